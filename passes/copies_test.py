"""copies: each predicted cause of a DirectML CPU fallback or graph split goes, numerics equal."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.targets.dml import placement
from dmlopt.passes import PassContext, all_passes
from dmlopt.passes.copies import CopiesPass, cast_round_trip_exact
from dmlopt.engine.pipeline import check_model, op_counts

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


def model(text: str) -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(text))


def rewrite(m: ir.Model, ort_version: str | None = "1.14"):
    p = CopiesPass(PassContext(target="dml", ort_version=ort_version))
    result = p(m.clone())
    check_model(result.model, "copies")
    return result, p


def sites(p: CopiesPass, action: str) -> list[str]:
    return [s.detail for s in p.sites if s.action == action]


def assert_same_numerics(original: ir.Model, out: ir.Model) -> None:
    v = dmlopt.validate(original, out)
    assert v.passed, v.to_table()


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_nary_becomes_binary_chain_and_the_graph_compiles(op):
    m = model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] a, float[2, 3] b, float[3] c, float[2, 1] d) => (float[2, 3] y) {{
        r = Relu(a)
        s = {op}(r, b, c, d)
        y = Relu(s)
    }}""")
    assert not placement.predict(m, ort_version="1.14").partitions["compiled"]
    result, p = rewrite(m)
    assert op_counts(result.model) == {op: 3, "Relu": 2}
    assert all(len(n.inputs) == 2 for n in result.model.graph if n.op_type == op)
    assert sites(p, "rewrote") == [f"4-input {op} -> 3 binary {op}"]
    assert_same_numerics(m, result.model)
    assert placement.predict(result.model, ort_version="1.14").partitions["compiled"]


def test_nary_mean_becomes_sum_chain_over_n():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 5] a, float[4, 5] b, float[5] c) => (float[4, 5] y) {
        y = Mean(a, b, c)
    }""")
    result, p = rewrite(m)
    assert op_counts(result.model) == {"Sum": 2, "Div": 1, "Constant": 1}
    assert_same_numerics(m, result.model)


def test_single_input_sum_becomes_nothing_and_binary_mean_is_kept():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] a, float[4] b) => (float[4] y, float[4] z) {
        r = Relu(a)
        y = Sum(r)
        z = Mean(r, b)
    }""")
    result, _ = rewrite(m)
    assert op_counts(result.model) == {"Relu": 1, "Mean": 1}  # the Identity is eliminated too
    assert_same_numerics(m, result.model)


@pytest.mark.parametrize("approximate, ops", [
    ("none", {"com.microsoft.Gelu": 1}),
    ("tanh", {"Mul": 6, "Add": 2, "Tanh": 1, "Constant": 4}),
])
def test_onnx_gelu_20_becomes_something_directml_runs(approximate, ops):
    m = model(f"""
    <ir_version: 9, opset_import: ["" : 20]>
    g (float[3, 16] x) => (float[3, 16] y) {{
        y = Gelu <approximate = "{approximate}"> (x)
    }}""")
    assert placement.predict(m, ort_version="1.23").cpu_count == 1
    result, _ = rewrite(m, "1.23")
    assert op_counts(result.model) == ops
    assert_same_numerics(m, result.model)
    assert placement.predict(result.model, ort_version="1.23").cpu_count == 0


LAYER_NORM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 8] x, float[8] s, float[8] b) => (float[2, 8] y, float[2, 8] z OUTPUTS) {
    y, mean, inv = LayerNormalization(x, s, b)
    z = LayerNormalization <epsilon = 0.001> (x, s)
}"""


def test_layer_norm_unused_outputs_dropped_and_zero_bias_added_for_1_14():
    m = model(LAYER_NORM.replace("OUTPUTS", ""))
    assert placement.predict(m, ort_version="1.14").cpu_count == 2
    result, p = rewrite(m, "1.14")
    lns = [n for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert [len(n.outputs) for n in lns] == [1, 1] and [len(n.inputs) for n in lns] == [3, 3]
    assert lns[1].attributes["epsilon"].value == pytest.approx(0.001)
    assert_same_numerics(m, result.model)
    assert placement.predict(result.model, ort_version="1.14").cpu_count == 0


def test_layer_norm_bias_left_alone_where_the_ep_takes_none_and_used_mean_declined():
    m = model(LAYER_NORM.replace("OUTPUTS", ", float[2, 1] mean"))
    result, p = rewrite(m, "1.23")
    lns = [n for n in result.model.graph if n.op_type == "LayerNormalization"]
    assert [len(n.outputs) for n in lns] == [3, 1] and [len(n.inputs) for n in lns] == [3, 2]
    assert any("Mean/InvStdDev output mean is used" in d for d in sites(p, "declined"))


@pytest.mark.parametrize("via, removed", [(11, True), (10, False)])  # double: lossless; float16: lossy
def test_cast_round_trip_removed_only_when_lossless(via, removed):
    m = model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y) {{
        a = Relu(x)
        c = Cast <to = {via}> (a)
        d = Cast <to = 1> (c)
        y = Relu(d)
    }}""")
    result, p = rewrite(m, "1.23")
    assert op_counts(result.model) == ({"Relu": 2} if removed else {"Relu": 2, "Cast": 2})
    if removed:
        assert_same_numerics(m, result.model)
        assert placement.predict(result.model, ort_version="1.23").copy_count == 0
    else:
        assert any("FLOAT -> FLOAT16 -> FLOAT is lossy" in d for d in sites(p, "declined"))


def test_cast_round_trip_table():
    D = ir.DataType
    assert cast_round_trip_exact(D.FLOAT, D.DOUBLE) and cast_round_trip_exact(D.FLOAT16, D.FLOAT)
    assert cast_round_trip_exact(D.INT32, D.INT64) and cast_round_trip_exact(D.INT32, D.DOUBLE)
    assert cast_round_trip_exact(D.INT16, D.FLOAT) and cast_round_trip_exact(D.BOOL, D.INT8)
    assert not cast_round_trip_exact(D.FLOAT, D.FLOAT16) and not cast_round_trip_exact(D.INT64, D.DOUBLE)
    assert not cast_round_trip_exact(D.INT32, D.FLOAT) and not cast_round_trip_exact(D.INT64, D.INT32)
    assert not cast_round_trip_exact(D.UINT32, D.INT32) and not cast_round_trip_exact(D.DOUBLE, D.FLOAT)


IF_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x COND_INPUT) => (float[4] y) {
    a = Relu(x)
    COND
    y = If(c) <then_branch = t () => (float[4] o) { o = Sigmoid(a) },
              else_branch = e () => (float[4] o) { o = Neg(a) }>
}"""


def test_constant_if_is_inlined_and_partitioning_comes_back():
    m = model(IF_MODEL.replace("COND_INPUT", "").replace("COND", "c = Constant <value = bool {1}> ()"))
    # Measured (1.17.3 and 1.24.3, `run.sh /tmp/dmlkit V const_if.onnx --list-nodes`): ORT's level-1 constant
    # folding inlines a constant If itself, one compiled partition; without that step the If blocks partitioning.
    assert placement.predict(m, ort_version="1.23").partitions["compiled"]
    before = placement.predict(m, ort_version="1.23", fold=False)
    assert not before.partitions["compiled"] and "If/Loop/Scan" in before.partitions["blockers"][0]
    result, p = rewrite(m, "1.23")
    assert op_counts(result.model) == {"Relu": 1, "Sigmoid": 1}
    assert_same_numerics(m, result.model)
    assert placement.predict(result.model, ort_version="1.23").partitions["compiled"]


def test_if_with_a_runtime_condition_is_declined():
    m = model(IF_MODEL.replace("COND_INPUT", ", bool c").replace("COND", ""))
    result, p = rewrite(m, "1.23")
    assert op_counts(result.model) == {"Relu": 1, "If": 1, "Sigmoid": 1, "Neg": 1}
    assert any("If condition is computed at run time" in d for d in sites(p, "declined"))


@pytest.mark.parametrize("cond", ["c = Constant <value = bool {1}> ()", ""])
def test_a_loop_keeps_its_empty_cond_input(cond):
    # onnx_ir's dead-code removal after the rewrites (or the If folding) used to cut Loop(m, "") to Loop(m).
    cond_input = "" if cond else ", bool c"
    m = model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] a, float[2, 3] b, float[2, 3] d{cond_input}) => (float[2, 3] y, float[3, 2, 3] s) {{
        {cond}
        y = If(c) <then_branch = t () => (float[2, 3] o) {{ o = Sum(a, b, d) }},
                  else_branch = e () => (float[2, 3] o2) {{ o2 = Neg(a) }}>
        m = Constant <value = int64 {{3}}> ()
        s = Loop(m, "") <body = body (int64 i, bool cond_in) => (bool cond_out, float[2, 3] step) {{
            cond_out = Identity(cond_in)
            step = Max(a, b, d)
        }}>
    }}""")
    result, p = rewrite(m)  # rewrite() runs the checker
    loop = next(n for n in result.model.graph if n.op_type == "Loop")
    assert len(loop.inputs) == 2 and loop.inputs[1] is None
    assert [n.op_type for n in loop.attributes["body"].as_graph()] == ["Identity", "Max", "Max"]
    assert "3-input Sum -> 2 binary Sum" in sites(p, "rewrote")
    if cond:
        assert "If" not in op_counts(result.model)
        assert_same_numerics(m, result.model)


def test_shape_inference_never_serializes_the_weights(monkeypatch):
    """Every onnx inference the pass and its placement predictions run gets a proto without the 4 MiB weight."""
    weight = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["h"]), onnx.helper.make_node("Sum", ["h", "x", "x"], ["y"])],
        "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 1024])],
        [onnx.numpy_helper.from_array(weight, "w")])
    m = ir.from_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]))
    sizes = []
    infer = onnx.shape_inference.infer_shapes

    def recording(proto, *args, **kwargs):
        sizes.append(proto.ByteSize())
        return infer(proto, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", recording)
    result = CopiesPass(PassContext(target="dml", ort_version="1.14"))(m)
    assert op_counts(result.model) == {"MatMul": 1, "Sum": 2}
    assert len(sizes) >= 3 and max(sizes) < 64 * 1024, sizes  # the pass, placement before and after


def test_notes_give_predicted_counts_before_and_after():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] a, float[4] b, float[4] c) => (float[4] y) {
        r = Relu(a)
        y = Sum(r, b, c)
    }""")
    _, p = rewrite(m, "1.14")
    # before: Relu compiles alone, the 3-input Sum runs as a standalone kernel
    assert p.notes[0] == ("DirectML placement (ORT 1.14 model): 0 CPU nodes, 0 copies, 1 DML partitions -> "
                          "0 CPU nodes, 0 copies, 1 DML partitions (whole graph compiled)")


def test_enabled_for_dml_only_and_registered_after_einsum():
    assert CopiesPass(PassContext(target="dml")).enabled()
    assert not CopiesPass(PassContext(target="cuda")).enabled()
    names = list(all_passes())
    assert names.index("copies") > names.index("einsum")


def test_sam_small_under_1_14_ends_with_no_cpu_nodes_no_copies_one_partition():
    """The full default pipeline (einsum lowering, then this pass) on the bundled small SAM encoder."""
    original = dmlopt.load(DATA / "sam_small.onnx")
    before = placement.predict(original, ort_version="1.14")
    assert before.cpu_count > 0 and before.copy_count > 0
    result = dmlopt.optimize(original, target="dml", ort_version="1.14")
    assert result.passed, result.report.validation
    after = placement.predict(result.model, ort_version="1.14")
    assert after.cpu_count == 0 and after.copy_count == 0
    assert after.partitions["count"] == 1 and after.partitions["compiled"]
    v = dmlopt.validate(original, result.model)
    assert v.passed, v.to_table()
