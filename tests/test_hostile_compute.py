"""Hostile models that attack dmlopt's time and memory, and its promise to keep the interface.

Issue 14, items 4-8: a graph input that is also a graph output (renamed by onnxscript's
output fix), constant folds that ask for gigabytes from a few bytes, functions that nest with
a fan-out of 2**40, long chains of nodes, a Loop with a 2**62 trip count, random inputs that
were generated as float64, string tensors, dims above int64, and ONNX Runtime failing while a
model is timed.  Memory is measured in a child process (its peak resident size), time as CPU
time of this process, compared between a graph and one 4 times longer.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.engine import pipeline
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import InputError, UsageError
from dmlopt.passes import DmlPass
from dmlopt.graph.shape_inference import check_function_expansion
from dmlopt.runtime.validate import compare
from tests.conftest import one_error_line

# Every option `dmlopt optimize` would otherwise tune, fixed: what runs is the passes alone.
FIXED = ["--leaky-relu", "keep", "--conv-transpose", "keep", "--einsum", "keep", "--einsum-layout",
         "fewest-transposes", "--attention", "keep", "--window-layout", "keep"]
FIXED_KW = dict(leaky_relu="keep", conv_transpose="keep", einsum="keep", einsum_layout="fewest-transposes",
                attention="keep", window_layout="keep")
NOTHING_RUN = ["--no-validate", "--no-time", "--target", "cpu", *FIXED]


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _save(path: pathlib.Path, nodes, inputs, outputs, initializers=(), functions=(), value_info=()) -> pathlib.Path:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers), value_info=list(value_info))
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("local", 1)] if functions else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=list(functions)), path)
    return path


# -- item 4: the interface never changes ---------------------------------------------------

def _passthrough(tmp_path) -> pathlib.Path:
    """y = Relu(m), and m itself is an output too."""
    return _save(tmp_path / "passthrough.onnx", [helper.make_node("Relu", ["m"], ["y"])], [_vi("m", [2, 3])],
                 [_vi("y", [2, 3]), _vi("m", [2, 3])])


def _interface(path) -> tuple[list[str], list[str]]:
    proto = onnx.load(path)
    return [i.name for i in proto.graph.input], [o.name for o in proto.graph.output]


def test_input_that_is_also_an_output_keeps_its_name_without_validation(cli, tmp_path):
    src = _passthrough(tmp_path)
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, "-o", out, *NOTHING_RUN)
    assert result.code == 0, result.err
    assert _interface(out) == (["m"], ["y", "m"])


def test_input_that_is_also_an_output_validates(cli, tmp_path):
    src = _passthrough(tmp_path)
    out = tmp_path / "out.onnx"
    result = cli("optimize", src, "-o", out, "--no-time", "--target", "cpu", *FIXED)
    assert result.code == 0, result.err
    assert _interface(out) == (["m"], ["y", "m"])
    got = runtime.session(ir.load(out)).run(None, {"m": -np.ones((2, 3), np.float32)})
    assert np.array_equal(got[1], -np.ones((2, 3), np.float32)) and np.array_equal(got[0], np.zeros((2, 3)))


class _RenamesAnInput(DmlPass):
    name = "renames-an-input"

    def call(self, model):
        model.graph.inputs[0].name = "m_orig"
        return ir.passes.PassResult(model, True)


class _RetypesAnOutput(DmlPass):
    name = "retypes-an-output"

    def call(self, model):
        out = model.graph.outputs[0]
        cast = ir.node("Cast", [out], attributes={"to": ir.DataType.DOUBLE})
        model.graph.append(cast)
        cast.outputs[0].dtype, cast.outputs[0].shape = ir.DataType.DOUBLE, out.shape
        name, out.name = out.name, "y_before"
        cast.outputs[0].name = name
        model.graph.outputs[0] = cast.outputs[0]
        return ir.passes.PassResult(model, True)


@pytest.mark.parametrize("bad_pass, said", [(_RenamesAnInput, "changed the model's inputs"),
                                            (_RetypesAnOutput, "changed the type of output 'y'")])
def test_a_pass_that_changes_the_interface_is_a_dmlopt_bug(monkeypatch, tmp_path, bad_pass, said):
    monkeypatch.setattr(pipeline, "all_passes", lambda: {bad_pass.name: bad_pass})
    with pytest.raises(pipeline.PassBroke, match=said) as caught:
        pipeline.optimize(str(_passthrough(tmp_path)), passes=bad_pass.name, validate=False, retime=False)
    assert "dmlopt bug" in str(caught.value) and caught.value.exit_code == 1


def test_fp16_without_keep_io_types_may_change_float_types_only(tmp_path):
    src = _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    result = dmlopt.optimize(str(src), passes="fp16", fp16=True, keep_io_types=False, validate=False, retime=False)
    assert [v.name for v in result.model.graph.inputs] == ["x"] and [v.name for v in result.model.graph.outputs] == ["y"]


# -- item 5: folding is sized before anything is evaluated ---------------------------------

BIG = 16384  # an Expand to [BIG, BIG] float32 is 1 GiB


def _expand_bomb(tmp_path) -> pathlib.Path:
    """A few hundred bytes: Expand(1.0, [BIG, BIG]) summed and added to x."""
    shape = numpy_helper.from_array(np.array([BIG, BIG], np.int64), "s")
    one = numpy_helper.from_array(np.array([1.0], np.float32), "one")
    return _save(tmp_path / "expand.onnx",
                 [helper.make_node("Expand", ["one", "s"], ["big"]),
                  helper.make_node("ReduceSum", ["big"], ["r"], keepdims=0),
                  helper.make_node("Add", ["x", "r"], ["y"])], [_vi("x", [1])], [_vi("y", [1])], [shape, one])


def _lying_constant_of_shape(tmp_path) -> pathlib.Path:
    """ConstantOfShape([BIG, BIG]) whose value_info claims a [1] result (a folder must not trust it)."""
    shape = numpy_helper.from_array(np.array([BIG, BIG], np.int64), "s")
    return _save(tmp_path / "cos.onnx",
                 [helper.make_node("ConstantOfShape", ["s"], ["big"]),
                  helper.make_node("ReduceMax", ["big"], ["r"], keepdims=0),
                  helper.make_node("Add", ["x", "r"], ["y"])], [_vi("x", [1])], [_vi("y", [1])], [shape],
                 value_info=[_vi("big", [1])])


def _peak_mb(args: list[str]) -> tuple[int, float, str]:
    """Run `dmlopt ARGS` in a child; (exit code, peak resident MB of the child, stderr).

    The peak is VmHWM, which exec resets: ru_maxrss of a child keeps the peak of the process it
    was forked from (pytest, which other tests grow to gigabytes)."""
    code = ("import re, resource, sys\nfrom dmlopt.cli.commands import main\nrc = main(sys.argv[1:])\n"
            "try:\n    kb = int(re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read()).group(1))\n"
            "except (OSError, AttributeError):\n    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "print(kb // 1024, file=sys.stderr)\nsys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    *rest, peak = proc.stderr.strip().splitlines()
    return proc.returncode, float(peak), "\n".join(rest)


@pytest.mark.parametrize("build", [_expand_bomb, _lying_constant_of_shape])
def test_fold_of_a_huge_constant_is_refused_before_it_is_built(tmp_path, build):
    src = build(tmp_path)
    assert src.stat().st_size < 400
    rc, peak, err = _peak_mb(["optimize", str(src), "-o", str(tmp_path / "out.onnx"), *NOTHING_RUN])
    assert rc == 0, err
    assert peak < 600, f"optimize peaked at {peak} MB for a {src.stat().st_size}-byte model"
    kept = {n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node}
    assert kept & {"Expand", "ConstantOfShape"}, "the 1 GiB result was folded into the model"
    rc, peak, err = _peak_mb(["inspect", str(src), "--ep", "dml"])
    assert rc == 0, err
    assert peak < 600, f"inspect --ep dml peaked at {peak} MB"


def test_cleanup_reports_the_fold_it_refused(tmp_path):
    result = dmlopt.optimize(str(_expand_bomb(tmp_path)), passes="cleanup", validate=False, retime=False)
    sites = result.report.to_dict()["passes"][0]["sites"]
    assert any(s["op"] == "Expand" and f"result of {BIG * BIG} elements" in s["detail"] for s in sites), sites


def test_placement_warns_about_the_fold_it_did_not_evaluate(tmp_path):
    from dmlopt.targets.dml import placement

    predicted = placement.predict(ir.load(_expand_bomb(tmp_path)))
    assert any("too large" in w for w in predicted.warnings), predicted.warnings


def test_small_folds_still_happen(tmp_path):
    """The size check refuses big results only: Expand to [4, 4] still folds."""
    shape = numpy_helper.from_array(np.array([4, 4], np.int64), "s")
    one = numpy_helper.from_array(np.array([1.0], np.float32), "one")
    src = _save(tmp_path / "small.onnx", [helper.make_node("Expand", ["one", "s"], ["e"]),
                                          helper.make_node("Add", ["x", "e"], ["y"])],
                [_vi("x", [4, 4])], [_vi("y", [4, 4])], [shape, one])
    result = dmlopt.optimize(str(src), passes="cleanup", retime=False)
    assert result.passed
    assert [n.op_type for n in result.model.graph] == ["Add"]


# -- item 6: bounded work ------------------------------------------------------------------

def _function_bomb(tmp_path, depth: int = 40) -> pathlib.Path:
    """f0 = Relu; f_k(x) = f_{k-1}(f_{k-1}(x)): calling f_depth expands to 2**depth Relus."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], opsets)]
    for k in range(1, depth + 1):
        functions.append(helper.make_function("local", f"f{k}", ["x"], ["y"], [
            helper.make_node(f"f{k - 1}", ["x"], ["t"], domain="local"),
            helper.make_node(f"f{k - 1}", ["t"], ["y"], domain="local")], opsets))
    return _save(tmp_path / "bomb.onnx", [helper.make_node(f"f{depth}", ["x"], ["y"], domain="local")],
                 [_vi("x", [2])], [_vi("y", [2])], functions=functions)


@pytest.mark.parametrize("command", ["optimize", "inspect-dml", "validate"])
def test_nested_function_bomb_is_refused_fast(cli, tmp_path, command):
    src = _function_bomb(tmp_path)
    assert src.stat().st_size < 10_000
    args = {"optimize": ["optimize", src, "-o", tmp_path / "out.onnx", "--no-time", "--target", "cpu", *FIXED],
            "inspect-dml": ["inspect", src, "--ep", "dml"], "validate": ["validate", src, src]}[command]
    t0 = time.perf_counter()
    result = cli(*args)
    assert time.perf_counter() - t0 < 60
    assert result.code == 2
    assert "expand to more than" in one_error_line(result.err)
    assert not (tmp_path / "out.onnx").exists()


def test_shallow_functions_are_still_inlined(tmp_path):
    result = dmlopt.optimize(str(_function_bomb(tmp_path, depth=3)), retime=False, **FIXED_KW)
    assert result.passed
    assert {n.op_type for n in result.model.graph} == {"Relu"} and not result.model.functions  # Relu(Relu) is Relu


def test_recursive_function_is_refused(tmp_path):
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    loop = helper.make_function("local", "f", ["x"], ["y"], [helper.make_node("f", ["x"], ["y"], domain="local")],
                                opsets)
    src = _save(tmp_path / "rec.onnx", [helper.make_node("f", ["x"], ["y"], domain="local")], [_vi("x", [2])],
                [_vi("y", [2])], functions=[loop])
    with pytest.raises(InputError, match="recursive"):  # onnx's checker says it first
        dmlopt.optimize(str(src), validate=False, retime=False, **FIXED_KW)
    with pytest.raises(InputError, match="calls itself"):  # what inlining and inference meet
        check_function_expansion(ir.load(src))


def _chain(n: int) -> onnx.ModelProto:
    """x -> Identity -> Add(one) -> Identity -> ... : n nodes."""
    nodes, prev = [], "x"
    for i in range(n):
        inputs = [prev, "one"] if i % 2 else [prev]
        nodes.append(helper.make_node("Add" if i % 2 else "Identity", inputs, [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    one = numpy_helper.from_array(np.ones((1, 4), np.float32), "one")
    graph = helper.make_graph(nodes, "chain", [_vi("x", [1, 4])], [_vi("y", [1, 4])], [one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cpu_seconds(model: onnx.ModelProto) -> float:
    t0 = time.process_time()
    result = dmlopt.optimize(model, target="cpu", validate=False, retime=False, **FIXED_KW)
    assert len(list(result.model.graph)) < len(model.graph.node)  # the Identities went: the passes ran
    return time.process_time() - t0


@pytest.mark.slow  # CPU-time scaling over 7500 nodes: 15 s
def test_work_grows_about_linearly_with_the_graph():
    small, large = 1500, 6000
    _cpu_seconds(_chain(200))  # imports and first-call costs out of the measurement
    t_small, t_large = _cpu_seconds(_chain(small)), _cpu_seconds(_chain(large))
    # Linear would be 4x, quadratic 16x (it was: 5k nodes 36 s, 10k 104 s, 20k past 2 minutes).
    assert t_large < 8 * t_small + 2.0, f"{small} nodes: {t_small:.1f} s, {large} nodes: {t_large:.1f} s"


def _endless_loop(tmp_path) -> pathlib.Path:
    """A Loop of 2**62 iterations adding one to a counter: runs for ever if anything runs it."""
    body = helper.make_graph([helper.make_node("Add", ["c_in", "one_b"], ["c_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("c_in", [1])],
                             [_vi("cond_out", [], TensorProto.BOOL), _vi("c_out", [1])],
                             [numpy_helper.from_array(np.ones(1, np.float32), "one_b")])
    trips = numpy_helper.from_array(np.array(2**62, np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "cond")
    return _save(tmp_path / "loop.onnx", [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
                 [_vi("x", [1])], [_vi("y", [1])], [trips, cond])


def test_no_validate_runs_nothing_outside_tuning(cli, tmp_path, monkeypatch):
    """Placement model, passes, shape inference and folding never run the model or its Loop
    (tuning is fixed here: what it runs under --no-validate is tested with it)."""
    def refuse(*_, **__):
        raise AssertionError("an ONNX Runtime session was created")

    monkeypatch.setattr(runtime, "session", refuse)
    src = _endless_loop(tmp_path)
    result = cli("optimize", src, "-o", tmp_path / "out.onnx", *NOTHING_RUN)
    assert result.code == 0, result.err
    assert cli("inspect", src, "--ep", "dml").code == 0


# -- item 7: random inputs counted in the bytes really made ---------------------------------

def test_random_inputs_are_made_in_their_own_dtype():
    specs = {"u8": ([3, 5], np.uint8), "h": ([7], np.float16), "f": ([2, 2], np.float32), "b": ([4], np.bool_),
             "i": ([3], np.int64)}
    feeds = runtime.random_inputs(specs)
    assert {k: v.dtype for k, v in feeds.items()} == {k: np.dtype(d) for k, (_, d) in specs.items()}
    assert feeds["h"].shape == (7,) and np.all(np.isfinite(feeds["h"]))
    assert np.array_equal(runtime.random_inputs(specs)["h"], feeds["h"])  # seeded


def test_random_input_cap_counts_all_inputs_together(monkeypatch):
    monkeypatch.setattr(runtime, "MAX_RANDOM_INPUT_BYTES", 1000)
    runtime.random_inputs({"a": ([600], np.uint8)})
    with pytest.raises(InputError, match="inputs to .* GiB of random data"):
        runtime.random_inputs({"a": ([600], np.uint8), "b": ([600], np.uint8)})


def test_random_input_over_the_cap_is_a_clear_error(cli, tmp_path):
    src = _save(tmp_path / "huge.onnx", [helper.make_node("Identity", ["x"], ["y"])],
                [_vi("x", [1 << 40], TensorProto.UINT8)], [_vi("y", [1 << 40], TensorProto.UINT8)])
    result = cli("validate", src, src)
    assert result.code == 2
    assert "--inputs FILE.npz" in one_error_line(result.err)


@pytest.mark.slow  # peak-memory subprocesses: 15 s
def test_large_uint8_input_is_validated_without_float64_copies(tmp_path):
    n = 40 << 20  # 40 MB of uint8: as float64/int64 copies it was 320 MB each
    one = numpy_helper.from_array(np.array([1], np.uint8), "one")
    src = _save(tmp_path / "u8.onnx", [helper.make_node("Add", ["x", "one"], ["y"])],
                [_vi("x", [n], TensorProto.UINT8)], [_vi("y", [n], TensorProto.UINT8)], [one])
    tiny = _save(tmp_path / "tiny.onnx", [helper.make_node("Add", ["x", "one"], ["y"])],
                 [_vi("x", [1], TensorProto.UINT8)], [_vi("y", [1], TensorProto.UINT8)], [one])
    rc, baseline, err = _peak_mb(["validate", str(tiny), str(tiny)])
    assert rc == 0, err
    rc, peak, err = _peak_mb(["validate", str(src), str(src)])
    assert rc == 0, err
    # The input, two outputs and ORT's own buffers: a few times 40 MB, not 8 bytes an element.
    assert peak - baseline < 8 * 40, f"validating a 40 MB uint8 model took {peak - baseline:.0f} MB more than a tiny one"


# -- item 8: bad input is exit 2 -----------------------------------------------------------

def test_string_outputs_are_compared_exactly():
    a = np.array(["a", "b"], dtype=object)
    assert compare("s", a, np.array(["a", "b"], dtype=object)).passed
    check = compare("s", a, np.array(["a", "c"], dtype=object))
    assert not check.passed and check.reason == "values differ"


def test_model_with_a_string_output_optimizes_and_validates(cli, tmp_path):
    words = numpy_helper.from_array(np.array(["alpha", "beta"], dtype=object), "words")
    src = _save(tmp_path / "words.onnx", [helper.make_node("Relu", ["x"], ["y"]),
                                          helper.make_node("Identity", ["words"], ["w"])],
                [_vi("x", [2])], [_vi("y", [2]), _vi("w", [2], TensorProto.STRING)], [words])
    result = cli("optimize", src, "-o", tmp_path / "out.onnx", "--no-time", "--target", "cpu", *FIXED)
    assert result.code == 0, result.err
    assert cli("validate", src, tmp_path / "out.onnx").code == 0


def test_string_input_is_a_clear_error(cli, tmp_path):
    src = _save(tmp_path / "str.onnx", [helper.make_node("Identity", ["s"], ["t"])],
                [_vi("s", [2], TensorProto.STRING)], [_vi("t", [2], TensorProto.STRING)])
    for args in (["validate", src, src], ["bench", src, "--ep", "cpu"],
                 ["optimize", src, "-o", tmp_path / "out.onnx", "--no-time", "--target", "cpu", *FIXED]):
        result = cli(*args)
        assert result.code == 2, result.err
        assert "string tensor" in one_error_line(result.err)


@pytest.mark.parametrize("flag", [["--dim", "n=99999999999999999999"], ["--shape", "x:99999999999999999999,4"],
                                  ["--dim", f"n={2**63}"]])
def test_dimension_above_int64_is_a_usage_error(cli, tmp_path, flag):
    src = _save(tmp_path / "dyn.onnx", [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 4])],
                [_vi("y", ["n", 4])])
    result = cli("optimize", src, "-o", tmp_path / "out.onnx", "--no-time", *flag)
    assert result.code == 2
    assert "2**63-1" in one_error_line(result.err)
    with pytest.raises(UsageError, match="2\\*\\*63-1"):
        dmlopt.optimize(str(src), dims={"n": 2**63}, validate=False, retime=False)


def test_onnx_runtime_failing_while_timing_is_exit_2(cli, tmp_path):
    """Reshape of x[n] to [2, 3]: loads, but fails for the n = 1 that timing feeds."""
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "sh")
    src = _save(tmp_path / "badrun.onnx", [helper.make_node("Reshape", ["x", "sh"], ["y"])], [_vi("x", ["n"])],
                [_vi("y", [2, 3])], [shape])
    result = cli("bench", src, "--ep", "cpu", "--dim", "n=1")
    assert result.code == 2
    assert "failed to run the model on CPUExecutionProvider while timing it" in one_error_line(result.err)
