"""copies: remove the causes the DirectML placement model finds for CPU nodes and copies.

Every node ORT's DirectML EP leaves on the CPU costs a GPU->CPU and a CPU->GPU copy, and
anything that cannot join a compiled DML graph splits it (dmlopt/targets/dml/placement.py and its data
files say which, per ORT version).  The causes this pass removes:

Rewrites:
  1. ``Sum(a, b, c, ...) -> Sum(Sum(a, b), c) ...``; ``Max``/``Min`` likewise: DirectML
     compiles 2-input Sum/Max/Min/Mean only.  ``Sum(a) -> Identity(a)`` (same for Max/Min/Mean).
  2. ``Mean(a, b, c, ...) -> Div(Sum(Sum(a, b), c), n)`` (float types).
  3. ``Gelu(x)`` (ai.onnx-20, no DirectML kernel in any version):
     approximate="none" -> ``com.microsoft.Gelu(x)`` (DirectML registers it);
     approximate="tanh" -> ``Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Mul(Mul(x, x), x), 0.044715)),
     sqrt(2/pi))), 1))``.
  4. ``LayerNormalization(x, s, b) -> (Y, Mean, InvStdDev)`` with Mean/InvStdDev unused
     -> ``LayerNormalization(x, s, b) -> Y``: extra outputs send it to the CPU.
  5. ``LayerNormalization(x, s) -> LayerNormalization(x, s, zeros)`` for ORT versions whose
     DirectML EP needs the bias (1.14 .. 1.18 in the data files).
  6. ``Cast(Cast(x, to=B), to=A) -> x`` when x is of type A and A -> B is lossless
     (float32 -> float64 -> float32 yes, float32 -> float16 -> float32 no): a float64 Cast
     alone sends the pair to the CPU.
  7. ``If(constant cond)`` -> the taken branch, inlined (onnxscript's constant folding): any
     If/Loop/Scan turns DirectML's partitioning off for the whole model.

Cases:
  1. Every rewrite above is exact, except Mean's division and Gelu's forms, which equal the
     originals within float rounding (validated against ORT's CPU EP).
  2. Declined with a reason: Mean on integers, a Gelu or Cast of unknown element type, a
     used Mean/InvStdDev output, a lossy Cast pair, an If whose condition is computed.
  3. What the pass does not lower itself: Einsum equations (the einsum pass, order 40, runs
     first), and shape arithmetic on dynamic axes (freeze-shapes with ``--dim``/``--shape``).
     Every node still predicted on the CPU afterwards is logged as declined, with the
     placement model's reason, and the notes give the predicted CPU nodes, copies and
     partitions before and after.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from dmlopt.passes._folding import check_failure, fold_constants
from onnxscript.rewriter import pattern

from dmlopt.targets.dml import placement
from dmlopt.passes._base import (DmlPass, Option, SiteRule, apply_rules, eliminate_identities, remove_unused_nodes,
                                restore)
from dmlopt.graph.shape_inference import sized_folds

FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}
MS_DOMAIN = "com.microsoft"
MAX_SITES = 20  # CPU nodes logged one by one after the pass; the notes count the rest

# Element types whose every value the target type holds exactly (a Cast there and back is the identity).
_INT_RANGE = {
    ir.DataType.BOOL: (0, 1), ir.DataType.UINT8: (0, 2**8 - 1), ir.DataType.INT8: (-2**7, 2**7 - 1),
    ir.DataType.UINT16: (0, 2**16 - 1), ir.DataType.INT16: (-2**15, 2**15 - 1),
    ir.DataType.UINT32: (0, 2**32 - 1), ir.DataType.INT32: (-2**31, 2**31 - 1),
    ir.DataType.UINT64: (0, 2**64 - 1), ir.DataType.INT64: (-2**63, 2**63 - 1),
}
# Largest integer magnitude a float type holds exactly (its significand), and whether it holds
# every value of a narrower float type.
_FLOAT_EXACT_INT = {ir.DataType.FLOAT16: 2**11, ir.DataType.BFLOAT16: 2**8, ir.DataType.FLOAT: 2**24,
                    ir.DataType.DOUBLE: 2**53}
_FLOAT_WIDENS = {ir.DataType.FLOAT16: {ir.DataType.FLOAT, ir.DataType.DOUBLE},
                 ir.DataType.BFLOAT16: {ir.DataType.FLOAT, ir.DataType.DOUBLE},
                 ir.DataType.FLOAT: {ir.DataType.DOUBLE}}


def cast_round_trip_exact(source: ir.DataType, via: ir.DataType) -> bool:
    """Whether Cast(Cast(x: source, to=via), to=source) returns x for every x."""
    if source == via:
        return True
    if source in _FLOAT_WIDENS:
        return via in _FLOAT_WIDENS[source]
    if source in _INT_RANGE:
        lo, hi = _INT_RANGE[source]
        if via in _INT_RANGE:
            vlo, vhi = _INT_RANGE[via]
            if source == ir.DataType.BOOL:
                return True  # 0/1 survive any integer type, and nonzero -> True on the way back
            return vlo <= lo and hi <= vhi
        if via in _FLOAT_EXACT_INT:
            return max(abs(lo), hi) <= _FLOAT_EXACT_INT[via]
    return False


def _scalar(value: float, dtype: ir.DataType) -> ir.Tensor:
    return ir.tensor(np.array(value, dtype=dtype.numpy()))


class _SplitVariadic(SiteRule):
    """``Op(a, b, c, ...) -> Op(Op(a, b), c) ...`` for the variadic op in ``op_type``."""

    op_type = ""

    def pattern(self, op, a):
        return getattr(op, self.op_type)(a, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, a, y, **_):
        node = y.producer()
        if len(node.inputs) == 2:
            return pattern.MatchResult().fail("two inputs: DirectML compiles it as is")
        if any(v is None for v in node.inputs):
            return self.decline(node, "an empty input name")
        if self.op_type == "Mean" and len(node.inputs) > 2:
            dtype = y.dtype or a.dtype
            if dtype not in FLOATS:
                return self.decline(node, f"Mean on {dtype}: the division by n is only exact for float types")
        return True

    def rewrite(self, op, a, y, **_):
        node = y.producer()
        inputs = list(node.inputs)
        if len(inputs) == 1:
            self.accepted(node, f"{self.op_type}(a) -> Identity(a)")
            return op.Identity(inputs[0])
        combine = "Sum" if self.op_type == "Mean" else self.op_type
        acc = inputs[0]
        for value in inputs[1:]:
            acc = getattr(op, combine)(acc, value)
        self.accepted(node, f"{len(inputs)}-input {self.op_type} -> {len(inputs) - 1} binary {combine}"
                      + (" + Div" if self.op_type == "Mean" else ""))
        if self.op_type == "Mean":
            dtype = y.dtype or a.dtype
            return op.Div(acc, op.Constant(value=_scalar(len(inputs), dtype)))
        return acc


class SplitSum(_SplitVariadic):
    """``Sum(a, b, c) -> Sum(Sum(a, b), c)``."""

    op_type = "Sum"


class SplitMax(_SplitVariadic):
    """``Max(a, b, c) -> Max(Max(a, b), c)``."""

    op_type = "Max"


class SplitMin(_SplitVariadic):
    """``Min(a, b, c) -> Min(Min(a, b), c)``."""

    op_type = "Min"


class SplitMean(_SplitVariadic):
    """``Mean(a, b, c) -> Div(Sum(Sum(a, b), c), 3)``."""

    op_type = "Mean"


class OnnxGeluToSupported(SiteRule):
    """``Gelu(x)`` (ai.onnx) -> ``com.microsoft.Gelu(x)``, or the tanh formula for approximate="tanh"."""

    def pattern(self, op, x):
        return op.Gelu(x, _outputs=["y"])

    def check(self, context, x, y, **_):
        node = y.producer()
        approximate = _attr(node, "approximate", "none")
        if approximate not in ("none", "tanh"):
            return self.decline(node, f"unknown approximate={approximate!r}")
        if (x.dtype or y.dtype) not in FLOATS:
            return self.decline(node, "element type unknown: the tanh constants need it")
        return True

    def rewrite(self, op, x, y, **_):
        node = y.producer()
        if _attr(node, "approximate", "none") == "none":
            self.accepted(node, "ai.onnx Gelu -> com.microsoft Gelu")
            return op.Gelu(x, _domain=MS_DOMAIN)
        dtype = x.dtype or y.dtype

        def c(v):
            return op.Constant(value=_scalar(v, dtype))

        cube = op.Mul(op.Mul(x, x), x)
        inner = op.Mul(op.Add(x, op.Mul(cube, c(0.044715))), c(math.sqrt(2.0 / math.pi)))
        self.accepted(node, "ai.onnx Gelu(approximate=tanh) -> Tanh form")
        return op.Mul(op.Mul(x, c(0.5)), op.Add(op.Tanh(inner), c(1.0)))


class LayerNormZeroBias(SiteRule):
    """``LayerNormalization(x, s) -> LayerNormalization(x, s, zeros)`` where the EP needs a bias."""

    def pattern(self, op, x, scale):
        return op.LayerNormalization(x, scale, _outputs=["y"])

    def check(self, context, x, scale, y, **_):
        node = y.producer()
        shape = scale.shape
        if shape is None or not all(isinstance(d, int) for d in shape.dims):
            return self.decline(node, "scale shape unknown: a zero bias of its shape cannot be made")
        if scale.dtype not in FLOATS:
            return self.decline(node, "scale element type unknown")
        return True

    def rewrite(self, op, x, scale, y, **_):
        node = y.producer()
        zeros = ir.tensor(np.zeros(tuple(scale.shape.dims), dtype=scale.dtype.numpy()))
        attrs = {name: attr for name, attr in node.attributes.items()}
        self.accepted(node, "zero bias added (the DirectML EP of this ORT version runs LayerNormalization "
                            "without a bias on the CPU)")
        return op.LayerNormalization(x, scale, op.Constant(value=zeros), _outputs=1, **attrs)


class CastRoundTrip(SiteRule):
    """``Cast(Cast(x, to=B), to=A) -> x`` when x is of type A and A -> B -> A is lossless."""

    def pattern(self, op, x):
        return op.Cast(op.Cast(x, _outputs=["mid"]), _outputs=["y"])

    def check(self, context, x, mid, y, **_):
        node = y.producer()
        source = x.dtype
        via = ir.DataType(_attr(mid.producer(), "to"))
        back = ir.DataType(_attr(node, "to"))
        if source is None:
            return self.decline(node, "the input's element type is unknown")
        if back != source:
            return pattern.MatchResult().fail("the pair changes the type")
        if not cast_round_trip_exact(source, via):
            return self.decline(node, f"{source.name} -> {via.name} -> {source.name} is lossy: not removed")
        return True

    def rewrite(self, op, x, mid, y, **_):
        self.accepted(y.producer(), f"Cast pair {x.dtype.name} -> {ir.DataType(_attr(mid.producer(), 'to')).name} "
                                    "-> back removed")
        return op.Identity(x)


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


class CopiesPass(DmlPass):
    """Remove what makes DirectML place nodes on the CPU or split its compiled graph."""

    name = "copies"
    summary = ("remove predicted DirectML CPU fallbacks and graph splits: n-ary Sum/Max/Min/Mean, ai.onnx Gelu, "
               "LayerNorm extra outputs/missing bias, lossless Cast pairs, constant If")
    order = 70.0
    options = (
        Option("copies_report", "on", "predict placement before and after (notes in the report)",
               choices=("on", "off")),
    )

    def enabled(self) -> bool:
        return self.context.target.ep == "dml"

    def prepare(self, model: ir.Model, sites) -> None:
        """The placement before the rewrite, for the report, is predicted on the model as it came."""
        self._before = placement.predict(model, ort_version=self.context.target.table_version) \
            if self.option("copies_report") == "on" else None
        super().prepare(model, sites)

    needs_shapes = "types"  # the rules check element types (no weight is serialized for it)

    def rewrite(self, model: ir.Model) -> bool:
        data = placement.load_data(self.context.target.table_version)
        report, before = self._before is not None, self._before
        modified = self._fold_constant_ifs(model)
        modified |= self._drop_layer_norm_outputs(model)
        rules = [SplitSum.rule(self), SplitMax.rule(self), SplitMin.rule(self), SplitMean.rule(self),
                 OnnxGeluToSupported.rule(self), CastRoundTrip.rule(self)]
        if data.rules["layer_norm"]["requires_bias"]:
            rules.append(LayerNormZeroBias.rule(self))
        count = apply_rules(model, rules)
        if count:
            modified = True
            if any(n.domain == MS_DOMAIN for n in ir.traversal.RecursiveGraphIterator(model.graph)):
                model.opset_imports.setdefault(MS_DOMAIN, 1)
            eliminate_identities(model)
            remove_unused_nodes(model)  # keeps Loop(M, "")'s empty input
        if report:
            after = placement.predict(model, ort_version=self.context.target.table_version)
            self.note(f"DirectML placement (ORT {data.version} model): " + _counts(before) + " -> " + _counts(after))
            self._report_left(model, after)
        return modified

    def _report_left(self, model: ir.Model, after: placement.Placement) -> None:
        """What is still predicted on the CPU, grouped by reason; the first sites by name."""
        by_name = {n.name: n for n in model.graph if n.name}
        groups: dict[str, list[str]] = {}
        for cpu in after.cpu_nodes:
            groups.setdefault(cpu["reason"], []).append(cpu["node"])
        for cpu in after.cpu_nodes[:MAX_SITES]:
            self.declined(by_name.get(cpu["node"], cpu["node"]), f"still predicted on the CPU: {cpu['reason']}")
        for reason, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            self.note(f"{len(names)} nodes still on the CPU: {reason} (e.g. {names[0]})")
        free = sorted({d.value for v in model.graph.inputs if v.shape is not None for d in v.shape.dims
                       if not isinstance(d, int) and getattr(d, "value", None)})
        if free and after.cpu_count:
            self.note(f"dynamic axes {', '.join(free)} keep shape arithmetic on the CPU: freeze them "
                      f"(--dim {free[0]}=VALUE)")
        for blocker in after.partitions["blockers"]:
            self.note(f"still blocks one compiled graph: {blocker}")

    def _fold_constant_ifs(self, model: ir.Model) -> bool:
        """Case 7: If with a constant condition -> its branch (onnxscript's folding inlines it)."""
        ifs = [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "If"]
        constant = []
        for node in ifs:
            if ir.convenience.get_const_tensor(node.inputs[0]) is None:
                self.declined(node, "If condition is computed at run time: DirectML does not partition the model")
            else:
                constant.append(node)
        if not constant:
            return False
        names = {n.name for n in constant}
        backup = model.clone()
        fold_constants(model, self, output_size_limit=1024, input_size_limit=1024,
                                 should_fold=sized_folds(1024))  # sized before evaluating
        remove_unused_nodes(model)
        why = check_failure(model, strict=check_failure(backup, strict=True) is None, before=backup)
        if why:  # inlining exposed a latent non-conformance the If hid (ONNX's expanded AffineGrid)
            restore(model, backup)
            for node in constant:
                self.declined(node, f"constant-condition If kept: inlining it fails a check ({why})")
            return False
        left = {n.name for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "If"}
        for node in constant:
            if node.name in left:
                self.declined(node, "constant-condition If was not inlined by constant folding")
            else:
                self.rewrote(node, "If with a constant condition -> its branch, inlined")
        return bool(names - left)

    def _drop_layer_norm_outputs(self, model: ir.Model) -> bool:
        """Case 4: LayerNormalization's unused Mean/InvStdDev outputs are dropped."""
        changed = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or len(node.outputs) < 2:
                continue
            extra = [v for v in node.outputs[1:] if v is not None and v.name != ""]
            used = [v.name for v in extra if v.uses() or v.is_graph_output()]
            if used:
                self.declined(node, f"Mean/InvStdDev output {used[0]} is used: the node stays on the CPU")
                continue
            if not extra:
                continue
            graph = node.graph
            single = ir.Node(node.domain, node.op_type, list(node.inputs), attributes=list(node.attributes.values()),
                             num_outputs=1, name=node.name, version=node.version)
            old = node.outputs[0]
            name, old.name = old.name, f"{old.name}__replaced"
            single.outputs[0].name = name
            single.outputs[0].shape, single.outputs[0].type = old.shape, old.type
            graph.insert_before(node, single)
            old.replace_all_uses_with(single.outputs[0], replace_graph_outputs=True)
            graph.remove(node, safe=True)
            self.rewrote(single, "unused Mean/InvStdDev outputs dropped")
            changed = True
        return changed


def _counts(p: placement.Placement) -> str:
    parts = p.partitions
    return (f"{p.cpu_count} CPU nodes, {p.copy_count} copies, {parts['count']} DML partitions"
            + (" (whole graph compiled)" if parts["compiled"] else ""))

