"""gemm-weights: a constant B read transposed is stored transposed; computed, overridable or shared B declines."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.engine.pipeline import check_model
from dmlopt.passes import PassContext
from dmlopt.passes.gemm_weights import GemmWeightsPass


def mlp_model(*, rows=128, dim=256, wide=512, dtype=TensorProto.FLOAT, shared=False, b_input=False,
              constant_node=False, trans_a=False, opset=17):
    """Two Linear layers as torch.onnx writes 2-D nn.Linear: Gemm(x, W, b; transB=1), Relu between."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((wide, dim)) / np.sqrt(dim)).astype(np_dtype)
    w2 = w1.T.copy() if shared else (rng.standard_normal((dim, wide)) / np.sqrt(wide)).astype(np_dtype)
    b1, b2 = (rng.standard_normal(n).astype(np_dtype) for n in (wide, dim))
    inits = [numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(b2, "b2")]
    nodes, inputs = [], [helper.make_tensor_value_info("x", dtype, [dim, rows] if trans_a else [rows, dim])]
    if b_input:
        inputs.append(helper.make_tensor_value_info("w1", dtype, [wide, dim]))
    elif constant_node:
        nodes.append(helper.make_node("Constant", [], ["w1"], value=numpy_helper.from_array(w1)))
    else:
        inits.append(numpy_helper.from_array(w1, "w1"))
    second = ["h", "w1" if shared else "w2", "b2"]
    if not shared:
        inits.append(numpy_helper.from_array(w2, "w2"))
    nodes += [helper.make_node("Gemm", ["x", "w1", "b1"], ["g"], name="fc1", transB=1, transA=int(trans_a),
                               alpha=0.5, beta=2.0),
              helper.make_node("Relu", ["g"], ["h"], name="act"),
              # shared: tied weights, fc2 = h @ w1 as stored, so storing fc1's B transposed would keep w1 twice
              helper.make_node("Gemm", second, ["y"], name="fc2", transB=0 if shared else 1)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", dtype, [rows, dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def rewrite(proto, target="webgpu", **options):
    original = dmlopt.load(proto)
    p = GemmWeightsPass(PassContext(target=target, options=options) if options else PassContext(target=target))
    result = p(original.clone())
    check_model(result.model, "gemm-weights")
    return original, result.model, p


def gemms(model):
    """The Gemms by the layer they compute (a rewritten node has a new name; its output keeps the old)."""
    layer = {"g": "fc1", "y": "fc2"}
    return {layer[n.outputs[0].name]: n for n in model.graph if n.op_type == "Gemm"}


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("opset", [11, 17])
def test_transposed_weights_are_stored_transposed_and_numerics_hold(dtype, opset):
    original, out, p = rewrite(mlp_model(dtype=dtype, opset=opset))
    for name, k in (("fc1", 256), ("fc2", 512)):
        node = gemms(out)[name]
        assert node.attributes.get_int("transB", 0) == 0, name
        assert node.inputs[1].const_value.numpy().shape[0] == k  # (K, N): read as stored
    fc1 = gemms(out)["fc1"]  # alpha and beta kept
    assert fc1.attributes.get_float("alpha") == 0.5 and fc1.attributes.get_float("beta") == 2.0
    assert sorted(out.graph.initializers) == sorted(["b1", "b2", *(n.inputs[1].name for n in gemms(out).values())])
    assert {s.node: s.action for s in p.sites} == {"fc1": "rewrote", "fc2": "rewrote"}
    v = dmlopt.validate(original, out)  # ORT's CPU EP, the export's own inputs shape
    assert v.passed, v.to_table()


def test_trans_a_is_kept():
    original, out, _ = rewrite(mlp_model(trans_a=True))
    assert gemms(out)["fc1"].attributes.get_int("transA", 0) == 1
    assert gemms(out)["fc1"].attributes.get_int("transB", 0) == 0
    assert dmlopt.validate(original, out).passed


def test_a_constant_node_weight_is_stored_transposed():
    original, out, _ = rewrite(mlp_model(constant_node=True))
    assert gemms(out)["fc1"].attributes.get_int("transB", 0) == 0
    assert "Constant" not in {n.op_type for n in out.graph}  # the old weight, read by nothing, is gone
    assert dmlopt.validate(original, out).passed


@pytest.mark.parametrize("kwargs, site, reason", [
    ({"b_input": True}, "fc1", "B is computed, not a constant"),
    ({"shared": True}, "fc1", "B is read by 2 nodes"),
])
def test_declined_with_the_reason(kwargs, site, reason):
    original, out, p = rewrite(mlp_model(**kwargs))
    assert gemms(out)[site].attributes.get_int("transB", 0) == 1
    (entry,) = [s for s in p.sites if s.node == site]
    assert entry.action == "declined" and reason in entry.detail


def test_an_overridable_initializer_declines():
    proto = mlp_model()
    proto.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [512, 256]))
    proto.ir_version = 8
    original, out, p = rewrite(proto)
    assert gemms(out)["fc1"].attributes.get_int("transB", 0) == 1
    (entry,) = [s for s in p.sites if s.node == "fc1"]
    assert "graph input" in entry.detail


@pytest.mark.parametrize("target, options, changed", [
    ("cpu", {}, False), ("cuda", {}, False), ("dml", {}, True), ("webgpu", {"gemm_weights": "keep"}, False),
    ("cpu", {"gemm_weights": "as-stored"}, True)])
def test_defaults_per_target_and_the_option(target, options, changed):
    original, out, _ = rewrite(mlp_model(), target, **options)
    assert (gemms(out)["fc1"].attributes.get_int("transB", 0) == 0) is changed


def test_the_pipeline_writes_it_for_webgpu():
    result = dmlopt.optimize(mlp_model(), target="webgpu", retime=False)
    assert result.passed
    assert all(n.attributes.get_int("transB", 0) == 0 for n in result.model.graph if n.op_type == "Gemm")
    assert any(s["action"] == "rewrote" for p in result.report.to_dict()["passes"] if p["name"] == "gemm-weights"
               for s in p["sites"])
