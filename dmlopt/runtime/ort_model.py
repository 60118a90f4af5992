"""Models dmlopt builds for ONNX Runtime (probes, test models) carry an IR version ORT can read.

Why: `onnx.helper.make_model` stamps the installed onnx's newest IR version; an onnx newer than
the ONNX Runtime beside it then writes models that ORT refuses ("Unsupported model IR version",
model.cc), and every probe fails (issue 30: onnx 1.23 with ORT 1.30 lost every WebGPU attention
fusion).  A built model instead gets the oldest IR version that holds its ai.onnx opset, from
onnx's own release table, which every ORT that has the opset reads.
"""

from __future__ import annotations

from typing import Iterable

import onnx
from onnx import helper

# Never older than IR 8 (onnx 1.13): below 4 every initializer must also be a graph input, below 8
# a model cannot hold local functions; every ORT dmlopt supports (1.17 and later) reads IR 8.
_FLOOR = 8


def ir_version_for(opsets: dict[str, int] | Iterable[onnx.OperatorSetIdProto]) -> int:
    """The oldest IR version whose onnx release defines the model's ai.onnx opset (at least 8)."""
    if not isinstance(opsets, dict):
        opsets = {o.domain: o.version for o in opsets}
    default = opsets.get("", opsets.get("ai.onnx", 1))
    for _release, ir_version, onnx_opset, *_ in helper.VERSION_TABLE:
        if onnx_opset >= default:
            return max(_FLOOR, ir_version)
    return onnx.IR_VERSION


def make_model(graph: onnx.GraphProto, opsets: dict[str, int], **kwargs) -> onnx.ModelProto:
    """`onnx.helper.make_model` with explicit opsets and the IR version `ir_version_for` gives."""
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version_for(opsets), **kwargs)

