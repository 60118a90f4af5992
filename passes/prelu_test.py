"""prelu: one slope value becomes LeakyRelu; anything else declines with a reason."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.prelu import PReluPass, broadcast_keeps_shape
from dmlopt.engine.pipeline import check_model, op_counts


def prelu_model(slope, x_shape=(1, 3, 4, 5), dtype=TensorProto.FLOAT, slope_as_input=False, opset=17):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inputs = [helper.make_tensor_value_info("x", dtype, list(x_shape))]
    inits = []
    if slope_as_input:
        inputs.append(helper.make_tensor_value_info("s", dtype, list(np.shape(slope))))
    else:
        inits.append(numpy_helper.from_array(np.asarray(slope, dtype=np_dtype), "s"))
    graph = helper.make_graph([helper.make_node("PRelu", ["x", "s"], ["y"], name="prelu")], "g", inputs,
                              [helper.make_tensor_value_info("y", dtype, list(x_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def rewrite(proto):
    original = dmlopt.load(proto)
    p = PReluPass(PassContext(target="cpu"))
    result = p(original.clone())
    check_model(result.model, "prelu")
    return original, result.model, p


@pytest.mark.parametrize("slope", [np.float32(0.25), [0.25], [[[0.25]]], np.full((3, 1, 1), 0.25), np.full((5,), 0.25),
                                   np.full((1, 3, 4, 5), 0.25), [-1.5], [0.0], [3.0]])
def test_uniform_slope_becomes_leaky_relu(slope):
    original, out, p = rewrite(prelu_model(slope))
    (node,) = list(out.graph)
    assert node.op_type == "LeakyRelu"
    assert node.attributes.get_float("alpha") == float(np.asarray(slope, dtype=np.float32).flat[0])
    v = dmlopt.validate(original, out)
    assert v.passed, v.to_table()
    (site,) = p.sites
    assert site.action == "rewrote" and site.node == "prelu"


@pytest.mark.parametrize("slope, kwargs, reason", [
    (np.array([0.1, 0.2, 0.3], dtype=np.float32).reshape(3, 1, 1), {}, "slope has 3 different values"),
    ([0.25], {"slope_as_input": True}, "slope is not a constant"),
    ([0.1], {"dtype": TensorProto.DOUBLE}, "not exactly a float32"),
    ([np.inf], {}, "not finite"),
    (np.full((1, 1, 1, 1, 1), 0.25), {}, "may change the output shape"),
    ([2], {"dtype": TensorProto.INT32}, "no integer form"),
])
def test_declines_with_the_reason(slope, kwargs, reason):
    _, out, p = rewrite(prelu_model(slope, **kwargs))
    assert [n.op_type for n in out.graph] == ["PRelu"]
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


def test_float64_slope_that_is_a_float32_is_rewritten():
    original, out, _ = rewrite(prelu_model([0.25], dtype=TensorProto.DOUBLE))
    assert [n.op_type for n in out.graph] == ["LeakyRelu"]
    assert dmlopt.validate(original, out).passed


def test_symbolic_dim_against_a_non_unit_slope_dim_is_declined():
    model = prelu_model(np.full((3, 1, 1), 0.25))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "c"
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "c"
    _, out, p = rewrite(model)
    assert [n.op_type for n in out.graph] == ["PRelu"] and "may change the output shape" in p.sites[0].detail


def test_broadcast_keeps_shape():
    shape = ir.Shape([1, 3, "h", 5])
    assert broadcast_keeps_shape(shape, ())
    assert broadcast_keeps_shape(shape, (3, 1, 1))
    assert broadcast_keeps_shape(shape, (1, 1, 1, 5))
    assert not broadcast_keeps_shape(shape, (2, 1, 1))
    assert not broadcast_keeps_shape(shape, (4, 1))  # h is symbolic: could be 1 and grow to 4
    assert not broadcast_keeps_shape(shape, (1, 1, 1, 1, 1))
    assert not broadcast_keeps_shape(None, (1,))


@settings(max_examples=60, deadline=None)
@given(value=st.floats(-4, 4, allow_nan=False, width=32),
       shape=st.lists(st.integers(1, 3), min_size=1, max_size=4),
       slope_rank=st.integers(0, 4), data=st.data())
def test_random_uniform_slopes_are_exact(value, shape, slope_rank, data):
    slope_rank = min(slope_rank, len(shape))
    # each slope dim is 1 or x's size: broadcasting never grows the output
    slope_shape = [data.draw(st.sampled_from([1, d])) for d in shape[len(shape) - slope_rank:]]
    original, out, _ = rewrite(prelu_model(np.full(slope_shape, value, dtype=np.float32), x_shape=shape))
    assert [n.op_type for n in out.graph] == ["LeakyRelu"]
    v = dmlopt.validate(original, out)
    assert v.passed, v.to_table()


def test_inside_a_loop_body():
    body = helper.make_graph(
        [helper.make_node("PRelu", ["acc_in", "s"], ["acc_out"], name="body_prelu"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)
    graph = helper.make_graph(
        [loop], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array([-0.5], dtype=np.float32), "s"), numpy_helper.from_array(np.array(3), "n")])
    original, out, p = rewrite(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert op_counts(out) == {"Identity": 1, "LeakyRelu": 1, "Loop": 1}
    assert dmlopt.validate(original, out).passed


def test_torch_prelu_then_leaky_relu_strategy(tmp_path):
    from models.torch_cnn import export_torch_cnn

    path = export_torch_cnn(tmp_path / "cnn.onnx", channels=4, height=8, width=8)
    assert op_counts(dmlopt.load(path))["PRelu"] == 1
    result = dmlopt.optimize(str(path), passes=["prelu", "leaky-relu"], target="cpu", leaky_relu="decompose")
    assert result.passed, result.report.to_table()
    counts = op_counts(result.model)
    assert "PRelu" not in counts and "LeakyRelu" not in counts and counts["Max"] == 5
    (site,) = result.report.passes[0]["sites"]
    assert site["action"] == "rewrote" and site["alpha"] == pytest.approx(0.15)


def test_no_prelu_is_not_modified():
    model = dmlopt.load(pathlib.Path(dmlopt.__file__).parent / "data" / "cnn_leaky.onnx")
    result = PReluPass(PassContext())(model)
    assert not result.modified
