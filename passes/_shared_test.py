"""The passes' shared helpers: constant_array says which values a rewrite may treat as constants."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dmlopt.passes._shared import constant_array


def _model() -> ir.Model:
    return ir.from_onnx_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x, float[2] fed) => (float[2] y) <float[2] w = {1, 2}, float[2] fed = {3, 4}> {
        c = Constant <value = float[2] {5, 6}> ()
        a = Add(x, w)
        b = Add(a, fed)
        y = Add(b, c) }""")


def test_initializers_and_constant_nodes_are_constants():
    graph = _model().graph
    w = graph.initializers["w"]
    c = next(n for n in graph if n.op_type == "Constant").outputs[0]
    np.testing.assert_array_equal(constant_array(w), [1, 2])
    assert constant_array(c) is None  # a Constant node counts only when asked
    np.testing.assert_array_equal(constant_array(c, constant_nodes=True), [5, 6])


def test_an_initializer_that_is_also_a_graph_input_is_not_a_constant():
    """IR < 4 style: the initializer is only the default of an input a caller may feed."""
    graph = _model().graph
    fed = graph.initializers["fed"]
    assert fed.is_graph_input()
    assert constant_array(fed) is None and constant_array(fed, constant_nodes=True) is None


def test_unreadable_data_is_not_a_constant(tmp_path):
    """External data that is missing: None (the site is declined), not an exception mid-pass."""
    value = ir.Value(name="ext", const_value=ir.ExternalTensor(
        "missing.bin", offset=0, length=8, dtype=ir.DataType.FLOAT, shape=ir.Shape([2]), name="ext",
        base_dir=str(tmp_path)))
    assert constant_array(value) is None
    assert constant_array(None) is None


def test_deduplication_says_nothing_of_the_initializers_it_leaves(caplog):
    """Equal initializers, one a graph input (overridable): kept apart, and no warning per such initializer
    reaches the caller's logs (onnx_ir's own pass writes one: the test's control)."""
    import logging

    import onnx_ir.passes.common as common_passes
    from onnx import TensorProto, helper, numpy_helper

    from dmlopt.passes._shared import DeduplicateInitializers

    def model():
        w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
        v = numpy_helper.from_array(np.ones((2, 2), np.float32), "v")
        g = helper.make_graph([helper.make_node("Add", ["w", "v"], ["y"])], "g",
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w, v])
        return ir.serde.deserialize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))

    with caplog.at_level(logging.INFO):
        common_passes.DeduplicateInitializersPass()(model())
    assert any("Skipped deduplication" in r.getMessage() for r in caplog.records)
    caplog.clear()
    m = model()
    with caplog.at_level(logging.INFO):
        DeduplicateInitializers()(m)
    assert not any("Skipped deduplication" in r.getMessage() for r in caplog.records)
    assert sorted(m.graph.initializers) == ["v", "w"]  # the graph input is not merged into v
