"""The real DirectML EP under Wine (dmlopt.targets.dml.host, real_ep) and the commands that use it.

Without a host: the log parsing, the version choice, the DLL version reader and every command's
one-line exit 2 saying how to get the host.  With one (tests marked dml_host, DMLOPT_DML_HOST):
the runner's tensors, calibrate/inspect/validate/bench on the real EP, the timeout, and the seed's
SAM story at ORT 1.17.3 (0 CPU nodes, 0 copies, 1 partition after dmlopt)."""

from __future__ import annotations

import json
import pathlib
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from dmlopt.report import optimize_report as report
from dmlopt.errors import InputError, UsageError
from dmlopt.targets.dml import host, real_ep
from tests.conftest import conv_leaky_model, one_error_line

DATA = pathlib.Path(dmlopt.__file__).parent / "data"
SAM_DYNAMIC = DATA / "sam_small_dynamic.onnx"
SAM = DATA / "sam_small.onnx"
CNN = DATA / "cnn_leaky.onnx"

PREFIX = "2026-12-05 06:17:07.8988201 [V:onnxruntime:, session_state.cc:1152 onnxruntime::VerifyEachNodeIsAssignedToAnEp]"
LOG = "\r\n".join([
    "2026-12-05 06:17:07.89 [I:onnxruntime:, transformer_memcpy.cc:329 onnxruntime::TransformerMemcpyImpl::AddCopyNode] "
    "Add MemcpyFromHost after /attn/Einsum_output_0 for DmlExecutionProvider",
    f"{PREFIX} Node placements",
    f"{PREFIX}  Node(s) placed on [DmlExecutionProvider]. Number of nodes: 3",
    f"{PREFIX}   DmlFusedNode_0_0 (DmlFusedNode_0_0)",
    f"{PREFIX}   DmlFusedNode_0_1 (DmlFusedNode_0_1)",
    f"{PREFIX}   MemcpyFromHost (Memcpy)",
    f"{PREFIX}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2",
    f"{PREFIX}   Einsum (/attn/Einsum)",
    f"{PREFIX}   StringNormalizer ({host.PROBE_NODE})",
    "2026-12-05 06:17:07.90 [I:onnxruntime:, inference_session.cc:1 Initialize] Session successfully initialized.",
])


def test_placement_summary_leaves_the_probe_out():
    p = host.placement_summary(LOG)
    assert p["cpu_nodes"] == 1 and p["cpu_ops"] == {"Einsum": 1} and p["cpu_node_names"] == ["/attn/Einsum"]
    assert p["copies"] == 1 and p["partitions"] == 2 and p["listed"] and p["dml_nodes"] == 3
    assert p["dml_standalone"] == 0  # the two partitions and the copy
    assert "1 CPU nodes, 1 copies, 2 compiled DML partitions (CPU: Einsum x1)" in real_ep.placement_line(p)


def test_placement_summary_without_a_node_list_does_not_guess_partitions():
    log = f"{PREFIX} Node placements\n{PREFIX}  All nodes placed on [DmlExecutionProvider]. Number of nodes: 4\n"
    p = host.placement_summary(log)
    assert p["cpu_nodes"] == 0 and p["copies"] == 0 and p["partitions"] is None and not p["listed"]
    assert not host.placement_summary("no placement here")["found"]


def test_dll_version_from_the_fixed_file_info(tmp_path):
    dll = tmp_path / "DirectML.dll"
    fixed = b"\xbd\x04\xef\xfe" + struct.pack("<IIIII", 0x10000, (1 << 16) | 13, (1 << 16) | 0, 0, 0)
    dll.write_bytes(b"MZ" + b"\0" * 100 + fixed + b"\0" * 16)
    assert host.dll_version(dll) == "1.13.1.0"
    dll.write_bytes(b"MZ no version")
    assert host.dll_version(dll).startswith("unversioned (13 bytes, sha256 ")


def test_version_choice_names_the_installed_ones(tmp_path):
    h = host.Host(tmp_path, ("1.17.3", "1.19.2", "1.24.3", "1.31.1"))
    assert h.choose(None) == h.choose("auto") == "1.31.1"
    assert h.choose("1.19") == "1.19.2" and h.choose("1.17.3") == "1.17.3"
    with pytest.raises(UsageError, match=r"1\.14 is not installed .*installed: 1\.17\.3, 1\.19\.2, 1\.24\.3, 1\.31\.1"):
        h.choose("1.14")
    with pytest.raises(UsageError):
        h.choose("1.1")  # not a prefix match of 1.17.3


def test_probe_is_added_to_a_copy_only():
    model = dmlopt.load(conv_leaky_model())
    probed = host.with_probe(model)
    assert [n.op_type for n in probed.graph][-1] == "StringNormalizer"
    assert host.PROBE_NODE not in {n.name for n in model.graph} and len(model.graph.inputs) == 1


def test_windows_paths_use_wines_z_drive():
    assert host.windows_path("/tmp/a b/m.onnx") == "Z:\\tmp\\a b\\m.onnx"


def test_commands_without_a_host_say_how_to_get_one(cli, tmp_path, monkeypatch):
    monkeypatch.delenv(host.ENV_VAR, raising=False)
    path = tmp_path / "m.onnx"
    onnx.save(conv_leaky_model(), path)
    for args in (("validate", path, path, "--ep", "dml"), ("bench", path, "--ep", "dml"), ("calibrate", path)):
        r = cli(*args)
        assert r.code == 2, args
        line = one_error_line(r.err)
        assert "DirectML is missing" in line and "--dml-host" in line
        # issue 31: where a host comes from, in words that hold for a pip install (no ../shared there)
        assert "../shared" not in line and "dml-wine kit's setup.sh (dmlopt's README" in line
    r = cli("inspect", path, "--ep", "dml")
    assert r.code == 0 and "actual placement: not measured" in r.out and "setup.sh" in r.out


def test_optimize_without_a_host_says_in_the_report_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(host.ENV_VAR, raising=False)
    result = dmlopt.optimize(conv_leaky_model(), target="dml", passes=["leaky-relu"], retime=False)
    assert result.passed and result.report.real_ep["passed"] is None
    assert "validation on the real DirectML EP: not run (DirectML is missing" in result.report.to_table()
    page = tmp_path / "report.html"
    report.write(result.report, page)
    assert "On the real DirectML EP</h3><p class=\"note\">Not run: DirectML is missing" in page.read_text()
    cpu = dmlopt.optimize(conv_leaky_model(), target="cpu", passes=["leaky-relu"], retime=False)
    assert cpu.report.real_ep is None  # nothing to say for another target


def test_a_broken_host_is_one_line_naming_what_is_missing(cli, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_leaky_model(), path)
    empty = tmp_path / "kit"
    empty.mkdir()
    r = cli("validate", path, path, "--ep", "dml", "--dml-host", empty)
    line = one_error_line(r.err)
    assert r.code == 2 and "incomplete" in line and "node.exe" in line and "ort-<version>/" in line
    r = cli("bench", path, "--ep", "dml", "--dml-host", tmp_path / "nowhere")
    assert r.code == 2 and "is not a folder" in one_error_line(r.err)
    r = cli("validate", path, path, "--dml-host", empty)
    assert r.code == 2 and "add --ep dml" in one_error_line(r.err)


# ---- with the real DirectML EP (Wine host) ----

TYPES = {"f32": TensorProto.FLOAT, "f16": TensorProto.FLOAT16, "i64": TensorProto.INT64, "i32": TensorProto.INT32,
         "u8": TensorProto.UINT8, "b": TensorProto.BOOL}


def dtype_model(names) -> onnx.ModelProto:
    """One Identity per element type the runner's .npy reader and writer handle, and a Relu."""
    nodes = [helper.make_node("Identity", [k], [f"{k}_out"]) for k in names]
    nodes.append(helper.make_node("Relu", ["f32"], ["relu_out"]))
    graph = helper.make_graph(nodes, "dtypes", [helper.make_tensor_value_info(k, TYPES[k], [2, 3]) for k in names],
                              [helper.make_tensor_value_info(f"{k}_out", TYPES[k], [2, 3]) for k in names]
                              + [helper.make_tensor_value_info("relu_out", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # ORT 1.17 reads <= 9


@pytest.mark.dml_host
def test_runner_round_trips_every_tensor_type(dml_host):
    rng = np.random.default_rng(0)
    feeds = {"f32": rng.standard_normal((2, 3)).astype(np.float32), "f16": rng.standard_normal((2, 3)).astype(np.float16),
             "i64": np.arange(6, dtype=np.int64).reshape(2, 3) - 2**40, "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
             "u8": np.arange(250, 256, dtype=np.uint8).reshape(2, 3), "b": np.array([[1, 0, 1], [0, 0, 1]], bool)}
    version = dml_host.versions[-1]
    run = dml_host.run(dmlopt.load(dtype_model(list(feeds))), feeds, version, warmup=1, runs=2)
    for name, value in feeds.items():
        got = run.outputs[f"{name}_out"]
        assert got.dtype == value.dtype and np.array_equal(got, value), name
    np.testing.assert_array_equal(run.outputs["relu_out"], np.maximum(feeds["f32"], 0))
    assert len(run.warmup_ms) == 1 and len(run.run_ms) == 2 and run.session_ms > 0
    assert run.placement["found"] and run.placement["dml_nodes"] >= 1
    assert {n["provider"] for n in run.nodes} <= {"DmlExecutionProvider", "CPUExecutionProvider"}
    assert host.PROBE_NODE not in {n["name"] for n in run.nodes} and len(run.nodes) >= run.placement["dml_nodes"]
    assert run.host["ort_version"] == version and run.host["directml_dll"][0].isdigit()
    if "1.17.3" in dml_host.versions:  # its binding has no float16 tensors: said so, in one line
        with pytest.raises(InputError, match="cannot pass float16 tensors"):
            dml_host.run(dmlopt.load(dtype_model(["f32", "f16"])), {k: feeds[k] for k in ("f32", "f16")}, "1.17.3")


@pytest.mark.dml_host
def test_sam_story_at_1_17_3(dml_host, tmp_path):
    """The seed's claim on the real EP: SAM (dynamic batch) at ORT 1.17.3 runs its rel-pos Einsums on
    the CPU with copies and partitions; after `dmlopt optimize --target dml --ort-version 1.17.3`
    (batch frozen) it is 0 CPU nodes, 0 copies, 1 compiled partition, numerics within tolerance."""
    if "1.17.3" not in dml_host.versions:
        pytest.skip(f"ORT 1.17.3 is not installed in {dml_host.root}")
    ep = real_ep.resolve(dml_host.root, "1.17.3")
    model = dmlopt.load(SAM_DYNAMIC)
    before = real_ep.placement(model, ep)
    assert before["cpu_ops"].get("Einsum") == 6 and before["copies"] > 0 and before["cpu_nodes"] > 6
    assert before["partitions"] == 0 and before["dml_standalone"] > 100  # dynamic shapes: nothing compiled
    result = dmlopt.optimize(SAM_DYNAMIC, target="dml", ort_version="1.17.3", dims={"batch": 1}, retime=False,
                             dml_host=dml_host.root)
    real = result.report.real_ep
    assert result.passed and real["passed"], result.report.to_table()
    p = real["placement"]
    assert (p["cpu_nodes"], p["copies"], p["partitions"]) == (0, 0, 1)
    assert real["host"]["ort_version"] == "1.17.3" and real["outputs"][0]["max_abs"] < 1e-4
    assert "validation on the real DirectML EP (passed)" in result.report.to_table()
    page = tmp_path / "report.html"
    report.write(result.report, page)
    assert "On the real DirectML EP (passed)" in page.read_text() and "ONNX Runtime 1.17.3" in page.read_text()


@pytest.mark.dml_host
def test_calibrate_runs_for_real(cli, dml_host, tmp_path):
    version = "1.17.3" if "1.17.3" in dml_host.versions else dml_host.versions[0]
    out = tmp_path / "calib.json"
    r = cli("calibrate", SAM, "--dml-host", dml_host.root, "--ort-version", version, "-o", out)
    assert r.code == 0, r.err
    assert "real DirectML EP: ONNX Runtime " + version in r.out and "software rendering" in r.out
    result = json.loads(out.read_text())
    s = result["summary"]
    assert {"cpu_predicted", "cpu_actual", "copies_predicted", "copies_actual", "partitions_actual"} <= set(s)
    assert result["provider"] == "DmlExecutionProvider" and result["host"]["ort_version"] == version
    assert host.PROBE_NODE not in json.dumps(result["actual"])
    if version == "1.17.3":  # before ORT 1.19 the rel-pos Einsums ran on the CPU
        cpu = {n["name"] for n in result["actual"]["placements"]["CPUExecutionProvider"]["nodes"]}
        assert s["cpu_actual"] == 6 and all("Einsum" in n for n in cpu)


@pytest.mark.dml_host
def test_inspect_shows_the_real_placement_beside_the_prediction(cli, dml_host):
    r = cli("inspect", SAM, "--ep", "dml", "--dml-host", dml_host.root, "--ort-version", dml_host.versions[-1])
    assert r.code == 0, r.err
    assert "predicted (table" in r.out and f"actual (real EP, ORT {dml_host.versions[-1]})" in r.out
    assert "DirectML.dll" in r.out and "software rendering: not GPU speed" in r.out


@pytest.mark.dml_host
def test_validate_on_the_real_ep_passes_and_catches_a_wrong_candidate(cli, dml_host, tmp_path):
    good = tmp_path / "good.onnx"
    bad = tmp_path / "bad.onnx"
    model = conv_leaky_model(batch=1)
    model.ir_version = 8  # ORT 1.17 reads IR <= 9
    onnx.save(model, good)
    wrong = conv_leaky_model(batch=1)
    wrong.ir_version = 8
    wrong.graph.initializer[1].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(wrong.graph.initializer[1]) + np.float32(0.5), "B"))
    onnx.save(wrong, bad)
    r = cli("validate", good, good, "--ep", "dml", "--dml-host", dml_host.root, "--json")
    assert r.code == 0, r.err
    result = json.loads(r.out)
    assert result["passed"] and result["cpu"]["passed"] and result["dml"]["passed"]
    assert result["dml"]["host"]["vulkan_device"] and result["dml"]["outputs"][0]["max_abs"] < 1e-4
    r = cli("validate", good, bad, "--ep", "dml", "--dml-host", dml_host.root)
    assert r.code == 1 and r.out.startswith("FAILED") and "on the real DirectML EP (FAILED)" in r.out


@pytest.mark.dml_host
def test_bench_names_the_host_and_says_software(cli, dml_host, tmp_path):
    r = cli("bench", CNN, "--ep", "dml", "--dml-host", dml_host.root, "--runs", "2", "--warmup", "1", "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert out["latency_ms"]["runs"] == 2 and out["session_ms"] > 0 and out["provider"] == "DmlExecutionProvider"
    if out["software"]:
        assert out["note"] == host.SOFTWARE_NOTE
    other = onnx.load(CNN)
    other.doc_string = "another file"
    onnx.save(other, tmp_path / "other.onnx")
    r = cli("bench", CNN, "--ep", "dml", "--dml-host", dml_host.root, "--compare", tmp_path / "other.onnx")
    if out["software"]:  # a GPU host compares (tests/test_dml_adapter.py)
        assert r.code == 2 and "--compare" in one_error_line(r.err) and "software" in one_error_line(r.err)


@pytest.mark.dml_host
def test_versions_not_installed_and_timeouts_are_exit_2(cli, dml_host, monkeypatch):
    r = cli("bench", CNN, "--ep", "dml", "--dml-host", dml_host.root, "--ort-version", "1.9")
    line = one_error_line(r.err)
    assert r.code == 2 and "installed: " + ", ".join(dml_host.versions) in line
    monkeypatch.setenv(host.TIMEOUT_VAR, "0.5")
    r = cli("bench", CNN, "--ep", "dml", "--dml-host", dml_host.root, "--runs", "1")
    assert r.code == 2 and "did not finish within 0.5 s" in one_error_line(r.err)


@pytest.mark.dml_host
def test_tune_never_chooses_by_the_hosts_timings(cli, dml_host, tmp_path):
    """The CI host is lavapipe: software times choose nothing (a GPU host's do: tests/test_dml_adapter.py)."""
    path = tmp_path / "m.onnx"
    onnx.save(conv_leaky_model(), path)
    r = cli("optimize", path, "-o", tmp_path / "o.onnx", "--tune", "--dml-host", dml_host.root)
    assert r.code == 2 and "times candidates only where its device is a GPU" in one_error_line(r.err)


@pytest.mark.dml_host
def test_session_options_reach_the_session(dml_host):
    """Graph fusion off (ep.dml.disable_graph_fusion, honoured from onnxruntime-node 1.24): every DirectML
    node is listed on its own instead of one compiled partition."""
    version = dml_host.versions[-1]
    if tuple(int(p) for p in version.split(".")) < (1, 24):
        pytest.skip(f"onnxruntime-node {version} ignores session config entries")
    model = dmlopt.load(CNN)
    feeds = {"input": np.ones((1, 3, 128, 128), np.float32)}
    fused = dml_host.run(model, feeds, version).placement
    apart = dml_host.run(model, feeds, version, fusion=False).placement
    assert fused["partitions"] == 1 and fused["cpu_nodes"] == 0
    assert apart["partitions"] == 0 and apart["dml_nodes"] > 1 and apart["cpu_nodes"] == 0


@pytest.mark.dml_host
def test_optimize_command_validates_on_the_real_ep(cli, dml_host, tmp_path):
    version = dml_host.versions[0]
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    r = cli("optimize", CNN, "-o", out, "--dml-host", dml_host.root, "--ort-version", version, "--report", rep,
            "--no-session-config", "-q")
    assert r.code == 0, r.err
    real = json.loads(rep.read_text())["real_ep"]
    assert real["passed"] and real["host"]["ort_version"] == version and real["placement"]["cpu_nodes"] == 0
    assert f"numerics (real DirectML EP, ORT {version}): match" in r.out and out.exists()
    missing = tmp_path / "m.onnx"
    r = cli("optimize", CNN, "-o", missing, "--dml-host", dml_host.root, "--ort-version", "1.9", "-q")
    assert r.code == 2 and "installed: " in one_error_line(r.err) and not missing.exists()


@pytest.mark.dml_host
def test_bench_auto_uses_the_configured_host_with_a_progress_line(cli, dml_host, monkeypatch):
    """Issue 31: `bench --ep auto` ignored a configured host; the host run printed nothing for 1:41."""
    import io

    from dmlopt.cli import commands as cli_mod
    from dmlopt.io import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    monkeypatch.setattr(cli_mod, "_progress", lambda args: None if args.quiet else progress.Steps(tty))
    monkeypatch.setenv(host.ENV_VAR, str(dml_host.root))
    r = cli("bench", CNN, "--ep", "auto", "--runs", "2", "--warmup", "1", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["provider"] == "DmlExecutionProvider"
    assert "on the real DirectML EP (ORT " in tty.getvalue() and tty.getvalue().endswith("\n")
    quiet = Terminal()
    monkeypatch.setattr(cli_mod, "_progress", lambda args: None if args.quiet else progress.Steps(quiet))
    assert cli("bench", CNN, "--ep", "auto", "--runs", "1", "--warmup", "0", "-q").code == 0
    assert quiet.getvalue() == ""


@pytest.mark.dml_host
def test_where_the_real_ep_ran_it_decides_graph_capture_and_the_session_file(dml_host):
    """Issue 31: graph capture and OUT.session.json followed the prediction right after the real EP ran."""
    src = pathlib.Path(__file__).parent / "measured" / "efficientvit.fp16.dmlopt.onnx"
    result = dmlopt.optimize(src, target="dml", dml_host=dml_host.root)
    real = result.report.real_ep
    assert result.passed and real["passed"], result.report.to_table()
    capture = result.report.graph_capture
    assert capture["basis"].startswith("DirectML placement measured on the real EP (ORT ")
    p = real["placement"]
    assert capture["ready"] is (p["copies"] == 0)
    entries = result.report.session_config["config"]["session_config_entries"]
    assert ("ep.dml.enable_graph_capture" in entries) is capture["ready"]
    # and the timing line no longer says DirectML "is not on this machine" under the line where it ran
    table = result.report.to_table()
    assert "is not on this machine" not in table and "DmlExecutionProvider ran on the DirectML host" in table
