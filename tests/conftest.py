"""Shared fixtures: small hand-built models and a CLI runner that captures stdout/stderr."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dmlopt.runtime import ort_model
from dmlopt.cli.commands import main


def conv_leaky_model(batch="N", alpha=0.1, channels=4, size=8, seed=0) -> onnx.ModelProto:
    """x -> Conv(3x3) -> LeakyRelu -> Identity -> y, with a dynamic batch by default."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("LeakyRelu", ["c"], ["l"], alpha=alpha, name="leaky"),
         helper.make_node("Identity", ["l"], ["y"], name="identity")],
        "conv_leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, channels, size, size])],
        [w, b])
    return ort_model.make_model(graph, {"": 17})


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(conv_leaky_model(), path)
    return path


class CliResult:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys):
    """Run `dmlopt ARGS...` in-process; return exit code, stdout, stderr."""

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def one_error_line(err: str) -> str:
    """The one line a refused command prints: `dmlopt: error: ...`, no traceback, no internal error."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert lines[0].startswith("dmlopt: error: "), err
    return lines[0]
