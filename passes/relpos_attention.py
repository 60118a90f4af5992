"""relpos-bias: fold a decomposed relative-position bias into MultiHeadAttention's Q and K.

Rewrite (``s`` = MHA's scale, ``E_r``/``E_c`` one-hot row/column indicators of the key grid):
  ``MultiHeadAttention(q, k, v, attention_bias=Reshape(Add(Rh, Rw)), scale=s)``
      -> ``MultiHeadAttention([q | Rh/s | Rw/s | 0], [k | E_r | E_c | 0], v, scale=s)``
  where the bias is SAM's decomposed relative position: ``Rh`` of shape (..., c, 1) and
  ``Rw`` of shape (..., 1, d) summed to (..., c, d) and reshaped to (B, N, S, T) with T = c*d
  (the keys a c x d grid, row-major).  For query i and key t = (r, w):
  ``s * (q_i.k_t + Rh[i, r]/s + Rw[i, w]/s) = s * q_i.k_t + Rh[i, r] + Rw[i, w]``,
  which is the biased score, so the (B, N, S, T) bias is never materialized and the CUDA EP
  can run its fused attention kernels (they take no bias of that size).  The appended width
  is zero-padded to a multiple of 8 (what the fused kernels need).

Option ``relpos_bias``: ``fold`` (the above), ``fold-pad-v`` (also pad V's head size with zeros
to the new Q/K head size and slice the output back: equal head sizes let ORT pick flash
attention), ``keep``; ``auto`` is ``fold`` for CUDA and ``keep`` for DirectML and CPU (not measured
there).

Declined with a reason: a bias that is not such a sum (any other bias), MHA with a key
padding mask, packed or past inputs, unidirectional (causal) attention, 3D q/k/v whose sizes
do not line up with the bias, symbolic shapes, a bias also read elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules, remove_unused_nodes
from dmlopt.passes._layout import ints, static_shape
from dmlopt.passes._shared import Decline

ALIGN = 8  # the fused kernels want head sizes that are multiples of 8
BIAS_INPUT = 5
FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


def _bias_terms(bias: ir.Value, batch: int, heads: int, seq_q: int, seq_kv: int):
    """(row term, column term, c, d, leading shape) of ``Reshape(Add(Rh, Rw), (B, N, S, T))``."""
    reshape = bias.producer()
    if reshape is None or reshape.op_type != "Reshape" or static_shape(bias) != [batch, heads, seq_q, seq_kv]:
        raise Decline("attention_bias is not a Reshape to (B, N, S, T) of a sum")
    add_out = reshape.inputs[0]
    add = add_out.producer()
    if add is None or add.op_type != "Add" or len(add_out.uses()) != 1 or add_out.is_graph_output():
        raise Decline("attention_bias is not the sum of a row term and a column term")
    full = static_shape(add_out)
    shapes = [static_shape(v) for v in add.inputs]
    if full is None or any(s is None for s in shapes) or len(full) < 3:
        raise Decline("bias terms have no static shape of rank >= 3")
    *lead, c, d = full
    if c * d != seq_kv or math.prod(lead) != batch * heads * seq_q:
        raise Decline(f"bias grid {full} does not factor as (B*N*S, rows, cols) with rows*cols = T={seq_kv}")
    for rows_i in (0, 1):
        row_shape, col_shape = shapes[rows_i], shapes[1 - rows_i]
        if _is_term(row_shape, full, keep=-2) and _is_term(col_shape, full, keep=-1):
            return add.inputs[rows_i], add.inputs[1 - rows_i], c, d, lead
    raise Decline(f"bias terms {shapes[0]} + {shapes[1]} are not a (..., rows, 1) and a (..., 1, cols) term")


def _is_term(shape: list[int], full: list[int], keep: int) -> bool:
    """A term that varies along one of the grid's two axes: 1 on the other; leading dims broadcast."""
    padded = [1] * (len(full) - len(shape)) + list(shape)
    if len(padded) != len(full):
        return False
    drop = -1 if keep == -2 else -2
    return padded[drop] == 1 and padded[keep] == full[keep] and all(
        p in (1, f) for p, f in zip(padded[:-2], full[:-2]))


class FoldRelPosBias(SiteRule):
    """``MultiHeadAttention(q, k, v, bias=Reshape(Add(Rh, Rw)))`` -> MHA of widened q and k, no bias."""

    def __init__(self, owner: RelPosBiasPass | None = None, pad_v: bool = False):
        super().__init__(owner, name="FoldRelPosBias")
        self.pad_v = pad_v
        self._plan: dict | None = None

    def pattern(self, op, q, k, v):
        return op.MultiHeadAttention(q, k, v, _allow_other_inputs=True, _domain="com.microsoft",
                                     _outputs=["out"])

    def check(self, context, q, k, v, out, **_):
        node = out.producer()
        try:
            self._plan = _plan(node, q, k, v)
        except Decline as e:
            return self.decline(node, str(e))
        if self._plan is None:
            return self.decline(None, "no attention_bias")  # not a site: nothing to log
        return pattern.MatchResult()

    def rewrite(self, op, q, k, v, out, **_):
        p = self._plan
        batch, heads, seq_q, seq_kv, head, head_v = (p[n] for n in ("B", "N", "S", "T", "H", "Hv"))
        c, d, pad, dtype = p["c"], p["d"], p["pad"], q.dtype
        wide = head + c + d + pad

        def grid(term, width, inner):  # a term as (B, N, S, width) after broadcasting its leading dims
            if static_shape(term) != p["lead"] + inner:
                term = op.Expand(term, ints(op, p["lead"] + inner))
            return op.Reshape(term, ints(op, [batch, heads, seq_q, width]))

        extra = op.Concat(grid(p["rows"], c, [c, 1]), grid(p["cols"], d, [1, d]), axis=3)
        extra = op.Mul(extra, op.Constant(value=ir.tensor(np.asarray(1.0 / p["scale"], dtype=dtype.numpy()))))
        if pad:
            extra = op.Pad(extra, ints(op, [0, 0, 0, 0, 0, 0, 0, pad]))
        extra = op.Transpose(extra, perm=[0, 2, 1, 3])  # (B, S, N, c+d+pad)
        q_wide = op.Concat(op.Reshape(q, ints(op, [batch, seq_q, heads, head])), extra, axis=3)
        q_wide = op.Reshape(q_wide, ints(op, [batch, seq_q, heads * wide]))
        keys = np.zeros((1, seq_kv, 1, c + d + pad), dtype=dtype.numpy())
        t = np.arange(seq_kv)
        keys[0, t, 0, t // d] = 1  # key t sits in row t // d and column t % d of the grid
        keys[0, t, 0, c + t % d] = 1
        indicators = op.Expand(op.Constant(value=ir.tensor(keys)), ints(op, [batch, seq_kv, heads, c + d + pad]))
        k_wide = op.Concat(op.Reshape(k, ints(op, [batch, seq_kv, heads, head])), indicators, axis=3)
        k_wide = op.Reshape(k_wide, ints(op, [batch, seq_kv, heads * wide]))
        for value, seq in ((q_wide, seq_q), (k_wide, seq_kv)):
            value.dtype, value.shape = dtype, ir.Shape([batch, seq, heads * wide])
        v_in = v
        if self.pad_v:
            v_in = op.Pad(op.Reshape(v, ints(op, [batch, seq_kv, heads, head_v])),
                          ints(op, [0, 0, 0, 0, 0, 0, 0, wide - head_v]))
            v_in = op.Reshape(v_in, ints(op, [batch, seq_kv, heads * wide]))
        attrs = {"num_heads": heads, "scale": float(p["scale"])}
        if p["mask_filter_value"] is not None:
            attrs["mask_filter_value"] = p["mask_filter_value"]
        fused = op.MultiHeadAttention(q_wide, k_wide, v_in, _domain="com.microsoft", **attrs)
        fused.dtype = dtype
        fused.shape = ir.Shape([batch, seq_q, heads * (wide if self.pad_v else head_v)])
        self.accepted(out.producer(), f"rel-pos bias folded into Q/K: head size {head} -> {wide} "
                                      f"(grid {c}x{d}" + (f", +{pad} zero" if pad else "") + ")"
                                      + (f"; V padded {head_v} -> {wide}" if self.pad_v else ""))
        if not self.pad_v:
            return fused
        fused = op.Reshape(fused, ints(op, [batch, seq_q, heads, wide]))
        fused = op.Slice(fused, ints(op, [0]), ints(op, [head_v]), ints(op, [3]))
        fused = op.Reshape(fused, ints(op, [batch, seq_q, heads * head_v]))
        fused.dtype, fused.shape = dtype, ir.Shape([batch, seq_q, heads * head_v])
        return fused


def _plan(node: ir.Node, q: ir.Value, k: ir.Value, v: ir.Value) -> dict | None:
    """Check one MultiHeadAttention; the sizes the rewrite needs, or raise Decline.

    None when it is not a site: no attention_bias (e.g. an MHA this pass made), a plain value
    rather than a second exception, since nothing is declined.
    """
    inputs = list(node.inputs)
    if len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
        raise Decline("present key/value outputs are read")
    if len(inputs) <= BIAS_INPUT or inputs[BIAS_INPUT] is None:
        return None
    if any(x is not None for i, x in enumerate(inputs) if i not in (0, 1, 2, BIAS_INPUT)):
        raise Decline("MHA has a bias, key padding mask or past inputs besides attention_bias")
    if node.attributes.get_int("unidirectional", 0):
        raise Decline("unidirectional (causal) attention")
    bias = inputs[BIAS_INPUT]
    if len(bias.uses()) != 1 or bias.is_graph_output():
        raise Decline("attention_bias is also read elsewhere (it would stay materialized)")
    shapes = [static_shape(x) for x in (q, k, v)]
    if any(s is None or len(s) != 3 for s in shapes):
        raise Decline("q, k, v are not static 3D (B, S, N*H) tensors")
    if q.dtype not in FLOAT_TYPES or k.dtype != q.dtype or v.dtype != q.dtype or bias.dtype != q.dtype:
        raise Decline("q, k, v and the bias are not all float or all float16")
    heads = node.attributes.get_int("num_heads", 0)
    (batch, seq_q, hidden), (kb, seq_kv, k_hidden), (vb, vt, v_hidden) = shapes
    if heads < 1 or hidden % heads or v_hidden % heads or k_hidden != hidden or kb != batch or vb != batch \
            or vt != seq_kv:
        raise Decline("q, k, v sizes do not line up with num_heads")
    head = hidden // heads
    scale = node.attributes.get_float("scale", 0.0) or 1.0 / math.sqrt(head)  # MHA's default: 1/sqrt(H)
    rows, cols, c, d, lead = _bias_terms(bias, batch, heads, seq_q, seq_kv)
    pad = -(head + c + d) % ALIGN
    mask_filter = node.attributes.get("mask_filter_value")
    return {"B": batch, "N": heads, "S": seq_q, "T": seq_kv, "H": head, "Hv": v_hidden // heads, "c": c, "d": d,
            "pad": pad, "lead": list(lead), "rows": rows, "cols": cols, "scale": scale,
            "mask_filter_value": None if mask_filter is None else mask_filter.as_float()}


class RelPosBiasPass(DmlPass):
    """Fold decomposed relative-position biases of MultiHeadAttention into its Q and K."""

    name = "relpos-bias"
    summary = "fold SAM's decomposed rel-pos bias into MultiHeadAttention's Q/K (no (B,N,S,T) bias)"
    order = 63.0  # after attention (60) and window-layout (62), which make and move the MHA nodes
    options = (
        Option("relpos_bias", "auto", "fold MultiHeadAttention's decomposed rel-pos bias into Q/K "
               "(fold-pad-v: also pad V for flash attention), or keep the bias",
               choices=("auto", "fold", "fold-pad-v", "keep"), tunable=True,
               auto_default={"cuda": "fold", "dml": "keep", "cpu": "keep"}),
    )

    needs_names = "sites"
    needs_shapes = "onnx"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        if self.resolved_option("relpos_bias") == "keep":
            return []
        return [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
                if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft"]

    def rewrite(self, model: ir.Model) -> bool:
        choice = self.resolved_option("relpos_bias")
        count = apply_rules(model, [FoldRelPosBias.rule(self, pad_v=choice == "fold-pad-v")])
        if count:
            remove_unused_nodes(model)
        return count > 0
