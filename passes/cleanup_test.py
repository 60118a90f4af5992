"""cleanup: folding and dead-code removal keep control flow valid (size guard: tests/test_pipeline.py)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxscript import rewriter

import dmlopt
from dmlopt.passes import cleanup as cleanup_pass
from dmlopt.passes.cleanup import CleanupPass


def _loop_without_cond() -> onnx.ModelProto:
    """z = Loop(M=3, cond="", x) adding 1 each trip: the empty cond input must survive."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body), helper.make_node("Identity", ["y"], ["z"])],
        "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array(3, np.int64), "M")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("passes", [["cleanup"], ["freeze-shapes"], None], ids=["cleanup", "freeze-shapes", "all"])
def test_loop_keeps_its_empty_cond_input(passes):
    result = dmlopt.optimize(_loop_without_cond(), passes=passes, target="cpu", retime=False)
    assert result.passed
    (loop,) = [n for n in result.model.graph if n.op_type == "Loop"]
    assert len(loop.inputs) == 3 and loop.inputs[1] is None
    if passes != ["freeze-shapes"]:  # cleanup's identity removal still ran on the main graph
        assert [n.op_type for n in result.model.graph] == ["Loop"]


def test_dead_code_removal_keeps_empty_inputs_that_onnx_ir_would_trim():
    """onnx_ir 1.1's RemoveUnusedNodesPass cuts Loop(M, "", x)'s empty cond only when the loop
    has no carried value after it; `remove_unused_nodes`, which every pass uses, puts it back."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes

    from dmlopt.passes._base import remove_unused_nodes

    proto = _loop_without_cond()
    loop = proto.graph.node[0]
    del loop.input[2:]  # Loop(M, "") with no carried value: the form the trimming breaks
    body = next(a.g for a in loop.attribute if a.name == "body")
    del body.input[2:], body.output[1:], body.node[1:], body.initializer[:]
    del loop.output[:], proto.graph.node[1:]
    loop.output.append("scan_out")
    body.node.append(helper.make_node("Identity", ["cond_in"], ["copy"]))
    body.output.append(helper.make_tensor_value_info("copy", TensorProto.BOOL, []))
    proto.graph.output[0].CopyFrom(helper.make_tensor_value_info("scan_out", TensorProto.BOOL, [3]))
    del proto.graph.input[:]
    raw, ours = ir.from_proto(proto), ir.from_proto(proto)
    common_passes.RemoveUnusedNodesPass()(raw)
    remove_unused_nodes(ours)
    assert len(next(iter(raw.graph)).inputs) == 1  # what the library does
    assert len(next(iter(ours.graph)).inputs) == 2  # what dmlopt keeps


def _rule_signature(rule) -> tuple:
    """What a rule matches, checks and writes, without the ids of its anonymous values."""
    condition = getattr(rule, "_condition_function", None)
    return (type(rule).__name__, re.sub(r"anonymous:\d+", "v", str(rule._target_pattern)),
            getattr(condition, "__qualname__", None), type(rule._replacement_pattern).__name__)


def test_cleanup_rules_are_onnxscript_optimizers_rules_in_its_order():
    """cleanup builds optimize_ir's rule list from onnxscript's public rules: it must stay that list."""
    ours, theirs = cleanup_pass.optimizer_rules(), list(rewriter._DEFAULT_REWRITE_RULES)  # noqa: SLF001
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a is b or _rule_signature(a) == _rule_signature(b), (_rule_signature(a), _rule_signature(b))


def _two_flattens_of_one_tensor() -> onnx.ModelProto:
    """DETR's legacy export: two Flattens of one dynamic-batch tensor (here at two axes, so that the
    two Reshapes differ and common-subexpression elimination keeps both)."""
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["a"], axis=1, name="flatten_a"),
         helper.make_node("Flatten", ["x"], ["b"], axis=2, name="flatten_b"),
         helper.make_node("Relu", ["b"], ["c"], name="relu")],
        "two_flattens", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 3])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 12]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, ["N*4", 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_two_flattens_of_one_tensor_get_shape_initializers_of_their_own():
    """onnxscript's Flatten2Reshape names both shapes `x/shape`; the second used to replace the first
    one's registration, leaving an invalid model (the checker: not topologically sorted)."""
    import onnx_ir as ir

    result = dmlopt.optimize(_two_flattens_of_one_tensor(), passes=["cleanup"], target="cpu", retime=False)
    assert result.passed
    assert [n.op_type for n in result.model.graph] == ["Reshape", "Reshape", "Relu"]
    onnx.checker.check_model(ir.serde.serialize_model(result.model), full_check=True)
    names = [n.inputs[1].name for n in result.model.graph if n.op_type == "Reshape"]
    assert len(set(names)) == 2 and all(name in result.model.graph.initializers for name in names)


def split_to_sequence_model():
    """ONNX's test_split_to_sequence_1: a scalar `split` input, which onnxscript's folding fails on."""
    graph = helper.make_graph(
        [helper.make_node("SplitToSequence", ["data", "split"], ["seq"], axis=0)], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 6]),
         helper.make_tensor_value_info("split", TensorProto.INT64, [])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


def test_a_fold_onnxscript_fails_on_is_skipped_not_raised():
    model = dmlopt.load(split_to_sequence_model())
    p = CleanupPass()
    result = p(model)
    assert [n.op_type for n in result.model.graph] == ["SplitToSequence"]
    assert any(s.action == "kept" and "constant folding failed on it" in s.detail for s in p.sites)


def test_a_failing_optimizer_leaves_the_model_as_it_was(monkeypatch):
    import dmlopt.passes.cleanup as cleanup

    def broken(*_, **__):
        def run(model):
            model.graph.remove(next(iter(model.graph)), safe=False)  # a half-done change, then the failure
            raise ir.passes.PassError("inside onnx_ir")
        return run

    monkeypatch.setattr(cleanup, "optimizer_passes", broken)
    model = dmlopt.load(split_to_sequence_model())
    p = CleanupPass()
    assert not p(model).modified
    assert [n.op_type for n in model.graph] == ["SplitToSequence"]
    assert any("onnxscript's optimizer failed (PassError: inside onnx_ir)" in n for n in p.notes)


def ir3_model():
    """An IR-3 export (PyTorch's oldest): every initializer is a graph input too, as IR 3 requires;
    its Constant nodes become initializers in cleanup (test_PixelShuffle, test_operator_view)."""
    a = numpy_helper.from_array(np.full((2,), 2.0, np.float32), "a")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.full((2,), 3.0, np.float32))),
         helper.make_node("Add", ["x", "a"], ["xa"]), helper.make_node("Mul", ["xa", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [a])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)], ir_version=3)


def test_folds_into_an_ir3_model_are_graph_inputs_too():
    import onnxruntime as ort

    onnx.checker.check_model(ir3_model())
    model = dmlopt.load(ir3_model())
    assert CleanupPass()(model).modified
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto)  # "in initializer but not in graph input" before the fix
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": np.ones(2, np.float32)})[0], [9.0, 9.0])
