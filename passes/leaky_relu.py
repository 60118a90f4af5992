"""leaky-relu: LeakyRelu in forms that DirectML can fuse, one strategy for the whole model.

On some GPUs and drivers DirectML runs Conv through a vendor metacommand that fuses Relu but not
LeakyRelu (DirectML issue #138: the 7-layer CNN ran far slower than its Relu twin).  What
fuses depends on hardware and driver, so this pass offers exact rewrites and ``dmlopt.engine.tune``
picks among them by timing on the target.  ``a`` is LeakyRelu's alpha, ``z`` its input.

Every strategy but ``keep`` first turns the degenerate slopes into what they are:
  1. LeakyRelu(z; a=0) -> Relu(z)
  2. LeakyRelu(z; a=1) -> Identity(z)

decompose:
  3. LeakyRelu(z) -> Max(z, Mul(z, a))        a < 1 (negative a included)
  4. LeakyRelu(z) -> Min(z, Mul(z, a))        a > 1

relu-split, whichever form has fewer compute nodes (ties: form 6, which is bit-exact because
each element comes from one branch only):
  5. LeakyRelu(z) -> Add(Mul(Relu(z), 1-a), Mul(z, a))     (1-a)*Relu(z) + a*z; a coefficient
     of 1 drops its Mul, -1 turns Add into Sub, a = 0.5 shares one Mul: 3 nodes for a in
     {0.5, 2, -1}, else 4
  6. LeakyRelu(z) -> Sub(Relu(z), Relu(Mul(z, -a)))        a > 0   Relu(z) - a*Relu(-z)
     LeakyRelu(z) -> Add(Relu(z), Relu(Mul(z, a)))         a < 0   (a*Relu(-z) = Relu(-a*z), a >= 0)

conv-split, P = Conv | ConvTranspose | Gemm | MatMul (linear in its weights), so one branch is
Conv+Relu, the form that fuses:
  7. LeakyRelu(P(x; W, b)) -> Add(Relu(P(x; (1-a)W, (1-a)b)), P(x; aW, ab))    a < 1
  8. LeakyRelu(P(x; W, b)) -> Sub(P(x; aW, ab), Relu(P(x; (a-1)W, (a-1)b)))    a > 1
     Relu(c*z) = c*Relu(z) holds only for c >= 0, hence the Sub form when 1-a < 0.  Gemm scales
     its alpha/beta attributes instead of its weights (any B and C); the others need constant
     weights and bias.

channel-fold, P and Q both Conv | ConvTranspose or both Gemm | MatMul, with constant weights:
  9. Q(LeakyRelu(P(x; W, b)); V) -> Q(Relu(P(x; [W; -W], [b; -b])); [V, -a*V])
     LeakyRelu(z) = Relu(z) - a*Relu(-z) for every a: the producer emits both halves as 2C
     channels with Relu fused, the consumer's input channels take the recombination.  With
     groups, the halves are interleaved in blocks of gcd(C/groups_P, C/groups_Q) channels so both
     convolutions keep their group structure.

Conditions (a site failing one is declined with the reason in the report): a finite alpha, a
floating input type; for 7-9 the producer's output feeds only the LeakyRelu (and is no graph
output), for 9 the LeakyRelu feeds only Q, as Q's data input.  Subgraphs (If/Loop/Scan bodies)
are rewritten too; inside model functions 7-9 decline (the rewriter cannot add initializers there).

Choosing: ``--leaky-relu auto`` is measured by ``dmlopt.engine.tune`` where the target provider
exists.  Where it does not, ``auto_default`` applies:
  - dml: ``keep``.  Measured on a GPU through the real DirectML EP (H100, ORT 1.31.1 under Wine and
    vkd3d, the 7-layer CNN at 270x480): DirectML fused Conv+LeakyRelu there, keep 6.47 ms, its Relu
    twin 6.94, relu-split 7.05, decompose 7.27, conv-split 7.44, channel-fold 7.74; conv-split also
    grows the file 1.85x.  The driver that does not fuse LeakyRelu (vendor metacommands, DirectML
    issue #138) is not on any machine here: ``--tune`` on the user's DirectML machine times every
    strategy and takes a split only where it is faster beyond the noise.
  - cuda, cpu, webgpu: ``keep``.  The CUDA EP fuses no activation into Conv, the CPU EP fuses
    LeakyRelu into its Conv itself and ORT fuses Conv+LeakyRelu for WebGPU, so every rewrite only
    adds work (benchmarks/cnn.py on an H200, benchmarks/webgpu.py on an H100; benchmarks/README.md).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules
from dmlopt.passes._shared import (FLOAT_TYPES, all_nodes, drop_orphaned_initializers, regroup,
                                   unused_initializers)

STRATEGIES = ("keep", "decompose", "relu-split", "conv-split", "channel-fold")
DEFAULT_ALPHA = 0.01  # the ONNX default of LeakyRelu's alpha
LINEAR_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
SPATIAL = ("Conv", "ConvTranspose")  # channels on axis 1
DENSE = ("Gemm", "MatMul")  # features on the last axis
NEGATIVE_FORM_COST = 4  # form 6: Relu, Mul, Relu, Add|Sub


def leaky_alpha(node: ir.Node) -> float:
    return float(node.attributes.get_float("alpha", DEFAULT_ALPHA))


def scalar(op, value: float, dtype: ir.DataType) -> ir.Value:
    """A scalar Constant of `dtype` (broadcasts against any tensor)."""
    return op.Constant(value=ir.tensor(np.asarray(value, dtype=dtype.numpy())))


def single_use_reason(value: ir.Value, what: str) -> str | None:
    """Why `value` cannot be absorbed into a rewrite: it has other consumers or is an output."""
    if value.is_graph_output():
        return f"{what} is also a graph output"
    if len(value.uses()) != 1:
        return f"{what} has {len(value.uses())} consumers (needs exactly one)"
    return None


def relu_linear_cost(a: float) -> int:
    """Compute nodes of form 5, (1-a)*Relu(z) + a*z (see `_relu_linear`)."""
    if 1 - a == a:
        return 3
    return 2 + sum(abs(c) != 1 for c in (1 - a, a))


# -- the weights of linear ops ------------------------------------------------------------------

def _groups(node: ir.Node) -> int:
    return node.attributes.get_int("group", 1) if node.op_type in SPATIAL else 1


def _trans_b(node: ir.Node) -> bool:
    return node.op_type == "Gemm" and bool(node.attributes.get_int("transB", 0))


def output_rows(node: ir.Node, w: np.ndarray) -> np.ndarray:
    """The weight as one row per output channel/feature."""
    if node.op_type == "Conv":
        return w
    if node.op_type == "ConvTranspose":
        return regroup(w, _groups(node))
    return w if _trans_b(node) else w.T


def from_output_rows(node: ir.Node, rows: np.ndarray) -> np.ndarray:
    if node.op_type == "Conv":
        return rows
    if node.op_type == "ConvTranspose":
        return regroup(rows, _groups(node))
    return rows if _trans_b(node) else rows.T


def input_rows(node: ir.Node, w: np.ndarray) -> np.ndarray:
    """The weight as one row per input channel/feature."""
    if node.op_type == "Conv":
        return regroup(w, _groups(node))
    if node.op_type == "ConvTranspose":
        return w
    return w.T if _trans_b(node) else w


def from_input_rows(node: ir.Node, rows: np.ndarray) -> np.ndarray:
    if node.op_type == "Conv":
        return regroup(rows, _groups(node))
    if node.op_type == "ConvTranspose":
        return rows
    return rows.T if _trans_b(node) else rows


def fold_layout(channels: int, producer_groups: int, consumer_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """New channel index of each channel's positive and negative half (form 9).

    Blocks of gcd(C/gp, C/gq) channels are laid out as [block; -block]: every group of the
    producer and of the consumer is then a run of whole blocks, i.e. contiguous.
    """
    block = math.gcd(channels // producer_groups, channels // consumer_groups)
    o = np.arange(channels)
    positive = (o // block) * 2 * block + o % block
    return positive, positive + block


# -- rules ---------------------------------------------------------------------------------------

class _LeakyReluRule(SiteRule):
    """Checks every strategy shares; `strategy` names it in the site log."""

    strategy: ClassVar[str] = ""
    needs_initializers: ClassVar[bool] = False

    def site_reason(self, context, node: ir.Node) -> str | None:
        a = leaky_alpha(node)
        if not math.isfinite(a):
            return f"alpha {a} is not finite"
        dtype = node.inputs[0].dtype or node.outputs[0].dtype
        if dtype is None:
            return "input type unknown (run shape inference first)"
        if dtype not in FLOAT_TYPES:
            return f"input type {dtype} is not a floating type"
        if self.needs_initializers and isinstance(context.graph_or_function, ir.Function):
            return "inside a model function, where the rewriter cannot add initializers"
        return None

    def log(self, node: ir.Node, form: str) -> None:
        self.accepted(node, f"{self.strategy}: {form}", strategy=self.strategy, form=form, alpha=leaky_alpha(node))


class LeakyReluDegenerate(_LeakyReluRule):
    """``LeakyRelu(z; alpha=0) -> Relu(z)``, ``LeakyRelu(z; alpha=1) -> Identity(z)`` (cases 1-2)."""

    def __init__(self, owner, strategy: str):
        super().__init__(owner, name=f"{strategy}-degenerate")
        self.strategy = strategy

    def pattern(self, op, z):
        return op.LeakyRelu(z, _outputs=["y"])

    def check(self, context, z, y, **_):
        if leaky_alpha(y.producer()) not in (0.0, 1.0):
            return pattern.MatchResult().fail("alpha is neither 0 nor 1")  # a general site, not a decline
        return True

    def rewrite(self, op, z, y, **_):
        node = y.producer()
        if leaky_alpha(node) == 0.0:
            self.log(node, "Relu(z) (alpha 0)")
            return op.Relu(z)
        self.log(node, "Identity(z) (alpha 1)")
        return op.Identity(z)


class _ElementwiseRule(_LeakyReluRule):
    def pattern(self, op, z):
        return op.LeakyRelu(z, _outputs=["y"])

    def check(self, context, z, y, **_):
        node = y.producer()
        reason = self.site_reason(context, node)
        return self.decline(node, reason) if reason else True


class LeakyReluToMaxMin(_ElementwiseRule):
    """``LeakyRelu(z) -> Max(z, a*z)`` for a < 1, ``Min(z, a*z)`` for a > 1 (cases 3-4)."""

    strategy = "decompose"

    def rewrite(self, op, z, y, **_):
        node = y.producer()
        a = leaky_alpha(node)
        scaled = op.Mul(z, scalar(op, a, node.outputs[0].dtype or z.dtype))
        if a < 1:
            self.log(node, "Max(z, a*z)")
            return op.Max(z, scaled)
        self.log(node, "Min(z, a*z)")
        return op.Min(z, scaled)


class LeakyReluToReluSplit(_ElementwiseRule):
    """``LeakyRelu(z) -> (1-a)*Relu(z) + a*z`` or ``Relu(z) - a*Relu(-z)``, the cheaper (cases 5-6)."""

    strategy = "relu-split"

    def rewrite(self, op, z, y, **_):
        node = y.producer()
        a = leaky_alpha(node)
        dtype = node.outputs[0].dtype or z.dtype
        if relu_linear_cost(a) < NEGATIVE_FORM_COST:
            self.log(node, "(1-a)*Relu(z) + a*z")
            return _relu_linear(op, z, a, dtype)
        self.log(node, "Relu(z) - a*Relu(-z)")
        if a > 0:
            return op.Sub(op.Relu(z), op.Relu(op.Mul(z, scalar(op, -a, dtype))))
        return op.Add(op.Relu(z), op.Relu(op.Mul(z, scalar(op, a, dtype))))


def _relu_linear(op, z, a: float, dtype) -> ir.Value:
    """(1-a)*Relu(z) + a*z with coefficients of 1 and -1 spelled as no Mul and Sub."""
    relu = op.Relu(z)
    if 1 - a == a:
        return op.Mul(op.Add(relu, z), scalar(op, a, dtype))
    terms = []
    for value, coefficient in ((relu, 1 - a), (z, a)):
        if abs(coefficient) != 1:
            value = op.Mul(value, scalar(op, abs(coefficient), dtype))
        terms.append((value, coefficient < 0))
    (first, first_negative), (second, second_negative) = terms
    if first_negative:
        return op.Sub(second, first)
    if second_negative:
        return op.Sub(first, second)
    return op.Add(first, second)


class LeakyReluConvSplit(_LeakyReluRule):
    """``LeakyRelu(P(x; W)) -> Add(Relu(P(x; (1-a)W)), P(x; aW))`` (Sub form for a > 1; cases 7-8)."""

    strategy = "conv-split"
    needs_initializers = True

    def __init__(self, owner, producer: str):
        super().__init__(owner, name=f"conv-split-{producer}")
        self.producer = producer
        # So a producer with other consumers reaches check() and its reason.  The rewriter then ends with
        # dead-code removal, which would cut Loop(M, "") to Loop(M): apply_rules keeps such empty inputs.
        self.remove_nodes = False

    def pattern(self, op, x, w):
        z = getattr(op, self.producer)(x, w, _allow_other_inputs=True, _outputs=["z"])
        return op.LeakyRelu(z, _outputs=["y"])

    def check(self, context, x, w, z, y, **_):
        node, producer = y.producer(), z.producer()
        reason = (self.site_reason(context, node) or single_use_reason(z, f"the {producer.op_type} output")
                  or _scalable_reason(producer))
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, w, z, y, **_):
        node, producer = y.producer(), z.producer()
        a = leaky_alpha(node)
        linear = self._scaled(op, producer, a)
        if a < 1:
            self.log(node, f"Add(Relu({producer.op_type}(x; (1-a)W)), {producer.op_type}(x; aW))")
            return op.Add(op.Relu(self._scaled(op, producer, 1 - a)), linear)
        self.log(node, f"Sub({producer.op_type}(x; aW), Relu({producer.op_type}(x; (a-1)W)))")
        return op.Sub(linear, op.Relu(self._scaled(op, producer, a - 1)))

    def _scaled(self, op, producer: ir.Node, scale: float) -> ir.Value:
        """A copy of `producer` whose output is `scale` times the original."""
        attrs = dict(producer.attributes)
        inputs = list(producer.inputs)
        if producer.op_type == "Gemm":
            attrs["alpha"] = ir.AttrFloat32("alpha", producer.attributes.get_float("alpha", 1.0) * scale)
            attrs["beta"] = ir.AttrFloat32("beta", producer.attributes.get_float("beta", 1.0) * scale)
        else:
            for i in _scaled_inputs(producer):
                arr = inputs[i].const_value.numpy()
                inputs[i] = self.owner.initializer(op, (arr.astype(np.float64) * scale).astype(arr.dtype),
                                                   f"{inputs[i].name}_x{scale:.6g}")
        return op.op(producer.op_type, *inputs, _domain=producer.domain, **attrs)


def _scaled_inputs(producer: ir.Node) -> list[int]:
    """Inputs to scale so the output scales: Conv/ConvTranspose weight and bias, MatMul's constant side."""
    if producer.op_type == "MatMul":
        return [1] if producer.inputs[1].const_value is not None else [0]
    return [i for i in (1, 2) if i < len(producer.inputs) and producer.inputs[i] is not None]


def _scalable_reason(producer: ir.Node) -> str | None:
    if producer.op_type == "Gemm":
        return None
    if producer.op_type == "MatMul":
        if all(v.const_value is None for v in producer.inputs):
            return "MatMul has no constant operand to scale"
        return None
    for i, what in ((1, "weight"), (2, "bias")):
        if i < len(producer.inputs) and producer.inputs[i] is not None and producer.inputs[i].const_value is None:
            return f"{producer.op_type} {what} is not a constant"
    return None


class LeakyReluChannelFold(_LeakyReluRule):
    """``Q(LeakyRelu(P(x; W)); V) -> Q(Relu(P(x; [W; -W])); [V, -aV])`` (case 9)."""

    strategy = "channel-fold"
    needs_initializers = True

    def __init__(self, owner, producer: str, consumer: str):
        super().__init__(owner, name=f"channel-fold-{producer}-{consumer}")
        self.producer, self.consumer = producer, consumer
        self.remove_nodes = False  # as in conv-split: shared values must reach check()

    def pattern(self, op, x, w, v):
        z = getattr(op, self.producer)(x, w, _allow_other_inputs=True, _outputs=["z"])
        y = op.LeakyRelu(z, _outputs=["y"])
        return getattr(op, self.consumer)(y, v, _allow_other_inputs=True, _outputs=["q"])

    def check(self, context, x, w, v, z, y, q, **_):
        node, producer, consumer = y.producer(), z.producer(), q.producer()
        reason = (self.site_reason(context, node)
                  or single_use_reason(z, f"the {producer.op_type} output")
                  or single_use_reason(y, "the LeakyRelu output")
                  or _foldable_producer_reason(producer) or _foldable_consumer_reason(consumer))
        if reason is None:
            produced = output_rows(producer, producer.inputs[1].const_value.numpy()).shape[0]
            consumed = input_rows(consumer, consumer.inputs[1].const_value.numpy()).shape[0]
            if produced != consumed:
                reason = f"{producer.op_type} makes {produced} channels but {consumer.op_type} takes {consumed}"
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, w, v, z, y, q, **_):
        node, producer, consumer = y.producer(), z.producer(), q.producer()
        a = leaky_alpha(node)
        weight = producer.inputs[1].const_value.numpy()
        rows = output_rows(producer, weight)
        channels = rows.shape[0]
        positive, negative = fold_layout(channels, _groups(producer), _groups(consumer))

        doubled = np.empty((2 * channels, *rows.shape[1:]), dtype=rows.dtype)
        doubled[positive], doubled[negative] = rows, -rows
        p_inputs = list(producer.inputs)
        p_inputs[1] = self.owner.initializer(op, from_output_rows(producer, doubled), f"{w.name}_fold")
        bias = _per_channel_bias(producer, channels)
        if bias is not None:
            new_bias = np.empty(2 * channels, dtype=bias.dtype)
            new_bias[positive], new_bias[negative] = bias, -bias
            p_inputs[2] = self.owner.initializer(op, new_bias, f"{producer.inputs[2].name}_fold")
        halves = op.Relu(op.op(producer.op_type, *p_inputs, _domain=producer.domain, **dict(producer.attributes)))

        c_rows = input_rows(consumer, consumer.inputs[1].const_value.numpy())
        c_doubled = np.empty((2 * channels, *c_rows.shape[1:]), dtype=c_rows.dtype)
        c_doubled[positive] = c_rows
        c_doubled[negative] = (c_rows.astype(np.float64) * -a).astype(c_rows.dtype)
        q_inputs = list(consumer.inputs)
        q_inputs[0] = halves
        q_inputs[1] = self.owner.initializer(op, from_input_rows(consumer, c_doubled), f"{v.name}_fold")
        self.log(node, f"{consumer.op_type}(Relu({producer.op_type}(x; [W; -W])); [V, -aV])")
        return op.op(consumer.op_type, *q_inputs, _domain=consumer.domain, **dict(consumer.attributes))


def _const_2d_reason(node: ir.Node, index: int, what: str) -> str | None:
    value = node.inputs[index]
    if value.const_value is None:
        return f"{node.op_type} {what} is not a constant"
    if node.op_type in DENSE and len(value.const_value.shape) != 2:
        return f"{node.op_type} {what} is not 2-D"
    return None


def _foldable_producer_reason(producer: ir.Node) -> str | None:
    reason = _const_2d_reason(producer, 1, "weight")
    if reason:
        return reason
    if len(producer.inputs) > 2 and producer.inputs[2] is not None:
        bias = producer.inputs[2].const_value
        if bias is None:
            return f"{producer.op_type} bias is not a constant"
        channels = output_rows(producer, producer.inputs[1].const_value.numpy()).shape[0]
        if _per_channel_bias(producer, channels) is None:
            return f"{producer.op_type} bias of shape {list(bias.shape)} is not one value per output channel"
    return None


def _per_channel_bias(producer: ir.Node, channels: int) -> np.ndarray | None:
    """The bias as [C], or None when there is none or it varies along other axes (Gemm's C)."""
    if len(producer.inputs) < 3 or producer.inputs[2] is None:
        return None
    bias = producer.inputs[2].const_value.numpy()
    if bias.ndim == 0 or bias.shape in ((1,), (channels,), (1, channels), (1, 1)):
        return np.broadcast_to(bias.reshape(-1), (channels,)).copy()
    return None


def _foldable_consumer_reason(consumer: ir.Node) -> str | None:
    if consumer.op_type == "Gemm" and consumer.attributes.get_int("transA", 0):
        return "Gemm consumer has transA=1 (its features are not on the last axis)"
    return _const_2d_reason(consumer, 1, "weight")


class LeakyReluPass(DmlPass):
    """LeakyRelu -> the chosen exact form (decompose | relu-split | conv-split | channel-fold)."""

    name = "leaky-relu"
    summary = "LeakyRelu in forms DirectML fuses (Max/Min, Relu splits, Conv+Relu split, channel fold); tuned"
    order = 30.0
    options = (Option(
        "leaky_relu", default="auto", choices=(*STRATEGIES, "auto"), tunable=True,
        # webgpu: ORT's ConvActivationFusion runs for the WebGPU EP with LeakyRelu among its activations
        # (dmlopt.targets.webgpu.registry; the fused Conv is checked on lavapipe in tests/test_webgpu.py).
        auto_default={"dml": "keep", "cuda": "keep", "cpu": "keep", "webgpu": "keep"},
        auto_default_source={
            "dml": "measured on a GPU through the real DirectML EP (H100, ORT 1.31.1, 7-layer CNN 270x480): "
                   "DirectML fused Conv+LeakyRelu, and every rewrite was slower (conv-split x0.87); where a driver "
                   "does not fuse LeakyRelu, --tune on that machine measures the splits",
            "webgpu": "ORT fuses Conv+LeakyRelu for WebGPU; every rewrite measured slower on an H100 (x0.57-x0.88)",
            "cuda": "the CUDA EP fuses no activation into Conv: every rewrite adds work (H200)",
            "cpu": "the CPU EP fuses LeakyRelu into Conv itself"},
        help="how to rewrite LeakyRelu: keep, decompose (Max/Min), relu-split, conv-split (Relu(Conv)+Conv), "
             "channel-fold, or auto (time them on the target; default without the target: keep, measured "
             "fastest where Conv+LeakyRelu fuses; --tune takes a split where the user's driver does not fuse)"),)

    def strategy(self) -> str:
        return self.resolved_option("leaky_relu")

    def initializer(self, op, array: np.ndarray, base: str) -> ir.Value:
        name = self.fresh(base or "leaky_relu_weight")
        return op.initializer(ir.tensor(np.ascontiguousarray(array), name=name), name=name)

    needs_names = "sites"
    needs_shapes = "types"  # the scalars need the input type
    needs_fresh_names = True

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        self.strategy()  # resolved (and an untuned "auto" noted) whether or not the model has sites
        return [node for node in all_nodes(model) if node.op_type == "LeakyRelu"]

    def skip(self, model: ir.Model, sites) -> bool:
        if self.strategy() != "keep":
            return False
        for node in sites:
            self.kept(node, "leaky_relu=keep", strategy="keep", alpha=leaky_alpha(node))
        return True

    def shapes_missing(self, sites) -> bool:
        return any(node.inputs[0].dtype is None and node.outputs[0].dtype is None for node in sites)

    def rewrite(self, model: ir.Model) -> bool:
        strategy = self.strategy()
        unused_before = unused_initializers(model)
        count = apply_rules(model, _rules(strategy, self))
        drop_orphaned_initializers(model, unused_before)
        self._decline_unmatched(model, strategy)
        return count > 0

    def _decline_unmatched(self, model: ir.Model, strategy: str) -> None:
        """Every LeakyRelu left that no rule looked at gets the reason no pattern fitted."""
        logged = {site.node for site in self.sites}
        for node in all_nodes(model):
            if node.op_type == "LeakyRelu" and node.name not in logged:
                self.declined(node, _unmatched_reason(strategy, node), strategy=strategy)


def _rules(strategy: str, owner: LeakyReluPass) -> list:
    rules = [LeakyReluDegenerate.rule(owner, strategy)]
    if strategy == "decompose":
        rules.append(LeakyReluToMaxMin.rule(owner))
    elif strategy == "relu-split":
        rules.append(LeakyReluToReluSplit.rule(owner))
    elif strategy == "conv-split":
        rules += [LeakyReluConvSplit.rule(owner, p) for p in LINEAR_PRODUCERS]
    elif strategy == "channel-fold":
        rules += [LeakyReluChannelFold.rule(owner, p, c) for family in (SPATIAL, DENSE) for p in family for c in family]
    else:
        raise ValueError(f"unknown LeakyRelu strategy {strategy!r}")
    return rules


def _unmatched_reason(strategy: str, node: ir.Node) -> str:
    producer = node.inputs[0].producer()
    made_by = producer.op_type if producer is not None else "a graph input or constant"
    if strategy == "conv-split":
        return f"input comes from {made_by}; conv-split needs a {', '.join(LINEAR_PRODUCERS)} producer"
    consumers = sorted({use.node.op_type for use in node.outputs[0].uses()}) or ["none"]
    return (f"channel-fold needs a Conv/ConvTranspose producer and a Conv/ConvTranspose consumer (or Gemm/MatMul "
            f"for both) taking it as data input; producer: {made_by}, consumers: {', '.join(consumers)}")

