"""Declared sizes and --inputs archives dmlopt cannot or need not materialise (issue 32.7, 32.9).

Every declared input shape numpy cannot hold, even an empty one ([0, 2**62]: its non-zero dims
times the item size pass 2**63), or over the inputs' limit, is exit 2 naming the input before any
pass runs; an --inputs archive's members are compared with the model's inputs from their .npy
headers, before any data is decompressed."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import dmlopt
from dmlopt import pipeline
from dmlopt.errors import InputError
from tests.conftest import one_error_line


def declared(path, dims, dtype=TensorProto.FLOAT):
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", dtype, dims)],
                          [helper.make_tensor_value_info("y", dtype, dims)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


HUGE = [[0, 2**62], [2**61, 0], [0, 2**40, 2**30], [3, 0, 2**62 - 1], [2**40], [1, 2**31]]


@pytest.mark.parametrize("dims", HUGE, ids=[str(d) for d in HUGE])
def test_a_declared_shape_that_cannot_be_made_is_exit_2_naming_the_input(cli, tmp_path, dims, monkeypatch):
    m = declared(tmp_path / "m.onnx", dims)
    out = tmp_path / "o.onnx"
    ran = []
    monkeypatch.setattr(pipeline, "PassContext", lambda *a, **k: ran.append(1) or pytest.fail("a pass ran"))
    for args in (("validate", m, m), ("optimize", m, "-o", out, "--no-time"), ("bench", m, "--runs", "1")):
        r = cli(*args)
        line = one_error_line(r.err)
        assert r.code == 2 and "input 'x'" in line, (args, line)
    assert not out.exists() and not ran
    with pytest.raises(InputError, match="input 'x'"):
        dmlopt.optimize(str(m))
