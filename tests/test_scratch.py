"""Scratch folders: an interrupt that arrives while one is made or removed waits until it is gone.

The signal is simulated by calling `raise_or_defer` (what the command line's handlers do) at the
moment a real signal can land: inside mkdtemp after the folder exists, inside rmtree."""

from __future__ import annotations

import os
import shutil
import tempfile

import onnx_ir as ir
import pytest

from dmlopt.io import model as model_io, scratch
from tests.conftest import conv_leaky_model


def test_interrupt_outside_a_block_is_raised_at_once():
    with pytest.raises(KeyboardInterrupt):
        scratch.raise_or_defer(KeyboardInterrupt())


def test_interrupt_inside_nested_blocks_waits_for_the_outermost():
    seen = []
    with pytest.raises(KeyboardInterrupt):
        with scratch.uninterrupted():
            with scratch.uninterrupted():
                scratch.raise_or_defer(KeyboardInterrupt())
                seen.append("inner went on")
            seen.append("outer went on")
    assert seen == ["inner went on", "outer went on"]
    with scratch.uninterrupted():  # the interrupt was raised once: a later block runs through
        seen.append("clean")
    assert seen[-1] == "clean"


def test_interrupt_while_the_folder_is_made_leaves_nothing(tmp_path, monkeypatch):
    real = tempfile.mkdtemp

    def mkdtemp_then_signal(*a, **k):
        path = real(*a, **k)
        scratch.raise_or_defer(KeyboardInterrupt())  # after the folder exists, before the caller has its name
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
    with pytest.raises(KeyboardInterrupt):
        with scratch.folder("dmlopt-test-", parent=tmp_path):
            pytest.fail("the body must not run after the interrupt")
    assert list(tmp_path.iterdir()) == []


def test_interrupt_while_the_folder_is_removed_finishes_the_removal(tmp_path, monkeypatch):
    real = shutil.rmtree
    calls = []

    def rmtree_with_signal(path, *a, **k):
        calls.append(path)
        scratch.raise_or_defer(KeyboardInterrupt())  # arrives mid-removal
        real(path, *a, **k)

    with pytest.raises(KeyboardInterrupt):
        with scratch.folder("dmlopt-test-", parent=tmp_path) as path:
            for i in range(20):
                (path / f"f{i}").write_bytes(b"x" * 100)
            monkeypatch.setattr(shutil, "rmtree", rmtree_with_signal)
    assert calls and list(tmp_path.iterdir()) == []


def test_folder_is_removed_on_error_and_on_success(tmp_path):
    with scratch.folder("ok-", parent=tmp_path) as path:
        assert path.is_dir() and path.parent == tmp_path
    with pytest.raises(ValueError):
        with scratch.folder("err-", parent=tmp_path):
            raise ValueError("boom")
    assert os.listdir(tmp_path) == []


def test_interrupt_during_save_leaves_no_half_written_output(tmp_path, monkeypatch):
    """model.save: an interrupt at the temp folder's creation leaves neither the folder nor an output."""
    m = ir.from_proto(conv_leaky_model())
    real = tempfile.mkdtemp

    def mkdtemp_then_signal(*a, **k):
        path = real(*a, **k)
        scratch.raise_or_defer(KeyboardInterrupt())
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signal)
    with pytest.raises(KeyboardInterrupt):
        model_io.save(m, tmp_path / "out.onnx")
    assert list(tmp_path.iterdir()) == []


def test_capture_stderr_holds_fd2_and_leaves_nothing(tmp_path, monkeypatch):
    """What native code writes to file descriptor 2 is collected (also when the block raises) and fd 2
    is restored; the scratch folder it used is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch.capture_stderr() as box:
        os.write(2, b"from native code\n")
    assert box["text"] == "from native code\n"
    try:
        with scratch.capture_stderr() as box:
            os.write(2, b"before the error\n")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert box["text"] == "before the error\n" and list(tmp_path.iterdir()) == []
    os.fstat(2)  # fd 2 is open again
