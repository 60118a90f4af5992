"""Graph-capture readiness: can ONNX Runtime record one run of the model as a GPU graph and
replay it (DirectML's ``ep.dml.enable_graph_capture``, CUDA's ``enable_cuda_graph``), and
what stops it.

Why: replay skips ORT's per-node dispatch, which is where small models and big models with
many small nodes lose time; but a session asked for capture on a model that does not
qualify fails to load, and one whose shapes change replays wrong results.  The rules follow
ORT's own check at session initialization (``inference_session.cc``, the graph-capture EP
selection: ``HasControlflowNodes``, ``AreAllComputeNodesAssignedTo...Ep``, ``HasMemcpyNodes``,
``HasShapeSubgraphNodes``) and what replay implies:

1. No node with a subgraph (If/Loop/Scan) in the main graph: ORT refuses the session.
2. Every node on the capturing EP or the CPU EP and no Memcpy node: a CPU node that exchanges
   data with the GPU (a copy either way) makes ORT refuse the session.  CPU nodes without
   copies (shape arithmetic on CPU tensors) are allowed with a warning: replay does not run
   them again, so their results must not change.
3. Replay reuses the recorded sizes and addresses: every input dimension must be fixed (IO
   binding at fixed device addresses is the caller's part) and no value may have a
   data-dependent shape (NonZero, Unique, a Reshape to computed sizes...).
4. A graph output computed on the CPU would not be recomputed by replay.

Where the placement comes from, said in ``basis``: DirectML uses dmlopt's placement model of
the ORT version (a prediction); CUDA uses this onnxruntime build's kernel registry when it is
a CUDA build (which ops have a CUDA kernel is then known; types, CPU-memory inputs and the
copies that follow are predicted), and is left unchecked otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys
from typing import Any

import onnx_ir as ir

from dmlopt.targets.dml import placement as placement_mod
from dmlopt.runtime import sessions as runtime
from dmlopt.target import Target, parse_version
from dmlopt.errors import UsageError

__all__ = ["Readiness", "graph_capture_readiness", "DML_CAPTURE_SINCE"]

PROVIDER_NAMES = {"dml": "DirectML", "cuda": "CUDA", "webgpu": "WebGPU"}
# ep.dml.enable_graph_capture is in the ORT sources from the 1.18 era on (dmlopt's reading of the
# source history; not verified against each release).  Older runtimes ignore the key.
DML_CAPTURE_SINCE = (1, 18)
NAMES_SHOWN = 3


@dataclasses.dataclass
class Readiness:
    """The answer of `graph_capture_readiness`; ``line()`` is what inspect and the report print."""

    target: str
    ort_version: str
    basis: str
    blockers: list[dict[str, Any]]
    warnings: list[str]

    @property
    def ready(self) -> bool:
        return not self.blockers

    @property
    def provider(self) -> str:
        return PROVIDER_NAMES[self.target]

    def line(self) -> str:
        head = f"graph capture ({self.provider}, ORT {self.ort_version}): "
        if self.ready:
            return head + "ready" + ("" if "predicted" in self.basis or "registry" in self.basis
                                     else f" ({self.basis})")
        return head + "not ready: " + "; ".join(b["summary"] for b in self.blockers)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "provider": self.provider, "ort_version": self.ort_version,
                "ready": self.ready, "line": self.line(), "basis": self.basis,
                "blockers": self.blockers, "warnings": self.warnings}


# Blockers that rest on the predicted placement: a measurement on the real EP replaces them.
PLACEMENT_KINDS = ("copies", "cpu_output")


def with_measured_placement(readiness: Readiness, measured: dict[str, Any], ort_version: str) -> Readiness:
    """`readiness` with the real DirectML EP's answer instead of the prediction's (CPU nodes and
    copies measured on ORT `ort_version`): where the real EP ran, it decides graph capture."""
    if readiness.target != "dml" or not measured.get("found"):
        return readiness
    blockers = [b for b in readiness.blockers if b["kind"] not in PLACEMENT_KINDS]
    cpu, copies = measured.get("cpu_nodes") or 0, measured.get("copies") or 0
    if copies:
        names = measured.get("cpu_node_names") or []
        blockers.append(_blocker("copies", f"{cpu} nodes on CPU (measured), {copies} copies",
                                 "ORT refuses graph capture where a node on the CPU exchanges data with the GPU "
                                 "(Memcpy)", names, known=True))
    elif cpu:
        readiness.warnings.append(f"{cpu} nodes on the CPU without copies (measured): replay does not rerun them")
    return dataclasses.replace(readiness, blockers=blockers,
                               basis=f"DirectML placement measured on the real EP (ORT {ort_version})")


def graph_capture_readiness(model: ir.Model, target: Target | str = "dml", ort_version: str | None = None, *,
                            placement: placement_mod.Placement | None = None,
                            prepared: tuple[ir.Model, int] | None = None) -> Readiness:
    """Whether `model` qualifies for graph capture on `target` ('dml' or 'cuda') under ONNX
    Runtime `ort_version` (None: the newest DirectML table / this build for CUDA).

    A resolved `Target` gives its `predicted_version` (its DirectML table; for CUDA the version asked for).
    `placement` reuses a DirectML prediction already made for the same model and version;
    `prepared` reuses `placement.prepare(model)` (only read here)."""
    if isinstance(target, Target):
        target, ort_version = target.ep, target.predicted_version
    if target not in PROVIDER_NAMES:
        raise UsageError(f"graph capture applies to DirectML (dml) and CUDA (cuda), not '{target}'")
    if prepared is None:  # once: the prediction below reads the same copy
        prepared = placement_mod.prepare(model)
    work = prepared[0]
    nodes = [n for n in work.graph if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    labels = {id(n): placement_mod.node_label(n, i) for i, n in enumerate(nodes)}
    blockers: list[dict[str, Any]] = []
    warnings: list[str] = []
    if target == "dml":
        predicted = placement or placement_mod.predict(model, ort_version=ort_version, prepared=prepared)
        version, basis = predicted.ort_version, f"DirectML placement predicted by the ORT {predicted.ort_version} table"
        if parse_version(version)[:2] < DML_CAPTURE_SINCE:
            since = ".".join(map(str, DML_CAPTURE_SINCE))
            blockers.append(_blocker("ort_version", f"no DirectML graph capture before ORT {since}",
                                     f"ep.dml.enable_graph_capture appears in the ORT sources around {since}; "
                                     "older runtimes ignore the key", [], known=False))
        cpu = {c["node"]: c for c in predicted.cpu_nodes if "graph" not in c}
        edges = [e for e in predicted.memcpy["edges"] if e["graph"] is None]
    else:
        version, basis, cpu, edges = _cuda_placement(work, nodes, labels, ort_version)
    blockers.extend(_control_flow(nodes, labels))
    blockers.extend(_copies(edges, cpu))
    blockers.extend(_cpu_outputs(work, nodes, labels, cpu))
    dynamic = _dynamic_inputs(work)
    blockers.extend(dynamic)
    if dynamic:  # shapes downstream of a dynamic input are dynamic too: data-dependence shows once frozen
        warnings.append("data-dependent shapes are checked once every input shape is static")
    else:
        blockers.extend(_data_dependent(nodes, labels))
    quiet_cpu = [name for name in cpu if not any(name in _edge_nodes(e) for e in edges)]
    if quiet_cpu:
        warnings.append(f"{len(quiet_cpu)} nodes run on the CPU without copies ({_names(quiet_cpu)}): ORT "
                        "allows them but replay does not rerun them, so their results must not depend on "
                        "the inputs' values")
    unknown = [labels[id(n)] for n in nodes if any(v is not None and v.name and v.shape is None
                                                     for v in n.outputs)]
    if unknown:
        warnings.append(f"{len(unknown)} nodes have outputs whose shape was not inferred offline "
                        f"({_names(unknown)}): their shapes are not checked")
    if target == "dml" and not blockers:
        warnings.append("run with IO binding: inputs and outputs bound to DirectML memory at fixed addresses")
    return Readiness(target=target, ort_version=version, basis=basis, blockers=blockers, warnings=warnings)


def _blocker(kind: str, summary: str, detail: str, nodes: list[str], *, known: bool, **extra: Any) -> dict[str, Any]:
    """`summary` goes on the one line; `known`: ORT's own check refuses this (False: it rests on a
    predicted placement or on what replay implies)."""
    return {"kind": kind, "summary": summary, "detail": detail, "nodes": nodes, "known": known, **extra}


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown + (", ..." if len(names) > NAMES_SHOWN else "")


def _control_flow(nodes: list[ir.Node], labels: dict[int, str]) -> list[dict[str, Any]]:
    found = [labels[id(n)] for n in nodes if placement_mod.graph_attributes(n)]
    if not found:
        return []
    return [_blocker("control_flow", f"{len(found)} If/Loop/Scan ({_names(found)})",
                     "ORT refuses graph capture for a model with control flow nodes", found, known=True)]


def _edge_nodes(edge: dict[str, Any]) -> list[str]:
    return [edge["producer"], *edge["consumers"]]


def _copies(edges: list[dict[str, Any]], cpu: dict[str, Any]) -> list[dict[str, Any]]:
    """One blocker for all copies: ORT's check fails on any Memcpy node."""
    if not edges:
        return []
    cpu_side = []
    for e in edges:
        side = e["consumers"] if e["direction"] == "to_host" else [e["producer"]]
        for name in side:
            if name not in cpu_side:
                cpu_side.append(name)
    inputs = [n[len("<input "):-1] for n in cpu_side if n.startswith("<input ")]
    cpu_nodes = [n for n in cpu_side if not n.startswith("<input ")]
    parts = []
    if cpu_nodes:
        parts.append(f"{len(cpu_nodes)} nodes on CPU ({_names(cpu_nodes)})")
    if inputs:
        parts.append(f"input {', '.join(repr(i) for i in inputs[:NAMES_SHOWN])} read on CPU and GPU")
    reads = sum(1 for e in edges if e["direction"] == "to_host")
    return [_blocker("copies", f"{' and '.join(parts)}, {len(edges)} copies",
                     f"{len(edges)} values cross between CPU and GPU ({reads} read back to the host); ORT refuses "
                     "graph capture when the graph has Memcpy nodes", cpu_nodes, known=False,
                     values=[e["value"] for e in edges],
                     reasons={n: cpu[n]["reason"] for n in cpu_nodes if n in cpu and cpu[n].get("reason")})]


def _cpu_outputs(work: ir.Model, nodes: list[ir.Node], labels: dict[int, str],
                 cpu: dict[str, Any]) -> list[dict[str, Any]]:
    outputs = {id(v) for v in work.graph.outputs}
    found = [labels[id(n)] for n in nodes if labels[id(n)] in cpu and any(id(o) in outputs for o in n.outputs)]
    if not found:
        return []
    return [_blocker("cpu_output", f"{len(found)} outputs computed on CPU ({_names(found)})",
                     "replay runs only the captured GPU work: outputs computed on the CPU would not be recomputed",
                     found, known=False)]


def _dynamic_inputs(work: ir.Model) -> list[dict[str, Any]]:
    dims: list[str] = []
    inputs: list[str] = []
    for v in work.graph.inputs:
        if v.name in work.graph.initializers or v.shape is None:
            if v.shape is None and v.name not in work.graph.initializers:
                inputs.append(v.name)
            continue
        for d in v.shape.dims:
            if not isinstance(d, int):
                name = getattr(d, "value", None)
                if name and name not in dims:
                    dims.append(name)
                elif not name and v.name not in inputs:
                    inputs.append(v.name)
    found = []
    if dims:
        found.append(_blocker("dynamic_dims", "dynamic " + ", ".join(f"dim '{d}'" for d in dims),
                              "a captured graph replays the recorded sizes: freeze the dims (--dim NAME=VALUE) "
                              "or set free-dimension overrides", [], known=False, dims=dims))
    if inputs:
        found.append(_blocker("dynamic_inputs", f"unknown shape of input {', '.join(inputs[:NAMES_SHOWN])}",
                              "inputs whose dims are unnamed or missing: freeze them with --shape", [],
                              known=False, inputs=inputs))
    return found


def _data_dependent(nodes: list[ir.Node], labels: dict[int, str]) -> list[dict[str, Any]]:
    """Nodes whose inputs all have static shapes but whose outputs do not: sizes set by data."""
    found = []
    for n in nodes:
        inputs = [v for v in n.inputs if v is not None and v.name]
        outputs = [v for v in n.outputs if v is not None and v.name and v.shape is not None]
        if not outputs or placement_mod.graph_attributes(n):
            continue
        if all(placement_mod.static_shape(v) is not None for v in inputs) and \
                any(placement_mod.static_shape(v) is None for v in outputs):
            found.append(labels[id(n)])
    if not found:
        return []
    return [_blocker("data_dependent_shape", f"{len(found)} data-dependent shapes ({_names(found)})",
                     "these nodes' output sizes depend on input values; a captured graph keeps the recorded sizes",
                     found, known=False)]


# -- CUDA -------------------------------------------------------------------------------------

# Run in a child process: on onnxruntime-gpu builds the registry query loads every provider library,
# and where one is missing (TensorRT's, as a plain pip install leaves it) it crashes the process.
_KERNEL_QUERY = """import json, sys
from onnxruntime.capi import onnxruntime_pybind11_state as capi
json.dump([[k.domain, k.op_name, list(k.version_range)] for k in capi.get_all_opkernel_def()
           if k.provider == "CUDAExecutionProvider"], sys.stdout)
"""


def _query_cuda_kernels(code: str) -> dict[tuple[str, str], list[tuple[int, int]]] | str:
    """(domain, op) -> since-version ranges of CUDA kernels, printed as JSON by `code` in a child
    process; or why there are none (a crash of the query cannot end this process)."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env=runtime.child_environment())
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the kernel registry query did not finish ({type(e).__name__})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the kernel registry query failed (exit {done.returncode}: {last[:200]})"
    try:
        rows = json.loads(done.stdout)
    except ValueError:
        return "the kernel registry query printed no kernel list"
    found: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for domain, op, (lo, hi) in rows:
        found.setdefault((placement_mod.canonical_domain(domain), op), []).append((int(lo), int(hi)))
    return found or "this onnxruntime build has no CUDA kernels (install onnxruntime-gpu)"


@functools.lru_cache(maxsize=1)
def _cuda_kernels() -> dict[tuple[str, str], list[tuple[int, int]]] | str:
    """This onnxruntime build's CUDA kernels (once a process), or why they are unknown."""
    return _query_cuda_kernels(_KERNEL_QUERY)


def _ort_build_version() -> str:
    try:
        return ".".join(runtime.ort().__version__.split(".")[:2])  # no onnxruntime gives "?"
    except Exception:  # noqa: BLE001
        return "?"


def _cuda_placement(work: ir.Model, nodes: list[ir.Node], labels: dict[int, str], ort_version: str | None):
    """(version, basis, cpu nodes, copy edges) for the CUDA EP, from this build's kernel registry."""
    build = _ort_build_version()
    kernels = _cuda_kernels()
    if isinstance(kernels, str):
        return (ort_version or build, f"CUDA kernel coverage not checked: {kernels}", {}, [])
    opsets = dict(work.opset_imports)
    cpu: dict[str, Any] = {}
    for n in nodes:
        since = placement_mod.since_version(n, opsets)
        ranges = kernels.get((placement_mod.canonical_domain(n.domain), n.op_type), [])
        if not any(since is not None and lo <= since <= hi for lo, hi in ranges):
            cpu[labels[id(n)]] = {"node": labels[id(n)], "reason": f"no CUDA kernel for {n.op_type}-{since}"}
    basis = (f"CUDA kernels of this onnxruntime {build} build (known); copies predicted"
             + (f"; asked for ORT {ort_version}" if ort_version and ort_version != build else ""))
    return build, basis, cpu, _cuda_copies(work, nodes, labels, cpu)


def _cuda_copies(work: ir.Model, nodes: list[ir.Node], labels: dict[int, str], cpu: dict[str, Any]):
    """Values crossing between CPU nodes and CUDA nodes (Shape/Size outputs live in CPU memory)."""
    producer = {id(o): n for n in nodes for o in n.outputs}
    graph_inputs = {id(v) for v in work.graph.inputs if v.name not in work.graph.initializers}
    host_outputs = ("Shape", "Size")
    edges: dict[int, dict[str, Any]] = {}
    for n in nodes:
        on_cpu = labels[id(n)] in cpu
        for v in n.inputs:
            if v is None or not v.name:
                continue
            p = producer.get(id(v))
            if p is None:
                if id(v) not in graph_inputs:
                    continue  # initializer: ORT places a copy of it where it is read
                readers = [labels[id(c)] in cpu for c, _ in v.uses()]
                if not (any(readers) and not all(readers)):
                    continue
                source, home = f"<input {v.name}>", "host"
            else:
                source = labels[id(p)]
                home = "host" if source in cpu or p.op_type in host_outputs else "device"
            wants = "host" if on_cpu else "device"
            if home == wants:
                continue
            e = edges.setdefault(id(v), {"value": v.name, "graph": None, "producer": source, "consumers": [],
                                         "direction": "to_host" if wants == "host" else "from_host"})
            e["consumers"].append(labels[id(n)])
    return list(edges.values())
