"""norm-fusion: RMSNorm / Add + LayerNormalization fused or declined, numerics kept either way; a
normalization over a non-last axis (SAM's channel LayerNorm2d) is never fused."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import Case

F = TensorProto.FLOAT


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


@st.composite
def norm_cases(draw):
    """RMSNorm (last axis or not), Add + LayerNormalization (3-D or not, residual, bias, broadcast skip)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    kind = draw(st.sampled_from(["rms", "skip", "mvn"]))
    rank = draw(st.sampled_from([3, 3, 3, 2, 4]))  # SkipLayerNormalization is 3-D
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    axis = draw(st.sampled_from([-1, -1, 1 % rank]))  # mostly the last axis; sometimes one before it
    d = shape[axis]
    eps = draw(st.sampled_from([1e-6, 1e-5, 1e-2]))
    inits, inputs, nodes = [], [helper.make_tensor_value_info("x", F, shape)], []
    if kind == "mvn":  # mean/variance over axes 2.. (InstanceNorm) or over the channels (SAM's LayerNorm2d)
        over = draw(st.sampled_from(["trailing", "trailing", "channels"]))
        axes = list(range(2, rank)) if over == "trailing" and rank >= 3 else [1]
        axis = -1 if axes != [1] else 1  # tags the case: channels are never fused
        nodes += [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
                  helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Pow", ["d", "two"], ["d2"]),
                  helper.make_node("ReduceMean", ["d2", "axes"], ["v"], keepdims=1),
                  helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
                  helper.make_node("Div", ["d", "sd"], ["y"], name="mvn")]
        inits += [_init("two", np.float32(2.0)), _init("axes", np.array(axes, dtype=np.int64)),
                  _init("eps", np.float32(eps))]
    elif kind == "rms":
        scale_shape = draw(st.sampled_from([[d], [d], [1] * (rank - 1) + [shape[-1]]]))
        if axis != -1:
            scale_shape = [d] + [1] * (rank - 1 - axis % rank)
        mul = ["w", "n"] if draw(st.booleans()) else ["n", "w"]
        nodes += [helper.make_node("Pow", ["x", "two"], ["sq"]),
                  helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                  helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["r"]),
                  helper.make_node("Reciprocal", ["r"], ["rr"]), helper.make_node("Mul", ["x", "rr"], ["n"]),
                  helper.make_node("Mul", mul, ["y"], name="rms")]
        inits += [_init("two", np.float32(2.0)), _init("axes", np.array([axis], dtype=np.int64)),
                  _init("eps", np.float32(eps)), _init("w", (rng.random(scale_shape) + 0.5).astype(np.float32))]
    else:
        skip_shape = draw(st.sampled_from([shape, shape, [1] + shape[1:]]))
        inputs.append(helper.make_tensor_value_info("b", F, skip_shape))
        add = ["x", "b"] if draw(st.booleans()) else ["b", "x"]
        nodes.append(helper.make_node("Add", add, ["s0"], name="add"))
        summed = "s0"
        if draw(st.booleans()):
            nodes.append(helper.make_node("Add", ["s0", "bias"], ["s"], name="add_bias"))
            inits.append(_init("bias", rng.random(shape[-1]).astype(np.float32)))
            summed = "s"
        norm_shape = shape[axis % rank:]
        inits += [_init("gamma", (rng.random(norm_shape) + 0.5).astype(np.float32)),
                  _init("beta", rng.random(norm_shape).astype(np.float32))]
        nodes.append(helper.make_node("LayerNormalization", [summed, "gamma", "beta"], ["n"], name="ln",
                                      axis=axis, epsilon=eps))
        if draw(st.booleans()):
            nodes.append(helper.make_node("Add", [summed, "n"], ["y"], name="residual"))
        else:
            nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    target = draw(st.sampled_from(["dml", "cuda"]))
    return Case(model, {"target": target, "ort_version": "1.23", "norm_fusion": "fuse"},
                label=f"{kind} axis={axis} shape={shape} {target}", tags={kind, "last" if axis == -1 else "inner"})


def test_norm_fusion_keeps_numerics_and_the_last_axis_rule():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=norm_cases())
    def prop(case):
        def only_last_axis(result):
            if "inner" in case.tags:  # the axis before the last: never a last-axis kernel
                assert not result.report.passes[0]["modified"], case.label

        outcome = run_case(case, "norm-fusion", then=only_last_axis)
        outcomes[(sorted(case.tags & {"rms", "skip", "mvn"})[0], outcome)] += 1

    prop()
    enough = PROPERTY_SETTINGS.max_examples // 15  # 20 of the 300 cases
    outcomes.require(enough, of=("rms", "rewrote"))
    outcomes.require(enough, of=("skip", "rewrote"))
    outcomes.require(enough, of=("skip", "declined"))
    outcomes.require(enough, of=("mvn", "rewrote"))
    outcomes.require(enough, of=("mvn", "declined"))
