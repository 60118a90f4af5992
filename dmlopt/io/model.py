"""Model I/O through onnx_ir: load with clear errors, save atomically, external data.

Why: a user's export may be a path, a ModelProto or an onnx_ir.Model; it may be over
2 GB with its weights in external data files.  Whatever goes wrong reading it must
become one readable line (`InputError`), and an output must never be half-written:
`save` writes into a temporary folder next to the destination and renames.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import pathlib
import stat
import weakref
from typing import Iterator, Union

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from dmlopt import limits
from dmlopt.io import outputs, scratch
from dmlopt.errors import InputError, OutputError, printable
from dmlopt.io.proto_stream import save_inline
from dmlopt.graph.shape_inference import (nested_graphs, split_initializers, tensor_bytes,
                                          weightless_proto, without_external_data)

ModelLike = Union[str, os.PathLike, onnx.ModelProto, ir.Model]

# Protobuf cannot serialize more than 2 GiB; above this, weights go to external data.
PROTOBUF_LIMIT = 2**31 - 1
# Save weights externally once they pass this size, well below the protobuf limit.
EXTERNAL_DATA_THRESHOLD = 1_500_000_000
# Python protobuf (upb) refuses messages nested deeper than this; a graph inside a node's
# attribute inside a graph takes three levels.
PROTOBUF_DEPTH = 100


def load(model: ModelLike) -> ir.Model:
    """Load a model from a path, a ModelProto or an onnx_ir.Model (returned as is)."""
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        # External data of a ModelProto is relative to the working folder (onnx's rule, as no file
        # is known): checked there like a file's against its folder.
        where, base = "the given ModelProto", pathlib.Path.cwd()
        _check_has_graph(model, where)
        _check_no_sparse_tensors(model, where)
        _check_unique_initializers(model, where)
        _check_external_data(model, base, where)
        ir_model = _deserialize(model, where)
        _resolve_external_data(ir_model, base)
        return ir_model
    if isinstance(model, (str, os.PathLike)):
        return _load_path(pathlib.Path(model))
    raise InputError(f"cannot load a model from {type(model).__name__}; give a path, an onnx.ModelProto or an onnx_ir.Model")


def _load_path(path: pathlib.Path) -> ir.Model:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{printable(str(path))}: no such file") from None
    except OSError as e:
        raise InputError(f"{printable(str(path))}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{printable(str(path))}: is a directory, not an ONNX file")
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read for ever
        raise InputError(f"{printable(str(path))}: not a regular file (a FIFO, device or socket)")
    if st.st_size == 0:
        raise InputError(f"{printable(str(path))}: empty file, not an ONNX model")
    if st.st_size > limits.PROTOBUF_BYTES:  # refused before it is read whole
        raise InputError(f"{printable(str(path))}: {st.st_size / 2**30:.3g} GiB, over protobuf's 2 GiB limit for one "
                         "message: not a readable ONNX file (a larger model keeps its weights in external data)")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        if "MaxDepth" in str(e) or "recursion" in str(e).lower():
            raise InputError(f"{path}: graphs nested too deeply: protobuf reads at most {PROTOBUF_DEPTH} levels of "
                             f"messages (about {PROTOBUF_DEPTH // 3} If/Loop/Scan bodies inside one another)") from e
        raise InputError(f"{path}: not a readable ONNX model (truncated or not ONNX: {_short(e)})") from e
    except Exception as e:  # noqa: BLE001 - protobuf may raise other types on garbage
        raise InputError(f"{path}: not a readable ONNX model ({_short(e)})") from e
    _check_has_graph(proto, str(path))
    _check_no_sparse_tensors(proto, str(path))
    _check_unique_initializers(proto, str(path))
    _check_external_data(proto, path.parent, str(path))
    model = _deserialize(proto, str(path))
    _resolve_external_data(model, path.parent)
    model.meta["dmlopt.source"] = str(path)  # runtime.users_file names it where ORT names a temporary copy
    return model


@contextlib.contextmanager
def _serde_warnings() -> Iterator[list[logging.LogRecord]]:
    """Hold back onnx_ir's serde warnings ("Input 'x' ... cannot be found in any scope", "The
    value type ... is not known"): on a broken model they would print before the one line
    that says what is wrong.  The caller turns them into that line, or re-emits them."""
    logger = logging.getLogger("onnx_ir.serde")
    records: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        records.append(record)
        return False

    logger.addFilter(hold)
    try:
        yield records
    finally:
        logger.removeFilter(hold)


def _release(records: list[logging.LogRecord]) -> None:
    for record in records:
        logging.getLogger(record.name).handle(record)


def _deserialize(proto: onnx.ModelProto, where: str) -> ir.Model:
    with _serde_warnings() as held:
        try:
            model = ir.serde.deserialize_model(proto)
        except Exception as e:  # noqa: BLE001 - onnx_ir raises many kinds on malformed protos
            raise InputError(f"{where}: not a valid ONNX model: {_short(_innermost(e))}") from e
    # onnx_ir goes on when a node reads a value nothing defines; that model is invalid.
    undefined = [str(r.args[0]) for r in held if "cannot be found in any scope" in str(r.msg) and r.args]
    if undefined:
        raise InputError(f"{where}: not a valid ONNX model: value '{undefined[0]}' is read by a node "
                         f"but no node, graph input or initializer defines it")
    _release(held)
    return model


def _innermost(e: BaseException) -> BaseException:
    """onnx_ir wraps the real reason ('Output y is redeclared') in 'Error calling ...'."""
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def check_input(model: ir.Model, where: str = "input model") -> None:
    """The onnx checker on the input: cycles, values nothing produces, duplicate names and
    unknown opsets become one InputError line instead of a failure deep inside a pass."""
    with _serde_warnings() as held:  # a value without a type: the checker's line says it
        try:
            proto = without_external_data(_checkable_proto(model))
            onnx.checker.check_model(proto)
        except Exception as e:  # noqa: BLE001
            raise InputError(f"{where} is not a valid ONNX model: {_short(_innermost(e))}") from e
    _release(held)
    if not proto.graph.output:
        raise InputError(f"{where} is not a valid ONNX model: its graph has no outputs")
    for opset in proto.opset_import:
        known = _known_opsets().get(opset.domain or "ai.onnx")
        if known is not None and opset.version > known:
            raise InputError(f"{where} uses opset {opset.version} of {opset.domain or 'ai.onnx'}, newer than the "
                             f"installed onnx {onnx.__version__} knows (up to {known}): its ops cannot be checked")


def _checkable_proto(model: ir.Model) -> onnx.ModelProto:
    """The model for the checker without a copy of all its weights at once: each large weight is
    checked on its own, then stands in the graph as a typed input (from IR 4, where an
    initializer need not be an input; before it, the whole model is serialized as it was)."""
    if model.ir_version is not None and model.ir_version < 4:
        return ir.to_proto(model)
    _, large = split_initializers(model)
    for value in large:
        if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor):
            onnx.checker.check_tensor(ir.serde.serialize_tensor(value.const_value))
    return weightless_proto(model)


@functools.lru_cache(maxsize=1)
def _known_opsets() -> dict[str, int]:
    """The newest opset of each domain the installed onnx has schemas for (custom domains: none)."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = schema.domain or "ai.onnx"
        newest[domain] = max(newest.get(domain, 0), schema.since_version)
    newest["ai.onnx"] = max(newest.get("ai.onnx", 0), onnx.defs.onnx_opset_version())
    return newest


def _check_has_graph(proto: onnx.ModelProto, where: str) -> None:
    if not proto.HasField("graph"):
        raise InputError(f"{where}: not an ONNX model (no graph)")
    if proto.ir_version == 0 and not proto.opset_import:
        raise InputError(f"{where}: not an ONNX model (no IR version and no opset)")


def _check_unique_initializers(proto: onnx.ModelProto, where: str) -> None:
    """Two initializers of one name: onnx_ir would keep one and ORT "the latest", silently."""
    for graph in nested_graphs(proto.graph):
        seen = set()
        for t in graph.initializer:
            if t.name in seen:
                raise InputError(f"{where}: not a valid ONNX model: initializer '{t.name}' is defined twice")
            seen.add(t.name)


def _iter_tensor_protos(proto: onnx.ModelProto):
    """Every dense tensor a model holds: initializers and tensor attributes (Constant's `value`,
    any TENSOR/TENSORS attribute) in the main graph, every subgraph and every model-local
    function, and the values and indices of sparse tensors.  One walk, so that every check of
    external data sees every tensor that may carry it."""
    yield from _graph_tensor_protos(proto.graph)
    for function in proto.functions:
        yield from _node_tensor_protos(function.node)


def _graph_tensor_protos(graph: onnx.GraphProto):
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensor_protos(graph.node)


def _node_tensor_protos(nodes):
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sparse in (*((attr.sparse_tensor,) if attr.HasField("sparse_tensor") else ()), *attr.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            if attr.HasField("g"):
                yield from _graph_tensor_protos(attr.g)
            for g in attr.graphs:
                yield from _graph_tensor_protos(g)


def _check_no_sparse_tensors(proto: onnx.ModelProto, where: str) -> None:
    """onnx_ir reads no sparse tensors: a sparse initializer would otherwise look like a value
    nothing defines, and a sparse Constant like a bug in onnx_ir."""
    for graph in _graph_protos(proto):
        if graph.sparse_initializer:
            name = graph.sparse_initializer[0].values.name
            raise InputError(f"{where}: sparse initializer '{name}' is not supported (dmlopt reads dense tensors "
                             f"only): store it as a dense initializer")
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("sparse_tensor") or attr.sparse_tensors:
                    raise InputError(f"{where}: node '{node.name or node.op_type}' has a sparse tensor attribute "
                                     f"'{attr.name}', which is not supported (dmlopt reads dense tensors only): "
                                     f"use a dense tensor ('value' instead of 'sparse_value')")


def _graph_protos(proto: onnx.ModelProto):
    """The main graph, its subgraphs, and every model-local function's body (as a node list
    holder with no initializers) and subgraphs."""
    yield from nested_graphs(proto.graph)
    for function in proto.functions:
        holder = onnx.GraphProto(node=function.node)
        yield from nested_graphs(holder)


def _check_external_data(proto: onnx.ModelProto, base: pathlib.Path, where: str) -> None:
    """Every external tensor's file (initializers, Constant values, tensors in subgraphs and in
    model-local functions) must exist inside the model's folder, and hold the bytes the tensor's
    shape needs: fail now, not mid-run.  A location that leads out of the folder
    (``../../etc/passwd``, an absolute path, a symlink) is refused: a model file must not make
    dmlopt read, or copy next to its output, a file the user did not hand it."""
    sizes: dict[str, int] = {}
    normal: dict[str, str] = {}
    for t in _iter_tensor_protos(proto):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if location not in sizes:
            file = external_data_path(base, location, t.name, where)
            if not file.is_file():
                raise InputError(f"{where}: external data file '{printable(location)}' for tensor "
                                 f"'{printable(t.name)}' is missing")
            sizes[location] = file.stat().st_size
            # One normal name (``w.bin/`` and ``missing/../w.bin`` are ``w.bin``): what was checked
            # is what every later reader (onnx_ir, ONNX Runtime) opens.
            normal[location] = file.relative_to(base.resolve()).as_posix()
        if normal[location] != location:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = normal[location]
        if any(d < 0 for d in t.dims):
            raise InputError(f"{where}: tensor '{printable(t.name)}' declares a negative dimension "
                             f"{list(t.dims)}: not a tensor shape")
        offset, length = _external_int(info, "offset", t, where), _external_int(info, "length", t, where)
        needed = _tensor_nbytes(t)
        if needed is not None and length is not None and length != needed:
            raise InputError(f"{where}: external data of tensor '{t.name}' is {length} bytes, but its shape and "
                             f"type need {needed}")
        end = (offset or 0) + (needed if needed is not None else length or 0)
        if end > sizes[location]:
            raise InputError(f"{where}: external data file '{location}' is too short for tensor '{t.name}' (truncated?)")


def external_data_path(base: pathlib.Path, location: str, tensor: str = "?", where: str = "model") -> pathlib.Path:
    """The file an external-data `location` names, resolved against the model's folder `base`
    (never the working folder); InputError when it is empty, holds a NUL byte, or leads out of
    the folder (``..``, an absolute path, a symlink)."""
    if not location:
        raise InputError(f"{where}: external data file '' for tensor '{printable(tensor)}' is missing")
    if "\0" in location:
        raise InputError(f"{where}: external data location '{printable(location)}' of tensor '{printable(tensor)}' "
                         f"holds a NUL byte: not a file name")
    try:
        file = (base / location).resolve()
        inside = file.is_relative_to(base.resolve())
    except (OSError, ValueError, RuntimeError) as e:  # a symlink loop, a name the OS refuses
        raise InputError(f"{where}: external data location '{printable(location)}' of tensor '{printable(tensor)}' "
                         f"cannot be resolved: {_short(e)}") from e
    if not inside:
        raise InputError(f"{where}: external data location '{printable(location)}' of tensor '{printable(tensor)}' "
                         f"is outside the model's folder; refusing to read it")
    return file


def _external_int(info: dict[str, str], key: str, t: onnx.TensorProto, where: str) -> int | None:
    if not info.get(key):
        return None
    try:
        value = int(info[key])
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"{where}: external data {key} '{info[key]}' of tensor '{t.name}' is not a byte count")
    return value


def _tensor_nbytes(t: onnx.TensorProto) -> int | None:
    """Bytes of a fixed-size tensor of t's dims and type, packed sub-byte types (int4, int2,
    float4e2m1) included: ceil(elements * bits / 8).  None for strings and unknown types."""
    count = 1
    for d in t.dims:
        count *= d
    bits = _sub_byte_bits(t.data_type)
    if bits:
        return (count * bits + 7) // 8
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:  # noqa: BLE001 - unknown or undefined type
        return None
    if t.data_type in (onnx.TensorProto.STRING,) or itemsize == 0:
        return None
    return count * itemsize


def _sub_byte_bits(data_type: int) -> int:
    """Bits per element of a packed sub-byte type; 0 for any other type."""
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2)):
        if getattr(onnx.TensorProto, name, None) == data_type:
            return bits
    return 0


def _resolve_external_data(model: ir.Model, base: pathlib.Path) -> None:
    """Read every tensor's external data from the model's folder, never the working folder:
    initializers (main graph and subgraphs) keep their reference with `base_dir` set, so large
    weights stay on disk; a Constant over external data in the main graph or a subgraph becomes
    such an initializer of its graph; any other tensor attribute (a Constant that is a graph
    output or in a function: a function has no initializers) and an initializer of a subgraph
    inside a function are read into memory now, because onnx_ir's save and ONNX Runtime's loader
    only follow the references of the initializers of `model.graphs()` (elsewhere they would be
    resolved against the working folder).  `_check_external_data` has checked every location."""
    saved = list(model.graphs())  # the graphs whose initializers onnx_ir's save writes out
    for graph in saved:
        _lift_external_constants(graph, base)
    kept = {id(g) for g in saved}
    for graph in _all_graphs(model):
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                if id(graph) in kept:
                    value.const_value.base_dir = str(base)
                    _live_external.add(value.const_value)
                else:  # a subgraph inside a function
                    value.const_value = _in_memory(value.const_value, base)
    for node in _all_nodes(model):
        for name, attr in list(node.attributes.items()):
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                node.attributes[name] = ir.AttrTensor(name, _in_memory(attr.value, base))
            elif attr.type == ir.AttributeType.TENSORS and any(isinstance(t, ir.ExternalTensor) for t in attr.value):
                tensors = [_in_memory(t, base) if isinstance(t, ir.ExternalTensor) else t for t in attr.value]
                node.attributes[name] = ir.AttrTensors(name, tensors)


def _lift_external_constants(graph: ir.Graph, base: pathlib.Path) -> None:
    """A Constant of `graph` whose `value` is external data becomes an initializer of `graph` of
    the same name that keeps the reference (read from `base`, memory-mapped when used), so that a
    large Constant is never read whole at load (nor by the checker, which sees large initializers
    as typed inputs).  A Constant that is a graph output stays a node (read below).

    Not onnx_ir's LiftConstantsToInitializersPass (1.1): it keeps the ExternalTensor too, but its
    one size limit is for every Constant: by default it also lifts each inline Constant of 16
    elements or more (the passes and the report's op counts see those as nodes) and leaves an
    external one of fewer to be read; no limit selects the external ones only."""
    for node in list(graph):
        attr = node.attributes.get("value")
        if (node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or attr is None or attr.is_ref()
                or not isinstance(attr.value, ir.ExternalTensor)):
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.name in graph.initializers:
            continue
        tensor = attr.value
        tensor.base_dir = str(base)
        _live_external.add(tensor)
        value = ir.Value(name=None, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype), const_value=tensor)
        ir.convenience.replace_all_uses_with(out, value)
        name = out.name
        graph.remove(node, safe=True)
        value.name = name
        graph.register_initializer(value)


def _in_memory(tensor: ir.ExternalTensor, base: pathlib.Path) -> ir.Tensor:
    tensor.base_dir = str(base)
    return ir.external_data.convert_tensors_from_external([tensor])[0]


def _all_nodes(model: ir.Model):
    """Every node: the main graph, model-local functions, and all their subgraphs."""
    yield from ir.traversal.RecursiveGraphIterator(model.graph)
    for function in model.functions.values():
        yield from ir.traversal.RecursiveGraphIterator(function)


def _all_graphs(model: ir.Model):
    """The main graph and every subgraph, those inside model-local functions included."""
    yield from model.graphs()
    for function in model.functions.values():
        for node in ir.traversal.RecursiveGraphIterator(function):
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.GRAPH:
                    yield attr.value
                elif attr.type == ir.AttributeType.GRAPHS:
                    yield from attr.value


def _all_initializer_tensors(model: ir.Model):
    for graph in _all_graphs(model):
        for value in graph.initializers.values():
            if value.const_value is not None:
                yield value.const_value


def initializer_bytes(model: ir.Model) -> int:
    """Bytes held in initializers and Constant nodes, the part of a file that folding can grow."""
    total = 0
    for tensor in _all_initializer_tensors(model):
        total += tensor_bytes(tensor)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    total += tensor_bytes(attr.value)
    return total


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialize, keeping external tensors as references (no weights are read)."""
    return ir.to_proto(model)


def save(model: ModelLike, path: str | os.PathLike, *, external_data: bool | None = None,
         protect: tuple[str | os.PathLike, ...] = (), value_info: bool = False) -> pathlib.Path:
    """Write `model` to `path` atomically; weights go to `<name>.data` when large.

    `protect` names files that must not be overwritten (the input model and its data).
    `value_info=False` leaves out the shapes of intermediate values: ONNX Runtime infers them
    again at session creation, and reading them back made it slower (onnxsim leaves them out
    too).  The caller's model keeps them.  Returns the path written.
    """
    model = load(model)
    if not value_info:
        model = without_value_info(model)
    dest = pathlib.Path(path)
    data_name = dest.name + ".data"
    parent = dest.parent if str(dest.parent) else pathlib.Path(".")
    protected = {os.fspath(p): "the input model" for p in protect}
    check_destination(dest, protected)
    check_destination(parent / data_name, protected)
    has_external = any(isinstance(t, ir.ExternalTensor) for t in _all_initializer_tensors(model))
    if external_data is None or external_data:
        _check_not_mapped(parent / data_name, model)
    _check_not_mapped(dest, model)
    if external_data is None:
        # Weights read from external data stay external, written next to the output: kept as
        # references, the output would point at the input's data file (missing in another folder).
        external_data = has_external or initializer_bytes(model) > EXTERNAL_DATA_THRESHOLD
    elif not external_data and has_external:
        model = ir.external_data.load_to_model(model.clone())  # inline them; the caller's model is kept
    tmp = None
    try:
        with scratch.uninterrupted():  # an interrupt waits until the folder's name is held
            tmp = scratch.make_folder(scratch.temp_prefix(dest.name), suffix=".tmp", parent=parent)
        renames = []
        if external_data:
            ir.save(model, tmp / dest.name, external_data=data_name)
            renames.append((tmp / data_name, parent / data_name))  # data first: a model never lacks it
        elif dest.suffix.lower() == ".onnx":
            save_inline(model, tmp / dest.name)  # ir.save's bytes, one weight serialized at a time
        else:
            ir.save(model, tmp / dest.name)
        renames.append((tmp / dest.name, dest))
        with scratch.uninterrupted():  # the group owns the folder from here
            group = outputs.Staged(f"the model {dest}", [(os.fspath(a), os.fspath(b)) for a, b in renames],
                                   folder=os.fspath(tmp))
            tmp = None
            outputs.put_in_place(group)  # now, or with the other outputs of the open transaction
    except OSError as e:  # the temporary folder's creation included
        raise OutputError(f"{printable(os.fspath(dest))}: cannot write: {e.strerror or e}") from e
    finally:
        if tmp is not None:
            scratch.remove(tmp)
    return dest


# Every external tensor `load` made, while something still holds it: onnx_ir reads its file
# lazily (memory-mapped on first use), so a file one of them reads must not be replaced.
_live_external: weakref.WeakSet = weakref.WeakSet()


def _check_not_mapped(target: pathlib.Path, model: ir.Model) -> None:
    """OutputError when `target` is a file that the weights of `model`, or of any model `load`
    made that is still alive, are read from.  Replacing it under them would make them read the
    new file's bytes at their old offsets: wrong values, silently, and wrong weights in any
    later save.  (`save` writes a new file and renames it: a weight already mapped keeps the
    old file, one not yet read would not.)"""
    if not os.path.lexists(target):
        return
    seen: set[str] = set()
    for tensor in itertools.chain(_all_initializer_tensors(model), list(_live_external)):
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        path = os.path.join(tensor.base_dir or "", os.fspath(tensor.location))
        if path in seen:
            continue
        seen.add(path)
        if _same_file(path, os.fspath(target)):
            raise OutputError(f"{printable(os.fspath(target))}: refusing to overwrite it: the weights of a loaded "
                              "model are read from it (save to another name, or load the weights into memory "
                              "first: onnx_ir.external_data.load_to_model)")


def without_value_info(model: ir.Model) -> ir.Model:
    """A copy (tensors shared) whose intermediate values and initializers carry no separate
    type or shape (an initializer's tensor has its own)."""
    copy = model.clone()
    for graph in copy.graphs():
        boundary = {id(v) for v in (*graph.inputs, *graph.outputs)}
        values = [v for node in graph for v in node.outputs] + list(graph.initializers.values())
        for value in values:
            if id(value) not in boundary:
                value.type = None
                value.shape = None
    return copy


def external_data_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The external data files a saved model refers to (for protecting the input)."""
    p = pathlib.Path(path)
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception:  # noqa: BLE001
        return []
    files = set()
    for t in _iter_tensor_protos(proto):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location" and e.value and "\0" not in e.value:  # load refuses the others
                    files.add(p.parent / e.value)
    return sorted(files)


def protected_paths(model_path: str | os.PathLike) -> dict[str, str]:
    """What no output of a run on `model_path` may replace: the model and its external data."""
    protected = {os.fspath(model_path): "the input model"}
    for file in external_data_files(model_path):
        protected.setdefault(os.fspath(file), "the input model's external data")
    return protected


def forbidden_destination(dest: str | os.PathLike, protected: dict[str, str] | None = None) -> str | None:
    """Why writing `dest` (a rename onto it) would destroy something, or None when it may be
    written.  Forbidden: a path in `protected` (path -> what it is: the input model, its data,
    the output written in this run), by name, symlink or hard link; an existing folder; and an
    existing file that is not a regular file (a FIFO, a device such as /dev/null, a socket),
    which the rename would replace.  The one rule for `-o`, the output's data file and --report."""
    dest = os.fspath(dest)
    for path, what in (protected or {}).items():
        if _same_file(dest, path):
            return f"refusing to overwrite {what}"
    try:
        st = os.stat(dest)  # follows a symlink: a link to /dev/null is refused like /dev/null
    except FileNotFoundError:
        return None
    except OSError as e:  # a symlink loop, a name too long, a path through a file
        return f"cannot write there: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        return "exists and is not a regular file (a FIFO, device or socket): refusing to replace it"
    return None


def check_destination(dest: str | os.PathLike, protected: dict[str, str] | None = None, *,
                      label: str = "") -> None:
    """OutputError (one line, exit 2) unless `dest` may be written: see forbidden_destination;
    its folder must also exist and be writable."""
    shown = f"{label}{printable(os.fspath(dest))}"
    reason = forbidden_destination(dest, protected)
    if reason is not None:
        raise OutputError(f"{shown}: {reason}")
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise OutputError(f"{shown}: folder {printable(parent)} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{shown}: folder {printable(parent)} is not writable")


def write_text(path: str | os.PathLike, text: str, what: str, protected: dict[str, str] | None = None, *,
               label: str = "") -> None:
    """Write `text` to `path` atomically (a temporary file beside it, then a rename), after the
    same check as every output (check_destination): the one writer of reports, session
    configurations and calibrations.  `what` names the file in the error."""
    path = os.fspath(path)
    check_destination(path, protected, label=label)
    parent = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        with scratch.uninterrupted():  # an interrupt waits until the file's name is held
            fd, tmp = scratch.make_file(scratch.temp_prefix(os.path.basename(path)), suffix=".tmp", parent=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes it 0600; a new file follows the umask, as the model
                os.fchmod(f.fileno(), outputs.creation_mode())
            f.write(text)
        with scratch.uninterrupted():
            group = outputs.Staged(what, [(tmp, path)])
            tmp = None
            outputs.put_in_place(group)  # now, or with the other outputs of the open transaction
    except OSError as e:
        raise OutputError(f"{printable(path)}: cannot write {what}: {e.strerror or e}") from e
    finally:
        if tmp is not None:
            with scratch.uninterrupted():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                scratch.settled(tmp)


def _same_file(a: str, b: str) -> bool:
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links: another name, the same file
    except OSError:
        return False


def _real(p) -> str:
    return os.path.realpath(os.fspath(p))


def _short(e: BaseException) -> str:
    """One line, whitespace collapsed: the checker's messages span several lines."""
    text = " ".join(str(e).split())
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)  # bytes of a damaged file
    return (text or type(e).__name__)[:300]
