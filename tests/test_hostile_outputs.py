"""Every destination and input is checked before the work, outputs are one transaction, exit
codes tell the truth, and created files follow the umask (issue 23.5, 23.6, 23.8; 22.9).

Generated over: the ways -o/--report can name the --inputs file; -o names of every length
around the file-name limit; the places a full disk can fail (the model, its session
configuration, the report, ONNX Runtime's scratch copy, a rename); every numeric option with
values the work cannot use; umasks."""

from __future__ import annotations

import errno
import itertools
import os
import stat
import tempfile

import numpy as np
import onnx
import pytest

import dmlopt
import dmlopt.cli.commands as cli_mod
from dmlopt.io import outputs
from tests.conftest import conv_leaky_model

NAME_MAX = os.pathconf(tempfile.gettempdir(), "PC_NAME_MAX") if hasattr(os, "pathconf") else 255


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmlopt: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def work_calls(monkeypatch):
    """Counts calls of the pipeline: a refusal must come before any."""
    calls = []
    real = cli_mod.optimize
    monkeypatch.setattr(cli_mod, "optimize", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _inputs(tmp_path, name="in.npz"):
    path = tmp_path / name
    with open(path, "wb") as f:  # np.savez would add .npz to any other name
        np.savez(f, x=np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32))
    return path


# -- 5. the --inputs file is an input, never a destination -----------------------------------

@pytest.mark.parametrize("where,how", list(itertools.product(["-o", "--report"], ["name", "symlink", "hard link"])))
def test_no_output_may_replace_the_inputs_file(cli, model_path, tmp_path, work_calls, where, how):
    npz = _inputs(tmp_path, "in.json" if where == "--report" else "in.npz")  # any name holds an npz
    before = npz.read_bytes()
    target = {"name": npz, "symlink": tmp_path / "link.json", "hard link": tmp_path / "hard.json"}[how]
    if how == "symlink":
        target.symlink_to(npz)
    elif how == "hard link":
        os.link(npz, target)
    args = ["optimize", model_path, "--inputs", npz, "--no-time"]
    args += ["-o", target] if where == "-o" else ["-o", tmp_path / "out.onnx", "--report", target]
    r = cli(*args)
    assert r.code == 2 and "the --inputs file" in _one_line(r.err)
    assert npz.read_bytes() == before and not work_calls and not (tmp_path / "out.onnx").exists()


def test_a_missing_inputs_file_fails_before_the_work(cli, model_path, tmp_path, work_calls):
    r = cli("optimize", model_path, "-o", tmp_path / "out.onnx", "--inputs", tmp_path / "missing.npz")
    assert r.code == 2 and "no such inputs file" in _one_line(r.err) and not work_calls


# -- 6. destinations checked before the work; one transaction; exit codes -------------------

@pytest.mark.parametrize("length", range(NAME_MAX - 16, NAME_MAX + 2))
@pytest.mark.parametrize("report", [False, True])
def test_an_output_name_near_the_limit_works_or_fails_before_the_work(cli, model_path, tmp_path, work_calls,
                                                                      length, report):
    name = "a" * (length - len(".onnx")) + ".onnx"
    args = ["optimize", model_path, "-o", tmp_path / name, "--target", "cpu", "--no-time", "-q"]
    if report:
        args += ["--report", tmp_path / ("r" * (length - len(".json")) + ".json")]
    r = cli(*args)
    if r.code == 0:
        assert (tmp_path / name).is_file() and dmlopt.load(tmp_path / name) is not None
    else:
        assert r.code == 2 and not work_calls, r.err
        _one_line(r.err)
        assert sorted(p.name for p in tmp_path.iterdir()) == [model_path.name]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _fail_with_enospc(prefix: str, real):
    def make(*a, **k):
        if str(k.get("prefix", a[1] if len(a) > 1 else "")).startswith(prefix):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)
    return make


FULL_DISK = ["the model", "the session configuration", "the report", "ONNX Runtime's scratch copy"]


@pytest.mark.parametrize("where", FULL_DISK)
def test_a_full_disk_anywhere_is_exit_2_and_nothing_written(cli, model_path, tmp_path, monkeypatch, where):
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    if where == "the model":
        monkeypatch.setattr(tempfile, "mkdtemp", _fail_with_enospc(".out.onnx.", tempfile.mkdtemp))
    elif where == "ONNX Runtime's scratch copy":
        monkeypatch.setattr(tempfile, "mkdtemp", _fail_with_enospc("dmlopt-ort-", tempfile.mkdtemp))
    else:
        prefix = ".out.session.json." if where == "the session configuration" else ".r.json."
        monkeypatch.setattr(tempfile, "mkstemp", _fail_with_enospc(prefix, tempfile.mkstemp))
    r = cli("optimize", model_path, "-o", out, "--report", report, "--target", "cpu", "--no-time", "-q")
    assert r.code == 2, r.err
    line = _one_line(r.err)
    assert "No space left" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [model_path.name]


@pytest.mark.parametrize("command", ["validate", "bench"])
def test_a_full_temp_folder_is_exit_2_for_every_command(cli, model_path, monkeypatch, command):
    monkeypatch.setattr(tempfile, "mkdtemp", _fail_with_enospc("dmlopt-ort-", tempfile.mkdtemp))
    args = ["validate", model_path, model_path] if command == "validate" else \
        ["bench", model_path, "--ep", "cpu", "--runs", "1", "-q"]
    r = cli(*args)
    assert r.code == 2 and "No space left" in _one_line(r.err)


def test_a_rename_that_fails_says_exactly_what_is_complete(cli, model_path, tmp_path, monkeypatch):
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    real = outputs.os.replace

    def replace(src, dst):
        if str(dst) == str(report):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(src, dst)

    monkeypatch.setattr(outputs.os, "replace", replace)
    r = cli("optimize", model_path, "-o", out, "--report", report, "--target", "cpu", "--no-time", "-q")
    line = _one_line(r.err)
    assert r.code == 2 and f"complete: {out}, {tmp_path / 'out.session.json'}" in line and "not written: the report" in line
    assert out.is_file() and not report.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_run_leaves_the_previous_outputs_as_they_were(cli, model_path, tmp_path, monkeypatch):
    out = tmp_path / "out.onnx"
    assert cli("optimize", model_path, "-o", out, "--target", "cpu", "--no-time", "-q").code == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    onnx.save(conv_leaky_model(seed=5), model_path)  # a new model for the same name
    monkeypatch.setattr(tempfile, "mkstemp", _fail_with_enospc(".r.json.", tempfile.mkstemp))
    r = cli("optimize", model_path, "-o", out, "--report", tmp_path / "r.json", "--target", "cpu", "--no-time", "-q")
    assert r.code == 2
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {k: v for k, v in after.items() if k != model_path.name} == \
        {k: v for k, v in before.items() if k != model_path.name}


def test_a_new_model_without_a_session_configuration_takes_the_old_one_away(cli, model_path, tmp_path):
    out = tmp_path / "out.onnx"
    assert cli("optimize", model_path, "-o", out, "--target", "cpu", "--no-time", "-q").code == 0
    assert (tmp_path / "out.session.json").exists()
    assert cli("optimize", model_path, "-o", out, "--target", "cpu", "--no-time", "-q", "--no-session-config").code == 0
    assert not (tmp_path / "out.session.json").exists()


BAD_NUMBERS = [("validate", "--seed", "-1"), ("validate", "--seed", "2**40"), ("validate", "--rtol", "nan"),
               ("validate", "--atol", "-1"), ("validate", "--atol", "inf"), ("optimize", "--rtol", "nan"),
               ("optimize", "--atol", "-0.5"), ("optimize", "--fp16-repair-runs", "-3"), ("bench", "--runs", "0"),
               ("bench", "--runs", "-2"), ("bench", "--warmup", "-1"), ("demo", "--runs", "0"), ("demo", "--runs", "x")]


@pytest.mark.parametrize("command,option,value", BAD_NUMBERS)
def test_every_numeric_option_is_checked_at_parse_time(cli, model_path, tmp_path, work_calls, command, option, value):
    args = {"validate": ["validate", model_path, model_path], "optimize": ["optimize", model_path, "-o", tmp_path / "o.onnx"],
            "bench": ["bench", model_path], "demo": ["demo", "-o", tmp_path / "demo"]}[command]
    r = cli(*args, option, value)
    assert r.code == 2 and option in _one_line(r.err) and not work_calls
    assert sorted(p.name for p in tmp_path.iterdir()) == [model_path.name]


def test_demo_into_a_file_is_refused_before_the_work(cli, tmp_path):
    target = tmp_path / "a-file"
    target.write_text("mine")
    r = cli("demo", "-o", target, "-q")
    assert r.code == 2 and "not a folder" in _one_line(r.err) and target.read_text() == "mine"


# -- 8. created files follow the umask ---------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002, 0o077])
def test_every_created_file_follows_the_umask(cli, model_path, tmp_path, umask):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    previous = os.umask(umask)
    try:
        r = cli("optimize", model_path, "-o", out_dir / "out.onnx", "--report", out_dir / "r.json", "--target", "cpu",
                "--no-time", "-q")
        r2 = cli("optimize", model_path, "-o", out_dir / "page.onnx", "--report", out_dir / "r.html", "--target",
                 "cpu", "--no-time", "-q")
        dmlopt.save(dmlopt.load(model_path), out_dir / "ext.onnx", external_data=True)
    finally:
        os.umask(previous)
    assert r.code == 0 and r2.code == 0, r.err + r2.err
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out_dir.iterdir()}
    assert {"out.onnx", "out.session.json", "r.json", "r.html", "ext.onnx", "ext.onnx.data"} <= set(modes)
    assert set(modes.values()) == {0o666 & ~umask}, modes


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS])
def test_a_storage_error_anywhere_else_is_one_line_exit_2(cli, model_path, monkeypatch, code):
    def fails(*a, **k):
        raise OSError(code, os.strerror(code), "/somewhere/file")

    monkeypatch.setattr(cli_mod, "inspect", fails)
    r = cli("inspect", model_path)
    assert r.code == 2 and _one_line(r.err) == f"dmlopt: error: /somewhere/file: {os.strerror(code)}; nothing was written"


def test_any_other_os_error_is_still_an_internal_error(cli, model_path, monkeypatch):
    monkeypatch.setattr(cli_mod, "inspect", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    r = cli("inspect", model_path)
    assert r.code == 3 and r.err.startswith("dmlopt: internal error: OSError")
