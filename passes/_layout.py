"""Layout algebra for static shapes: a value as a strided view of the tensor it was cut from.

Why: exporters spell the same data movement many ways (SAM's qkv
``Reshape -> Transpose(2,0,3,1,4) -> Reshape -> Split -> Squeeze``, HF's
``Reshape -> Transpose(0,2,1,3)``, window partitions...).  Instead of matching each
spelling, a chain of layout ops (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Slice,
Split, Gather of one index, Identity) is evaluated on index maps: every visible axis is a
list of (size, stride) sub-dims over the base tensor's row-major storage, plus an offset.
Two chains that move the same elements the same way give the same view, whatever ops they
use, so questions like "is this a plain Reshape of X?" or "can this be cut from X with one
Reshape and one Slice?" have exact answers.

Used by the attention pass (which Q/K/V layouts MultiHeadAttention can take without a
copy) and by `CollapseLayoutChain` (a Reshape/Transpose chain that nets to a Reshape).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from dmlopt.passes._base import SiteRule
from dmlopt.passes._shared import constant_array

SubDim = tuple[int, int]  # (size, stride)
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split", "Gather")
# Ops a Transpose moves through (the transpose and window-layout passes):
UNARY = ("Abs", "Acos", "Asin", "Atan", "Cast", "Ceil", "Celu", "Clip", "Cos", "Cosh", "Elu", "Erf", "Exp", "Floor",
         "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg", "Not",
         "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt",
         "Tan", "Tanh", "ThresholdedRelu")
BINARY = ("Add", "And", "Div", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Min", "Mod",
          "Mul", "Or", "Pow", "Sub", "Xor")
SOFTMAX = ("Softmax", "LogSoftmax", "Hardmax")
REDUCE = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
          "ReduceProd", "ReduceSum", "ReduceSumSquare")
MAX_CHAIN = 64


class NotAView(Exception):
    """The op sequence cannot be expressed as a strided view (or shapes are not static).

    Not a site decline (that is `_shared.Decline`): an answer of the layout algebra, which knows
    no sites.  Each caller decides what it means there: the attention pass declines its site
    with it as the reason ("heads layout: ..."), a layout rule simply does not match, the
    window-layout pass tries another geometry.
    """


@dataclasses.dataclass
class View:
    base_numel: int
    offset: int
    axes: list[list[SubDim]]  # per visible axis, outer to inner; size-1 axes have []

    @classmethod
    def contiguous(cls, shape: Sequence[int]) -> View:
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        return cls(math.prod(shape), 0, [[(n, s)] if n != 1 else [] for n, s in zip(shape, strides)])

    @property
    def shape(self) -> list[int]:
        return [math.prod(n for n, _ in axis) for axis in self.axes]

    def subdims(self) -> list[SubDim]:
        return [d for axis in self.axes for d in axis]

    # -- ops -----------------------------------------------------------------
    def transpose(self, perm: Sequence[int]) -> View:
        return View(self.base_numel, self.offset, [list(self.axes[p]) for p in perm])

    def reshape(self, shape: Sequence[int]) -> View:
        if math.prod(shape) != math.prod(self.shape):
            raise NotAView("reshape changes the element count")
        seq = self.subdims()
        axes: list[list[SubDim]] = []
        for size in shape:
            group: list[SubDim] = []
            have = 1
            while have < size:
                if not seq:
                    raise NotAView("reshape overruns")
                n, s = seq[0]
                if size % (have * n) == 0:
                    group.append(seq.pop(0))
                    have *= n
                    continue
                need = size // have
                if size % have or n % need:
                    raise NotAView("reshape splits a sub-dimension unevenly")
                group.append((need, s * (n // need)))
                seq[0] = (n // need, s)
                have = size
            axes.append(group)
        if seq:
            raise NotAView("reshape leaves elements")
        return View(self.base_numel, self.offset, axes)

    def squeeze(self, axes: Sequence[int]) -> View:
        if any(self.shape[a] != 1 for a in axes):
            raise NotAView("squeeze of a non-1 axis")
        return View(self.base_numel, self.offset, [a for i, a in enumerate(self.axes) if i not in axes])

    def unsqueeze(self, axes: Sequence[int]) -> View:
        out = list(self.axes)
        for a in sorted(axes):
            out.insert(a, [])
        return View(self.base_numel, self.offset, out)

    def slice(self, axis: int, start: int, count: int, step: int = 1) -> View:
        """Elements start, start+step, ... (count of them) along `axis`."""
        group = merge_contiguous(self.axes[axis])
        size = math.prod(n for n, _ in group)
        if count == size and step == 1 and start == 0:
            return self
        offset = self.offset
        if count <= 0:
            raise NotAView("empty slice")
        if len(group) == 1:
            n, s = group[0]
            new = [(count, s * step)] if count != 1 else []
            offset += start * s
        else:
            inner = math.prod(n for n, _ in group[1:])
            if step != 1 or start % inner or count % inner:
                raise NotAView("slice across a merged axis")
            n0, s0 = group[0]
            new = ([(count // inner, s0)] if count // inner != 1 else []) + group[1:]
            offset += (start // inner) * s0
        axes = list(self.axes)
        axes[axis] = new
        return View(self.base_numel, offset, axes)

    def select(self, axis: int, index: int) -> View:
        return self.slice(axis, index, 1).squeeze([axis])

    # -- questions -------------------------------------------------------------
    def is_contiguous(self) -> bool:
        """The base's elements, all of them, in storage order: a plain Reshape of the base."""
        merged = merge_contiguous(self.subdims())
        return self.offset == 0 and math.prod(self.shape) == self.base_numel and (
            merged == [] or merged == [(self.base_numel, 1)])

    def cut(self) -> Cut | None:
        """How to get this view with Reshape -> Slice -> Reshape of the base, if possible."""
        merged = merge_contiguous(self.subdims())
        if not merged:
            merged = [(1, 1)]
        strides = [s for _, s in merged]
        if any(a <= b for a, b in zip(strides, strides[1:])):
            return None  # not in storage order: would need a Transpose
        fine: list[int] = []
        if self.base_numel % strides[0]:
            return None
        fine.append(self.base_numel // strides[0])
        for a, b in zip(strides, strides[1:]):
            if a % b:
                return None
            fine.append(a // b)
        sizes = [n for n, _ in merged]
        inner = strides[-1]
        if inner > 1:
            fine.append(inner)
            sizes.append(1)
        starts = []
        rest = self.offset
        for stride in strides + ([1] if inner > 1 else []):
            starts.append(rest // stride)
            rest %= stride
        if rest or any(a + n > f for a, n, f in zip(starts, sizes, fine)):
            return None
        return Cut(fine, starts, sizes, self.shape)


def merge_contiguous(subdims: Sequence[SubDim]) -> list[SubDim]:
    """Drop size-1 sub-dims and merge neighbours that are contiguous (outer stride = n * inner)."""
    out: list[SubDim] = []
    for n, s in subdims:
        if n == 1:
            continue
        if out and out[-1][1] == n * s:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out


@dataclasses.dataclass
class Cut:
    """``Reshape(Slice(Reshape(base, fine), starts, starts+sizes), shape)``."""

    fine: list[int]
    starts: list[int]
    sizes: list[int]
    shape: list[int]

    def emit(self, op, base: ir.Value) -> ir.Value:
        base_shape = list(base.shape.dims) if base.shape is not None else None
        x = base
        if base_shape != self.fine:
            x = op.Reshape(x, ints(op, self.fine))
        axes = [i for i, (a, n, f) in enumerate(zip(self.starts, self.sizes, self.fine)) if a != 0 or n != f]
        if axes:
            x = op.Slice(x, ints(op, [self.starts[i] for i in axes]),
                         ints(op, [self.starts[i] + self.sizes[i] for i in axes]), ints(op, axes))
        if [n for n in self.sizes] != self.shape:
            x = op.Reshape(x, ints(op, self.shape))
        return x


def ints(op, values: Sequence[int]) -> ir.Value:
    return op.Constant(value=ir.tensor(np.asarray(list(values), dtype=np.int64)))


# ** tracing a value back through layout ops **

def static_shape(value: ir.Value | None) -> list[int] | None:
    if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape.dims):
        return None
    return list(value.shape.dims)


def const_ints(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in value.const_value.numpy().reshape(-1)]


def step(node: ir.Node, view: View, output_index: int = 0, opset: int = 17) -> View:
    """The view of `node`'s output given the view of its first input (a layout op)."""
    op_type = node.op_type
    in_shape = view.shape
    out_shape = static_shape(node.outputs[output_index])
    rank = len(in_shape)
    if op_type == "Identity":
        return view
    if op_type in ("Reshape", "Flatten"):
        if out_shape is None:
            raise NotAView(f"{op_type} output shape not static")
        return view.reshape(out_shape)
    if op_type == "Transpose":
        perm = node.attributes.get_ints("perm", None)
        return view.transpose(list(perm) if perm is not None else list(reversed(range(rank))))
    if op_type in ("Squeeze", "Unsqueeze"):
        axes = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
        if axes is None:
            attr = node.attributes.get_ints("axes", None)
            axes = list(attr) if attr is not None else None
        if op_type == "Squeeze":
            axes = [a % rank for a in axes] if axes is not None else [i for i, d in enumerate(in_shape) if d == 1]
            return view.squeeze(axes)
        if axes is None:
            raise NotAView("Unsqueeze without axes")
        out_rank = rank + len(axes)
        return view.unsqueeze([a % out_rank for a in axes])
    if op_type == "Gather":
        index = const_ints(node.inputs[1])
        if index is None or len(index) != 1:
            raise NotAView("Gather of a non-constant or several indices")
        axis = node.attributes.get_int("axis", 0) % rank
        idx = index[0] % in_shape[axis]
        if node.inputs[1].shape is not None and len(node.inputs[1].shape) == 0:
            return view.select(axis, idx)
        return view.slice(axis, idx, 1)
    if op_type == "Split":
        axis = node.attributes.get_int("axis", 0) % rank
        sizes = [static_shape(o)[axis] if static_shape(o) else None for o in node.outputs]
        if any(s is None for s in sizes):
            raise NotAView("Split sizes not static")
        return view.slice(axis, sum(sizes[:output_index]), sizes[output_index])
    if op_type == "Slice":
        if out_shape is None:
            raise NotAView("Slice output not static")
        if opset < 10:
            starts = list(node.attributes.get_ints("starts"))
            axes = list(node.attributes.get_ints("axes", range(len(starts))))
            steps = [1] * len(starts)
        else:
            starts = const_ints(node.inputs[1])
            axes = const_ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
            steps = const_ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
            if starts is None:
                raise NotAView("Slice starts not constant")
            axes = axes if axes is not None else list(range(len(starts)))
            steps = steps if steps is not None else [1] * len(starts)
        for start, axis, stride in zip(starts, axes, steps):
            axis %= rank
            if stride <= 0:
                raise NotAView("reverse Slice")
            dim = in_shape[axis]
            start = min(max(start + dim if start < 0 else start, 0), dim)
            view = view.slice(axis, start, out_shape[axis], stride)
        return view
    raise NotAView(f"{op_type} is not a layout op")


def trace(value: ir.Value, *, through_scale: bool = False, stop=None,
          opset: int = 17) -> tuple[ir.Value, View, float]:
    """Walk up layout ops (and, with `through_scale`, Mul/Div by a scalar constant) from `value`.

    Returns (base, view of `value` over the base, accumulated scalar factor).  `stop(value)`
    can end the walk early at a value.
    """
    chain: list[tuple[ir.Node, int]] = []
    scale = 1.0
    current = value
    for _ in range(MAX_CHAIN):
        if stop is not None and stop(current):
            break
        node = current.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            break
        if node.op_type in LAYOUT_OPS:
            if static_shape(node.inputs[0]) is None:
                break
            chain.append((node, node.outputs.index(current)))
            current = node.inputs[0]
            continue
        factor = _scalar_factor(node, current) if through_scale else None
        if factor is None:
            break
        scale *= factor[0]
        current = factor[1]
    shape = static_shape(current)
    if shape is None:
        raise NotAView("base shape not static")
    view = View.contiguous(shape)
    for node, index in reversed(chain):
        view = step(node, view, index, opset)
    return current, view, scale


def _scalar_factor(node: ir.Node, output: ir.Value) -> tuple[float, ir.Value] | None:
    """(factor, other input) when node is Mul(x, c) / Mul(c, x) / Div(x, c) with a scalar constant c."""
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    for i, value in enumerate(node.inputs):
        if value is not None and value.const_value is not None and value.const_value.size == 1:
            if node.op_type == "Div" and i == 0:
                return None
            c = float(value.const_value.numpy().reshape(-1)[0])
            other = node.inputs[1 - i]
            if static_shape(other) != static_shape(output):
                return None  # the scalar must not broadcast the other operand up
            return (c if node.op_type == "Mul" else 1.0 / c), other
    return None


# ** a rule: a Reshape/Transpose chain that nets to a Reshape **

class CollapseLayoutChain(SiteRule):
    """``Transpose/Reshape(...(Reshape/Transpose(x)))`` -> ``Reshape(x)`` when it moves no data."""

    def __init__(self, owner=None, op_type: str = "Transpose"):
        super().__init__(owner, name=f"CollapseLayoutChainAt{op_type}")
        self.op_type = op_type

    def pattern(self, op, x):
        return getattr(op, self.op_type)(x, _allow_other_inputs=True, _outputs=["out"])

    def check(self, context, x, out, **_):
        if static_shape(out) is None:
            return self.decline(None, "shape not static")
        try:
            base, view, _ = trace(out, stop=_not_reshape_or_transpose_output,
                                  opset=context.model.opset_imports.get("", 17))
        except NotAView as e:
            return self.decline(None, str(e))
        nodes = self._chain(out, base)
        if len(nodes) < 2 or "Transpose" not in {n.op_type for n in nodes} or not view.is_contiguous():
            return self.decline(None, "nothing to collapse")
        if any(len(n.outputs[0].uses()) > 1 for n in nodes[1:]):
            return self.decline(None, "intermediate values are read elsewhere")
        self._base = base
        return pattern.MatchResult()

    @staticmethod
    def _chain(out: ir.Value, base: ir.Value) -> list[ir.Node]:
        nodes = []
        current = out
        while current is not base:
            node = current.producer()
            nodes.append(node)
            current = node.inputs[0]
        return nodes

    def rewrite(self, op, x, out, **_):
        node = out.producer()
        self.accepted(node, "Reshape/Transpose chain moves no data: one Reshape")
        return op.Reshape(self._base, ints(op, static_shape(out)))


def _not_reshape_or_transpose_output(value: ir.Value) -> bool:
    node = value.producer()
    return node is None or node.op_type not in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity",
                                                 "Flatten")


# -- permutation helpers (the transpose and window-layout passes) ---------------------------

def inverse(perm: Sequence[int]) -> list[int]:
    """The permutation that undoes `perm`."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def rank_of(value: ir.Value | None) -> int | None:
    """The rank of `value` if its shape is known, else None."""
    return len(value.shape) if value is not None and value.shape is not None else None


def reduce_axes(node: ir.Node, opset: int) -> list[int] | None:
    """The constant axes of a reduction (attribute before opset 18/13, input after); None: not constant."""
    rank = rank_of(node.inputs[0])
    if rank is None:
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = constant_array(node.inputs[1])
        if axes is None:
            return None
        axes = [int(a) for a in axes.reshape(-1)]
    else:
        axes = node.attributes.get_ints("axes", None)
        axes = list(axes) if axes is not None else []
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return []
        axes = list(range(rank))
    return sorted(a % rank for a in axes)


def transpose_count(model: ir.Model) -> int:
    """ONNX-domain Transposes in every graph (subgraphs included, functions not)."""
    return sum(1 for n in ir.traversal.RecursiveGraphIterator(model.graph)
               if n.op_type == "Transpose" and n.domain in ("", "ai.onnx"))
