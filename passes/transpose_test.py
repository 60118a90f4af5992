"""Tests of the transpose pass: exact op types and Transpose counts, numerics on ORT's CPU EP."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from dmlopt.passes import PassContext, SiteRule
from dmlopt.passes.transpose import TransposePass, transpose_count
from dmlopt.engine.pipeline import check_model, op_counts
from dmlopt.runtime.validate import run


def parse(text: str, initializers: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n' + text)
    for name, value in (initializers or {}).items():
        proto.graph.initializer.append(numpy_helper.from_array(value, name))
    return proto


def optimize(proto, pass_cls=TransposePass, target="dml"):
    model = ir.from_proto(proto)
    p = pass_cls(PassContext(target=target))
    result = p(model)
    check_model(result.model, "transpose")
    return result, p


def feeds_for(proto, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in proto.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_same(proto, model, feeds=None):
    feeds = feeds or feeds_for(proto)
    ref = run(ir.from_proto(proto), feeds)
    got = run(model, feeds)
    for name in ref:
        assert got[name].shape == ref[name].shape
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-5, atol=1e-5)


def ops(model):
    """Op types in graph order, Constant nodes (shape vectors, axes) left out."""
    return [n.op_type for n in model.graph if n.op_type != "Constant"]


RNG = np.random.default_rng(0)


# ** case 1: pairs and chains (onnxscript's rules) **

def test_inverse_pair_cancels():
    proto = parse("""g (float[2,3,4] x) => (float[2,3,4] y) {
        t = Transpose <perm = [1, 2, 0]> (x)
        u = Transpose <perm = [2, 0, 1]> (t)
        y = Relu(u)
    }""")
    result, p = optimize(proto)
    assert ops(result.model) == ["Relu"]
    assert p.notes == ["Transposes: 2 -> 0"]
    assert_same(proto, result.model)


def test_chain_merges_into_one():
    proto = parse("""g (float[2,3,4] x) => (float[3,2,4] y) {
        t = Transpose <perm = [1, 2, 0]> (x)
        y = Transpose <perm = [0, 2, 1]> (t)
    }""")
    result, _ = optimize(proto)
    (node,) = list(result.model.graph)
    assert node.op_type == "Transpose" and list(node.attributes.get_ints("perm")) == [1, 0, 2]
    assert_same(proto, result.model)


def test_identity_permutation_is_dropped():
    proto = parse("""g (float[2,3] x) => (float[2,3] y) {
        t = Transpose <perm = [0, 1]> (x)
        y = Relu(t)
    }""")
    result, _ = optimize(proto)
    assert ops(result.model) == ["Relu"]


# ** case 2: constants **

def test_transpose_of_a_weight_is_folded():
    w = RNG.standard_normal((5, 4)).astype(np.float32)
    proto = parse("""g (float[3,4] x) => (float[3,5] y) {
        wt = Transpose <perm = [1, 0]> (w)
        y = MatMul(x, wt)
    }""", {"w": w})
    result, _ = optimize(proto)
    assert ops(result.model) == ["MatMul"]
    (matmul,) = list(result.model.graph)
    np.testing.assert_array_equal(matmul.inputs[1].const_value.numpy(), w.T)
    assert_same(proto, result.model)


# ** case 3: size-1 moves **

def test_transpose_of_size_one_dims_becomes_a_reshape():
    proto = parse("""g (float[1,5,1,7] x) => (float[5,1,7,1] y) {
        y = Transpose <perm = [1, 0, 3, 2]> (x)
    }""")
    result, p = optimize(proto)
    assert ops(result.model) == ["Reshape"]
    assert "size-1" in p.sites[0].detail
    assert_same(proto, result.model)


def test_size_one_move_with_one_symbolic_dim_uses_minus_one():
    proto = parse("""g (float[N,1,7] x) => (float[N,7,1] y) {
        y = Transpose <perm = [0, 2, 1]> (x)
    }""")
    result, _ = optimize(proto)
    assert ops(result.model) == ["Reshape"]
    (reshape,) = [n for n in result.model.graph if n.op_type == "Reshape"]
    assert reshape.inputs[1].const_value.numpy().tolist() == [-1, 7, 1]
    feeds = {"x": RNG.standard_normal((3, 1, 7)).astype(np.float32)}
    assert_same(proto, result.model, feeds)


def test_size_one_move_with_two_symbolic_dims_is_declined():
    proto = parse("""g (float[N,1,M] x) => (float[N,M,1] y) {
        y = Transpose <perm = [0, 2, 1]> (x)
    }""")
    result, p = optimize(proto)
    assert ops(result.model) == ["Transpose"]
    assert any(s.action == "declined" and "two symbolic" in s.detail for s in p.sites)


# ** case 4: Gemm/MatMul absorb transposes **

def test_gemm_absorbs_transposes_of_both_inputs():
    proto = parse("""g (float[4,3] a, float[5,4] b, float[5] c) => (float[3,5] y) {
        at = Transpose <perm = [1, 0]> (a)
        bt = Transpose <perm = [1, 0]> (b)
        y = Gemm <alpha = 0.5, transB = 0> (at, bt, c)
    }""")
    result, _ = optimize(proto)
    (gemm,) = list(result.model.graph)
    assert gemm.op_type == "Gemm"
    assert gemm.attributes.get_int("transA") == 1 and gemm.attributes.get_int("transB") == 1
    assert gemm.attributes.get_float("alpha") == 0.5
    assert_same(proto, result.model)


def test_2d_matmul_with_transposed_input_becomes_gemm():
    proto = parse("""g (float[4,3] a, float[4,5] b) => (float[3,5] y) {
        at = Transpose <perm = [1, 0]> (a)
        y = MatMul(at, b)
    }""")
    result, _ = optimize(proto)
    (gemm,) = list(result.model.graph)
    assert gemm.op_type == "Gemm" and gemm.attributes.get_int("transA") == 1
    assert_same(proto, result.model)


def test_transpose_of_a_2d_matmul_becomes_gemm():
    proto = parse("""g (float[3,4] a, float[4,5] b) => (float[5,3] y) {
        m = MatMul(a, b)
        y = Transpose <perm = [1, 0]> (m)
    }""")
    result, _ = optimize(proto)
    (gemm,) = list(result.model.graph)
    assert gemm.op_type == "Gemm" and [v.name for v in gemm.inputs] == ["b", "a"]
    assert_same(proto, result.model)


def test_batched_matmul_with_transposed_key_becomes_fused_matmul():
    proto = parse("""g (float[6,5,8] q, float[6,7,8] k) => (float[6,5,7] y) {
        kt = Transpose <perm = [0, 2, 1]> (k)
        y = MatMul(q, kt)
    }""")
    result, _ = optimize(proto)
    (fused,) = list(result.model.graph)
    assert (fused.domain, fused.op_type) == ("com.microsoft", "FusedMatMul")
    assert fused.attributes.get_int("transB") == 1
    assert_same(proto, result.model)


def test_no_fused_matmul_for_webgpu():
    """WebGPU has no FusedMatMul kernel (measured: the node lands on the CPU with copies; tests/test_webgpu.py):
    the transposed key stays a Transpose and a MatMul there."""
    proto = parse("""g (float[6,5,8] q, float[6,7,8] k) => (float[6,5,7] y) {
        kt = Transpose <perm = [0, 2, 1]> (k)
        y = MatMul(q, kt)
    }""")
    result, _ = optimize(proto, target="webgpu")
    assert [n.op_type for n in result.model.graph] == ["Transpose", "MatMul"]


# ** cases 5 and 6: sinking **

def test_sinks_through_unary_ops_to_cancel():
    proto = parse("""g (float[2,3,4] x) => (float[2,3,4] y) {
        t = Transpose <perm = [2, 0, 1]> (x)
        s = Sigmoid(t)
        c = Clip(s, lo, hi)
        y = Transpose <perm = [1, 2, 0]> (c)
    }""", {"lo": np.array(0.2, np.float32), "hi": np.array(0.7, np.float32)})
    result, _ = optimize(proto)
    assert ops(result.model) == ["Sigmoid", "Clip"]
    assert_same(proto, result.model)


def test_sinks_through_a_broadcast_constant_transposed_into_place():
    c = RNG.standard_normal((3, 1)).astype(np.float32)  # broadcasts along t's axes 1 and 2
    proto = parse("""g (float[2,3,4] x) => (float[2,3,4] y) {
        t = Transpose <perm = [2, 1, 0]> (x)
        a = Add(t, c)
        s = Sub(c, a)
        y = Transpose <perm = [2, 1, 0]> (s)
    }""", {"c": c})
    result, _ = optimize(proto)
    assert ops(result.model) == ["Add", "Sub"]
    assert_same(proto, result.model)


def test_binary_op_of_two_equal_transposes_keeps_one():
    proto = parse("""g (float[2,3,4] a, float[2,3,4] b) => (float[4,2,3] y) {
        ta = Transpose <perm = [2, 0, 1]> (a)
        tb = Transpose <perm = [2, 0, 1]> (b)
        y = Mul(ta, tb)
    }""")
    result, _ = optimize(proto)
    assert ops(result.model) == ["Mul", "Transpose"]
    assert_same(proto, result.model)


def test_softmax_axis_follows_the_permutation():
    proto = parse("""g (float[2,3,4] x) => (float[2,3,4] y) {
        t = Transpose <perm = [0, 2, 1]> (x)
        s = Softmax <axis = -1> (t)
        y = Transpose <perm = [0, 2, 1]> (s)
    }""")
    result, _ = optimize(proto)
    (softmax,) = list(result.model.graph)
    assert softmax.op_type == "Softmax" and softmax.attributes.get_int("axis") == 1
    assert_same(proto, result.model)


@pytest.mark.parametrize("perm,sunk", [([1, 0, 2], True), ([0, 2, 1], False)])
def test_softmax_before_opset_13_only_when_the_flattened_tail_stays(perm, sunk):
    inv = np.argsort(perm).tolist()
    proto = parse(f"""g (float[2,3,4] x) => (float[2,3,4] y) {{
        t = Transpose <perm = {perm}> (x)
        s = Softmax <axis = 2> (t)
        y = Transpose <perm = {inv}> (s)
    }}""", opset=11)
    result, _ = optimize(proto)
    assert transpose_count(result.model) == (0 if sunk else 2)
    assert_same(proto, result.model)


def test_reduction_without_keepdims_absorbs_the_transpose():
    proto = parse("""g (float[2,3,4] x) => (float[4] y) {
        t = Transpose <perm = [1, 0, 2]> (x)
        y = ReduceSum <keepdims = 0> (t, axes)
    }""", {"axes": np.array([0, 1], np.int64)})
    result, _ = optimize(proto)
    assert ops(result.model) == ["ReduceSum"]
    assert_same(proto, result.model)


def test_reduction_with_keepdims_and_axes_attribute_sinks_to_cancel():
    proto = parse("""g (float[2,3,4] x) => (float[2,1,4] y) {
        t = Transpose <perm = [2, 1, 0]> (x)
        r = ReduceMean <axes = [1], keepdims = 1> (t)
        y = Transpose <perm = [2, 1, 0]> (r)
    }""")
    result, _ = optimize(proto)
    (reduce,) = list(result.model.graph)
    assert reduce.op_type == "ReduceMean" and list(reduce.attributes.get_ints("axes")) == [1]
    assert_same(proto, result.model)


def test_not_sunk_when_nothing_removes_it():
    proto = parse("""g (float[2,3,4] x) => (float[4,3,2] y) {
        t = Transpose <perm = [2, 1, 0]> (x)
        y = Relu(t)
    }""")
    result, p = optimize(proto)
    assert ops(result.model) == ["Transpose", "Relu"]
    assert not result.modified


def test_pair_inside_an_if_branch_cancels():
    proto = parse("""g (bool c, float[2,3] x) => (float[2,3] y) {
        y = If (c) <then_branch = t () => (float[2,3] a) {
                a1 = Transpose <perm = [1, 0]> (x)
                a = Transpose <perm = [1, 0]> (a1)
            }, else_branch = e () => (float[2,3] b) {
                b = Relu(x)
            }>
    }""")
    result, _ = optimize(proto)
    assert transpose_count(result.model) == 0
    feeds = {"c": np.array(True), "x": RNG.standard_normal((2, 3)).astype(np.float32)}
    assert_same(proto, result.model, feeds)


# ** case 7: chains across Reshapes **

def test_transposes_that_cancel_across_reshapes_collapse_to_one_reshape():
    """Window partition then unpartition (SAM's window_partition/window_unpartition)."""
    proto = parse("""g (float[1,4,6,3] x) => (float[1,4,6,3] y) {
        a = Reshape(x, s6)
        b = Transpose <perm = [0, 1, 3, 2, 4, 5]> (a)
        c = Reshape(b, win)
        d = Reshape(c, s6b)
        e = Transpose <perm = [0, 1, 3, 2, 4, 5]> (d)
        y = Reshape(e, back)
    }""", {"s6": np.array([1, 2, 2, 3, 2, 3], np.int64), "win": np.array([6, 2, 2, 3], np.int64),
           "s6b": np.array([1, 2, 3, 2, 2, 3], np.int64), "back": np.array([1, 4, 6, 3], np.int64)})
    result, _ = optimize(proto)
    assert ops(result.model) == ["Reshape"]
    assert_same(proto, result.model)


def test_chain_that_moves_data_is_kept():
    proto = parse("""g (float[2,6] x) => (float[3,4] y) {
        a = Reshape(x, s)
        b = Transpose <perm = [1, 0, 2]> (a)
        y = Reshape(b, t)
    }""", {"s": np.array([2, 3, 2], np.int64), "t": np.array([3, 4], np.int64)})
    result, _ = optimize(proto)
    assert ops(result.model) == ["Reshape", "Transpose", "Reshape"]


def test_sinking_in_a_branch_uses_the_models_opset():
    """An opset-11 model: the If body declares no opset; ReduceSum keeps its axes attribute."""
    proto = parse("""g (bool c, float[2,3] x) => (float[2] y) {
        y = If (c) <then_branch = t () => (float[2] a) {
                r = Relu(x)
                tr = Transpose <perm = [1, 0]> (r)
                a = ReduceSum <axes = [0], keepdims = 0> (tr)
            }, else_branch = e () => (float[2] b) {
                b = ReduceSum <axes = [1], keepdims = 0> (x)
            }>
    }""", opset=11)
    result, _ = optimize(proto)
    assert transpose_count(result.model) == 0
    feeds = {"c": np.array(True), "x": RNG.standard_normal((2, 3)).astype(np.float32)}
    assert_same(proto, result.model, feeds)


# ** the count guarantee **

class _AddTransposePair(SiteRule):
    """A deliberately bad rule: Relu(x) -> Relu(Transpose(Transpose(x)))."""

    def pattern(self, op, x):
        return op.Relu(x)

    def rewrite(self, op, x):
        return op.Relu(op.Identity(op.Transpose(op.Transpose(x, perm=[1, 0]), perm=[1, 0])))

    def check(self, context, x, **_):
        from onnxscript.rewriter import pattern

        if x.producer() is not None and x.producer().op_type == "Identity":
            return pattern.MatchResult().fail("done")
        return pattern.MatchResult()


class _GrowingTransposePass(TransposePass):
    def rules(self):
        return [_AddTransposePair.rule(self)]


def test_a_run_that_would_add_transposes_is_undone():
    proto = parse("""g (float[2,3] x) => (float[3,2] y) {
        r = Relu(x)
        y = Transpose <perm = [1, 0]> (r)
    }""")
    result, p = optimize(proto, _GrowingTransposePass)
    assert not result.modified
    assert ops(result.model) == ["Relu", "Transpose"]
    assert any("undone" in n for n in p.notes)
    assert_same(proto, result.model)


def test_sam_encoder_transposes_drop_and_numerics_hold(sam_small_cleaned):
    from dmlopt.passes.einsum import EinsumPass
    from dmlopt.runtime.validate import validate

    original, model = sam_small_cleaned
    before = transpose_count(model)
    EinsumPass(PassContext(target="dml", options={"einsum_layout": "fewest-transposes"}))(model)
    TransposePass(PassContext(target="dml"))(model)
    check_model(model, "einsum+transpose")
    counts = op_counts(model)
    assert "Einsum" not in counts
    # the k.transpose(-2, -1) of each of the 3 blocks went into FusedMatMul
    assert transpose_count(model) == before - 3 and counts["com.microsoft.FusedMatMul"] == 3
    assert validate(original, model).passed


@pytest.fixture
def sam_small_cleaned():
    import importlib.resources

    import dmlopt

    path = importlib.resources.files("dmlopt.data") / "sam_small.onnx"
    original = dmlopt.load(str(path))
    return original, dmlopt.optimize(original, passes="cleanup", validate=False).model


# ** case 8: a pointwise Conv between channels-last Transposes **

def neck(kernel=1, group=1, bias=True, read_inner=False, rank=4):
    """HF SAM's neck: tokens (B, H, W, C) -> NCHW -> Conv -> back to channels-last (for LayerNorm2d)."""
    c, m = 4, 6
    spatial = [5, 7, 3][:rank - 2]
    to_first = [0, rank - 1, *range(1, rank - 1)]
    to_last = [0, *range(2, rank), 1]
    dims = ", ".join(str(d) for d in spatial)
    extra = ", b" if bias else ""
    pads = ", ".join([str(kernel // 2)] * (2 * (rank - 2)))
    conv_attrs = f"group = {group}, kernel_shape = [{', '.join([str(kernel)] * (rank - 2))}], pads = [{pads}]"
    side = "\n      side = Relu(t)" if read_inner else ""
    outputs = ", float[1, " + str(c) + ", " + dims + "] side" if read_inner else ""
    text = f"""
    g (float[1, {dims}, {c}] x) => (float[1, {dims}, {m}] y{outputs}) {{
      t = Transpose<perm = {to_first}>(x)
      z = Conv<{conv_attrs}>(t, w{extra}){side}
      y = Transpose<perm = {to_last}>(z)
    }}
    """
    inits = {"w": RNG.standard_normal([m, c // group] + [kernel] * (rank - 2)).astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal([m]).astype(np.float32)
    return parse(text, inits)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rank", [3, 4, 5])
def test_pointwise_conv_between_channels_last_transposes_is_a_matmul(bias, rank):
    proto = neck(bias=bias, rank=rank)
    result, p = optimize(proto)
    assert ops(result.model) == (["MatMul", "Add"] if bias else ["MatMul"])
    assert_same(proto, result.model)
    assert any(s.action == "rewrote" and "1x1 Conv" in s.detail for s in p.sites)


@pytest.mark.parametrize("kwargs", [{"kernel": 3}, {"group": 2}, {"read_inner": True}])
def test_conv_that_is_not_pointwise_or_whose_input_is_shared_stays(kwargs):
    proto = neck(**kwargs)
    result, p = optimize(proto)
    assert "Conv" in ops(result.model) and transpose_count(result.model) == 2
    if "read_inner" not in kwargs:  # (a shared input does not even match the pattern)
        assert any(s.action == "declined" and "not a 1x1 Conv" in s.detail for s in p.sites)
