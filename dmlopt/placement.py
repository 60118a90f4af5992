"""DirectML placement model: which nodes ORT's DirectML EP leaves on the CPU, what copies that
costs, and whether the graph compiles as one DirectML partition.

Why: nobody can see this before deploying on Windows, and it is what made SAM slow there
(profiles full of Memcpy).  The prediction replays the EP's own steps, with the facts in
``dmlopt/data/dml_ort_<version>.json`` (every rule there names its source):

1. ORT's level-1 constant folding runs first: a node whose inputs are all constants, and a
   Shape/Size of a static shape, become initializers and never reach the EP.
2. Kernel lookup (``kernel_match``): the node's ONNX since-version must be one the EP
   registers, with the element types it registers; then the device's types, rank <= 8 and
   the operator's support query (Einsum equations, LayerNormalization outputs, Resize modes...).
3. CPU preference (``cpu_preference``, fallback_cpu_capability.cc): consumers of CPU-memory
   outputs (Shape, Size) whose inputs are all small initializers, graph inputs or CPU tensors
   go to the CPU, and so on downstream.
4. Copies (``memcpy``): one per value crossing between CPU and GPU memory, shared by all
   its consumers on the other side.
5. Partitions (``graph_fusion``): greedy merge of DML graph nodes in topological order; a
   graph with an If/Loop/Scan is not partitioned at all.

Subgraph bodies are predicted as graphs of their own (their nodes are named
``outer_node/attribute/node``).  ``predict`` never changes the model it is given.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import importlib.resources
import json
from typing import Any

import networkx as nx
import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from dmlopt.einsum_support import einsum_supported, parse_version
from dmlopt.target import available_versions, resolve_version
from dmlopt.shape_inference import check_function_expansion, fold_refusal, infer_shapes

__all__ = ["Placement", "available_versions", "einsum_supported", "load_data", "predict", "summary_table"]

CONTROL_FLOW = {"If", "Loop", "Scan"}
# Ops ORT never folds (non-deterministic) even when their inputs are constant.
NOT_FOLDABLE = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                "Bernoulli"}
MS_DOMAIN = "com.microsoft"
# The prediction evaluates ORT's folds itself; a result over this many elements (that frees
# less than it adds) is not evaluated and is predicted as a node (a warning says so).
FOLD_LIMIT_ELEMENTS = 1 << 22


# ** the data files **

# available_versions and resolve_version (the newest table at or below a version) live in dmlopt.target.


@dataclasses.dataclass(frozen=True)
class Registration:
    """One row group of the EP's registration table for an op."""

    since: tuple[int, ...]
    types: dict[str, frozenset[str]]
    cpu_inputs: frozenset[int] = frozenset()
    cpu_outputs: frozenset[int] = frozenset()
    graph: bool = True
    graph_input_count: int | None = None
    query: str | None = None
    int64_from_any_ep: bool = False
    source: str = ""


class DmlData:
    """One ``dml_ort_<version>.json``: registrations by (domain, op) and the placement rules."""

    def __init__(self, raw: dict[str, Any], name: str):
        self.raw = raw
        self.name = name
        self.version: str = raw["ort_version"]
        self.rules: dict[str, Any] = raw["rules"]
        groups = raw["type_groups"]
        self.ops: dict[tuple[str, str], list[Registration]] = {}
        for key, rows in raw["ops"].items():
            domain, _, op = key.rpartition("::")
            self.ops[(domain, op)] = [self._row(r, groups) for r in rows]
        self.device_unsupported = frozenset(self.rules["device"]["unsupported"])

    @staticmethod
    def _row(row: dict[str, Any], groups: dict[str, list[str]]) -> Registration:
        types = {}
        for param, spec in row.get("types", {}).items():
            names: set[str] = set()
            for part in spec.split("+"):
                names.update(groups.get(part, [part]))
            types[param] = frozenset(names)
        return Registration(
            since=tuple(row["since"]), types=types, cpu_inputs=frozenset(row.get("cpu_inputs", ())),
            cpu_outputs=frozenset(row.get("cpu_outputs", ())), graph=row.get("graph", True),
            graph_input_count=row.get("graph_input_count"), query=row.get("query"),
            int64_from_any_ep=row.get("int64_from_any_ep", False), source=row.get("source", ""))

    def registrations(self, domain: str, op: str) -> list[Registration]:
        return self.ops.get((_domain(domain), op), [])

    def has_op(self, domain: str, op: str, since: int | None = None) -> bool:
        rows = self.registrations(domain, op)
        return any(since is None or since in r.since for r in rows)


@functools.lru_cache(maxsize=None)
def load_data(ort_version: str | None = None) -> DmlData:
    """The placement data for `ort_version` (see `resolve_version`)."""
    version = resolve_version(ort_version)
    name = f"dml_ort_{version}.json"
    text = (importlib.resources.files("dmlopt.data") / name).read_text()
    return DmlData(json.loads(text), name)


def _domain(domain: str | None) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain


# ** the result **

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "ort_version": self.ort_version,
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


# ** the prediction **

@dataclasses.dataclass
class _Node:
    """A node of the analysed graph with what the placement needs."""

    node: ir.Node
    name: str
    index: int
    reg: Registration | None = None
    reason: str | None = None  # why not on DML (None: on DML)
    device: str = "dml"


def predict(model: ir.Model, *, ort_version: str | None = None, fold: bool = True,
            prepared: tuple[ir.Model, int] | None = None) -> Placement:
    """Predict the DirectML EP's placement of `model` under ONNX Runtime `ort_version`.

    `fold=False` skips the model of ORT's constant folding (every node reaches the EP).
    `prepared` is `prepare(model, fold=fold)` when the caller made it already (it is only read).
    """
    data = load_data(ort_version)
    work, folded_by_ort = prepared if prepared is not None else prepare(model, fold)
    unfolded = work.graph.meta.get(UNFOLDED_KEY, [])
    opsets = dict(work.opset_imports)
    cpu_nodes: list[dict[str, Any]] = []
    copies: list[dict[str, Any]] = []
    subgraph_names: list[str] = []
    totals = {"nodes": 0, "dml": 0, "folded": folded_by_ort}
    has_subgraph = any(graph_attributes(n) for n in ir.traversal.RecursiveGraphIterator(work.graph))

    def visit(graph: ir.Graph, prefix: str) -> list[_Node]:
        analysed = _place_graph(graph, data, opsets, prefix)
        for item in analysed:
            totals["nodes"] += 1
            if item.device == "cpu":
                cpu_nodes.append({"node": item.name, "op": _op_name(item.node), "reason": item.reason,
                                  **({"graph": prefix.rstrip("/")} if prefix else {})})
            else:
                totals["dml"] += 1
        copies.extend(_copies(graph, analysed, prefix))
        for item in analysed:
            for attr_name, sub in graph_attributes(item.node):
                sub_prefix = f"{item.name}/{attr_name}/"
                subgraph_names.append(sub_prefix.rstrip("/"))
                visit(sub, sub_prefix)
        return analysed

    main = visit(work.graph, "")
    gaps = version_gaps(work, data)
    partitions = _partitions(work.graph, main, data, has_subgraph)
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
                     folded_nodes=totals["folded"], subgraphs=subgraph_names, warnings=_warnings(model, data, unfolded),
                     version_gaps=gaps)


def registered_versions(data: DmlData, domain: str, op: str) -> list[int]:
    """The ONNX since-versions of `op` that DirectML registers in `data`, oldest first."""
    return sorted({s for r in data.registrations(domain, op) for s in r.since})


def version_gap(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[int, list[int]] | None:
    """(node's since-version, registered since-versions) when DirectML has `node`'s op at other versions
    only, or at none while ONNX defines it; None when its version is registered (or it is no ONNX op)."""
    since = _since_version(node, opsets)
    if since is None or _domain(node.domain) != "":
        return None
    known = registered_versions(data, node.domain, node.op_type)
    if since in known:
        return None
    if not known and _schema(node, opsets) is None:
        return None  # not an ONNX op (an ORT contrib op in the ONNX domain, or unknown)
    return since, known


def version_gaps(model: ir.Model, data: DmlData) -> list[dict[str, Any]]:
    """One entry per (op, since-version) of the model that DirectML does not register:
    {"op", "version", "registered", "nodes"}; every graph, subgraphs included."""
    opsets = dict(model.opset_imports)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "Constant":
            continue
        gap = version_gap(node, data, opsets)
        if gap is None:
            continue
        since, known = gap
        schema = _schema(node, opsets)
        # An op no EP has a kernel for is expanded by ORT into its ONNX function body, if it has one
        # (GroupNormalization: measured on the CPU EP); whether the CPU EP has one is not in the table.
        body = bool(schema is not None and (schema.has_function or schema.has_context_dependent_function))
        entry = found.setdefault((node.op_type, since), {"op": node.op_type, "version": since,
                                                         "registered": known, "nodes": 0, "function_body": body})
        entry["nodes"] += 1
    return sorted(found.values(), key=lambda e: (e["op"], e["version"]))


def version_gap_text(gap: dict[str, Any], ort_version: str) -> str:
    """``GridSample-20: DirectML registers 16 only`` (one line of ``inspect --ep dml``)."""
    known = gap["registered"]
    if not known:
        has = "no version of it"
    elif len(known) == 1:
        has = f"{known[0]} only"
    else:
        has = ", ".join(map(str, known))
    count = gap["nodes"]
    where = (f"{count} node{'s' if count != 1 else ''} on the CPU" if not gap.get("function_body") else
             f"{count} node{'s' if count != 1 else ''}: CPU kernel or ORT's expansion of the ONNX function body")
    return f"{gap['op']}-{gap['version']}: DirectML registers {has} (ORT {ort_version}; {where})"


def _warnings(model: ir.Model, data: DmlData, unfolded: list[str]) -> list[str]:
    found = []
    rule = data.rules.get("max_onnx_opset")
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if rule and opset is not None and opset > rule["value"]:
        found.append(f"the model uses ai.onnx opset {opset}; ONNX Runtime {data.version} loads opsets up to "
                     f"{rule['value']} (the session would fail to load)")
    if unfolded:
        found.append(f"{len(unfolded)} constant nodes ORT would fold have results too large (or of unknown size) to evaluate here "
                     f"(e.g. {unfolded[0]}): predicted as nodes; ORT materializes them when it loads the model")
    return found


def prepare(model: ir.Model, fold: bool = True) -> tuple[ir.Model, int]:
    """The copy of `model` that `predict` analyses and how many nodes ORT's folding removed."""
    if model.functions:  # ORT inlines model-local functions when it loads the model
        check_function_expansion(model)
        model = model.clone()
        common_passes.InlinePass()(model)
    return _ort_constant_folding(model) if fold else (_with_shapes(model.clone()), 0)


def prepared_graph(model: ir.Model, *, fold: bool = True) -> ir.Model:
    """The copy of `model` that `predict` analyses (ORT's folding applied, shapes inferred);
    its nodes, Constant nodes left out, carry the names `node_label` gives."""
    return prepare(model, fold)[0]


def node_label(node: ir.Node, index: int, prefix: str = "") -> str:
    """The name placement results use for `node`, the `index`-th non-Constant node of its graph."""
    return prefix + (node.name or f"{node.op_type}_{index}")


def memory_slots(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[frozenset[int], frozenset[int]]:
    """(input slots, output slots) the DML kernel of `node` keeps in CPU memory; empty when none."""
    reg, _ = _kernel(node, data, opsets)
    return (reg.cpu_inputs, reg.cpu_outputs) if reg is not None else (frozenset(), frozenset())


def _with_shapes(model: ir.Model) -> ir.Model:
    """`model` (changed in place and returned) with ONNX shape inference, data propagation on.

    Best effort (contrib ops, odd models); the weights are not serialized (dmlopt.shape_inference)."""
    infer_shapes(model)
    return model


def _ort_constant_folding(model: ir.Model, max_rounds: int = 12) -> tuple[ir.Model, int]:
    """A copy of `model` after what ORT's level-1 ConstantFolding does before partitioning.

    ORT folds a node when all its inputs are constant, and a Shape/Size whose input shape is
    fully static; it does not fold through partially known shapes.  Each round infers shapes
    again, because a folded Reshape shape makes the next Shape static.
    """
    work = _with_shapes(model.clone())
    folded = 0
    unfolded: list[str] = []
    for _ in range(max_rounds):
        changed = 0
        for node in list(work.graph):
            values = _fold_node(node, unfolded)
            if values is None:
                continue
            for out, array in zip(node.outputs, values):
                const = ir.Value(name=out.name, shape=ir.Shape(array.shape), type=ir.TensorType(out.dtype or
                                 ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
                ir.convenience.replace_all_uses_with(out, const, replace_graph_outputs=True)
                work.graph.register_initializer(const)
            work.graph.remove(node, safe=True)
            changed += 1
        folded += changed
        if not changed:
            break
        work = _with_shapes(work)
    work.graph.meta[UNFOLDED_KEY] = unfolded
    return work, folded


UNFOLDED_KEY = "dmlopt.placement.unfolded"


def _fold_node(node: ir.Node, unfolded: list[str]) -> list[np.ndarray] | None:
    """The values of `node`'s outputs when ORT would fold it, else None."""
    if _domain(node.domain) != "" or node.op_type in NOT_FOLDABLE or node.op_type == "Constant" \
            or graph_attributes(node) or not node.outputs:
        return None
    inputs = list(node.inputs)
    if node.op_type in ("Shape", "Size") and inputs and _static_shape(inputs[0]) is not None:
        shape = np.array(_static_shape(inputs[0]), dtype=np.int64)
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        start, end = _attr(node, "start", 0), _attr(node, "end", None)
        return [shape[start:end] if end is not None else shape[start:]]
    if not inputs or any(v is not None and v.is_graph_input() for v in inputs):
        return None
    tensors = {v.name: _const_tensor(v) for v in inputs if v is not None}
    if any(t is None for t in tensors.values()):
        return None
    if fold_refusal(node, FOLD_LIMIT_ELEMENTS, const=_const_tensor) is not None:  # sized before evaluating
        if node.name not in unfolded:
            unfolded.append(node.name or node.op_type)
        return None
    feeds = {name: t.numpy() for name, t in tensors.items()}
    try:
        from onnx.reference import ReferenceEvaluator  # lazily: only folds that get this far need it

        proto = ir.serde.serialize_node(node)
        outputs = ReferenceEvaluator(proto).run(None, feeds)
    except Exception:  # noqa: BLE001 - an op the reference runtime cannot evaluate stays in the graph
        return None
    return [np.asarray(o) for o in outputs]


def _const_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """ir.convenience.get_const_tensor without naming a Constant's tensor: the work copy shares it with the
    caller's model (clone does not copy tensors), which predict leaves unchanged."""
    producer = value.producer()
    if value.const_value is None and producer is not None and producer.op_type == "Constant" \
            and _domain(producer.domain) == "" and "value" in producer.attributes:
        return producer.attributes["value"].as_tensor()
    return ir.convenience.get_const_tensor(value)


def graph_attributes(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """(attribute name, body) for each subgraph of `node` (If branches, Loop/Scan bodies)."""
    found = []
    for name, attr in node.attributes.items():
        if attr.type == ir.AttributeType.GRAPH:
            found.append((name, attr.as_graph()))
        elif attr.type == ir.AttributeType.GRAPHS:
            found.extend((f"{name}[{i}]", g) for i, g in enumerate(attr.as_graphs()))
    return found


def _op_name(node: ir.Node) -> str:
    domain = _domain(node.domain)
    return f"{domain}.{node.op_type}" if domain else node.op_type


def _place_graph(graph: ir.Graph, data: DmlData, opsets: dict[str, int], prefix: str) -> list[_Node]:
    """Placement of one graph's nodes (not its subgraphs); Constant nodes are initializers to ORT."""
    constant = _constant_values(graph)
    nodes = [n for n in graph if not (n.op_type == "Constant" and _domain(n.domain) == "")]
    analysed = [_Node(n, node_label(n, i, prefix), i) for i, n in enumerate(nodes)]
    for item in analysed:
        item.reg, item.reason = _kernel(item.node, data, opsets)
    tentative = [item for item in analysed if item.reg is not None]
    for item in tentative:
        if item.reason is None:
            item.reason = _support_query(item.node, item.reg, data)
    preferred = _cpu_preferred(graph, analysed, constant, data)
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
            item.reason = _int64_source_check(item, by_value, constant)
        item.device = "cpu" if item.reason else "dml"
    return analysed


def _constant_values(graph: ir.Graph) -> dict[int, ir.Value]:
    """Initializers and Constant outputs (ORT turns Constant nodes into initializers)."""
    constant: dict[int, ir.Value] = {id(v): v for v in graph.initializers.values()}
    for node in graph:
        if node.op_type == "Constant" and _domain(node.domain) == "":
            constant.update((id(o), o) for o in node.outputs)
    return constant


def _static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape.dims:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


def _dtype_name(value: ir.Value | None) -> str | None:
    if value is None or value.dtype is None:
        return None
    return value.dtype.name.lower()


def _since_version(node: ir.Node, opsets: dict[str, int]) -> int | None:
    domain = _domain(node.domain)
    if domain == MS_DOMAIN:
        return 1
    opset = opsets.get(domain if domain else "", opsets.get("ai.onnx"))
    if opset is None:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, domain).since_version
    except Exception:  # noqa: BLE001 - ORT contrib ops registered in the ONNX domain (since 1)
        return 1 if domain == "" else None


def _schema(node: ir.Node, opsets: dict[str, int]):
    domain = _domain(node.domain)
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
    except Exception:  # noqa: BLE001
        return None


def _type_bindings(node: ir.Node, opsets: dict[str, int]) -> list[tuple[str, str, bool, int]]:
    """(type parameter, element type, is_input, index) for each present input and output."""
    schema = _schema(node, opsets)
    bound = []
    for is_input, values, formals in ((True, node.inputs, schema.inputs if schema else None),
                                      (False, node.outputs, schema.outputs if schema else None)):
        for i, value in enumerate(values):
            dtype = _dtype_name(value)
            if dtype is None:
                continue
            if formals:
                formal = formals[min(i, len(formals) - 1)]
                param = formal.type_str
            else:
                param = "T" if dtype in ("float", "float16", "double", "bfloat16") else ""
            bound.append((param, dtype, is_input, i))
    return bound


def _kernel(node: ir.Node, data: DmlData, opsets: dict[str, int]) -> tuple[Registration | None, str | None]:
    """The registration ORT's kernel lookup finds for `node`, or why none matches."""
    rows = data.registrations(node.domain, node.op_type)
    label = _op_name(node)
    if not rows:
        if node.op_type == "Gelu" and _domain(node.domain) == "":
            return None, (f"no DirectML kernel for ai.onnx Gelu in ORT {data.version} (only com.microsoft Gelu "
                          "is registered)")
        return None, f"no DirectML kernel for {label} in ORT {data.version}"
    since = _since_version(node, opsets)
    reg = next((r for r in rows if since in r.since), None)
    if reg is None:
        known = sorted({s for r in rows for s in r.since})
        return None, (f"no DirectML kernel for {label}-{since} in ORT {data.version} (registered since-versions: "
                      f"{', '.join(map(str, known))})")
    for param, dtype, is_input, index in _type_bindings(node, opsets):
        allowed = reg.types.get(param)
        if allowed is not None and dtype not in allowed:
            where = f"input {index}" if is_input else f"output {index}"
            return None, f"{label} has no DirectML kernel for {dtype} ({where}, type {param})"
    return reg, None


def _support_query(node: ir.Node, reg: Registration, data: DmlData) -> str | None:
    """The EP's IsNodeSupportedByDml beyond the kernel lookup: device types, rank, support query."""
    label = _op_name(node)
    for i, value in enumerate(node.inputs):
        if value is None or i in reg.cpu_inputs:
            continue
        dtype = _dtype_name(value)
        if dtype in data.device_unsupported:
            return f"{dtype} tensors are not supported by DirectML devices (input {i} of {label})"
    for value in node.outputs:
        dtype = _dtype_name(value)
        if dtype in data.device_unsupported:
            return f"{dtype} tensors are not supported by DirectML devices (output of {label})"
    max_rank = data.rules["max_rank"]["value"]
    for value in [*node.inputs, *node.outputs]:
        if value is not None and value.shape is not None and len(value.shape) > max_rank:
            return f"rank {len(value.shape)} exceeds DirectML's {max_rank} dimensions"
    query = QUERIES.get(reg.query) if reg.query else None
    return query(node, data) if query else None


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _present(values) -> list:
    return [v for v in values if v is not None and v.name != ""]


def _query_einsum(node: ir.Node, data: DmlData) -> str | None:
    equation = _attr(node, "equation", "")
    n_inputs = len(_present(node.inputs))
    if einsum_supported(equation, n_inputs, data.version):
        return None
    mode = data.rules["einsum"]["mode"]
    if mode == "pattern_table":
        return f"Einsum '{equation}' is not in the DirectML EP's recognized-equation table (ORT <= 1.18)"
    return f"Einsum '{equation}' needs ellipsis, more than 2 inputs or more than 8 labels"


def _query_layer_norm(node: ir.Node, data: DmlData) -> str | None:
    rule = data.rules["layer_norm"]
    if len(_present(node.outputs)) > 1:
        return "LayerNormalization with Mean/InvStdDev outputs runs on the CPU"
    inputs = node.inputs
    if rule["requires_bias"] and (len(inputs) < 3 or inputs[2] is None or inputs[2].name == ""):
        return f"LayerNormalization without a bias input runs on the CPU in ORT {data.version}"
    return None


def _query_skip_layer_norm(node: ir.Node, data: DmlData) -> str | None:
    outputs = list(node.outputs)
    if any(k < len(outputs) and outputs[k] is not None and outputs[k].name for k in (1, 2)):
        return f"{node.op_type} with mean/inv_std_var outputs runs on the CPU"
    return None


def _query_resize(node: ir.Node, data: DmlData) -> str | None:
    mode = _attr(node, "mode", "nearest")
    if mode == "cubic":
        return "Resize mode=cubic runs on the CPU"
    if _attr(node, "exclude_outside", 0):
        return "Resize exclude_outside=1 runs on the CPU"
    if _attr(node, "extrapolation_value", 0.0):
        return "Resize with extrapolation_value != 0 runs on the CPU"
    return None


def _query_slice(node: ir.Node, data: DmlData) -> str | None:
    limit = data.rules["slice"]["max_inputs"]
    return f"Slice with more than {limit} inputs" if len(node.inputs) > limit else None


def _query_attention(node: ir.Node, data: DmlData) -> str | None:
    inputs, outputs = node.inputs, node.outputs
    if len(inputs) > 4 and inputs[4] is not None and inputs[4].name:
        return "Attention with a past input runs on the CPU"
    if len(inputs) > 6 and inputs[6] is not None and inputs[6].name:
        return "Attention with past_sequence_length runs on the CPU"
    if len(_present(outputs)) > 1:
        return "Attention with a present output runs on the CPU"
    if _attr(node, "unidirectional", 0) or _attr(node, "do_rotary", 0):
        return "Attention with unidirectional=1 or do_rotary=1 runs on the CPU"
    return None


def _query_batchnorm(node: ir.Node, data: DmlData) -> str | None:
    return "BatchNormalization training_mode=1 runs on the CPU" if _attr(node, "training_mode", 0) else None


def _query_scatter(node: ir.Node, data: DmlData) -> str | None:
    reduction = _attr(node, "reduction", "none")
    return None if reduction == "none" else f"{node.op_type} reduction={reduction} runs on the CPU"


QUERIES = {
    "einsum": _query_einsum,
    "layer_norm": _query_layer_norm,
    "skip_layer_norm": _query_skip_layer_norm,
    "resize": _query_resize,
    "slice": _query_slice,
    "attention": _query_attention,
    "batchnorm_training": _query_batchnorm,
    "scatter_reduction": _query_scatter,
}


def _cpu_preferred(graph: ir.Graph, analysed: list[_Node], constant: dict[int, ir.Value],
                   data: DmlData) -> set[int]:
    """ORT's GetCpuPreferredNodes over the nodes that reach the EP (indices of `analysed`)."""
    rule = data.rules["cpu_preference"]
    small = rule["small_initializer_elements"]
    blocking = set(rule["blocking_types"])
    order = {item.index: k for k, item in enumerate(analysed)}
    by_index = {item.index: item for item in analysed}
    consumers: dict[int, list[int]] = {}
    for item in analysed:
        for value in item.node.inputs:
            if value is not None:
                consumers.setdefault(id(value), []).append(item.index)
    graph_inputs = {id(v) for v in graph.inputs}
    cpu_values: set[int] = set()
    heap: list[tuple[int, int]] = []

    def push_consumers(value: ir.Value) -> None:
        for index in consumers.get(id(value), ()):
            heapq.heappush(heap, (order[index], index))

    for item in analysed:
        if item.reg is None:
            continue
        for k, out in enumerate(item.node.outputs):
            if k in item.reg.cpu_outputs:
                cpu_values.add(id(out))
                push_consumers(out)
    visited: set[int] = set()
    preferred: set[int] = set()
    while heap:
        _, index = heapq.heappop(heap)
        if index in visited:
            continue
        visited.add(index)
        item = by_index[index]
        if item.reg is None:  # no DML kernel: the CPU EP runs it, its outputs are CPU tensors
            for out in item.node.outputs:
                cpu_values.add(id(out))
                push_consumers(out)
            continue
        place = True
        inputs = list(item.node.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        for i, value in enumerate(inputs):
            if value is None or _dtype_name(value) in blocking:
                place = False
                break
            if id(value) in graph_inputs or _small_constant(value, constant, small):
                continue
            if id(value) not in cpu_values or i in item.reg.cpu_inputs:
                place = False
                break
        if place:
            preferred.add(index)
            for out in item.node.outputs:
                cpu_values.add(id(out))
                push_consumers(out)
    return preferred


def _small_constant(value: ir.Value, constant: dict[int, ir.Value], limit: int) -> bool:
    if id(value) not in constant:
        return False
    shape = _static_shape(value)
    if shape is None:
        tensor = value.const_value
        shape = tuple(tensor.shape) if tensor is not None else None
    return shape is not None and int(np.prod(shape, dtype=np.int64)) <= limit


def _int64_source_check(item: _Node, by_value: dict[int, _Node], constant: dict[int, ir.Value]) -> str | None:
    """ORT <= 1.16: int64 is emulated with strided 32-bit reads, safe only for values from DML nodes."""
    if item.reg is None or item.reg.int64_from_any_ep:
        return None
    for i, value in enumerate(item.node.inputs):
        if value is None or i in item.reg.cpu_inputs or _dtype_name(value) not in ("int64", "uint64"):
            continue
        producer = by_value.get(id(value))
        if producer is None or producer.reason is not None:
            source = ("an initializer" if id(value) in constant else
                      "a graph input" if producer is None else f"CPU node {producer.name}")
            return (f"int64 input {i} comes from {source}; DirectML reads int64 as strided 32-bit only from "
                    "DML-produced values")
    return None


# ** copies **

def _tensor_bytes(value: ir.Value) -> int | None:
    shape = _static_shape(value)
    if shape is None or value.dtype is None:
        return None
    try:
        itemsize = value.dtype.itemsize
    except Exception:  # noqa: BLE001
        return None
    return int(np.prod(shape, dtype=np.int64) * itemsize)


def _copies(graph: ir.Graph, analysed: list[_Node], prefix: str) -> list[dict[str, Any]]:
    """One Memcpy per value that is needed in the other memory than it lives in.

    The graph of values and consumers is a networkx DiGraph (producer -> consumer, one edge
    per input slot, labelled with the memory the consumer reads it from).
    """
    g = nx.MultiDiGraph()
    by_value: dict[int, _Node] = {}
    for item in analysed:
        g.add_node(item.name, device=item.device)
        for out in item.node.outputs:
            by_value[id(out)] = item
    graph_inputs = {id(v): v for v in graph.inputs if v.name not in graph.initializers}
    values: dict[int, ir.Value] = {}
    reads: dict[int, list[tuple[str, str, str, str]]] = {}  # value -> (source, reader, home, wants)
    for item in analysed:
        for i, value in enumerate(item.node.inputs):
            if value is None:
                continue
            producer = by_value.get(id(value))
            if producer is not None:
                source = producer.name
                k = list(producer.node.outputs).index(value)
                home = "host" if (producer.device == "cpu" or (producer.reg and k in producer.reg.cpu_outputs)) \
                    else "device"
            elif id(value) in graph_inputs:
                source, home = f"<input {value.name}>", "host"
            else:
                continue  # initializer, folded constant or outer-scope value: duplicated, never copied
            wants = "host" if (item.device == "cpu" or (item.reg and i in item.reg.cpu_inputs)) else "device"
            g.add_edge(source, item.name, value=id(value), home=home, wants=wants)
            values[id(value)] = value
            reads.setdefault(id(value), []).append((source, item.name, home, wants))
    found = []
    for vid, value in values.items():
        edges = reads[vid]
        source, _, home, _ = edges[0]
        needs = {wants for *_, wants in edges}
        if source.startswith("<input ") and needs != {"host", "device"}:
            continue  # the session copies a feed to where its only readers are
        for wants in sorted(needs - {home}):
            found.append({
                "value": value.name, "graph": prefix.rstrip("/") or None,
                "direction": "to_host" if wants == "host" else "from_host",
                "producer": source, "consumers": [reader for _, reader, _, w in edges if w == wants],
                "dtype": _dtype_name(value), "shape": _shape_list(value), "bytes": _tensor_bytes(value),
            })
    return found


def _shape_list(value: ir.Value) -> list | None:
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in value.shape.dims]


# ** partitions **

def _partitions(graph: ir.Graph, analysed: list[_Node], data: DmlData, has_subgraph: bool) -> dict[str, Any]:
    """The DML EP's BuildPartitions: greedy merge of graph nodes in topological order."""
    constant_inits = set(graph.initializers)
    for node in graph:
        if node.op_type == "Constant":
            constant_inits.update(o.name for o in node.outputs)
    reasons: dict[str, list[str]] = {}

    def blocked(kind: str, name: str) -> None:
        reasons.setdefault(kind, []).append(name)

    eligible: dict[str, bool] = {}
    for item in analysed:
        eligible[item.name] = _graph_node(item, constant_inits, data, blocked)
    # A value -> partition map; partitions are dicts {id, nodes, final, graph}.
    owner: dict[int, dict] = {}
    parts: list[dict] = []
    merged: dict[int, int] = {}

    def root(part: dict) -> dict:
        while part["id"] in merged:
            part = parts[merged[part["id"]]]
        return part

    for item in analysed:
        input_parts = [root(owner[id(v)]) for v in item.node.inputs if v is not None and id(v) in owner]
        if has_subgraph or not eligible[item.name]:
            for p in input_parts:
                p["final"] = True
            part = {"id": len(parts), "nodes": [item.name], "final": True, "graph": False,
                    "dml": item.device == "dml"}
            parts.append(part)
        else:
            open_parts = []
            for p in input_parts:
                if not p["final"] and p not in open_parts:
                    open_parts.append(p)
            if not open_parts:
                part = {"id": len(parts), "nodes": [item.name], "final": False, "graph": True, "dml": True}
                parts.append(part)
            else:
                part = open_parts[0]
                part["nodes"].append(item.name)
                for other in open_parts[1:]:
                    part["nodes"].extend(other["nodes"])
                    merged[other["id"]] = part["id"]
        for out in item.node.outputs:
            owner[id(out)] = part
    roots = [p for p in parts if p["id"] not in merged]
    graph_parts = [p for p in roots if p["graph"]]
    standalone = sum(1 for p in roots if not p["graph"] and p["dml"])
    blockers = _blocker_text(reasons, analysed, has_subgraph, len(graph_parts))
    compiled = (not has_subgraph and len(graph_parts) == 1 and len(graph_parts[0]["nodes"]) == len(analysed))
    return {
        "count": len(graph_parts),
        "compiled": compiled,
        "sizes": sorted((len(p["nodes"]) for p in graph_parts), reverse=True),
        "standalone_dml_kernels": standalone,
        "blockers": blockers,
        "blocker_nodes": {k: v[:20] for k, v in reasons.items()},
    }


def _graph_node(item: _Node, constant_inits: set[str], data: DmlData, blocked) -> bool:
    """Whether a node can join a compiled DML graph (GraphPartitioner GetRegistrationProperties)."""
    if item.device != "dml":
        blocked("cpu", item.name)
        return False
    reg = item.reg
    if not reg.graph:
        blocked("not_graph_op:" + item.node.op_type, item.name)
        return False
    for i in reg.cpu_inputs:
        if i < len(item.node.inputs) and item.node.inputs[i] is not None and item.node.inputs[i].name \
                and item.node.inputs[i].name not in constant_inits:
            blocked("cpu_input:" + item.node.op_type, item.name)
            return False
    for value in [*item.node.inputs, *item.node.outputs]:
        if value is None or value.name == "":
            continue
        shape = _static_shape(value)
        if shape is None or 0 in shape:
            blocked("dynamic_shape", item.name)
            return False
    if reg.graph_input_count is not None and len(item.node.inputs) != reg.graph_input_count:
        blocked(f"input_count:{item.node.op_type}", item.name)
        return False
    return True


def _blocker_text(reasons: dict[str, list[str]], analysed: list[_Node], has_subgraph: bool,
                  n_parts: int) -> list[str]:
    out = []
    if has_subgraph:
        out.append("the model has an If/Loop/Scan: the DirectML EP does not partition such models, every DML "
                   "node runs as its own kernel")
    for kind, names in reasons.items():
        n = len(names)
        example = names[0]
        if kind == "cpu":
            ops: dict[str, int] = {}
            for item in analysed:
                if item.device == "cpu":
                    ops[_op_name(item.node)] = ops.get(_op_name(item.node), 0) + 1
            summary = ", ".join(f"{op} x{k}" for op, k in sorted(ops.items(), key=lambda kv: -kv[1]))
            out.append(f"{n} nodes run on the CPU and split the graph ({summary})")
        elif kind.startswith("not_graph_op:"):
            out.append(f"{kind.split(':', 1)[1]} cannot be part of a DML graph ({n} nodes, e.g. {example})")
        elif kind.startswith("cpu_input:"):
            out.append(f"{kind.split(':', 1)[1]} reads a CPU input that is computed at run time, not an "
                       f"initializer ({n} nodes, e.g. {example})")
        elif kind == "dynamic_shape":
            out.append(f"{n} nodes have inputs or outputs without a static shape (e.g. {example}); freeze the "
                       "dynamic axes")
        elif kind.startswith("input_count:"):
            out.append(f"{kind.split(':', 1)[1]} with more than 2 inputs cannot be part of a DML graph "
                       f"({n} nodes, e.g. {example})")
    if n_parts > 1:
        out.append(f"the graph splits into {n_parts} DML partitions")
    return out


# ** text **

def summary_table(placement: dict[str, Any], *, limit: int = 40) -> str:
    """Readable text of `Placement.to_dict()` for ``dmlopt inspect MODEL --ep dml``."""
    p = placement
    mem = p["memcpy"]
    parts = p["partitions"]
    size = "unknown size (dynamic shapes)" if mem["bytes"] is None else _human_bytes(mem["bytes"])
    lines = [
        f"DirectML placement (ORT {p['ort_version']} model, {p['data_source']}):",
        f"  nodes reaching the EP: {p['nodes']} ({p['folded_by_ort']} folded away by ORT first)",
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
        lines.append(_table(rows))
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
        lines.append(_table(rows))
        if len(mem["edges"]) > limit:
            lines.append(f"... and {len(mem['edges']) - limit} more (--json lists all)")
    return "\n".join(lines)


def _table(rows: list[tuple]) -> str:
    widths = [min(max(len(str(r[i])) for r in rows), 60) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [str(c) if i == len(row) - 1 else str(c)[:60].ljust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
