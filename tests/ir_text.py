"""Small models for pass tests, written in ONNX text (as onnxscript's rule tests are)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper


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


class Graph:
    """A tiny graph builder: named nodes, numpy initializers."""

    def __init__(self, seed=0):
        self.nodes, self.inits, self.rng, self._n = [], [], np.random.default_rng(seed), 0

    def const(self, value, dtype=np.float32):
        self._n += 1
        name = f"c{self._n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, *shape, scale=0.3):
        return self.const(self.rng.standard_normal(shape) * scale)

    def __call__(self, op, *inputs, **attrs):
        self._n += 1
        out = f"v{self._n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"n{self._n}", **attrs))
        return out

    def model(self, inputs, output, opset=17, shape=None):
        graph = helper.make_graph(self.nodes, "g", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                                                                          shape)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
