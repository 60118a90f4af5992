"""dmlopt.graph.shape_inference: onnx's inference without the weights gives what inference on the full model gives."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir

import dmlopt
from dmlopt.graph import shape_inference
from dmlopt.graph.shape_inference import SMALL_TENSOR_BYTES, graph_values, infer_shapes, weightless_proto

DATA = pathlib.Path(dmlopt.__file__).parent / "data"
BIG = 256 * 1024  # float32 elements of the weight: 1 MiB


def weighted_model() -> ir.Model:
    """MatMul with a 1 MiB weight, then a Reshape whose shape comes from Shape arithmetic and a small constant."""
    m = ir.from_proto(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 512] x) => (float[?, ?, ?] y) {
        h = MatMul(x, w)
        s = Shape(h)
        n = Slice(s, zero, one)
        shape = Concat<axis = 0>(n, tail)
        y = Reshape(h, shape)
    }"""))
    rng = np.random.default_rng(0)
    for name, array in (("w", rng.standard_normal((512, BIG // 512)).astype(np.float32)),
                        ("zero", np.array([0], np.int64)), ("one", np.array([1], np.int64)),
                        ("tail", np.array([8, 64], np.int64))):
        value = ir.Value(name=name, const_value=ir.tensor(array))
        m.graph.initializers.add(value)  # no type or shape on the value: taken from the tensor
    return m


def full_inference(m: ir.Model) -> ir.Model:
    """What onnx infers on the whole model, weights serialized (the slow way)."""
    return ir.from_proto(onnx.shape_inference.infer_shapes(ir.to_proto(m), check_type=False, strict_mode=False,
                                                           data_prop=True))


def test_weightless_proto_declares_big_initializers_as_inputs_and_keeps_small_ones():
    m = weighted_model()
    before = onnx.printer.to_text(ir.to_proto(m))
    proto = weightless_proto(m)
    assert [t.name for t in proto.graph.initializer] == ["zero", "one", "tail"]
    inputs = {i.name: i for i in proto.graph.input}
    assert list(inputs) == ["x", "w"]
    assert inputs["w"].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in inputs["w"].type.tensor_type.shape.dim] == [512, BIG // 512]
    assert proto.ByteSize() < SMALL_TENSOR_BYTES * 2  # the 1 MiB weight is not in it
    onnx.checker.check_model(proto)
    assert onnx.printer.to_text(ir.to_proto(m)) == before  # the model is not changed


def test_infer_shapes_reaches_through_big_weights_and_shape_arithmetic():
    m = weighted_model()
    assert infer_shapes(m)
    values = {v.name: v for v in graph_values(m.graph)}
    assert values["h"].dtype == ir.DataType.FLOAT and values["h"].shape[1] == BIG // 512
    assert values["shape"].shape.dims == (3,)
    y = values["y"].shape
    assert len(y) == 3 and list(y.dims[1:]) == [8, 64]  # data propagation read the small constants
    assert not infer_shapes(m)  # nothing new the second time


def test_same_types_and_shapes_as_inference_on_the_full_model():
    for name in ("sam_small.onnx", "sam_small_dynamic.onnx", "cnn_leaky.onnx"):
        m = dmlopt.load(DATA / name)
        full = full_inference(m)
        infer_shapes(m)
        expected = {v.name: (v.type, str(v.shape)) for g in full.graphs() for v in graph_values(g)}
        got = {v.name: (v.type, str(v.shape)) for g in m.graphs() for v in graph_values(g)}
        assert got == expected, name


def test_subgraph_values_are_typed_and_loop_inputs_kept():
    m = ir.from_proto(onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] a, bool c) => (float[?, ?] y, float[?, ?, ?] scan) {
        y = If(c) <then_branch = t () => (float[?, ?] o) { r = Relu(a)  o = Flatten<axis = 0>(r) },
                   else_branch = e () => (float[?, ?] o2) { n = Neg(a)  o2 = Flatten<axis = 0>(n) }>
        m = Constant<value = int64 {4}>()
        scan = Loop(m, "") <body = b (int64 i, bool cond_in) => (bool cond_out, float[?, ?] step) {
            cond_out = Identity(cond_in)
            step = Sigmoid(a)
        }>
    }"""))
    infer_shapes(m)
    shapes = {v.name: v.shape for g in m.graphs() for v in graph_values(g)}
    assert shapes["r"].dims == (2, 3) and shapes["o"].dims == (1, 6) and shapes["n"].dims == (2, 3)
    assert shapes["step"].dims == (2, 3) and shapes["y"].dims == (1, 6) and shapes["scan"].dims[1:] == (2, 3)
    loop = next(n for n in m.graph if n.op_type == "Loop")
    assert len(loop.inputs) == 2 and loop.inputs[1] is None


def test_a_failing_inference_leaves_the_model_as_it_was(monkeypatch):
    m = weighted_model()
    before = onnx.printer.to_text(ir.to_proto(m))

    def broken(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("boom")

    monkeypatch.setattr(shape_inference.onnx.shape_inference, "infer_shapes", broken)
    assert infer_shapes(m) is False
    assert onnx.printer.to_text(ir.to_proto(m)) == before


def test_onnx_inference_keeps_sequences_sequences():
    """onnx_ir 1.1's ShapeInferencePass typed a sequence as its element's tensor (test_sequence_model5)."""
    from onnx import TensorProto, helper

    from dmlopt.graph.check import check_model
    graph = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x", "x"], ["seq"]),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = dmlopt.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    shape_inference.onnx_shape_inference(model)
    seq = next(iter(model.graph)).outputs[0]
    assert isinstance(seq.type, ir.SequenceType)
    check_model(model, "inference")
