"""norm-fusion: normalizations DirectML (and CUDA) run as one kernel, fused where ORT does not fuse them.

ORT fuses some normalizations itself when it loads a model (``graph_transformer_utils.cc``, level 2):
LayerNormFusion and SkipLayerNormFusion for the CPU, CUDA, ROCm and DirectML EPs, but
SimplifiedLayerNormFusion (RMSNorm) for CPU, CUDA and ROCm only, not DirectML.  So:
  1. Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2), [-1]), eps)))), scale)
     -> SimplifiedLayerNormalization(x, scale; axis=-1)      (RMSNorm, onnxscript's RmsNormFusion pattern,
     Casts to a compute type allowed).  ``auto``: for DirectML where the ORT version registers the
     kernel (1.23 table); for CUDA ORT does it at load, so it is left to ORT.
  2. LayerNormalization(Add(a, b), gamma, beta; axis=-1) -> com.microsoft SkipLayerNormalization(a, b,
     gamma, beta)  (onnxscript's SkipLayerNormFusion pattern; with the bias Add variants; the sum goes
     on as output 3 when the residual stream needs it, outputs 1 and 2 stay empty, which DirectML
     requires).  ORT fuses the 3-D sites at load for DirectML and CUDA, so ``auto`` leaves those to
     ORT; ``fuse`` writes them into the model (a session at a lower optimization level, a profile).
  3. The same for another rank (SAM's [B, H, W, C] blocks), which ORT's fusion does not take:
     Reshape(SkipLayerNormalization(Reshape(a, [1, -1, D]), Reshape(b, [1, -1, D]), ...), shape(a))
     for static shapes; the Reshapes are views (aliases on DirectML).
  4. Div(Sub(x, m), Sqrt(Add(ReduceMean(Pow(Sub(x, m), 2), axes), eps))), m = ReduceMean(x, axes),
     axes = 2.. of x -> InstanceNormalization(x, 1, 0; eps): InstanceNorm written out, and the
     ReduceMean form of GroupNorm (on its [N, G, -1] view, diffusion models).  ORT has no
     InstanceNormalization fusion (none in graph_transformer_utils.cc); DirectML registers
     InstanceNormalization-6 in every table (and fuses an activation into it).

Only normalizations over the trailing axes are fused (the last one; 2.. for InstanceNormalization):
a LayerNorm2d over the channels of NCHW (SAM's neck) normalizes axis 1 and is never touched.
Declined, with the reason: an epsilon that is not a constant, axes other than the last, a scale (or
gamma/beta/bias) that is not 1-D of the normalized size (the kernels do not broadcast them),
Add inputs of different shapes or a non-3-D one without a static shape (SkipLayerNormalization),
two ReduceMeans over different axes, float64 (DirectML has no float64), and a target whose kernel
table lacks the op.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter.ort_fusions.rms_normalization import RmsNormFusion
from onnxscript.rewriter.ort_fusions.skip_normalization import SkipLayerNormFusion

from dmlopt.targets.dml import placement
from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules, remove_unused_nodes
from dmlopt.passes._shared import all_nodes, show_shape
from dmlopt.target import DEFAULT_TARGET

MS_DOMAIN = "com.microsoft"
# DirectML and CUDA kernels are float32/float16 (the tables' Float16to32; CUDA adds bfloat16).
KERNEL_TYPES = {"dml": {ir.DataType.FLOAT, ir.DataType.FLOAT16},
                "cuda": {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16},
                "cpu": {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE},
                "webgpu": {ir.DataType.FLOAT, ir.DataType.FLOAT16}}  # WebGpuSupportedFloatTypes()
# What ORT fuses itself at load, per EP (graph_transformer_utils.cc level 2; SimplifiedLayerNormFusion
# lists cpu/cuda/rocm, SkipLayerNormFusion cpu/acl/cuda/rocm/dml).
ORT_FUSES_AT_LOAD = {"SimplifiedLayerNormalization": {"cpu", "cuda"},
                     "SkipLayerNormalization": {"cpu", "cuda", "dml", "webgpu"},  # webgpu: PR #32294
                     "InstanceNormalization": set()}


def _root(context) -> ir.Node | None:
    outputs = getattr(context, "output_values", None) or []
    return outputs[0].producer() if outputs and outputs[0] is not None else None


def _dims(value: ir.Value | None) -> list | None:
    return None if value is None or value.shape is None else list(value.shape.dims)


class _NormSite(SiteRule):
    """What both fusions check before the onnxscript rule's own conditions: the mode and the kernel."""

    op_name = ""
    domain = ""
    root: ir.Node | None = None  # the matched site, set by check for rewrite

    def __init__(self, owner: DmlPass, name: str, inner, mode: str, data: placement.DmlData | None):
        super().__init__(owner, name)
        self.inner, self.mode, self.data = inner, mode, data

    def target_reason(self, dtype: ir.DataType | None, ort_would_fuse: bool = True) -> str | None:
        target = (self.owner.context.target if self.owner is not None else DEFAULT_TARGET).ep
        if self.mode == "auto" and ort_would_fuse and target in ORT_FUSES_AT_LOAD[self.op_name]:
            return (f"kept: ORT fuses it into {self.op_name} itself when it loads the model for the {target} EP "
                    "(--norm-fusion fuse writes it into the model)")
        if target == "dml" and self.data is not None and not self.data.has_op(self.domain, self.op_name):
            return f"ORT {self.data.version}'s DirectML registers no {self.op_name}"
        if dtype is not None and dtype not in KERNEL_TYPES.get(target, KERNEL_TYPES["cpu"]):
            takes = "/".join(sorted(t.name.lower() for t in KERNEL_TYPES.get(target, KERNEL_TYPES["cpu"])))
            return f"{self.op_name} on {dtype}: the {target} kernel takes {takes}"
        return None

    def verdict(self, node: ir.Node | None, reason: str | None):
        if reason and reason.startswith("kept: "):
            if self.owner is not None and node is not None:
                self.owner.kept(node, reason[len("kept: "):])
            return self.decline(None, reason)
        return self.decline(node, reason) if reason else True


class RmsNormToSimplifiedLayerNorm(_NormSite):
    """``x * 1/sqrt(mean(x^2, -1) + eps) * scale`` -> ``SimplifiedLayerNormalization(x, scale)``."""

    op_name = "SimplifiedLayerNormalization"

    def __init__(self, owner, name, mul_order: bool, mode: str, data):
        super().__init__(owner, name, RmsNormFusion(name, _mul_order=mul_order), mode, data)

    def pattern(self, op, x, scale, epsilon, compute_dtype, target_dtype):
        return self.inner.pattern(op, x, scale, epsilon, compute_dtype, target_dtype)

    def check(self, context, x, scale, epsilon, compute_dtype, target_dtype, **rest):
        node = self.root = _root(context)
        result = self.inner.check(context, x, scale, epsilon, compute_dtype, target_dtype, **rest)
        reason = None if result else (result.reason or "onnxscript's RmsNormFusion check failed")
        if reason is None and epsilon.const_value is None:
            reason = "epsilon is not a constant"
        if reason is None:
            reason = _scale_reason("scale", scale, x)
        return self.verdict(node, reason or self.target_reason(x.dtype))

    def rewrite(self, op, **bindings):
        self.accepted(self.root, "SimplifiedLayerNormalization over the last axis")
        return self.inner.rewrite(op, **bindings)


class AddLayerNormToSkipLayerNorm(_NormSite):
    """``LayerNormalization(Add(a, b), gamma, beta)`` -> ``com.microsoft SkipLayerNormalization``."""

    op_name = "SkipLayerNormalization"
    domain = MS_DOMAIN

    def __init__(self, owner, name, has_bias: bool, bias_pre_add: bool, mode: str, data):
        super().__init__(owner, name, SkipLayerNormFusion(name, has_bias=has_bias, bias_pre_add=bias_pre_add),
                         mode, data)

    def pattern(self, op, input, skip, gamma, beta, bias):
        return self.inner.pattern(op, input, skip, gamma, beta, bias)

    def check(self, context, input, skip, gamma, beta, bias, layer_norm, **rest):
        node = layer_norm.producer()
        reason, dims = None, _dims(input)
        if dims is None or dims != _dims(skip):
            reason = (f"inputs {show_shape(input.shape)} and {show_shape(skip.shape)}: SkipLayerNormalization adds two "
                      "inputs of one shape (no broadcasting)")
        elif len(dims) != 3 and not (len(dims) >= 2 and all(isinstance(d, int) for d in dims)):
            reason = (f"input {show_shape(input.shape)}: SkipLayerNormalization is 3-D; another rank needs a static "
                      "shape to be viewed as [1, -1, D]")
        elif len(dims) == 3:
            result = self.inner.check(context, input, skip, gamma, beta, bias, layer_norm, **rest)
            reason = None if result else (result.reason or "onnxscript's SkipLayerNormFusion check failed")
        elif layer_norm.producer().attributes.get_int("stash_type", 1) != 1:
            reason = "stash_type other than float32"
        for name, value in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if reason is None and value is not None:
                reason = _scale_reason(name, value, input)
        if reason is None and len(node.outputs) > 1 and any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            reason = "the LayerNormalization's Mean/InvStdDev outputs are used"
        # ORT's own SkipLayerNormFusion takes 3-D inputs only: other ranks are left to no one
        return self.verdict(node, reason or self.target_reason(input.dtype, ort_would_fuse=len(dims) == 3))

    def rewrite(self, op, input, skip, gamma, beta, bias, layer_norm, **_):
        node = layer_norm.producer()
        epsilon = node.attributes.get_float("epsilon", 1e-5)
        dims = _dims(input)
        view = len(dims) != 3  # e.g. SAM's [B, H, W, C] blocks: the same sums on a [1, B*H*W, C] view
        if view:
            shape3 = op.Constant(value=ir.tensor(np.array([1, -1, dims[-1]], dtype=np.int64)))
            input, skip = op.Reshape(input, shape3), op.Reshape(skip, shape3)
        inputs = [input, skip, gamma, beta] + ([bias] if bias is not None else [])
        normalized, mean, inv_std, skip_sum = op.SkipLayerNormalization(
            *inputs, epsilon=epsilon, _outputs=4, _domain=MS_DOMAIN)
        # ONNX shape inference knows no com.microsoft op: say what ORT's contrib shape inference says
        kernel_shape = ir.Shape([1, int(np.prod(dims[:-1])), dims[-1]] if view else dims)
        for value in (normalized, skip_sum):
            value.type, value.shape = ir.TensorType(layer_norm.dtype or input.dtype), kernel_shape
        for value in (mean, inv_std):  # unread; the schema's U is float32 whatever T is
            value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([*kernel_shape[:-1], 1])
        if view:
            back = op.Constant(value=ir.tensor(np.array(dims, dtype=np.int64)))
            normalized, skip_sum = op.Reshape(normalized, back), op.Reshape(skip_sum, back)
        self.accepted(node, "SkipLayerNormalization (Add + LayerNormalization over the last axis)"
                      + (f" on a [1, -1, {dims[-1]}] view of the rank-{len(dims)} input" if view else ""))
        return normalized, skip_sum


class MeanVarianceToInstanceNorm(_NormSite):
    """``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` over axes 2.. -> ``InstanceNormalization(x, 1, 0)``."""

    op_name = "InstanceNormalization"

    def __init__(self, owner, mode: str, data):
        super().__init__(owner, "MeanVarianceToInstanceNorm", None, mode, data)

    def pattern(self, op, x, axes, axes2, two, epsilon):
        mean = op.ReduceMean(x, axes, keepdims=1, noop_with_empty_axes=0)
        centered = op.Sub(x, mean)
        variance = op.ReduceMean(op.Pow(centered, two), axes2, keepdims=1, noop_with_empty_axes=0)
        return op.Div(centered, op.Sqrt(op.Add(variance, epsilon)))

    def check(self, context, x, axes, axes2, two, epsilon, **_):
        node = self.root = _root(context)
        dims = _dims(x)
        reason = None
        if dims is None or len(dims) < 3 or not isinstance(dims[1], int):
            reason = f"input {show_shape(x.shape if x is not None else None)}: needs rank >= 3 and a static axis 1"
        elif _ints(axes) is None or _ints(axes) != _ints(axes2):
            reason = "the two ReduceMeans do not reduce the same constant axes"
        elif sorted(a % len(dims) for a in _ints(axes)) != list(range(2, len(dims))):
            reason = (f"axes {_ints(axes)} of a rank-{len(dims)} input are not all axes after the first two "
                      "(InstanceNormalization normalizes each [n, c] over the rest)")
        elif _scalar(two) != 2.0:
            reason = "the variance is not a mean of squares (Pow exponent is not the constant 2)"
        elif _scalar(epsilon) is None:
            reason = "epsilon is not a constant scalar"
        return self.verdict(node, reason or self.target_reason(x.dtype))

    def rewrite(self, op, x, epsilon, **_):
        channels = _dims(x)[1]
        dtype = x.dtype.numpy()
        self.accepted(self.root, f"InstanceNormalization over axes 2.. of {channels} channels")
        return op.InstanceNormalization(x, op.Constant(value=ir.tensor(np.ones(channels, dtype=dtype))),
                                        op.Constant(value=ir.tensor(np.zeros(channels, dtype=dtype))),
                                        epsilon=_scalar(epsilon))


def _ints(value: ir.Value) -> list[int] | None:
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else [int(v) for v in tensor.numpy().reshape(-1)]


def _scalar(value: ir.Value) -> float | None:
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None or tensor.numpy().size != 1:
        return None
    return float(tensor.numpy().reshape(-1)[0])


def _scale_reason(name: str, value: ir.Value, x: ir.Value) -> str | None:
    """Why `value` is not a 1-D tensor of x's (static) last size, which the kernels require."""
    dims, x_dims = _dims(value), _dims(x)
    if x_dims is None or not x_dims or not isinstance(x_dims[-1], int):
        return f"input shape {show_shape(x.shape if x is not None else None)}: the normalized size is not static"
    if dims != [x_dims[-1]]:
        return (f"{name} of shape {show_shape(value.shape)} is not 1-D of the normalized size {x_dims[-1]} "
                "(the kernel does not broadcast it)")
    return None


@contextlib.contextmanager
def _reduce_mean_defaults_spelled(model: ir.Model) -> Iterator[None]:
    """Write ReduceMean's default keepdims=1 / noop_with_empty_axes=0 while the rules match (the
    onnxscript pattern names them, and its matcher does not fill in defaults); taken out again after."""
    added = []
    for node in all_nodes(model):
        if node.op_type == "ReduceMean" and node.domain in ("", "ai.onnx"):
            for name, default in (("keepdims", 1), ("noop_with_empty_axes", 0)):
                if name not in node.attributes:
                    node.attributes[name] = ir.AttrInt64(name, default)
                    added.append((node, name))
    try:
        yield
    finally:
        for node, name in added:
            node.attributes.pop(name, None)


def _empty_unused_outputs(model: ir.Model) -> None:
    """Leave SkipLayerNormalization's mean/inv_std_var (and an unused sum) unnamed: DirectML's support
    query sends a node with mean or inv_std_var outputs to the CPU."""
    for node in all_nodes(model):
        if node.op_type == "SkipLayerNormalization" and node.domain == MS_DOMAIN:
            for k in range(1, len(node.outputs)):
                out = node.outputs[k]
                if out.name and not out.uses() and not out.is_graph_output():
                    out.name = ""


class NormFusionPass(DmlPass):
    """RMSNorm -> SimplifiedLayerNormalization, Add + LayerNormalization -> SkipLayerNormalization."""

    name = "norm-fusion"
    summary = ("RMSNorm -> SimplifiedLayerNormalization, Add + LayerNormalization -> SkipLayerNormalization, "
               "mean/variance over axes 2.. -> InstanceNormalization; trailing axes only, where the target registers "
               "the kernel and ORT does not fuse it itself")
    order = 67.0
    options = (
        Option("norm_fusion", "auto", "fuse normalizations: auto (only what ORT does not fuse at load for the "
               "target), fuse (every exact site the target has a kernel for), keep", choices=("auto", "fuse", "keep")),
    )

    needs_names = "all"
    needs_shapes = "types"  # the checks need static shapes

    def skip(self, model: ir.Model, sites) -> bool:
        mode = self.option("norm_fusion")
        return mode == "keep" or self.context.target.ep == "cpu" and mode == "auto"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        return [n for n in all_nodes(model) if n.op_type in ("LayerNormalization", "ReduceMean")]

    def rewrite(self, model: ir.Model) -> bool:
        mode = self.option("norm_fusion")
        data = placement.load_data(self.context.target.table_version) if self.context.target.ep == "dml" else None
        rules = [RmsNormToSimplifiedLayerNorm.rule(self, f"RmsNorm{k}", order, mode, data)
                 for k, order in enumerate((False, True))]
        rules += [AddLayerNormToSkipLayerNorm.rule(self, name, has_bias, pre, mode, data)
                  for name, has_bias, pre in (("SkipLayerNormPreBias", True, True), ("SkipLayerNormBias", True, False),
                                              ("SkipLayerNorm", False, False))]
        rules.append(MeanVarianceToInstanceNorm.rule(self, mode, data))
        with _reduce_mean_defaults_spelled(model):
            count = apply_rules(model, rules)
        settled = {s.node for s in self.sites if s.action in ("rewrote", "kept")}
        # one site, several rules (bias variants): a rule that declined a site another rule fused, or
        # matched and left to ORT, is no news (BERT's embedding sum: the bias variants' shape mismatch)
        self.sites = [s for s in self.sites if s.action in ("rewrote", "kept") or s.node not in settled]
        if count:
            remove_unused_nodes(model)  # the Reshape back of an unused sum
            _empty_unused_outputs(model)
            if self.context.target.ep == "dml" or any(n.domain == MS_DOMAIN for n in all_nodes(model)):
                model.opset_imports.setdefault(MS_DOMAIN, 1)
        return count > 0
