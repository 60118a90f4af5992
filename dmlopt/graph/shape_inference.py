"""ONNX shape inference on an ir.Model without serializing its weights.

``onnx.shape_inference`` takes a ModelProto, and ``ir.to_proto`` copies every tensor into it: on
SAM ViT-B (360 MB) each call cost ~2 s, and the placement model runs it once per folding round.
Inference needs only the weights' types and shapes, so the proto made here declares every large
main-graph initializer as a graph input of the same type and shape (the trick
``without_external_data`` plays for the checker, below) and holds no large tensor data;
the inferred types and shapes are then copied back onto the model's values by name.

Small initializers keep their data: inference reads constant inputs (Reshape's shape, Slice's
starts, axes, pads) and data propagation reads shape arithmetic.  Initializers of subgraphs are
left as they are (their graph inputs are positional, a Loop body cannot gain one); they are rare
and small in exported models.

Two bounds live here because onnx's inference is where an unbounded model first explodes:
``check_function_expansion`` refuses model-local functions that would expand past
``MAX_INLINED_NODES`` nodes (onnx infers a function by expanding every call, as inlining does),
and ``folded_elements`` sizes a constant fold from the true shapes of its inputs, before any
folder evaluates it (a few bytes of Expand can ask for gigabytes).
"""

from __future__ import annotations

import logging
import math

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from dmlopt.errors import InputError

SMALL_TENSOR_BYTES = 4096  # initializers up to this size keep their data in the proto
# More nodes than any exported model has once its functions are inlined; beyond it, refused.
MAX_INLINED_NODES = 1_000_000
# Constant inputs up to this many elements are handed to onnx's node inference as data
# (shape, repeats, pads, Range's scalars decide an output's size).
SHAPE_DATA_ELEMENTS = 64
logger = logging.getLogger(__name__)


def tensor_bytes(tensor: ir.TensorProtocol) -> int:
    """Bytes of a tensor's data; for string tensors (no fixed item size), the bytes of its strings."""
    try:
        return tensor.nbytes
    except TypeError:
        return sum(len(s) for s in tensor.numpy().ravel())


def check_function_expansion(model: ir.Model, limit: int = MAX_INLINED_NODES) -> int:
    """Nodes of `model` once every call of a model-local function is inlined; InputError above `limit`.

    Counted without expanding anything (each function's size once, from its callees'), so
    functions that nest with a large fan-out are refused at once, as is a function that calls
    itself.  ONNX Runtime, onnx's shape inference and onnxscript's inliner all expand them.
    """
    functions = model.functions
    sizes: dict[tuple, int] = {}
    active: set[tuple] = set()

    def graph_size(nodes) -> int:
        total = 0
        for node in nodes:
            key = node.op_identifier()
            total += function_size(key) if key in functions else 1
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    total += graph_size(attr.as_graph())
                elif attr.type == ir.AttributeType.GRAPHS:
                    total += sum(graph_size(g) for g in attr.as_graphs())
            if total > limit:
                return total  # no need to count further: already refused
        return total

    def function_size(key: tuple) -> int:
        if key in sizes:
            return sizes[key]
        if key in active:
            raise InputError(f"model-local function {key[0]}::{key[1]} is recursive: it calls itself (directly "
                             "or through others), so it cannot be inlined")
        active.add(key)
        sizes[key] = graph_size(functions[key])
        active.discard(key)
        return sizes[key]

    if not functions:
        return sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
    try:  # the recursion depth is the nesting depth of the calls
        total = graph_size(model.graph)
    except RecursionError:
        raise InputError("model-local functions nest too deeply to be inlined") from None
    if total > limit:
        raise InputError(f"model-local functions expand to more than {limit} nodes when inlined "
                         f"(calls nest with a large fan-out): refused")
    return total


def weightless_proto(model: ir.Model) -> onnx.ModelProto:
    """`model` as a ModelProto whose large main-graph initializers are typed graph inputs (no data).

    Every inference goes through here: functions that would expand without bound are refused first."""
    check_function_expansion(model)
    small, large = split_initializers(model)
    return proto_with(model, initializers=small, extra_inputs=[_declaration(v) for v in large])


def without_external_data(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The checker would look for external files relative to the working folder (and read
    them).  The data was checked at load time, so each external initializer is checked as a
    graph input of the same type and shape instead: checker and shape inference need only that."""
    for graph in nested_graphs(proto.graph):
        external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
        if not external:
            continue
        keep = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        declared = {i.name for i in graph.input}
        for t in external:
            if t.name not in declared:
                graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return proto


def nested_graphs(graph: onnx.GraphProto):
    """`graph` and every graph in its nodes' attributes, at any depth."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from nested_graphs(attr.g)
            for g in attr.graphs:
                yield from nested_graphs(g)


def split_initializers(model: ir.Model) -> tuple[list[ir.Value], list[ir.Value]]:
    """The main graph's initializers as (small ones, large ones that are not also graph inputs)."""
    graph = model.graph
    small = [v for v in graph.initializers.values()
             if v.const_value is not None and tensor_bytes(v.const_value) <= SMALL_TENSOR_BYTES]
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
    data_prop = data_prop and data_propagation_allowed(model)
    proto = weightless_proto(model)
    proto = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=data_prop)
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
        # The message only: a record holding the exception would keep its frames, and with them
        # views of memory-mapped weights, alive in any handler that stores records.
        logger.warning("shape inference failed, shapes left as they were: %s", str(e).strip().splitlines()[0][:300])
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


# onnx's data propagation (data_prop=True) holds one shape dim (~75 bytes) per element of every
# 1-D vector it propagates (of any type, a graph input's included), per node that reads it: a 200-byte model whose 1-D input of a
# million elements is concatenated with itself 40 times took 2.9 GB, and Gather from a 1-D weight
# of 275M elements (tests/test_external_data.py) 20 GB.  Shape arithmetic propagates vectors of a
# few elements, so when the elements propagated could pass this budget, data propagation is left
# off (shapes are then inferred without it).
DATA_PROP_BUDGET = 1 << 21  # elements: ~150 MB at most
_CONCATENATING = ("Concat",)
_SHAPE_OPS = ("Shape", "Size")
_SHAPE_RANK_GUESS = 8  # elements of a Shape output whose input's rank is not declared


def data_propagation_cost(model: ir.Model) -> int:
    """An upper bound on the vector elements onnx's data propagation would materialize for `model`.

    Sources: tensors of rank 0 or 1 with a known size (graph inputs, initializers, which
    `weightless_proto` declares as inputs, Constant values) and Shape/Size outputs.  Each node
    reading one yields a result the size of its inputs together (Concat) or of the largest
    (anything else); every result counts, and results feed later nodes, so chains and fan-outs
    add up.  Counted without serializing or running anything, in one walk of every graph."""
    sizes: dict[int, int] = {}
    total = 0

    def declare(value: ir.Value, shape) -> None:
        if shape is None:
            return
        dims = list(shape)
        if len(dims) == 0:
            sizes[id(value)] = 1
        elif len(dims) == 1 and isinstance(dims[0], int):
            sizes[id(value)] = max(dims[0], 0)

    def walk(graph) -> bool:
        nonlocal total
        for value in getattr(graph, "inputs", ()):
            declare(value, value.shape)
        for value in getattr(graph, "initializers", {}).values():
            declare(value, value.const_value.shape if value.const_value is not None else value.shape)
        for node in graph:
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.GRAPH:
                    if walk(attr.value):
                        return True
                elif attr.type == ir.AttributeType.GRAPHS:
                    for g in attr.value:
                        if walk(g):
                            return True
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                attr = node.attributes.get("value")
                if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
                    declare(node.outputs[0], attr.value.shape)
                continue
            if node.op_type in _SHAPE_OPS:
                for out in node.outputs:
                    sizes[id(out)] = _SHAPE_RANK_GUESS
                continue
            read = [sizes[id(v)] for v in node.inputs if v is not None and id(v) in sizes]
            if not read:
                continue
            result = sum(read) if node.op_type in _CONCATENATING else max(read)
            total += result
            for out in node.outputs:
                sizes[id(out)] = result
            if total > DATA_PROP_BUDGET:
                return True
        return False

    walk(model.graph)
    for function in model.functions.values():
        walk(function)
    return total


def data_propagation_allowed(model: ir.Model) -> bool:
    """Whether onnx's data propagation on `model` stays within DATA_PROP_BUDGET."""
    return data_propagation_cost(model) <= DATA_PROP_BUDGET


def onnx_shape_inference(model: ir.Model, *, strict: bool = False) -> None:
    """onnx_ir's ShapeInferencePass (the whole model serialized, types and shapes set in place),
    with data propagation only where it stays bounded (`data_propagation_allowed`).  Every
    route to onnx's whole-model inference goes through here or `infer_shapes`."""
    check_function_expansion(model)
    if _has_non_tensors(model):  # onnx_ir 1.1 types an inferred sequence or optional as its element's tensor
        infer_shapes(model)
        return
    common_passes.ShapeInferencePass(strict_mode=strict, data_prop=data_propagation_allowed(model))(model)


# Ops that make sequences or optionals: a value they make is typed by onnx as no tensor.
NON_TENSOR_OPS = frozenset({"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt",
                            "SplitToSequence", "SequenceMap", "Optional", "OptionalGetElement", "OptionalHasElement"})


def _has_non_tensors(model: ir.Model) -> bool:
    """Whether a value of `model` may be a sequence or an optional (a graph's input or output, or an op's)."""
    for graph in model.graphs():
        for value in (*graph.inputs, *graph.outputs):
            if value.type is not None and not isinstance(value.type, ir.TensorType):
                return True
        if any(node.op_type in NON_TENSOR_OPS and node.domain in ("", "ai.onnx") for node in graph):
            return True
    return False


def folded_elements(node: ir.Node, opset: int | None = None, const=None) -> list[int] | None:
    """Elements of each output of `node` if it were evaluated on its constant inputs, or None.

    From onnx's inference of this one node on the inputs' true types and shapes (those of the
    tensors themselves, never a declared value_info, which a model may get wrong) and the data
    of its small constant inputs; None when an input is not constant or a size cannot be known.
    `const(value)` gives an input's tensor (default: its ``const_value``; the placement model
    also reads Constant nodes).  Nothing is evaluated: this is what a folder asks before it
    materializes a tensor.  String results count as unknown: their size is not in their shape
    (and onnx_ir cannot save a string tensor a folder makes).  A subgraph without its own opset
    imports is inferred with the newest schema; where that does not fit, the size is unknown.
    """
    input_types, input_data = {}, {}
    for value in node.inputs:
        if value is None or not value.name:
            continue
        tensor = const(value) if const is not None else value.const_value
        if tensor is None:
            return None
        type_proto = onnx.helper.make_tensor_type_proto(int(tensor.dtype), list(tensor.shape.numpy()))
        input_types[value.name] = type_proto
        if math.prod(tensor.shape.numpy()) <= SHAPE_DATA_ELEMENTS:
            try:
                input_data[value.name] = ir.serde.serialize_tensor(tensor)
            except Exception:  # noqa: BLE001 - unreadable data: sized without it
                pass
    domain = "" if node.domain == "ai.onnx" else node.domain
    try:
        version = opset if opset is not None else (node.graph.opset_imports.get(domain) if node.graph else None)
        schema = onnx.defs.get_schema(node.op_type, version or onnx.defs.onnx_opset_version(), domain)
        inferred = onnx.shape_inference.infer_node_outputs(schema, ir.serde.serialize_node(node), input_types,
                                                           input_data)
    except Exception:  # noqa: BLE001 - unknown op, bad attributes: not sizeable
        return None
    counts = []
    for out in node.outputs:
        type_proto = inferred.get(out.name)
        if type_proto is None or not type_proto.HasField("tensor_type") \
                or not type_proto.tensor_type.HasField("shape") \
                or type_proto.tensor_type.elem_type == onnx.TensorProto.STRING:  # a string has no fixed size
            return None
        dims = type_proto.tensor_type.shape.dim
        if any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims):
            return None
        counts.append(math.prod(d.dim_value for d in dims))
    return counts


def fold_refusal(node: ir.Node, limit: int, opset: int | None = None, counts: list[int] | None = None,
                 const=None) -> str | None:
    """Why `node` must not be evaluated by a folder allowed `limit` output elements; None if it may.

    An output over the limit is allowed when the constant inputs that die with the node are at
    least as big (a Transpose of a weight replaces it); an output whose size is unknown is
    refused.  Checked before evaluating, unlike onnxscript's own output limit.  `counts`: the
    node's `folded_elements`, when the caller has them; `const` as for `folded_elements`.
    """
    const = const or (lambda value: value.const_value)
    counts = counts if counts is not None else folded_elements(node, opset, const)
    if counts is None:
        return "result size unknown before evaluating it"
    total = sum(counts)
    if total <= limit:
        return None
    freed = 0
    for value in node.inputs:
        tensor = const(value) if value is not None else None
        if tensor is not None and len(value.uses()) == 1 and not value.is_graph_output():
            freed += math.prod(tensor.shape.numpy())
    if total <= freed:
        return None
    return f"result of {total} elements, over the folding limit of {limit}"


def sized_folds(limit: int):
    """A `should_fold` for onnxscript's folder: False where `fold_refusal` refuses, else its own rules."""
    return lambda node: False if fold_refusal(node, limit) is not None else None
