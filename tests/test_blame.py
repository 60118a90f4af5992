"""The pass blamed for a validation failure is one that changed the result, never the first pass by default."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import dmlopt


def empty_reduce_model():
    """ONNX's test_reduce_max_empty_set: every output is -inf, so no comparison passes, whatever the passes do."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["data", "axes"], ["reduced"], keepdims=1)], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 0, 4])],
        [helper.make_tensor_value_info("reduced", TensorProto.FLOAT, [2, 1, 4])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_no_pass_is_blamed_when_even_the_unchanged_model_cannot_pass():
    result = dmlopt.optimize(empty_reduce_model(), retime=False)
    assert not result.passed
    assert "no finite values" in result.report.validation["outputs"][0]["reason"]
    assert result.report.broken_by is None  # was 'cleanup', the first pass that ran
