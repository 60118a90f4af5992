"""Helpers and rewrite rules that more than one pass uses (one copy, imported by each)."""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import pattern

from dmlopt.graph import shape_inference
from dmlopt.passes._base import SiteRule

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16})


class DeduplicateInitializers(common_passes.DeduplicateInitializersPass):
    """onnx_ir's DeduplicateInitializersPass without its warning for each initializer it rightly leaves alone
    ("Skipped deduplication of initializer ... as it is a graph input or output": a caller may override it).
    Through dmlopt's Python API that warning reached the user's stderr once per such initializer, and a model
    of IR version < 4 lists every initializer as a graph input; the choice is the right one and nothing to say."""

    _LOGGER = logging.getLogger(common_passes.DeduplicateInitializersPass.__module__)

    @staticmethod
    def _drop(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Skipped deduplication")

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self._LOGGER.addFilter(self._drop)
        try:
            return super().call(model)
        finally:
            self._LOGGER.removeFilter(self._drop)


class Decline(Exception):
    """A site cannot be rewritten exactly; the message says why (the site's reason in the report).

    The one "decline this site, with this reason" exception of the passes.  Not-a-site is no
    exception (a check returns early), and `_layout.NotAView` is the layout algebra's answer,
    which a caller may turn into a Decline.
    """


def is_static(value: ir.Value | None) -> bool:
    """Whether `value` has a known shape made of integers only."""
    return value is not None and value.shape is not None and all(isinstance(d, int) for d in value.shape.dims)


def show_shape(shape: ir.Shape | None) -> str:
    """``[1,3,N,?]``: a shape for the report, symbolic dims by name."""
    if shape is None:
        return "[?]"
    return "[" + ",".join(str(d) if isinstance(d, int) else (d.value or "?") for d in shape.dims) + "]"


class ReshapeNoOp(SiteRule):
    """``Reshape(x, s)`` -> x when static shapes show it keeps x's shape (``s`` may hold -1 or 0)."""

    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _allow_other_attributes=True)

    def check(self, context, x, shape, **_):
        out = context.output_values[0]
        if not (is_static(x) and is_static(out)) or x.shape.dims != out.shape.dims:
            return pattern.MatchResult().fail("shape changes or is not static")
        return pattern.MatchResult()

    def rewrite(self, op, x, shape, **_):
        return op.Identity(x)


def unused_initializers(model: ir.Model) -> set[ir.Value]:
    return {v for graph in model.graphs() for v in graph.initializers.values()
            if not v.uses() and not v.is_graph_input() and not v.is_graph_output()}


def drop_orphaned_initializers(model: ir.Model, unused_before: set[ir.Value]) -> None:
    """Remove the initializers a rewrite left unused (the rewriter keeps them: old weights)."""
    for graph in model.graphs():
        for name, value in list(graph.initializers.items()):
            if value not in unused_before and not value.uses() and not value.is_graph_input() \
                    and not value.is_graph_output():
                del graph.initializers[name]


def all_nodes(model: ir.Model):
    """Every node: all graphs (subgraphs included), then the model's functions."""
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from function


def regroup(w: np.ndarray, groups: int) -> np.ndarray:
    """Conv weight [O, I/g, ...] <-> per-input-channel layout [I, O/g, ...] (ConvTranspose's).

    Rows are split into `groups` blocks; in each block the two leading axes swap.  The same
    function converts either way, and between a ConvTranspose weight and per-output rows.
    """
    rows, cols = w.shape[:2]
    spatial = w.shape[2:]
    blocks = w.reshape(groups, rows // groups, cols, *spatial).swapaxes(1, 2)
    return blocks.reshape(groups * cols, rows // groups, *spatial)


def graph_values(graph: ir.Graph):
    """The graph's inputs and every node output (not its initializers)."""
    yield from graph.inputs
    for node in graph:
        yield from node.outputs


def constant_array(value: ir.Value | None, *, constant_nodes: bool = False) -> np.ndarray | None:
    """The value of an initializer that is not a graph input (so cannot be fed another) or, with
    `constant_nodes`, of an ONNX Constant node's ``value``; None for anything else and for data
    that cannot be read (external data missing and the like): the caller then declines the site."""
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    producer = value.producer()
    if (tensor is None and constant_nodes and producer is not None and producer.op_type == "Constant"
            and producer.domain in ("", "ai.onnx") and "value" in producer.attributes):
        tensor = producer.attributes["value"].value
    if tensor is None:
        return None
    try:
        return tensor.numpy()
    except Exception:  # noqa: BLE001 - external data missing and the like
        return None


# -- shape inference ----------------------------------------------------------------------
def infer_static_dims(model: ir.Model) -> int:
    """onnx shape inference (data propagation on), merged so that static dims win; dims made static."""
    try:
        inferred = shape_inference.inferred_values(model)  # no weight is serialized for it
    except Exception:  # noqa: BLE001 - best effort: the model keeps the shapes it has
        return 0
    gained = 0
    for graph, theirs in inferred.items():
        for value in graph_values(graph):
            new = theirs.get(value.name)
            if new is None:
                continue
            if value.type is None and new.type is not None:
                value.type = new.type  # the whole type: a sequence's dtype is its element's (a tensor's, if set)
            merged, n = _merge(value.shape, new.shape)
            if n:
                value.shape = merged
                gained += n
    return gained


def _merge(ours: ir.Shape | None, theirs: ir.Shape | None) -> tuple[ir.Shape | None, int]:
    if theirs is None:
        return ours, 0
    if ours is None:
        return theirs, sum(isinstance(d, int) for d in theirs.dims) or 1
    if len(ours) != len(theirs):
        return ours, 0
    dims, gained = [], 0
    for a, b in zip(ours.dims, theirs.dims):
        if not isinstance(a, int) and isinstance(b, int):
            dims.append(b)
            gained += 1
        else:
            dims.append(a)
    return ir.Shape(dims), gained
