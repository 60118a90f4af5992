"""Numerics comparison: metrics, tolerances by dtype, NaNs, shapes, user inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import dmlopt
from dmlopt.errors import InputError, UsageError
from dmlopt.runtime.validate import compare, tolerances
from tests.conftest import conv_leaky_model


def test_identical_and_different_models():
    same = dmlopt.validate(conv_leaky_model(), conv_leaky_model())
    assert same.passed and same.outputs[0].max_abs == 0 and same.outputs[0].cosine == pytest.approx(1.0)
    assert same.inputs == {"x": [1, 3, 8, 8]}  # the dynamic batch became 1
    other = dmlopt.validate(conv_leaky_model(), conv_leaky_model(seed=3))
    assert not other.passed and other.outputs[0].max_rel > 0.1


def test_shapes_choose_the_input_shape():
    v = dmlopt.validate(conv_leaky_model(), conv_leaky_model(), shapes={"x": [2, 3, 8, 8]})
    assert v.inputs == {"x": [2, 3, 8, 8]} and v.outputs[0].shape == [2, 4, 8, 8]


def test_user_inputs_npz(tmp_path):
    x = np.ones((1, 3, 8, 8), np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    v = dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "in.npz")
    assert v.passed and v.seed is None
    np.savez(tmp_path / "bad.npz", nope=x)
    with pytest.raises(UsageError, match="nope"):
        dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "bad.npz")
    with pytest.raises(InputError):
        dmlopt.validate(conv_leaky_model(), conv_leaky_model(), inputs=tmp_path / "missing.npz")


def test_tolerance_scales_with_magnitude():
    ref = np.array([1000.0, -1000.0, 1.0], np.float32)
    assert compare("y", ref, ref + np.float32(0.05)).passed  # 5e-5 of the magnitude
    assert not compare("y", ref, ref * np.float32(1.01)).passed  # 1% off
    assert tolerances(np.float16, None, None) == (0.0, 1e-2)  # no absolute floor: see the scale-aware tests
    assert tolerances(np.int64, None, None) == (0.0, 0.0)
    assert not compare("i", np.array([1, 2]), np.array([1, 3])).passed


def test_nans_shapes_and_missing_outputs():
    nan = np.array([np.nan, 1.0], np.float32)
    assert compare("y", nan, nan.copy()).passed
    assert not compare("y", nan, np.array([0.0, 1.0], np.float32)).passed
    assert not compare("y", np.zeros(3), np.zeros(4)).passed
    missing = compare("y", np.zeros(3), None)
    assert not missing.passed and missing.reason == "output missing"


def _half_model(nodes, inputs, outputs, inits=()):
    """A float16 model built with onnx.helper (the text parser takes float16 values only as bits)."""
    from onnx import helper, numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return dmlopt.load(model)


HALF_T, FLOAT_T = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


def test_float16_model_is_run_with_float16_rounding_of_every_value():
    """ORT's CPU EP would compute these float16 ops in float32 between Casts it removes:
    (x + 1000) - 1000 came back exact and x*1000 squared did not overflow."""
    from onnx import helper

    from dmlopt.runtime.validate import run, with_float16_rounding

    model = _half_model([helper.make_node("Add", ["x", "big"], ["a"]), helper.make_node("Sub", ["a", "big"], ["b"]),
                         helper.make_node("Mul", ["a", "a"], ["sq"])],
                        [("x", HALF_T, [8])], [("b", HALF_T, [8]), ("sq", HALF_T, [8])],
                        [("big", np.array([1000], np.float16))])
    x = np.linspace(-1, 1, 8).astype(np.float16)
    out = run(model, {"x": x})
    expected = (x + np.float16(1000)) - np.float16(1000)  # numpy rounds each step to float16
    np.testing.assert_array_equal(out["b"], expected)
    assert out["b"].dtype == np.float16 and np.abs(out["b"] - x).max() > 0.1
    assert np.isinf(out["sq"]).all()  # ~1e6 overflows float16
    emulated = with_float16_rounding(model)
    assert [v.name for v in emulated.graph.outputs] == ["b", "sq"]
    assert [v.dtype.name for v in emulated.graph.outputs] == ["FLOAT16", "FLOAT16"]
    assert model.graph.initializers["big"].dtype.name == "FLOAT16"  # the input model is left as it was


def test_float16_constant_of_shape_and_cast_are_rounded_too():
    from onnx import helper, numpy_helper

    from dmlopt.runtime.validate import run

    value = numpy_helper.from_array(np.array([1000], np.float16))
    model = _half_model([helper.make_node("Cast", ["x"], ["c"], to=HALF_T),
                         helper.make_node("ConstantOfShape", ["shape"], ["k"], value=value),
                         helper.make_node("Add", ["c", "k"], ["s"]), helper.make_node("Sub", ["s", "k"], ["y"])],
                        [("x", FLOAT_T, [8]), ("shape", onnx.TensorProto.INT64, [1])], [("y", HALF_T, [8])])
    x = np.linspace(-1, 1, 8).astype(np.float32)
    y = run(model, {"x": x, "shape": np.array([8], np.int64)})["y"]
    np.testing.assert_array_equal(y, (x.astype(np.float16) + np.float16(1000)) - np.float16(1000))


def test_float16_rounding_names_never_clash_with_the_models():
    """Values already named like the rounding Casts' outputs, and an output that is also read."""
    from onnx import helper

    from dmlopt.runtime.validate import run

    model = _half_model([helper.make_node("Add", ["x", "big"], ["a"], name="a__rounded_0"),
                         helper.make_node("Sub", ["a", "big"], ["a__r0"]),
                         helper.make_node("Relu", ["a__r0"], ["a__float32"])],
                        [("x", HALF_T, [4])], [("a__float32", HALF_T, [4]), ("a", HALF_T, [4])],
                        [("big", np.array([1000], np.float16))])
    x = np.linspace(-1, 1, 4).astype(np.float16)
    out = run(model, {"x": x})
    a = x + np.float16(1000)
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["a__float32"], np.maximum(a - np.float16(1000), 0))


def _wrong_versions(ref: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"all zeros": np.zeros_like(ref), "sign flipped": -ref,
            "permuted": rng.permutation(ref.ravel()).reshape(ref.shape),
            "channels swapped": np.roll(ref, 1, axis=1)}


@pytest.mark.parametrize("scale", [1e-5, 1e-3, 1.0, 1e3])
@pytest.mark.parametrize("kind", ["signed", "probabilities"])
@pytest.mark.parametrize("half", [False, True])
def test_no_wrong_output_passes_at_any_scale_while_float16_rounding_does(scale, kind, half):
    """Issue 31: an all-zeros output passed against a reference of magnitude 1e-5 (atol 1e-4
    dominated; with --fp16, 1e-2 dominated softmax probabilities and depth in 1e-3)."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 6, 16, 16))
    if kind == "probabilities":  # positive, summing to 1 over channels, like a softmax's
        ref = np.exp(ref) / np.exp(ref).sum(axis=1, keepdims=True)
    ref = (ref * scale).astype(np.float32)
    dtype = np.float16 if half and scale * 6e4 > 1e-3 else np.float32  # float16 holds the values
    honest = ref.astype(dtype)
    check = compare("y", ref, honest)
    assert check.passed and check.cosine > 0.9999, check
    for case, wrong in _wrong_versions(ref).items():
        got = compare("y", ref, wrong.astype(dtype))
        assert not got.passed and got.reason, (case, got)
        assert got.decided_by in ("rel L2", "max abs/range") and got.decided_by in got.to_dict().values()


def test_the_rule_that_decides_is_named_and_one_wrong_element_fails():
    ref = np.linspace(-1, 1, 4096, dtype=np.float32)
    off = ref.copy()
    off[100] += 0.5  # one element: relative L2 ~0.01, but a quarter of the range
    got = compare("y", ref, off, rtol=1e-2)
    assert not got.passed and got.decided_by == "max abs/range" and "range" in got.reason
    scaled = compare("y", ref, ref * np.float32(1.05))
    assert not scaled.passed and scaled.decided_by == "rel L2" and "rel L2" in scaled.reason
    fine = compare("y", ref, ref + np.float32(1e-6))
    assert fine.passed and fine.decided_by in ("rel L2", "max abs/range")
    # an explicit atol is an absolute error the user chose to ignore
    assert compare("y", ref * np.float32(1e-6), np.zeros_like(ref), atol=1e-5).passed


def test_validate_refuses_an_all_zeros_model_against_a_small_output(cli, tmp_path):
    """The issue's case through the API and the command: REF's output ~1e-5, CAND's all zeros."""
    from onnx import helper, numpy_helper

    def scaled(k: float):
        graph = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", FLOAT_T, [1, 64])],
                                  [helper.make_tensor_value_info("y", FLOAT_T, [1, 64])],
                                  [numpy_helper.from_array(np.array([k], np.float32), "k")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    onnx.save(scaled(1e-5), tmp_path / "ref.onnx")
    onnx.save(scaled(0.0), tmp_path / "zeros.onnx")
    v = dmlopt.validate(tmp_path / "ref.onnx", tmp_path / "zeros.onnx")
    assert not v.passed and not v.outputs[0].passed and v.outputs[0].cosine == 0.0
    out = cli("validate", str(tmp_path / "ref.onnx"), str(tmp_path / "zeros.onnx"))
    assert out.code != 0 and "DIFFER" in out.out and "FAIL rel L2" in out.out and " ok" not in out.out


def _validation_dict(pairs) -> dict:
    checks = [compare(name, ref, got) for name, ref, got in pairs]
    return {"passed": all(c.passed for c in checks), "inputs": {"x": [1, 8]}, "input_basis": [], "seed": 0,
            "outputs": [c.to_dict() for c in checks]}


def test_rows_and_verdict_never_disagree_on_the_webgpu_ep():
    """Issue 31: SAM ViT-B --target webgpu --fp16 printed "ok" rows under a DIFFER verdict (the rows
    were the CPU EP's, the verdict the WebGPU EP's); an excused output is now excused row by row."""
    from dmlopt.report.optimize_report import _validation_table
    from dmlopt.targets.webgpu.validation import judged

    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    near, off, far = ref * np.float32(1.001), ref * np.float32(1.05), ref * np.float32(1.5)
    cpu = _validation_dict([("a", ref, ref), ("b", ref, ref)])
    for cand, base, want in [([("a", ref, ref), ("b", ref, far)], [("a", ref, ref), ("b", ref, ref)], False),
                             ([("a", ref, near), ("b", ref, off)], [("a", ref, near), ("b", ref, off * 0.99)], True),
                             ([("a", ref, near), ("b", ref, far)], [("a", ref, near), ("b", ref, off)], False)]:
        found = judged(_validation_dict(cand), _validation_dict(base))
        rows = found["optimized"]["outputs"]
        assert found["passed"] is want is all(o["passed"] for o in rows), found
        table = _validation_table({**cpu, "cpu_passed": True, "passed": found["passed"],
                                   "webgpu": {**found, "adapter": "test adapter"}})
        webgpu_part = table.split("validation on the WebGPU EP")[1]
        assert ("FAILED" in webgpu_part) is (not want) and ("FAIL " in webgpu_part) is (not want), table


def test_a_model_computing_in_float16_is_judged_as_float16_whatever_its_outputs_type():
    """Its float32 outputs (--keep-io-types) got float32's rtol: the same model failed against itself
    on the real DirectML EP (rel L2 1.6e-3, EfficientViT --fp16)."""
    import pathlib

    half = pathlib.Path(__file__).parent / "measured" / "efficientvit.fp16.dmlopt.onnx"
    v = dmlopt.validate(half, half)
    assert v.outputs[0].dtype == "float32" and v.outputs[0].rtol == 1e-2
    assert dmlopt.validate(conv_leaky_model(), conv_leaky_model()).outputs[0].rtol == 1e-4
    assert dmlopt.validate(half, half, rtol=1e-5).outputs[0].rtol == 1e-5


def test_a_saved_float16_model_with_contrib_ops_is_validated_from_its_file():
    """dmlopt's --fp16 SAM from disk (no value_info; SkipLayerNormalization, MultiHeadAttention and
    initializers typed on their tensors only): its float16-rounding copy did not load ("MatMul
    bound to different types"), so `dmlopt validate REF OUT` of a float16 output always failed."""
    import pathlib

    half = pathlib.Path(__file__).parent / "measured" / "sam_small.fp16.dmlopt.onnx"
    v = dmlopt.validate(pathlib.Path(dmlopt.__file__).parent / "data" / "sam_small.onnx", half)
    assert v.passed and v.outputs[0].rtol == 1e-2 and 1e-4 < v.outputs[0].rel_l2 < 1e-2


def test_subnormal_outputs_are_equal_and_a_normal_one_is_judged():
    """A Gemm with alpha 1e-45 (a hypothesis case) makes outputs of a few float32 subnormals, which flush to
    zero on some threads and runs: two values both below the smallest normal are equal; a normal value off
    by as little is not."""
    from dmlopt.runtime.validate import compare

    tiny = np.finfo(np.float32).smallest_subnormal
    ref = (np.arange(15, dtype=np.float32).reshape(3, 5) % 7) * tiny
    assert compare("y", ref, ref * 3).passed and compare("y", ref, np.zeros_like(ref)).passed
    normal = ref + np.float32(1e-30)
    assert not compare("y", normal, np.zeros_like(normal)).passed
    assert not compare("y", normal, normal * 1.01).passed
    small = np.full(4, 1e-5, np.float32)  # a float16 subnormal, but the float32 reference's normal value
    assert not compare("y", small, np.zeros(4, np.float16)).passed
