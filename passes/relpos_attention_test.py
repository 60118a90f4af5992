"""Tests of relpos-bias: a decomposed rel-pos bias folded into MultiHeadAttention's Q/K, numerics on ORT CPU."""

from __future__ import annotations

import importlib.resources

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.relpos_attention import RelPosBiasPass
from dmlopt.engine.pipeline import check_model
from dmlopt.runtime.validate import run

MS = "com.microsoft"


def mha_graph(*, batch=2, heads=3, rows_q=2, cols_q=3, grid=(4, 5), head=7, head_v=6, scale=0.3,
              row_shape=None, col_shape=None, bias="relpos", dtype=TensorProto.FLOAT, unidirectional=0):
    """MultiHeadAttention whose attention_bias is Reshape(Add(Rh (.., c, 1), Rw (.., 1, d))), every tensor an input."""
    c, d = grid
    seq_q, seq_kv = rows_q * cols_q, c * d
    lead = [batch * heads, rows_q, cols_q]
    row_shape = row_shape or lead + [c, 1]
    col_shape = col_shape or lead + [1, d]
    inputs = [helper.make_tensor_value_info("q", dtype, [batch, seq_q, heads * head]),
              helper.make_tensor_value_info("k", dtype, [batch, seq_kv, heads * head]),
              helper.make_tensor_value_info("v", dtype, [batch, seq_kv, heads * head_v])]
    nodes = []
    inits = [helper.make_tensor("bias_shape", TensorProto.INT64, [4], [batch, heads, seq_q, seq_kv])]
    if bias == "relpos":
        inputs += [helper.make_tensor_value_info("rh", dtype, row_shape),
                   helper.make_tensor_value_info("rw", dtype, col_shape)]
        nodes += [helper.make_node("Add", ["rh", "rw"], ["grid"]),
                  helper.make_node("Reshape", ["grid", "bias_shape"], ["bias"])]
    else:  # a plain (B, N, S, T) bias
        inputs.append(helper.make_tensor_value_info("bias", dtype, [batch, heads, seq_q, seq_kv]))
    attrs = {"num_heads": heads, "unidirectional": unidirectional}
    if scale is not None:
        attrs["scale"] = scale
    nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"], domain=MS,
                                  **attrs))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", dtype, [batch, seq_q, heads * head_v])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def fold(proto, choice="fold"):
    p = RelPosBiasPass(PassContext(target="cuda", options={"relpos_bias": choice}))
    result = p(ir.from_proto(proto))
    check_model(result.model, "relpos-bias")
    return result, p


def feeds_for(proto, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(dtype)
            for v in proto.graph.input}


def assert_same(proto, model, tol=1e-5, dtype=np.float32):
    feeds = feeds_for(proto, dtype=dtype)
    ref = run(ir.from_proto(proto), feeds)["y"]
    got = run(model, feeds)["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=tol, atol=tol)


def mha(model):
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "MultiHeadAttention"]


@pytest.mark.parametrize("choice", ["fold", "fold-pad-v"])
def test_decomposed_bias_folds_into_q_and_k_and_keeps_the_outputs(choice):
    proto = mha_graph()
    result, p = fold(proto, choice)
    assert result.modified
    (node,) = mha(result.model)
    assert len(node.inputs) == 3 or all(x is None for x in node.inputs[3:])  # no bias left
    assert not any(n.op_type == "Add" for n in result.model.graph)
    # head 7 + grid 4 + 5 = 16: already a multiple of 8, no padding
    assert node.inputs[0].shape.dims[-1] == 3 * 16
    assert node.attributes.get_float("scale") == pytest.approx(0.3)
    assert [s.action for s in p.sites] == ["rewrote"]
    assert_same(proto, result.model)


@pytest.mark.parametrize("kwargs", [
    dict(grid=(3, 2), head=5, rows_q=1, cols_q=4),  # padding to 16; S not a square
    dict(batch=1, heads=2, grid=(6, 6), head=8, head_v=8, scale=None),  # MHA's default scale 1/sqrt(8) kept
    dict(row_shape=[1, 2, 3, 4, 1], col_shape=[6, 1, 3, 1, 5]),  # leading dims that broadcast
    dict(row_shape=[4, 1], col_shape=[6, 2, 3, 1, 5]),  # a row term of lower rank
])
def test_any_sizes_and_broadcast_terms(kwargs):
    proto = mha_graph(**kwargs)
    result, _ = fold(proto)
    (node,) = mha(result.model)
    assert node.attributes.get_float("scale", 0.0) > 0  # written out: the new head size must not change it
    assert node.inputs[0].shape.dims[-1] % 8 == 0
    assert_same(proto, result.model)


def test_terms_given_in_column_then_row_order():
    proto = mha_graph()
    add = proto.graph.node[0]
    add.input[:] = ["rw", "rh"]
    result, _ = fold(proto)
    assert result.modified
    assert_same(proto, result.model)


def test_float16():
    proto = mha_graph(dtype=TensorProto.FLOAT16, scale=0.125, head=8, grid=(4, 4))
    result, _ = fold(proto)
    assert result.modified
    assert_same(proto, result.model, tol=2e-2, dtype=np.float16)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(bias="plain"), "not a Reshape"),
    (dict(unidirectional=1), "unidirectional"),
    (dict(row_shape=[6, 2, 3, 4, 5], col_shape=[6, 2, 3, 1, 5]), "not a (..., rows, 1)"),
])
def test_declines_with_reasons(kwargs, reason):
    proto = mha_graph(**kwargs)
    result, p = fold(proto)
    assert not result.modified
    assert p.sites and p.sites[0].action == "declined" and reason in p.sites[0].detail


def test_bias_read_elsewhere_is_declined():
    proto = mha_graph()
    proto.graph.output.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2, 3, 6, 20]))
    result, p = fold(proto)
    assert not result.modified and "read elsewhere" in p.sites[0].detail


def test_keep_leaves_the_model_alone():
    proto = mha_graph()
    result, p = fold(proto, "keep")
    assert not result.modified and not p.sites


@pytest.mark.parametrize("choice", ["fold", "fold-pad-v"])
def test_sam_encoder_has_no_attention_bias_and_validates(choice):
    path = importlib.resources.files("dmlopt.data") / "sam_small.onnx"
    result = dmlopt.optimize(str(path), target="cuda", retime=False, attention="fuse", relpos_bias=choice)
    assert result.passed
    nodes = mha(result.model)
    assert len(nodes) == 3  # 2 windowed blocks, 1 global
    assert all(len(n.inputs) <= 5 or n.inputs[5] is None for n in nodes)
    sites = [s for s in result.report.to_dict()["passes"] if s["name"] == "relpos-bias"][0]["sites"]
    assert [s["action"] for s in sites] == ["rewrote"] * 3
