"""cleanup: onnxscript's optimizer (constant folding, dead nodes, identities), size-guarded.

Cases:
  1. Foldable subgraphs (Shape of static values, arithmetic on constants) become
     constants; dead nodes, Identity and no-op nodes go (onnxscript.optimizer's passes).
  2. Folding may materialize large tensors (Expand, Tile, ConstantOfShape, Range on
     constants).  Other optimizers have grown models several-fold this way.  Each fold is sized from the true
     shapes of its inputs before anything is evaluated (``fold_refusal``): a result over the
     output limit stays an op, so a 300-byte Expand to [30000, 30000] allocates nothing.
     The result is then measured: if the initializers grew by more than 1% (``MAX_GROWTH``),
     the fold is undone and retried with a smaller output limit, down to dead nodes only.
  3. The model's interface stays as it is: the passes are those of
     ``onnxscript.optimizer.optimize_ir`` less its OutputFixPass, which renames a graph
     input that is also a graph output (``m`` -> ``m_orig``) and so changes what a caller feeds.
  4. Model-local functions are inlined only when they expand to a bounded number of nodes
     (``dmlopt.graph.shape_inference.check_function_expansion``); otherwise the model is refused.
  5. onnxscript's multi-output rule (Slices -> Split) lists the whole graph for every node it
     is tried on; it is tried only on Slice nodes, and only in graphs with at most
     ``MAX_SLICES_FOR_SPLIT`` Slices (freeze-shapes merges tiling Slices in one walk anyway).
  6. A rule's new initializer gets a name of its own when the name is taken by an initializer
     that something outside the match still reads.  onnxscript's rules name them after an input
     (Flatten2Reshape: ``{x}/shape``), and its RewritePass then replaces the registered one, so
     two Flattens of one tensor (DETR's encoder and decoder, legacy export) left the first Reshape
     reading an unregistered value: an invalid model.
  7. onnxscript's rules write the forms of the newest opset (Unsqueeze with an axes input, from
     opset 13): a rule's replacement that the model's opset does not have is not written
     (passes/_opset.py), and the site is logged as declined with the reason.
  8. A failure inside onnxscript or onnx_ir is no traceback: a node the constant folding fails on
     stays unfolded (logged "kept" with the error); any other failure of the optimizer leaves the
     model as it was, with the error in the pass's notes.
  9. A fold may expose a latent non-conformance of the input: inlining a constant-condition If of
     ONNX's own expanded AffineGrid feeds a [1]-shaped tensor to Range, which onnx's check rejects.
     A result that fails the check the input passed is undone and folded again keeping every If;
     if that fails too, the model is left as it was (notes say why).
"""

from __future__ import annotations

from typing import Callable

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript import rewriter
from onnxscript.rewriter.rules import common as common_rules
from onnxscript.optimizer import _constant_folding as constant_folding

from dmlopt.io.model import initializer_bytes
from dmlopt.passes._base import DmlPass, OpsetGate, remove_unused_nodes, restore
from dmlopt.passes._folding import SkippingFailedFolds, check_failure, first_cause
from dmlopt.passes._shared import DeduplicateInitializers
from dmlopt.graph.shape_inference import check_function_expansion, fold_refusal

MAX_GROWTH = 0.01
# Largest folded tensor (elements) tried first, then smaller ones while the model grows.
OUTPUT_LIMITS = (1 << 20, 1 << 12, 64)
MAX_SLICES_FOR_SPLIT = 256


class CleanupPass(DmlPass):
    """Constant folding and dead-code removal that never grows the model by more than 1%."""

    name = "cleanup"
    summary = "fold constants, drop dead nodes and identities (onnxscript optimizer); never grows the model >1%"
    order = 0.0

    def rewrite(self, model: ir.Model) -> bool:
        """Its own undo-if-worse: each folding limit in turn, undone while it grows the model; a
        result that fails onnx's check where the input passed it is folded again keeping If (case 9)."""
        before_nodes = _count_nodes(model)
        before_bytes = initializer_bytes(model)
        if model.functions:
            check_function_expansion(model)
        original = model.clone()
        strict = check_failure(model, strict=True) is None
        if not self._fold(model, before_bytes):
            return False
        why = check_failure(model, strict, before=original)
        if why:
            restore(model, original.clone())
            self.note(f"folding undone: its result fails a check ({why}); folded again keeping every If and "
                      "what computes its condition")
            if not self._fold(model, before_bytes, keep_ops=frozenset({"If"})) \
                    or (why := check_failure(model, strict, before=original)):
                restore(model, original)
                self.note(f"constant folding skipped: its result fails a check ({why})")
                return False
        after_nodes = _count_nodes(model)
        modified = after_nodes != before_nodes or initializer_bytes(model) != before_bytes
        if modified:
            self.rewrote("<graph>", f"{before_nodes} -> {after_nodes} nodes")
        return modified

    def _fold(self, model: ir.Model, before_bytes: int, keep_ops: frozenset[str] = frozenset()) -> bool:
        """The optimizer at each output limit until the model stays within 1% (else dead nodes only);
        False, the model as it was, when a dependency failed (case 8)."""
        budget = before_bytes * (1 + MAX_GROWTH) + 4096  # tiny models: allow a few scalars
        for limit in OUTPUT_LIMITS:
            backup = model.clone()
            try:
                optimizer_passes(limit, self._size_guard(limit), owner=self, keep_ops=keep_ops)(model)
            except Exception as e:  # noqa: BLE001 - a dependency's failure skips the folding (case 8)
                restore(model, backup)
                self.note(f"constant folding skipped: onnxscript's optimizer failed ({first_cause(e)})")
                return False
            after_bytes = initializer_bytes(model)
            if after_bytes <= budget:
                if limit != OUTPUT_LIMITS[0]:
                    self.note(f"constant folding limited to outputs of <= {limit} elements to keep the model within 1% of its size")
                return True
            self.note(f"folding with outputs up to {limit} elements grew constants {before_bytes} -> {after_bytes} bytes: undone")
            restore(model, backup)
        common_passes.InlinePass()(model)
        remove_unused_nodes(model)
        self.note("constant folding skipped: every attempt grew the model by more than 1%")
        return True

    def _size_guard(self, limit: int) -> Callable[[ir.Node], bool | None]:
        """onnxscript's `should_fold`: False for a node whose result would be too big, else its own rules."""
        def should_fold(node: ir.Node) -> bool | None:
            reason = fold_refusal(node, limit)
            if reason is None:
                return None
            if limit == OUTPUT_LIMITS[0]:
                self.kept(node, f"not folded: {reason}")
            return False
        return should_fold


def optimizer_passes(output_limit: int, should_fold: Callable[[ir.Node], bool | None],
                     owner: DmlPass | None = None, keep_ops: frozenset[str] = frozenset()) -> ir.passes.Sequential:
    """``onnxscript.optimizer.optimize_ir``'s passes (2 iterations), without OutputFixPass (case 3);
    a rule's replacement the model's opset does not have is declined in `owner`'s log (case 7)."""
    folding = ir.passes.PassManager([
        SkippingFailedFolds(owner, keep_ops, shape_inference=True,
                                           input_size_limit=constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                                           output_size_limit=output_limit, should_fold=should_fold),
        rewriter.RewritePass([OpsetGate(rule, owner) for rule in default_rules()]),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.RemoveUnusedFunctionsPass(),
        common_passes.RemoveUnusedOpsetsPass(),
    ], steps=2, early_stop=True)
    return ir.passes.Sequential(
        common_passes.InlinePass(), folding, common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(), DeduplicateInitializers(),
        common_passes.CommonSubexpressionEliminationPass(), common_passes.NameFixPass())


def optimizer_rules() -> list:
    """The rules ``onnxscript.optimizer.optimize_ir`` applies, in its order, from onnxscript's public
    rule modules (its own list is private; passes/cleanup_test.py checks the two agree)."""
    r = common_rules
    return [
        *r.mul_by_1_rule.commute(), *r.add_0_rule.commute(), r.sub_0_rule, r.div_by_1_rule,
        r.dropout_zero_rule, r.dropout_inference_rule,
        r.two_reshapes_matmul_reshape_rule, r.one_reshape_matmul_reshape_rule,
        r.cast_constant_of_shape_rule, r.cast_constant_of_shape_without_value_rule,
        r.collapse_slice_rule, r.collapse_slice2_rule, r.materialize_reshape_shape_rule,
        r.min_min_rule, r.max_max_rule, r.min_max_rule, r.max_min_rule,
        r.successive_clip_relu_rule, r.successive_relu_clip_rule, r.successive_relu_rule, r.successive_clip_rule,
        r.cast_cast_rule, r.no_op_cast_rule, r.no_op_expand_rule, r.flatten_to_reshape_rule, r.reshape_reshape_rule,
        r.slice_split_rule, r.no_op_transpose_rule, r.transpose_transpose_rule, r.unsqueeze_unsqueeze_rule,
        r.squeeze_reshape_1d_rule, r.no_op_dynamic_scatter_nd_rule, r.no_op_static_scatter_nd_rule,
        r.normalize_pad_format_conv_rule, r.normalize_pad_format_conv_integer_rule,
        r.fuse_pad_into_conv_rule, r.fuse_pad_into_conv_integer_rule,
        r.fuse_batchnorm_into_conv_rule, r.fuse_batchnorm_into_conv_transpose_rule, r.fuse_batchnorm_into_gemm_rule,
        r.remove_optional_bias_from_conv_rule, r.remove_optional_bias_from_conv_transpose_rule,
        r.remove_optional_bias_from_qlinear_conv_rule, r.remove_optional_bias_from_gemm_rule,
    ]


def default_rules() -> list:
    """The rules optimize_ir applies, multi-output ones gated to their first op (case 5)."""
    rules = []
    for rule in optimizer_rules():
        pattern_ir = getattr(rule, "_target_pattern", None)
        if pattern_ir is not None and not pattern_ir.has_single_output_node:
            rule = _FirstOpGate(rule, pattern_ir.output_nodes[0].op_identifier())
        rules.append(_OwnInitializerNames(rule))
    return rules


class _OwnInitializerNames:
    """A rewrite rule whose new initializers never take the name of one still read outside the match
    (case 6): such an initializer is renamed `name_1`, `name_2`, ... before RewritePass registers it."""

    def __init__(self, rule):
        self._rule = rule

    def __getattr__(self, name):
        return getattr(self._rule, name)

    def commute(self):
        return [_OwnInitializerNames(r) for r in self._rule.commute()]

    def try_rewrite(self, model, graph_or_function, node, **kw):
        delta = self._rule.try_rewrite(model, graph_or_function, node, **kw)
        if delta is None or not delta.new_initializers or not isinstance(graph_or_function, ir.Graph):
            return delta
        registered = graph_or_function.initializers
        matched = set(delta.match.nodes)
        for value in delta.new_initializers:
            taken = registered.get(value.name)
            if taken is None or taken is value or not _read_outside(taken, matched):
                continue
            base, count = value.name, 1
            while f"{base}_{count}" in registered:
                count += 1
            value.name = f"{base}_{count}"
        return delta


def _read_outside(value: ir.Value, nodes: set) -> bool:
    """Whether `value` is a graph input or output, or a node other than `nodes` reads it."""
    return value.is_graph_input() or value.is_graph_output() or any(user not in nodes for user, _ in value.uses())


class _FirstOpGate:
    """A multi-output rewrite rule tried only on nodes of its first output op, in graphs with
    few of them: onnxscript's matcher lists every graph node for each node it is tried on."""

    def __init__(self, rule, op: tuple):
        self._rule, self._op = rule, op
        self._counted: dict[int, int] = {}

    def __getattr__(self, name):
        return getattr(self._rule, name)

    def commute(self):
        return [_FirstOpGate(r, self._op) for r in self._rule.commute()]

    def graph_pre_visitor(self):
        """Called before each graph is rewritten: its nodes are counted again."""
        self._counted.clear()
        if self._rule.graph_pre_visitor:
            self._rule.graph_pre_visitor()

    def try_rewrite(self, model, graph_or_function, node, **kw):
        if node.op_identifier() != self._op:
            return None
        key = id(graph_or_function)
        if key not in self._counted:
            self._counted[key] = sum(1 for n in graph_or_function if n.op_identifier() == self._op)
        if self._counted[key] > MAX_SLICES_FOR_SPLIT:
            return None
        return self._rule.try_rewrite(model, graph_or_function, node, **kw)


def _count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
