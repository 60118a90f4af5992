"""op-versions: GroupNormalization -> InstanceNormalization form, GridSample-20/22 -> 16; declines with reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.targets.dml import placement
from dmlopt.passes import PassContext
from dmlopt.passes.op_versions import OpVersionsPass, opset_change_reason
from dmlopt.engine.pipeline import check_model, op_counts

RNG = np.random.default_rng(7)


def group_norm_model(opset=21, shape=(2, 6, 4, 5), groups=3, dtype=TensorProto.FLOAT, scale_as_input=False):
    channels = shape[1]
    n = channels if opset >= 21 else groups
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inputs = [helper.make_tensor_value_info("x", dtype, list(shape))]
    inits = [numpy_helper.from_array((RNG.random(n) + 0.5).astype(np_dtype), "b")]
    if scale_as_input:
        inputs.append(helper.make_tensor_value_info("s", dtype, [n]))
    else:
        inits.append(numpy_helper.from_array((RNG.random(n) + 0.5).astype(np_dtype), "s"))
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=groups, epsilon=1e-3)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def grid_sample_model(opset=20, mode="linear", x_shape=(1, 2, 5, 6), grid_shape=(1, 3, 4, 2), then="Relu",
                      extra_grid_sample=None):
    out_shape = [x_shape[0], x_shape[1], *grid_shape[1:-1]]
    nodes = [helper.make_node("GridSample", ["x", "grid"], ["g0"], name="gs", mode=mode, align_corners=1)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
              helper.make_tensor_value_info("grid", TensorProto.FLOAT, list(grid_shape))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)]
    nodes.append(helper.make_node(then, ["g0"], ["y"], name="after"))
    if extra_grid_sample is not None:
        x2, g2 = extra_grid_sample
        inputs += [helper.make_tensor_value_info("x2", TensorProto.FLOAT, list(x2)),
                   helper.make_tensor_value_info("grid2", TensorProto.FLOAT, list(g2))]
        nodes.append(helper.make_node("GridSample", ["x2", "grid2"], ["y2"], name="gs2"))
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [x2[0], x2[1], *g2[1:-1]]))
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def rewrite(proto, ort_version="1.23", target="dml"):
    original = dmlopt.load(proto)
    p = OpVersionsPass(PassContext(target=target, ort_version=ort_version))
    result = p(original.clone())
    if result.modified:  # (the onnx checker rejects GroupNormalization-18 itself: deprecated)
        check_model(result.model, "op-versions")
    return original, result, p


# ** GroupNormalization **

@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape, groups", [((2, 6, 4, 5), 3), ((1, 8, 7), 2), ((2, 4, 2, 3, 3), 4), ((1, 6, 3, 3), 1)])
def test_group_norm_becomes_instance_norm(opset, shape, groups):
    original, result, p = rewrite(group_norm_model(opset, shape, groups))
    counts = op_counts(result.model)
    assert "GroupNormalization" not in counts and counts["InstanceNormalization"] == 1
    (site,) = p.sites
    assert site.action == "rewrote" and site.node == "gn"
    v = dmlopt.validate(original, result.model)
    assert v.passed, v.to_table()
    assert placement.predict(result.model).cpu_count == 0


def test_group_norm_with_a_symbolic_batch_dim():
    proto = group_norm_model(21)
    for vi in (proto.graph.input[0], proto.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "n"
    original, result, _ = rewrite(proto)
    assert "InstanceNormalization" in op_counts(result.model)
    for batch in (1, 3):
        assert dmlopt.validate(original, result.model, shapes={"x": [batch, 6, 4, 5]}).passed


def test_group_norm_21_with_a_computed_scale():
    original, result, _ = rewrite(group_norm_model(21, scale_as_input=True))
    assert "InstanceNormalization" in op_counts(result.model)
    assert dmlopt.validate(original, result.model).passed


@pytest.mark.parametrize("kwargs, reason", [
    ({"dtype": TensorProto.FLOAT16}, "only float32 is rewritten"),
    ({"opset": 18, "scale_as_input": True}, "computed scale"),
])
def test_group_norm_declines(kwargs, reason):
    _, result, p = rewrite(group_norm_model(**kwargs))
    assert op_counts(result.model) == {"GroupNormalization": 1} and not result.modified
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


def test_group_norm_with_a_symbolic_channel_dim_declines():
    proto = group_norm_model(21)
    for vi in (proto.graph.input[0], proto.graph.output[0]):
        vi.type.tensor_type.shape.dim[2].dim_param = "h"
    _, result, p = rewrite(proto)
    assert op_counts(result.model) == {"GroupNormalization": 1}
    assert "static channel and spatial sizes" in p.sites[0].detail


def test_group_norm_channels_not_a_multiple_of_groups_declines():
    proto = group_norm_model(21, shape=(1, 6, 2, 2), groups=4)
    _, result, p = rewrite(proto)
    assert op_counts(result.model) == {"GroupNormalization": 1}
    assert "not a multiple of num_groups=4" in p.sites[0].detail


# ** GridSample **

@pytest.mark.parametrize("opset, mode, spelled", [(20, "linear", "bilinear"), (21, "nearest", "nearest"),
                                                  (22, "cubic", "bicubic")])
def test_grid_sample_is_lowered_to_16(opset, mode, spelled):
    original, result, p = rewrite(grid_sample_model(opset, mode))
    assert result.model.opset_imports[""] == 19
    (node,) = [n for n in result.model.graph if n.op_type == "GridSample"]
    assert node.attributes.get_string("mode") == spelled
    (site,) = p.sites
    assert site.action == "rewrote" and f"model opset {opset} -> 19" in site.detail
    v = dmlopt.validate(original, result.model)
    assert v.passed, v.to_table()
    before, after = placement.predict(original), placement.predict(result.model)
    assert before.cpu_count == 1 and after.cpu_count == 0


def test_grid_sample_types_only_change_elsewhere_is_fine():
    # Reshape-21 only added types over Reshape-19; the model's Reshape uses float
    proto = grid_sample_model(21, then="Reshape")
    proto.graph.node[1].input.append("shape")
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1, 2, 3, 4], dtype=np.int64), "shape"))
    original, result, _ = rewrite(proto)
    assert result.model.opset_imports[""] == 19
    assert dmlopt.validate(original, result.model).passed


def test_grid_sample_declines_when_another_op_needs_the_newer_opset():
    _, result, p = rewrite(grid_sample_model(20, then="Gelu"))
    assert result.model.opset_imports[""] == 20 and not result.modified
    (site,) = p.sites
    assert site.action == "declined" and "Gelu-20" in site.detail and "does not exist at opset 19" in site.detail


def test_grid_sample_5d_declines_and_holds_back_the_other():
    proto = grid_sample_model(20, extra_grid_sample=((1, 1, 3, 3, 3), (1, 2, 2, 2, 3)))
    _, result, p = rewrite(proto)
    assert result.model.opset_imports[""] == 20
    by_node = {s.node: s.detail for s in p.sites}
    assert "GridSample-16 is 4-D only" in by_node["gs2"]
    assert "needs the model at opset 19" in by_node["gs"] and "gs2" in by_node["gs"]


def test_grid_sample_on_ort_without_a_directml_kernel_declines():
    _, result, p = rewrite(grid_sample_model(20), ort_version="1.14")
    assert result.model.opset_imports[""] == 20
    assert "registers no GridSample" in p.sites[0].detail


def test_grid_sample_16_is_left_alone():
    _, result, p = rewrite(grid_sample_model(17, mode="bilinear"))
    assert not result.modified and not p.sites


def test_opset_change_reason_sees_attribute_changes():
    # DequantizeLinear-21 added block_size: not the same op at opset 19
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"], name="dq")], "g",
        [helper.make_tensor_value_info("q", TensorProto.INT8, [4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")])
    model = dmlopt.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    reason = opset_change_reason(model, 21, 19, set())
    assert reason is not None and "DequantizeLinear-21" in reason and "block_size" in reason


def test_placement_tables_register_grid_sample_16_from_ort_1_15():
    assert placement.registered_versions(placement.load_data("1.14"), "", "GridSample") == []
    for version in ("1.18", "1.23"):
        data = placement.load_data(version)
        assert placement.registered_versions(data, "", "GridSample") == [16]
        (row,) = data.registrations("", "GridSample")
        assert row.source  # every rule names its source


def test_only_for_directml_and_webgpu():
    assert not OpVersionsPass(PassContext(target="cuda")).enabled()
    assert OpVersionsPass(PassContext(target="dml")).enabled()
    assert OpVersionsPass(PassContext(target="webgpu")).enabled()


@pytest.mark.parametrize("opset", [18, 21])
def test_webgpu_pins_grid_sample_to_16_and_writes_group_norm_as_instance_norm(opset):
    """WebGPU registers GridSample for opsets 16-19 only and no GroupNormalization
    (dmlopt.targets.webgpu.registry; tests/test_webgpu.py measures both on the EP)."""
    original, result, p = rewrite(grid_sample_model(20), target="webgpu", ort_version=None)
    assert result.model.opset_imports[""] == 19 and p.sites[0].action == "rewrote"
    assert dmlopt.validate(original, result.model).passed
    original, result, p = rewrite(group_norm_model(opset), target="webgpu", ort_version=None)
    assert op_counts(result.model)["InstanceNormalization"] == 1 and p.sites[0].action == "rewrote"
    assert dmlopt.validate(original, result.model).passed


def test_through_optimize():
    result = dmlopt.optimize(grid_sample_model(20), passes=["op-versions"], target="dml", retime=False)
    assert result.passed, result.report.to_table()
    assert result.model.opset_imports[""] == 19
    (site,) = result.report.passes[0]["sites"]
    assert site["action"] == "rewrote" and site["opset"] == 19
