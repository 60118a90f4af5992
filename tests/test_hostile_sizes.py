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
from dmlopt.engine import pipeline
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


def _bomb(path, shape=(100_000_000,), name="x", dtype="float32"):
    """A small .npz whose one member inflates to shape x dtype of zeros (400 MB by default)."""
    import io
    import zipfile

    import numpy as np
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                  "shape": tuple(shape)})
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(f"{name}.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            chunk = bytes(1 << 24)
            for start in range(0, nbytes, len(chunk)):
                member.write(chunk[: min(len(chunk), nbytes - start)])
    return path


@pytest.mark.parametrize("shape,dtype", [((100_000_000,), "float32"), ((2, 3, 1), "float32"), ((2, 3), "float64"),
                                         ((3, 2), "float32")])
def test_an_inputs_member_that_does_not_fit_the_model_is_refused_unread(cli, tmp_path, monkeypatch, shape, dtype):
    import numpy as np
    m = declared(tmp_path / "m.onnx", [2, 3])
    npz = _bomb(tmp_path / "in.npz", shape, dtype=dtype)
    read = []
    real_read = np.lib.format.read_array
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: read.append(1) or real_read(*a, **k))
    for args in (("validate", m, m, "--inputs", npz), ("optimize", m, "-o", tmp_path / "o.onnx", "--inputs", npz)):
        r = cli(*args)
        line = one_error_line(r.err)
        assert r.code == 2 and "array 'x'" in line and "input 'x'" in line, line
    assert not read, "a member's data was decompressed"
    assert not (tmp_path / "o.onnx").exists()


def test_members_that_are_not_inputs_are_never_decompressed(cli, tmp_path, monkeypatch):
    import zipfile

    import numpy as np
    m = declared(tmp_path / "m.onnx", [2, 3])
    npz = _bomb(tmp_path / "in.npz", name="reference_output")
    with zipfile.ZipFile(npz, "a") as z:
        with z.open("x.npy", "w") as member:
            np.lib.format.write_array(member, np.ones((2, 3), np.float32))
    read = []
    real_read = np.lib.format.read_array
    monkeypatch.setattr(np.lib.format, "read_array", lambda *a, **k: read.append(1) or real_read(*a, **k))
    r = cli("validate", m, m, "--inputs", npz)
    assert r.code == 0, r.err
    assert len(read) == 1  # x only
