"""gemm-weights: a Gemm that reads its constant B transposed -> the same Gemm on B stored transposed, once.

torch.onnx writes a 2-D ``nn.Linear`` as ``Gemm(x, W, b; transB=1)`` with W as the layer keeps it,
(out, in).  The WebGPU EP's Gemm reads a transposed B at less than half the speed of B as stored
(the MLP of SAM ViT-B, 4096 x 768 -> 3072 -> 768 on an H100: 7.47 against 3.30 ms in float32, 4.13
against 2.13 ms in float16; DirectML 4.80 against 4.43 ms: benchmarks/where_time_goes.py, figures in
benchmarks/README.md).  Transposing the constant once makes the same product:
  1. Gemm(A, W, C; transB=1) -> Gemm(A, W^T, C)          W a 2-D constant (initializer or Constant node)

Numerics: the same products and sums; a kernel may sum in another order, so equal within float
rounding.  Declined, with the reason: a B that is computed or a graph input (an overridable
initializer), a B that other nodes read too (transposing it would store the weight twice).
Default: as-stored for webgpu and dml (measured), keep for cpu and cuda (not measured there; the
CPU EP packs B at session creation either way).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules, remove_unused_nodes
from dmlopt.passes._shared import all_nodes


class GemmWeightAsStored(SiteRule):
    """``Gemm(A, W, C; transB=1) -> Gemm(A, W^T, C)`` for a constant W read by this Gemm alone."""

    def pattern(self, op, a, w):
        return op.Gemm(a, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, a, w, y, **_):
        node = y.producer()
        trans_b = node.attributes.get("transB")
        if trans_b is None or trans_b.as_int() == 0:  # not a site (e.g. the Gemm this rule wrote)
            return self.decline(None, "B is read as stored already (transB=0)")
        reason = _reason(node, w)
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, a, w, y, **_):
        node = y.producer()
        stored = np.ascontiguousarray(w.const_value.numpy().T)
        name = self.owner.fresh(f"{w.name or 'gemm_b'}_as_stored") if self.owner is not None else None
        inputs = [a, op.initializer(ir.tensor(stored, name=name), name=name)] + list(node.inputs[2:])
        attributes = {k: v for k, v in node.attributes.items() if k != "transB"}
        self.accepted(node, f"B {list(w.shape.dims) if w.shape else list(stored.T.shape)} stored transposed "
                            f"({list(stored.shape)}), transB=0")
        return op.Gemm(*inputs, **{k: v.value for k, v in attributes.items()})


def _reason(node: ir.Node, w: ir.Value) -> str | None:
    if w.const_value is None:
        return "B is computed, not a constant"
    if w.is_graph_input():
        return "B is a graph input (an initializer a caller may override): its transpose would not follow"
    if len(w.uses()) > 1:
        return f"B is read by {len(w.uses())} nodes: transposing it for one would store the weight twice"
    return None


class GemmWeightsPass(DmlPass):
    """Gemm with a constant B read transposed (transB=1) -> B stored transposed, transB=0."""

    name = "gemm-weights"
    summary = "Gemm(A, W; transB=1) with W constant -> Gemm(A, W^T): WebGPU's Gemm reads a transposed B 2.3x slower"
    order = 66.0  # after linear-gemm (65), which writes Gemms with B as stored
    options = (
        Option("gemm_weights", "auto", "store a Gemm's constant B transposed where it is read transposed (as-stored), "
               "leave it (keep), or auto (as-stored for webgpu and dml, keep for cpu and cuda)",
               choices=("auto", "as-stored", "keep"),
               auto_default={"webgpu": "as-stored", "dml": "as-stored", "cpu": "keep", "cuda": "keep"},
               auto_default_source={
                   "webgpu": "H100, ORT 1.30.0 + plug-in 0.4.0: Gemm with transB=1 x0.44 (float32), x0.52 (float16) "
                             "on SAM ViT-B's MLP (benchmarks/where_time_goes.py)",
                   "dml": "H100, DirectML 1.15.4 under vkd3d: transB=1 x0.94 on the same MLP"}),
    )

    needs_names = "sites"
    needs_fresh_names = True

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        if self.resolved_option("gemm_weights") == "keep":
            return []
        return [n for n in all_nodes(model) if n.op_type == "Gemm" and n.domain in ("", "ai.onnx")
                and (attr := n.attributes.get("transB")) is not None and attr.as_int() == 1]

    def rewrite(self, model: ir.Model) -> bool:
        if apply_rules(model, [GemmWeightAsStored.rule(self)]) == 0:
            return False
        remove_unused_nodes(model)  # the weights as they were, now read by nothing
        return True
