"""A small torch CNN exported by torch's TorchScript exporter, for the LeakyRelu pass tests.

Hand-built ONNX (models/cnn.py) has one alpha and one layout; a torch export is what users
bring.  This network mixes the cases a LeakyRelu rewrite must handle:

    input [N,3,H,W]
      -> Conv 3x3 (bias)       -> LeakyRelu(0.2)
      -> Conv 3x3 (bias)       -> LeakyRelu(0.01)     torch's default slope
      -> Conv 3x3 (no bias)    -> LeakyRelu(0.1)
      -> Conv 3x3 (bias)       -> PRelu(one slope)    PRelu with a single learned slope
      -> ConvTranspose k4 s2 p1 -> LeakyRelu(0.2)     activation after a ConvTranspose
      -> output [N,3,2H,2W]
"""

from __future__ import annotations

import io
import json
import pathlib
import warnings

import numpy as np
import onnx

OPSET = 17
ALPHAS = (0.2, 0.01, 0.1)


def build_torch_cnn(*, channels: int = 16, seed: int = 0):
    """The torch module (eval mode) with seeded weights."""
    import torch
    from torch import nn

    layers = []
    in_ch = 3
    for i, alpha in enumerate(ALPHAS):
        layers += [nn.Conv2d(in_ch, channels, 3, padding=1, bias=(i != 2)), nn.LeakyReLU(alpha)]
        in_ch = channels
    layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.PReLU(num_parameters=1),
               nn.ConvTranspose2d(channels, 3, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
    module = nn.Sequential(*layers).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for layer in module:
            if isinstance(layer, nn.PReLU):
                layer.weight.fill_(0.15)
            elif isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
                w = layer.weight  # Conv: (out, in, k, k); ConvTranspose: (in, out, k, k)
                # He scale by the number of products summed into one output value.
                fan_in = w.shape[1] * 9 if isinstance(layer, nn.Conv2d) else w.shape[0] * 4
                w.copy_(_normal(rng, w.shape, np.sqrt(2.0 / fan_in)))
                if layer.bias is not None:
                    layer.bias.copy_(_normal(rng, layer.bias.shape, 0.05))
    return module


def export_torch_cnn(path, *, channels: int = 16, height: int = 32, width: int = 32,
                     dynamic_batch: bool = False, seed: int = 0) -> pathlib.Path:
    """Export with the legacy exporter (`dynamo=False`), opset 17; returns the path."""
    import torch

    module = build_torch_cnn(channels=channels, seed=seed)
    example = torch.zeros(1, 3, height, width)
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["output"], dynamic_axes=axes)
    proto = onnx.load_from_string(buffer.getvalue())
    args = dict(channels=channels, height=height, width=width, dynamic_batch=dynamic_batch, seed=seed)
    onnx.helper.set_model_props(proto, {"builder": "models.torch_cnn.export_torch_cnn",
                                        "args": json.dumps(args, sort_keys=True), "torch": torch.__version__})
    dest = pathlib.Path(path)
    onnx.save(proto, dest)
    return dest


def _normal(rng, shape, std):
    import torch

    return torch.from_numpy((rng.standard_normal(tuple(shape)) * std).astype(np.float32))
