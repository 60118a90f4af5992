"""Small models for pass tests, written in ONNX text (as onnxscript's rule tests are)."""

from __future__ import annotations

import onnx_ir as ir

from models.onnx_builder import Graph  # noqa: F401 - the hand-built graphs of the pass tests


def text(body: str, opset: int = 17) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 8, opset_import: ["" : {opset}]>\n{body}')


def with_weights(model: ir.Model, **arrays) -> ir.Model:
    """Turn the graph inputs named in `arrays` into initializers holding those arrays."""
    for name, array in arrays.items():
        value = next(v for v in model.graph.inputs if v.name == name)
        model.graph.inputs.remove(value)
        value.const_value = ir.tensor(array)
        model.graph.register_initializer(value)
    return model
