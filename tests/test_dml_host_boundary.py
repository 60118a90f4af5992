"""What dmlopt does with what crosses the DirectML host's boundary (issue 32).

A fake host (tests/fake_dml_host.py) answers in ways the real one should not: every byte that
comes back is untrusted, so every bad answer is exit 2 with one line naming the host, never exit 3.
Settings the host reads from the environment are checked like options."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dmlopt.targets.dml import host
from tests import fake_dml_host
from tests.conftest import one_error_line


def identity_model(path, name_in="x", name_out="y", shape=(2, 3)):
    g = helper.make_graph([helper.make_node("Identity", [name_in], [name_out], name="id")], "g",
                          [helper.make_tensor_value_info(name_in, TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(name_out, TensorProto.FLOAT, list(shape))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Make a fake host answering with `respond`; returns its folder."""

    def make(respond=fake_dml_host.ECHO):
        root, path = fake_dml_host.make(tmp_path, respond)
        monkeypatch.setenv("PATH", path)
        monkeypatch.delenv(host.TIMEOUT_VAR, raising=False)
        return root

    return make


def test_a_well_behaved_fake_host_passes(cli, fake, tmp_path):
    root = fake()
    m = identity_model(tmp_path / "m.onnx")
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root)
    assert r.code == 0, r.err
    assert "real DirectML EP (passed)" in r.out


@pytest.mark.parametrize("value", ["0", "nan", "-1", "inf", "1e400", "ten", "  ", "1e9"])
def test_time_limits_from_the_environment_are_checked_like_options(cli, fake, tmp_path, monkeypatch, value):
    root = fake()
    m = identity_model(tmp_path / "m.onnx")
    monkeypatch.setenv(host.TIMEOUT_VAR, value)
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root)
    if not value.strip():  # unset in effect: the default
        assert r.code == 0, r.err
        return
    line = one_error_line(r.err)
    assert r.code == 2 and host.TIMEOUT_VAR in line and "above 0" in line, line


GOOD = {"ok": True, "ort_version": "1.17.3", "session_ms": 1.0, "warmup_ms": [], "run_ms": [1.0],
        "outputs": [{"name": "@0", "file": "out0.npy", "dtype": "float32", "shape": [2, 3]}]}
ARRAY = np.zeros((2, 3), np.float32)

BAD_ANSWERS = {
    "not json": ("{'ok': tru", {"out0.npy": ARRAY}),
    "deep json": ("[" * 100000 + "]" * 100000, {}),
    "a list": ([GOOD], {"out0.npy": ARRAY}),
    "ok a string": ({**GOOD, "ok": "yes"}, {"out0.npy": ARRAY}),
    "session_ms a string": ({**GOOD, "session_ms": "fast"}, {"out0.npy": ARRAY}),
    "session_ms NaN": ({**GOOD, "session_ms": float("nan")}, {"out0.npy": ARRAY}),
    "run_ms a map": ({**GOOD, "run_ms": {"0": 1}}, {"out0.npy": ARRAY}),
    "run_ms empty": ({**GOOD, "run_ms": []}, {"out0.npy": ARRAY}),
    "outputs a map": ({**GOOD, "outputs": {"y": "out0.npy"}}, {"out0.npy": ARRAY}),
    "output entry a list": ({**GOOD, "outputs": [["y", "out0.npy"]]}, {"out0.npy": ARRAY}),
    "output file missing": (GOOD, {}),
    "output missing": ({**GOOD, "outputs": []}, {}),
    "output listed twice": ({**GOOD, "outputs": GOOD["outputs"] * 2}, {"out0.npy": ARRAY}),
    "another output": ({**GOOD, "outputs": [{**GOOD["outputs"][0], "name": "z"}]}, {"out0.npy": ARRAY}),
    "the model's own name": ({**GOOD, "outputs": [{**GOOD["outputs"][0], "name": "y"}]}, {"out0.npy": ARRAY}),
    "file out of the folder": ({**GOOD, "outputs": [{**GOOD["outputs"][0], "file": "../job.json"}]}, {}),
    "file a number": ({**GOOD, "outputs": [{**GOOD["outputs"][0], "file": 7}]}, {"out0.npy": ARRAY}),
    "wrong shape": (GOOD, {"out0.npy": np.zeros((3, 2), np.float32)}),
    "wrong rank": (GOOD, {"out0.npy": np.zeros((6,), np.float32)}),
    "wrong dtype": (GOOD, {"out0.npy": np.zeros((2, 3), np.float64)}),
    "not npy": (GOOD, {"out0.npy": b"PK\x03\x04 not an array"}),
    "truncated npy": (GOOD, {"out0.npy": fake_dml_host._files({"a": ARRAY})["a"][:-8]}),
    "object npy": (GOOD, {"out0.npy": b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, "
                                     b"'shape': (2, 3), }" + b" " * 58 + b"\n"}),
    "huge npy header": (GOOD, {"out0.npy": b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, "
                                          b"'shape': (2, 3000000000000), }" + b" " * 47 + b"\n"}),
    "error not text": ({"ok": False, "error": {"why": 1}}, {}),
}


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
def test_a_bad_answer_is_one_line_naming_the_host(cli, fake, tmp_path, case):
    result, files = BAD_ANSWERS[case]
    root = fake(fake_dml_host.answer(result, files))
    m = identity_model(tmp_path / "m.onnx")
    for args in (("validate", m, m, "--ep", "dml"), ("bench", m, "--ep", "dml", "--runs", "1", "--warmup", "0")):
        r = cli(*args, "--dml-host", root)
        line = one_error_line(r.err)
        assert r.code == 2 and "DirectML host" in line and "answered badly" in line, (case, line)


def test_a_good_answer_in_the_same_form_passes(cli, fake, tmp_path):
    """The bad answers above differ from this one in one thing each."""
    root = fake(fake_dml_host.answer(GOOD, {"out0.npy": ARRAY}))
    m = identity_model(tmp_path / "m.onnx")
    r = cli("bench", m, "--ep", "dml", "--runs", "1", "--warmup", "0", "--dml-host", root)
    assert r.code == 0, r.err


def test_a_symlinked_output_is_refused(cli, fake, tmp_path):
    respond = fake_dml_host.answer(GOOD) + "os.symlink('/dev/zero', out / 'out0.npy')\n"
    root = fake(respond)
    m = identity_model(tmp_path / "m.onnx")
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root)
    assert r.code == 2 and "answered badly" in one_error_line(r.err)


# -- names that reach JavaScript and ORT's log (the real host) -------------------------------------

LOG_PREFIX = "2026-12-05 06:17:07.8988201 [V:onnxruntime:, session_state.cc:1152 onnxruntime::VerifyEachNodeIsAssignedToAnEp]"
FORGED = "\n".join(["cast", f"{LOG_PREFIX}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 3",
                    f"{LOG_PREFIX}   Einsum (e1)", f"{LOG_PREFIX}   Einsum (e2)",
                    "2026-12-05 06:17:07.89 [I:onnxruntime:, transformer_memcpy.cc:329 "
                    "onnxruntime::TransformerMemcpyImpl::AddCopyNode] Add MemcpyFromHost after q for DmlExecutionProvider"])


def shape_cast_model(shape_name="shape", cast_name="cast"):
    """Relu and Shape on DirectML, Cast on the CPU (ORT keeps shape arithmetic there)."""
    import dmlopt
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           helper.make_node("Shape", ["r"], ["s"], name=shape_name),
                           helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT, name=cast_name)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return dmlopt.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.mark.dml_host
def test_a_node_name_cannot_forge_the_actual_placement(dml_host):
    feeds = {"x": np.ones((2, 3), np.float32)}
    version = dml_host.versions[0]
    plain = dml_host.run(shape_cast_model(), feeds, version).placement
    assert plain["cpu_nodes"] == 1 and plain["copies"] == 0 and plain["cpu_node_names"] == ["cast"]
    for names in ({"shape_name": FORGED}, {"cast_name": FORGED}):
        got = dml_host.run(shape_cast_model(**names), feeds, version).placement
        assert (got["cpu_nodes"], got["copies"], got["partitions"]) == (1, 0, plain["partitions"]), (names, got)
        assert got["cpu_node_names"] == [names.get("cast_name", "cast")]  # the model's own name, mapped back


@pytest.mark.dml_host
@pytest.mark.parametrize("name", ["__proto__", "constructor", "hasOwnProperty", "toString"])
def test_names_that_are_javascript_machinery_run(cli, dml_host, tmp_path, name):
    path = tmp_path / "m.onnx"
    g = helper.make_graph([helper.make_node("Identity", [name], ["y"], name=name),
                           helper.make_node("Relu", ["x"], [name + "_"], name="r")], "g",
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info(name + "_", TensorProto.FLOAT, [2, 3])])
    g2 = helper.make_graph([helper.make_node("Relu", ["x"], [name], name="r")], "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                           [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])])
    for graph in (g, g2):
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
        r = cli("validate", path, path, "--ep", "dml", "--dml-host", dml_host.root, "--ort-version", dml_host.versions[0])
        assert r.code == 0, (name, r.err, r.out[-800:])


# -- nothing of the host outlives dmlopt (the real host) -------------------------------------------

def _marked(mark: str) -> list[str]:
    """Command lines of the processes whose environment holds DMLOPT_TEST_RUN=mark."""
    import os
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"DMLOPT_TEST_RUN={mark}".encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


@pytest.mark.dml_host
@pytest.mark.parametrize("signals", [(), ("SIGINT",), ("SIGTERM",), ("SIGINT", "SIGINT")],
                         ids=["finished", "sigint", "sigterm", "sigint-twice"])
def test_nothing_of_the_host_outlives_dmlopt(dml_host, tmp_path, signals):
    """`dmlopt inspect --ep dml` as a program: finished, or signalled while node.exe runs (the
    second SIGINT makes the supervisor kill the worker at once).  Afterwards no process of the run
    is left and its temp folder (TMPDIR) is empty."""
    import os
    import secrets
    import signal
    import subprocess
    import sys
    import time
    temp = tmp_path / "t"
    temp.mkdir()
    mark = secrets.token_hex(6)
    env = {**os.environ, "TMPDIR": str(temp), "DMLOPT_TEST_RUN": mark, host.ENV_VAR: str(dml_host.root)}
    env.pop(host.TIMEOUT_VAR, None)
    identity_model(tmp_path / "m.onnx", shape=("N", 3))
    proc = subprocess.Popen([sys.executable, "-m", "dmlopt", "inspect", str(tmp_path / "m.onnx"), "--ep", "dml",
                             "--ort-version", dml_host.versions[0]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        if signals:
            deadline = time.monotonic() + 120
            while not any("node.exe" in c for c in _marked(mark)):
                assert time.monotonic() < deadline and proc.poll() is None, "node.exe never started"
                time.sleep(0.1)
            time.sleep(1.0)
            for name in signals:
                proc.send_signal(getattr(signal, name))
                time.sleep(0.3)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if not signals:
        assert proc.returncode == 0, err.decode()[-2000:]
    else:
        assert proc.returncode in (130, 143), err.decode()[-2000:]
    deadline = time.monotonic() + 5
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _marked(mark) == [], "left running"
    assert sorted(p.name for p in temp.iterdir()) == [], "left in the temp folder"


# -- paths on their way into Wine ------------------------------------------------------------------

@pytest.mark.parametrize("temp_name", ["a b", "tab\there", 'dq"uote', "x" * 220])
def test_a_temp_folder_wine_cannot_take_is_refused_naming_it(cli, fake, tmp_path, monkeypatch, temp_name):
    import tempfile
    root = fake()
    m = identity_model(tmp_path / "m.onnx")
    temp = tmp_path / temp_name
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root)
    line = one_error_line(r.err)
    assert r.code == 2 and "temp folder" in line and "TMPDIR" in line and "failed" not in line, line


@pytest.mark.parametrize("host_name", ['dq"uote', "nl\nline", "k" * 170])
def test_a_host_folder_wine_cannot_take_is_refused_naming_it(cli, tmp_path, monkeypatch, host_name):
    root, path = fake_dml_host.make(tmp_path)
    monkeypatch.setenv("PATH", path)
    moved = root.rename(tmp_path / host_name)
    m = identity_model(tmp_path / "m.onnx")
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", moved)
    line = one_error_line(r.err)
    assert r.code == 2 and "host folder" in line and "failed" not in line, line


@pytest.mark.dml_host
@pytest.mark.parametrize("temp_name", ["a b", "q'uote"])
def test_the_real_host_with_an_odd_temp_folder(dml_host, tmp_path, temp_name):
    """A space: refused up front naming TMPDIR (it was DirectML's DXGI error 887A0004); a single
    quote: runs."""
    import os
    import subprocess
    import sys
    temp = tmp_path / temp_name
    temp.mkdir()
    m = identity_model(tmp_path / "m.onnx")
    env = {**os.environ, "TMPDIR": str(temp), host.ENV_VAR: str(dml_host.root)}
    r = subprocess.run([sys.executable, "-m", "dmlopt", "validate", str(m), str(m), "--ep", "dml", "--ort-version",
                        dml_host.versions[0]], env=env, capture_output=True, text=True, timeout=300)
    if " " in temp_name:
        line = one_error_line(r.stderr)
        assert r.returncode == 2 and "TMPDIR" in line and "887A0004" not in line, line
    else:
        assert r.returncode == 0, r.stderr
    assert list(temp.iterdir()) == []


def test_the_hosts_error_names_the_models_own_names(cli, fake, tmp_path):
    """The host runs under safe names; its error says the model's names again (escaped)."""
    root = fake(fake_dml_host.answer({"ok": False, "error": "output \"@0\" could not be computed"}))
    m = identity_model(tmp_path / "m.onnx", name_out="y\nforged")
    r = cli("validate", m, m, "--ep", "dml", "--dml-host", root)
    line = one_error_line(r.err)
    assert r.code == 2 and '"y\\nforged" could not be computed' in line, line


def test_safe_names_leave_optional_outputs_absent():
    """An output left out ("") stays out in the host's copy: named, it would exist and change what
    ORT places (SAM's SkipLayerNormalization went to the CPU)."""
    import dmlopt
    import onnx_ir as ir
    from dmlopt.targets.dml import host_names
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "", "inv"], name="ln")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("inv", TensorProto.FLOAT, [2, 1])],
                          [helper.make_tensor("s", TensorProto.FLOAT, [3], [1, 1, 1]),
                           helper.make_tensor("b", TensorProto.FLOAT, [3], [0, 0, 0])])
    model = dmlopt.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    names = host_names.SafeNames(model)
    outputs = list(ir.serde.serialize_model(names.model).graph.node[0].output)
    assert outputs[1] == "" and all(o.startswith(names.prefix) for o in (outputs[0], outputs[2]))
    assert sorted(names.outputs.values()) == ["inv", "y"] and names.inputs == {"x": names.model.graph.inputs[0].name}


# -- ORT's profile of a host run (bench --ep dml --profile) ------------------------------------------

def _profiling(events_text: str) -> str:
    """The echo host that also writes `events_text` where ORT writes its profile (the job's prefix)."""
    return fake_dml_host.ECHO + (
        "prefix = job['session'].get('profile')\n"
        "if prefix:\n"
        f"    pathlib.Path(linux(prefix) + '_2026-12-06.json').write_text({events_text!r})\n")


GOOD_EVENTS = """[{"cat": "Session", "name": "model_run", "ts": 0, "dur": 900},
 {"cat": "Node", "name": "id_kernel_time", "ts": 10, "dur": 700,
  "args": {"op_name": "Identity", "provider": "DmlExecutionProvider"}},
 {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 900},
 {"cat": "Node", "name": "id_kernel_time", "ts": 1010, "dur": 500,
  "args": {"op_name": "Identity", "provider": "DmlExecutionProvider", "extra": {"deep": [1]}}},
 {"cat": "Node", "name": "id_kernel_time", "ts": 1020, "dur": NaN, "args": {"op_name": "Identity"}},
 {"cat": "Node", "name": "id_kernel_time", "ts": 1030, "dur": true, "args": {"op_name": "Identity"}},
 {"cat": "Node", "name": 5, "dur": "x"}, "not an event"]"""


def test_bench_profile_reads_the_hosts_profile_as_untrusted(cli, fake, tmp_path):
    import json

    root = fake(_profiling(GOOD_EVENTS))
    m = identity_model(tmp_path / "m.onnx")
    r = cli("bench", m, "--ep", "dml", "--dml-host", root, "--profile", "--runs", "2", "--json")
    assert r.code == 0, r.err
    profile = json.loads(r.out)["profile"]
    assert profile["op_time_ms"] == {"Identity": {"ms": 0.5, "nodes": 1}}, profile  # the runs after the first
    assert [n["node"] for n in profile["slowest_nodes"]] == ["id"]  # the model's own node name again
    r = cli("bench", m, "--ep", "dml", "--dml-host", root, "--profile", "--runs", "2")
    assert r.code == 0 and "CPU-side recording and submission" in r.out, r.out


@pytest.mark.parametrize("events_text, said", [("{\"a\": 1}", "not a list of profile events"),
                                                ("[1, 2", "is not JSON")])
def test_a_bad_profile_is_one_line_naming_the_host(cli, fake, tmp_path, events_text, said):
    root = fake(_profiling(events_text))
    m = identity_model(tmp_path / "m.onnx")
    r = cli("bench", m, "--ep", "dml", "--dml-host", root, "--profile", "--runs", "1")
    line = one_error_line(r.err)
    assert r.code == 2 and said in line and "answered badly" in line, r.err


def test_a_host_that_writes_no_profile_says_which_versions_do(cli, fake, tmp_path):
    root = fake()
    m = identity_model(tmp_path / "m.onnx")
    r = cli("bench", m, "--ep", "dml", "--dml-host", root, "--profile", "--runs", "1")
    assert r.code == 0 and "wrote no profile" in r.out and "from 1.24" in r.out, r.out
    r = cli("bench", m, "--ep", "dml", "--dml-host", root, "--profile", "--compare", identity_model(tmp_path / "o.onnx",
            shape=(2, 3), name_out="z"))
    assert r.code == 2 and "drop --compare" in one_error_line(r.err)


@pytest.mark.dml_host
def test_the_real_host_profiles_from_ort_1_24(dml_host):
    from dmlopt.targets.dml import real_ep
    import onnx_ir as ir
    from tests.conftest import conv_leaky_model

    model = ir.from_proto(conv_leaky_model(batch=1))
    for version in dml_host.versions:
        out = real_ep.time_model(model, real_ep.resolve(dml_host.root, version), runs=2, warmup=1, profile=True)
        if host_version_at_least(version, (1, 24)):
            assert out["profile"]["nodes_by_provider"].get("DmlExecutionProvider"), (version, out["profile"])
            assert "StringNormalizer" not in out["profile"]["op_time_ms"]  # dmlopt's placement probe left out
        else:
            assert out["profile"] is None and "from 1.24" in out["profile_missing"]


def host_version_at_least(version: str, wanted: tuple[int, int]) -> bool:
    return tuple(int(p) for p in version.split(".")[:2]) >= wanted
