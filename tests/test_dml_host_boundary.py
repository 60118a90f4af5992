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
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Make a fake host answering with `respond`; returns its folder."""

    def make(respond=fake_dml_host.ECHO, outputs=None):
        root, path = fake_dml_host.make(tmp_path, respond, outputs)
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
