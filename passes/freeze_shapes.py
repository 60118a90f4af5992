"""freeze-shapes: give dynamic axes the values the user names, then fold the shape arithmetic.

On DirectML a dynamic axis keeps Shape/Gather/Concat arithmetic alive at run time (on the
CPU, with copies) and blocks whole-graph compilation; a SAM encoder exported with a dynamic
batch carries hundreds of such nodes.  With the axes fixed, that arithmetic is constant.

Rewrites (every graph: the main graph and If/Loop/Scan bodies):
  x: [batch, 3, H, W]  ->  x: [1, 3, 1024, 1024]          inputs, outputs, value_info
  Shape(x), Size(x)  ->  Constant                           x static
  Gather/Slice/Concat/Unsqueeze/Squeeze/Cast/Add/Sub/Mul/Div/Mod/Equal/Where/Range/
    ConstantOfShape(constants)  ->  Constant                 size-guarded (case 3)
  Gather(Shape(x), i), Slice(Shape(x), a, b)  ->  Constant  the picked dims static, others not
  Reshape(x, Concat(Shape(x)[0], -1))  ->  Reshape(x, [2, 60])   output static: no 0, no -1
  Reshape(x, s), Expand(x, s), Slice(x, 0, end), Cast(x, type(x))  ->  x   no-ops once static
                                          (s may be [N, -1]: the static output shape decides)
  V2(V1(x))  ->  Reshape(x, Constant)     V1, V2 in {Reshape, Squeeze, Unsqueeze, Flatten}
  Slice(Slice(x, axis a), axis b)  ->  Slice(x, axes a, b)
  Slice(x, 0, a), Slice(x, a, b), Slice(x, b, dim)  ->  Split(x, [a, b - a, dim - b])  one axis, tiled
  Pad(x, zeros)  ->  x;  Conv(Pad(x, p, 0)) -> Conv(x; pads + p)   pads folded to constants (HF's
                                          TF-style "same" padding: MobileNetV2, EfficientNet)
  Mul(x, ones), Div(x, ones), Add(x, zeros), Sub(x, zeros)  ->  x
                                          the static shapes show the broadcast changes nothing
  If(Constant cond, then, else)  ->  the taken branch's nodes, inlined (names made unique)

Cases:
  1. Nothing given (no shapes, no dims): the model is left as it is; the report lists its
     free dimensions, which ``dmlopt bench --dim`` can still fix at session creation.
  2. Shapes/dims given: they are checked first (``dmlopt.graph.shapes.check_shapes``: unknown
     names, rank, conflicts with static dims -> UsageError).  A dim named in ``dims`` is
     fixed wherever it appears; a ``shapes`` entry also fixes the names its dynamic axes
     carry (``image: [batch, ...]`` with batch = 1 fixes ``batch`` everywhere).
  3. Big constants: Expand/Tile/ConstantOfShape/Range results above ``BIG_RESULT``
     elements stay ops, and so does any result above it that frees less than it adds.
     Sizes come from the true shapes of the constant inputs before anything is evaluated
     (``dmlopt.graph.shape_inference.folded_elements``); a result of unknown size stays an op.  Folding runs twice: first only folds that add at most
     ``SMALL_GROWTH`` bytes (a shape constant replacing a node); then folds that add more (a
     Gather of a weight, say) may spend what the first round saved plus 1% of the model, in
     graph order, and stay ops once it is spent.  The saved size (less value_info) is
     measured at the end; over 1% growth, the pass keeps only the declared shapes.
  4. Shape inference (onnx, with data propagation) and folding alternate until nothing
     changes: folding a Reshape's shape makes its output static, which folds the next Shape.
  5. What stays dynamic (a free dim not given, data-dependent shapes such as NonZero) is
     reported: remaining Shape/Size nodes are logged as kept, with the dynamic dims.
  6. Model-local functions are left as they are (the cleanup pass inlines them first).
  7. Every input already static (nothing to give): the shape arithmetic an exporter kept
     anyway (SAM's F.pad computes its pads through ConstantOfShape/Concat/Transpose, which
     onnxscript's folder never folds) is folded as in case 4.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from dmlopt.passes._folding import check_failure, fold_constants
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules import common as common_rules

from dmlopt.graph import shape_inference
from dmlopt.io.model import initializer_bytes, tensor_bytes
from dmlopt.passes._base import DmlPass, SiteRule, apply_rules, remove_unused_nodes, restore
from dmlopt.passes._shared import (DeduplicateInitializers, ReshapeNoOp, constant_array, graph_values, infer_static_dims,
                                   is_static, show_shape)
from dmlopt.graph.shapes import check_shapes, free_dimensions, runtime_inputs

# Expand/Tile/ConstantOfShape/Range results above this many elements stay ops.
BIG_RESULT = 1 << 14
# A fold adding at most this many bytes replaces a node about as big: never charged.
SMALL_GROWTH = 1024
# The saved model may grow by at most this fraction (plus SLACK bytes: on a weightless
# test graph one shape constant is already more than 1%).
MAX_GROWTH = 0.01
SLACK = 1024
# Inference + folding rounds; each round makes more shapes static (case 4).
MAX_ROUNDS = 6
# Above this many bytes of weights, size is measured from initializers alone (no serializing).
SERIALIZE_LIMIT = 256 << 20

BIG_RESULT_OPS = frozenset({"Expand", "Tile", "ConstantOfShape", "Range"})
VIEW_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


class FreezeShapesPass(DmlPass):
    """Fix dynamic axes to the given values and fold what they kept dynamic."""

    name = "freeze-shapes"
    summary = "fix dynamic axes (--shape/--dim) and fold the Shape arithmetic they keep alive; lists free dims otherwise"
    order = 10.0
    _inputs_changed = False  # set by _freeze_declared
    _keep_ops: frozenset[str] = frozenset()  # ONNX ops the folding keeps (If, after a fold exposed a latent error)
    needs_fresh_names = True  # for the Splits and their sizes, and the shapes of folded view chains

    def skip(self, model: ir.Model, sites) -> bool:
        """Checks the declared shapes; nothing declared: lists the free dims, and stops if nothing can fold."""
        shapes, dims = self.context.shapes, self.context.dims
        self._values = check_shapes(model, shapes, dims)
        return not shapes and not dims and self._report_free(model)

    def rewrite(self, model: ir.Model) -> bool:
        """Its own undo-if-worse: a fold that grows the model is undone but the declared shapes stay."""
        shapes, dims, values = self.context.shapes, self.context.dims, self._values
        before = _census(model)
        size_before = _model_bytes(model)
        limit = size_before * (1 + MAX_GROWTH) + SLACK
        backup = model.clone()
        self._freeze_declared(model, shapes, values)
        strict = check_failure(model, strict=True) is None
        # Fold what does not grow the model first; big folds may then spend what that saved.
        if self._fold(model, budget=0.0, log=False):
            self._fold(model, budget=limit - _model_bytes(model), log=True)
        why = check_failure(model, strict, before=backup)
        if why:  # a fold exposed a latent non-conformance (case 9): fold again keeping every If
            self.note(f"folding undone: its result fails a check ({why}); folded again keeping every If and "
                      "what computes its condition")
            restore(model, backup.clone())
            self._freeze_declared(model, shapes, values)
            self._keep_ops = frozenset({"If"})
            if self._fold(model, budget=0.0, log=False):
                self._fold(model, budget=limit - _model_bytes(model), log=True)
            why = check_failure(model, strict, before=backup)
        size = _model_bytes(model)
        undone = size > limit or bool(why)
        if why:
            self.note(f"folding undone again: its result still fails a check ({why}); only the declared "
                      "shapes are kept")
        elif undone:
            self.note(f"folding grew the model from {size_before} to {size} bytes (> 1%): undone, "
                      "only the declared shapes are kept")
        if undone:
            restore(model, backup)
            self._freeze_declared(model, shapes, values)
            infer_static_dims(model)
        after = _census(model)
        if not shapes and not dims and after.computing == before.computing:  # case 7, nothing folded
            restore(model, backup)
            return False
        self._report(model, before, after, undone)
        return self._inputs_changed or (before.nodes, before.dynamic) != (after.nodes, after.dynamic)

    # -- steps ----------------------------------------------------------------------
    def _freeze_declared(self, model: ir.Model, shapes: Mapping[str, Sequence[int]],
                         values: Mapping[str, int]) -> None:
        """Case 2: the given input shapes, and every occurrence of a given dim name."""
        self._inputs_changed = False
        for value in runtime_inputs(model):
            if value.name in shapes:
                old = show_shape(value.shape)
                value.shape = ir.Shape([int(d) for d in shapes[value.name]])
                if old != show_shape(value.shape):
                    self._inputs_changed = True
                    self.rewrote(f"input {value.name}", f"{old} -> {show_shape(value.shape)}")
        for graph in model.graphs():
            for value in graph_values(graph):
                if value.shape is None:
                    continue
                dims = [values.get(d.value, d) if isinstance(d, ir.SymbolicDim) else d for d in value.shape.dims]
                if any(a is not b for a, b in zip(dims, value.shape.dims)):
                    if value.is_graph_input() and graph is model.graph:
                        self._inputs_changed = True
                        self.rewrote(f"input {value.name}", f"{show_shape(value.shape)} -> {show_shape(ir.Shape(dims))}")
                    value.shape = ir.Shape(dims)

    def _fold(self, model: ir.Model, budget: float, log: bool) -> int:
        """Case 4: shape inference and folding until nothing changes; returns folds refused for size."""
        guard = _FoldGuard(self, budget, log)
        split_sizes_as_input = model.opset_imports.get("", 1) >= 13
        for _ in range(MAX_ROUNDS):
            changed = infer_static_dims(model) > 0
            changed |= bool(fold_constants(model, self, keep_ops=self._keep_ops, onnx_shape_inference=True,
                                           output_size_limit=BIG_RESULT,
                                           should_fold=guard))
            present = {n.op_type for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.domain in ("", "ai.onnx")}
            rules = _shape_rules(self, present)
            changed |= bool(rules) and apply_rules(model, rules) > 0
            if split_sizes_as_input:
                changed |= slices_to_split(self, model) > 0
            changed |= remove_unused_nodes(model)
            if not changed:
                break
        for step in (common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
                     common_passes.LiftSubgraphInitializersToMainGraphPass(),
                     DeduplicateInitializers(),
                     common_passes.CommonSubexpressionEliminationPass(),
                     remove_unused_nodes,
                     common_passes.NameFixPass()):
            step(model)
        infer_static_dims(model)
        return guard.refused

    # -- report ---------------------------------------------------------------------
    def _report_free(self, model: ir.Model) -> bool:
        """Case 1: say which axes are free and how to fix them; False when none is (case 7)."""
        free = free_dimensions(model)
        if not free:
            self.note("all input shapes are static: folding the shape arithmetic the export kept")
            return False
        listed = ", ".join(f"{name} ({', '.join(where)})" for name, where in free.items())
        self.note(f"free dimensions: {listed}; fix them with --shape NAME:D0,D1,... or --dim NAME=VALUE")
        for name, where in free.items():
            self.kept(f"dim {name}", f"dynamic at {', '.join(where)}: nothing given to freeze it")
        return True

    def _report(self, model: ir.Model, before: _Census, after: _Census, undone: bool) -> None:
        self.rewrote("<graph>", f"nodes {before.nodes} -> {after.nodes}, Shape/Size {before.shape_ops} -> "
                     f"{after.shape_ops}, If {before.ifs} -> {after.ifs}, dynamic values {before.dynamic} -> "
                     f"{after.dynamic}", nodes_before=before.nodes, nodes_after=after.nodes,
                     shape_ops_before=before.shape_ops, shape_ops_after=after.shape_ops)
        named = sorted(before.if_names - after.if_names)
        for name in named:
            self.rewrote(name, "condition folded to a constant: the taken branch is inlined")
        if before.ifs - after.ifs > len(named):
            self.rewrote("<If>", f"{before.ifs - after.ifs - len(named)} unnamed If with a constant condition: "
                                 "the taken branch is inlined")
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx"):
                self.kept(node, "folding undone: it grew the model by more than 1%" if undone else
                          f"input shape {show_shape(node.inputs[0].shape)} is not static")
        free = free_dimensions(model)
        if free:
            self.note("still free: " + ", ".join(f"{name} ({', '.join(where)})" for name, where in free.items()))
        if after.dynamic:
            self.note(f"{after.dynamic} values keep dynamic dims (e.g. {', '.join(after.dynamic_examples)})")


# -- folding guard (case 3) -------------------------------------------------------------
class _FoldGuard:
    """`should_fold` for onnxscript's folder: keep big results as ops, cap constant growth."""

    def __init__(self, owner: DmlPass, budget: float, log: bool):
        self.owner, self.remaining, self.log = owner, budget, log
        self.refused = 0  # folds refused because they would grow the model

    def _keep(self, node: ir.Node, reason: str, grows: bool = False) -> bool:
        self.refused += grows
        if self.log or not grows:
            self.owner.kept(node, reason)
        return False

    def __call__(self, node: ir.Node) -> bool | None:
        out = node.outputs[0] if len(node.outputs) == 1 else None
        counts = shape_inference.folded_elements(node)  # from the inputs' true shapes, before evaluating
        big_maker = node.op_type in BIG_RESULT_OPS and node.domain in ("", "ai.onnx")
        if counts is None:
            return self._keep(node, "result size unknown: stays an op")
        count = sum(counts)
        if big_maker and count > BIG_RESULT:
            return self._keep(node, f"result of {count} elements stays an op (bound {BIG_RESULT})")
        growth = count * _itemsize(out) - _freed_bytes(node) if out is not None else 0
        if growth > SMALL_GROWTH and growth > self.remaining:
            return self._keep(node, f"folding would add {growth} bytes of constants, over the 1% budget "
                                    f"({max(int(self.remaining), 0)} bytes left)", grows=True)
        reason = shape_inference.fold_refusal(node, BIG_RESULT, counts=counts)
        if reason is not None:
            return self._keep(node, f"{reason}: stays an op")
        if out is None:
            return None  # several outputs: onnxscript's own rules
        if growth > SMALL_GROWTH:
            self.remaining -= growth
        return True if big_maker else None


def _freed_bytes(node: ir.Node) -> int:
    """Bytes of constant inputs that die with `node` (it is their only use)."""
    freed = 0
    for value in node.inputs:
        if value is not None and value.const_value is not None and len(value.uses()) == 1 \
                and not value.is_graph_output():
            freed += tensor_bytes(value.const_value)
    return freed


# -- rewrite rules that need static shapes ----------------------------------------------
class ShapeElementsToConstant(SiteRule):
    """``Gather(Shape(x), i)`` / ``Slice(Shape(x), a, b)`` -> Constant when the picked dims are static."""

    def __init__(self, owner, op_type: str):
        super().__init__(owner, f"{op_type}OfShapeToConstant")
        self.op_type = op_type

    def pattern(self, op, shape, index):
        # Shape(x) is not in the pattern: it usually feeds several Gathers, and a matched
        # node whose output has users outside the match cannot be rewritten.
        if self.op_type == "Gather":
            return op.Gather(shape, index, _allow_other_attributes=True)
        return op.Slice(shape, index, _allow_other_inputs=True)

    def check(self, context, shape, index, **_):
        producer = shape.producer()
        if producer is None or producer.op_type != "Shape" or producer.domain not in ("", "ai.onnx"):
            return pattern.MatchResult().fail("not a Shape")
        picked = _picked_dims(producer, context.output_values[0].producer(), producer.inputs[0])
        if picked is None:
            return pattern.MatchResult().fail("indices or shape not constant")
        if not all(isinstance(d, int) for d in picked[1]):
            return pattern.MatchResult().fail("a picked dim is dynamic")
        self._picked = picked
        return pattern.MatchResult()

    def rewrite(self, op, shape, index, **_):
        scalar, dims = self._picked
        array = np.array(dims[0] if scalar else dims, dtype=np.int64)
        return op.Constant(value=ir.tensor(array))


def _picked_dims(shape_node: ir.Node, node: ir.Node, x: ir.Value):
    """(is_scalar, dims) that `node` takes out of Shape(x), or None if not known."""
    if x.shape is None:
        return None
    start = shape_node.attributes.get_int("start", 0)
    end = shape_node.attributes.get_int("end", None)
    dims = list(x.shape.dims)[start:end]
    consts = [constant_array(v) for v in node.inputs[1:]]
    if any(c is None for c, v in zip(consts, node.inputs[1:]) if v is not None):
        return None
    if node.op_type == "Gather":
        if node.attributes.get_int("axis", 0) != 0:
            return None
        index = consts[0]
        if index.ndim > 1 or any(not -len(dims) <= int(i) < len(dims) for i in np.ravel(index)):
            return None
        return index.ndim == 0, [dims[int(i)] for i in np.ravel(index)]
    if len(consts) < 2:  # Slice-1: starts/ends are attributes
        return None
    starts, ends = consts[0], consts[1]
    axes = consts[2] if len(consts) > 2 and consts[2] is not None else np.array([0])
    steps = consts[3] if len(consts) > 3 and consts[3] is not None else np.array([1])
    if starts.size != 1 or ends.size != 1 or int(np.ravel(axes)[0]) not in (0, -1):
        return None
    step = int(np.ravel(steps)[0])
    if step == 0:
        return None
    return False, dims[slice(int(np.ravel(starts)[0]), int(np.ravel(ends)[0]), step)]


class ViewChainToReshape(SiteRule):
    """``V2(V1(x))`` -> ``Reshape(x, static)`` for V1, V2 view ops (shape-only, no data change)."""

    def __init__(self, owner, outer: str, inner: str):
        super().__init__(owner, f"{outer}Of{inner}ToReshape")
        self.outer, self.inner = outer, inner

    def pattern(self, op, x):
        inner = getattr(op, self.inner)(x, _allow_other_inputs=True, _allow_other_attributes=True)
        return getattr(op, self.outer)(inner, _allow_other_inputs=True, _allow_other_attributes=True)

    def check(self, context, x, **_):
        out = context.output_values[0]
        if not is_static(out) or not is_static(x):
            return pattern.MatchResult().fail("shapes not static")
        if any(d == 0 for d in out.shape.dims):
            return self.decline(context.nodes[-1], "zero-size dim: Reshape would read 0 as 'copy this dim'")
        self._out_dims, self._out_name = list(out.shape.dims), out.name
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):
        dims = np.array(self._out_dims, dtype=np.int64)
        return op.Reshape(x, op.initializer(ir.tensor(dims, name=self.owner.fresh(f"{self._out_name}_shape"))))


class ReshapeToExplicitShape(SiteRule):
    """``Reshape(x, [N, -1])`` -> ``Reshape(x, [2, 60])``: a static output needs no 0 or -1."""

    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _allow_other_attributes=True)

    def check(self, context, x, shape, **_):
        value, out = constant_array(shape), context.output_values[0]
        if value is None or not np.any(value <= 0):
            return pattern.MatchResult().fail("shape not constant or already explicit")
        if not is_static(out) or any(d == 0 for d in out.shape.dims):
            return pattern.MatchResult().fail("output not static, or has a zero dim")
        self._dims = list(out.shape.dims)
        return pattern.MatchResult()

    def rewrite(self, op, x, shape, **_):
        return op.Reshape(x, op.Constant(value=ir.tensor(np.array(self._dims, dtype=np.int64))))


class SliceOfSlice(SiteRule):
    """``Slice(Slice(x, a1), a2)`` -> ``Slice(x, a1 + a2)`` when the two slice different axes."""

    def pattern(self, op, x, s1, e1, s2, e2):
        inner = op.Slice(x, s1, e1, _allow_other_inputs=True)
        return op.Slice(inner, s2, e2, _allow_other_inputs=True)

    def check(self, context, x, **_):
        outer = context.output_values[0].producer()
        inner = outer.inputs[0].producer()
        if len(inner.outputs[0].uses()) != 1:
            return pattern.MatchResult().fail("inner Slice has other users")
        params = [_slice_params(n, x) for n in (inner, outer)]
        if any(p is None for p in params):
            return pattern.MatchResult().fail("slice parameters not constant or rank unknown")
        if set(params[0][2]) & set(params[1][2]):
            return pattern.MatchResult().fail("both slice the same axis")
        self._merged = [np.concatenate([a, b]).astype(np.int64) for a, b in zip(*params)]
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):
        return op.Slice(x, *[op.Constant(value=ir.tensor(a)) for a in self._merged])


def _slice_params(node: ir.Node, x: ir.Value):
    """(starts, ends, axes >= 0, steps) of a Slice-10+ with constant inputs, or None."""
    if x.shape is None or len(node.inputs) < 3:
        return None
    consts = [constant_array(v) for v in node.inputs[1:5]]
    if any(c is None for c, v in zip(consts, node.inputs[1:5]) if v is not None) or consts[0] is None \
            or consts[1] is None:
        return None
    starts, ends = consts[0].astype(np.int64), consts[1].astype(np.int64)
    axes = consts[2] if len(consts) > 2 and consts[2] is not None else np.arange(len(starts))
    steps = consts[3] if len(consts) > 3 and consts[3] is not None else np.ones(len(starts))
    rank = len(x.shape)
    axes = np.array([a + rank if a < 0 else a for a in axes.astype(np.int64)], dtype=np.int64)
    return starts, ends, axes, steps.astype(np.int64)


def slices_to_split(owner: DmlPass, model: ir.Model) -> int:
    """``Slice(x, 0, a), Slice(x, a, b), ...`` on one axis, tiling it -> ``Split(x, [a, b - a, ...])``.

    The tiling is only visible once the axis is static (the qkv unbind of dynamo exports).
    A walk over each value's consumers, not a rewrite rule: onnxscript's multi-output
    matcher binds identical sub-patterns (three ``Slice(x, ...)``) to the same node.
    """
    count = 0
    for graph in model.graphs():
        for x in list(graph_values(graph)):
            if not is_static(x):
                continue
            by_axis: dict[int, list] = {}
            for node in {use.node for use in x.uses()}:
                if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or node.inputs[0] is not x \
                        or node.graph is not graph:
                    continue
                params = _slice_params(node, x)
                if params is None or len(params[0]) != 1 or params[3][0] != 1:
                    continue
                axis = int(params[2][0])
                by_axis.setdefault(axis, []).append((_bounds(int(params[0][0]), int(params[1][0]),
                                                             x.shape.dims[axis]), node))
            for axis, parts in by_axis.items():
                parts.sort(key=lambda p: (p[0], p[1].name or ""))
                bounds = [b for b, _ in parts]
                if len(parts) < 2 or bounds[0][0] != 0 or bounds[-1][1] != x.shape.dims[axis] or any(
                        a[1] != b[0] for a, b in zip(bounds, bounds[1:])) or any(lo >= hi for lo, hi in bounds):
                    continue
                nodes = [n for _, n in parts]
                sizes = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
                sizes_value = ir.Value(name=owner.fresh(f"{x.name}_split_sizes"), const_value=ir.tensor(sizes),
                                       shape=ir.Shape([len(nodes)]), type=ir.TensorType(ir.DataType.INT64))
                graph.register_initializer(sizes_value)
                split = ir.Node("", "Split", [x, sizes_value], attributes=[ir.AttrInt64("axis", axis)],
                                num_outputs=len(nodes), name=owner.fresh(f"{nodes[0].name}_split") if nodes[0].name else None)
                for out, node in zip(split.outputs, nodes):
                    out.name, out.shape, out.type = node.outputs[0].name, node.outputs[0].shape, node.outputs[0].type
                ir.convenience.replace_nodes_and_values(graph, nodes[0], nodes, [split],
                                                        [n.outputs[0] for n in nodes], list(split.outputs))
                owner.rewrote(split, f"{len(nodes)} Slices tiling axis {axis} of {x.name} -> one Split")
                count += 1
    return count


def _bounds(start: int, end: int, dim: int) -> tuple[int, int]:
    """Slice's clamping of [start, end) to [0, dim] (negative values count from the end)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    return min(max(start, 0), dim), min(max(end, 0), dim)


class BroadcastNoOp(SiteRule):
    """``Mul(x, ones)``, ``Div(x, ones)``, ``Add(x, zeros)``, ``Sub(x, zeros)`` -> x.

    Only when static shapes show the broadcast keeps x's shape.  Exact: x*1, x/1 and x-0
    are x bit for bit; x+0 differs only for x = -0.0 (gives +0.0, equal as numbers).
    """

    NEUTRAL = {"Mul": 1, "Div": 1, "Add": 0, "Sub": 0}

    def __init__(self, owner, op_type: str, constant_first: bool = False):
        super().__init__(owner, f"{op_type}NoOp{'Commuted' if constant_first else ''}")
        self.op_type, self.constant_first = op_type, constant_first

    def pattern(self, op, x, c):
        make = getattr(op, self.op_type)
        return make(c, x) if self.constant_first else make(x, c)

    def check(self, context, x, c, **_):
        value = constant_array(c)
        if value is None or value.size == 0:
            return pattern.MatchResult().fail("not a constant")
        if not np.all(value == self.NEUTRAL[self.op_type]):
            return pattern.MatchResult().fail("constant is not neutral")
        out = context.output_values[0]
        if not (is_static(x) and is_static(out)) or x.shape.dims != out.shape.dims or x.dtype != out.dtype:
            return pattern.MatchResult().fail("broadcast may change the shape")
        return pattern.MatchResult()

    def rewrite(self, op, x, c, **_):
        return op.Identity(x)


class PadNoOp(SiteRule):
    """``Pad(x, pads)`` with every pad 0 -> x: nothing is added or cut, whatever the mode and value."""

    def pattern(self, op, x, pads):
        return op.Pad(x, pads, _allow_other_inputs=True, _allow_other_attributes=True)

    def check(self, context, x, pads, **_):
        value = constant_array(pads)
        if value is None or value.size == 0 or np.any(value != 0):
            return pattern.MatchResult().fail("pads are not constant zeros")
        return pattern.MatchResult()

    def rewrite(self, op, x, pads, **_):
        return op.Identity(x)


def _shape_rules(owner: DmlPass, present: set[str]) -> list:
    """The rules for the op types `present` in the model (matching costs rules x nodes)."""
    groups = [
        ({"Gather"}, lambda: [ShapeElementsToConstant.rule(owner, "Gather")]),
        ({"Slice"}, lambda: [ShapeElementsToConstant.rule(owner, "Slice"), SliceOfSlice.rule(owner),
                             common_rules.collapse_slice_rule, common_rules.collapse_slice2_rule]),
        ({"Reshape", "Squeeze", "Unsqueeze", "Flatten"}, lambda: [
            *(ViewChainToReshape.rule(owner, outer, inner) for outer in VIEW_OPS[:3] for inner in VIEW_OPS
              if (outer, inner) != ("Reshape", "Reshape")),
            common_rules.squeeze_reshape_1d_rule, common_rules.unsqueeze_unsqueeze_rule]),
        ({"Reshape"}, lambda: [ReshapeNoOp.rule(owner), ReshapeToExplicitShape.rule(owner),
                               common_rules.materialize_reshape_shape_rule, common_rules.reshape_reshape_rule]),
        ({"Mul", "Div", "Add", "Sub"}, lambda: [
            *(BroadcastNoOp.rule(owner, op_type) for op_type in BroadcastNoOp.NEUTRAL),
            *(BroadcastNoOp.rule(owner, op_type, constant_first=True) for op_type in ("Mul", "Add"))]),
        ({"Expand"}, lambda: [common_rules.no_op_expand_rule, *common_rules.expand_before_binary_op_rules]),
        ({"Cast"}, lambda: [common_rules.no_op_cast_rule]),
        # pads computed from the input size (TF "same" padding) are constant only now: cleanup's
        # Pad-into-Conv fusion ran before, and ORT cannot fuse a Pad that pad-concat made a Concat
        ({"Pad"}, lambda: [PadNoOp.rule(owner), common_rules.fuse_pad_into_conv_rule]),
    ]
    return [rule for ops, make in groups if ops & present for rule in make()]


# -- shape inference ----------------------------------------------------------------------
# -- small helpers ------------------------------------------------------------------------
@dataclasses.dataclass
class _Census:
    nodes: int
    computing: int  # nodes other than Constant (lifting those to initializers changes nothing)
    shape_ops: int
    ifs: int
    if_names: set
    dynamic: int
    dynamic_examples: list


def _census(model: ir.Model) -> _Census:
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    dynamic = [v for g in model.graphs() for v in graph_values(g) if not is_static(v)]
    return _Census(len(nodes), sum(n.op_type != "Constant" for n in nodes),
                   sum(n.op_type in ("Shape", "Size") for n in nodes),
                   sum(n.op_type == "If" for n in nodes), {n.name for n in nodes if n.op_type == "If" and n.name},
                   len(dynamic), [f"{v.name} {show_shape(v.shape)}" for v in dynamic[:3]])


def _itemsize(value: ir.Value) -> int:
    try:
        return value.dtype.itemsize if value.dtype is not None else 8
    except (AttributeError, TypeError, ValueError):
        return 8


def _model_bytes(model: ir.Model) -> int:
    """Size of the saved model less its value_info (serialized when small enough, else its weights).

    value_info is left out: static dims for every value are what this pass is asked to
    write, and on a weightless test graph they alone would be more than 1%.
    """
    weights = initializer_bytes(model)
    if weights > SERIALIZE_LIMIT:
        return weights
    # The large main-graph weights count by their bytes, not serialized: a copy of each of them
    # for a size was the largest use of memory of an optimize run.
    _, large = shape_inference.split_initializers(model)
    streamed = set(large)
    proto = shape_inference.proto_with(model, initializers=[v for v in model.graph.initializers.values()
                                                            if v not in streamed])
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        graph.ClearField("value_info")
        for node in graph.node:
            for attr in node.attribute:
                graphs += ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
    return proto.ByteSize() + sum(v.const_value.nbytes for v in large if v.const_value is not None)
