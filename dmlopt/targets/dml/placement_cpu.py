"""Step 3: CPU preference (ORT's GetCpuPreferredNodes, fallback_cpu_capability.cc), and the
strided int64 rule of ORT <= 1.16.

Why: the EP sends shape arithmetic on CPU tensors (consumers of Shape/Size outputs whose inputs
are small initializers, graph inputs or CPU values) to the CPU even when DirectML has a kernel.
"""

from __future__ import annotations

import heapq

import numpy as np
import onnx_ir as ir

from dmlopt.targets.dml.placement_data import DmlData
from dmlopt.targets.dml.placement_nodes import AnalysedNode, dtype_name, static_shape


def cpu_preferred(graph: ir.Graph, analysed: list[AnalysedNode], constant: dict[int, ir.Value],
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
            if value is None or dtype_name(value) in blocking:
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
    shape = static_shape(value)
    if shape is None:
        tensor = value.const_value
        shape = tuple(tensor.shape) if tensor is not None else None
    return shape is not None and int(np.prod(shape, dtype=np.int64)) <= limit


def int64_source_check(item: AnalysedNode, by_value: dict[int, AnalysedNode],
                       constant: dict[int, ir.Value]) -> str | None:
    """ORT <= 1.16: int64 is emulated with strided 32-bit reads, safe only for values from DML nodes."""
    if item.reg is None or item.reg.int64_from_any_ep:
        return None
    for i, value in enumerate(item.node.inputs):
        if value is None or i in item.reg.cpu_inputs or dtype_name(value) not in ("int64", "uint64"):
            continue
        producer = by_value.get(id(value))
        if producer is None or producer.reason is not None:
            source = ("an initializer" if id(value) in constant else
                      "a graph input" if producer is None else f"CPU node {producer.name}")
            return (f"int64 input {i} comes from {source}; DirectML reads int64 as strided 32-bit only from "
                    "DML-produced values")
    return None
