"""conv-transpose: ConvTranspose -> a forward Conv + DepthToSpace (sub-pixel convolution).

The public DirectML report saw the CNN's last layer, a stride-2 ConvTranspose, run without a
metacommand while forward Convs had one.  A stride-s ConvTranspose is s*s interleaved forward
convolutions over the input (one per output phase), i.e. one Conv with s*s*C_out channels whose
outputs DepthToSpace puts in place.  Per spatial axis: kernel k, stride s, pads (b, e),
output_padding p; W is [C_in, C_out/g, kh, kw], groups g.

  1. ConvTranspose(x; W, B) -> Slice(DepthToSpace(Conv(x; K, B'), s, CRD))     stride s > 1
  2. ConvTranspose(x; W, B) -> Slice(Conv(x; K, B))                             stride 1
  3. A(ConvTranspose(x; W, B)) -> Slice(DepthToSpace(A(Conv(x; K, B'))))        A an elementwise
     activation (Relu, LeakyRelu, ...): it commutes with DepthToSpace and Slice, and right after
     the Conv DirectML fuses it
  4. Strides (sh, sw) that differ: as 1 with sh*sw phases, which Reshape([N, C, sh, sw, Qh, Qw]),
     Transpose and Reshape([N, C, Qh*sh, Qw*sw]) interleave in place of DepthToSpace (one block
     size); the input's height and width must be static (the Reshapes' shapes).
  The Slice is left out when there is nothing to crop.

Derivation: with U = q*s + r a full (uncropped) output position, U = i*s + t for input i and tap t,
so t = m*s + r and  y[q*s + r] = sum_m x[q - m] * W[m*s + r],  m < M = ceil(k/s): for phase r a
correlation with the M taps K_r[M-1-m] = W[m*s + r] (zero past k).  CRD numbers the Conv's channels
o*s*s + rh*s + rw, which keeps each group's channels together, so groups carry over.  The Conv
starts at phase row q0 = min(b // s, M-1) with pads (M-1-q0, max(0, ceil((k-e+p)/s) - 1)); the
Slice then drops b - q0*s leading and s*(pad_end+1) - k + e - p trailing rows.  Both crops are
independent of the input size, so dynamic spatial dims work.  (Moving the crop into the kernel
would need ceil((k + b mod s)/s) taps, 2.25x the MACs for k4 s2 p1: more than the copy.)

Cost: s*s*M*M taps against k*k, equal when s divides k (k4 s2), 16/9 for k3 s2 (zero taps).

Declined with the reason: non-constant weight or bias, not 2-D, dilations other than 1, strides
that differ between the axes where the input's height or width is not static, auto_pad SAME_* or an
output_shape attribute (the pads they imply have differed between ONNX Runtime and the spec),
negative pads, opset < 11 (no DepthToSpace mode).

Option ``--conv-transpose keep|subpixel|auto``; ``auto`` is timed by ``dmlopt.engine.tune`` on the
target.  Without the target it means:
  - dml: ``subpixel``: the report's layer ran without a metacommand; a forward Conv gets one.
  - cuda: ``subpixel``: measured faster on an H200 (benchmarks/cnn.py; figures in benchmarks/README.md).
  - cpu: ``keep``: no clear gain measured on a shared 2-core machine (benchmarks/cnn.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules
from dmlopt.passes._shared import (FLOAT_TYPES, all_nodes, drop_orphaned_initializers, regroup,
                                   unused_initializers)

# Elementwise activations DirectML fuses into a Conv (dml-facts.md section 4), ONNX domain.
FUSABLE_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Elu", "Selu", "Softplus",
                       "Softsign", "ThresholdedRelu")
INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass(frozen=True)
class AxisPlan:
    """How one spatial axis of a ConvTranspose maps onto the Conv and the crop."""

    taps: int  # M = ceil(k / s)
    pad_begin: int
    pad_end: int
    crop_begin: int
    crop_end: int  # rows dropped at the end


def plan_axis(kernel: int, stride: int, begin: int, end: int, output_padding: int) -> AxisPlan:
    taps = -(-kernel // stride)
    q0 = min(begin // stride, taps - 1)
    pad_end = max(0, -(-(kernel - end + output_padding) // stride) - 1)
    crop_end = stride * (pad_end + 1) - kernel + end - output_padding
    return AxisPlan(taps, taps - 1 - q0, pad_end, begin - q0 * stride, crop_end)


def subpixel_weight(w: np.ndarray, stride, groups: int) -> np.ndarray:
    """[C_in, C_out/g, kh, kw] ConvTranspose weight -> [C_out*sh*sw, C_in/g, Mh, Mw] Conv weight (CRD);
    `stride`: one for both axes, or (sh, sw)."""
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    rows = regroup(w, groups)  # [C_out, C_in/g, kh, kw]: one row per output channel
    c_out, c_in_g, kh, kw = rows.shape
    mh, mw = -(-kh // sh), -(-kw // sw)
    padded = np.zeros((c_out, c_in_g, mh * sh, mw * sw), dtype=w.dtype)
    padded[:, :, :kh, :kw] = rows
    # tap index m*s + r -> (m, r); the Conv reads the taps in reverse order of m.
    taps = padded.reshape(c_out, c_in_g, mh, sh, mw, sw)[:, :, ::-1, :, ::-1, :]
    return np.ascontiguousarray(taps.transpose(0, 3, 5, 1, 2, 4).reshape(c_out * sh * sw, c_in_g, mh, mw))


def subpixel_reason(node: ir.Node, opset: int | None) -> str | None:
    """Why this ConvTranspose cannot become a sub-pixel Conv, or None."""
    attrs = node.attributes
    w = node.inputs[1]
    if w.const_value is None:
        return "weight is not a constant"
    if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].const_value is None:
        return "bias is not a constant"
    dtype = w.const_value.dtype
    if dtype not in FLOAT_TYPES:
        return f"weight type {dtype} is not a floating type"
    shape = w.const_value.shape
    if len(shape) != 4:
        return f"{len(shape) - 2}-D ConvTranspose; DepthToSpace is 2-D only"
    if opset is not None and opset < 11:
        return f"opset {opset} < 11 has no DepthToSpace mode"
    strides = attrs.get_ints("strides", [1, 1])
    x = node.inputs[0]
    if len(set(strides)) != 1 and not (x.shape is not None and len(x.shape) == 4
                                       and all(isinstance(d, int) for d in x.shape.dims[2:])):
        return (f"strides {list(strides)} differ and the input's height and width are not static (the phases "
                "are interleaved by Reshape/Transpose, whose shapes need them; DepthToSpace has one block size)")
    dilations = attrs.get_ints("dilations", [1, 1])
    if any(d != 1 for d in dilations):
        return f"dilations {list(dilations)}: only 1 is rewritten"
    auto_pad = attrs.get_string("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return f"auto_pad={auto_pad}: the pads it implies have differed between ONNX Runtime and the spec"
    if "output_shape" in attrs:
        return "output_shape attribute: the pads it implies have differed between ONNX Runtime and the spec"
    kernel_shape = attrs.get_ints("kernel_shape", None)
    if kernel_shape is not None and list(kernel_shape) != list(shape[2:]):
        return f"kernel_shape {list(kernel_shape)} disagrees with the weight's {list(shape[2:])}"
    if any(p < 0 for p in _pads(node)):
        return f"negative pads {_pads(node)}"
    return None


def _pads(node: ir.Node) -> list[int]:
    if node.attributes.get_string("auto_pad", "NOTSET") == "VALID":
        return [0, 0, 0, 0]
    return list(node.attributes.get_ints("pads", [0, 0, 0, 0]))


def _opset(context) -> int | None:
    return context.model.opset_imports.get("")


class _SubpixelRule(SiteRule):
    def build(self, op, node: ir.Node, activation: ir.Node | None = None) -> ir.Value:
        """The Conv (+ activation) + DepthToSpace + Slice that replaces `node`."""
        attrs = node.attributes
        x, w = node.inputs[0], node.inputs[1]
        weight = w.const_value.numpy()
        sh, sw = strides = tuple(attrs.get_ints("strides", [1, 1]))
        stride = sh if sh == sw else strides
        groups = attrs.get_int("group", 1)
        pads = _pads(node)
        output_padding = list(attrs.get_ints("output_padding", [0, 0]))
        plans = [plan_axis(weight.shape[2 + i], strides[i], pads[i], pads[2 + i], output_padding[i]) for i in range(2)]

        inputs = [x, self.owner.initializer(op, subpixel_weight(weight, strides, groups), f"{w.name}_subpixel")]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = node.inputs[2].const_value.numpy()
            inputs.append(self.owner.initializer(op, np.repeat(bias, sh * sw), f"{node.inputs[2].name}_subpixel"))
        y = op.Conv(*inputs, kernel_shape=[p.taps for p in plans], group=groups,
                    pads=[p.pad_begin for p in plans] + [p.pad_end for p in plans])
        if activation is not None:
            y = op.op(activation.op_type, y, _domain=activation.domain, **dict(activation.attributes))
        if sh == sw > 1:
            y = op.DepthToSpace(y, blocksize=sh, mode="CRD")
        elif sh != sw:  # case 4: the phases interleaved per axis, [N, C*sh*sw, Qh, Qw] -> [N, C, Qh*sh, Qw*sw]
            c_out = weight.shape[1] * groups
            qh, qw = (x.shape.dims[2 + i] + plans[i].pad_begin + plans[i].pad_end - plans[i].taps + 1 for i in range(2))
            split = np.array([0, c_out, sh, sw, qh, qw], dtype=np.int64)
            merged = np.array([0, c_out, qh * sh, qw * sw], dtype=np.int64)
            y = op.Reshape(y, self.owner.initializer(op, split, "subpixel_phases"))
            y = op.Transpose(y, perm=[0, 1, 4, 2, 5, 3])
            y = op.Reshape(y, self.owner.initializer(op, merged, "subpixel_interleaved"))
        crop_axes = [i for i, p in enumerate(plans) if p.crop_begin or p.crop_end]
        if crop_axes:
            starts = np.array([plans[i].crop_begin for i in crop_axes], dtype=np.int64)
            ends = np.array([-plans[i].crop_end if plans[i].crop_end else INT64_MAX for i in crop_axes], dtype=np.int64)
            y = op.Slice(y, self.owner.initializer(op, starts, "subpixel_crop_starts"),
                         self.owner.initializer(op, ends, "subpixel_crop_ends"),
                         self.owner.initializer(op, np.array([2 + i for i in crop_axes], dtype=np.int64),
                                                "subpixel_crop_axes"))
        detail = (f"Conv({sh * sw}x{weight.shape[1] * groups} channels, {plans[0].taps}x{plans[1].taps})"
                  + (f" + {activation.op_type}" if activation is not None else "")
                  + (" + DepthToSpace(CRD)" if sh == sw > 1 else " + Reshape/Transpose/Reshape" if sh != sw else "")
                  + (" + Slice" if crop_axes else ""))
        self.accepted(node, detail, strategy="subpixel", stride=stride)
        return y

    def site_reason(self, context, node: ir.Node) -> str | None:
        if isinstance(context.graph_or_function, ir.Function):
            return "inside a model function, where the rewriter cannot add initializers"
        return subpixel_reason(node, _opset(context))


class ConvTransposeToSubpixel(_SubpixelRule):
    """``ConvTranspose(x) -> Slice(DepthToSpace(Conv(x; K)))`` (cases 1-2)."""

    def pattern(self, op, x, w):
        return op.ConvTranspose(x, w, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, x, w, y, **_):
        node = y.producer()
        if _activation_after(y) is not None:
            return pattern.MatchResult().fail("an activation follows; ActivatedConvTransposeToSubpixel takes it")
        reason = self.site_reason(context, node)
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, w, y, **_):
        return self.build(op, y.producer())


class ActivatedConvTransposeToSubpixel(_SubpixelRule):
    """``A(ConvTranspose(x)) -> Slice(DepthToSpace(A(Conv(x; K))))``, A elementwise (case 3)."""

    def __init__(self, owner, activation: str):
        super().__init__(owner, name=f"subpixel-{activation}")
        self.activation = activation

    def pattern(self, op, x, w):
        z = op.ConvTranspose(x, w, _allow_other_inputs=True, _outputs=["z"])
        return getattr(op, self.activation)(z, _outputs=["y"])

    def check(self, context, x, w, z, y, **_):
        node = z.producer()
        reason = self.site_reason(context, node)
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, w, z, y, **_):
        return self.build(op, z.producer(), activation=y.producer())


def _activation_after(value: ir.Value) -> ir.Node | None:
    """The fusable activation that is `value`'s only consumer, if so."""
    uses = value.uses()
    if value.is_graph_output() or len(uses) != 1:
        return None
    consumer = uses[0].node
    if consumer.op_type in FUSABLE_ACTIVATIONS and consumer.domain == "" and len(consumer.inputs) == 1:
        return consumer
    return None


class ConvTransposePass(DmlPass):
    """ConvTranspose -> sub-pixel Conv + DepthToSpace (+ Slice), or kept."""

    name = "conv-transpose"
    summary = "ConvTranspose -> forward Conv + DepthToSpace (sub-pixel), exact; tuned"
    order = 35.0
    options = (Option(
        "conv_transpose", default="auto", choices=("keep", "subpixel", "auto"), tunable=True,
        auto_default={"dml": "subpixel", "cuda": "subpixel", "cpu": "keep"},
        help="ConvTranspose: keep, subpixel (Conv + DepthToSpace), or auto (time both on the target; default "
             "without the target: subpixel for dml and cuda, keep for cpu)"),)

    def choice(self) -> str:
        return self.resolved_option("conv_transpose")

    def initializer(self, op, array: np.ndarray, base: str) -> ir.Value:
        name = self.fresh(base or "subpixel_weight")
        return op.initializer(ir.tensor(np.ascontiguousarray(array), name=name), name=name)

    needs_names = "sites"
    needs_fresh_names = True

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        return [n for n in all_nodes(model) if n.op_type == "ConvTranspose" and n.domain == ""]

    def skip(self, model: ir.Model, sites) -> bool:
        if self.choice() != "keep":
            return False
        for node in sites:
            self.kept(node, "conv_transpose=keep", strategy="keep")
        return True

    def rewrite(self, model: ir.Model) -> bool:
        rules = [ConvTransposeToSubpixel.rule(self)]
        rules += [ActivatedConvTransposeToSubpixel.rule(self, a) for a in FUSABLE_ACTIVATIONS]
        unused_before = unused_initializers(model)
        count = apply_rules(model, rules)
        drop_orphaned_initializers(model, unused_before)
        return count > 0

