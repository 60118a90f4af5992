"""ONNX shape inference on an ir.Model without serializing its weights.

``onnx.shape_inference`` takes a ModelProto, and ``ir.to_proto`` copies every tensor into it: on
SAM ViT-B (360 MB) each call cost ~2 s, and the placement model runs it once per folding round.
Inference needs only the weights' types and shapes, so the proto made here declares every large
main-graph initializer as a graph input of the same type and shape (the trick
``dmlopt.model.without_external_data`` plays for the checker) and holds no large tensor data;
the inferred types and shapes are then copied back onto the model's values by name.

Small initializers keep their data: inference reads constant inputs (Reshape's shape, Slice's
starts, axes, pads) and data propagation reads shape arithmetic.  Initializers of subgraphs are
left as they are (their graph inputs are positional, a Loop body cannot gain one); they are rare
and small in exported models.
"""

from __future__ import annotations

import logging

import onnx
import onnx_ir as ir

SMALL_TENSOR_BYTES = 4096  # initializers up to this size keep their data in the proto
logger = logging.getLogger(__name__)


def weightless_proto(model: ir.Model) -> onnx.ModelProto:
    """`model` as a ModelProto whose large main-graph initializers are typed graph inputs (no data)."""
    small, large = split_initializers(model)
    return proto_with(model, initializers=small, extra_inputs=[_declaration(v) for v in large])


def split_initializers(model: ir.Model) -> tuple[list[ir.Value], list[ir.Value]]:
    """The main graph's initializers as (small ones, large ones that are not also graph inputs)."""
    graph = model.graph
    small = [v for v in graph.initializers.values()
             if v.const_value is not None and v.const_value.nbytes <= SMALL_TENSOR_BYTES]
    kept = set(small)
    declared = set(graph.inputs)
    large = [v for v in graph.initializers.values() if v not in kept and v not in declared]
    return small, large


def proto_with(model: ir.Model, *, initializers: list[ir.Value], extra_inputs: list[ir.Value] = ()) -> onnx.ModelProto:
    """`model` as a ModelProto whose main graph keeps only `initializers` (and gains `extra_inputs`):
    the other weights are never copied into it."""
    graph = model.graph
    view = ir.GraphView([*graph.inputs, *extra_inputs], graph.outputs, nodes=graph, initializers=initializers,
                        doc_string=graph.doc_string, opset_imports=graph.opset_imports, name=graph.name)
    shell = ir.Model(ir.Graph([], [], nodes=[], opset_imports=dict(graph.opset_imports), name=graph.name),
                     ir_version=model.ir_version, producer_name=model.producer_name,
                     producer_version=model.producer_version, domain=model.domain,
                     model_version=model.model_version, functions=list(model.functions.values()))
    proto = ir.to_proto(shell)
    proto.graph.Clear()
    ir.serde.serialize_graph_into(proto.graph, view, model_ir_version=model.ir_version)
    return proto


def _declaration(initializer: ir.Value) -> ir.Value:
    """A stand-in graph input of the initializer's name, type and shape (its tensor's, if unset)."""
    tensor = initializer.const_value
    type_ = initializer.type or (ir.TensorType(tensor.dtype) if tensor is not None else None)
    shape = initializer.shape or (ir.Shape(tensor.shape) if tensor is not None else None)
    return ir.Value(name=initializer.name, type=type_, shape=shape)


def inferred_values(model: ir.Model, *, data_prop: bool = True) -> dict[ir.Graph, dict[str, ir.Value]]:
    """For each graph of `model` (subgraphs included), its values as onnx shape inference types them.

    The returned values are detached copies carrying only ``type`` and ``shape``; `model` is not
    changed.  Raises what onnx raises (callers treat inference as best effort).
    """
    proto = onnx.shape_inference.infer_shapes(weightless_proto(model), check_type=False, strict_mode=False,
                                              data_prop=data_prop)
    found: dict[ir.Graph, dict[str, ir.Value]] = {}
    _collect(model.graph, proto.graph, found)
    return found


def infer_shapes(model: ir.Model, *, data_prop: bool = True) -> bool:
    """Set the types and shapes onnx infers on `model`'s values, in place; whether any changed.

    An inferred type or shape replaces the value's own (onnx merged the declared ones into it);
    a value onnx says nothing about keeps its own.  When onnx fails, `model` is left as it was.
    """
    try:
        inferred = inferred_values(model, data_prop=data_prop)
    except Exception as e:  # noqa: BLE001 - best effort, as onnx_ir's ShapeInferencePass
        logger.warning("shape inference failed, shapes left as they were: %s", e)
        return False
    changed = False
    for graph, theirs in inferred.items():
        for value in graph_values(graph):
            new = theirs.get(value.name) if value.name else None
            if new is None:
                continue
            if new.type is not None and value.type != new.type:
                value.type = new.type
                changed = True
            if new.shape is not None and value.shape != new.shape:
                value.shape = new.shape
                changed = True
    return changed


def graph_values(graph: ir.Graph):
    """The values a graph defines: its inputs and every node output (initializers are typed already)."""
    yield from graph.inputs
    for node in graph:
        yield from node.outputs


def _collect(graph: ir.Graph, proto: onnx.GraphProto, found: dict[ir.Graph, dict[str, ir.Value]]) -> None:
    """Walk `graph` and its serialized `proto` together (same node order) and read the inferred types."""
    infos = {}
    for info in (*proto.input, *proto.value_info, *proto.output):
        if info.HasField("type"):
            infos[info.name] = info
    found[graph] = {name: ir.serde.deserialize_value_info_proto(info, None) for name, info in infos.items()}
    for node, node_proto in zip(graph, proto.node):
        attributes = {a.name: a for a in node_proto.attribute}
        for name, attr in node.attributes.items():
            if name not in attributes:
                continue
            if attr.type == ir.AttributeType.GRAPH:
                _collect(attr.as_graph(), attributes[name].g, found)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub, sub_proto in zip(attr.as_graphs(), attributes[name].graphs):
                    _collect(sub, sub_proto, found)
