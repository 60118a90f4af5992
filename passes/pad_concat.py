"""pad-concat: constant-mode Pad -> Concat with filled blocks, for providers whose Pad kernel is slow.

ONNX Runtime's CUDA Pad kernel computes every output element's source index; on a large
activation (SAM's window partition, a [1, 64, 64, 768] tensor padded to 70x70) it runs far
below memory bandwidth, while Concat is a plain copy.  Padding with a value is concatenation
with blocks filled with that value, one axis after the other:
  1. Pad(x, pads; mode=constant, value=v) -> Concat(Expand(v, before_a), ..., x, ..., Expand(v, after_a); axis=a)
     for each padded axis a, in axis order (each block's shape uses the sizes padded so far).

Declined, with the reason: another mode (reflect, edge, wrap), pads or value that are not
constants, negative pads (a crop), an `axes` input, and an input whose shape is not static.
Default: concat for --target cuda (measured: benchmarks/sam_gpu.py), keep for dml and cpu.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules
from dmlopt.passes._shared import all_nodes


class PadToConcat(SiteRule):
    """``Pad(x, pads, value) -> Concat(filled, x, filled)`` per padded axis."""

    def pattern(self, op, x, pads):
        return op.Pad(x, pads, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["y"])

    def check(self, context, x, pads, y, **_):
        node = y.producer()
        reason = _reason(node, x, pads)
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, pads, y, **_):
        node = y.producer()
        shape = [int(d) for d in x.shape.dims]
        rank = len(shape)
        p = pads.const_value.numpy().astype(np.int64).reshape(-1)
        value = _fill_value(node)
        fill = op.Constant(value=ir.tensor(np.array(value, dtype=x.dtype.numpy())))
        out = x
        padded_axes = []
        for axis in range(rank):
            before, after = int(p[axis]), int(p[axis + rank])
            if before == 0 and after == 0:
                continue
            parts = []
            for size in (before, after):
                block = list(shape)
                block[axis] = size
                parts.append(op.Expand(fill, op.Constant(value=ir.tensor(np.array(block, dtype=np.int64))))
                             if size else None)
            out = op.Concat(*[t for t in (parts[0], out, parts[1]) if t is not None], axis=axis)
            shape[axis] += before + after
            padded_axes.append(axis)
        self.accepted(node, f"Concat on axes {padded_axes} with blocks of {value!r}", axes=padded_axes)
        return out


def _fill_value(node: ir.Node):
    """The pad value (an absent or empty value input pads with 0)."""
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is None:
        return 0
    return value.const_value.numpy().reshape(-1)[0].item() if value.const_value.numpy().size else 0


def _reason(node: ir.Node, x: ir.Value, pads: ir.Value) -> str | None:
    mode = node.attributes.get("mode")
    mode = mode.as_string() if mode is not None else "constant"
    if mode != "constant":
        return f"mode={mode}: only constant padding is a concatenation"
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return "an axes input (not handled: pads over all axes only)"
    if x.shape is None or not all(isinstance(d, int) for d in x.shape.dims) or x.dtype is None:
        return "the input's shape is not static (the filled blocks need their sizes)"
    if pads.const_value is None:
        return "pads are computed, not a constant"
    p = pads.const_value.numpy().reshape(-1)
    if p.size != 2 * len(x.shape.dims):
        return f"{p.size} pads for a rank-{len(x.shape.dims)} input"
    if (p < 0).any():
        return "negative pads crop: not a concatenation"
    if not p.any():
        return "no padding"
    value = node.inputs[2] if len(node.inputs) > 2 else None
    if value is not None and value.const_value is None:
        return "the pad value is computed, not a constant"
    if value is not None and value.const_value.numpy().size > 1:
        return "the pad value is not a scalar"
    return None


class PadConcatPass(DmlPass):
    """Constant-mode Pad -> Concat with filled blocks, where the target's Pad kernel is slow."""

    name = "pad-concat"
    summary = "constant Pad -> Concat with filled blocks (ORT's CUDA Pad kernel is slow on large tensors)"
    order = 64.0  # after window-layout (62) and relpos-bias (63), which leave the partition Pads
    options = (
        Option("pad_concat", "auto", "rewrite constant-mode Pads as Concats (concat), leave them (keep), or auto "
               "(concat for cuda, keep for dml and cpu)", choices=("auto", "concat", "keep"),
               auto_default={"dml": "keep", "cuda": "concat", "cpu": "keep"},
               auto_default_source={"cuda": "SAM ViT-B 1024 float16 profile on an H200: each partition Pad "
                                            "took ~0.38 ms (benchmarks/sam_gpu.py)"}),
    )

    needs_names = "sites"
    needs_shapes = "onnx"  # the filled blocks need x's static shape

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        if self.resolved_option("pad_concat") == "keep":
            return []
        return [n for n in all_nodes(model) if n.op_type == "Pad" and n.domain in ("", "ai.onnx")]

    def shapes_missing(self, sites) -> bool:
        return any(n.inputs[0] is None or n.inputs[0].shape is None for n in sites)

    def rewrite(self, model: ir.Model) -> bool:
        return apply_rules(model, [PadToConcat.rule(self)]) > 0
