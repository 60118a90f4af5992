"""norm-fusion: RMSNorm and Add + LayerNormalization fused over the last axis only; declines with reasons."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.targets.dml import placement
from dmlopt.passes import PassContext
from dmlopt.passes.norm_fusion import NormFusionPass
from dmlopt.engine.pipeline import check_model, op_counts

RNG = np.random.default_rng(3)
F = TensorProto.FLOAT


def _const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def rms_model(shape=(2, 5, 8), axis=-1, scale_shape=None, epsilon_as_input=False, scale_first=False):
    scale_shape = scale_shape or (shape[-1],)
    mul = ["w", "n"] if scale_first else ["n", "w"]
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["r"]),
             helper.make_node("Reciprocal", ["r"], ["rr"]), helper.make_node("Mul", ["x", "rr"], ["n"]),
             helper.make_node("Mul", mul, ["y"], name="rms")]
    inputs = [helper.make_tensor_value_info("x", F, list(shape))]
    inits = [_const("two", np.float32(2.0)), _const("axes", np.array([axis], dtype=np.int64)),
             _const("w", (RNG.random(scale_shape) + 0.5).astype(np.float32))]
    if epsilon_as_input:
        inputs.append(helper.make_tensor_value_info("eps", F, []))
    else:
        inits.append(_const("eps", np.float32(1e-6)))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def skip_model(shape=(2, 5, 8), skip_shape=None, residual=True, bias=False, gamma_shape=None, axis=-1,
               bias_shape=None):
    skip_shape = skip_shape or shape
    gamma_shape = gamma_shape or (shape[axis],)
    nodes = [helper.make_node("Add", ["a", "b"], ["s0"], name="add")]
    inits = [_const("gamma", (RNG.random(gamma_shape) + 0.5).astype(np.float32)),
             _const("beta", RNG.random(gamma_shape).astype(np.float32))]
    summed = "s0"
    if bias:
        nodes.append(helper.make_node("Add", ["s0", "bias"], ["s"], name="add_bias"))
        inits.append(_const("bias", RNG.random(bias_shape or shape[-1]).astype(np.float32)))
        summed = "s"
    nodes.append(helper.make_node("LayerNormalization", [summed, "gamma", "beta"], ["n"], name="ln", axis=axis,
                                  epsilon=1e-5))
    out = "n"
    if residual:
        nodes.append(helper.make_node("Add", [summed, "n"], ["z"], name="residual"))
        out = "z"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", F, list(shape)),
                                           helper.make_tensor_value_info("b", F, list(skip_shape))],
                              [helper.make_tensor_value_info(out, F, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def layer_norm_2d_model(shape=(1, 6, 4, 5), eps=1e-6):
    """SAM's neck LayerNorm2d: normalizes over the channels of NCHW, after a residual Add."""
    c = shape[1]
    nodes = [helper.make_node("Add", ["p", "q"], ["x"], name="add"),
             helper.make_node("ReduceMean", ["x", "axes"], ["u"], keepdims=1),
             helper.make_node("Sub", ["x", "u"], ["d"]), helper.make_node("Pow", ["d", "two"], ["d2"]),
             helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["nrm"]), helper.make_node("Mul", ["w", "nrm"], ["sc"]),
             helper.make_node("Add", ["sc", "bias"], ["y"], name="ln2d_out"),
             # and an RMS over the channels as well: must not become SimplifiedLayerNormalization
             helper.make_node("Pow", ["x", "two"], ["x2"]),
             helper.make_node("ReduceMean", ["x2", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["r"]),
             helper.make_node("Reciprocal", ["r"], ["rr"]), helper.make_node("Mul", ["x", "rr"], ["xn"]),
             helper.make_node("Mul", ["xn", "w"], ["z"], name="rms_c")]
    inits = [_const("axes", np.array([1], dtype=np.int64)), _const("two", np.float32(2.0)),
             _const("eps", np.float32(eps)), _const("w", (RNG.random((c, 1, 1)) + 0.5).astype(np.float32)),
             _const("bias", RNG.random((c, 1, 1)).astype(np.float32))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("p", F, list(shape)),
                                           helper.make_tensor_value_info("q", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, list(shape)),
                               helper.make_tensor_value_info("z", F, list(shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def rewrite(proto, target="dml", ort_version="1.23", mode="auto"):
    original = dmlopt.load(proto)
    p = NormFusionPass(PassContext(target=target, ort_version=ort_version, options={"norm_fusion": mode}))
    result = p(original.clone())
    check_model(result.model, "norm-fusion")
    return original, result, p


def assert_exact(original, result):
    v = dmlopt.validate(original, result.model)
    assert v.passed, v.to_table()


# ** RMSNorm **

@pytest.mark.parametrize("scale_first", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 8), (3, 16), (1, 2, 3, 4)])
def test_rms_norm_becomes_simplified_layer_norm_on_directml_1_23(shape, scale_first):
    original, result, p = rewrite(rms_model(shape, scale_first=scale_first))
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    (node,) = list(result.model.graph)
    assert node.attributes.get_int("axis") == -1 and node.attributes.get_float("epsilon") == pytest.approx(1e-6)
    (site,) = p.sites
    assert site.action == "rewrote" and site.node == "rms"
    assert_exact(original, result)
    assert placement.predict(result.model, ort_version="1.23").cpu_count == 0


def test_rms_norm_without_a_directml_kernel_declines():
    _, result, p = rewrite(rms_model(), ort_version="1.18")
    assert "SimplifiedLayerNormalization" not in op_counts(result.model)
    assert p.sites[0].action == "declined" and "1.18's DirectML registers no SimplifiedLayerNormalization" in p.sites[0].detail


def test_rms_norm_on_cuda_is_left_to_ort_unless_fuse():
    _, result, p = rewrite(rms_model(), target="cuda")
    assert "SimplifiedLayerNormalization" not in op_counts(result.model)
    assert p.sites[0].action == "kept" and "ORT fuses it" in p.sites[0].detail
    original, result, _ = rewrite(rms_model(), target="cuda", mode="fuse")
    assert op_counts(result.model) == {"SimplifiedLayerNormalization": 1}
    assert_exact(original, result)


@pytest.mark.parametrize("kwargs, reason", [
    ({"scale_shape": (1, 1, 8)}, "is not 1-D of the normalized size 8"),
    ({"epsilon_as_input": True}, "psilon"),
])
def test_rms_norm_declines(kwargs, reason):
    _, result, p = rewrite(rms_model(**kwargs), mode="fuse")
    assert "SimplifiedLayerNormalization" not in op_counts(result.model)
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


def test_rms_norm_over_a_non_last_axis_is_not_fused():
    _, result, _ = rewrite(rms_model((2, 5, 8), axis=1, scale_shape=(5, 1)), mode="fuse")
    assert "SimplifiedLayerNormalization" not in op_counts(result.model) and not result.modified


def test_keep_does_nothing():
    _, result, p = rewrite(rms_model(), mode="keep")
    assert not result.modified and not p.sites


# ** SkipLayerNormalization **

@pytest.mark.parametrize("target", ["dml", "cuda"])
@pytest.mark.parametrize("residual, bias", [(True, False), (False, False), (True, True), (False, True)])
def test_add_layer_norm_becomes_skip_layer_norm(target, residual, bias):
    original, result, p = rewrite(skip_model(residual=residual, bias=bias), target=target, mode="fuse")
    counts = op_counts(result.model)
    assert counts["com.microsoft.SkipLayerNormalization"] == 1 and "LayerNormalization" not in counts
    (node,) = [n for n in result.model.graph if n.op_type == "SkipLayerNormalization"]
    assert len(node.inputs) == (5 if bias else 4)
    # mean and inv_std_var stay empty (DirectML's support query sends them to the CPU)
    assert [o.name for o in node.outputs[1:3]] == ["", ""]
    assert bool(node.outputs[3].name) == residual
    assert p.sites[0].action == "rewrote" and p.sites[0].node == "ln"
    assert_exact(original, result)
    if target == "dml":
        assert placement.predict(result.model, ort_version="1.23").cpu_count == 0


def test_auto_leaves_skip_layer_norm_to_ort():
    _, result, p = rewrite(skip_model())
    assert not result.modified
    assert p.sites[0].action == "kept" and "ORT fuses it into SkipLayerNormalization" in p.sites[0].detail


@pytest.mark.parametrize("target", ["dml", "cuda"])
@pytest.mark.parametrize("shape", [(1, 4, 4, 8), (6, 8), (2, 1, 3, 2, 4)])
def test_other_ranks_fuse_on_a_3d_view_even_in_auto(target, shape):
    # SAM's blocks add and normalize [B, H, W, C]: ORT's own fusion takes 3-D only, so auto does it
    original, result, p = rewrite(skip_model(shape), target=target)
    counts = op_counts(result.model)
    assert counts["com.microsoft.SkipLayerNormalization"] == 1 and counts["Reshape"] == 4
    assert p.sites[0].action == "rewrote" and f"view of the rank-{len(shape)} input" in p.sites[0].detail
    assert_exact(original, result)
    if target == "dml":  # the contrib op's shapes are set: one compiled DirectML graph
        predicted = placement.predict(result.model, ort_version="1.23")
        assert predicted.cpu_count == 0 and predicted.partitions["compiled"]


def test_a_dynamic_rank_4_input_declines():
    proto = skip_model((1, 4, 4, 8))
    for vi in (*proto.graph.input, *proto.graph.output):
        vi.type.tensor_type.shape.dim[1].dim_param = "h"
    _, result, p = rewrite(proto, mode="fuse")
    assert "com.microsoft.SkipLayerNormalization" not in op_counts(result.model)
    assert "needs a static shape" in p.sites[0].detail


@pytest.mark.parametrize("kwargs, reason", [
    ({"skip_shape": (1, 5, 8)}, "two inputs of one shape (no broadcasting)"),
    ({"shape": (2, 4, 8), "skip_shape": (4, 8)}, "two inputs of one shape (no broadcasting)"),
])
def test_skip_layer_norm_declines(kwargs, reason):
    _, result, p = rewrite(skip_model(**kwargs), mode="fuse")
    assert "com.microsoft.SkipLayerNormalization" not in op_counts(result.model)
    (site,) = p.sites
    assert site.action == "declined" and reason in site.detail


@pytest.mark.parametrize("target", ["dml", "cuda"])
def test_a_site_left_to_ort_is_only_kept_not_also_declined_by_the_bias_variants(target):
    """BERT's embeddings: LayerNorm(Add(Add(a, b), c)) with a 3-D c.  The variant without bias matches
    and leaves it to ORT; the bias variants' own mismatch (c is not 1-D) is no reason to report."""
    _, result, p = rewrite(skip_model(bias=True, bias_shape=(2, 5, 8), residual=False), target=target)
    assert not result.modified
    assert [(s.node, s.action) for s in p.sites] == [("ln", "kept")]
    assert "ORT fuses it" in p.sites[0].detail


def test_layer_norm_over_a_non_last_axis_is_not_fused():
    _, result, _ = rewrite(skip_model(axis=1, gamma_shape=(5, 8)), mode="fuse")
    assert "com.microsoft.SkipLayerNormalization" not in op_counts(result.model) and not result.modified


@pytest.mark.parametrize("target", ["dml", "cuda"])
def test_sam_layer_norm_2d_over_channels_is_never_fused(target):
    original, result, p = rewrite(layer_norm_2d_model(), target=target, mode="fuse")
    assert op_counts(result.model) == op_counts(original)
    assert not result.modified and not any(s.action == "rewrote" for s in p.sites)
    assert_exact(original, result)


def test_placement_sends_skip_layer_norm_with_mean_output_to_cpu():
    graph = helper.make_graph(
        [helper.make_node("SkipLayerNormalization", ["a", "b", "g", "be"], ["y", "mean"], domain="com.microsoft",
                          name="sln")], "g",
        [helper.make_tensor_value_info("a", F, [1, 2, 4]), helper.make_tensor_value_info("b", F, [1, 2, 4])],
        [helper.make_tensor_value_info("y", F, [1, 2, 4]), helper.make_tensor_value_info("mean", F, None)],
        [_const("g", np.ones(4, np.float32)), _const("be", np.zeros(4, np.float32))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    (cpu,) = placement.predict(dmlopt.load(model)).cpu_nodes
    assert "mean/inv_std_var outputs" in cpu["reason"]


def test_through_optimize_with_the_option():
    result = dmlopt.optimize(skip_model(), passes=["norm-fusion"], target="dml", norm_fusion="fuse", retime=False)
    assert result.passed, result.report.to_table()
    assert op_counts(result.model)["com.microsoft.SkipLayerNormalization"] == 1
    result = dmlopt.optimize(rms_model(), passes=["norm-fusion"], target="dml", ort_version="1.23", retime=False)
    assert result.passed and op_counts(result.model) == {"SimplifiedLayerNormalization": 1}


# ** mean/variance -> InstanceNormalization **

def mean_variance_model(shape=(2, 4, 6), axes=None, group_norm_view=False, second_axes=None):
    """(x - mean) / sqrt(var + eps) over `axes`; with `group_norm_view`, the GroupNorm form of diffusion
    exports: Reshape [N, G, -1], normalize, Reshape back, per-channel Mul/Add."""
    axes = axes if axes is not None else [-1] if group_norm_view else list(range(2, len(shape)))
    nodes, inits = [], [_const("axes", np.array(axes, dtype=np.int64)), _const("two", np.float32(2.0)),
                        _const("eps", np.float32(1e-5))]
    x, out_shape = "x", list(shape)
    if group_norm_view:
        n, c = shape[0], shape[1]
        nodes.append(helper.make_node("Reshape", ["x", "view"], ["xv"]))
        inits.append(_const("view", np.array([n, 2, -1], dtype=np.int64)))
        x = "xv"
    axes2 = "axes2" if second_axes is not None else "axes"
    if second_axes is not None:
        inits.append(_const("axes2", np.array(second_axes, dtype=np.int64)))
    nodes += [helper.make_node("ReduceMean", [x, "axes"], ["m"], keepdims=1), helper.make_node("Sub", [x, "m"], ["d"]),
              helper.make_node("Pow", ["d", "two"], ["d2"]), helper.make_node("ReduceMean", ["d2", axes2], ["v"]),
              helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
              helper.make_node("Div", ["d", "sd"], ["nrm"], name="mvn")]
    result = "nrm"
    if group_norm_view:
        c = shape[1]
        nodes += [helper.make_node("Reshape", ["nrm", "back"], ["nb"]), helper.make_node("Mul", ["nb", "w"], ["nw"]),
                  helper.make_node("Add", ["nw", "bias"], ["y"])]
        inits += [_const("back", np.array(shape, dtype=np.int64)),
                  _const("w", (RNG.random((c, 1, 1)) + 0.5).astype(np.float32)),
                  _const("bias", RNG.random((c, 1, 1)).astype(np.float32))]
        result = "y"
    else:
        nodes.append(helper.make_node("Identity", ["nrm"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["dml", "cuda"])
@pytest.mark.parametrize("shape, axes", [((2, 4, 6), None), ((1, 3, 4, 5), None), ((1, 3, 4, 5), [-1, -2]),
                                         ((2, 2, 2, 3, 2), None)])
def test_mean_variance_over_trailing_axes_becomes_instance_norm(target, shape, axes):
    original, result, p = rewrite(mean_variance_model(shape, axes), target=target, ort_version="1.14")
    counts = op_counts(result.model)
    assert counts["InstanceNormalization"] == 1 and "ReduceMean" not in counts
    assert p.sites[0].action == "rewrote" and p.sites[0].node == "mvn"
    assert_exact(original, result)


def test_group_norm_written_with_reduce_means_becomes_instance_norm():
    original, result, _ = rewrite(mean_variance_model((2, 4, 3, 3), group_norm_view=True), ort_version="1.14")
    counts = op_counts(result.model)
    assert counts["InstanceNormalization"] == 1 and "ReduceMean" not in counts
    assert_exact(original, result)
    assert placement.predict(result.model, ort_version="1.14").cpu_count == 0


@pytest.mark.parametrize("kwargs, reason", [
    ({"shape": (1, 3, 4, 5), "axes": [3]}, "are not all axes after the first two"),
    ({"shape": (2, 4, 6), "second_axes": [-1]}, "do not reduce the same constant axes"),
])
def test_mean_variance_declines(kwargs, reason):
    _, result, p = rewrite(mean_variance_model(**kwargs))
    assert "InstanceNormalization" not in op_counts(result.model)
    assert p.sites[0].action == "declined" and reason in p.sites[0].detail


def test_mean_variance_keep():
    _, result, _ = rewrite(mean_variance_model(), mode="keep")
    assert not result.modified
