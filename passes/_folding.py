"""onnxscript's constant folding for every pass that folds, a node it fails on left unfolded.

Why: a failure inside a dependency is no traceback for the user.  onnxscript 0.7's folder raised
on SplitToSequence with a scalar `split` (its evaluator reads the split as a 1-D array) and ended
the whole pass with onnx_ir's PassError; here that node stays as it is, logged as kept with the error.
A fold may also expose a latent non-conformance of the input (`check_failure` tells): the folding
passes then fold again keeping If and what computes its condition (`keep_ops`).  ONNX Runtime's own
optimizer inlines an If whose condition is constant and infers again: a [1]-shaped constant that the If
hid from Range (ONNX's expanded AffineGrid) then makes ORT refuse a model that onnx's checker passes,
so a folded model with a constant-condition If is also loaded in ORT.
"""

from __future__ import annotations

from typing import Callable

import onnx_ir as ir
from onnxscript.optimizer import _constant_folding as constant_folding

from dmlopt.runtime import sessions as runtime
from dmlopt.graph.check import PassBroke, check_model
from dmlopt.passes._base import DmlPass, initializers_as_inputs_before_ir4


class SkippingFailedFolds(constant_folding.FoldConstantsPass):
    """onnxscript's constant folding, a node it fails on left unfolded (case 8): SplitToSequence with
    a scalar `split` raised from inside its evaluator and ended the run with onnx_ir's PassError."""

    def __init__(self, owner: DmlPass | None, keep_ops: frozenset[str] = frozenset(), **kw):
        """`keep_ops`: ONNX op types left as they are; with If, the nodes that compute an If's
        condition stay too (a constant condition is what ORT's optimizer inlines)."""
        super().__init__(**kw)
        self.owner = owner
        self.keep_ops = keep_ops
        self._condition_cone: set[int] = set()

    def call(self, model: ir.Model):
        self._condition_cone = if_condition_cone(model) if "If" in self.keep_ops else set()
        return super().call(model)

    def process_node(self, node: ir.Node, is_function: bool):
        if (node.op_type in self.keep_ops and node.domain in ("", "ai.onnx")) or id(node) in self._condition_cone:
            return None
        try:
            return super().process_node(node, is_function)
        except Exception as e:  # noqa: BLE001 - the dependency's bug on one node: that node stays as it is
            if self.owner is not None:
                self.owner.kept(node, f"not folded: onnxscript's constant folding failed on it ({first_cause(e)})")
            return None


def first_cause(error: BaseException) -> str:
    """The innermost cause of a dependency's error, on one line (onnx_ir wraps it in PassErrors)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}".rstrip(": ")




def fold_constants(model: ir.Model, owner: DmlPass | None, *, keep_ops: frozenset[str] = frozenset(),
                   onnx_shape_inference: bool = False,
                   input_size_limit: int = constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                   output_size_limit: int = constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                   should_fold: Callable[[ir.Node], bool | None] = lambda node: None):
    """``onnxscript.optimizer.fold_constants`` with `SkippingFailedFolds`."""
    return SkippingFailedFolds(owner, keep_ops, shape_inference=onnx_shape_inference, input_size_limit=input_size_limit,
                               output_size_limit=output_size_limit, should_fold=should_fold)(model)


def if_condition_cone(model: ir.Model) -> set[int]:
    """id() of every node an If's condition is computed from, in every graph."""
    cone: set[int] = set()
    stack = [n.inputs[0] for n in ir.traversal.RecursiveGraphIterator(model.graph)
             if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.inputs and n.inputs[0] is not None]
    while stack:
        producer = stack.pop().producer()
        if producer is not None and id(producer) not in cone:
            cone.add(id(producer))
            stack.extend(v for v in producer.inputs if v is not None)
    return cone


def has_constant_if(model: ir.Model) -> bool:
    return any(n.op_type == "If" and n.domain in ("", "ai.onnx") and n.inputs and n.inputs[0] is not None
               and ir.convenience.get_const_tensor(n.inputs[0]) is not None
               for n in ir.traversal.RecursiveGraphIterator(model.graph))


def check_failure(model: ir.Model, strict: bool, before: ir.Model | None = None) -> str | None:
    """onnx's checker and shape inference (`strict`: errors fatal) on the model, as the engine checks it;
    with `before` (the model before the fold), a constant-condition If also loads in ONNX Runtime
    wherever `before` did."""
    initializers_as_inputs_before_ir4(model)  # what DmlPass.call does after the pass, first
    try:
        check_model(model, "folding", strict=strict)
    except PassBroke as e:
        return str(e).split("invalid model: ", 1)[-1][:200]
    if before is not None and has_constant_if(model):
        why = runtime.load_problem(model, level="basic")
        if why and runtime.load_problem(before, level="basic") is None:
            return f"ONNX Runtime refuses it once its optimizer inlines an If with a constant condition: {why[:200]}"
    return None
