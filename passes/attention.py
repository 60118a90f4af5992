"""attention: fuse scaled dot-product attention into com.microsoft MultiHeadAttention.

Rewrite:
  ``MatMul(Softmax(bias_path(MatMul(heads(q) * s, heads(k)^T))), heads(v))``
      -> ``layout(MultiHeadAttention(Q3, K3, V3, attention_bias=B4, num_heads=N, scale=s))``
  where ``heads(x)`` is any chain of layout ops (Reshape, Transpose, Split, Slice, Squeeze,
  Gather, ...) that cuts per-head tensors out of one tensor, and ``bias_path`` is Reshapes
  and Adds of bias terms (SAM's decomposed relative position:
  ``attn.view(B*nH, qH, qW, kH, kW) + rel_h[..., None] + rel_w[:, :, :, None, :]``).

Cases:
  1. Scores: ``MatMul(Qh, Kt)`` or, after the transpose pass, ``FusedMatMul(Qh, Kh, transB=1,
     alpha)``.  Scalar Mul/Div on q, on k or on the scores (before any bias) multiply into
     ``scale``.  The Softmax may run on a Reshape of the scores (e.g. 4D) and P be reshaped
     back before P.V.
  2. Heads: Qh, Kh, Vh (shape ``(batch..., S, H)``) are traced back to the tensors they were
     cut from as strided views (passes/_layout.py).  The batch axes split into B and N
     heads where the N part sits next to the head dim in memory; Q3 = (B, S, N*H) must then
     be a Reshape -> Slice -> Reshape of its base (no Transpose).  SAM's packed qkv Linear
     output (B*windows, 14, 14, 3*C) gives Q3/K3/V3 as three Slices of one Reshape; HF's
     ``Transpose(Reshape(q, (B,S,N,H)), (0,2,1,3))`` gives q itself.
  3. Output: MHA's (B, S, N*Hv) goes back into the per-head layout the graph used
     (Reshape/Transpose/Reshape), and then `CollapseLayoutChain` folds that with the
     graph's own head-merging chain (``view(B,N,H,W,C).permute(0,2,3,1,4).reshape(B,H,W,-1)``
     is a plain Reshape of MHA's output): the per-head Transposes disappear.
  4. Bias: the Add operands along the path, broadcast, summed and reshaped to
     (B, N, S, T); for DirectML always expanded to exactly (B, N, S, T) (its kernel's
     only accepted shape), for CPU/CUDA the B and N axes may stay 1.
  5. A per-head tensor that something else also reads (SAM's rel-pos terms read q per head)
     is re-derived from Q3 (one Transpose of q alone) so the packed-qkv Transpose can go;
     undone if the model would end with more Transposes.  This is why a SAM block keeps
     one Transpose: MHA takes q token-major, the rel-pos MatMuls read it head-major.

  6. NaN guard: torch's dynamo exporter writes SDPA as ``Where(IsNaN(P), 0, P)`` before P.V
     (every Hugging Face model exported with ``dynamo=True``).  Softmax gives NaN only for a row
     that holds a NaN or +inf score or is -inf throughout, so for finite Q and K the guard is
     the identity unless a bias masks a whole row out; it is dropped when every bias term on the
     scores path is a constant with finite values only, and the site is declined (with that
     reason) when a bias is computed at run time (BERT's attention mask: a fully masked row is
     0 with the guard, and no longer guarded inside MultiHeadAttention).

Declined with a reason: symbolic shapes (freeze them first: ``--dim``), a Softmax not over
the last axis, ops other than Reshape/Add/scalar scale between the scores and the Softmax
(masks by Where, Casts), scale after a bias, probabilities read elsewhere, heads whose
layout needs a copy, element types other than float/float16, DirectML before ORT 1.15.
Option ``attention``: fuse | keep | auto (CUDA: keep in float32, fuse in float16; DirectML: fuse
from ORT 1.15; CPU: keep; measured where the target's provider is present).  CUDA keeps float32
attention because its float32 MHA with a full (B, N, S, T) bias gains nothing over MatMul+Softmax
(benchmarks/attention.py; figures in benchmarks/README.md); what fusing gains on DirectML (one MHA
operator instead of a block's chain of ops) is measured there with --tune.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir
import onnxscript.rewriter.rules.common as onnxscript_rules
from onnxscript.rewriter import pattern

from dmlopt.graph import shape_inference
from dmlopt.target import DEFAULT_TARGET
from dmlopt.passes._base import DmlPass, Option, SiteRule, apply_rules, remove_unused_nodes, restore
from dmlopt.passes._layout import CollapseLayoutChain, Cut, NotAView, View, ints, static_shape, trace
from dmlopt.passes._shared import Decline

MHA_SINCE_DML = (1, 15)
FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
MAX_PATH = 16


@dataclasses.dataclass
class Heads:
    """One of Q/K/V: the tensor it is cut from and how to get its (B, S, N*H) form.

    `head` is the per-head tensor (batch..., S, H) the graph computed, when there is one:
    if something besides the attention reads it (SAM's rel-pos terms read q), it is
    re-derived from the 3D form after fusion (case 5).
    """

    base: ir.Value
    cut: Cut
    head: ir.Value | None = None


@dataclasses.dataclass
class PathStep:
    kind: str  # "reshape" | "add"
    shape: list[int]  # the path's shape after this step
    bias: ir.Value | None = None


@dataclasses.dataclass
class Plan:
    q: Heads
    k: Heads
    v: Heads
    batch: int
    heads: int
    seq_q: int
    seq_kv: int
    head_v: int
    scale: float
    scores_shape: list[int]
    path: list[PathStep]
    out_shape: list[int]
    head_qk: int = 0


# ** analysis **

def _softmax_behind(probs: ir.Value) -> tuple[ir.Node, ir.Node | None] | None:
    """The Softmax that P comes from, directly or through one Reshape (a 4D Softmax, 3D P.V), and
    the NaN guard ``Where(IsNaN(P), 0, P)`` on its output, if there is one (case 6)."""
    node = probs.producer()
    if node is not None and node.op_type == "Reshape":
        node = node.inputs[0].producer()
    guard = node if _is_nan_guard(node) else None
    if guard is not None:
        node = guard.inputs[2].producer()
    if node is None or node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
        return None
    return node, guard


def _is_nan_guard(node: ir.Node | None) -> bool:
    """Whether `node` is ``Where(IsNaN(p), 0, p)``: NaN entries of p become 0, the others stay."""
    if node is None or node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
        return False
    condition, zero, p = node.inputs
    test = condition.producer() if condition is not None else None
    if test is None or test.op_type != "IsNaN" or test.domain not in ("", "ai.onnx") or test.inputs[0] is not p:
        return False
    if zero is None or zero.const_value is None or zero.const_value.size != 1:
        return False
    return float(zero.const_value.numpy().reshape(-1)[0]) == 0.0


def plan_attention(softmax: ir.Node, pv: ir.Node, opset: int, guard: ir.Node | None = None) -> Plan:
    """Check one Softmax -> MatMul(P, V) site (P perhaps behind a NaN guard, case 6); return how
    to fuse it or raise Decline."""
    probs = {softmax.outputs[0], pv.inputs[0]}
    if guard is not None:
        test = guard.inputs[0].producer()
        expected = {softmax.outputs[0]: {test, guard}, test.outputs[0]: {guard}, guard.outputs[0]: None}
        for value, readers in expected.items():
            if value.is_graph_output() or (readers is not None and {u for u, _ in value.uses()} != readers):
                raise Decline("attention probabilities are read elsewhere")
        probs = {guard.outputs[0], pv.inputs[0]}
    for value in probs:
        if len(value.uses()) != 1 or value.is_graph_output():
            raise Decline("attention probabilities are read elsewhere")
    in_shape = static_shape(softmax.inputs[0])
    if in_shape is None or static_shape(pv.outputs[0]) is None:
        raise Decline("shapes are not static (freeze the dims first, e.g. --dim batch=1)")
    axis = softmax.attributes.get_int("axis", -1 if opset >= 13 else 1) % len(in_shape)
    if axis != len(in_shape) - 1:
        raise Decline("Softmax is not over the last axis")
    scores_node, steps, path_scale = _walk_to_scores(softmax.inputs[0])
    q_value, k_value, k_plain, alpha = _scores_operands(scores_node)
    v_value = pv.inputs[1]
    shapes = [static_shape(v) for v in (q_value, k_value, v_value)]
    if any(s is None for s in shapes):
        raise Decline("Q/K/V shapes are not static")
    q_shape, k_shape, v_shape = shapes
    if not k_plain:  # MatMul(Qh, Kt): the operand is K transposed
        k_shape = k_shape[:-2] + [k_shape[-1], k_shape[-2]]
    if not (len(q_shape) == len(k_shape) == len(v_shape) >= 3):
        raise Decline("Q/K/V need a batch axis and equal ranks")
    batch_shape = q_shape[:-2]
    if k_shape[:-2] != batch_shape or v_shape[:-2] != batch_shape:
        raise Decline("Q, K and V batch axes differ (broadcast attention)")
    seq_q, head = q_shape[-2:]
    seq_kv = k_shape[-2]
    if k_shape[-1] != head or v_shape[-2] != seq_kv:
        raise Decline("Q/K/V sizes do not line up")
    if q_value.dtype not in FLOAT_TYPES:
        raise Decline(f"element type {q_value.dtype} (MultiHeadAttention takes float and float16)")
    try:
        q_base, q_view, q_scale = trace(q_value, through_scale=True, opset=opset)
        k_base, k_view, k_scale = trace(k_value, through_scale=True, opset=opset)
        v_base, v_view, _ = trace(v_value, opset=opset)
    except NotAView as e:
        raise Decline(f"heads layout: {e}") from e
    if not k_plain:
        n = len(k_view.axes)
        k_view = k_view.transpose(list(range(n - 2)) + [n - 1, n - 2])
    groups = math.prod(batch_shape)
    heads, cuts = _split_heads([q_view, k_view, v_view], len(batch_shape), groups)
    scores_shape = static_shape(scores_node.outputs[0])
    if static_shape(pv.inputs[0]) != scores_shape or static_shape(softmax.inputs[0])[-1] != scores_shape[-1]:
        raise Decline("the probabilities do not have the scores' shape")
    q_head = _head_value(q_value, q_shape, transposed=False)
    k_head = _head_value(k_value, k_shape, transposed=not k_plain)
    v_head = _head_value(v_value, v_shape, transposed=False)
    plan = Plan(Heads(q_base, cuts[0], q_head), Heads(k_base, cuts[1], k_head), Heads(v_base, cuts[2], v_head),
                groups // heads, heads,
                seq_q, seq_kv, v_shape[-1], q_scale * k_scale * alpha * path_scale, scores_shape, steps,
                static_shape(pv.outputs[0]), head_qk=head)
    _check_bias(plan, scores_node)
    if guard is not None:
        _check_guard_is_identity(plan)
    return plan


def _check_guard_is_identity(plan: Plan) -> None:
    """Case 6: the NaN guard may go only where no bias can mask a whole row out."""
    for step in plan.path:
        if step.kind != "add":
            continue
        if step.bias.const_value is None:
            raise Decline("the probabilities are guarded by Where(IsNaN(P), 0, P) and a bias is computed at run "
                          "time: a row it masks out entirely (all -inf) is 0 with the guard, which "
                          "MultiHeadAttention does not promise")
        if not np.isfinite(step.bias.const_value.numpy()).all():
            raise Decline("the probabilities are guarded by Where(IsNaN(P), 0, P) and a constant bias holds "
                          "non-finite values: a row it masks out entirely is 0 with the guard")


def _head_value(operand: ir.Value, head_shape: list[int], transposed: bool) -> ir.Value | None:
    """The per-head tensor behind a scores/PV operand: below scalar scales (and the K^T Transpose)."""
    value = operand
    for _ in range(MAX_PATH):
        node = value.producer()
        if node is not None and node.op_type in ("Mul", "Div") and _scalar(node) is not None:
            value = _scalar(node)[1]
        else:
            break
    if transposed:
        node = value.producer()
        perm = node.attributes.get_ints("perm", None) if node is not None and node.op_type == "Transpose" else None
        n = len(head_shape)
        if perm is None or list(perm) != list(range(n - 2)) + [n - 1, n - 2]:
            return None
        value = node.inputs[0]
    return value if static_shape(value) == head_shape else None


def _is_scores(node: ir.Node | None) -> bool:
    return node is not None and (
        (node.op_type == "MatMul" and node.domain in ("", "ai.onnx"))
        or (node.op_type == "FusedMatMul" and node.domain == "com.microsoft"))


def _walk_to_scores(value: ir.Value) -> tuple[ir.Node, list[PathStep], float]:
    """From the Softmax input up to the Q.K MatMul through Reshapes, bias Adds and scalar scales."""
    full = math.prod(static_shape(value))
    backward: list[PathStep] = []
    scale = 1.0
    current = value
    for _ in range(MAX_PATH):
        node = current.producer()
        if node is None:
            raise Decline("no Q.K MatMul before the Softmax")
        if backward and (len(current.uses()) != 1 or current.is_graph_output()):
            raise Decline(f"attention scores ({node.op_type} output) are read elsewhere")
        if _is_scores(node):
            return node, list(reversed(backward)), scale
        if node.op_type == "Reshape":
            backward.append(PathStep("reshape", static_shape(current)))
            current = node.inputs[0]
        elif node.op_type == "Add":
            if scale != 1.0:
                raise Decline("scale applied after a bias")
            on_path = [i for i in (0, 1) if _leads_to_scores(node.inputs[i], full)]
            if len(on_path) != 1:
                raise Decline("cannot tell the scores from the bias in an Add")
            backward.append(PathStep("add", static_shape(current), node.inputs[1 - on_path[0]]))
            current = node.inputs[on_path[0]]
        elif node.op_type in ("Mul", "Div"):
            factor = _scalar(node)
            if factor is None:
                raise Decline(f"{node.op_type} by a non-scalar between the scores and the Softmax")
            scale *= factor[0]
            current = factor[1]
        else:
            raise Decline(f"{node.op_type} between the scores and the Softmax")
        if static_shape(current) is None:
            raise Decline("shapes on the scores path are not static")
    raise Decline("scores path too long")


def _leads_to_scores(value: ir.Value | None, full: int) -> bool:
    """Whether `value` (the full scores size) comes from a MatMul through Reshape/Add/scale."""
    for _ in range(MAX_PATH):
        shape = static_shape(value)
        if shape is None or math.prod(shape) != full:
            return False
        node = value.producer()
        if _is_scores(node):
            return True
        if node is None or node.op_type not in ("Reshape", "Add", "Mul", "Div"):
            return False
        if node.op_type == "Add":
            return any(_leads_to_scores(v, full) for v in node.inputs)
        if node.op_type in ("Mul", "Div") and _scalar(node) is None:
            return False
        value = _scalar(node)[1] if node.op_type in ("Mul", "Div") else node.inputs[0]
    return False


def _scalar(node: ir.Node) -> tuple[float, ir.Value] | None:
    for i, v in enumerate(node.inputs):
        if v is not None and v.const_value is not None and v.const_value.size == 1:
            if node.op_type == "Div" and i == 0:
                return None
            c = float(v.const_value.numpy().reshape(-1)[0])
            return (c if node.op_type == "Mul" else 1.0 / c), node.inputs[1 - i]
    return None


def _scores_operands(node: ir.Node) -> tuple[ir.Value, ir.Value, bool, float]:
    """(q, k or k^T, whether it is k itself (FusedMatMul transB=1), alpha) of the scores product."""
    if node.op_type == "MatMul":
        return node.inputs[0], node.inputs[1], False, 1.0
    attrs = node.attributes
    if attrs.get_int("transA", 0) or attrs.get_int("transBatchA", 0) or attrs.get_int("transBatchB", 0):
        raise Decline("FusedMatMul with transA or batch transposes")
    return node.inputs[0], node.inputs[1], bool(attrs.get_int("transB", 0)), attrs.get_float("alpha", 1.0)


def _split_heads(views: list[View], n_batch: int, groups: int) -> tuple[int, list[Cut]]:
    """The head count N and the (B, S, N*H) cut of each of Q/K/V; raise Decline if none works."""
    candidates = {1}
    for view in views:
        product = 1
        for n, _ in reversed([d for axis in view.axes[:n_batch] for d in axis]):
            product *= n
            candidates.add(product)
    for heads in sorted((c for c in candidates if groups % c == 0), reverse=True):
        cuts = [_cut_3d(view, n_batch, heads) for view in views]
        if all(c is not None for c in cuts):
            return heads, cuts
    raise Decline("the heads' layout is not a slice of a (B, S, N*H) tensor (would need a copy)")


def _cut_3d(view: View, n_batch: int, heads: int) -> Cut | None:
    """The view as (B, S, N*H): split the batch sub-dims into B (outer) and N (inner) parts."""
    subdims = [d for axis in view.axes[:n_batch] for d in axis]
    n_part: list[tuple[int, int]] = []
    need = heads
    while need > 1:
        if not subdims:
            return None
        n, s = subdims.pop()
        if need % n == 0:
            n_part.insert(0, (n, s))
            need //= n
        elif n % need == 0:
            n_part.insert(0, (need, s))
            subdims.append((n // need, s * need))
            need = 1
        else:
            return None
    seq, head = view.axes[n_batch], view.axes[n_batch + 1]
    shape3 = [math.prod(n for n, _ in subdims), math.prod(n for n, _ in seq), heads * math.prod(n for n, _ in head)]
    cut = View(view.base_numel, view.offset, [subdims, seq, n_part + head]).cut()
    if cut is None:
        return None
    return dataclasses.replace(cut, shape=shape3)


def _check_bias(plan: Plan, scores_node: ir.Node) -> None:
    for step in plan.path:
        if step.kind != "add":
            continue
        if static_shape(step.bias) is None:
            raise Decline("bias shape is not static")
        if step.bias.dtype != scores_node.outputs[0].dtype:
            raise Decline("bias element type differs from the scores'")
        try:
            np.broadcast_shapes(tuple(static_shape(step.bias)), tuple(step.shape))
        except ValueError as e:
            raise Decline("bias does not broadcast against the scores") from e
        if _depends_on(step.bias, scores_node):
            raise Decline("bias is computed from the scores")


def _depends_on(value: ir.Value, node: ir.Node) -> bool:
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        producer = v.producer() if v is not None else None
        if producer is None or id(producer) in seen:
            continue
        if producer is node:
            return True
        seen.add(id(producer))
        stack.extend(producer.inputs)
    return False


# ** emitting **

def emit_bias(op, plan: Plan, full_heads: bool) -> ir.Value | None:
    """The Add operands of the path as one (B or 1, N or 1, S, T) tensor (case 4)."""
    acc, acc_shape = None, None
    shape = plan.scores_shape
    for step in plan.path:
        if step.kind == "reshape":
            if acc is not None:
                if acc_shape != shape:
                    acc = op.Expand(acc, ints(op, shape))
                acc, acc_shape = op.Reshape(acc, ints(op, step.shape)), step.shape
        else:
            b_shape = static_shape(step.bias)
            acc = step.bias if acc is None else op.Add(acc, step.bias)
            acc_shape = b_shape if acc_shape is None else list(np.broadcast_shapes(tuple(acc_shape), tuple(b_shape)))
        shape = step.shape
    if acc is None:
        return None
    target = [plan.batch, plan.heads, plan.seq_q, plan.seq_kv]
    padded = [1] * (len(shape) - len(acc_shape)) + list(acc_shape)
    if shape == target:  # the path ends in (B, N, S, T): expand only what MHA needs
        want = target if full_heads else [d if padded[i] != 1 or i >= 2 else 1 for i, d in enumerate(target)]
        if padded != want:
            return op.Expand(acc, ints(op, want))
        return acc if len(acc_shape) == 4 else op.Reshape(acc, ints(op, want))
    if padded != shape:  # another factorization (SAM's 5D view): materialize, then reshape
        acc = op.Expand(acc, ints(op, shape))
    return op.Reshape(acc, ints(op, target))


class FuseAttention(SiteRule):
    """``MatMul(Softmax(scores), v)`` with its Q.K product and head layouts -> MultiHeadAttention."""

    def __init__(self, owner: AttentionPass | None = None):
        super().__init__(owner, name="FuseAttention")
        self._plan: Plan | None = None

    def pattern(self, op, probs, v):
        # Only the P.V MatMul is matched: the Softmax and the scores are checked (and removed
        # once dead) here, so that a Softmax that cannot go is declined with its reason.
        return op.MatMul(probs, v, _outputs=["out"])

    def check(self, context, probs, v, out, **_):
        pv = out.producer()
        found = _softmax_behind(probs)
        if found is None:
            return self.decline(None, "not attention")
        softmax, guard = found
        try:
            self._plan = plan_attention(softmax, pv, context.model.opset_imports.get("", 17), guard)
        except Decline as e:
            return self.decline(pv, str(e))
        refused = self._kernel_refusal(self._plan, probs.dtype)
        if refused is not None:
            return self.decline(pv, refused)
        return pattern.MatchResult()

    def _kernel_refusal(self, plan: Plan, dtype) -> str | None:
        """The target EP's verdict on MultiHeadAttention at this site's shapes (EngineSettings.kernel_check),
        where the engine can ask it: WebGPU's MHA is wrong from 32 tokens on under lavapipe."""
        checker = self.owner.context.engine.kernel_check if self.owner is not None else None
        if checker is None:
            return None
        site = dict(batch=plan.batch, heads=plan.heads, seq_q=plan.seq_q, seq_kv=plan.seq_kv, head_qk=plan.head_qk,
                    head_v=plan.head_v, bias=any(step.kind == "add" for step in plan.path),
                    dtype="float16" if dtype == ir.DataType.FLOAT16 or self.owner.context.precision == "float16"
                    else "float32")
        return checker("MultiHeadAttention", site)

    def rewrite(self, op, probs, v, out, **_):
        plan = self._plan
        target = (self.owner.context.target if self.owner else DEFAULT_TARGET).ep
        q3 = plan.q.cut.emit(op, plan.q.base)
        k3 = plan.k.cut.emit(op, plan.k.base)
        v3 = plan.v.cut.emit(op, plan.v.base)
        bias = emit_bias(op, plan, full_heads=target == "dml")
        inputs = [q3, k3, v3] + ([None, None, bias] if bias is not None else [])
        fused = op.MultiHeadAttention(*inputs, num_heads=plan.heads, scale=float(plan.scale),
                                      _domain="com.microsoft")
        fused.shape = ir.Shape([plan.batch, plan.seq_q, plan.heads * plan.head_v])
        fused.dtype = out.dtype
        if self.owner is not None:
            for heads, value, seq in ((plan.q, q3, plan.seq_q), (plan.k, k3, plan.seq_kv), (plan.v, v3, plan.seq_kv)):
                if heads.head is not None:
                    self.owner.rewires.append((heads.head, value, [plan.batch, seq, plan.heads]))
        self.accepted(out.producer(), f"MultiHeadAttention: B={plan.batch} N={plan.heads} S={plan.seq_q} "
                                      f"T={plan.seq_kv}" + (" with attention_bias" if bias is not None else ""))
        if self.owner is not None:
            self.owner.new_nodes.update(id(n) for n in op.nodes)
        # Back into the per-head layout; CollapseLayoutChain then meets the graph's own
        # head-merging chain and both become one Reshape (case 3).
        if plan.heads == 1 or plan.seq_q == 1:
            return op.Reshape(fused, ints(op, plan.out_shape))
        per_head = op.Reshape(fused, ints(op, [plan.batch, plan.seq_q, plan.heads, plan.head_v]))
        per_head = op.Transpose(per_head, perm=[0, 2, 1, 3])
        return op.Reshape(per_head, ints(op, plan.out_shape))


def transposes_of_any_domain(model: ir.Model) -> int:
    """Transposes of every domain in every graph; unlike _layout.transpose_count (ONNX domain only), it
    also counts a contrib-domain Transpose, as this pass has always compared its rewire step by."""
    return sum(1 for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "Transpose")


class AttentionPass(DmlPass):
    """Fuse attention into com.microsoft MultiHeadAttention where the target supports it."""

    name = "attention"
    summary = "fuse scaled dot-product attention (with bias, e.g. SAM's rel-pos) into MultiHeadAttention"
    order = 60.0
    options = (
        Option("attention", "auto", "fuse attention into com.microsoft MultiHeadAttention, or keep it",
               choices=("auto", "fuse", "keep"), tunable=True,
               # webgpu: ORT runs no AttentionFusion for it although it has a MultiHeadAttention kernel; each
               # site is probed on the EP first where it runs (EngineSettings.kernel_check)
               auto_default={"dml": "fuse", "cuda": {"float32": "keep", "float16": "fuse"}, "cpu": "keep",
                             "webgpu": "fuse"},
               auto_default_source={
                   "cuda": "measured on an H200, onnxruntime-gpu 1.31, SAM ViT-B: fused MultiHeadAttention is "
                           "slower than MatMul+Softmax in float32 and faster in float16",
                   "dml": "one MultiHeadAttention operator instead of about ten per block",
                   "webgpu": "ORT does not fuse attention for WebGPU; sites the EP computes wrongly are declined"}),
    )

    needs_shapes = "onnx"

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        if self.resolved_option("attention") == "keep":
            return []
        return [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.op_type == "Softmax"]

    def skip(self, model: ir.Model, sites) -> bool:
        target = self.context.target
        if target.ep == "dml" and target.older_than(MHA_SINCE_DML):
            self.note(f"DirectML registers MultiHeadAttention from ORT 1.15; target is {target.ort_version}: "
                      "attention kept")
            return True
        if target.ep == "webgpu" and self.context.engine.kernel_check is None:
            self.note("sites not probed on a WebGPU adapter (none here, or --no-validate): some adapters compute "
                      "MultiHeadAttention wrongly from 32 tokens on; validate on the target (dmlopt validate --ep webgpu)")
        return False

    def rewrite(self, model: ir.Model) -> bool:
        """Fuse, then re-derive per-head tensors read outside attention; that second step alone is
        undone (back to the fused model) when it would add Transposes."""
        self.rewires, self.new_nodes = [], set()
        before = transposes_of_any_domain(model)
        if not apply_rules(model, [FuseAttention.rule(self)]):
            return False
        model.opset_imports.setdefault("com.microsoft", 1)
        remove_unused_nodes(model)
        fused = model.clone()
        rewired = self._rewire_heads(model)
        self._tidy(model)
        if rewired and transposes_of_any_domain(model) > before:
            restore(model, fused)
            self._tidy(model)
            self.note("per-head tensors read outside attention kept their original layout chain")
        elif rewired:
            self.note(f"{rewired} per-head tensors read outside attention (e.g. rel-pos terms) re-derived "
                      "from the fused inputs")
        return True

    def _tidy(self, model: ir.Model) -> None:
        """Fold the layout chains around the fused nodes (case 3)."""
        shape_inference.onnx_shape_inference(model)
        rules = [CollapseLayoutChain.rule(self, "Transpose"), CollapseLayoutChain.rule(self, "Reshape"),
                 onnxscript_rules.reshape_reshape_rule, onnxscript_rules.transpose_transpose_rule,
                 onnxscript_rules.no_op_transpose_rule]
        for _ in range(MAX_PATH):
            if not apply_rules(model, rules):
                break
        remove_unused_nodes(model)

    def _rewire_heads(self, model: ir.Model) -> int:
        """Case 5: a per-head tensor still read elsewhere is re-derived from MHA's 3D input.

        SAM's rel-pos terms read q per head; without this the whole packed-qkv Transpose
        stays alive for them.  Re-derived, only q moves (a third of the data) and the qkv
        Transpose goes.  Returns how many were re-derived.
        """
        count = 0
        for head, src, (batch, seq, heads) in self.rewires:
            uses = [u for u in head.uses() if id(u.node) not in self.new_nodes]
            if not uses or head.graph is None or head.is_graph_input() or head.const_value is not None:
                continue
            shape = static_shape(head)
            split_to = _int_constant([batch, seq, heads, shape[-1]])
            split = ir.node("Reshape", [src, split_to.outputs[0]])
            swap = ir.node("Transpose", [split.outputs[0]], {"perm": [0, 2, 1, 3]})
            merge_to = _int_constant(shape)
            back = ir.node("Reshape", [swap.outputs[0], merge_to.outputs[0]])
            back.outputs[0].shape, back.outputs[0].dtype = ir.Shape(shape), head.dtype
            head.graph.insert_before(uses[0].node, [split_to, split, swap, merge_to, back])
            for use in uses:
                use.node.replace_input_with(use.idx, back.outputs[0])
            head.graph.sort()
            count += 1
        remove_unused_nodes(model)
        return count


def _int_constant(values) -> ir.Node:
    return ir.node("Constant", [], {"value": ir.tensor(np.asarray(values, dtype=np.int64))})
