"""A tiny ONNX graph builder for hand-made test models: named nodes, seeded numpy weights."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from dmlopt.runtime import ort_model


class Graph:
    """A tiny graph builder: named nodes, numpy initializers."""

    def __init__(self, seed=0, opset=17):
        self.nodes, self.inits, self.rng, self._n = [], [], np.random.default_rng(seed), 0
        self.opset = opset

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

    def model(self, inputs, output, opset=None, shape=None):
        opset = opset or self.opset
        graph = helper.make_graph(self.nodes, "g", inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                                                                          shape)], self.inits)
        return ort_model.make_model(graph, {"": opset})
