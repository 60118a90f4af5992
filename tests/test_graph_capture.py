"""Graph-capture readiness (dmlopt.targets.graph_capture): each of ORT's conditions blocks on its own,
the one line says what, and inspect shows it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.report import inspection
from dmlopt.runtime import sessions as runtime
from dmlopt.targets import graph_capture
from dmlopt.targets.dml import placement, placement_folding
from dmlopt.targets.graph_capture import graph_capture_readiness
from tests.conftest import conv_leaky_model


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return dmlopt.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _gelu_model(output_on_cpu: bool):
    """Relu -> ai.onnx Gelu-20 (no DirectML kernel) [-> Relu]: the Gelu runs on the CPU."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_in"),
             helper.make_node("Gelu", ["r"], ["g" if not output_on_cpu else "y"], name="gelu")]
    if not output_on_cpu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"], name="relu_out"))
    return _model(nodes, [_f("x", [1, 8])], [_f("y", [1, 8])], opset=20)


def _kinds(r):
    return [b["kind"] for b in r.blockers]


def test_static_model_is_ready_on_directml():
    r = graph_capture_readiness(dmlopt.load(conv_leaky_model(batch=1)), "dml")
    assert r.ready and r.blockers == []
    assert r.line() == f"graph capture (DirectML, ORT {r.ort_version}): ready"
    assert "predicted" in r.basis
    assert any("IO binding" in w for w in r.warnings)


def test_dynamic_dim_blocks_and_is_named():
    r = graph_capture_readiness(dmlopt.load(conv_leaky_model(batch="batch")), "dml")
    assert _kinds(r) == ["dynamic_dims"]
    assert r.blockers[0]["dims"] == ["batch"]
    assert r.line().endswith("not ready: dynamic dim 'batch'")


def test_old_runtime_has_no_directml_capture():
    r = graph_capture_readiness(dmlopt.load(conv_leaky_model(batch=1)), "dml", "1.14")
    assert r.ort_version == "1.14" and _kinds(r) == ["ort_version"]
    assert not r.blockers[0]["known"]


def test_cpu_node_with_copies_blocks():
    r = graph_capture_readiness(_gelu_model(output_on_cpu=False), "dml")
    assert _kinds(r) == ["copies"]
    b = r.blockers[0]
    assert b["nodes"] == ["gelu"] and sorted(b["values"]) == ["g", "r"]
    assert "Gelu" in b["reasons"]["gelu"]
    assert "1 nodes on CPU (gelu), 2 copies" in r.line()


def test_output_computed_on_cpu_blocks():
    r = graph_capture_readiness(_gelu_model(output_on_cpu=True), "dml")
    assert "cpu_output" in _kinds(r)
    assert [b for b in r.blockers if b["kind"] == "cpu_output"][0]["nodes"] == ["gelu"]


def test_control_flow_is_refused_by_ort():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                               [_f("t", [1, 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                               [_f("e", [1, 4])])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    m = _model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
               [cond, _f("x", [1, 4])], [_f("y", [1, 4])])
    r = graph_capture_readiness(m, "dml")
    cf = [b for b in r.blockers if b["kind"] == "control_flow"]
    assert cf and cf[0]["nodes"] == ["branch"] and cf[0]["known"] is True
    assert "1 If/Loop/Scan (branch)" in r.line()


def test_data_dependent_shape_blocks():
    m = _model([helper.make_node("NonZero", ["x"], ["y"], name="nz")], [_f("x", [2, 3])],
               [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    r = graph_capture_readiness(m, "dml")
    assert "data_dependent_shape" in _kinds(r)
    assert [b for b in r.blockers if b["kind"] == "data_dependent_shape"][0]["nodes"] == ["nz"]


def test_constant_input_shapes_are_not_data_dependent():
    """A Reshape to a constant shape is static: only values computed from data count."""
    shape = numpy_helper.from_array(np.array([8, 1], dtype=np.int64), "shape")
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [_f("x", [1, 8])],
               [_f("y", [8, 1])], [shape])
    assert graph_capture_readiness(m, "dml").ready


def test_cuda_without_cuda_build_says_it_did_not_check(monkeypatch):
    monkeypatch.setattr(graph_capture, "_cuda_kernels", lambda: "this build has no CUDA kernels")
    r = graph_capture_readiness(dmlopt.load(conv_leaky_model(batch=1)), "cuda")
    assert r.ready and "not checked" in r.basis
    assert "not checked" in r.line()


def test_a_crashing_kernel_query_does_not_end_the_process():
    """onnxruntime-gpu without TensorRT's library segfaults in get_all_opkernel_def: the query runs apart."""
    why = graph_capture._query_cuda_kernels("import os; os.abort()")
    assert isinstance(why, str) and "failed" in why


def test_the_kernel_query_reads_the_child_s_list():
    code = "import json, sys; json.dump([['', 'Relu', [14, 2147483647]], ['com.microsoft', 'Gelu', [1, 1]]], sys.stdout)"
    assert graph_capture._query_cuda_kernels(code) == {("", "Relu"): [(14, 2**31 - 1)],
                                                        ("com.microsoft", "Gelu"): [(1, 1)]}


@pytest.mark.parametrize("set_by_user", [None, "0"])
def test_the_kernel_query_child_has_telemetry_off_unless_the_user_set_it(monkeypatch, set_by_user):
    """The child imports onnxruntime: it gets runtime.ort()'s switch (no .ses file in TMPDIR), the user's if set."""
    if set_by_user is None:
        monkeypatch.delenv(runtime.TELEMETRY_SWITCH, raising=False)
    else:
        monkeypatch.setenv(runtime.TELEMETRY_SWITCH, set_by_user)
    code = (f"import json, os, sys; json.dump([['', os.environ.get({runtime.TELEMETRY_SWITCH!r}, 'unset'), "
            "[1, 1]]], sys.stdout)")
    assert graph_capture._query_cuda_kernels(code) == {("", set_by_user or runtime.TELEMETRY_OFF): [(1, 1)]}


@pytest.mark.skipif(runtime.has_target("cuda"), reason="the CUDA provider is here")
def test_the_cpu_build_has_no_cuda_kernels():
    assert "no CUDA kernels" in graph_capture._query_cuda_kernels(graph_capture._KERNEL_QUERY)


def test_cuda_registry_places_nodes_without_kernels_on_cpu(monkeypatch):
    """With a CUDA build's registry (here: Relu only), Gelu has no kernel and copies follow."""
    monkeypatch.setattr(graph_capture, "_cuda_kernels", lambda: {("", "Relu"): [(14, 2**31 - 1)]})
    r = graph_capture_readiness(_gelu_model(output_on_cpu=False), "cuda")
    assert _kinds(r) == ["copies"]
    assert r.blockers[0]["nodes"] == ["gelu"] and sorted(r.blockers[0]["values"]) == ["g", "r"]
    assert "known" in r.basis


def test_cpu_target_is_refused():
    with pytest.raises(dmlopt.UsageError):
        graph_capture_readiness(dmlopt.load(conv_leaky_model(batch=1)), "cpu")


def test_inspect_prints_the_line_and_json_lists_all(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_leaky_model(batch="batch"), path)
    r = cli("inspect", path)
    assert r.code == 0 and "graph capture (DirectML, ORT " in r.out and "not ready: dynamic dim 'batch'" in r.out
    r = cli("inspect", path, "--ep", "dml", "--ort-version", "1.20", "--json")
    info = json.loads(r.out)
    assert info["graph_capture"]["ort_version"] == info["placement"]["ort_version"]
    assert info["graph_capture"]["blockers"][0]["dims"] == ["batch"]


def test_gather_from_a_huge_vector_skips_onnx_data_propagation():
    """onnx's Gather data propagation costs ~70 bytes per element of a 1-D data input (20 GB for
    the 275M-element weights of tests/test_external_data.py); readiness must stay cheap."""
    from dmlopt.graph import shape_inference

    n = shape_inference.DATA_PROP_BUDGET + 1
    w = numpy_helper.from_array(np.zeros(n, dtype=np.float32), "W")
    m = _model([helper.make_node("Gather", ["W", "idx"], ["y"], name="gather")],
               [helper.make_tensor_value_info("idx", TensorProto.INT64, [4])], [_f("y", [4])], [w])
    assert shape_inference.data_propagation_cost(m) > shape_inference.DATA_PROP_BUDGET
    assert graph_capture_readiness(m, "dml").ready


def test_inspect_prepares_once_and_answers_as_each_step_alone(monkeypatch):
    """`inspect --ep dml`: one prepared copy (ORT's folding modelled once) serves the placement
    prediction and the readiness walk, and both answer as when each prepares its own."""
    model = _gelu_model(output_on_cpu=False)
    alone = {"placement": placement.predict(model).to_dict(),
             "graph_capture": graph_capture_readiness(model, "dml").to_dict()}
    folds = []
    real = placement_folding.ort_level1
    monkeypatch.setattr(placement_folding, "ort_level1", lambda m: folds.append(m) or real(m))
    info = inspection.inspect(model, ep="dml")
    assert len(folds) == 1
    assert info["placement"] == alone["placement"] and info["graph_capture"] == alone["graph_capture"]
    assert info["graph_capture"]["blockers"]  # the Gelu on the CPU: a real answer, not an empty one
