"""Emulated DirectML placement: the split runs (all parts on the CPU EP here) and equals the whole model."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.runtime import sessions as runtime
from dmlopt.targets.dml import emulate, placement

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


def model(text: str) -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(text))


def whole(m: ir.Model, feeds) -> list[np.ndarray]:
    return runtime.session(m, "cpu").run(None, feeds)


EINSUM = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 5, 6, 8] x, float[5, 7, 8] k) => (float[2, 5, 6, 7] y, float[2, 5, 6, 8] r) {
    a = Relu(x)
    e = Einsum <equation = "bhwc,hkc->bhwk"> (a, k)
    y = Sigmoid(e)
    r = Neg(a)
}"""


def test_split_follows_the_predicted_devices_and_orders_dependencies():
    m = model(EINSUM)
    p = placement.predict(m, ort_version="1.14")
    parts = emulate.split_by_placement(m, p)
    assert [(part.device, part.nodes) for part in parts] == [
        ("gpu", ["Relu_0", "Neg_3"]), ("cpu", ["Einsum_1"]), ("gpu", ["Sigmoid_2"])]
    assert parts[0].inputs == ["x"] and parts[0].outputs == ["a", "r"]
    assert parts[1].inputs == ["a", "k"] and parts[1].outputs == ["e"]
    assert parts[2].inputs == ["e"] and parts[2].outputs == ["y"]
    assert emulate.EmulatedSession(m, p, "cpu").copies_per_run == p.copy_count == 2


def test_no_cpu_nodes_means_one_part():
    m = model(EINSUM)
    parts = emulate.split_by_placement(m, placement.predict(m, ort_version="1.23"))
    assert len(parts) == 1 and parts[0].device == "gpu"


def test_if_bodies_capture_outer_values_across_parts():
    m = model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x, bool c) => (float[4] y) {
        a = Relu(x)
        y = If(c) <then_branch = t () => (float[4] o) { o = Sigmoid(a) },
                  else_branch = e () => (float[4] o) { o = Neg(a) }>
    }""")
    p = placement.predict(m, ort_version="1.14")  # If has no DML kernel in 1.14
    parts = emulate.split_by_placement(m, p)
    assert [part.device for part in parts] == ["gpu", "cpu"] and parts[1].inputs == ["c", "a"]
    session = emulate.EmulatedSession(m, p, "cpu")
    x = np.array([-1.0, 0.5, 2.0, -3.0], dtype=np.float32)
    for cond in (True, False):
        feeds = {"x": x, "c": np.array(cond)}
        np.testing.assert_array_equal(session.run(feeds)[0], whole(m, feeds)[0])


@pytest.mark.parametrize("name, version", [("sam_small", "1.14"), ("sam_small_dynamic", "1.14"),
                                           ("sam_small_dynamic", "1.23")])
def test_emulated_sam_equals_the_whole_model_on_cpu(name, version):
    m = dmlopt.load(DATA / f"{name}.onnx")
    p = placement.predict(m, ort_version=version)
    session = emulate.EmulatedSession(m, p, "cpu")
    assert len(session.parts) > 2 and {part.device for part in session.parts} == {"cpu", "gpu"}
    assert session.copies_per_run == p.copy_count  # Shape outputs stay in host memory, as on DirectML
    feeds = runtime.random_inputs(runtime.input_specs(m), seed=1)
    got, want = session.run(feeds), whole(m, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
