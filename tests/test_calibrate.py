"""`dmlopt calibrate`: ORT's log and profile read from recorded samples (both log layouts ORT has
used), predicted vs actual compared on them, and on a real session with the CPU EP standing in
for DirectML; without DirectML the command says so in one line (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.targets.dml import calibrate, ort_log, placement, placement_folding

# ORT >= 1.2x: every node of a placement list is a log line of its own (session_state.cc).
LOG_NEW = """\
2026-11-20 10:41:02.118211 [I:onnxruntime:, transformer_memcpy.cc:393 AddCopyNode] Add MemcpyToHost before r for CPUExecutionProvider
2026-11-20 10:41:02.118263 [I:onnxruntime:, transformer_memcpy.cc:393 AddCopyNode] Add MemcpyFromHost after e for DmlExecutionProvider
2026-11-20 10:41:02.118301 [I:onnxruntime:, graph_transformer.cc:15 Apply] GraphTransformer MemcpyTransformer modified: 1 with status: OK
2026-11-20 10:41:02.120001 [V:onnxruntime:, session_state.cc:1598 VerifyEachNodeIsAssignedToAnEp] Node placements
2026-11-20 10:41:02.120010 [V:onnxruntime:, session_state.cc:1606 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [DmlExecutionProvider]. Number of nodes: 4
2026-11-20 10:41:02.120014 [V:onnxruntime:, session_state.cc:1608 VerifyEachNodeIsAssignedToAnEp]   DmlFusedNode_0_0 (DmlFusedNode_0_0)
2026-11-20 10:41:02.120016 [V:onnxruntime:, session_state.cc:1608 VerifyEachNodeIsAssignedToAnEp]   DmlFusedNode_0_1 (DmlFusedNode_0_1)
2026-11-20 10:41:02.120019 [V:onnxruntime:, session_state.cc:1608 VerifyEachNodeIsAssignedToAnEp]   MemcpyToHost (Memcpy)
2026-11-20 10:41:02.120021 [V:onnxruntime:, session_state.cc:1608 VerifyEachNodeIsAssignedToAnEp]   MemcpyFromHost (Memcpy_token_1)
2026-11-20 10:41:02.120030 [V:onnxruntime:, session_state.cc:1606 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1
2026-11-20 10:41:02.120033 [V:onnxruntime:, session_state.cc:1608 VerifyEachNodeIsAssignedToAnEp]   Einsum (einsum_rel)
2026-11-20 10:41:02.120040 [W:onnxruntime:, session_state.cc:1612 VerifyEachNodeIsAssignedToAnEp] Some nodes were not assigned to the preferred execution providers which may or may not have an negative impact on performance. e.g. ORT explicitly assigns shape related ops to CPU to improve perf.
2026-11-20 10:41:02.120050 [W:onnxruntime:, session_state.cc:1614 VerifyEachNodeIsAssignedToAnEp] Rerunning with verbose output on a non-minimal build will show node assignments.
"""

# Older releases log one message per provider, its nodes as continuation lines.
LOG_OLD = """\
2024-06-10 09:12:40.5561234 [V:onnxruntime:, session_state.cc:1148 VerifyEachNodeIsAssignedToAnEp] Node placements
2024-06-10 09:12:40.5561301 [V:onnxruntime:, session_state.cc:1154 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [DmlExecutionProvider]. Number of nodes: 2
  DmlFusedNode_0_0 (DmlFusedNode_0_0)
  Einsum (einsum_rel)

2024-06-10 09:12:40.5561377 [V:onnxruntime:, session_state.cc:1154 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1
  Relu (relu_out)

2024-06-10 09:12:40.5561402 [I:onnxruntime:, inference_session.cc:1673 Initialize] Session successfully initialized.
"""

LOG_ALL = ("2026-11-20 10:41:02.120001 [V:onnxruntime:, session_state.cc:1598 VerifyEachNodeIsAssignedToAnEp] "
           "Node placements\n2026-11-20 10:41:02.120010 [V:onnxruntime:, session_state.cc:1601 "
           "VerifyEachNodeIsAssignedToAnEp]  All nodes placed on [DmlExecutionProvider]. Number of nodes: 1\n")


def _event(node, op, provider):
    return {"cat": "Node", "name": f"{node}_kernel_time", "ph": "X", "dur": 12,
            "args": {"op_name": op, "provider": provider, "node_index": "0"}}


PROFILE_NEW = [
    {"cat": "Session", "name": "session_initialization", "ph": "X", "dur": 9000, "args": {}},
    _event("DmlFusedNode_0_0", "DmlFusedNode_0_0", "DmlExecutionProvider"),
    _event("Memcpy", "MemcpyToHost", "CPUExecutionProvider"),
    _event("einsum_rel", "Einsum", "CPUExecutionProvider"),
    _event("Memcpy_token_1", "MemcpyFromHost", "DmlExecutionProvider"),
    _event("DmlFusedNode_0_1", "DmlFusedNode_0_1", "DmlExecutionProvider"),
    {"cat": "Session", "name": "model_run", "ph": "X", "dur": 400, "args": {}},
]


def einsum_model(batch=1):
    """Relu -> Einsum 'bhwc,hkc->bhwk' (SAM's rel-pos term: CPU in the 1.14 table) -> Relu."""
    k = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32), "K")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu_in"),
         helper.make_node("Einsum", ["r", "K"], ["e"], equation="bhwc,hkc->bhwk", name="einsum_rel"),
         helper.make_node("Relu", ["e"], ["y"], name="relu_out")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 2, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2, 2, 3])], [k])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_placements_new_layout():
    p = ort_log.parse_placements(LOG_NEW)
    assert set(p) == {"DmlExecutionProvider", "CPUExecutionProvider"}
    assert p["DmlExecutionProvider"]["count"] == 4 and not p["DmlExecutionProvider"]["all"]
    assert [n["name"] for n in p["DmlExecutionProvider"]["nodes"]] == [
        "DmlFusedNode_0_0", "DmlFusedNode_0_1", "Memcpy", "Memcpy_token_1"]
    assert p["CPUExecutionProvider"]["nodes"] == [{"op": "Einsum", "name": "einsum_rel"}]


def test_placements_old_layout():
    p = ort_log.parse_placements(LOG_OLD)
    assert [n["name"] for n in p["DmlExecutionProvider"]["nodes"]] == ["DmlFusedNode_0_0", "einsum_rel"]
    assert p["CPUExecutionProvider"]["nodes"] == [{"op": "Relu", "name": "relu_out"}]


def test_all_nodes_on_one_provider():
    p = ort_log.parse_placements(LOG_ALL)
    assert p == {"DmlExecutionProvider": {"count": 1, "all": True, "nodes": []}}


def test_copies_and_profile():
    assert ort_log.parse_copies(LOG_NEW) == [
        {"op": "MemcpyToHost", "value": "r", "provider": "CPUExecutionProvider"},
        {"op": "MemcpyFromHost", "value": "e", "provider": "DmlExecutionProvider"}]
    nodes = ort_log.profile_nodes(PROFILE_NEW)
    assert nodes["einsum_rel"] == {"op": "Einsum", "provider": "CPUExecutionProvider"}
    assert "session_initialization" not in nodes and len(nodes) == 5


def test_compare_agrees_with_the_1_14_table():
    # Measured on 1.17.3 (`run.sh /tmp/dmlkit 1.17.3 einsum_model.onnx --list-nodes`, the model at IR 8): the
    # Einsum on the CPU, two copies, relu_in in one compiled partition and relu_out a standalone kernel (ORT
    # knows only the rank of the Einsum's output); LOG_NEW's second DmlFusedNode stands for it here.
    log = LOG_NEW.replace("DmlFusedNode_0_1 (DmlFusedNode_0_1)", "Relu (relu_out)")
    profile = [e for e in PROFILE_NEW if "DmlFusedNode_0_1" not in json.dumps(e)] + [
        _event("relu_out", "Relu", "DmlExecutionProvider")]
    model = dmlopt.load(einsum_model())
    predicted = placement.predict(model, ort_version="1.14").to_dict()
    result = calibrate.compare(model, predicted, calibrate.actual_placement(log, profile))
    s = result["summary"]
    assert s["cpu_predicted"] == s["cpu_actual"] == 1
    assert s["copies_predicted"] == s["copies_actual"] == 2
    assert s["partitions_predicted"] == s["partitions_actual"] == 1
    assert s["mismatches"] == 0 and s["seen"] == 2 and s["not_listed"] == 1  # relu_in sits in the partition
    assert result["actual"]["fused_partitions"] == ["DmlFusedNode_0_0"]
    table = calibrate.to_table(result)
    assert "2 of 2 listed by ORT agree" in table and "mismatches" not in table


def test_compare_reports_what_the_table_got_wrong():
    """The old-layout sample has the Einsum on DirectML and a Relu on the CPU: two mismatches."""
    model = dmlopt.load(einsum_model())
    predicted = placement.predict(model, ort_version="1.14").to_dict()
    result = calibrate.compare(model, predicted, calibrate.actual_placement(LOG_OLD, []))
    wrong = {m["node"]: (m["predicted"], m["actual_provider"]) for m in result["mismatches"]}
    assert wrong == {"einsum_rel": ("cpu", "DmlExecutionProvider"), "relu_out": ("gpu", "CPUExecutionProvider")}
    assert "Einsum" in [m for m in result["mismatches"] if m["node"] == "einsum_rel"][0]["predicted_reason"]
    assert "einsum_rel" in calibrate.to_table(result)


def test_cpu_stands_in_for_directml_on_a_real_session():
    """A real verbose, profiled CPU session: every node ORT lists ran on the CPU, so the nodes the
    1.14 table puts on DirectML are mismatches and the Einsum (CPU there too) agrees."""
    model = dmlopt.load(einsum_model())
    result = calibrate.calibrate(model, ort_version="1.14", target="cpu")
    assert result["stand_in"] and result["provider"] == "CPUExecutionProvider"
    assert result["ort_version_table"] == "1.14"
    rows = {r["node"]: r for r in result["nodes"]}
    assert rows["einsum_rel"]["agrees"] is True
    assert {m["node"] for m in result["mismatches"]} == {"relu_in", "relu_out"}
    assert result["summary"]["copies_actual"] == 0


def test_calibrate_prepares_once_and_compare_answers_the_same_with_the_copy(monkeypatch):
    """The prediction and the comparison read one prepared copy (ORT's folding modelled once);
    `compare` given that copy answers as when it prepares its own."""
    model = dmlopt.load(einsum_model())
    predicted = placement.predict(model, ort_version="1.14").to_dict()
    actual = calibrate.actual_placement(LOG_OLD, [])
    alone = calibrate.compare(model, predicted, actual)
    assert calibrate.compare(model, predicted, actual, prepared=placement.prepare(model)) == alone
    assert alone["mismatches"]  # the old-layout sample disagrees: a real answer, not an empty one
    folds = []
    real = placement_folding.ort_level1
    monkeypatch.setattr(placement_folding, "ort_level1", lambda m: folds.append(m) or real(m))
    calibrate.calibrate(model, ort_version="1.14", target="cpu")
    assert len(folds) == 1


def test_command_without_directml_is_one_line_exit_2(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(einsum_model(), path)
    r = cli("calibrate", path, "-o", tmp_path / "calib.json")
    assert r.code == 2
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "DirectML is missing" in lines[0] and "Traceback" not in r.err
    assert not (tmp_path / "calib.json").exists()


def test_command_refuses_bad_output_before_running(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(einsum_model(), path)
    r = cli("calibrate", path, "-o", path)
    assert r.code == 2 and "overwrite the input" in r.err
    r = cli("calibrate", path, "-o", tmp_path / "calib.txt")
    assert r.code == 2 and ".json" in r.err


def test_write_is_json(tmp_path):
    out = tmp_path / "c.json"
    calibrate.write({"summary": {"agree": 1}}, str(out))
    assert json.loads(out.read_text()) == {"summary": {"agree": 1}}
