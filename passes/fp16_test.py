"""Tests of the fp16 pass: which tensors turn float16, where Casts go, numerics within float16 tolerance."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.cli.demo import bundled_path
from dmlopt.io.model import initializer_bytes
from dmlopt.passes import PassContext
from dmlopt.passes.fp16 import Fp16Pass
from dmlopt.engine.pipeline import check_model, op_counts
from dmlopt.runtime.validate import DEFAULT_TOLERANCES, run, validate

HALF_TOL = DEFAULT_TOLERANCES["float16"]
F16, F32 = ir.DataType.FLOAT16, ir.DataType.FLOAT


def convert(model: ir.Model, **options) -> tuple[ir.Model, Fp16Pass]:
    work = model.clone()
    p = Fp16Pass(PassContext(target="dml", options={"fp16": True, **options}))
    result = p(work)
    check_model(result.model, "fp16")
    return result.model, p


def text_model(body: str, inputs: str, outputs: str, inits: str = "", opset: int = 17) -> ir.Model:
    init_block = f"<{inits}>" if inits else ""
    return ir.from_onnx_text(f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g ({inputs}) => ({outputs}) {init_block} {{ {body} }}""")


def nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == op_type]


def bundled(name: str) -> ir.Model:
    path = bundled_path(name)
    if not path.is_file():
        pytest.skip(f"bundled model {name} not built")
    return dmlopt.load(path)


# -- the bundled models ------------------------------------------------------------------

def test_cnn_runs_in_float16_with_float32_interface():
    model = bundled("cnn_leaky.onnx")
    out, p = convert(model)
    # Every Conv/LeakyRelu/ConvTranspose computes in float16; weights are float16 initializers.
    for node in out.graph:
        if node.op_type in ("Conv", "ConvTranspose", "LeakyRelu"):
            assert all(v.dtype == F16 for v in node.inputs if v is not None), node.name
            assert node.outputs[0].dtype == F16
    casts = nodes(out, "Cast")
    assert len(casts) == 2  # graph input -> f16, last value -> f32 output
    assert {c.attributes["to"].value for c in casts} == {F16.value, F32.value}
    assert [v.dtype for v in out.graph.inputs] == [F32] and [v.dtype for v in out.graph.outputs] == [F32]
    assert [v.name for v in out.graph.outputs] == [v.name for v in model.graph.outputs]
    assert initializer_bytes(out) * 2 == initializer_bytes(model)
    v = validate(model, out, atol=HALF_TOL[0], rtol=HALF_TOL[1])
    assert v.passed, v.to_table()
    assert 0 < v.outputs[0].max_abs  # float16 really ran


@pytest.mark.parametrize("name", ["sam_small.onnx", "sam_small_dynamic.onnx"])
def test_sam_keeps_index_math_in_float32(name):
    model = bundled(name)
    out, p = convert(model)
    for node in nodes(out, "Range"):
        assert all(v.dtype != F16 for v in node.inputs if v is not None)
    kept = [s for s in p.sites if s.action == "kept"]
    assert kept and all("index math" in s.detail for s in kept)
    # Data ops compute in float16 (LayerNormalization, MatMul, Softmax, Einsum).
    for op in ("LayerNormalization", "MatMul", "Softmax", "Einsum"):
        assert nodes(out, op) and all(n.outputs[0].dtype == F16 for n in nodes(out, op)), op
    # Only the graph boundary needed Casts: index math feeds float16 through Gather of a table.
    assert len(nodes(out, "Cast")) - len(nodes(model, "Cast")) == 2
    assert initializer_bytes(out) < 0.52 * initializer_bytes(model)
    v = validate(model, out, atol=HALF_TOL[0], rtol=HALF_TOL[1])
    assert v.passed, v.to_table()


def test_without_keep_io_types_the_interface_is_float16():
    model = bundled("cnn_leaky.onnx")
    out, _ = convert(model, keep_io_types=False)
    assert [v.dtype for v in out.graph.inputs] == [F16] and [v.dtype for v in out.graph.outputs] == [F16]
    assert not nodes(out, "Cast")
    x = np.random.default_rng(0).standard_normal([1, 3, 128, 128]).astype(np.float32)
    ref = run(model, {"input": x})["output"]
    got = run(out, {"input": x.astype(np.float16)})["output"]
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float32) - ref).max() <= HALF_TOL[0] + HALF_TOL[1] * np.abs(ref).max()


# -- the cases, on small graphs --------------------------------------------------------------

def test_disabled_without_the_option():
    model = text_model("y = Relu(x)", "float[2,3] x", "float[2,3] y")
    p = Fp16Pass(PassContext(options={}))
    assert not p.enabled()
    assert not p(model).modified
    assert model.graph.outputs[0].dtype == F32 and not nodes(model, "Cast")


def test_resize_scales_and_roi_stay_float32():
    model = text_model('y = Resize(x, roi, scales) <mode = "linear">', "float[1,2,4,4] x", "float[1,2,8,8] y",
                       "float[0] roi = {}, float[4] scales = {1.0, 1.0, 2.0, 2.0}", opset=19)
    out, _ = convert(model)
    resize = nodes(out, "Resize")[0]
    assert [v.dtype for v in resize.inputs] == [F16, F32, F32]
    assert resize.outputs[0].dtype == F16
    x = np.random.default_rng(1).standard_normal([1, 2, 4, 4]).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})["y"], run(model, {"x": x})["y"], atol=1e-2, rtol=1e-2)


def test_layer_norm_statistics_stay_float32():
    model = text_model("y, mean, inv = LayerNormalization(x, s, b) <axis = -1>", "float[2,8] x",
                       "float[2,8] y, float[2,1] mean, float[2,1] inv",
                       "float[8] s = {1,1,1,1,1,1,1,1}, float[8] b = {0,0,0,0,0,0,0,0}")
    out, _ = convert(model)
    ln = nodes(out, "LayerNormalization")[0]
    assert [v.dtype for v in ln.inputs] == [F16, F16, F16]
    assert [v.dtype for v in ln.outputs] == [F16, F32, F32]
    assert len(nodes(out, "Cast")) == 2  # x in, y out; mean/inv are float32 already
    x = np.random.default_rng(2).standard_normal([2, 8]).astype(np.float32)
    got, ref = run(out, {"x": x}), run(model, {"x": x})
    for name in ("y", "mean", "inv"):
        np.testing.assert_allclose(got[name], ref[name], atol=2e-2, rtol=2e-2)


def test_skip_layer_norm_runs_in_float16_with_float32_statistics():
    """com.microsoft SkipLayerNormalization: T turns float16 (no Casts around it), U (mean) stays float32."""
    model = ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[1,4,8] x, float[1,4,8] r) => (float[1,4,8] y, float[1,4,1] mean, float[1,4,8] s)
        <float[8] g = {1,2,1,2,1,2,1,2}, float[8] b = {0,1,0,1,0,1,0,1}> {
        a = Relu(x)
        y, mean, inv, s = com.microsoft.SkipLayerNormalization(a, r, g, b) <epsilon: float = 1e-5> }""")
    sln = nodes(model, "SkipLayerNormalization")[0]
    sln.outputs[2].type = ir.TensorType(F32)  # inv_std_var: read by nobody, typed as ORT's shape inference would
    out, p = convert(model)
    sln = nodes(out, "SkipLayerNormalization")[0]
    assert [v.dtype for v in sln.inputs] == [F16] * 4
    assert [v.dtype if v is not None else None for v in sln.outputs] == [F16, F32, F32, F16]
    assert not any(s.op == "SkipLayerNormalization" and s.action == "declined" for s in p.sites)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal([1, 4, 8]).astype(np.float32) for n in ("x", "r")}
    got, ref = run(out, feeds), run(model, feeds)
    assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in ref.items()}
    for name in ("y", "mean", "s"):
        np.testing.assert_allclose(got[name], ref[name], atol=2e-2, rtol=2e-2)


def test_float_index_math_stays_float32():
    # n = Cast<float>(Shape(x)[1]); r = Range(0, n, 1) feeds Mul with data: Range has no float16 and the
    # index arithmetic (Cast, Div) stays float32; only the data path (Mul, Add) is float16.
    model = text_model("""
        shp = Shape(x)
        idx = Constant<value = int64[1] {1}>()
        n_i = Gather<axis = 0>(shp, idx)
        n_f = Cast<to = 1>(n_i)
        two = Constant<value = float[1] {2.0}>()
        half_n = Div(n_f, two)
        zero = Constant<value = float {0.0}>()
        one = Constant<value = float {1.0}>()
        n_s = Squeeze(half_n)
        r = Range(zero, n_s, one)
        y0 = Mul(x, r)
        y = Add(y0, x)
        """, "float[3,4] x", "float[3,2] y")
    model.graph.outputs[0].shape = None
    out, p = convert(model)
    by_op = {n.op_type: n for n in out.graph}
    assert by_op["Range"].outputs[0].dtype == F32
    assert by_op["Div"].outputs[0].dtype == F32
    assert by_op["Mul"].outputs[0].dtype == F16 and by_op["Add"].outputs[0].dtype == F16
    reasons = collections.Counter(s.op for s in p.sites if s.action == "kept")
    assert reasons["Range"] == 1 and reasons["Div"] == 1 and reasons["Cast"] == 1


def test_constant_shared_with_float32_node_gets_a_float16_copy():
    # w feeds MatMul (float16) and Softmax (kept float32): MatMul gets a float16 copy of it.
    model = text_model("a = MatMul(x, w)\n y = Add(a, x)\n z = Softmax(w)", "float[2,2] x",
                       "float[2,2] y, float[2,2] z", "float[2,2] w = {1.0, 2.0, 3.0, 4.0}")
    out, _ = convert(model, fp16_keep_ops="Softmax")
    softmax, matmul = nodes(out, "Softmax")[0], nodes(out, "MatMul")[0]
    assert softmax.inputs[0].dtype == F32 and softmax.inputs[0].name == "w"
    assert matmul.inputs[1].dtype == F16 and matmul.inputs[1].is_initializer()
    np.testing.assert_array_equal(matmul.inputs[1].const_value.numpy(), np.array([[1, 2], [3, 4]], np.float16))
    assert out.graph.outputs[1].dtype == F32


def test_keep_ops_get_casts_around_them():
    model = text_model("a = Relu(x)\n b = Softmax(a)\n y = Relu(b)", "float[2,3] x", "float[2,3] y")
    out, p = convert(model, fp16_keep_ops="Softmax")
    softmax = nodes(out, "Softmax")[0]
    assert softmax.inputs[0].dtype == F32 and softmax.outputs[0].dtype == F32
    assert softmax.inputs[0].producer().op_type == "Cast"
    assert [u.op_type for u, _ in softmax.outputs[0].uses()] == ["Cast"]
    assert any(s.op == "Softmax" and "--fp16-keep-ops" in s.detail for s in p.sites)
    x = np.random.default_rng(3).standard_normal([2, 3]).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})["y"], run(model, {"x": x})["y"], atol=1e-2, rtol=1e-2)


MATRIX_PRODUCTS = ("a = Relu(x)\n b = MatMul(a, w)\n c = Gemm(b, w)\n y = Relu(c)", "float[3,3] x", "float[3,3] y",
                   "float[3,3] w = {1,0,0, 0,1,0, 0,0,1}")


@pytest.mark.parametrize("target, kept", [("webgpu", {"MatMul", "Gemm"}), ("dml", set()), ("cpu", set())])
def test_matrix_products_stay_float32_where_the_targets_float16_kernels_lose_accuracy(target, kept):
    """WebGPU's float16 Gemm/MatMul/Conv: SAM ViT-B's error on the EP 1.7e-2 -> within float16 validation."""
    model = text_model(*MATRIX_PRODUCTS)
    p = Fp16Pass(PassContext(target=target, options={"fp16": True}))
    out = p(model.clone()).model
    assert {n.op_type for n in out.graph if n.op_type in ("MatMul", "Gemm") and n.outputs[0].dtype == F32} == kept
    assert {s.op for s in p.sites if "loses accuracy" in s.detail} == kept
    assert nodes(out, "Relu")[0].outputs[0].dtype == ir.DataType.FLOAT16


def test_the_targets_float32_ops_can_be_converted_too():
    p = Fp16Pass(PassContext(target="webgpu", options={"fp16": True, "fp16_target_keep": False}))
    out = p(text_model(*MATRIX_PRODUCTS)).model
    assert all(n.outputs[0].dtype == ir.DataType.FLOAT16 for n in out.graph if n.op_type in ("MatMul", "Gemm"))


@pytest.mark.parametrize("keep", ["second", ("second",)])
def test_keep_nodes_keeps_the_named_node_only(keep):
    """The fp16 repair's mechanism: one of two Softmax nodes kept by name (CLI string or API tuple)."""
    model = text_model("a = Softmax(x)\n b = Softmax(a)\n y = Relu(b)", "float[2,3] x", "float[2,3] y")
    for node, name in zip(model.graph, ("first", "second", "last")):
        node.name = name
    out, p = convert(model, fp16_keep_nodes=keep)
    by_name = {n.name: n for n in out.graph}
    assert by_name["first"].outputs[0].dtype == F16 and by_name["last"].outputs[0].dtype == F16
    assert by_name["second"].inputs[0].dtype == F32 and by_name["second"].outputs[0].dtype == F32
    assert [(s.node, s.action) for s in p.sites if "--fp16-keep-nodes" in s.detail] == [("second", "kept")]
    assert p.converted == ["first", "last"]
    x = np.random.default_rng(4).standard_normal([2, 3]).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})["y"], run(model, {"x": x})["y"], atol=1e-2, rtol=1e-2)


def test_keep_nodes_names_missing_from_the_graph_are_noted():
    model = text_model("y = Relu(x)", "float[2] x", "float[2] y")
    _, p = convert(model, fp16_keep_nodes="nowhere, Relu_0")
    assert any("no node named" in n and "nowhere" in n for n in p.notes)


def test_cast_to_float_becomes_cast_to_float16():
    model = text_model("a = Cast<to = 1>(m)\n y = Mul(x, a)", "float[2,3] x, int64[2,3] m", "float[2,3] y")
    out, _ = convert(model)
    casts = [n for n in nodes(out, "Cast") if n.inputs[0].name == "m"]
    assert len(casts) == 1 and casts[0].attributes["to"].value == F16.value
    x = np.ones([2, 3], np.float32)
    m = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(run(out, {"x": x, "m": m})["y"], x * m)


def test_values_beyond_float16_range_are_clipped_and_noted():
    model = text_model("y = Add(x, big)", "float[2] x", "float[2] y", "float[2] big = {1e6, -3.0}")
    out, p = convert(model)
    add = nodes(out, "Add")[0]
    np.testing.assert_array_equal(add.inputs[1].const_value.numpy(), np.array([65504, -3], np.float16))
    assert any("clipped" in n for n in p.notes)


def test_if_body_reads_float32_of_an_outer_float16_value():
    then_branch = "then_out = Relu(a)"
    else_branch = "else_out = Neg(a)"
    model = ir.from_onnx_text(f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x, bool c) => (float[2] y) {{
            a = Relu(x)
            y = If(c) <then_branch = then_g () => (float[2] then_out) {{ {then_branch} }},
                       else_branch = else_g () => (float[2] else_out) {{ {else_branch} }}>
        }}""")
    out, p = convert(model)
    relu = nodes(out, "Relu")[0]
    assert relu.outputs[0].dtype == F16
    if_node = nodes(out, "If")[0]
    body_inputs = [n.inputs[0] for g in if_node.attributes.values() for n in g.value]
    assert all(v.dtype == F32 and v.producer().op_type == "Cast" for v in body_inputs)
    assert any(s.op == "If" and "control flow" in s.detail for s in p.sites)
    x = np.array([-1.5, 2.25], np.float32)
    for c in (True, False):
        np.testing.assert_array_equal(run(out, {"x": x, "c": np.array(c)})["y"],
                                      run(model, {"x": x, "c": np.array(c)})["y"])


def test_unknown_domain_op_is_declined_and_kept_float32():
    model = ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17, "custom.ops" : 1]>
        g (float[2] x) => (float[2] y) { a = Relu(x)
 y = custom.ops.Thing(a) }""")
    model.graph.outputs[0].type = ir.TensorType(F32)
    work = model.clone()
    p = Fp16Pass(PassContext(options={"fp16": True}))
    p(work)
    thing = [n for n in work.graph if n.op_type == "Thing"][0]
    assert thing.inputs[0].dtype == F32 and thing.inputs[0].producer().op_type == "Cast"
    assert any(s.action == "declined" and s.op == "Thing" for s in p.sites)


def test_pipeline_validates_fp16_with_float16_tolerances():
    model = bundled("cnn_leaky.onnx")
    result = dmlopt.optimize(model, target="cpu", passes=["fp16"], fp16=True, retime=False)
    assert result.passed
    assert {o["atol"] for o in result.report.validation["outputs"]} == {HALF_TOL[0]}
    assert op_counts(result.model)["Cast"] == 2


def test_pipeline_validates_a_float16_interface():
    """Without keep_io_types the inputs are float16: validation feeds each model its own input type."""
    model = bundled("cnn_leaky.onnx")
    result = dmlopt.optimize(model, target="cpu", passes=["fp16"], fp16=True, keep_io_types=False, retime=False)
    assert [v.dtype for v in result.model.graph.inputs] == [F16]
    assert result.passed, result.report.to_table()
    assert result.report.validation["outputs"][0]["max_abs"] > 0
