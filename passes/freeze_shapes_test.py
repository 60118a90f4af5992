"""freeze-shapes: hand-written shape chains, control flow, size guard, random chains, SAM exports."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dmlopt
from dmlopt.errors import UsageError
from dmlopt.passes import PassContext
from dmlopt.passes.freeze_shapes import BIG_RESULT, FreezeShapesPass
from dmlopt.runtime.validate import run
from tests.ir_text import text, with_weights

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


# ** helpers **

def freeze(model: ir.Model, shapes=None, dims=None):
    """Run the pass on a copy; return (frozen model, the pass with its site log)."""
    work = model.clone()
    p = FreezeShapesPass(PassContext(shapes=shapes or {}, dims=dims or {}))
    result = p(work)
    onnx.checker.check_model(ir.to_proto(result.model), full_check=True)
    return result.model, p


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph)]


def main_ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def dynamic_values(model: ir.Model) -> list[str]:
    found = []
    for graph in model.graphs():
        values = list(graph.inputs) + [v for n in graph for v in n.outputs]
        found += [v.name for v in values
                  if v.shape is None or not all(isinstance(d, int) for d in v.shape.dims)]
    return found


def assert_same_outputs(ref: ir.Model, cand: ir.Model, feeds: dict) -> None:
    """Both run on ORT CPU with its rewrites off; every output bit-identical."""
    expected, got = run(ref, feeds), run(cand, feeds)
    assert expected.keys() == got.keys()
    for name in expected:
        assert expected[name].shape == got[name].shape, name
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


RNG = np.random.default_rng(0)


def feed(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ** shape chains **

def chain_model() -> ir.Model:
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): the TorchScript flatten."""
    return text("""
    g (float[N, C, H, W] x) => (float[N, M] y) {
      s = Shape(x)
      i0 = Constant<value = int64 {0}>()
      n = Gather<axis = 0>(s, i0)
      axes = Constant<value = int64[1] {0}>()
      n1 = Unsqueeze(n, axes)
      minus1 = Constant<value = int64[1] {-1}>()
      target = Concat<axis = 0>(n1, minus1)
      y = Reshape(x, target)
    }
    """)


def test_shape_gather_unsqueeze_concat_reshape_folds_to_one_reshape():
    model = chain_model()
    frozen, p = freeze(model, shapes={"x": [2, 3, 4, 5]})
    assert main_ops(frozen) == ["Reshape"]
    assert frozen.graph.node(0).inputs[1].const_value.numpy().tolist() == [2, 60]
    assert frozen.graph.outputs[0].shape.dims == (2, 60)
    assert dynamic_values(frozen) == []
    assert any(s.node == "input x" and s.detail == "[N,C,H,W] -> [2,3,4,5]" for s in p.sites)
    assert_same_outputs(model, frozen, {"x": feed([2, 3, 4, 5])})


def test_nothing_given_changes_nothing_and_lists_free_dims():
    model = chain_model()
    before = ir.to_proto(model).SerializeToString()
    work = model.clone()
    p = FreezeShapesPass(PassContext())
    result = p(work)
    assert result.modified is False
    assert ir.to_proto(work).SerializeToString() == before
    assert p.notes and "N (x[0])" in p.notes[0] and "W (x[3])" in p.notes[0]
    assert {s.node for s in p.sites if s.action == "kept"} == {"dim N", "dim C", "dim H", "dim W"}


def test_static_model_still_folds_the_pad_arithmetic_the_export_kept():
    """Case 7: F.pad's pads (Concat(C, ConstantOfShape(n)) -> Reshape -> reversed Slice -> Transpose
    -> Reshape), as the TorchScript exporter writes them, fold with no shape given."""
    model = text("""
    g (float[1, 3, 3, 2] x) => (float[1, 5, 5, 2] y) {
      head = Constant<value = int64[6] {0, 0, 0, 2, 0, 2}>()
      n = Constant<value = int64[1] {2}>()
      zeros = ConstantOfShape<value = int64[1] {0}>(n)
      flat = Concat<axis = 0>(head, zeros)
      pairs_shape = Constant<value = int64[2] {-1, 2}>()
      pairs = Reshape(flat, pairs_shape)
      start = Constant<value = int64[1] {-1}>()
      end = Constant<value = int64[1] {-9223372036854775807}>()
      axis = Constant<value = int64[1] {0}>()
      step = Constant<value = int64[1] {-1}>()
      reversed = Slice(pairs, start, end, axis, step)
      cols = Transpose<perm = [1, 0]>(reversed)
      minus1 = Constant<value = int64[1] {-1}>()
      pads = Reshape(cols, minus1)
      y = Pad(x, pads)
    }
    """)
    frozen, p = freeze(model)
    assert main_ops(frozen) == ["Pad"]
    assert frozen.graph.node(0).inputs[1].const_value.numpy().tolist() == [0, 0, 0, 0, 0, 2, 2, 0]
    assert any("folding the shape arithmetic" in n for n in p.notes)
    assert_same_outputs(model, frozen, {"x": feed([1, 3, 3, 2])})


def tf_same_pad_model() -> ir.Model:
    """HF MobileNetV2's TF-style "same" padding, as the legacy exporter writes it: pads computed from
    the input size, so constant only once the batch is frozen (after cleanup's Pad-into-Conv fusion).
    One Pad adds a pixel each side before a Conv, one adds nothing before a Relu."""
    return with_weights(text("""
    g (float[N, 2, 6, 6] x, float[2, 2, 3, 3] w) => (float[N, 2, 6, 6] y, float[N, 2, 6, 6] z) {
      s = Shape(x)
      b = Constant<value = int64[1] {2}>()
      e = Constant<value = int64[1] {4}>()
      hw = Slice(s, b, e)
      none = Sub(hw, hw)
      one = Constant<value = int64[2] {1, 1}>()
      side = Add(none, one)
      lead = Constant<value = int64[2] {0, 0}>()
      pads = Concat<axis = 0>(lead, side, lead, side)
      zero = Concat<axis = 0>(lead, none, lead, none)
      p = Pad(x, pads)
      y = Conv<kernel_shape = [3, 3]>(p, w)
      q = Pad(x, zero)
      z = Relu(q)
    }
    """), w=RNG.standard_normal((2, 2, 3, 3)).astype(np.float32))


def test_pads_that_fold_to_constants_go_into_the_conv_or_away():
    model = tf_same_pad_model()
    frozen, p = freeze(model, dims={"N": 1})
    assert sorted(main_ops(frozen)) == ["Conv", "Relu"]
    (conv,) = [n for n in frozen.graph if n.op_type == "Conv"]
    assert list(conv.attributes.get_ints("pads")) == [1, 1, 1, 1]
    assert_same_outputs(model, frozen, {"x": feed([1, 2, 6, 6])})


def test_static_model_with_nothing_to_fold_is_left_as_it_was():
    model = text("""
    g (float[1, 4] a, float[1, 4] b) => (float[1, 4] y) {
      c = Constant<value = float[4] {1, 2, 3, 4}>()
      s = Add(a, c)
      y = Mul(s, b)
    }
    """)
    work = model.clone()
    p = FreezeShapesPass(PassContext())
    result = p(work)
    assert result.modified is False and not p.sites
    assert main_ops(work) == ["Constant", "Add", "Mul"] and not work.graph.initializers  # nothing lifted


def test_dim_param_freezes_every_occurrence():
    model = text("""
    g (float[batch_size, 4] a, float[batch_size, 4] b) => (float[batch_size, 4] y, int64[1] n) {
      y = Add(a, b)
      s = Shape(a)
      zero = Constant<value = int64[1] {0}>()
      one = Constant<value = int64[1] {1}>()
      n = Slice(s, zero, one)
    }
    """)
    frozen, _ = freeze(model, dims={"batch_size": 3})
    assert [v.shape.dims for v in frozen.graph.inputs] == [(3, 4), (3, 4)]
    assert frozen.graph.outputs[0].shape.dims == (3, 4)
    assert "Shape" not in ops(frozen) and "Slice" not in ops(frozen)
    assert dynamic_values(frozen) == []
    assert_same_outputs(model, frozen, {"a": feed([3, 4]), "b": feed([3, 4])})


def test_shape_given_for_one_input_fixes_its_dim_name_in_the_other():
    model = text("""
    g (float[batch, 4] a, float[batch, 4] b) => (float[batch, 4] y) { y = Mul(a, b) }
    """)
    frozen, _ = freeze(model, shapes={"a": [5, 4]})
    assert frozen.graph.inputs[1].shape.dims == (5, 4)
    assert frozen.graph.outputs[0].shape.dims == (5, 4)


def test_range_and_constant_of_shape_fold_when_small():
    model = text("""
    g (float[N, 6] x) => (float[N, 6] y) {
      s = Shape(x)
      zero = Constant<value = int64 {0}>()
      one = Constant<value = int64 {1}>()
      n = Gather<axis = 0>(s, one)
      r = Range(zero, n, one)
      rf = Cast<to = 1>(r)
      ones = ConstantOfShape<value = float[1] {2.0}>(s)
      t = Mul(ones, rf)
      y = Add(x, t)
    }
    """)
    frozen, _ = freeze(model, dims={"N": 3})
    assert main_ops(frozen) == ["Add"]
    const = frozen.graph.node(0).inputs[1].const_value.numpy()
    np.testing.assert_array_equal(const, np.tile(2.0 * np.arange(6, dtype=np.float32), (3, 1)))
    assert_same_outputs(model, frozen, {"x": feed([3, 6])})


@pytest.mark.parametrize("maker", ["ConstantOfShape", "Expand", "Tile", "Range"])
def test_big_results_stay_ops(maker):
    side = 256  # 256 * 256 = 65536 elements > BIG_RESULT
    assert side * side > BIG_RESULT
    make = {
        "ConstantOfShape": "big = ConstantOfShape<value = float[1] {1.0}>(s)",
        "Expand": "one = Constant<value = float[1] {1.0}>()\n big = Expand(one, s)",
        "Tile": "one = Constant<value = float[1, 1] {1.0}>()\n big = Tile(one, s)",
        "Range": ("z = Constant<value = float {0.0}>()\n st = Constant<value = float {1.0}>()\n"
                  " n = ReduceProd<keepdims = 0>(s)\n nf = Cast<to = 1>(n)\n r = Range(z, nf, st)\n"
                  " big = Reshape(r, s)"),
    }[maker]
    # Relu between: Expand straight into Add would (rightly) be dropped, Add broadcasts itself
    model = text(f"""
    g (float[N, {side}] x) => (float[N, {side}] y) {{
      s = Shape(x)
      {make}
      relu = Relu(big)
      y = Add(x, relu)
    }}
    """)
    frozen, p = freeze(model, shapes={"x": [side, side]})
    assert maker in ops(frozen)
    assert "Shape" not in ops(frozen)  # its input is static: the shape itself is a constant
    kept = [s for s in p.sites if s.action == "kept" and s.op == maker]
    assert kept and f"stays an op (bound {BIG_RESULT})" in kept[0].detail
    size_in, size_out = len(ir.to_proto(model).SerializeToString()), len(ir.to_proto(frozen).SerializeToString())
    assert size_out <= size_in * 1.01 + 200  # tiny model: a few bytes of static dims in value_info
    assert_same_outputs(model, frozen, {"x": feed([side, side])})


def test_fold_that_would_grow_the_model_more_than_one_percent_stays_an_op():
    # Gather of a weight by constant indices (SAM's rel-pos lookup): 80x80x16 floats from 159x16.
    index = (np.arange(80)[:, None] - np.arange(80)[None, :] + 79).astype(np.int64)
    model = with_weights(text("""
    g (float[N, 80, 80, 16] x, float[159, 16] w, int64[80, 80] idx) => (float[N, 80, 80, 16] y) {
      g = Gather<axis = 0>(w, idx)
      y = Add(x, g)
    }
    """), w=RNG.standard_normal((159, 16)).astype(np.float32), idx=index)
    frozen, p = freeze(model, dims={"N": 1})
    assert main_ops(frozen) == ["Gather", "Add"]
    assert any(s.op == "Gather" and "over the 1% budget" in s.detail for s in p.sites if s.action == "kept")
    assert dmlopt.io.model.initializer_bytes(frozen) <= dmlopt.io.model.initializer_bytes(model) * 1.01
    assert_same_outputs(model, frozen, {"x": feed([1, 80, 80, 16])})


def test_partial_freeze_folds_the_static_elements_only():
    model = text("""
    g (float[N, 3, L] x) => (float[N, 3, L] y, int64 c, int64[2] nc) {
      s = Shape(x)
      one = Constant<value = int64 {1}>()
      c = Gather<axis = 0>(s, one)
      zero1 = Constant<value = int64[1] {0}>()
      two1 = Constant<value = int64[1] {2}>()
      nc = Slice(s, zero1, two1)
      y = Identity(x)
    }
    """)
    frozen, p = freeze(model, dims={"N": 2})
    assert "Gather" not in ops(frozen) and "Slice" not in ops(frozen)
    assert frozen.graph.inputs[0].shape.dims[:2] == (2, 3)
    assert not isinstance(frozen.graph.inputs[0].shape.dims[2], int)
    assert_same_outputs(model, frozen, {"x": feed([2, 3, 7])})
    assert "still free: L (x[2])" in p.notes


# ** view chains, slices, no-op arithmetic **

def test_view_chain_becomes_one_reshape():
    model = text("""
    g (float[N, 4, 6] x) => (float[N, 2, 12] y) {
      a = Constant<value = int64[1] {1}>()
      u = Unsqueeze(x, a)
      sq = Squeeze(u, a)
      t = Constant<value = int64[3] {0, 2, 12}>()
      y = Reshape(sq, t)
    }
    """)
    frozen, _ = freeze(model, dims={"N": 3})
    assert main_ops(frozen) == ["Reshape"]
    assert frozen.graph.node(0).inputs[0] is frozen.graph.inputs[0]
    assert frozen.graph.node(0).inputs[1].const_value.numpy().tolist() == [3, 2, 12]
    assert_same_outputs(model, frozen, {"x": feed([3, 4, 6])})


def test_slice_of_slice_on_different_axes_merges():
    model = text("""
    g (float[N, 10, 10, 4] x) => (float[N, 8, 8, 4] y) {
      z = Constant<value = int64[1] {0}>()
      e = Constant<value = int64[1] {8}>()
      a1 = Constant<value = int64[1] {1}>()
      a2 = Constant<value = int64[1] {2}>()
      s1 = Slice(x, z, e, a1)
      y = Slice(s1, z, e, a2)
    }
    """)
    frozen, _ = freeze(model, dims={"N": 1})
    assert main_ops(frozen) == ["Slice"]
    node = frozen.graph.node(0)
    assert [v.const_value.numpy().tolist() for v in node.inputs[1:4]] == [[0, 0], [8, 8], [1, 2]]
    assert_same_outputs(model, frozen, {"x": feed([1, 10, 10, 4])})


def test_slices_tiling_an_axis_become_one_split():
    model = text("""
    g (float[N, 3, 5] x) => (float[N, 1, 5] q, float[N, 1, 5] k, float[N, 1, 5] v) {
      z = Constant<value = int64[1] {0}>()
      o = Constant<value = int64[1] {1}>()
      t = Constant<value = int64[1] {2}>()
      h = Constant<value = int64[1] {3}>()
      k = Slice(x, o, t, o)
      q = Slice(x, z, o, o)
      v = Slice(x, t, h, o)
    }
    """, opset=18)
    frozen, p = freeze(model, dims={"N": 2})
    assert main_ops(frozen) == ["Split"]
    split = frozen.graph.node(0)
    assert split.attributes["axis"].value == 1
    assert split.inputs[1].const_value.numpy().tolist() == [1, 1, 1]
    assert [o.name for o in frozen.graph.outputs] == ["q", "k", "v"]
    assert_same_outputs(model, frozen, {"x": feed([2, 3, 5])})


def test_split_takes_a_node_name_no_other_node_has():
    """ORT refuses two nodes of one name: the Split must not take an existing "<slice>_split" (the user's
    node keeps its name: --fp16-keep-nodes and the site log refer to it)."""
    from onnx import TensorProto, helper

    ints = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [1], [v])  # noqa: E731
    nodes = [helper.make_node("Slice", ["x", "z", "o", "o"], ["a"], name="s0"),
             helper.make_node("Slice", ["x", "o", "t", "o"], ["b"], name="s1"),
             helper.make_node("Relu", ["x"], ["r"], name="s0_split")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 3])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b", "r")],
                              initializer=[ints("z", 0), ints("o", 1), ints("t", 2)])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    frozen, _ = freeze(model)
    assert sorted(main_ops(frozen)) == ["Relu", "Split"]
    names = {n.op_type: n.name for n in frozen.graph}
    assert names["Relu"] == "s0_split" and names["Split"] != "s0_split", names
    assert_same_outputs(model, frozen, {"x": feed([2, 2, 3])})  # ORT loads it


def test_slices_that_do_not_tile_stay():
    model = text("""
    g (float[N, 3, 5] x) => (float[N, 1, 5] q, float[N, 1, 5] v) {
      z = Constant<value = int64[1] {0}>()
      o = Constant<value = int64[1] {1}>()
      t = Constant<value = int64[1] {2}>()
      h = Constant<value = int64[1] {3}>()
      q = Slice(x, z, o, o)
      v = Slice(x, t, h, o)
    }
    """, opset=18)
    frozen, _ = freeze(model, dims={"N": 2})
    assert main_ops(frozen) == ["Slice", "Slice"]


def test_neutral_broadcast_arithmetic_goes_only_when_shape_is_kept():
    model = with_weights(text("""
    g (float[N, 4, 5] x, float[4, 1] ones, float[2, 1, 1, 1] ones4, float[4, 1] zeros) =>
      (float[N, 4, 5] y, float[N, 2, 4, 5] z, float[N, 4, 5] w) {
      y = Mul(x, ones)
      z = Mul(ones4, x)
      w = Sub(y, zeros)
    }
    """), ones=np.ones((4, 1), np.float32), ones4=np.ones((2, 1, 1, 1), np.float32),
        zeros=np.zeros((4, 1), np.float32))
    frozen, _ = freeze(model, dims={"N": 2})
    # x * ones[4,1] and - zeros keep x's shape: gone; ones4 * x broadcasts x to rank 4: stays.
    assert sorted(main_ops(frozen)) == ["Identity", "Identity", "Mul"]
    assert_same_outputs(model, frozen, {"x": feed([2, 4, 5])})


# ** control flow **

IF_MODEL = """
g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
  s = Shape(x)
  zero = Constant<value = int64 {0}>()
  n = Gather<axis = 0>(s, zero)
  one = Constant<value = int64 {1}>()
  c = Equal(n, one)
  t = Constant<value = float {2.0}>()
  z = Mul(x, t)
  y = If(c) <
    then_branch = then_g () => (float[N, 4] r) {
        t3 = Constant<value = float {3.0}>()
        u = Mul(x, t3)
        r = Sub(u, z)
    },
    else_branch = else_g () => (float[N, 4] r) {
        sx = Shape(x)
        flat = Constant<value = int64[1] {-1}>()
        v = Reshape(x, flat)
        r = Reshape(v, sx)
    }
  >
}
"""


@pytest.mark.parametrize("batch,expected", [(1, ["Mul", "Mul", "Sub"]), (2, ["Mul", "Identity"])])
def test_if_on_a_shape_condition_is_replaced_by_its_branch(batch, expected):
    model = text(IF_MODEL)
    frozen, p = freeze(model, dims={"N": batch})
    assert ops(frozen) == expected
    assert any(s.op == "" and "branch is inlined" in s.detail for s in p.sites)
    names = [v.name for n in frozen.graph for v in n.outputs] + [v.name for v in frozen.graph.inputs]
    assert len(names) == len(set(names))
    assert dynamic_values(frozen) == []
    assert_same_outputs(model, frozen, {"x": feed([batch, 4])})


def test_two_inlined_branches_with_the_same_inner_names_do_not_clash():
    branch = """then_branch = t{i} () => (float[N, 4] r{i}) {{ k = Constant<value = float {{{i}.5}}>()  u = Mul(x, k)  r{i} = Relu(u) }},
        else_branch = e{i} () => (float[N, 4] r{i}) {{ r{i} = Identity(x) }}"""
    model = text(f"""
    g (float[N, 4] x) => (float[N, 4] y1, float[N, 4] y2) {{
      s = Shape(x)
      zero = Constant<value = int64 {{0}}>()
      n = Gather<axis = 0>(s, zero)
      one = Constant<value = int64 {{1}}>()
      c = Equal(n, one)
      y1 = If(c) <{branch.format(i=1)}>
      y2 = If(c) <{branch.format(i=2)}>
    }}
    """)
    frozen, _ = freeze(model, dims={"N": 1})
    assert ops(frozen) == ["Mul", "Relu", "Mul", "Relu"]
    names = [v.name for n in frozen.graph for v in n.outputs]
    assert len(names) == len(set(names))
    assert_same_outputs(model, frozen, {"x": feed([1, 4])})


LOOP_MODEL = """
g (float[N, 6] x, int64 trips) => (float[N, 6] y) {
  cond = Constant<value = bool {1}>()
  y = Loop(trips, cond, x) <body = body (int64 i, bool c, float[N, 6] acc) => (bool c_out, float[N, 6] acc_out) {
      c_out = Identity(c)
      s = Shape(x)
      z = Constant<value = int64 {0}>()
      n = Gather<axis = 0>(s, z)
      z1 = Constant<value = int64[1] {0}>()
      n1 = Unsqueeze(n, z1)
      m1 = Constant<value = int64[1] {-1}>()
      shape2 = Concat<axis = 0>(n1, m1)
      flat = Reshape(acc, shape2)
      sa = Shape(acc)
      back = Reshape(flat, sa)
      acc_out = Add(back, x)
  }>
}
"""


def test_loop_body_is_frozen_and_folded():
    model = text(LOOP_MODEL)
    assert ops(model).count("Shape") == 2
    frozen, _ = freeze(model, dims={"N": 2})
    assert "Shape" not in ops(frozen) and "Concat" not in ops(frozen) and "Gather" not in ops(frozen)
    loop = next(n for n in frozen.graph if n.op_type == "Loop")
    assert [n.op_type for n in loop.attributes["body"].as_graph()] == ["Identity", "Add"]
    feeds = {"x": feed([2, 6]), "trips": np.array(3, np.int64)}
    assert_same_outputs(model, frozen, feeds)


def test_scan_body_is_frozen_and_folded():
    model = text("""
    g (float[T, N, 4] xs) => (float[N, 4] last, float[T, N, 4] ys) {
      ax = Constant<value = int64[1] {0}>()
      init = ReduceSum<keepdims = 0>(xs, ax)
      last, ys = Scan<num_scan_inputs = 1, body = body (float[N, 4] acc, float[N, 4] x) => (float[N, 4] acc2, float[N, 4] y) {
          s = Shape(x)
          r = Reshape(acc, s)
          acc2 = Add(r, x)
          y = Identity(acc2)
      }>(init, xs)
    }
    """)
    frozen, _ = freeze(model, shapes={"xs": [3, 2, 4]})
    scan = next(n for n in frozen.graph if n.op_type == "Scan")
    assert [n.op_type for n in scan.attributes["body"].as_graph()] == ["Add", "Identity"]
    assert_same_outputs(model, frozen, {"xs": feed([3, 2, 4])})


# ** property: random dynamic dims and random shape chains **

@st.composite
def shape_programs(draw):
    """A rank-4 input with random dynamic axes and a Reshape target built from its Shape."""
    dims = [draw(st.integers(1, 5)) for _ in range(4)]
    dynamic = [draw(st.booleans()) for _ in range(4)]
    cuts = sorted(draw(st.sets(st.integers(1, 3), max_size=3)))
    groups = [list(range(a, b)) for a, b in zip([0, *cuts], [*cuts, 4])]
    styles = [draw(st.sampled_from(["gather", "slice-prod", "size-div", "minus-one"])) for _ in groups]
    if styles.count("minus-one") > 1 or "size-div" in styles and len(groups) == 1:
        styles = [s if s not in ("minus-one", "size-div") else "gather" for s in styles]
    use_dims_api = draw(st.booleans())
    return dims, dynamic, groups, styles, use_dims_api


def build_program(dims, dynamic, groups, styles) -> ir.Model:
    names = [f"d{i}" if dyn else str(d) for i, (d, dyn) in enumerate(zip(dims, dynamic))]
    lines = ["s = Shape(x)", "z1 = Constant<value = int64[1] {0}>()"]
    parts = []
    for g, (group, style) in enumerate(zip(groups, styles)):
        lo, hi = group[0], group[-1] + 1
        lines += [f"lo{g} = Constant<value = int64[1] {{{lo}}}>()", f"hi{g} = Constant<value = int64[1] {{{hi}}}>()"]
        if style == "minus-one":
            lines.append(f"p{g} = Constant<value = int64[1] {{-1}}>()")
        elif style == "gather" and len(group) == 1:
            lines += [f"i{g} = Constant<value = int64 {{{lo}}}>()", f"e{g} = Gather<axis = 0>(s, i{g})",
                      f"p{g} = Unsqueeze(e{g}, z1)"]
        elif style == "size-div":
            # product of this group = Size(x) / product of every other dim
            others = [i for i in range(4) if i not in group]
            lines += [f"sz{g} = Size(x)", f"o{g} = Constant<value = int64[{len(others)}] {{{', '.join(map(str, others))}}}>()",
                      f"og{g} = Gather<axis = 0>(s, o{g})", f"op{g} = ReduceProd<keepdims = 0>(og{g})",
                      f"q{g} = Div(sz{g}, op{g})", f"p{g} = Unsqueeze(q{g}, z1)"]
        else:
            lines += [f"sl{g} = Slice(s, lo{g}, hi{g})", f"p{g} = ReduceProd<keepdims = 1>(sl{g})"]
        parts.append(f"p{g}")
    lines += [f"target = Concat<axis = 0>({', '.join(parts)})", "r = Reshape(x, target)",
              "f = Cast<to = 1>(s)", "fs = ReduceSum<keepdims = 1>(f)", "y = Add(r, fs)"]
    body = "\n  ".join(lines)
    out_dims = ", ".join(f"o{i}" for i in range(len(groups)))
    return text(f"g (float[{', '.join(names)}] x) => (float[{out_dims}] y) {{\n  {body}\n}}")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape_programs())
def test_random_shape_chains_fold_away(program):
    dims, dynamic, groups, styles, use_dims_api = program
    model = build_program(dims, dynamic, groups, styles)
    if use_dims_api and any(dynamic):
        frozen, _ = freeze(model, dims={f"d{i}": d for i, (d, dyn) in enumerate(zip(dims, dynamic)) if dyn})
    else:
        frozen, _ = freeze(model, shapes={"x": dims})
    expected_shape = [int(np.prod([dims[i] for i in group])) for group in groups]
    # the Reshape goes too when it changes nothing (every group one axis)
    assert main_ops(frozen) == (["Add"] if expected_shape == dims else ["Reshape", "Add"])
    assert dynamic_values(frozen) == []
    assert frozen.graph.outputs[0].shape.dims == tuple(expected_shape)
    assert_same_outputs(model, frozen, {"x": feed(dims)})


# ** the bundled SAM encoder with a dynamic batch, and a dynamo export **

@pytest.fixture(scope="module")
def sam_dynamic(tmp_path_factory) -> pathlib.Path:
    bundled = DATA / "sam_small_dynamic.onnx"
    if bundled.exists():
        return bundled
    sam_encoder = pytest.importorskip("models.sam_encoder")
    return sam_encoder.export_small(tmp_path_factory.mktemp("sam") / "sam_dynamic.onnx", dynamic_batch=True)


@pytest.fixture(scope="module")
def sam_dynamo(tmp_path_factory) -> pathlib.Path:
    sam_encoder = pytest.importorskip("models.sam_encoder")
    return sam_encoder.export_dynamo(tmp_path_factory.mktemp("sam") / "sam_dynamo.onnx", dynamic_batch=True)


def frozen_file_checks(source: pathlib.Path, tmp_path: pathlib.Path, batch: int):
    model = dmlopt.load(source)
    image = model.graph.inputs[0]
    assert not isinstance(image.shape.dims[0], int)  # the export really is dynamic
    shape = [batch, *image.shape.dims[1:]]
    frozen, p = freeze(model, shapes={image.name: shape})
    out = dmlopt.save(frozen, tmp_path / "frozen.onnx")
    assert "Shape" not in ops(frozen) and "Size" not in ops(frozen)
    assert dynamic_values(frozen) == []
    inferred = onnx.shape_inference.infer_shapes(onnx.load(out), strict_mode=True)
    for info in [*inferred.graph.value_info, *inferred.graph.output]:
        dims = info.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), info.name
    assert out.stat().st_size <= source.stat().st_size * 1.01
    assert_same_outputs(model, frozen, {image.name: feed(shape)})
    return model, frozen, p


@pytest.mark.parametrize("batch", [1, 2])
def test_bundled_dynamic_sam_freezes_to_static(sam_dynamic, tmp_path, batch):
    model, frozen, p = frozen_file_checks(sam_dynamic, tmp_path, batch)
    assert ops(model).count("Shape") > 10  # the TorchScript export keeps shape arithmetic alive
    assert len(ops(frozen)) < len(ops(model)) / 3
    summary = next(s for s in p.sites if s.node == "<graph>")
    assert summary.extra["shape_ops_after"] == 0


def test_dynamo_export_freezes_to_static(sam_dynamo, tmp_path):
    model, frozen, _ = frozen_file_checks(sam_dynamo, tmp_path, 1)
    assert len(ops(frozen)) < len(ops(model))


def test_api_path_checks_shapes_like_the_cli(sam_dynamic):
    with pytest.raises(UsageError, match="not an input"):
        dmlopt.optimize(sam_dynamic, shapes={"imgae": [1, 3, 64, 64]}, passes=["freeze-shapes"], validate=False)
    with pytest.raises(UsageError, match="rank 4"):
        FreezeShapesPass(PassContext(shapes={"image": [1, 3, 64]}))(dmlopt.load(sam_dynamic))
    result = dmlopt.optimize(sam_dynamic, dims={"batch": 1}, passes=["freeze-shapes"])
    assert result.passed and "Shape" not in ops(result.model)
