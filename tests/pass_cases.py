"""dmlopt's own cases for the suite of tests/onnx_suite.py: each rewriting pass's sites at old and new opsets.

ONNX's single-node tests never put a LeakyRelu after a Conv or an Add after a MatMul, so each
strategy of each rewriting pass gets its own small model here, made at opsets 7, 11, 13 and the
newest (each op in its form at that opset: Gemm's C, ReduceMean's axes), with the expected outputs
from ORT on the model as made.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_suite import Case, model_case

OPSETS = (7, 11, 13, onnx.defs.onnx_opset_version())
LEAKY_STRATEGIES = ("keep", "decompose", "relu-split", "conv-split", "channel-fold")


def _model(nodes, x_shape, y_shape, inits, opset, name):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7 if opset < 21 else 10)


def _w(rng, name, *shape):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _linear(kind: str, rng, src: str, dst: str, k: int, n: int, suffix: str):
    """x[., k] -> [., n] by Conv (1x1 on NCHW), Gemm (with C, as Gemm before 11 needs) or MatMul."""
    if kind == "Conv":
        return [helper.make_node("Conv", [src, f"w{suffix}", f"b{suffix}"], [dst], kernel_shape=[3, 3],
                                 pads=[1, 1, 1, 1])], [_w(rng, f"w{suffix}", n, k, 3, 3), _w(rng, f"b{suffix}", n)]
    if kind == "Gemm":
        return [helper.make_node("Gemm", [src, f"w{suffix}", f"b{suffix}"], [dst], transB=1)], \
            [_w(rng, f"w{suffix}", n, k), _w(rng, f"b{suffix}", n)]
    return [helper.make_node("MatMul", [src, f"w{suffix}"], [dst])], [_w(rng, f"w{suffix}", k, n)]


def leaky_chain(kind: str, opset: int, alpha: float = 0.2) -> onnx.ModelProto:
    """P -> LeakyRelu -> Q -> LeakyRelu: every strategy's site, channel-fold's pair included."""
    rng = np.random.default_rng(0)
    x_shape, y_shape = ((1, 4, 6, 6), (1, 4, 6, 6)) if kind == "Conv" else ((3, 4), (3, 4))
    first, w1 = _linear(kind, rng, "x", "p", 4, 6, "1")
    second, w2 = _linear(kind, rng, "l", "q", 6, 4, "2")
    nodes = [*first, helper.make_node("LeakyRelu", ["p"], ["l"], alpha=alpha), *second,
             helper.make_node("LeakyRelu", ["q"], ["y"], alpha=alpha * 10)]
    return _model(nodes, x_shape, y_shape, w1 + w2, opset, f"leaky_{kind}")


def prelu_one_slope(opset: int) -> onnx.ModelProto:
    slope = numpy_helper.from_array(np.full((4, 1, 1), 0.25, np.float32), "s")
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
                   helper.make_node("PRelu", ["c", "s"], ["y"])], (1, 4, 5, 5), (1, 4, 5, 5),
                  [slope, _w(np.random.default_rng(1), "w", 4, 4, 1, 1), _w(np.random.default_rng(2), "b", 4)],
                  opset, "prelu")


def matmul_add(opset: int) -> onnx.ModelProto:
    """Add(MatMul(a, W), b) with a 2-D: Gemm-able (linear-gemm)."""
    rng = np.random.default_rng(3)
    return _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                  (5, 8), (5, 6), [_w(rng, "w", 8, 6), _w(rng, "b", 6)], opset, "matmul_add")


def _reduce_mean(src: str, dst: str, axes: list[int], opset: int, name: str):
    if opset >= 18:
        return [helper.make_node("Constant", [], [f"{name}_axes"],
                                 value=numpy_helper.from_array(np.array(axes, np.int64))),
                helper.make_node("ReduceMean", [src, f"{name}_axes"], [dst], keepdims=1)]
    return [helper.make_node("ReduceMean", [src], [dst], axes=axes, keepdims=1)]


def _scalar(name: str, value: float):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.float32)))


def rms_norm(opset: int) -> onnx.ModelProto:
    """Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2)), eps)))), scale)."""
    scale = _w(np.random.default_rng(4), "scale", 16)
    nodes = [_scalar("two", 2.0), _scalar("eps", 1e-5), helper.make_node("Pow", ["x", "two"], ["sq"]),
             *_reduce_mean("sq", "ms", [-1], opset, "rm"), helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]), helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["normed"]), helper.make_node("Mul", ["normed", "scale"], ["y"])]
    return _model(nodes, (2, 3, 16), (2, 3, 16), [scale], opset, "rms_norm")


def instance_norm(opset: int) -> onnx.ModelProto:
    """Div(Sub(x, m), Sqrt(Add(ReduceMean(Pow(Sub(x, m), 2)), eps))) over axes 2.. (written-out InstanceNorm)."""
    nodes = [_scalar("two", 2.0), _scalar("eps", 1e-5), *_reduce_mean("x", "m", [2, 3], opset, "m"),
             helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Pow", ["d", "two"], ["d2"]),
             *_reduce_mean("d2", "var", [2, 3], opset, "v"), helper.make_node("Add", ["var", "eps"], ["vare"]),
             helper.make_node("Sqrt", ["vare"], ["std"]), helper.make_node("Div", ["d", "std"], ["y"])]
    return _model(nodes, (2, 3, 4, 5), (2, 3, 4, 5), [], opset, "instance_norm")


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(9).standard_normal(shape).astype(np.float32)}


def pass_cases() -> list[tuple[Case, dict]]:
    """(case, optimize options) for every pass strategy at every opset of OPSETS."""
    found = []
    for opset in OPSETS:
        for kind in ("Conv", "Gemm", "MatMul"):
            model = leaky_chain(kind, opset)
            for strategy in LEAKY_STRATEGIES:
                found.append((model_case(f"leaky_{kind}_{strategy}_opset{opset}", model, _feeds(model)),
                              {"leaky_relu": strategy}))
        for name, build, options in (("prelu", prelu_one_slope, {}), ("matmul_add", matmul_add, {}),
                                     ("rms_norm", rms_norm, {"norm_fusion": "fuse"}),
                                     ("instance_norm", instance_norm, {"norm_fusion": "fuse"})):
            model = build(opset)
            found.append((model_case(f"{name}_opset{opset}", model, _feeds(model)), options))
    return found


def with_constant_inputs(case: Case, names: tuple[str, ...]) -> Case:
    """ONNX's case with the named inputs (a ConvTranspose's W and B) made initializers of its first data
    set's values: ONNX feeds the weights, and the conv-transpose pass rewrites only constant ones."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    feeds, expected = case.data_sets[0]
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds[n]), n) for n in names if n in feeds)
    return Case(f"{case.name}_constant_weights", model,
                [({k: v for k, v in feeds.items() if k not in names}, expected)], case.rtol, case.atol)


# ONNX's ConvTranspose node cases (onnx/backend/test/case/node/convtranspose.py), by name: listed so that
# collecting the tests does not generate all of ONNX's cases.
CONV_TRANSPOSE_CASES = (
    "test_convtranspose", "test_convtranspose_1d", "test_convtranspose_3d", "test_convtranspose_output_shape",
    "test_convtranspose_pad", "test_convtranspose_kernel_shape", "test_convtranspose_pads",
    "test_convtranspose_dilations", "test_convtranspose_autopad_same", "test_convtranspose_group_2",
    "test_convtranspose_group_2_image_3")


def conv_transpose_case(name: str) -> tuple[Case, dict]:
    """ONNX's ConvTranspose case `name`, weights constant, with the sub-pixel rewrite asked for."""
    from tests.onnx_suite import load_case
    case = load_case(name)
    node = case.model.graph.node[0]
    return with_constant_inputs(case, tuple(node.input[1:])), {"conv_transpose": "subpixel"}
