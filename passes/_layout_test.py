"""Tests of the layout algebra: views against numpy doing the same ops, and cuts rebuilt with ORT."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxscript.rewriter import _context

from dmlopt.passes._layout import NotAView, View
from dmlopt.runtime.validate import run


def gather(view: View, base: np.ndarray) -> np.ndarray:
    """The elements a view names, read from the base's storage."""
    index = np.full(view.shape, view.offset, dtype=np.int64)
    for axis, subdims in enumerate(view.axes):
        size = view.shape[axis]
        coord = np.arange(size)
        contribution = np.zeros(size, dtype=np.int64)
        for n, s in reversed(subdims):
            contribution += (coord % n) * s
            coord //= n
        shape = [1] * len(view.shape)
        shape[axis] = size
        index = index + contribution.reshape(shape)
    return base.reshape(-1)[index]


def _factorizations(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def layout_programs(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.sampled_from([1, 2, 3, 4, 6])) for _ in range(rank)]
    ops = []
    current = list(shape)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["transpose", "reshape", "slice"]))
        if kind == "transpose":
            perm = draw(st.permutations(range(len(current))))
            ops.append(("transpose", list(perm)))
            current = [current[p] for p in perm]
        elif kind == "reshape":
            total = math.prod(current)
            new = []
            while total > 1 and len(new) < 4:
                d = draw(st.sampled_from(_factorizations(total)))
                new.append(d)
                total //= d
            new.append(total)
            ops.append(("reshape", list(new)))
            current = list(new)
        else:
            axis = draw(st.integers(0, len(current) - 1))
            start = draw(st.integers(0, current[axis] - 1))
            count = draw(st.integers(1, current[axis] - start))
            ops.append(("slice", (axis, start, count)))
            current[axis] = count
    return shape, ops


@settings(max_examples=200, deadline=None)
@given(layout_programs())
def test_views_name_the_same_elements_as_numpy(program):
    shape, ops = program
    base = np.arange(math.prod(shape)).reshape(shape)
    expected = base
    view = View.contiguous(shape)
    for kind, arg in ops:
        if kind == "transpose":
            expected = expected.transpose(arg)
            view = view.transpose(arg)
        elif kind == "reshape":
            expected = expected.reshape(arg)
            try:
                view = view.reshape(arg)
            except NotAView:
                return  # numpy copies here; a view must refuse, not lie
        else:
            axis, start, count = arg
            expected = np.take(expected, range(start, start + count), axis=axis)
            try:
                view = view.slice(axis, start, count)
            except NotAView:
                return
    assert view.shape == list(expected.shape)
    np.testing.assert_array_equal(gather(view, base), expected)
    assert view.is_contiguous() == (np.array_equal(expected.reshape(-1), base.reshape(-1)))


@settings(max_examples=100, deadline=None)
@given(layout_programs())
def test_a_cut_rebuilds_the_view_with_reshape_and_slice(program):
    shape, ops = program
    base = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    view = View.contiguous(shape)
    try:
        for kind, arg in ops:
            view = getattr(view, kind)(*([arg] if kind != "slice" else arg))
    except NotAView:
        return
    cut = view.cut()
    if cut is None:  # not in storage order, or strides no Reshape of the base nests: needs a copy
        return
    x = ir.Value(name="x", shape=ir.Shape(shape), type=ir.TensorType(ir.DataType.FLOAT))
    builder = _context.TapeBuilder()
    y = cut.emit(builder, x)
    if y is x:
        y = builder.Identity(x)
    y.name = "y"
    graph = ir.Graph([x], [y], nodes=builder.nodes, opset_imports={"": 17})
    got = run(ir.Model(graph, ir_version=8), {"x": base})["y"]
    np.testing.assert_array_equal(got, gather(view, base))


def test_sam_packed_qkv_heads_are_three_slices():
    """(B', 5, 5, 3*48) -> reshape (B', 25, 3, 3, 16) -> transpose (2,0,3,1,4) -> q, k, v heads."""
    view = View.contiguous([4, 5, 5, 144]).reshape([4, 25, 3, 3, 16]).transpose([2, 0, 3, 1, 4])
    view = view.reshape([3, 12, 25, 16])
    for i, start in enumerate((0, 48, 96)):
        head = view.select(0, i)  # (B'*N, S, H)
        assert head.offset == start
        three_d = View(head.base_numel, head.offset, [head.axes[0][:1], head.axes[1], head.axes[0][1:] + head.axes[2]])
        cut = three_d.cut()
        # windows and tokens are contiguous: one (100, 144) Reshape, a Slice of 48 columns
        assert cut is not None and cut.fine == [100, 144] and cut.starts == [0, start]
        assert cut.sizes == [100, 48] and cut.shape == [4, 25, 48]


@pytest.mark.parametrize("shape,perm,ok", [([2, 3, 4], [0, 1, 2], True), ([2, 3, 4], [1, 0, 2], False),
                                           ([1, 3, 1], [2, 1, 0], True)])
def test_contiguity(shape, perm, ok):
    assert View.contiguous(shape).transpose(perm).is_contiguous() is ok
