"""Tests of the attention pass: MultiHeadAttention fusion on hand-built and SAM graphs, numerics on ORT CPU."""

from __future__ import annotations

import importlib.resources

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.passes import EngineSettings, PassContext
from dmlopt.passes.attention import AttentionPass
from dmlopt.passes.einsum import EinsumPass
from dmlopt.passes.transpose import TransposePass, transpose_count
from dmlopt.engine.pipeline import check_model, op_counts
from dmlopt.runtime.validate import run, validate
from tests.ir_text import Graph

MHA = "com.microsoft.MultiHeadAttention"


def hf_attention(batch=2, seq=5, kv_seq=None, heads=3, head=4, mask=None, k_perm="0231", scale_on="scores",
                 opset=17, dynamic=False, nan_guard=False, mask_input=False):
    """BERT/ViT-style attention: separate q/k/v Linears, (0,2,1,3) head transposes, scale, mask, output merge."""
    g = Graph()
    hidden = heads * head
    kv_seq = kv_seq or seq
    x_shape = ["B", seq, hidden] if dynamic else [batch, seq, hidden]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    kv = "x"
    if kv_seq != seq:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [batch, kv_seq, hidden]))
        kv = "m"
    q = g("Add", g("MatMul", "x", g.weight(hidden, hidden)), g.weight(hidden))
    k = g("Add", g("MatMul", kv, g.weight(hidden, hidden)), g.weight(hidden))
    v = g("Add", g("MatMul", kv, g.weight(hidden, hidden)), g.weight(hidden))
    split_q = g.const([0 if dynamic else batch, seq, heads, head], np.int64)
    split_kv = g.const([0 if dynamic else batch, kv_seq, heads, head], np.int64)
    qh = g("Transpose", g("Reshape", q, split_q), perm=[0, 2, 1, 3])
    if k_perm == "0231":
        kt = g("Transpose", g("Reshape", k, split_kv), perm=[0, 2, 3, 1])
    else:  # k heads first, then swap the last two axes
        kt = g("Transpose", g("Transpose", g("Reshape", k, split_kv), perm=[0, 2, 1, 3]), perm=[0, 1, 3, 2])
    vh = g("Transpose", g("Reshape", v, split_kv), perm=[0, 2, 1, 3])
    if scale_on == "q":
        qh = g("Mul", qh, g.const(head ** -0.5))
    scores = g("MatMul", qh, kt)
    if scale_on == "scores":
        scores = g("Div", scores, g.const(head ** 0.5))
    if mask_input:  # a bias computed at run time, e.g. from BERT's attention_mask
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, 1, kv_seq]))
        scores = g("Add", scores, "mask")
    elif mask is not None:
        scores = g("Add", scores, g.const(mask))
    probs = g("Softmax", scores, axis=-1 if opset >= 13 else 3)
    if nan_guard:  # torch's dynamo SDPA: Where(IsNaN(P), 0, P)
        probs = g("Where", g("IsNaN", probs), g.const(0.0), probs)
    out = g("MatMul", probs, vh)
    merged = g("Reshape", g("Transpose", out, perm=[0, 2, 1, 3]), g.const([0 if dynamic else batch, seq, hidden],
                                                                           np.int64))
    y = g("MatMul", merged, g.weight(hidden, hidden))
    return g.model(inputs, y, opset, shape=x_shape)


def fuse(proto, target="cpu", ort_version=None, choice="fuse"):
    model = ir.from_proto(proto) if isinstance(proto, onnx.ModelProto) else proto
    p = AttentionPass(PassContext(target=target, ort_version=ort_version, options={"attention": choice}))
    result = p(model)
    check_model(result.model, "attention")
    return result, p


def feeds_for(proto, seed=1):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
            for v in proto.graph.input}


def assert_same(proto, model, feeds=None):
    feeds = feeds or feeds_for(proto)
    ref = run(ir.from_proto(proto), feeds)
    got = run(model, feeds)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


def mha_nodes(model):
    return [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "MultiHeadAttention"]


# ** hand-built attention **

def test_bert_style_attention_becomes_one_mha_without_transposes():
    proto = hf_attention()
    assert transpose_count(ir.from_proto(proto)) == 4
    result, p = fuse(proto)
    counts = op_counts(result.model)
    assert counts[MHA] == 1 and "Softmax" not in counts and transpose_count(result.model) == 0
    (mha,) = mha_nodes(result.model)
    assert mha.attributes.get_int("num_heads") == 3
    assert mha.attributes.get_float("scale") == pytest.approx(0.5)
    assert len(mha.inputs) == 3  # no bias
    assert p.sites[0].action == "rewrote"
    assert_same(proto, result.model)


@pytest.mark.parametrize("k_perm", ["0231", "0213+swap"])
@pytest.mark.parametrize("scale_on", ["q", "scores"])
def test_key_layouts_and_scale_positions(k_perm, scale_on):
    proto = hf_attention(k_perm=k_perm, scale_on=scale_on)
    result, _ = fuse(proto)
    assert op_counts(result.model)[MHA] == 1 and transpose_count(result.model) == 0
    assert_same(proto, result.model)


def test_padding_mask_bias_is_expanded_to_s_and_t_on_cpu_and_fully_on_dml():
    mask = np.zeros((2, 1, 1, 5), np.float32)
    mask[1, 0, 0, 3:] = -1e4
    proto = hf_attention(mask=mask)
    for target, bias_shape in (("cpu", [2, 1, 5, 5]), ("dml", [2, 3, 5, 5])):
        result, _ = fuse(proto, target=target)
        (mha,) = mha_nodes(result.model)
        bias = mha.inputs[5]
        assert list(bias.shape.dims) == bias_shape
        assert_same(proto, result.model)


@pytest.mark.parametrize("mask", [None, "finite"])
def test_dynamo_nan_guard_goes_with_the_softmax_when_no_bias_can_mask_a_row(mask):
    """torch's dynamo exporter guards P with Where(IsNaN(P), 0, P) (ViT, DETR, every HF model with
    dynamo=True): without a bias, or with a finite constant one, it is the identity for finite scores."""
    if mask == "finite":
        mask = np.zeros((2, 1, 1, 5), np.float32)
        mask[1, 0, 0, 3:] = -1e4
    proto = hf_attention(mask=mask, nan_guard=True)
    result, p = fuse(proto)
    counts = op_counts(result.model)
    assert counts[MHA] == 1 and not {"Softmax", "IsNaN", "Where"} & set(counts)
    assert p.sites[0].op == "MatMul" and p.sites[0].action == "rewrote"
    assert_same(proto, result.model)


@pytest.mark.parametrize("how", ["run-time bias", "-inf constant"])
def test_dynamo_nan_guard_is_declined_where_a_bias_may_mask_a_whole_row(how):
    """A fully masked row gives NaN from Softmax, which the guard makes 0: with a bias computed at run
    time (BERT's attention mask) or holding -inf, fusing could change it, so the site is declined."""
    if how == "run-time bias":
        proto = hf_attention(nan_guard=True, mask_input=True)
    else:
        mask = np.zeros((2, 1, 1, 5), np.float32)
        mask[1, 0, 0, :] = -np.inf
        proto = hf_attention(mask=mask, nan_guard=True)
    result, p = fuse(proto)
    assert MHA not in op_counts(result.model)
    (site,) = p.sites
    assert site.action == "declined" and "Where(IsNaN(P), 0, P)" in site.detail
    assert_same(proto, result.model)


def test_cross_attention_with_other_key_length():
    proto = hf_attention(seq=5, kv_seq=7)
    result, _ = fuse(proto)
    (mha,) = mha_nodes(result.model)
    assert [list(v.shape.dims) for v in mha.inputs[:3]] == [[2, 5, 12], [2, 7, 12], [2, 7, 12]]
    assert_same(proto, result.model)


def test_opset_11_softmax_over_the_last_axis_fuses():
    proto = hf_attention(opset=11)
    result, _ = fuse(proto)
    assert op_counts(result.model)[MHA] == 1
    assert_same(proto, result.model)


def test_softmax_on_a_4d_view_of_3d_scores():
    """scores (B*N, S, T) -> Reshape (B, N, S, T) + mask -> Softmax -> Reshape back -> P.V."""
    g = Graph()
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 12])]
    qkv = g("MatMul", "x", g.weight(12, 36))
    heads = g("Transpose", g("Reshape", qkv, g.const([2, 5, 3, 3, 4], np.int64)), perm=[2, 0, 3, 1, 4])
    q, k, v = (g("Reshape", g("Gather", heads, g.const(i, np.int64), axis=0), g.const([6, 5, 4], np.int64))
               for i in range(3))
    scores = g("Reshape", g("MatMul", q, g("Transpose", k, perm=[0, 2, 1])), g.const([2, 3, 5, 5], np.int64))
    mask = np.where(np.arange(5) < 4, 0.0, -1e4).reshape(1, 1, 1, 5)
    probs = g("Reshape", g("Softmax", g("Add", scores, g.const(mask)), axis=-1), g.const([6, 5, 5], np.int64))
    out = g("Reshape", g("Transpose", g("Reshape", g("MatMul", probs, v), g.const([2, 3, 5, 4], np.int64)),
                         perm=[0, 2, 1, 3]), g.const([2, 5, 12], np.int64))
    proto = g.model(inputs, out, shape=[2, 5, 12])
    result, _ = fuse(proto, target="dml")
    (mha,) = mha_nodes(result.model)
    assert list(mha.inputs[5].shape.dims) == [2, 3, 5, 5] and transpose_count(result.model) == 0
    assert_same(proto, result.model)


# ** declines **

def test_symbolic_batch_is_declined_with_a_reason():
    proto = hf_attention(dynamic=True)
    result, p = fuse(proto)
    assert MHA not in op_counts(result.model)
    assert p.sites[0].action == "declined" and "static" in p.sites[0].detail


def test_softmax_not_over_the_last_axis_is_declined():
    proto = hf_attention()
    for node in proto.graph.node:
        if node.op_type == "Softmax":
            node.attribute[0].i = 2
    result, p = fuse(proto)
    assert MHA not in op_counts(result.model) and "last axis" in p.sites[0].detail


def test_probabilities_read_elsewhere_are_declined():
    proto = hf_attention()
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    proto.graph.output.append(helper.make_tensor_value_info(softmax.output[0], TensorProto.FLOAT, None))
    result, p = fuse(proto)
    assert MHA not in op_counts(result.model) and "read elsewhere" in p.sites[0].detail
    assert_same(proto, result.model)


def test_head_layouts_fuse_when_slices_suffice_and_decline_when_a_copy_is_needed():
    """Whatever the head layout, MHA is used when its (B, S, N*H) inputs need no copy."""
    g = Graph()
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 5, 4]) for n in ("q", "k", "v")]
    kt = g("Transpose", "k", perm=[0, 1, 3, 2])
    probs = g("Softmax", g("MatMul", "q", kt), axis=-1)
    proto = g.model(inputs, g("MatMul", probs, "v"))
    result, p = fuse(proto)
    (mha,) = mha_nodes(result.model)  # fused with one head per batch: (B*N, S, H) needs no copy
    assert mha.attributes.get_int("num_heads") == 1
    assert_same(proto, result.model)
    g = Graph()  # (S, B*N, H) in memory is (1, S, N*H): six heads of a batch of one
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [5, 6, 4]) for n in ("q", "k", "v")]
    qh, kh, vh = (g("Transpose", n, perm=[1, 0, 2]) for n in ("q", "k", "v"))
    probs = g("Softmax", g("MatMul", qh, g("Transpose", kh, perm=[0, 2, 1])), axis=-1)
    proto = g.model(inputs, g("MatMul", probs, vh))
    result, p = fuse(proto)
    (mha,) = mha_nodes(result.model)
    assert mha.attributes.get_int("num_heads") == 6 and list(mha.inputs[0].shape.dims) == [1, 5, 24]
    assert_same(proto, result.model)
    g = Graph()  # q stored (B*N, H, S): every (B, S, N*H) layout needs a copy
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [6, 4, 5])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [6, 5, 4]) for n in ("k", "v")]
    qh = g("Transpose", "q", perm=[0, 2, 1])
    probs = g("Softmax", g("MatMul", qh, g("Transpose", "k", perm=[0, 2, 1])), axis=-1)
    proto = g.model(inputs, g("MatMul", probs, "v"))
    result, p = fuse(proto)
    assert MHA not in op_counts(result.model) and "copy" in p.sites[0].detail


def test_keep_and_old_directml_leave_attention_alone():
    proto = hf_attention()
    result, _ = fuse(proto, choice="keep")
    assert MHA not in op_counts(result.model) and not result.modified
    result, p = fuse(proto, target="dml", ort_version="1.14")
    assert MHA not in op_counts(result.model) and "1.15" in p.notes[0]
    result, _ = fuse(proto, target="dml", ort_version="1.16")
    assert op_counts(result.model)[MHA] == 1


@pytest.mark.parametrize("target,fp16,fused", [("dml", False, True), ("cuda", False, False), ("cuda", True, True),
                                               ("cpu", False, False), ("webgpu", False, True)])
def test_auto_follows_the_target_default_when_run_alone(target, fp16, fused):
    """CUDA's default depends on the precision the model is written in: fused only for float16."""
    model = ir.from_proto(hf_attention())
    p = AttentionPass(PassContext(target=target, options={"attention": "auto"},
                                  precision="float16" if fp16 else "float32"))
    result = p(model)
    assert (MHA in op_counts(result.model)) is fused
    if target == "cuda":  # the note names the precision whose default applied
        assert f"--target cuda in {'float16' if fp16 else 'float32'}" in p.notes[0]


def test_a_site_the_target_ep_computes_wrongly_is_declined_with_its_reason():
    """EngineSettings.kernel_check (the WebGPU EP's verdict in the pipeline) is asked per site, with the
    site's shapes and precision; a refusal declines that site only, its reason in the report."""
    asked = []

    def check(op_type, site):
        asked.append((op_type, site))
        return "wrong on this adapter" if site["seq_q"] >= 6 else None

    short, long_ = hf_attention(seq=5), hf_attention(seq=7)
    for proto, fused in ((short, True), (long_, False)):
        p = AttentionPass(PassContext(target="webgpu", options={"attention": "fuse"},
                                      engine=EngineSettings(kernel_check=check)))
        result = p(ir.from_proto(proto))
        assert (MHA in op_counts(result.model)) is fused
        if not fused:
            (site,) = [s for s in p.sites if s.op == "MatMul"]
            assert site.action == "declined" and site.detail == "wrong on this adapter"
            assert_same(proto, result.model)
    assert [a[0] for a in asked] == ["MultiHeadAttention"] * 2
    assert asked[1][1] == dict(batch=2, heads=3, seq_q=7, seq_kv=7, head_qk=4, head_v=4, bias=False, dtype="float32")


def test_attention_in_an_if_branch_is_fused():
    body = hf_attention()
    then_graph = helper.make_graph(list(body.graph.node), "then", [], [helper.make_tensor_value_info(
        body.graph.output[0].name, TensorProto.FLOAT, [2, 5, 12])], list(body.graph.initializer))
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 5, 12])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                              "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 12])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result, _ = fuse(proto)
    assert len(mha_nodes(result.model)) == 1
    feeds = {"c": np.array(True), "x": np.random.default_rng(3).standard_normal((2, 5, 12)).astype(np.float32)}
    assert_same(proto, result.model, feeds)


# ** SAM: packed qkv, windows, decomposed relative positions **

@pytest.fixture(scope="module")
def sam_small():
    path = importlib.resources.files("dmlopt.data") / "sam_small.onnx"
    original = dmlopt.load(str(path))
    cleaned = dmlopt.optimize(original, passes="cleanup", validate=False).model
    return original, cleaned


def test_sam_attention_fuses_with_its_rel_pos_bias(sam_small):
    original, cleaned = sam_small
    model = cleaned.clone()
    result, p = fuse(model, target="dml")
    nodes = mha_nodes(result.model)
    # blocks 0-1: 4 windows of 5x5 tokens, block 2: global 8x8; 3 heads of 16
    assert sorted((n.inputs[0].shape[0], n.inputs[0].shape[1]) for n in nodes) == [(1, 64), (4, 25), (4, 25)]
    assert all(list(n.inputs[5].shape.dims) == [n.inputs[0].shape[0], 3, n.inputs[0].shape[1],
                                                n.inputs[0].shape[1]] for n in nodes)
    assert "Softmax" not in op_counts(result.model)
    assert validate(original, result.model).passed


def test_sam_encoder_after_einsum_transpose_attention(sam_small):
    """The issue's show: zero Einsum, Transposes down from the export's, numerics equal."""
    original, cleaned = sam_small
    model = cleaned.clone()
    context = PassContext(target="dml", options={"attention": "fuse", "einsum_layout": "fewest-transposes"})
    for pass_cls in (EinsumPass, TransposePass, AttentionPass):
        pass_cls(context)(model)
        check_model(model, pass_cls.name)
    counts = op_counts(model)
    assert "Einsum" not in counts and counts[MHA] == 3
    # export: 17 Transposes; left: patch embed, neck, 2 window partitions + 2 unpartitions, one q
    # per block for the rel-pos terms (MHA takes q token-major, the rel-pos MatMuls head-major),
    # and the Transpose inside F.pad's shape arithmetic that cleanup does not fold.
    assert transpose_count(original) == 17 and transpose_count(model) == 10
    assert validate(original, model).passed
