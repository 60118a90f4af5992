"""Ctrl-C at every point of `dmlopt.save` (issue 32.10): the API's interrupt lands at each bytecode
of save's own code (scratch, outputs, the temporary folder's creation and removal), one run per
point.  After each: nothing is left beside the output but the complete output, the interrupt was
raised (never lost, never raised later by another call), and Python's own Ctrl-C handler is back."""

from __future__ import annotations

import signal
import sys

import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt.io import model as model_mod

WATCHED = ("dmlopt/io/scratch.py", "dmlopt/io/model.py", "dmlopt/io/outputs.py", "contextlib.py", "tempfile.py",
           "shutil.py", "posixpath.py")


def _model():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return dmlopt.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _save_interrupted_at(model, dest, at: int) -> tuple[bool, int]:
    """Save, with SIGINT raised at the `at`-th bytecode of the watched files: (interrupted, bytecodes run)."""
    count = [0]

    def local(frame, event, arg):
        if event == "opcode":
            count[0] += 1
            if count[0] == at:
                signal.raise_signal(signal.SIGINT)
        return local

    def trace(frame, event, arg):
        if frame.f_code.co_filename.endswith(WATCHED):
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(trace)
    try:
        model_mod.save(model, dest)
        return False, count[0]
    except KeyboardInterrupt:
        return True, count[0]
    finally:
        sys.settrace(None)


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                    reason="needs Python's own Ctrl-C handler (the API's case)")
def test_an_interrupt_anywhere_in_save_leaves_nothing_and_is_raised(tmp_path):
    model = _model()
    problems = []
    at = 1
    while True:
        folder = tmp_path / f"r{at}"
        folder.mkdir()
        interrupted, ran = _save_interrupted_at(model, folder / "o.onnx", at)
        left = sorted(p.name for p in folder.iterdir())
        handler = signal.getsignal(signal.SIGINT)
        if left not in ([], ["o.onnx"]):
            problems.append((at, "left", left))
        if handler is not signal.default_int_handler:
            problems.append((at, "handler", getattr(handler, "__name__", handler)))
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if ran >= at and not interrupted:
            problems.append((at, "interrupt lost"))
        late = False
        try:
            model_mod.save(model, tmp_path / "later.onnx")  # a stale interrupt would surface here
        except KeyboardInterrupt:
            late = True
        if late:
            problems.append((at, "raised by a later call"))
        if ran < at:  # save finished before the signal's turn: every point was tried
            break
        at += 1
    assert at > 200, "the trace did not reach save"
    assert not problems, problems[:10]
