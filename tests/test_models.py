"""The model builders (models/) and the bundled models in dmlopt/data/ they regenerate."""

from __future__ import annotations

import collections
import json
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from models import build_bundled, cnn, sam_encoder, torch_cnn

DATA = build_bundled.DATA_DIR
SAM_FILES = ["sam_small.onnx", "sam_small_dynamic.onnx"]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def histogram(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(ops(model))


def run(model, feeds: dict) -> list[np.ndarray]:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def image(batch, size, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, 3, size, size), dtype=np.float32)


# ** CNN builders **

@pytest.mark.parametrize("activation", ["leaky_relu", "relu"])
def test_cnn_layers_and_shapes(activation):
    model = cnn.build_cnn(activation=activation, alpha=0.1, channels=8, height=20, width=12)
    onnx.checker.check_model(model, full_check=True)
    act = "LeakyRelu" if activation == "leaky_relu" else "Relu"
    assert ops(model) == ["Conv", act] * 6 + ["ConvTranspose"]
    assert model.opset_import[0].version == 17
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert dims(inferred.graph.output[0]) == [1, 3, 40, 24]
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            assert len(node.input) == 3 and attrs["pads"] == [1, 1, 1, 1] and attrs["kernel_shape"] == [3, 3]
        if node.op_type == "LeakyRelu":
            assert attrs["alpha"] == pytest.approx(0.1)
        if node.op_type == "ConvTranspose":
            assert attrs["strides"] == [2, 2] and attrs["kernel_shape"] == [4, 4]
    (y,) = run(model, {"input": image(1, 20)[:, :, :, :12]})
    assert y.shape == (1, 3, 40, 24)


def test_relu_twin_has_relu_and_same_structure():
    leaky = cnn.build_cnn(channels=8, height=16, width=16)
    relu = cnn.build_cnn_relu(channels=8, height=16, width=16)
    assert histogram(relu) == {"Conv": 6, "Relu": 6, "ConvTranspose": 1}
    assert histogram(leaky) == {"Conv": 6, "LeakyRelu": 6, "ConvTranspose": 1}
    assert [t.dims for t in leaky.graph.initializer] == [t.dims for t in relu.graph.initializer]


@pytest.mark.parametrize("activation,alpha", [("leaky_relu", 0.1), ("leaky_relu", 0.2), ("relu", 0.1)])
def test_cnn_computes_the_documented_network(activation, alpha):
    """ORT on the built graph == torch conv2d/leaky_relu/conv_transpose2d on its weights."""
    model = cnn.build_cnn(activation=activation, alpha=alpha, channels=8, height=24, width=24, seed=3)
    w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
    x = image(1, 24)
    ref = torch.from_numpy(x)
    for i in range(6):
        ref = F.conv2d(ref, w[f"conv{i}.weight"], w[f"conv{i}.bias"], padding=1)
        ref = F.leaky_relu(ref, alpha) if activation == "leaky_relu" else F.relu(ref)
    ref = F.conv_transpose2d(ref, w["upscale.weight"], w["upscale.bias"], stride=2, padding=1)
    (y,) = run(model, {"input": x})
    np.testing.assert_allclose(y, ref.numpy(), atol=1e-5, rtol=1e-4)
    assert 0.05 < float(y.std()) < 5.0  # He scaling keeps the output O(1)


def test_cnn_dynamic_batch_and_determinism():
    model = cnn.build_cnn(channels=8, height=16, width=16, dynamic_batch=True)
    assert dims(model.graph.input[0]) == ["batch", 3, 16, 16]
    assert dims(model.graph.output[0]) == ["batch", 3, 32, 32]
    (y,) = run(model, {"input": image(2, 16)})
    assert y.shape == (2, 3, 32, 32)
    again = cnn.build_cnn(channels=8, height=16, width=16, dynamic_batch=True)
    assert model.SerializeToString() == again.SerializeToString()
    other = cnn.build_cnn(channels=8, height=16, width=16, dynamic_batch=True, seed=1)
    assert not np.array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                              numpy_helper.to_array(other.graph.initializer[0]))
    props = {p.key: p.value for p in model.metadata_props}
    assert props["builder"] == "models.cnn.build_cnn"
    assert json.loads(props["args"])["dynamic_batch"] is True


def test_cnn_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation"):
        cnn.build_cnn(activation="gelu")


# ** torch CNN **

def test_torch_cnn_export(tmp_path):
    path = torch_cnn.export_torch_cnn(tmp_path / "t.onnx", channels=8, height=16, width=16, dynamic_batch=True)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert ops(model) == ["Conv", "LeakyRelu"] * 3 + ["Conv", "PRelu", "ConvTranspose", "LeakyRelu"]
    alphas = [onnx.helper.get_attribute_value(n.attribute[0]) for n in model.graph.node if n.op_type == "LeakyRelu"]
    assert alphas == pytest.approx([0.2, 0.01, 0.1, 0.2])
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert [len(n.input) for n in convs] == [3, 3, 2, 3]  # the third Conv has no bias
    prelu = next(n for n in model.graph.node if n.op_type == "PRelu")
    slope = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == prelu.input[1]))
    assert slope.size == 1
    x = image(2, 16)
    (y,) = run(path, {"input": x})
    with torch.no_grad():
        ref = torch_cnn.build_torch_cnn(channels=8)(torch.from_numpy(x)).numpy()
    assert y.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(y, ref, atol=1e-5, rtol=1e-4)


# ** small SAM encoder **

@pytest.fixture(scope="module")
def fresh_sam(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The two SAM files, rebuilt exactly as build_bundled does."""
    out = tmp_path_factory.mktemp("sam")
    return {p.name: p for p in build_bundled.build_all(out, names=SAM_FILES)}


@pytest.fixture(scope="module")
def sam_module():
    return sam_encoder.build_small(seed=0)


def test_sam_small_has_the_sam_structure(fresh_sam):
    model = onnx.load(fresh_sam["sam_small.onnx"])
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    h = histogram(model)
    config = sam_encoder.SMALL
    assert h["Einsum"] == 2 * config.depth  # rel-pos h and w terms in every block
    equations = {onnx.helper.get_attribute_value(n.attribute[0]).decode()
                 for n in model.graph.node if n.op_type == "Einsum"}
    assert equations == {"bhwc,hkc->bhwk", "bhwc,wkc->bhwk"}
    windowed = config.depth - len(config.global_attn_indexes)
    assert h["Pad"] == windowed  # 8x8 tokens padded to 10x10 for window 5
    assert h["Softmax"] == config.depth and h["LayerNormalization"] == 2 * config.depth
    assert h["Transpose"] >= 3 * config.depth and h["Reshape"] >= 5 * config.depth
    assert h["Shape"] > 0  # the TorchScript exporter's shape arithmetic is kept, as in real exports
    assert dims(model.graph.input[0]) == [1, 3, 64, 64]


def test_sam_small_matches_torch(fresh_sam, sam_module):
    x = image(1, 64, seed=5)
    (y,) = run(fresh_sam["sam_small.onnx"], {"image": x})
    with torch.no_grad():
        ref = sam_module(torch.from_numpy(x)).numpy()
    assert y.shape == (1, 32, 8, 8)
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)


def test_sam_rel_pos_weights_are_not_trivial(sam_module):
    """Zero rel-pos tables (SAM's init) would make a broken Einsum rewrite invisible."""
    with torch.no_grad():
        for blk in sam_module.blocks:
            assert float(blk.attn.rel_pos_h.abs().min()) > 0 and float(blk.attn.rel_pos_w.std()) > 0.1
        assert float(sam_module.pos_embed.std()) > 0.05


def test_sam_small_dynamic_runs_at_batch_2(fresh_sam, sam_module):
    model = onnx.load(fresh_sam["sam_small_dynamic.onnx"])
    assert dims(model.graph.input[0]) == ["batch", 3, 64, 64]
    assert dims(model.graph.output[0])[0] == "batch"
    x = image(2, 64, seed=6)
    (y,) = run(model, {"image": x})
    with torch.no_grad():
        ref = sam_module(torch.from_numpy(x)).numpy()
    assert y.shape == (2, 32, 8, 8)
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # torch dynamo export: 10 s
def test_sam_dynamo_export_runs(tmp_path, sam_module):
    path = sam_encoder.export_dynamo(tmp_path / "dynamo.onnx", dynamic_batch=True)
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert dims(model.graph.input[0])[0] == "batch"
    assert histogram(model)["Einsum"] == 2 * sam_encoder.SMALL.depth
    assert {o.version for o in model.opset_import if o.domain == ""} == {sam_encoder.DYNAMO_OPSET}
    x = image(2, 64, seed=7)
    (y,) = run(path, {"image": x})
    with torch.no_grad():
        ref = sam_module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, ref, atol=1e-4, rtol=1e-4)


# ** bundled files == what the builders make now **

@pytest.mark.parametrize("name", ["cnn_leaky.onnx", "cnn_relu.onnx"])
def test_bundled_cnn_is_byte_identical_to_a_rebuild(tmp_path, name):
    (fresh,) = build_bundled.build_all(tmp_path, names=[name])
    assert (DATA / name).read_bytes() == fresh.read_bytes()
    shipped = onnx.load(DATA / name)
    assert {p.key: p.value for p in shipped.metadata_props}["builder"] == "models.cnn.build_cnn"
    assert sum(numpy_helper.to_array(t).nbytes for t in shipped.graph.initializer) < 200_000


@pytest.mark.parametrize("name", SAM_FILES)
def test_bundled_sam_matches_a_rebuild(fresh_sam, name):
    shipped, fresh = onnx.load(DATA / name), onnx.load(fresh_sam[name])
    assert histogram(shipped) == histogram(fresh)
    assert ops(shipped) == ops(fresh)
    fresh_weights = {t.name: numpy_helper.to_array(t) for t in fresh.graph.initializer}
    for t in shipped.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t), fresh_weights.pop(t.name))
    assert not fresh_weights
    assert build_bundled.graph_differences(shipped, fresh) == []
    x = image(1, 64, seed=8)
    np.testing.assert_array_equal(run(shipped, {"image": x})[0], run(fresh, {"image": x})[0])
    props = {p.key: p.value for p in shipped.metadata_props}
    assert props["builder"] == "models.sam_encoder.export_small"
    assert json.loads(props["args"])["dynamic_batch"] is (name == "sam_small_dynamic.onnx")


def test_graph_differences_sees_a_changed_weight():
    a = cnn.build_cnn(channels=4, height=8, width=8)
    b = cnn.build_cnn(channels=4, height=8, width=8, seed=1)
    assert build_bundled.graph_differences(a, a) == []
    assert any("initializers differ" in d for d in build_bundled.graph_differences(a, b))


# ** full-size recipe (tiny custom variant; real ViT-B below) **

TINY = sam_encoder.EncoderConfig(embed_dim=32, depth=2, num_heads=2, global_attn_indexes=(1,),
                                 img_size=64, patch_size=16, window_size=3, out_chans=16)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A SAM-style checkpoint (image_encoder.* plus decoder keys) of the tiny config."""
    encoder = sam_encoder.build_small(seed=2, config=TINY)
    state = {f"image_encoder.{k}": v for k, v in encoder.state_dict().items()}
    state["mask_decoder.iou_token.weight"] = torch.zeros(1, 4)
    path = tmp_path_factory.mktemp("ckpt") / "sam_tiny.pth"
    torch.save(state, path)
    return path, encoder


def test_export_full_recipe_on_a_tiny_variant(tmp_path, tiny_checkpoint):
    ckpt, encoder = tiny_checkpoint
    dest = sam_encoder.export_full(ckpt, TINY, tmp_path / "tiny.onnx", dynamic_batch=True)
    model = onnx.load(dest)
    assert histogram(model)["Einsum"] == 2 * TINY.depth
    assert dims(model.graph.input[0]) == ["batch", 3, 64, 64]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["builder"] == "models.sam_encoder.export_full"
    assert json.loads(props["args"])["checkpoint"] == "sam_tiny.pth"
    x = image(2, 64, seed=9)
    with torch.no_grad():
        ref = encoder(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(dest, {"image": x})[0], ref, atol=1e-4, rtol=1e-4)


def test_export_full_external_data(tmp_path, tiny_checkpoint):
    ckpt, encoder = tiny_checkpoint
    dest = sam_encoder.export_full(ckpt, TINY, tmp_path / "tiny.onnx", external_data=True)
    data = tmp_path / "tiny.onnx.data"
    assert data.is_file() and data.stat().st_size > dest.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx", "tiny.onnx.data"]  # temp files gone
    x = image(1, 64, seed=10)
    with torch.no_grad():
        ref = encoder(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(run(dest, {"image": x})[0], ref, atol=1e-4, rtol=1e-4)


def test_cli_exports_and_reports_errors(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    ckpt, _ = tiny_checkpoint
    monkeypatch.setitem(sam_encoder.VARIANTS, "vit_b", TINY)
    out = tmp_path / "out.onnx"
    assert sam_encoder.main(["--checkpoint", str(ckpt), "--variant", "vit_b", "-o", str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert onnx.load(out).graph.input[0].name == "image"
    # A checkpoint of another size: one line naming the mismatch, exit code 2.
    assert sam_encoder.main(["--checkpoint", str(ckpt), "--variant", "vit_l", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint does not match vit_l") and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as missing:
        sam_encoder.main(["--checkpoint", str(tmp_path / "nope.pth"), "--variant", "vit_b", "-o", str(out)])
    assert missing.value.code == 2 and "no such file" in capsys.readouterr().err
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    assert sam_encoder.main(["--checkpoint", str(garbage), "--variant", "vit_b", "-o", str(out)]) == 2
    assert "not a readable torch checkpoint" in capsys.readouterr().err


def test_load_encoder_state_dict_forms():
    w = torch.zeros(2)
    assert sam_encoder.load_encoder_state_dict({"image_encoder.a": w, "prompt_encoder.b": w}) == {"a": w}
    assert set(sam_encoder.load_encoder_state_dict({"model": {"patch_embed.proj.weight": w}})) == {"patch_embed.proj.weight"}
    with pytest.raises(sam_encoder.CheckpointError, match="no image_encoder"):
        sam_encoder.load_encoder_state_dict({"mask_decoder.x": w})


def test_variant_table_matches_segment_anything_build_sam(monkeypatch):
    """Our VARIANTS == the ImageEncoderViT arguments of segment_anything's build_sam_vit_*."""
    sam_encoder.image_encoder_module()
    import segment_anything.build_sam as build_sam

    class Captured(Exception):
        pass

    def capture(**kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(build_sam, "ImageEncoderViT", capture)
    for name, config in sam_encoder.VARIANTS.items():
        with pytest.raises(Captured) as got:
            build_sam.sam_model_registry[name]()
        kwargs = got.value.args[0]
        assert kwargs["norm_layer"].keywords == {"eps": 1e-6} and kwargs["use_rel_pos"] is True
        assert (kwargs["embed_dim"], kwargs["depth"], kwargs["num_heads"], tuple(kwargs["global_attn_indexes"]),
                kwargs["img_size"], kwargs["patch_size"], kwargs["window_size"], kwargs["out_chans"],
                kwargs["mlp_ratio"]) == (config.embed_dim, config.depth, config.num_heads,
                                         config.global_attn_indexes, config.img_size, config.patch_size,
                                         config.window_size, config.out_chans, config.mlp_ratio)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DMLOPT_SLOW") != "1", reason="ViT-B export: ~40 s, ~9 GB RAM; set DMLOPT_SLOW=1")
def test_export_full_vit_b_random_weights(tmp_path):
    encoder = sam_encoder.VARIANTS["vit_b"].build()
    state = {f"image_encoder.{k}": v for k, v in encoder.state_dict().items()}
    dest = sam_encoder.export_full(state, "vit_b", tmp_path / "vit_b.onnx")
    model = onnx.load(dest, load_external_data=False)
    assert dims(model.graph.input[0]) == [1, 3, 1024, 1024]
    assert histogram(model)["Einsum"] == 24 and histogram(model)["Pad"] == 8
    assert not (tmp_path / "vit_b.onnx.data").exists()
