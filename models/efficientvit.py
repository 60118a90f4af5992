"""An EfficientViT-like classifier (MIT-Han-Lab's shape) exported with the TorchScript exporter, for
the DirectML placement corpus in float16.

Why: issue 31 found the float16 placement prediction wrong on a real EfficientViT (1 copy and 6
partitions predicted, 0 and 1 measured): its ReLU linear attention pads V with a float constant,
and ORT's CPU EP, which makes the level-1 graph the prediction reads, computes float16 ops it has
no float16 kernel for (Pad, HardSwish) in float32 between Casts that the DirectML EP never sees.
Conv-BN-Hardswish stem, an MBConv, LiteMLA (ReLU linear attention with a multi-scale depthwise
aggregation), a pooled head; seeded; 64x64 images.

    python -m models.efficientvit out.onnx [--dynamic]
"""

from __future__ import annotations

import argparse
import pathlib
import warnings


def build(seed: int = 0):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LiteMLA(nn.Module):
        def __init__(self, c, dim=8, eps=1e-15):
            super().__init__()
            self.dim, self.eps = dim, eps
            self.qkv = nn.Conv2d(c, 3 * c, 1, bias=False)
            self.aggreg = nn.Sequential(nn.Conv2d(3 * c, 3 * c, 5, padding=2, groups=3 * c, bias=False),
                                        nn.Conv2d(3 * c, 3 * c, 1, groups=3 * c // dim, bias=False))
            self.proj = nn.Sequential(nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c))
        def relu_linear_att(self, qkv):
            B, _, H, W = qkv.size()
            qkv = torch.reshape(qkv, (B, -1, 3 * self.dim, H * W))
            q, k, v = qkv[:, :, 0:self.dim], qkv[:, :, self.dim:2 * self.dim], qkv[:, :, 2 * self.dim:]
            q, k = F.relu(q), F.relu(k)
            trans_k = k.transpose(-1, -2)
            v = F.pad(v, (0, 0, 0, 1), mode="constant", value=1)
            vk = torch.matmul(v, trans_k)
            out = torch.matmul(vk, q)
            out = out[:, :, :-1] / (out[:, :, -1:] + self.eps)
            return torch.reshape(out, (B, -1, H, W))
        def forward(self, x):
            qkv = self.qkv(x)
            multi = [qkv, self.aggreg(qkv)]
            qkv = torch.cat(multi, dim=1)
            return x + self.proj(self.relu_linear_att(qkv))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
            self.mb = nn.Sequential(nn.Conv2d(16, 32, 1), nn.Hardswish(), nn.Conv2d(32, 32, 3, 2, 1, groups=32),
                                    nn.Hardswish(), nn.Conv2d(32, 16, 1), nn.BatchNorm2d(16))
            self.att = LiteMLA(16)
            self.head = nn.Sequential(nn.Conv2d(16, 32, 1), nn.Hardswish())
            self.fc = nn.Linear(32, 10)
        def forward(self, x):
            x = self.att(self.mb(self.stem(x)))
            x = self.head(x)
            x = F.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.fc(x)

    torch.manual_seed(seed)
    return Net().eval()


def export(path, *, dynamic: bool = False, seed: int = 0) -> pathlib.Path:
    """Export to `path` (opset 17; `dynamic`: batch and image size dynamic)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(build(seed), torch.randn(1, 3, 64, 64), str(path), opset_version=17, dynamo=False,
                          input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch", 2: "h", 3: "w"}} if dynamic else None)
    return pathlib.Path(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--dynamic", action="store_true")
    args = ap.parse_args(argv)
    export(args.output, dynamic=args.dynamic)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
