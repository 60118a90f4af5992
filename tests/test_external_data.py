"""A model over 2 GB (weights in external data) loads, optimizes, validates and saves."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt

# Two weight tensors of 1.1 GB each: together above protobuf's 2 GiB limit.
N = 275_000_000


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big")
    w1 = numpy_helper.from_array(np.arange(N, dtype=np.float32), "W1")
    w2 = numpy_helper.from_array(np.full(N, 0.5, dtype=np.float32), "W2")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W1", "idx"], ["g1"]),
         helper.make_node("Gather", ["W2", "idx"], ["g2"]),
         helper.make_node("Add", ["g1", "g2"], ["s"]),
         helper.make_node("Identity", ["s"], ["y"])],
        "big", [helper.make_tensor_value_info("idx", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "big.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="big.onnx.data")
    del model, graph, w1, w2
    return path


@pytest.mark.slow  # builds a 2 GB model: ~8 GB peak, 50 s
def test_over_2gb_loads_optimizes_and_saves_with_external_data(big_model, tmp_path):
    data = big_model.parent / "big.onnx.data"
    size_before = data.stat().st_size
    assert size_before > 2**31
    model = dmlopt.load(big_model)
    result = dmlopt.optimize(model, passes=["cleanup"])
    assert result.passed, result.report.to_table()
    assert "Identity" not in result.report.output["op_counts"]
    out = dmlopt.save(result.model, tmp_path / "big.dml.onnx")
    assert (tmp_path / "big.dml.onnx.data").stat().st_size >= size_before
    assert out.stat().st_size < 10_000  # the graph alone; weights are external
    # the input is untouched, and the output runs with the same answer
    assert data.stat().st_size == size_before
    idx = {"idx": np.array([0, 1, 1000, N - 1], dtype=np.int64)}
    from dmlopt.runtime.validate import run

    y = run(dmlopt.load(out), idx)["y"]
    np.testing.assert_array_equal(y, np.array([0.5, 1.5, 1000.5, N - 1 + 0.5], dtype=np.float32))
