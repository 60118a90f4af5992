"""Step 5: partitions (``graph_fusion``): the DML EP's BuildPartitions, a greedy merge of DML
graph nodes in topological order.

Why: a graph compiled as one DML partition runs fastest; this says what splits it (CPU nodes,
ops that cannot join a DML graph, dynamic shapes, or an If/Loop/Scan anywhere in the model).
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from dmlopt.targets.dml.placement_data import DmlData
from dmlopt.targets.dml.placement_nodes import AnalysedNode, op_name, static_shape


def find_partitions(graph: ir.Graph, analysed: list[AnalysedNode], data: DmlData, has_subgraph: bool) -> dict[str, Any]:
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


def _graph_node(item: AnalysedNode, constant_inits: set[str], data: DmlData, blocked) -> bool:
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
        shape = static_shape(value)
        if shape is None or 0 in shape:
            blocked("dynamic_shape", item.name)
            return False
    if reg.graph_input_count is not None and len(item.node.inputs) != reg.graph_input_count:
        blocked(f"input_count:{item.node.op_type}", item.name)
        return False
    return True


def _blocker_text(reasons: dict[str, list[str]], analysed: list[AnalysedNode], has_subgraph: bool,
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
                    ops[op_name(item.node)] = ops.get(op_name(item.node), 0) + 1
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
