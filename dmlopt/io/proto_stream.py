"""Write a model as one .onnx file without a serialized copy of all its weights at once.

Why: ``ir.save`` builds the whole ModelProto (a copy of every weight) and then its bytes (a
second copy): on a 360 MB model that is 720 MB on top of the model itself.  Here the model is
serialized with a one-element stand-in for each large weight, and while the bytes are written,
each stand-in is replaced by its real tensor, serialized one at a time.  Protobuf frames a
nested message by its length, so the lengths of the graph field are computed first.  The
file has the same bytes ``ir.save`` writes (same fields, same order).
"""

from __future__ import annotations

import os
from typing import BinaryIO, Iterator

import numpy as np
import onnx_ir as ir

STREAM_BYTES = 4096  # tensors above this size are serialized one at a time
_GRAPH_FIELD = 7  # ModelProto.graph
_INITIALIZER_FIELD = 5  # GraphProto.initializer
_LEN = 2  # wire type of length-delimited fields


def save_inline(model: ir.Model, path: str | os.PathLike) -> None:
    """`model` (no external tensors) to `path`, as ``ir.save(model, path)`` would write it."""
    shell = model.clone()
    real: dict[int, ir.TensorProtocol] = {}  # index among the graph's serialized initializers
    index = 0
    for mine, theirs in zip(model.graph.initializers.values(), shell.graph.initializers.values()):
        tensor = mine.const_value
        if tensor is None:
            continue  # not serialized (ir.save warns and skips it)
        if tensor.nbytes > STREAM_BYTES:
            tensor.name = mine.name  # what ir.save does before serializing an initializer
            real[index] = tensor
            theirs.const_value = ir.Tensor(np.zeros(1, np.uint8), name=mine.name)
        index += 1
    proto = ir.to_proto(shell)
    graph = proto.graph.SerializeToString()
    proto.ClearField("graph")
    rest = proto.SerializeToString()
    pieces = list(_graph_pieces(graph, real))
    graph_size = sum(size for size, _ in pieces)
    with open(path, "wb") as f:
        graph_written = False
        for number, start, end in _fields(rest):
            if number > _GRAPH_FIELD and not graph_written:
                _write_graph(f, graph_size, pieces)
                graph_written = True
            f.write(rest[start:end])
        if not graph_written:
            _write_graph(f, graph_size, pieces)


def _write_graph(f: BinaryIO, size: int, pieces) -> None:
    f.write(_varint(_GRAPH_FIELD << 3 | _LEN) + _varint(size))
    for _, write in pieces:
        write(f)


def _graph_pieces(graph: bytes, real: dict[int, ir.TensorProtocol]):
    """(size, writer) for each field of the serialized graph, the stand-ins' real tensors in their place."""
    index = 0
    for number, start, end in _fields(graph):
        if number == _INITIALIZER_FIELD and index in real:
            yield _tensor_piece(real[index])
        else:
            chunk = graph[start:end]
            yield len(chunk), (lambda f, chunk=chunk: f.write(chunk))
        if number == _INITIALIZER_FIELD:
            index += 1


def _tensor_piece(tensor: ir.TensorProtocol):
    length = ir.serde.serialize_tensor(tensor).ByteSize()
    head = _varint(_INITIALIZER_FIELD << 3 | _LEN) + _varint(length)

    def write(f: BinaryIO) -> None:
        data = ir.serde.serialize_tensor(tensor).SerializeToString()
        if len(data) != length:
            raise RuntimeError(f"tensor '{tensor.name}' serialized to {len(data)} bytes, then {length}")
        f.write(head)
        f.write(data)

    return len(head) + length, write


def _fields(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each top-level field of a serialized message."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == _LEN:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        yield key >> 3, start, pos


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
