"""What every placement step reads off a node or value: names, shapes, element types, attributes.

Why: the five steps (dmlopt.placement) share one view of the analysed graph; `AnalysedNode` carries a
node's registration, the reason it is not on DirectML and its device from step to step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from dmlopt.targets.dml.placement_data import Registration, canonical_domain


@dataclasses.dataclass
class AnalysedNode:
    """A node of the analysed graph with what the placement needs."""

    node: ir.Node
    name: str
    index: int
    reg: Registration | None = None
    reason: str | None = None  # why not on DML (None: on DML)
    device: str = "dml"


def node_label(node: ir.Node, index: int, prefix: str = "") -> str:
    """The name placement results use for `node`, the `index`-th non-Constant node of its graph."""
    return prefix + (node.name or f"{node.op_type}_{index}")


def graph_attributes(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """(attribute name, body) for each subgraph of `node` (If branches, Loop/Scan bodies)."""
    found = []
    for name, attr in node.attributes.items():
        if attr.type == ir.AttributeType.GRAPH:
            found.append((name, attr.as_graph()))
        elif attr.type == ir.AttributeType.GRAPHS:
            found.extend((f"{name}[{i}]", g) for i, g in enumerate(attr.as_graphs()))
    return found


def op_name(node: ir.Node) -> str:
    domain = canonical_domain(node.domain)
    return f"{domain}.{node.op_type}" if domain else node.op_type


def constant_values(graph: ir.Graph) -> dict[int, ir.Value]:
    """Initializers and Constant outputs (ORT turns Constant nodes into initializers)."""
    constant: dict[int, ir.Value] = {id(v): v for v in graph.initializers.values()}
    for node in graph:
        if node.op_type == "Constant" and canonical_domain(node.domain) == "":
            constant.update((id(o), o) for o in node.outputs)
    return constant


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape.dims:
        if not isinstance(d, int):
            return None
        dims.append(d)
    return tuple(dims)


def dtype_name(value: ir.Value | None) -> str | None:
    if value is None or value.dtype is None:
        return None
    return value.dtype.name.lower()


def attribute_value(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def present_values(values) -> list:
    return [v for v in values if v is not None and v.name != ""]
