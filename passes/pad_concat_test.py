"""pad-concat: constant Pads become Concats with filled blocks, exactly; other Pads decline with a reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.graph.check import check_model, op_counts
from dmlopt.passes import PassContext
from dmlopt.passes.pad_concat import PadConcatPass


def pad_model(shape=(1, 5, 6, 8), pads=(0, 0, 0, 0, 0, 2, 3, 0), value=None, mode=None, dtype=TensorProto.FLOAT,
              pads_as_input=False, dynamic=False):
    inputs = [helper.make_tensor_value_info("x", dtype, ["n", *shape[1:]] if dynamic else list(shape))]
    inits, names = [], ["x", "pads"]
    if pads_as_input:
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [len(pads)]))
    else:
        inits.append(numpy_helper.from_array(np.array(pads, dtype=np.int64), "pads"))
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, dtype=helper.tensor_dtype_to_np_dtype(dtype)), "v"))
        names.append("v")
    attrs = {"mode": mode} if mode else {}
    node = helper.make_node("Pad", names, ["p"], name="pad", **attrs)
    relu = helper.make_node("Relu", ["p"], ["y"], name="relu")  # the Pad's output is not the graph's output
    r = len(shape)
    out_shape = [("n" if dynamic and a == 0 else shape[a] + pads[a] + pads[a + r]) for a in range(r)]
    graph = helper.make_graph([node, relu], "g", inputs, [helper.make_tensor_value_info("y", dtype, out_shape)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def rewrite(proto, target="cuda", **options):
    original = dmlopt.load(proto)
    p = PadConcatPass(PassContext(target=target, options=options))
    result = p(original.clone())
    check_model(result.model, "pad-concat")
    return original, result.model, p


@pytest.mark.parametrize("shape, pads, value", [
    ((1, 5, 6, 8), (0, 0, 0, 0, 0, 2, 3, 0), None),          # SAM's window partition: H and W at the end
    ((1, 5, 6, 8), (0, 1, 2, 0, 0, 2, 0, 0), 1.5),           # before and after, a fill value
    ((2, 3, 4), (1, 0, 0, 0, 0, 2), -2.0),                   # leading axis, rank 3
    ((7,), (3, 0), None),                                    # rank 1, before only
])
def test_constant_pad_becomes_concat_exactly(shape, pads, value):
    original, out, p = rewrite(pad_model(shape, pads, value))
    counts = op_counts(out)
    assert counts.get("Pad", 0) == 0 and counts.get("Concat", 0) == sum(
        1 for a in range(len(shape)) if pads[a] or pads[a + len(shape)])
    v = dmlopt.validate(original, out)
    assert v.passed and all(o.max_abs == 0.0 for o in v.outputs), v.to_table()
    assert [s.action for s in p.sites] == ["rewrote"]


@pytest.mark.parametrize("kwargs, reason", [
    ({"mode": "reflect"}, "mode=reflect"),
    ({"pads": (0, 0, 0, 0, 0, -1, 0, 0)}, "negative pads"),
    ({"pads_as_input": True}, "pads are computed"),
    ({"dynamic": True}, "not static"),
])
def test_other_pads_decline_with_a_reason(kwargs, reason):
    original, out, p = rewrite(pad_model(**kwargs))
    assert op_counts(out).get("Pad") == 1
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


@pytest.mark.parametrize("target, expected_pads", [("cuda", 0), ("dml", 1), ("cpu", 1)])
def test_auto_default_per_target(target, expected_pads):
    _, out, _ = rewrite(pad_model(), target=target)
    assert op_counts(out).get("Pad", 0) == expected_pads


def test_keep_leaves_the_model():
    _, out, p = rewrite(pad_model(), pad_concat="keep")
    assert op_counts(out).get("Pad") == 1 and not p.sites


def test_float16_pad_is_exact():
    original, out, _ = rewrite(pad_model(dtype=TensorProto.FLOAT16, value=0.5))
    assert op_counts(out).get("Pad", 0) == 0
    v = dmlopt.validate(original, out)
    assert v.passed and all(o.max_abs == 0.0 for o in v.outputs), v.to_table()
