"""Where the WebGPU EP puts each node and which copies ORT adds, measured from the EP, and what
that means for graph capture.

Why measured: the EP claims every node it has a kernel for and then gives small shape chains back
to the CPU (``GetCpuPreferredNodes``, the same heuristic DirectML's placement uses), after ORT's
level-2 rewrites; the session's own verbose log (``VerifyEachNodeIsAssignedToAnEp``,
``transformer_memcpy``) says what happened, so no table is needed where the EP runs.  Where it
does not run, the answer is None with the reason: every command (inspect, bench, optimize) asks
this one function, so they give the same answer.

Graph capture (``enableGraphCapture``, PRs #24900/#25367): ORT refuses it unless every node is on
the WebGPU EP with no Memcpy, no control flow; replay needs fixed input shapes.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import onnx_ir as ir

from dmlopt import runtime
from dmlopt.errors import DmlOptError
from dmlopt.graph_capture import Readiness, _blocker, _dynamic_inputs
from dmlopt.target import installed_ort_version
from dmlopt.targets.dml import ort_log
from dmlopt.targets.webgpu import adapter, host

PROVIDER = host.PROVIDER
CONTROL_FLOW = ("If", "Loop", "Scan")


def measure(model: ir.Model, *, dims: Mapping[str, int] | None = None,
            provider_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Placement and copies of `model` in a WebGPU session as deployed (ORT_ENABLE_ALL), from its log:
    {measured, provider, adapter, nodes_by_provider, cpu_nodes [{op, name}], copies, reason}."""
    if not runtime.has_target("webgpu"):
        return {"measured": False, "reason": runtime.webgpu_missing()}
    try:
        with ort_log.capture_stderr() as box:
            runtime.session(model, "webgpu", provider_options=provider_options, free_dims=dims, log_severity=0)
    except DmlOptError as e:
        return {"measured": False, "reason": f"the WebGPU session did not start: {e}"}
    placed = ort_log.parse_placements(box["text"])
    copies = [c for c in ort_log.parse_copies(box["text"]) if c["provider"] == PROVIDER]
    chosen, why = adapter.chosen()
    cpu = placed.get("CPUExecutionProvider", {"count": 0, "nodes": []})
    return {"measured": True, "provider": PROVIDER, "adapter": chosen.line() if chosen else f"unknown ({why})",
            "nodes_by_provider": {p: e["count"] for p, e in placed.items()},
            "cpu_nodes": cpu["nodes"], "copies": copies, "reason": None}


def readiness(model: ir.Model, measured: Mapping[str, Any]) -> Readiness:
    """Graph-capture readiness on WebGPU from `measured` (the answer of `measure`)."""
    version = installed_ort_version() or "unknown"
    blockers: list[dict[str, Any]] = []
    control = [n.name or n.op_type for n in model.graph if n.op_type in CONTROL_FLOW]
    if control:
        blockers.append(_blocker("control_flow", f"{len(control)} control-flow node(s)",
                                 "ORT refuses graph capture with If/Loop/Scan in the graph", control, known=True))
    if not measured.get("measured"):
        basis = f"placement not measured: {measured.get('reason')}"
        blockers.append(_blocker("placement_unknown", "placement on WebGPU not measured here",
                                 f"{measured.get('reason')}; run dmlopt where the WebGPU EP runs", [], known=False))
    else:
        basis = f"placement measured on the WebGPU EP ({measured['adapter']})"
        cpu = [f"{n['op']} ({n['name']})" for n in measured["cpu_nodes"]]
        if cpu:
            blockers.append(_blocker("cpu_nodes", f"{len(cpu)} node(s) on the CPU",
                                     "ORT captures only when every node is on the WebGPU EP", cpu, known=True))
        if measured["copies"]:
            blockers.append(_blocker("copies", f"{len(measured['copies'])} copies between CPU and GPU",
                                     "a Memcpy node makes ORT refuse graph capture",
                                     [c["value"] for c in measured["copies"]], known=True))
    blockers.extend(_dynamic_inputs(model))
    return Readiness("webgpu", version, basis, blockers, [])


def summary(measured: Mapping[str, Any]) -> str:
    """One line for inspect and the report."""
    if not measured.get("measured"):
        return f"WebGPU placement: not measured ({measured.get('reason')})"
    counts = ", ".join(f"{n} on {p}" for p, n in measured["nodes_by_provider"].items())
    return (f"WebGPU placement (measured, {measured['adapter']}): {counts}; "
            f"{len(measured['copies'])} CPU<->GPU copies")
