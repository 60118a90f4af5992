"""dmlopt.load / dmlopt.save: every input kind, clear errors, atomic writes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import dmlopt
from dmlopt.errors import InputError, OutputError
from tests.conftest import conv_leaky_model


def test_load_accepts_path_proto_and_ir(model_path):
    from_path = dmlopt.load(model_path)
    from_proto = dmlopt.load(onnx.load(model_path))
    already = dmlopt.load(from_path)
    assert already is from_path
    assert [n.op_type for n in from_path.graph] == [n.op_type for n in from_proto.graph] == ["Conv", "LeakyRelu", "Identity"]


@pytest.mark.parametrize("content, message", [
    (b"", "empty file"),
    (b"this is not an onnx model at all \x00\xff" * 10, "not a readable ONNX model"),
])
def test_load_rejects_non_onnx(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message):
        dmlopt.load(path)


def test_load_rejects_truncated(tmp_path, model_path):
    data = model_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError):
        dmlopt.load(path)


def test_load_rejects_missing_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        dmlopt.load(tmp_path / "missing.onnx")
    with pytest.raises(InputError, match="is a directory"):
        dmlopt.load(tmp_path)


def test_load_rejects_missing_external_data(tmp_path):
    model = conv_leaky_model()
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    dmlopt.load(path)  # loads while the data is there
    os.remove(tmp_path / "ext.data")
    with pytest.raises(InputError, match="external data file 'ext.data'.*missing"):
        dmlopt.load(path)


def test_load_rejects_short_external_data(tmp_path):
    path = tmp_path / "ext.onnx"
    onnx.save(conv_leaky_model(), path, save_as_external_data=True, location="ext.data", size_threshold=0)
    data = (tmp_path / "ext.data").read_bytes()
    (tmp_path / "ext.data").write_bytes(data[:10])
    with pytest.raises(InputError, match="too short"):
        dmlopt.load(path)


def test_save_round_trip_and_external_data(tmp_path, model_path):
    model = dmlopt.load(model_path)
    out = dmlopt.save(model, tmp_path / "plain.onnx")
    assert onnx.load(out).graph.node[0].op_type == "Conv"
    dmlopt.save(model, tmp_path / "ext.onnx", external_data=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    reloaded = dmlopt.load(tmp_path / "ext.onnx")
    np.testing.assert_array_equal(reloaded.graph.initializers["W"].const_value.numpy(),
                                  model.graph.initializers["W"].const_value.numpy())
    # no temporary files left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data", "model.onnx", "plain.onnx"]


def test_save_refuses_input_and_bad_folders(tmp_path, model_path):
    model = dmlopt.load(model_path)
    before = model_path.read_bytes()
    with pytest.raises(OutputError, match="overwrite the input"):
        dmlopt.save(model, model_path, protect=(model_path,))
    assert model_path.read_bytes() == before
    with pytest.raises(OutputError, match="does not exist"):
        dmlopt.save(model, tmp_path / "nope" / "out.onnx")
    with pytest.raises(OutputError, match="is a directory"):
        dmlopt.save(model, tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; the CLI test checks the message path")
def test_save_refuses_unwritable_folder(tmp_path, model_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(OutputError, match="not writable"):
        dmlopt.save(dmlopt.load(model_path), ro / "out.onnx")


def test_save_failure_leaves_no_partial_file(tmp_path, model_path, monkeypatch):
    model = dmlopt.load(model_path)

    def boom(model, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"partial")  # the disk filled up part way through
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ir, "save", boom)
    monkeypatch.setattr(dmlopt.io.model, "save_inline", boom)  # the writer of single-file .onnx outputs
    with pytest.raises(OutputError, match="No space left"):
        dmlopt.save(model, tmp_path / "out.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_save_leaves_out_intermediate_shapes_but_keeps_the_callers(tmp_path):
    """ORT infers intermediate shapes at session creation; stored ones only slow loading."""
    result = dmlopt.optimize(conv_leaky_model(batch=1), passes=["cleanup"], retime=False)
    conv_out = next(iter(result.model.graph)).outputs[0]
    assert conv_out.shape is not None  # shape inference filled it in memory
    dmlopt.save(result.model, tmp_path / "lean.onnx")
    dmlopt.save(result.model, tmp_path / "full.onnx", value_info=True)
    lean, full = onnx.load(tmp_path / "lean.onnx"), onnx.load(tmp_path / "full.onnx")
    assert conv_out.name in {v.name for v in full.graph.value_info}
    assert conv_out.name not in {v.name for v in lean.graph.value_info}
    assert [i.name for i in lean.graph.input] == ["x"] and lean.graph.output[0].type == full.graph.output[0].type
    assert conv_out.shape is not None  # the caller's model is unchanged
    assert dmlopt.validate(tmp_path / "full.onnx", tmp_path / "lean.onnx").passed
