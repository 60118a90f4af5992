"""float16 validation of models with subgraphs: the rounding copy rounds inside If/Loop/Scan bodies too.

Before, the copy retyped a Scan's float16 outputs as float32 while its body still made float16, and
ONNX Runtime refused the copy: every --fp16 output with a Scan was "ONNX Runtime cannot load the model".
"""

from __future__ import annotations

import importlib

import numpy as np
from onnx import TensorProto, helper

import dmlopt

validate = importlib.import_module("dmlopt.runtime.validate")  # the module, not dmlopt.validate the function


def scan_model(half: bool = True):
    """y_t = (s + x_t)^2 with s carried, in float16 inside the body when `half`."""
    t = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "s_out"], ["y_t"])],
        "body", [helper.make_tensor_value_info("s_in", t, [2]), helper.make_tensor_value_info("x_t", t, [2])],
        [helper.make_tensor_value_info("s_out", t, [2]), helper.make_tensor_value_info("y_t", t, [2])])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xh"], to=t), helper.make_node("Cast", ["s"], ["sh"], to=t),
         helper.make_node("Scan", ["sh", "xh"], ["sf", "yh"], body=body, num_scan_inputs=1),
         helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float16_scan_body_is_rounded_and_runs():
    feeds = {"s": np.ones(2, np.float32), "x": np.array([[0, 1], [2, 3], [4, 300]], np.float32)}
    out = validate.run(dmlopt.load(scan_model()), feeds)["y"]
    # (1+4+300)^2 ... the carried state rounds in float16 at each step; 305^2 = 93025 overflows float16's 65504
    np.testing.assert_array_equal(out, [[1, 4], [9, 25], [49, np.inf]])


def test_a_float16_model_with_a_scan_is_validated():
    result = dmlopt.optimize(scan_model(), retime=False)
    assert result.passed and result.report.validation["outputs"][0]["max_abs"] == 0


def test_fp16_keeps_a_float16_scan_body_valid():
    """The fp16 pass cast a body's own float16 value at the top of the main graph (before its producer)."""
    result = dmlopt.optimize(scan_model(), passes="fp16", fp16=True, retime=False)
    assert result.passed
