"""Signals reach dmlopt even inside native code (issue 23.4).

dmlopt runs as a program through a supervisor (dmlopt.cli.supervisor): the command works in a child
process that SIGINT, SIGTERM or SIGHUP stop within seconds even while ONNX Runtime runs a Loop
that never ends, with the same promise as ever: one line, exit 128 + signal (130 for Ctrl-C),
nothing partial left beside the output or in the temp folder.  Generated over the commands that
run models and the signals, plus a worker that dies on its own (killed mid-save) and Ctrl-C in
the Python API while save makes its temporary folder."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dmlopt
from tests.conftest import conv_leaky_model
from tests.test_guarantees import _children, _interrupt_when, _leftovers, big_model  # noqa: F401 - fixture

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the supervisor needs fork (POSIX)")
GRACE = 3.0  # dmlopt.cli.supervisor.GRACE_S
STOPPED_WITHIN = GRACE + 6.0  # seconds from the signal to the exit, on a loaded 2-core machine


def endless_loop_model() -> onnx.ModelProto:
    """y = Loop(cond=true, no trip count){ v + 1 }: ONNX Runtime never returns from it."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    graph = helper.make_graph([helper.make_node("Loop", ["", "cond", "x"], ["y"], body=body)], "endless",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _cpu_seconds(pid: int) -> float:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _in_the_loop(proc: subprocess.Popen, timeout: float = 120.0) -> bool:
    """Wait until the worker has burnt CPU for a while after its imports: inside ORT's Loop."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        workers = _children(proc.pid)
        if workers and _cpu_seconds(workers[0]) > 6.0:
            return True
        time.sleep(0.1)
    return False


COMMANDS = {"validate": ["validate", "{m}", "{m}"],
            "optimize": ["optimize", "{m}", "-o", "{out}/out.onnx", "--no-time", "--report", "{out}/r.json"],
            "bench": ["bench", "{m}", "--runs", "1", "--warmup", "0", "--ep", "cpu", "-q"]}
CASES = [(c, s) for c in COMMANDS for s in ("SIGTERM", "SIGINT")] + [("validate", "SIGHUP")]


@pytest.mark.slow
@pytest.mark.parametrize("command,signame", CASES, ids=[f"{c}-{s}" for c, s in CASES])
def test_a_signal_stops_a_run_stuck_in_native_code(tmp_path, command, signame):
    sig = getattr(signal, signame)
    model = tmp_path / "endless.onnx"
    onnx.save(endless_loop_model(), model)
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    argv = [a.format(m=model, out=out) for a in COMMANDS[command]]
    proc = subprocess.Popen([sys.executable, "-m", "dmlopt", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TMPDIR=str(tmp)))
    try:
        assert _in_the_loop(proc), "the run ended before it reached the Loop"
        proc.send_signal(sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=STOPPED_WITHIN + 30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < STOPPED_WITHIN, f"{took:.1f} s after {signame}"
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    said = "interrupted" if sig == signal.SIGINT else f"terminated ({signame})"
    assert err.strip() == f"dmlopt: {said}; nothing was written"
    assert list(out.iterdir()) == [] and list(tmp.iterdir()) == []
    assert not _children(proc.pid)


@pytest.mark.slow
def test_a_worker_that_dies_mid_save_leaves_nothing(big_model, tmp_path):  # noqa: F811
    """The worker killed outright (as the OOM killer would) while it saves: the supervisor
    removes the temporary folder beside the output and names the cause."""
    out_dir, tmp_dir = tmp_path / "out", tmp_path / "tmp"
    out_dir.mkdir()
    tmp_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "dmlopt", "optimize", str(big_model), "-o", str(out_dir / "out.onnx"),
                             "--passes", "cleanup", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_dir)))

    class Worker:  # _interrupt_when signals `proc`; here the worker itself is killed
        pid = proc.pid

        @staticmethod
        def poll():
            return proc.poll()

        @staticmethod
        def send_signal(sig):
            if sig in (signal.SIGSTOP, signal.SIGCONT):
                os.kill(proc.pid, sig)
            else:
                for pid in _children(proc.pid):
                    os.kill(pid, signal.SIGKILL)

    hit = _interrupt_when(Worker, lambda: any(p.name.startswith(".out.onnx.") for p in out_dir.iterdir()),
                          sig=signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert hit, f"the run ended before the moment came: {err}"
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert err.strip() == "dmlopt: internal error: the worker process died of SIGKILL (out of memory?); nothing was written"
    assert list(out_dir.iterdir()) == [] and _leftovers(tmp_dir) == []


def test_ctrl_c_in_the_api_while_save_makes_its_folder_leaves_nothing(tmp_path, monkeypatch):
    """A real SIGINT under Python's own handler (no command line), arriving right after the
    temporary folder exists: KeyboardInterrupt, and no .out.onnx.*.tmp left behind."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    real = tempfile.mkdtemp

    def mkdtemp_then_sigint(*a, **k):
        path = real(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes: give it some
            pass
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_sigint)
    with pytest.raises(KeyboardInterrupt):
        dmlopt.save(dmlopt.load(conv_leaky_model()), tmp_path / "out.onnx")
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
