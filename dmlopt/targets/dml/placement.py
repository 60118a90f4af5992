"""DirectML placement model: which nodes ORT's DirectML EP leaves on the CPU, what copies that
costs, and whether the graph compiles as one DirectML partition.

Why: nobody can see this before deploying on Windows, and it is what made SAM slow there
(profiles full of Memcpy).  The prediction replays the EP's own steps, with the facts in
``dmlopt/data/dml_ort_<version>.json`` (measured on the real EP by models/dml_probe.py for 1.17,
1.19, 1.24 and 1.31, derived from ORT's sources for 1.14, 1.18 and 1.23; every rule names its
source; placement_data):

1. ORT's level-1 optimizer runs first (constant folding of static shape chains, common
   subexpressions, ReshapeFusion, constant-If inlining): the installed onnxruntime makes that graph
   itself (placement_ort), else dmlopt replays the folding (placement_folding).  ORT <= 1.19 knows
   only the rank of an Einsum's output (table rule ``einsum_output_shape``).
2. Kernel lookup (``kernel_match``): the node's ONNX since-version must be one the EP
   registers, with the element types it registers; then the device's types, rank <= 8 and
   the operator's support query (Einsum equations, LayerNormalization outputs, Resize modes...)
   (placement_kernels).
3. CPU preference (``cpu_preference``, fallback_cpu_capability.cc): consumers of CPU-memory
   outputs (Shape, Size) whose inputs are all small initializers, graph inputs or CPU tensors
   go to the CPU, and so on downstream (placement_cpu).
4. Copies (``memcpy``): one per value crossing between CPU and GPU memory, shared by all
   its consumers on the other side (placement_copies).
5. Partitions (``graph_fusion``): greedy merge of DML graph nodes in topological order; a
   graph with an If/Loop/Scan is not partitioned at all (placement_partitions).  Each partition,
   a single node too, is one compiled DmlFusedNode in ORT's log (measured on 1.17.3-1.31.1).

This module runs the steps (`predict`), holds the result (`Placement`, `summary_table`) and is
the one import callers need.  Subgraph bodies are predicted as graphs of their own (their nodes
are named ``outer_node/attribute/node``).  ``predict`` never changes the model it is given.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import onnx_ir as ir

from dmlopt.targets.dml.einsum_support import einsum_supported
from dmlopt.targets.dml.placement_copies import fill_sizes, find_copies
from dmlopt.targets.dml.placement_cpu import cpu_preferred, int64_source_check
from dmlopt.targets.dml.placement_data import DmlData, Registration, canonical_domain, load_data
from dmlopt.targets.dml.placement_folding import LEVEL1_KEY, UNFOLDED_KEY, prepare, prepared_graph
from dmlopt.targets.dml.placement_ort import rank_only_einsum_shapes
from dmlopt.targets.dml.placement_kernels import (
    find_kernel,
    memory_slots,
    registered_versions,
    since_version,
    support_query,
    version_gap,
    version_gap_text,
    version_gaps,
)
from dmlopt.targets.dml.placement_nodes import (
    AnalysedNode,
    constant_values,
    graph_attributes,
    node_label,
    op_name,
    static_shape,
)
from dmlopt.targets.dml.placement_partitions import find_partitions
from dmlopt.target import available_versions, resolve_version

__all__ = ["Placement", "available_versions", "einsum_supported", "load_data", "predict", "summary_table"]
# The other names imported above stay reachable as placement.NAME for the callers that use them
# (graph capture, calibration, emulation, the copies pass).


@dataclasses.dataclass
class Placement:
    """What `predict` found; `to_dict()` is the JSON form (``dmlopt inspect --ep dml --json``)."""

    ort_version: str
    data_source: str
    nodes: int
    dml_nodes: int
    cpu_nodes: list[dict[str, Any]]
    memcpy: dict[str, Any]
    partitions: dict[str, Any]
    folded_nodes: int
    subgraphs: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Ops on the CPU only because DirectML registers other versions of them (see `version_gaps`).
    version_gaps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # The version asked for (None: the newest table), whether the table was measured on the real EP,
    # and how ORT's level-1 graph was made (placement_folding.prepare).
    asked_version: str | None = None
    measured_table: bool = False
    level1: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ort_version": self.ort_version,
            "asked_ort_version": self.asked_version,
            "table": {"file": self.data_source, "measured": self.measured_table,
                      "nearest": self.asked_version is not None and _short(self.asked_version) != self.ort_version},
            "level1": self.level1,
            "data_source": self.data_source,
            "nodes": self.nodes,
            "dml_nodes": self.dml_nodes,
            "folded_by_ort": self.folded_nodes,
            "cpu_nodes": self.cpu_nodes,
            "memcpy": self.memcpy,
            "partitions": self.partitions,
            "subgraphs": self.subgraphs,
            "warnings": self.warnings,
            "version_gaps": self.version_gaps,
        }

    @property
    def cpu_count(self) -> int:
        return len(self.cpu_nodes)

    @property
    def copy_count(self) -> int:
        return self.memcpy["count"]

    def device_of(self, node_name: str) -> str:
        """'cpu' or 'dml' for a node of the main graph (folded nodes count as 'dml': they vanish)."""
        return "cpu" if node_name in self._cpu_names else "dml"

    @functools.cached_property
    def _cpu_names(self) -> set[str]:
        return {c["node"] for c in self.cpu_nodes}


def predict(model: ir.Model, *, ort_version: str | None = None, fold: bool = True,
            prepared: tuple[ir.Model, int] | None = None) -> Placement:
    """Predict the DirectML EP's placement of `model` under ONNX Runtime `ort_version`.

    `fold=False` skips the model of ORT's constant folding (every node reaches the EP).
    `prepared` is `prepare(model, fold=fold)` when the caller made it already (it is only read).
    """
    data = load_data(ort_version)
    work, folded_by_ort = prepared if prepared is not None else prepare(model, fold)
    shaped = work
    if data.rules.get("einsum_output_shape", {}).get("value") == "rank_only":
        work = rank_only_einsum_shapes(work)  # a copy: `prepared` is only read
    unfolded = work.graph.meta.get(UNFOLDED_KEY, [])
    opsets = dict(work.opset_imports)
    cpu_nodes: list[dict[str, Any]] = []
    copies: list[dict[str, Any]] = []
    subgraph_names: list[str] = []
    totals = {"nodes": 0, "dml": 0, "folded": folded_by_ort}
    has_subgraph = any(graph_attributes(n) for n in ir.traversal.RecursiveGraphIterator(work.graph))

    def visit(graph: ir.Graph, prefix: str) -> list[AnalysedNode]:
        analysed = _place_graph(graph, data, opsets, prefix)
        for item in analysed:
            totals["nodes"] += 1
            if item.device == "cpu":
                cpu_nodes.append({"node": item.name, "op": op_name(item.node), "reason": item.reason,
                                  **({"graph": prefix.rstrip("/")} if prefix else {})})
            else:
                totals["dml"] += 1
        copies.extend(find_copies(graph, analysed, prefix))
        for item in analysed:
            for attr_name, sub in graph_attributes(item.node):
                sub_prefix = f"{item.name}/{attr_name}/"
                subgraph_names.append(sub_prefix.rstrip("/"))
                visit(sub, sub_prefix)
        return analysed

    main = visit(work.graph, "")
    gaps = version_gaps(work, data)
    partitions = find_partitions(work.graph, main, data, has_subgraph)
    if shaped is not work:
        _einsum_shape_blockers(partitions, work.graph, shaped.graph)
    if shaped is not work:
        fill_sizes(copies, shaped.graph)
    byte_sizes = [c["bytes"] for c in copies]
    memcpy = {
        "count": len(copies),
        "bytes": None if any(b is None for b in byte_sizes) else int(sum(byte_sizes)),
        "to_host": sum(1 for c in copies if c["direction"] == "to_host"),
        "from_host": sum(1 for c in copies if c["direction"] == "from_host"),
        "edges": copies,
    }
    return Placement(ort_version=data.version, data_source=data.name, nodes=totals["nodes"],
                     dml_nodes=totals["dml"], cpu_nodes=cpu_nodes, memcpy=memcpy, partitions=partitions,
                     folded_nodes=totals["folded"], subgraphs=subgraph_names,
                     warnings=_warnings(model, data, unfolded, work.graph.meta.get(LEVEL1_KEY)),
                     version_gaps=gaps,
                     asked_version=data.version if ort_version is None or str(ort_version).lower() in ("newest", "latest")
                     else str(ort_version),
                     measured_table=data.measured, level1=work.graph.meta.get(LEVEL1_KEY))


def _einsum_shape_blockers(partitions: dict[str, Any], rank_only: ir.Graph, full: ir.Graph) -> None:
    """Say which dynamic-shape blockers come from ORT <= 1.19 knowing only an Einsum's rank (the model is
    static there): freezing axes does not help them, lowering the Einsums does."""
    full_shapes = {v.name: static_shape(v) for n in full for v in n.outputs}
    after_einsum = really_dynamic = 0
    for node in rank_only:
        if node.op_type == "Constant":
            continue
        values = [v for v in (*node.inputs, *node.outputs) if v is not None and v.name]
        dynamic = [v for v in values if static_shape(v) is None]
        if not dynamic:
            continue
        if all(full_shapes.get(v.name) is not None for v in dynamic):
            after_einsum += 1
        else:
            really_dynamic += 1
    if not after_einsum:
        return
    lines = [b for b in partitions["blockers"] if "without a static shape" not in b]
    if really_dynamic:
        lines.insert(0, f"{really_dynamic} nodes have inputs or outputs without a static shape; freeze the dynamic axes")
    lines.insert(0, f"{after_einsum} nodes (the Einsums and the nodes they feed) have no static shape in this ORT, "
                    "which infers only an Einsum's rank (ONNX < 1.17): those on DirectML run as standalone kernels; "
                    "lowering the Einsums to MatMul (dmlopt's einsum pass) lets them join a DML graph")
    partitions["blockers"] = lines


def _short(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def _warnings(model: ir.Model, data: DmlData, unfolded: list[str], level1: str | None = None) -> list[str]:
    found = []
    if level1 and level1.startswith("replayed"):
        found.append(f"ORT's level-1 graph was {level1}; common subexpressions and ORT's other level-1 rewrites "
                     "are not modelled, so CPU nodes and copies may be overcounted")
    rule = data.rules.get("max_onnx_opset")
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if rule and opset is not None and opset > rule["value"]:
        found.append(f"the model uses ai.onnx opset {opset}; ONNX Runtime {data.version} loads opsets up to "
                     f"{rule['value']} (the session would fail to load)")
    if unfolded:
        found.append(f"{len(unfolded)} constant nodes ORT would fold have results too large (or of unknown size) to evaluate here "
                     f"(e.g. {unfolded[0]}): predicted as nodes; ORT materializes them when it loads the model")
    return found


def _place_graph(graph: ir.Graph, data: DmlData, opsets: dict[str, int], prefix: str) -> list[AnalysedNode]:
    """Placement of one graph's nodes (not its subgraphs); Constant nodes are initializers to ORT."""
    constant = constant_values(graph)
    nodes = [n for n in graph if not (n.op_type == "Constant" and canonical_domain(n.domain) == "")]
    analysed = [AnalysedNode(n, node_label(n, i, prefix), i) for i, n in enumerate(nodes)]
    for item in analysed:
        item.reg, item.reason = find_kernel(item.node, data, opsets)
    tentative = [item for item in analysed if item.reg is not None]
    for item in tentative:
        if item.reason is None:
            item.reason = support_query(item.node, item.reg, data)
    preferred = cpu_preferred(graph, analysed, constant, data)
    for item in analysed:
        if item.reason is None and item.index in preferred:
            item.reason = ("shape arithmetic on CPU tensors: every input is a small initializer, a graph input "
                           "or a CPU value (ORT's CPU-preference rule)")
    by_value = {}
    for item in analysed:
        for out in item.node.outputs:
            by_value[id(out)] = item
    strided_int64 = data.rules["int64"]["mode"] == "strided_32bit"
    for item in analysed:  # topological order: a producer's device is final before its consumers
        if strided_int64 and item.reason is None:
            item.reason = int64_source_check(item, by_value, constant)
        item.device = "cpu" if item.reason else "dml"
    return analysed


def summary_table(placement: dict[str, Any], *, limit: int = 40) -> str:
    """Readable text of `Placement.to_dict()` for ``dmlopt inspect MODEL --ep dml``."""
    p = placement
    mem = p["memcpy"]
    parts = p["partitions"]
    size = "unknown size (dynamic shapes)" if mem["bytes"] is None else _human_bytes(mem["bytes"])
    lines = [
        f"DirectML placement ({_table_text(p)}):",
        f"  nodes reaching the EP: {p['nodes']} ({folded_text(p['folded_by_ort'])})",
        f"  on DirectML: {p['dml_nodes']}   on CPU: {len(p['cpu_nodes'])}",
        f"  copies (Memcpy): {mem['count']} ({mem['from_host']} to GPU, {mem['to_host']} to CPU), {size} per run",
        f"  compiled DML partitions: {parts['count']}" + ("  (whole graph compiled as one)" if parts["compiled"]
                                                        else ""),
    ]
    lines.extend(f"  warning: {w}" for w in p.get("warnings", ()))
    if p.get("version_gaps"):
        lines.append("  operator versions DirectML does not register:")
        lines.extend(f"    - {version_gap_text(g, p['ort_version'])}" for g in p["version_gaps"])
    if parts["blockers"]:
        lines.append("  what blocks one compiled graph:")
        lines.extend(f"    - {b}" for b in parts["blockers"])
    if p["cpu_nodes"]:
        lines.append("")
        lines.append("nodes on the CPU:")
        rows = [("node", "op", "why")]
        for c in p["cpu_nodes"][:limit]:
            rows.append((c["node"], c["op"], c["reason"]))
        lines.append(clipped_table(rows))
        if len(p["cpu_nodes"]) > limit:
            lines.append(f"... and {len(p['cpu_nodes']) - limit} more (--json lists all)")
    if mem["edges"]:
        lines.append("")
        lines.append("copies:")
        rows = [("value", "direction", "from", "to", "bytes")]
        for e in mem["edges"][:limit]:
            rows.append((e["value"], "GPU->CPU" if e["direction"] == "to_host" else "CPU->GPU", e["producer"],
                         ", ".join(e["consumers"][:3]) + (" ..." if len(e["consumers"]) > 3 else ""),
                         "?" if e["bytes"] is None else str(e["bytes"])))
        lines.append(clipped_table(rows))
        if len(mem["edges"]) > limit:
            lines.append(f"... and {len(mem['edges']) - limit} more (--json lists all)")
    return "\n".join(lines)


def _table_text(p: dict[str, Any]) -> str:
    """'ORT 1.24 model, dml_ort_1.24.json, measured' or, for 1.28, 'ORT 1.28 asked: nearest measured table 1.24 ...'."""
    table = p.get("table") or {}
    kind = "measured" if table.get("measured") else "derived from ORT's sources, not measured"
    if table.get("nearest"):
        return (f"ORT {p['asked_ort_version']} asked: nearest {'measured' if table.get('measured') else 'derived'} "
                f"table {p['ort_version']}, {p['data_source']}")
    return f"ORT {p['ort_version']} model, {p['data_source']}, {kind}"


def clipped_table(rows: list[tuple]) -> str:
    widths = [min(max(len(str(r[i])) for r in rows), 60) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [str(c) if i == len(row) - 1 else str(c)[:60].ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def folded_text(folded: int) -> str:
    """What ORT's level 1 did to the node count, also when it grew (function ops inlined)."""
    if folded >= 0:
        return (f"{folded} removed first by ORT's level-1 optimizer: constant folding, common subexpressions, "
                "eliminations")
    return (f"{-folded} more after ORT's level-1 optimizer: function ops without a CPU kernel for their type "
            "(HardSwish in float16) inlined as their bodies")
