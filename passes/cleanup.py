"""cleanup: onnxscript's optimizer (constant folding, dead nodes, identities), size-guarded.

Cases:
  1. Foldable subgraphs (Shape of static values, arithmetic on constants) become
     constants; dead nodes, Identity and no-op nodes go (onnxscript.optimizer).
  2. Folding may materialize large tensors (Expand, Tile, ConstantOfShape, Range on
     constants).  Peers have grown models 5-10x this way.  The result is measured: if
     the initializers grew by more than 1% (``MAX_GROWTH``), the fold is undone and
     retried with a smaller output limit, down to removing dead nodes only.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import optimizer

from dmlopt.model import initializer_bytes
from dmlopt.passes._base import DmlPass, remove_unused_nodes, restore

MAX_GROWTH = 0.01
# Largest folded tensor (elements) tried first, then smaller ones while the model grows.
OUTPUT_LIMITS = (1 << 20, 1 << 12, 64)


class CleanupPass(DmlPass):
    """Constant folding and dead-code removal that never grows the model by more than 1%."""

    name = "cleanup"
    summary = "fold constants, drop dead nodes and identities (onnxscript optimizer); never grows the model >1%"
    order = 0.0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        before_nodes = _count_nodes(model)
        before_bytes = initializer_bytes(model)
        budget = before_bytes * (1 + MAX_GROWTH) + 4096  # tiny models: allow a few scalars
        for limit in OUTPUT_LIMITS:
            backup = model.clone()
            optimizer.optimize_ir(model, num_iterations=2, output_size_limit=limit)
            after_bytes = initializer_bytes(model)
            if after_bytes <= budget:
                if limit != OUTPUT_LIMITS[0]:
                    self.note(f"constant folding limited to outputs of <= {limit} elements to keep the model within 1% of its size")
                break
            self.note(f"folding with outputs up to {limit} elements grew constants {before_bytes} -> {after_bytes} bytes: undone")
            restore(model, backup)
        else:
            remove_unused_nodes(model)
            self.note("constant folding skipped: every attempt grew the model by more than 1%")
        after_nodes = _count_nodes(model)
        modified = after_nodes != before_nodes or initializer_bytes(model) != before_bytes
        if modified:
            self.rewrote("<graph>", f"{before_nodes} -> {after_nodes} nodes")
        return ir.passes.PassResult(model, modified)


def _count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
