"""conv-transpose: the sub-pixel Conv + DepthToSpace (+ Slice) equals the ConvTranspose, or declines."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.passes import PassContext
from dmlopt.passes.conv_transpose import ConvTransposePass, plan_axis
from dmlopt.engine.pipeline import check_model, op_counts

rng = np.random.default_rng(0)
BUNDLED_CNN = pathlib.Path(dmlopt.__file__).parent / "data" / "cnn_leaky.onnx"


def conv_transpose_model(cin=4, cout=3, groups=1, kernel=(4, 4), strides=(2, 2), pads=(1, 1, 1, 1),
                         output_padding=None, dilations=None, bias=True, size=(5, 4), activation=None, opset=17,
                         **attrs):
    inits = [numpy_helper.from_array(rng.standard_normal((cin, cout // groups, *kernel)).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        inputs.append("b")
    if output_padding is not None:
        attrs["output_padding"] = list(output_padding)
    if dilations is not None:
        attrs["dilations"] = list(dilations)
    if pads is not None:
        attrs["pads"] = list(pads)
    out = "z" if activation else "y"
    nodes = [helper.make_node("ConvTranspose", inputs, [out], name="convt", group=groups, strides=list(strides), **attrs)]
    if activation:
        nodes.append(helper.make_node(activation, ["z"], ["y"], name="act"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def rewrite(proto, choice="subpixel", target="cpu"):
    original = dmlopt.load(proto)
    p = ConvTransposePass(PassContext(target=target, options={"conv_transpose": choice}))
    result = p(original.clone())
    check_model(result.model, "conv-transpose")
    return original, result.model, p


def assert_exact(original, rewritten, **kw):
    v = dmlopt.validate(original, rewritten, **kw)
    assert v.passed, v.to_table()


def test_kernel4_stride2_pads1_is_conv_depth_to_space_slice():
    original, out, p = rewrite(conv_transpose_model())
    assert [n.op_type for n in out.graph] == ["Conv", "DepthToSpace", "Slice"]
    conv, d2s, _ = list(out.graph)
    assert conv.inputs[1].const_value.shape == (3 * 4, 4, 2, 2)  # s*s*C_out channels, ceil(k/s) taps
    assert d2s.attributes.get_string("mode") == "CRD" and d2s.attributes.get_int("blocksize") == 2
    assert_exact(original, out)
    (site,) = p.sites
    assert site.action == "rewrote" and site.extra == {"strategy": "subpixel", "stride": 2}


def test_no_crop_no_slice():
    original, out, _ = rewrite(conv_transpose_model(kernel=(2, 2), pads=(0, 0, 0, 0)))
    assert [n.op_type for n in out.graph] == ["Conv", "DepthToSpace"]
    assert_exact(original, out)


def test_stride_one_is_a_plain_conv():
    original, out, _ = rewrite(conv_transpose_model(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1)))
    assert [n.op_type for n in out.graph] == ["Conv"]
    assert_exact(original, out)


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "Sigmoid"])
def test_activation_moves_next_to_the_conv(activation):
    original, out, _ = rewrite(conv_transpose_model(activation=activation))
    assert [n.op_type for n in out.graph] == ["Conv", activation, "DepthToSpace", "Slice"]
    assert_exact(original, out)


def test_activation_with_another_consumer_stays_after():
    model = conv_transpose_model(activation="Relu")
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", "c", "h", "w"]))
    original, out, _ = rewrite(model)
    assert [n.op_type for n in out.graph] == ["Conv", "DepthToSpace", "Slice", "Relu"]
    assert_exact(original, out)


def test_groups_carry_over():
    original, out, _ = rewrite(conv_transpose_model(cin=4, cout=6, groups=2, kernel=(3, 3), pads=(1, 0, 0, 1),
                                                    output_padding=(1, 1)))
    conv = next(n for n in out.graph if n.op_type == "Conv")
    assert conv.attributes.get_int("group") == 2 and conv.inputs[1].const_value.shape == (24, 2, 2, 2)
    assert_exact(original, out)


def test_dynamic_spatial_dims_at_two_sizes():
    model = conv_transpose_model(kernel=(3, 5), strides=(3, 3), pads=(2, 1, 0, 3), output_padding=(1, 2))
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("h", "w")):
        dim.dim_param = name
    original, out, _ = rewrite(model)
    for h, w in ((4, 7), (9, 3)):
        assert_exact(original, out, shapes={"x": [1, 4, h, w]})


@pytest.mark.parametrize("kwargs, reason", [
    (dict(dilations=(2, 2)), "dilations [2, 2]"),
    (dict(pads=None, auto_pad="SAME_UPPER"), "auto_pad=SAME_UPPER"),
    (dict(pads=None, output_shape=[10, 8]), "output_shape attribute"),
    (dict(opset=10), "opset 10 < 11"),
])
def test_declines_with_the_reason(kwargs, reason):
    original, out, p = rewrite(conv_transpose_model(**kwargs))
    assert [n.op_type for n in out.graph] == ["ConvTranspose"]
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


@pytest.mark.parametrize("strides, kernel, pads, output_padding", [
    ((2, 1), (4, 4), (1, 1, 1, 1), None), ((3, 2), (3, 3), (1, 2, 1, 2), (1, 1)), ((1, 3), (2, 5), (0, 1, 1, 2), None),
    ((3, 2), (3, 3), (0, 0, 0, 0), (1, 1))])
def test_unequal_strides_with_static_sizes_are_rewritten_exactly(strides, kernel, pads, output_padding):
    model = conv_transpose_model(strides=strides, kernel=kernel, pads=pads, output_padding=output_padding,
                                 groups=1, size=(5, 6))
    original, out, p = rewrite(model)
    assert "ConvTranspose" not in [n.op_type for n in out.graph]
    assert "Reshape/Transpose/Reshape" in p.sites[0].detail
    assert_exact(original, out)


def test_unequal_strides_with_dynamic_sizes_are_declined():
    model = conv_transpose_model(strides=(2, 1))
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    _, out, p = rewrite(model)
    assert [n.op_type for n in out.graph] == ["ConvTranspose"]
    assert "strides [2, 1] differ and the input's height and width are not static" in p.sites[0].detail


def test_declines_non_constant_weight_and_1d():
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convt", strides=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    _, _, p = rewrite(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert p.sites[0].detail == "weight is not a constant"
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="convt", strides=[2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8])],
                              [numpy_helper.from_array(np.ones((2, 3, 2), np.float32), "w")])
    _, _, p = rewrite(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "1-D ConvTranspose" in p.sites[0].detail


def test_keep_and_auto_defaults():
    _, out, p = rewrite(conv_transpose_model(), "keep")
    assert [n.op_type for n in out.graph] == ["ConvTranspose"] and p.sites[0].action == "kept"
    _, out, _ = rewrite(conv_transpose_model(), "auto", target="dml")
    assert "DepthToSpace" in op_counts(out)
    _, out, _ = rewrite(conv_transpose_model(), "auto", target="cpu")
    assert op_counts(out) == {"ConvTranspose": 1}


@pytest.mark.parametrize("kernel, stride, begin, end, output_padding", [(4, 2, 1, 1, 0), (3, 2, 1, 1, 1), (1, 3, 0, 0, 2),
                                                                       (5, 2, 4, 0, 0)])
def test_plan_covers_exactly_the_output(kernel, stride, begin, end, output_padding):
    plan = plan_axis(kernel, stride, begin, end, output_padding)
    for size in (1, 4, 7):
        conv_rows = size + plan.pad_begin + plan.pad_end - plan.taps + 1
        expected = (size - 1) * stride + kernel - begin - end + output_padding
        if expected > 0:
            assert conv_rows * stride - plan.crop_begin - plan.crop_end == expected
            assert plan.crop_begin >= 0 and plan.crop_end >= 0 and plan.pad_begin >= 0


@st.composite
def conv_transpose_cases(draw):
    groups = draw(st.sampled_from([1, 2, 3]))
    stride = draw(st.integers(1, 3))
    kernel = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    begin = [draw(st.integers(0, k - 1)) for k in kernel]
    end = [draw(st.integers(0, k - 1)) for k in kernel]
    output_padding = (draw(st.integers(0, stride - 1)), draw(st.integers(0, stride - 1)))
    size = (draw(st.integers(2, 5)), draw(st.integers(2, 5)))
    for i in range(2):  # ConvTranspose itself must have an output
        assume((size[i] - 1) * stride + kernel[i] - begin[i] - end[i] + output_padding[i] > 0)
    return dict(cin=groups * draw(st.integers(1, 2)), cout=groups * draw(st.integers(1, 2)), groups=groups,
                kernel=kernel, strides=(stride, stride), pads=begin + end, output_padding=output_padding,
                bias=draw(st.booleans()), size=size, activation=draw(st.sampled_from([None, None, "Relu", "LeakyRelu"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=conv_transpose_cases())
def test_random_conv_transposes_are_exact(case):
    model = conv_transpose_model(**case)
    original, out, p = rewrite(model)
    assert "ConvTranspose" not in op_counts(out), [s.detail for s in p.sites]
    assert op_counts(out)["Conv"] == 1 and op_counts(out).get("DepthToSpace", 0) == (case["strides"][0] > 1)
    assert_exact(original, out)


def test_bundled_cnn_with_every_leaky_strategy():
    for strategy in ("keep", "decompose", "relu-split", "conv-split", "channel-fold"):
        result = dmlopt.optimize(str(BUNDLED_CNN), passes=["leaky-relu", "conv-transpose"], target="cpu",
                                 leaky_relu=strategy, conv_transpose="subpixel")
        assert result.passed, result.report.to_table()
        counts = op_counts(result.model)
        assert "ConvTranspose" not in counts and counts["DepthToSpace"] == 1 and counts["Slice"] == 1


def test_torch_cnn_conv_transpose_with_leaky_relu(tmp_path):
    from models.torch_cnn import export_torch_cnn

    path = export_torch_cnn(tmp_path / "cnn.onnx", channels=4, height=8, width=6)
    result = dmlopt.optimize(str(path), passes=["conv-transpose"], target="cpu", conv_transpose="subpixel")
    assert result.passed, result.report.to_table()
    nodes = [n.op_type for n in result.model.graph]
    assert "ConvTranspose" not in nodes
    assert nodes[-4:] == ["Conv", "LeakyRelu", "DepthToSpace", "Slice"]  # the activation sits on the Conv
