"""Where the WebGPU EP puts each node and which copies ORT adds, measured from the EP, and what
that means for graph capture.

Why measured: the EP claims every node it has a kernel for and then gives small shape chains back
to the CPU (``GetCpuPreferredNodes``, the same heuristic DirectML's placement uses), after ORT's
level-2 rewrites; the session's own verbose log (``VerifyEachNodeIsAssignedToAnEp``,
``transformer_memcpy``) says what happened, so no table is needed where the EP runs.  Where it
does not run, the answer is None with the reason: every command (inspect, bench, optimize) asks
this one function, so they give the same answer: measured where the EP runs, else predicted
(``predict``) from dmlopt's WebGPU table (``registry``: ops without a WebGPU kernel, GridSample's
versions), which is partial and says so; ``calibrate`` puts the two side by side where the EP runs.

Graph capture (``enableGraphCapture``, PRs #24900/#25367): ORT refuses it unless every node is on
the WebGPU EP with no Memcpy, no control flow; replay needs fixed input shapes.
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx
import onnx_ir as ir

from dmlopt.io import scratch
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import DmlOptError
from dmlopt.targets.graph_capture import Readiness, _blocker, _dynamic_inputs
from dmlopt.target import installed_ort_version
from dmlopt.targets.dml import ort_log
from dmlopt.runtime import vulkan as adapter
from dmlopt.targets.webgpu import registry
from dmlopt.runtime import webgpu_host as host

PROVIDER = host.PROVIDER
CONTROL_FLOW = ("If", "Loop", "Scan")


def measure(model: ir.Model, *, dims: Mapping[str, int] | None = None,
            provider_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Placement and copies of `model` in a WebGPU session as deployed (ORT_ENABLE_ALL), from its log:
    {measured, provider, adapter, nodes_by_provider, cpu_nodes [{op, name}], copies, reason}."""
    missing = runtime.webgpu_missing()
    if missing is not None:
        return {**predict(model), "reason": missing}
    try:
        with scratch.capture_stderr() as box:
            runtime.session(model, "webgpu", provider_options=provider_options, free_dims=dims, log_severity=0)
    except DmlOptError as e:
        return {**predict(model), "reason": f"the WebGPU session did not start: {e}"}
    placed = ort_log.parse_placements(box["text"])
    copies = [c for c in ort_log.parse_copies(box["text"]) if c["provider"] == PROVIDER]
    chosen, why = adapter.chosen()
    cpu = placed.get("CPUExecutionProvider", {"count": 0, "nodes": []})
    return {"measured": True, "provider": PROVIDER, "adapter": chosen.line() if chosen else f"unknown ({why})",
            "nodes_by_provider": {p: e["count"] for p, e in placed.items()},
            "cpu_nodes": cpu["nodes"], "copies": copies, "reason": None}


def _since(node: ir.Node, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain or "").since_version
    except onnx.defs.SchemaError:
        return None


def predict(model: ir.Model) -> dict[str, Any]:
    """Placement predicted from dmlopt's partial WebGPU table: a node lands on the CPU when its op has no
    WebGPU kernel (registry.NO_KERNEL) or its version is not registered (registry.REGISTERED_VERSIONS);
    ORT's CPU preference for small shape chains is not modelled.  Copies: CPU<->WebGPU edges."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    on_cpu: list[dict[str, str]] = []
    cpu_ids = set()
    nodes = [n for n in model.graph if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    for node in nodes:
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        versions = registry.REGISTERED_VERSIONS.get(key)
        if key in registry.NO_KERNEL or (versions is not None and _since(node, opset) not in versions):
            on_cpu.append({"op": node.op_type, "name": node.name or ""})
            cpu_ids.add(id(node))
    copies = []
    for node in nodes:
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is None or value.const_value is not None:
                continue
            if (id(producer) in cpu_ids) != (id(node) in cpu_ids):
                copies.append({"op": "MemcpyToHost" if id(node) in cpu_ids else "MemcpyFromHost",
                               "value": value.name, "provider": PROVIDER})
    unique = list({c["value"]: c for c in copies}.values())
    return {"measured": False, "predicted": True, "provider": PROVIDER, "adapter": None,
            "basis": "predicted from dmlopt's partial WebGPU table (ops without a kernel, GridSample versions); "
                     "ORT's CPU preference for shape chains is not modelled",
            "nodes_by_provider": {p: n for p, n in ((PROVIDER, len(nodes) - len(on_cpu)),
                                                    ("CPUExecutionProvider", len(on_cpu))) if n},
            "cpu_nodes": on_cpu, "copies": unique}


def calibrate(model: ir.Model, *, dims: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The prediction beside the measurement: which CPU nodes each names that the other does not.
    ORT's level-2 rewrites rename and fuse nodes before placement, so the comparison is by op type."""
    predicted = predict(model)
    measured = measure(model, dims=dims)
    if not measured.get("measured"):
        return {"predicted": predicted, "measured": measured, "agree": None,
                "reason": f"not measured: {measured.get('reason')}"}

    def ops(found):
        counts: dict[str, int] = {}
        for n in found["cpu_nodes"]:
            counts[n["op"]] = counts.get(n["op"], 0) + 1
        return counts

    want, got = ops(predicted), ops(measured)
    missed = {op: n - want.get(op, 0) for op, n in got.items() if n > want.get(op, 0)}
    extra = {op: n - got.get(op, 0) for op, n in want.items() if n > got.get(op, 0)}
    return {"predicted": predicted, "measured": measured, "agree": not missed and not extra,
            "cpu_ops_missed_by_prediction": missed, "cpu_ops_predicted_wrongly": extra,
            "copies": {"predicted": len(predicted["copies"]), "measured": len(measured["copies"])}}


def calibration_table(result: Mapping[str, Any]) -> str:
    if result["agree"] is None:
        return f"WebGPU calibration: {result['reason']}\n{summary(result['predicted'])}"
    verdict = "prediction agrees with the EP" if result["agree"] else "prediction differs from the EP"
    lines = [f"WebGPU calibration: {verdict}", summary(result["measured"]), summary(result["predicted"])]
    for key, label in (("cpu_ops_missed_by_prediction", "on the CPU but not predicted"),
                       ("cpu_ops_predicted_wrongly", "predicted on the CPU but on WebGPU")):
        if result[key]:
            lines.append(f"  {label}: " + ", ".join(f"{op} x{n}" for op, n in result[key].items()))
    return "\n".join(lines)


def readiness(model: ir.Model, measured: Mapping[str, Any]) -> Readiness:
    """Graph-capture readiness on WebGPU from `measured` (the answer of `measure`)."""
    version = installed_ort_version() or "unknown"
    blockers: list[dict[str, Any]] = []
    control = [n.name or n.op_type for n in model.graph if n.op_type in CONTROL_FLOW]
    if control:
        blockers.append(_blocker("control_flow", f"{len(control)} control-flow node(s)",
                                 "ORT refuses graph capture with If/Loop/Scan in the graph", control, known=True))
    known = bool(measured.get("measured"))  # a measured placement is ORT's own answer
    basis = (f"placement measured on the WebGPU EP ({measured['adapter']})" if known
             else f"placement predicted (not measured: {measured.get('reason')})")
    cpu = [f"{n['op']} ({n['name']})" for n in measured["cpu_nodes"]]
    if cpu:
        blockers.append(_blocker("cpu_nodes", f"{len(cpu)} node(s) on the CPU",
                                 "ORT captures only when every node is on the WebGPU EP", cpu, known=known))
    if measured["copies"]:
        blockers.append(_blocker("copies", f"{len(measured['copies'])} copies between CPU and GPU",
                                 "a Memcpy node makes ORT refuse graph capture",
                                 [c["value"] for c in measured["copies"]], known=known))
    blockers.extend(_dynamic_inputs(model))
    return Readiness("webgpu", version, basis, blockers, [])


def summary(measured: Mapping[str, Any]) -> str:
    """One line for inspect and the report."""
    counts = ", ".join(f"{n} on {p}" for p, n in measured["nodes_by_provider"].items())
    how = (f"measured, {measured['adapter']}" if measured.get("measured")
           else "predicted from dmlopt's partial table"
           + (f"; not measured: {measured['reason']}" if measured.get("reason") else ""))
    return f"WebGPU placement ({how}): {counts}; {len(measured['copies'])} CPU<->GPU copies"
