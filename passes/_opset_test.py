"""The one opset check (passes/_opset.py): forms a model's opset lacks are named, and no pass writes them."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes._opset import form_refusal, model_refusals
from dmlopt.passes.cleanup import CleanupPass
from dmlopt.passes.leaky_relu import LeakyReluPass
from dmlopt.passes.transpose import TransposePass

NEWEST = onnx.defs.onnx_opset_version()


def node(op, n_inputs, **attrs):
    values = [ir.Value(name=f"i{k}") for k in range(n_inputs)]
    return ir.node(op, values, attrs)


@pytest.mark.parametrize("op, n_inputs, attrs, opset, needle", [
    ("Gemm", 2, {}, 10, "takes 3-3 inputs, not 2"),
    ("Unsqueeze", 2, {}, 12, "takes 1-1 inputs, not 2"),
    ("Unsqueeze", 1, {}, 12, "needs attribute axes"),
    ("Mul", 2, {}, 6, "legacy 'broadcast'"),
    ("Gelu", 1, {}, 19, "does not exist at ai.onnx opset 19 (from opset 20)"),
    ("Relu", 1, {"alpha": 0.5}, 13, "has no attribute alpha"),
])
def test_forms_the_opset_lacks_are_named(op, n_inputs, attrs, opset, needle):
    assert needle in form_refusal(node(op, n_inputs, **attrs), {"": opset})


@pytest.mark.parametrize("op, n_inputs, attrs, opset", [
    ("Gemm", 2, {}, 11), ("Unsqueeze", 2, {}, 13), ("Unsqueeze", 1, {"axes": [0]}, 12), ("Mul", 2, {}, 7),
    ("Gelu", 1, {}, 20), ("Relu", 1, {}, 6)])
def test_forms_the_opset_has_pass(op, n_inputs, attrs, opset):
    assert form_refusal(node(op, n_inputs, **attrs), {"": opset}) is None


def test_constant_types_are_checked():
    int64 = ir.node("Constant", [], {"value": ir.tensor(np.array([1], np.int64))})
    assert "takes no tensor(int64)" in form_refusal(int64, {"": 8})
    assert form_refusal(int64, {"": 9}) is None
    assert form_refusal(ir.node("Constant", [], {"value": ir.tensor(np.array([1.0], np.float32))}), {"": 1}) is None


def test_domains_without_schemas_are_not_judged():
    assert form_refusal(ir.node("Gelu", [ir.Value(name="x")], domain="com.microsoft"), {"com.microsoft": 1}) is None


def _loads(model: ir.Model) -> None:
    proto = ir.serde.serialize_model(model)
    ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _model(nodes, inputs, outputs, inits, opset):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return dmlopt.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7))


def leaky_model(opset):
    return _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("LeakyRelu", ["r"], ["y"], alpha=0.1)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [], opset)


@pytest.mark.parametrize("strategy", ["decompose", "relu-split"])
def test_leaky_relu_writes_no_legacy_mul_at_opset_6(strategy):
    model = leaky_model(6)
    p = LeakyReluPass(PassContext(target="cpu", options={"leaky_relu": strategy}))
    p(model)
    assert not model_refusals(model)
    _loads(model)
    assert any(s.action == "declined" and "legacy 'broadcast'" in s.detail for s in p.sites)
    assert [n.op_type for n in model.graph] == ["Relu", "LeakyRelu"]


def test_leaky_relu_still_rewrites_at_opset_7():
    model = leaky_model(7)
    LeakyReluPass(PassContext(target="cpu", options={"leaky_relu": "decompose"}))(model)
    assert "Max" in [n.op_type for n in model.graph]
    _loads(model)


def unsqueeze_model(opset):
    return _model([helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
                   helper.make_node("Unsqueeze", ["u"], ["y"], axes=[0])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 3])], [], opset)


def test_cleanup_writes_no_unsqueeze_13_into_opset_12():
    model = unsqueeze_model(12)
    CleanupPass(PassContext(target="cpu"))(model)
    assert not model_refusals(model)
    _loads(model)


def gemm_model(opset):
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    return _model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                   helper.make_node("MatMul", ["x", "wt"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w], opset)


@pytest.mark.parametrize("opset", [7, 9, 10, 11, 13, NEWEST])
def test_transpose_pass_writes_what_the_opset_has(opset):
    model = gemm_model(opset)
    TransposePass(PassContext(target="dml"))(model)
    assert not model_refusals(model)
    _loads(model)


@pytest.mark.parametrize("source", ["x", "r"])
def test_identity_elimination_keeps_branch_outputs_inside_their_branch(source):
    """An If branch returning an outer value through Identity keeps it (ONNX's expanded AffineGrid)."""
    from dmlopt.graph.check import check_model
    from dmlopt.passes._base import eliminate_identities

    def branch(name):
        return helper.make_graph([helper.make_node("Identity", [source], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch("then"), else_branch=branch("else"))], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = dmlopt.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    eliminate_identities(model)
    check_model(model, "identity elimination")
    _loads(model)
