"""Tiny random-weight Swin and DETR from Hugging Face transformers, for the DirectML placement corpus.

Why: real architectures' exports (Swin's window shifting and its shape arithmetic with a dynamic
batch; DETR's ResNet backbone, encoder/decoder and heads) checked against the real DirectML EP
(tests/test_placement_measured.py), small enough to commit.  Needs `pip install transformers`
(not a dependency of dmlopt).  TorchScript exporter, opset 17, IR 8.

    python -m models.hf_tiny OUT_DIR        # swin_tiny.onnx, swin_tiny_dynamic.onnx, detr_tiny.onnx
"""

from __future__ import annotations

import pathlib
import sys
import warnings


def _export(module, example, path, dynamic_batch: bool, outputs: list[str]) -> pathlib.Path:
    import onnx
    import torch

    axes = {"x": {0: "batch"}, **{o: {0: "batch"} for o in outputs}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=outputs, dynamic_axes=axes)
    model = onnx.load(path)
    model.ir_version = min(model.ir_version, 8)  # loadable by ORT 1.17 (IR <= 9)
    onnx.save(model, path)
    return pathlib.Path(path)


def export_swin_tiny(path, *, dynamic_batch: bool = False, seed: int = 0) -> pathlib.Path:
    """SwinModel: 64x64 input, patch 4, embed 32, depths [2, 2], heads [2, 4], window 4; last_hidden_state."""
    import torch
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(seed)
    swin = SwinModel(SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                window_size=4)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.swin = swin

        def forward(self, x):
            return self.swin(pixel_values=x).last_hidden_state

    return _export(Hidden(), torch.randn(1, 3, 64, 64), path, dynamic_batch, ["y"])


def export_detr_tiny(path, *, seed: int = 0) -> pathlib.Path:
    """DetrForObjectDetection with a 4-stage ResNet backbone (16-128 channels), d_model 32, one encoder and one
    decoder layer, 10 queries; 64x64 input; outputs logits and boxes."""
    import torch
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(seed)
    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            out_features=["stage4"])
    config = DetrConfig(use_timm_backbone=False, backbone_config=backbone, d_model=32, encoder_layers=1,
                        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, num_queries=10, use_pretrained_backbone=False)
    detr = DetrForObjectDetection(config).eval()

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.detr = detr

        def forward(self, x):
            out = self.detr(pixel_values=x)
            return out.logits, out.pred_boxes

    return _export(Heads(), torch.randn(1, 3, 64, 64), path, False, ["logits", "boxes"])


if __name__ == "__main__":
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    export_swin_tiny(folder / "swin_tiny.onnx")
    export_swin_tiny(folder / "swin_tiny_dynamic.onnx", dynamic_batch=True)
    export_detr_tiny(folder / "detr_tiny.onnx")
