"""`dmlopt inspect`: what a model is and what dmlopt's passes would look at in it.

Counts go over every graph (If/Loop/Scan bodies included), so a user sees the shape
arithmetic and control flow that keep DirectML from compiling the graph.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from dmlopt.graph import input_sizes
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import printable, printable_tree
from dmlopt.targets.dml import placement
from dmlopt.targets.webgpu import placement as webgpu_placement
from dmlopt.targets.graph_capture import graph_capture_readiness
from dmlopt.graph.check import describe_values, has_subgraphs, op_counts
from dmlopt.io.model import ModelLike, check_input, initializer_bytes, load
from dmlopt.io.tables import format_table
from dmlopt.runtime.validate import shapes_text
from dmlopt.target import Target

SHAPE_OPS = {"Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Range", "ConstantOfShape",
             "Cast", "Add", "Sub", "Mul", "Div", "Mod", "Equal", "Where", "Expand", "Reshape"}
LINEAR = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# Attention already fused into one op (the attention pass leaves these as they are).
FUSED_ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention"}
# Ops between an attention Softmax and the MatMul that applies it to the values.
SOFTMAX_TO_MATMUL = {"Cast", "Dropout", "Identity"}


def _feeds_matmul(softmax: ir.Node) -> bool:
    """Whether the Softmax's probabilities reach a MatMul (Q K^T -> Softmax -> @ V): an attention site."""
    todo, seen = [softmax], set()
    while todo:
        node = todo.pop()
        for out in node.outputs:
            for user, _ in out.uses():
                if user.op_type == "MatMul":
                    return True
                if user.op_type in SOFTMAX_TO_MATMUL and id(user) not in seen:
                    seen.add(id(user))
                    todo.append(user)
    return False


def _producer(value: ir.Value | None) -> ir.Node | None:
    return value.producer() if value is not None else None


def shape_arithmetic_nodes(model: ir.Model) -> list[ir.Node]:
    """Nodes that compute from Shape/Size outputs only: what freezing shapes would fold."""
    shape_derived: set[int] = set()
    found = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in ("Shape", "Size"):
            found.append(node)
            shape_derived.update(id(o) for o in node.outputs)
            continue
        if node.op_type in SHAPE_OPS and any(id(i) in shape_derived for i in node.inputs if i is not None):
            if all(i is None or id(i) in shape_derived or i.const_value is not None
                   or (i.producer() is not None and i.producer().op_type == "Constant") for i in node.inputs):
                found.append(node)
                shape_derived.update(id(o) for o in node.outputs)
    return found


def inspect(model: ModelLike, *, ep: str | None = None, ort_version: str | None = None) -> dict[str, Any]:
    """A JSON-ready description of the model (and, with ep='dml', its predicted placement)."""
    target = Target.resolve("dml", ort_version)  # the DirectML table the predictions read
    m = load(model)
    check_input(m)  # refuse what no runtime can load (cycles, undefined values, unknown opsets)
    counts = op_counts(m)
    nodes = list(ir.traversal.RecursiveGraphIterator(m.graph))
    leaky_sites, prelu, einsums, control, attention, conv_transpose = [], [], [], [], [], []
    for node in nodes:
        if node.op_type == "LeakyRelu":
            prod = _producer(node.inputs[0])
            if prod is not None and prod.op_type in LINEAR:
                alpha = node.attributes.get("alpha")
                leaky_sites.append({"node": node.name, "producer": prod.op_type, "producer_node": prod.name,
                                    "alpha": alpha.as_float() if alpha is not None else 0.01})
        elif node.op_type == "PRelu":
            prelu.append(node.name)
        elif node.op_type == "Einsum":
            eq = node.attributes.get("equation")
            einsums.append({"node": node.name, "equation": eq.as_string() if eq is not None else None})
        elif node.op_type in FUSED_ATTENTION or node.op_type == "Softmax" and _feeds_matmul(node):
            attention.append({"node": node.name, "op": node.op_type})
        elif node.op_type == "ConvTranspose":
            strides = node.attributes.get("strides")
            conv_transpose.append({"node": node.name, "strides": strides.as_ints() if strides is not None else None})
        elif has_subgraphs(node):
            control.append({"node": node.name, "op": node.op_type})
    load_problem = runtime.load_problem(m)
    free_dims = sorted({d.value for v in m.graph.inputs if v.shape is not None for d in v.shape.dims
                        if not isinstance(d, int) and getattr(d, "value", None)})
    info: dict[str, Any] = {
        "ort_cannot_load": load_problem,  # None: ONNX Runtime loads it (CPU EP, this build)
        "inputs": describe_values([v for v in m.graph.inputs if v.name not in m.graph.initializers]),
        "outputs": describe_values(m.graph.outputs),
        "free_dims": free_dims,
        "opsets": dict(sorted(m.opset_imports.items())),
        "ir_version": m.ir_version,
        "producer": f"{m.producer_name or ''} {m.producer_version or ''}".strip(),
        "nodes": len(nodes),
        "op_counts": counts,
        "initializer_bytes": initializer_bytes(m),
        "sites": {
            "conv_leaky_relu": leaky_sites,
            "prelu": prelu,
            "einsum": einsums,
            "attention": attention,
            "conv_transpose": conv_transpose,
            "shape_arithmetic": len(shape_arithmetic_nodes(m)),
            "control_flow": control,
        },
    }
    try:  # what validation and timing would feed without --shape/--dim
        sizes = input_sizes.choose(m)
        info["validation_inputs"] = {"shapes": sizes.shapes, "basis": sizes.basis, "refused": None}
    except input_sizes.FreeDims as e:
        info["validation_inputs"] = {"shapes": None, "basis": [], "refused": str(e)}
    predicted = None
    prepared = placement.prepare(m)  # one copy serves the prediction and the readiness walk (both only read it)
    if ep == "dml":
        predicted = placement.predict(m, ort_version=target.ort_version, prepared=prepared)  # names the asked version
        info["placement"] = predicted.to_dict()
    elif ep == "webgpu":  # measured on the EP, as optimize --target webgpu measures it
        measured = webgpu_placement.measure(m)
        info["webgpu_placement"] = measured
        info["graph_capture"] = webgpu_placement.readiness(m, measured).to_dict()
        return info
    info["graph_capture"] = graph_capture_readiness(m, target, placement=predicted, prepared=prepared).to_dict()
    return info


def to_table(info: dict[str, Any]) -> str:
    """The description for a terminal.  Every name is escaped first (printable_tree): a tensor
    called "x\\n..." or holding terminal control codes must not forge a line or recolour it."""
    problem = info.get("ort_cannot_load")
    info = printable_tree(info)
    lines = []
    if problem:  # first, whole (ORT's sentence, escaped, not cut): the placement below is moot
        lines.append(f"ONNX Runtime {runtime.ort().__version__} cannot load this model (not a DirectML fallback: no "
                     f"provider runs it without a custom-op library that registers it): {printable(problem)}")
    for kind in ("inputs", "outputs"):
        for v in info[kind]:
            shape = "x".join(str(d) for d in v["shape"]) if v["shape"] is not None else "?"
            lines.append(f"{kind[:-1]:<7} {v['name']}: {v['dtype']} [{shape}]")
    if info["free_dims"]:
        lines.append(f"free dims: {', '.join(info['free_dims'])} (freeze with --shape or --dim NAME=VALUE)")
    chosen = info.get("validation_inputs")
    if chosen and chosen["shapes"] is not None and chosen["basis"]:
        lines.append(f"validated and timed by default on: {shapes_text(chosen['shapes'], chosen['basis'])}")
    elif chosen and chosen["refused"]:
        lines.append(f"validation and timing need sizes: {chosen['refused']}")
    lines.append("opsets: " + ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in info["opsets"].items()))
    lines.append(f"nodes: {info['nodes']}   initializers: {info['initializer_bytes'] / 2**20:.2f} MiB")
    lines.append("")
    rows = [("op", "count")] + [(op, n) for op, n in sorted(info["op_counts"].items(), key=lambda kv: -kv[1])]
    lines.append(format_table(rows))
    s = info["sites"]
    lines.append("")
    lines.append("what the passes would look at:")
    lines.append(f"  Conv/ConvTranspose/Gemm/MatMul + LeakyRelu: {len(s['conv_leaky_relu'])}")
    lines.append(f"  PRelu: {len(s['prelu'])}")
    eqs = sorted({e['equation'] for e in s['einsum'] if e['equation']})
    lines.append(f"  Einsum: {len(s['einsum'])}" + (f" ({', '.join(eqs)})" if eqs else ""))
    lines.append(f"  attention (Softmax into MatMul, or fused): {len(s['attention'])}")
    strides = sorted({tuple(c["strides"]) for c in s["conv_transpose"] if c["strides"]})
    lines.append(f"  ConvTranspose: {len(s['conv_transpose'])}"
                 + (f" (strides {', '.join('x'.join(map(str, t)) for t in strides)})" if strides else ""))
    lines.append(f"  shape-arithmetic nodes: {s['shape_arithmetic']}")
    lines.append(f"  If/Loop/Scan: {len(s['control_flow'])}")
    if "webgpu_placement" in info:
        lines.append(webgpu_placement.summary(info["webgpu_placement"]))
    if "graph_capture" in info:
        lines.append(info["graph_capture"]["line"])
    if "placement" in info:
        lines.append("")
        lines.append(placement.summary_table(info["placement"]))
    return "\n".join(lines)
