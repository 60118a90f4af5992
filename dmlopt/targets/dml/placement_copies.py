"""Step 4: copies (``memcpy``): one Memcpy per value crossing between CPU and GPU memory.

Why: the copies are what makes a placement slow; one copy is shared by all the value's
consumers on the other side, and a feed is copied by the session, not by a Memcpy node.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np
import onnx_ir as ir

from dmlopt.targets.dml.placement_nodes import AnalysedNode, dtype_name, static_shape


def _tensor_bytes(value: ir.Value) -> int | None:
    shape = static_shape(value)
    if shape is None or value.dtype is None:
        return None
    try:
        itemsize = value.dtype.itemsize
    except Exception:  # noqa: BLE001
        return None
    return int(np.prod(shape, dtype=np.int64) * itemsize)


def find_copies(graph: ir.Graph, analysed: list[AnalysedNode], prefix: str) -> list[dict[str, Any]]:
    """One Memcpy per value that is needed in the other memory than it lives in.

    The graph of values and consumers is a networkx DiGraph (producer -> consumer, one edge
    per input slot, labelled with the memory the consumer reads it from).
    """
    g = nx.MultiDiGraph()
    by_value: dict[int, AnalysedNode] = {}
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
                "dtype": dtype_name(value), "shape": _shape_list(value), "bytes": _tensor_bytes(value),
            })
    return found


def fill_sizes(copies: list[dict[str, Any]], graph: ir.Graph) -> None:
    """Sizes of copies whose value has no static shape in the analysed copy, from `graph`'s shapes
    (the rank-only Einsum shapes of ORT <= 1.19 decide fusion, not how many bytes a copy moves)."""
    values = {v.name: v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs}
    for copy in copies:
        value = values.get(copy["value"])
        if copy["bytes"] is None and value is not None and _tensor_bytes(value) is not None:
            copy["bytes"], copy["shape"] = _tensor_bytes(value), _shape_list(value)


def _shape_list(value: ir.Value) -> list | None:
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else (getattr(d, "value", None) or "?") for d in value.shape.dims]
