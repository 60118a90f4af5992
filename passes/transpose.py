"""transpose: fewer Transposes (copies on DirectML) by cancelling, merging, folding and sinking them.

Rewrites (p, q: permutations; ``q.p`` their composition):
  1. ``Transpose(Transpose(x, p), q)`` -> ``Transpose(x, q.p)`` or ``x`` when inverse
     (onnxscript's ``transpose_transpose_rule``); ``Transpose(x, identity)`` -> ``x``
     (onnxscript's ``no_op_transpose_rule``).
  2. ``Transpose(C)`` -> ``C'``: a constant is transposed once, here (e.g. MatMul weights).
  3. ``Transpose(x)`` that moves only size-1 dims -> ``Reshape(x)`` (no data moves).
  4. ``Gemm(Transpose(a), b)`` -> ``Gemm(a, b, transA=1)`` (same for b); for rank 2,
     ``MatMul(Transpose(a), b)`` -> ``Gemm(a, b, transA=1)`` and
     ``Transpose(MatMul(a, b))`` -> ``Gemm(b, a, transA=1, transB=1)``; above rank 2 a
     swap of the last two axes goes into ``com.microsoft.FusedMatMul`` transA/transB
     (onnxscript's ort_fusions rules) where the target registers FusedMatMul: not on WebGPU
     (measured: it lands on the CPU with copies around it; dmlopt.targets.webgpu.registry).
  5. Sinking, when it removes some: ``U(Transpose(x, p))`` -> ``Transpose(U'(x), p)`` for
     elementwise U (unary; binary with a constant, transposed back into x's layout, or a
     broadcast scalar), Softmax/LogSoftmax (axis ``p[axis]``; before opset 13 only when
     the flattened tail axes map onto themselves) and reductions (axes ``p[axes]``; with
     keepdims=0 the remaining permutation shrinks and often vanishes).  A Transpose is sunk
     only when, further down its single-consumer chain, it meets a Transpose (case 1), a
     binary op whose other input has the same Transpose (case 6), or a MatMul/Gemm that
     absorbs it (case 4).
  6. ``Bin(Transpose(a, p), Transpose(b, p))`` -> ``Transpose(Bin(a, b), p)``: two become one.
  7. A chain of Reshape/Transpose/Squeeze/Unsqueeze that moves no data, e.g.
     ``Reshape(Transpose(Reshape(Transpose(x))))`` whose Transposes undo each other across the
     Reshapes -> ``Reshape(x)`` (``CollapseLayoutChain``, static shapes; passes/_layout.py);
     the Reshape that may follow merges in (onnxscript's ``reshape_reshape_rule``).

  8. ``Transpose(Conv1x1(Transpose(x, (0, 3, 1, 2)), W, B), (0, 2, 3, 1))`` -> ``MatMul(x, W') + B``:
     a pointwise Conv between channels-last Transposes (HF SAM's neck, LayerNorm2d as
     permute/LayerNorm/permute) is a MatMul on the channels-last tensor (any spatial rank).

The pass counts Transposes (every graph) before and after; if a run would end with more,
it is undone (``restore``) and the report says so.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import onnx_ir as ir
import onnxscript.rewriter.rules.common as onnxscript_rules
from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import fused_matmul_rule_sets as fused_matmul

from dmlopt.passes._base import DmlPass, SiteRule, apply_rules, eliminate_identities, remove_unused_nodes
from dmlopt.passes._layout import (BINARY, REDUCE, SOFTMAX, UNARY, CollapseLayoutChain, inverse, rank_of, reduce_axes,
                                   transpose_count)
from dmlopt.passes._shared import constant_array
from dmlopt.targets.webgpu.registry import no_kernel

MAX_ROUNDS = 32
MAX_LOOKAHEAD = 64
# A Transpose of a constant that other nodes also read is folded (a copy) up to this size.
SHARED_FOLD_LIMIT = 1 << 16

# ** permutation helpers **

def perm_of(node: ir.Node) -> list[int] | None:
    """A Transpose's permutation (the default reverses the axes); None if the rank is unknown."""
    perm = node.attributes.get_ints("perm", None)
    if perm is not None:
        return list(perm)
    rank = rank_of(node.inputs[0])
    return list(reversed(range(rank))) if rank is not None else None


def _is_transpose(value: ir.Value | None) -> ir.Node | None:
    node = value.producer() if value is not None else None
    if node is not None and node.op_type == "Transpose" and node.domain in ("", "ai.onnx"):
        return node
    return None


def _single_use(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _scalar_like(value: ir.Value, rank: int) -> bool:
    """Broadcasts the same against any layout: rank 0, or only static 1s and rank <= rank."""
    if value.shape is None:
        return False
    return len(value.shape) <= rank and all(d == 1 for d in value.shape.dims)


def _opset(context) -> int:
    """The model's ONNX opset (an If/Loop body usually declares none of its own)."""
    return context.model.opset_imports.get("", context.model.opset_imports.get("ai.onnx", 17))


def _axes_in_input(op_type: str, opset: int) -> bool:
    return opset >= (13 if op_type == "ReduceSum" else 18)


# ** where does a sunk Transpose end up? **

def _sinks_to_a_merge(value: ir.Value, perm: list[int], opset: int) -> bool:
    """Whether a Transpose(perm) placed on `value` would reach something that removes it (case 5)."""
    for _ in range(MAX_LOOKAHEAD):
        if not _single_use(value):
            return False
        consumer, index = value.uses()[0]
        if consumer.domain not in ("", "ai.onnx"):
            return False
        op_type = consumer.op_type
        if op_type == "Transpose":
            return True
        if op_type in ("MatMul", "Gemm") and _swaps_last_two(perm) and index in (0, 1):
            return True
        if op_type in BINARY:
            other = consumer.inputs[1 - index]
            other_t = _is_transpose(other)
            if other_t is not None and perm_of(other_t) == perm and _single_use(other):
                return True
            if not _adjustable_operand(other, len(perm)):
                return False
        elif op_type in UNARY:
            if index != 0 or not all(_scalar_like(v, len(perm)) for v in consumer.inputs[1:] if v is not None):
                return False
        elif op_type in SOFTMAX:
            if _softmax_axis(consumer, perm, opset) is None:
                return False
        elif op_type in REDUCE and index == 0:
            moved = _reduced_perm(consumer, perm, opset)
            if moved is None:
                return False
            perm = moved
            if perm == list(range(len(perm))):
                return True
        else:
            return False
        value = consumer.outputs[0]
    return False


def _swaps_last_two(perm: Sequence[int]) -> bool:
    n = len(perm)
    return n >= 2 and list(perm) == list(range(n - 2)) + [n - 1, n - 2]


def _adjustable_operand(other: ir.Value | None, rank: int) -> bool:
    if other is None:
        return False
    if _scalar_like(other, rank):
        return True
    const = constant_array(other)
    return const is not None and const.ndim <= rank


def _softmax_axis(node: ir.Node, perm: list[int], opset: int) -> int | None:
    """The axis on x for Softmax(Transpose(x, perm), axis); None when it has no equivalent."""
    rank = len(perm)
    axis = node.attributes.get_int("axis", -1 if opset >= 13 else 1) % rank
    if opset >= 13:
        return perm[axis]
    # Before opset 13 the input is flattened to 2D at `axis`: the tail must map onto itself.
    return axis if sorted(perm[axis:]) == list(range(axis, rank)) else None


def _reduced_perm(node: ir.Node, perm: list[int], opset: int) -> list[int] | None:
    """Permutation left after Reduce(Transpose(x, perm)) becomes Transpose(Reduce(x, perm[axes]))."""
    axes = reduce_axes(node, opset)
    if axes is None:
        return None
    if node.attributes.get_int("keepdims", 1):
        return perm
    x_axes = {perm[a] for a in axes}
    kept_x = [a for a in range(len(perm)) if a not in x_axes]
    return [kept_x.index(perm[j]) for j in range(len(perm)) if j not in axes]


# ** rules **

class _TransposeRule(SiteRule):
    """Shared setup: the opset of the model being rewritten."""

    def opset(self, context) -> int:
        return _opset(context)


class FoldConstantTranspose(_TransposeRule):
    """``Transpose(C)`` -> ``C'`` (case 2)."""

    def pattern(self, op, x):
        return op.Transpose(x, _outputs=["out"])

    def check(self, context, x, out, **_):
        const = constant_array(x)
        if const is None:
            return self.decline(None, "not a constant")
        if len(x.uses()) > 1 and const.size > SHARED_FOLD_LIMIT:
            return self.decline(out.producer(), f"constant of {const.size} elements also read elsewhere: "
                                                "folding would copy it")
        return pattern.MatchResult()

    def rewrite(self, op, x, out, **_):
        node = out.producer()
        perm = perm_of(node) or list(reversed(range(constant_array(x).ndim)))
        folded = np.array(np.transpose(constant_array(x), perm), order="C")
        self.accepted(node, f"folded into a {list(folded.shape)} constant")
        return op.initializer(ir.tensor(folded), name=_new_initializer_name(node.graph, x.name))


class SizeOneTransposeToReshape(_TransposeRule):
    """``Transpose(x)`` moving only size-1 dims -> ``Reshape(x)`` (case 3)."""

    def pattern(self, op, x):
        return op.Transpose(x, _outputs=["out"])

    def check(self, context, x, out, **_):
        node = out.producer()
        perm = perm_of(node)
        if perm is None or x.shape is None or out.shape is None or constant_array(x) is not None:
            return self.decline(None, "rank unknown")
        dims = list(x.shape.dims)
        moved = [p for p in perm if dims[p] != 1]
        if moved != sorted(moved) or perm == list(range(len(perm))):
            return self.decline(None, "moves data")
        target = [d if isinstance(d, int) else None for d in out.shape.dims]
        if target.count(None) > 1:
            return self.decline(node, "moves only size-1 dims, but a Reshape would need two symbolic sizes")
        self._target = [-1 if d is None else d for d in target]
        return pattern.MatchResult()

    def rewrite(self, op, x, out, **_):
        self.accepted(out.producer(), "moves only size-1 dims: now a Reshape")
        return op.Reshape(x, op.Constant(value=ir.tensor(np.asarray(self._target, dtype=np.int64))))


class GemmTransposedInput(_TransposeRule):
    """``Gemm(Transpose(a), b)`` -> ``Gemm(a, b, transA=1)``; likewise for b (case 4)."""

    def __init__(self, owner=None, position: int = 0):
        super().__init__(owner, name=f"GemmTransposedInput{position}")
        self.position = position

    def pattern(self, op, a, b):
        t = op.Transpose(a if self.position == 0 else b, _outputs=["t"])
        args = (t, b) if self.position == 0 else (a, t)
        return op.Gemm(*args, _allow_other_inputs=True, _outputs=["out"])

    def check(self, context, t, **_):
        perm = perm_of(t.producer())
        if perm != [1, 0]:
            return self.decline(None, "not a 2D transpose")
        return pattern.MatchResult()

    def rewrite(self, op, a, b, t, out, **_):
        gemm = out.producer()
        attrs = {k: v.value for k, v in gemm.attributes.items()}
        flag = "transA" if self.position == 0 else "transB"
        attrs[flag] = 1 - int(attrs.get(flag, 0))
        inputs = [a, b] + [v for v in gemm.inputs[2:]]
        self.accepted(gemm, f"Transpose of input {'AB'[self.position]} folded into {flag}")
        return op.Gemm(*inputs, **attrs)


class MatMul2DTransposedInput(_TransposeRule):
    """Rank 2: ``MatMul(Transpose(a), b)`` -> ``Gemm(a, b, transA=1)``; likewise for b (case 4)."""

    def __init__(self, owner=None, position: int = 0):
        super().__init__(owner, name=f"MatMul2DTransposedInput{position}")
        self.position = position

    def pattern(self, op, a, b):
        t = op.Transpose(a if self.position == 0 else b, _outputs=["t"])
        args = (t, b) if self.position == 0 else (a, t)
        return op.MatMul(*args, _outputs=["out"])

    def check(self, context, a, b, t, **_):
        if rank_of(a) != 2 or rank_of(b) != 2 or perm_of(t.producer()) != [1, 0]:
            return self.decline(None, "not rank 2")
        return pattern.MatchResult()

    def rewrite(self, op, a, b, t, out, **_):
        flag = "transA" if self.position == 0 else "transB"
        self.accepted(out.producer(), f"2D MatMul with a transposed input: Gemm {flag}=1")
        return op.Gemm(a, b, **{flag: 1})


class TransposedMatMul2D(_TransposeRule):
    """Rank 2: ``Transpose(MatMul(a, b))`` -> ``Gemm(b, a, transA=1, transB=1)`` (case 4)."""

    def pattern(self, op, a, b):
        return op.Transpose(op.MatMul(a, b), _outputs=["out"])

    def check(self, context, a, b, out, **_):
        if rank_of(a) != 2 or rank_of(b) != 2:
            return self.decline(None, "not rank 2")
        return pattern.MatchResult()

    def rewrite(self, op, a, b, out, **_):
        self.accepted(out.producer(), "Transpose of a 2D MatMul: Gemm(b, a, transA=1, transB=1)")
        return op.Gemm(b, a, transA=1, transB=1)


class PointwiseConvBetweenTransposes(_TransposeRule):
    """``Transpose(Conv1x1(Transpose(x, to_channels_first), W, B), back)`` -> ``MatMul(x, W') + B`` (case 8)."""

    def pattern(self, op, x, w):
        inner = op.Transpose(x, _outputs=["inner"])
        return op.Transpose(op.Conv(inner, w, _allow_other_inputs=True, _outputs=["conv"]), _outputs=["out"])

    def check(self, context, x, w, inner, conv, out, **_):
        node = conv.producer()
        weight = constant_array(w)
        rank = rank_of(x)
        if weight is None or rank is None or rank < 3 or weight.ndim != rank:
            return self.decline(None, "weight not constant or rank unknown")
        channels_first = [0, rank - 1, *range(1, rank - 1)]
        if perm_of(inner.producer()) != channels_first or perm_of(out.producer()) != inverse(channels_first):
            return self.decline(None, "not a channels-last -> channels-first -> channels-last sandwich")
        if not _single_use(inner) or not _single_use(conv):
            return self.decline(node, "the channels-first values are read elsewhere")
        attrs = node.attributes
        if any(d != 1 for d in weight.shape[2:]) or attrs.get_int("group", 1) != 1 \
                or any(v != 1 for v in attrs.get_ints("strides", [1])) or any(attrs.get_ints("pads", [0])) \
                or attrs.get_string("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return self.decline(node, "not a 1x1 Conv (stride 1, no padding, one group)")
        if len(node.inputs) > 2 and node.inputs[2] is not None and constant_array(node.inputs[2]) is None:
            return self.decline(node, "bias not constant")
        return pattern.MatchResult()

    def rewrite(self, op, x, w, inner, conv, out, **_):
        node = conv.producer()
        weight = constant_array(w)
        matrix = np.ascontiguousarray(weight.reshape(weight.shape[0], weight.shape[1]).T)
        self.accepted(node, "1x1 Conv between channels-last Transposes: MatMul on the channels-last tensor")
        y = op.MatMul(x, op.initializer(ir.tensor(matrix), name=_new_initializer_name(node.graph, w.name)))
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            y = op.Add(y, node.inputs[2])
        return y


class SinkTranspose(_TransposeRule):
    """``U(Transpose(x, p))`` -> ``Transpose(U'(x), p)`` when that leads to a removal (cases 5, 6)."""

    def __init__(self, owner=None, op_type: str = "Relu", position: int = 0):
        super().__init__(owner, name=f"SinkTransposeThrough{op_type}{position}")
        self.op_type = op_type
        self.position = position
        self.kind = ("unary" if op_type in UNARY else "binary" if op_type in BINARY else
                     "softmax" if op_type in SOFTMAX else "reduce")

    def pattern(self, op, x, other):
        t = op.Transpose(x, _outputs=["t"])
        make = getattr(op, self.op_type)
        if self.kind == "binary":
            args = (t, other) if self.position == 0 else (other, t)
            return make(*args, _outputs=["out"])
        return make(t, _allow_other_inputs=True, _outputs=["out"])

    def check(self, context, x, t, out, other=None, **_):
        opset = self._opset = self.opset(context)
        node = out.producer()
        perm = perm_of(t.producer())
        if perm is None or not _single_use(t):
            return self.decline(None, "Transpose is read elsewhere")
        rank = len(perm)
        self._perm, self._after, self._axis, self._axes, self._other = perm, perm, None, None, None
        if self.kind == "binary":
            other_t = _is_transpose(other)
            if other_t is not None and perm_of(other_t) == perm and _single_use(other) and other_t is not t.producer():
                self._other = other_t.inputs[0]
                return pattern.MatchResult()  # case 6: two Transposes become one
            if not _adjustable_operand(other, rank):
                return self.decline(None, "other operand has its own layout")
            self._other = other
        elif self.kind == "unary":
            if not all(_scalar_like(v, rank) for v in node.inputs[1:] if v is not None):
                return self.decline(None, "non-scalar extra inputs")
        elif self.kind == "softmax":
            self._axis = _softmax_axis(node, perm, opset)
            if self._axis is None:
                return self.decline(None, "softmax axis has no equivalent before opset 13")
        else:
            axes = reduce_axes(node, opset)
            after = _reduced_perm(node, perm, opset)
            if axes is None or after is None:
                return self.decline(None, "reduction axes not constant")
            self._axes, self._after = [perm[a] for a in axes], after
            if after == list(range(len(after))):
                return pattern.MatchResult()  # the Transpose vanishes here
        if not _sinks_to_a_merge(out, self._after, opset):
            return self.decline(None, "sinking would not meet another Transpose")
        return pattern.MatchResult()

    def rewrite(self, op, x, t, out, other=None, **_):
        node = out.producer()
        self._graph = node.graph
        opset = self._opset
        attrs = {k: v.value for k, v in node.attributes.items()}
        make = getattr(op, self.op_type)
        if self.kind == "binary":
            adjusted = self._other_in_x_layout(op)
            args = (x, adjusted) if self.position == 0 else (adjusted, x)
            moved = make(*args, **attrs)
        elif self.kind == "unary":
            moved = make(x, *node.inputs[1:], **attrs)
        elif self.kind == "softmax":
            attrs["axis"] = self._axis
            moved = make(x, **attrs)
        else:
            axes = sorted(self._axes)
            if _axes_in_input(self.op_type, opset):
                moved = make(x, op.Constant(value=ir.tensor(np.asarray(axes, dtype=np.int64))), **attrs)
            else:
                attrs["axes"] = axes
                moved = make(x, **attrs)
        self.accepted(node, f"Transpose moved below {self.op_type}")
        if self._after == list(range(len(self._after))):
            return moved
        return op.Transpose(moved, perm=self._after)

    def _other_in_x_layout(self, op) -> ir.Value:
        other = self._other
        if _is_transpose(other) is None and not _scalar_like(other, len(self._perm)) and constant_array(other) is not None:
            const = constant_array(other)
            full = const.reshape((1,) * (len(self._perm) - const.ndim) + const.shape)
            folded = np.array(np.transpose(full, inverse(self._perm)), order="C")
            return op.initializer(ir.tensor(folded), name=_new_initializer_name(self._graph, other.name))
        return other


def _new_initializer_name(graph: ir.Graph, base: str | None) -> str:
    """A fresh name: the rewriter would replace an existing initializer of the same name."""
    base = f"{base or 'const'}_transposed"
    for i in itertools.count():
        if f"{base}{i}" not in graph.initializers:
            return f"{base}{i}"
    raise AssertionError("unreachable")


class TransposePass(DmlPass):
    """Cancel, merge, fold and sink Transposes; never ends with more than it started with."""

    name = "transpose"
    summary = "cancel/merge/fold Transposes, use Gemm/FusedMatMul transA/transB, sink them through elementwise ops"
    order = 50.0

    def rules(self) -> list:
        rules = [onnxscript_rules.no_op_transpose_rule, onnxscript_rules.transpose_transpose_rule,
                 FoldConstantTranspose.rule(self), SizeOneTransposeToReshape.rule(self),
                 GemmTransposedInput.rule(self, 0), GemmTransposedInput.rule(self, 1),
                 MatMul2DTransposedInput.rule(self, 0), MatMul2DTransposedInput.rule(self, 1),
                 TransposedMatMul2D.rule(self), PointwiseConvBetweenTransposes.rule(self),
                 CollapseLayoutChain.rule(self, "Transpose"), CollapseLayoutChain.rule(self, "Reshape"),
                 onnxscript_rules.reshape_reshape_rule]
        if ("com.microsoft", "FusedMatMul") not in no_kernel(self.context.target.ep):
            rules += [fused_matmul.TransposeMatMul1.rule(), fused_matmul.TransposeMatMul2.rule(),
                      fused_matmul.TransposeFusedMatMul1.rule(), fused_matmul.TransposeFusedMatMul2.rule()]
        for op_type in UNARY + SOFTMAX + REDUCE:
            rules.append(SinkTranspose.rule(self, op_type, 0))
        for op_type in BINARY:
            rules += [SinkTranspose.rule(self, op_type, 0), SinkTranspose.rule(self, op_type, 1)]
        return rules

    needs_shapes = "onnx"
    measured = "Transposes"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        return [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
                if n.op_type == "Transpose" and n.domain in ("", "ai.onnx")]

    def measure(self, model: ir.Model) -> int:
        return transpose_count(model)

    def worse(self, before: int, after: int) -> str | None:
        return f"the rewrites would have left {after} Transposes where there were {before}" if after > before else None

    def rewrite(self, model: ir.Model) -> bool:
        rules = self.rules()
        total = 0
        for _ in range(MAX_ROUNDS):
            count = apply_rules(model, rules)
            total += count
            if not count:
                break
        eliminate_identities(model)  # cancelled pairs leave Identity
        remove_unused_nodes(model)
        return total > 0
