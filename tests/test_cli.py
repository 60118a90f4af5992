"""The `dmlopt` command: subcommands, exit codes, and one clear line for each bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

from tests.conftest import conv_leaky_model


def _one_clean_line(result):
    lines = [l for l in result.err.splitlines() if l.strip()]
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    assert lines[0].startswith("dmlopt")
    return lines[0]


def test_help_on_every_subcommand(cli, capsys):
    for sub in ("optimize", "inspect", "validate", "bench", "passes", "demo"):
        with pytest.raises(SystemExit) as e:
            cli(sub, "--help")
        assert e.value.code == 0
        assert "usage: dmlopt " + sub in capsys.readouterr().out


def test_passes_lists_every_registered_pass(cli):
    from dmlopt.passes import all_passes

    r = cli("passes")
    assert r.code == 0
    for name, cls in all_passes().items():
        assert any(line.startswith(name) and cls.summary in line for line in r.out.splitlines())


def test_inspect_json(cli, model_path):
    r = cli("inspect", model_path, "--json")
    assert r.code == 0
    info = json.loads(r.out)
    assert info["nodes"] == 3
    assert info["op_counts"] == {"Conv": 1, "Identity": 1, "LeakyRelu": 1}
    assert info["inputs"] == [{"name": "x", "dtype": "float", "shape": ["N", 3, 8, 8]}]
    assert info["free_dims"] == ["N"]
    assert info["sites"]["conv_leaky_relu"][0]["producer"] == "Conv"


def test_inspect_table(cli, model_path):
    r = cli("inspect", model_path)
    assert r.code == 0
    assert "free dims: N" in r.out and "LeakyRelu" in r.out


def test_optimize_writes_validated_model_and_report(cli, model_path, tmp_path):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    r = cli("optimize", model_path, "-o", out, "--passes", "cleanup", "--report", report)
    assert r.code == 0, r.err
    assert r.out.splitlines()[1].startswith("numerics (ORT CPU EP): match")  # the verdict first
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Conv", "LeakyRelu"]
    data = json.loads(report.read_text())
    assert data["validation"]["passed"] is True
    assert data["passes"][0]["name"] == "cleanup"
    assert data["passes"][0]["op_delta"] == {"Identity": -1}
    assert data["written"] == str(out)


def test_validate_exit_codes(cli, model_path, tmp_path):
    same = cli("validate", model_path, model_path, "--json")
    assert same.code == 0
    assert json.loads(same.out)["outputs"][0]["max_abs"] == 0
    other = tmp_path / "other.onnx"
    onnx.save(conv_leaky_model(seed=1), other)
    diff = cli("validate", model_path, other)
    assert diff.code == 1
    assert "FAIL" in diff.out


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


BAD_INPUTS = {
    "missing file": lambda d, m: ["optimize", d / "missing.onnx", "-o", d / "out.onnx"],
    "directory": lambda d, m: ["optimize", d, "-o", d / "out.onnx"],
    "non-onnx bytes": lambda d, m: ["optimize", _write(d / "junk.onnx", b"\x89PNG not a model" * 50), "-o", d / "out.onnx"],
    "truncated": lambda d, m: ["optimize", _write(d / "cut.onnx", m.read_bytes()[:100]), "-o", d / "out.onnx"],
    "empty file": lambda d, m: ["optimize", _write(d / "empty.onnx", b""), "-o", d / "out.onnx"],
    "unknown pass": lambda d, m: ["optimize", m, "-o", d / "out.onnx", "--passes", "cleanup,no-such-pass"],
    "malformed shape": lambda d, m: ["optimize", m, "-o", d / "out.onnx", "--shape", "x:1,three,8,8"],
    "shape naming no input": lambda d, m: ["optimize", m, "-o", d / "out.onnx", "--shape", "nope:1,3,8,8"],
    "output equal to input": lambda d, m: ["optimize", m, "-o", m],
    "unwritable output": lambda d, m: ["optimize", m, "-o", d / "no-such-folder" / "out.onnx"],
    "no output": lambda d, m: ["optimize", m],
    "unknown target": lambda d, m: ["optimize", m, "-o", d / "out.onnx", "--target", "tpu"],
    "inspect missing": lambda d, m: ["inspect", d / "missing.onnx"],
    "validate junk": lambda d, m: ["validate", m, _write(d / "junk2.onnx", b"junk")],
}


def _write(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, tmp_path, case):
    model = tmp_path / "model.onnx"
    onnx.save(conv_leaky_model(), model)
    args = BAD_INPUTS[case](tmp_path, model)
    before = _snapshot(tmp_path)
    r = cli(*args)
    assert r.code == 2, (case, r.err)
    _one_clean_line(r)
    after = _snapshot(tmp_path)
    assert after == before  # no partial output; the input untouched


def test_missing_external_data_is_exit_2(cli, tmp_path):
    path = tmp_path / "ext.onnx"
    onnx.save(conv_leaky_model(), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    os.remove(tmp_path / "ext.data")
    r = cli("optimize", path, "-o", tmp_path / "out.onnx")
    assert r.code == 2
    assert "external data file 'ext.data'" in _one_clean_line(r)
    assert not (tmp_path / "out.onnx").exists()


def test_failed_validation_writes_nothing_unless_forced(cli, tmp_path, model_path, monkeypatch):
    from dmlopt.passes import cleanup

    real_call = cleanup.CleanupPass.call

    def corrupt(self, model):  # a deliberately wrong pass: flips the LeakyRelu slope
        result = real_call(self, model)
        for node in model.graph:
            if node.op_type == "LeakyRelu":
                import onnx_ir as ir
                node.attributes["alpha"] = ir.AttrFloat32("alpha", 0.9)
        return result

    monkeypatch.setattr(cleanup.CleanupPass, "call", corrupt)
    out = tmp_path / "out.onnx"
    r = cli("optimize", model_path, "-o", out, "--passes", "cleanup")
    assert r.code == 1
    assert "nothing was written" in r.err and "first failing pass: cleanup" in r.err
    assert not out.exists()
    forced = cli("optimize", model_path, "-o", out, "--passes", "cleanup", "--force", "--json")
    assert forced.code == 1 and out.exists()
    report = json.loads(forced.out)
    assert report["forced"] is True and report["validation"]["passed"] is False


def test_entry_point_runs_as_a_user_would(tmp_path, model_path):
    """... and leaves nothing in TMPDIR (ORT's telemetry uploader keeps a .ses file there unless it
    is switched off before onnxruntime is imported)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "CI", "GITHUB_ACTIONS", "TF_BUILD")}
    r = subprocess.run([sys.executable, "-m", "dmlopt", "optimize", str(model_path), "-o", str(tmp_path / "o.onnx"),
                        "--passes", "cleanup", "-q"], capture_output=True, text=True, env={**env, "TMPDIR": str(tmpdir)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o.onnx").exists()
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    bad = subprocess.run([sys.executable, "-m", "dmlopt", "inspect", str(tmp_path / "missing.onnx")],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "no such file" in bad.stderr


# -- a signal after the output is in place -------------------------------------------------------

def _raises(exc: BaseException, real=None):
    """A stand-in that runs `real` (if given), then raises `exc`: a signal arriving right there."""
    def arrives(*args, **kwargs):
        if real is not None:
            real(*args, **kwargs)
        raise exc
    return arrives


@pytest.mark.parametrize("where", ["writing the report", "inside save, after it staged the model"])
def test_a_signal_before_the_outputs_are_put_in_place_leaves_none_of_them(cli, model_path, tmp_path, monkeypatch,
                                                                          where):
    """The outputs are one transaction (dmlopt.io.outputs): SIGTERM while the report is written, or
    Ctrl-C in save after the model is staged, leaves no model, no session configuration, no
    report and no temporary file, and the message says that nothing was written."""
    import signal

    import dmlopt.cli.commands as cli_mod
    import dmlopt.report.optimize_report as report_mod

    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    if where == "writing the report":
        monkeypatch.setattr(report_mod, "write", _raises(cli_mod.Terminated(signal.SIGTERM)))
        expected_code, start = 128 + signal.SIGTERM, "dmlopt: terminated (SIGTERM); "
    else:
        monkeypatch.setattr(cli_mod, "save", _raises(KeyboardInterrupt(), real=cli_mod.save))
        expected_code, start = 130, "dmlopt: interrupted; "
    r = cli("optimize", model_path, "-o", out, "--report", report, "--target", "cpu", "--no-time", "-q")
    assert r.code == expected_code, r.err
    assert r.err.strip() == start + "nothing was written", r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [model_path.name]


def test_a_signal_during_the_renames_waits_and_names_every_file(cli, model_path, tmp_path, monkeypatch):
    """Ctrl-C arriving at the first rename of the transaction waits until every output is in
    place; the message then names them all (complete)."""
    import dmlopt
    from dmlopt.io import outputs, scratch

    real = outputs.os.replace
    calls = []

    def replace_then_signal(src, dst):
        real(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            scratch.raise_or_defer(KeyboardInterrupt())

    monkeypatch.setattr(outputs.os, "replace", replace_then_signal)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    r = cli("optimize", model_path, "-o", out, "--report", report, "--target", "cpu", "--no-time", "-q")
    assert r.code == 130, r.err
    written = f"{out}, {tmp_path / 'out.session.json'}, {report}"
    assert r.err.strip() == f"dmlopt: interrupted; already written (complete): {written}", r.err
    assert len(dmlopt.load(out).graph) > 0 and report.exists() and len(calls) == 3


def test_a_signal_before_anything_is_written_still_says_nothing_was_written(cli, model_path, tmp_path, monkeypatch):
    import dmlopt.cli.commands as cli_mod

    monkeypatch.setattr(cli_mod, "save", _raises(KeyboardInterrupt()))
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--target", "cpu", "--no-time", "-q")
    assert r.code == 130 and r.err.strip() == "dmlopt: interrupted; nothing was written", r.err
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("args, message", [
    (("--passes", "cleanup", "--fp16"), "--fp16 converts with the fp16 pass, which --passes leaves out"),
    (("--passes", "cleanup,fp16"), "--passes names fp16, which converts only with --fp16"),
])
def test_fp16_and_passes_must_agree(cli, model_path, tmp_path, args, message):
    """The precision picks defaults and tolerances: a float16 request no pass carries out is refused."""
    out = tmp_path / "out.onnx"
    r = cli("optimize", model_path, "-o", out, "--target", "cpu", "--no-time", *args)
    assert r.code == 2
    assert message in _one_clean_line(r)
    assert not out.exists()


def test_fp16_named_with_fp16_converts(cli, model_path, tmp_path):
    out = tmp_path / "out.onnx"
    r = cli("optimize", model_path, "-o", out, "--target", "cpu", "--no-time", "--passes", "fp16", "--fp16")
    assert r.code == 0, r.err
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in onnx.load(out).graph.initializer)
