"""A tiny ViT classifier exported with the TorchScript exporter, for the DirectML placement corpus.

Why: the placement tests need a real transformer export (LayerNormalization, MatMul, Softmax, Erf GELU,
the exporter's Shape/Gather/Concat arithmetic when the batch is dynamic), small enough to commit.
torch.nn.TransformerEncoder (pre-norm, GELU), patch 8, 32x32 images, embed 64, 2 layers, 4 heads.

    python -m models.vit_tiny out.onnx [--dynamic-batch]
"""

from __future__ import annotations

import argparse
import pathlib
import warnings


def build_vit_tiny(dim: int = 64, depth: int = 2, heads: int = 4, patch: int = 8, img: int = 32, classes: int = 10,
                   seed: int = 0):
    import torch

    class ViT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = torch.nn.Conv2d(3, dim, patch, patch)
            self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
            self.pos = torch.nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, dim))
            layer = torch.nn.TransformerEncoderLayer(dim, heads, dim * 4, activation="gelu", batch_first=True,
                                                     norm_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.head = torch.nn.Linear(dim, classes)

        def forward(self, x):
            t = self.patch(x).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], 1) + self.pos
            return self.head(self.enc(t)[:, 0])

    torch.manual_seed(seed)
    return ViT().eval()


def export_vit_tiny(path, *, dynamic_batch: bool = False, seed: int = 0) -> pathlib.Path:
    """Export (opset 17, IR 8); with grad enabled, so the exporter sees the layers, not the fused fast path."""
    import onnx
    import torch

    module = build_vit_tiny(seed=seed)
    x = torch.randn(1, 3, 32, 32)
    axes = {"x": {0: "batch"}, "y": {0: "batch"}} if dynamic_batch else None
    dest = pathlib.Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(dest), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"], dynamic_axes=axes)
    model = onnx.load(dest)
    model.ir_version = min(model.ir_version, 8)  # loadable by ORT 1.17 (IR <= 9)
    onnx.save(model, dest)
    return dest


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--dynamic-batch", action="store_true")
    args = ap.parse_args()
    export_vit_tiny(args.output, dynamic_batch=args.dynamic_batch)
