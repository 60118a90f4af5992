"""op-versions: GroupNormalization and GridSample-20/22 rewritten or declined, numerics kept either way."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import Case

F = TensorProto.FLOAT


@st.composite
def group_norm_cases(draw):
    """GroupNormalization-21 of any group count, spatial rank 1-3, per-channel scale/bias."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    groups = draw(st.integers(1, 4))
    channels = groups * draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 2)), channels] + draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5]))
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=groups, epsilon=eps)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, shape)],
                              [numpy_helper.from_array((rng.random(channels) * 2 - 0.5).astype(np.float32), "s"),
                               numpy_helper.from_array(rng.random(channels).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model)
    return Case(model, {"target": "dml"}, label=f"GroupNormalization G={groups} shape={shape}", tags={"gn"})


@st.composite
def grid_sample_cases(draw):
    """GridSample-20/22, 4-D or 5-D, any mode/padding/align_corners, next to an op that may need opset 20."""
    opset = draw(st.sampled_from([20, 21, 22]))
    rank = draw(st.sampled_from([4, 4, 4, 5]))
    spatial_in = draw(st.lists(st.integers(2, 5), min_size=rank - 2, max_size=rank - 2))
    spatial_out = draw(st.lists(st.integers(1, 4), min_size=rank - 2, max_size=rank - 2))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    modes = ["linear", "nearest"] + (["cubic"] if rank == 4 else [])
    attrs = {"mode": draw(st.sampled_from(modes)), "align_corners": draw(st.integers(0, 1)),
             "padding_mode": draw(st.sampled_from(["zeros", "border", "reflection"]))}
    after = draw(st.sampled_from(["Relu", "Relu", "Gelu", "Softmax"]))
    shape = [n, c, *spatial_out]
    graph = helper.make_graph(
        [helper.make_node("GridSample", ["x", "grid"], ["g0"], name="gs", **attrs),
         helper.make_node(after, ["g0"], ["y"], name="after")], "g",
        [helper.make_tensor_value_info("x", F, [n, c, *spatial_in]),
         helper.make_tensor_value_info("grid", F, [n, *spatial_out, rank - 2])],
        [helper.make_tensor_value_info("y", F, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return Case(model, {"target": "dml", "ort_version": "1.23"},
                label=f"GridSample-{opset} rank {rank} {attrs} then {after}", tags={"gs"})


def test_op_versions_keep_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=st.one_of(group_norm_cases(), grid_sample_cases()))
    def prop(case):
        outcome = run_case(case, "op-versions")
        outcomes[(sorted(case.tags)[0], outcome)] += 1

    prop()
    enough = PROPERTY_SETTINGS.max_examples // 15
    outcomes.require(enough, of=("gn", "rewrote"))
    outcomes.require(enough, of=("gs", "rewrote"))
    outcomes.require(enough, of=("gs", "declined"))
