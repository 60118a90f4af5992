"""The 7-layer super-resolution CNN of the public DirectML report, and its Relu twin.

DirectML issue #138 ("Failed fuse leaky relu with convolution on RTX 3090") describes a
small image CNN whose Conv+LeakyRelu pairs do not fuse under vendor metacommands while
Conv+Relu pairs do.  `build_cnn` rebuilds that shape of network in plain ONNX:

    input [N,3,H,W]
      -> 6 x ( Conv 3x3, pads 1, with bias  ->  LeakyRelu(alpha) | Relu )
      -> ConvTranspose, kernel 4, stride 2, pads 1      (C -> 3 channels)
      -> output [N,3,2H,2W]

The last layer uses kernel 4 with pads 1 because then (H-1)*2 - 2*1 + 4 = 2H holds for every
H with no output_padding; a kernel-3 layer would need pads 1 plus output_padding 1, an
attribute some converters and providers handle less well.

Weights are seeded and He-scaled (std = sqrt(2 / ((1 + alpha^2) * fan_in))) so activations
stay O(1) through all seven layers: numerical comparisons then test real values, neither
blown up nor vanishing.  Only onnx and numpy are used, so the result is byte-identical from
run to run.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
CONV_LAYERS = 6
INPUT_CHANNELS = 3
OUTPUT_CHANNELS = 3
UPSCALE_KERNEL = 4  # with stride 2 and pads 1 this doubles H and W exactly


def build_cnn(activation: str = "leaky_relu", alpha: float = 0.1, channels: int = 32,
              height: int = 256, width: int = 256, batch: int = 1,
              dynamic_batch: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Six Conv+activation layers and a stride-2 ConvTranspose; output is 2x the input size."""
    if activation not in ("leaky_relu", "relu"):
        raise ValueError(f"activation must be 'leaky_relu' or 'relu', not {activation!r}")
    if channels < 1 or height < 1 or width < 1 or batch < 1:
        raise ValueError("channels, height, width and batch must be positive")
    rng = np.random.default_rng(seed)
    gain_alpha = alpha if activation == "leaky_relu" else 0.0
    nodes, initializers = [], []
    x = "input"
    in_ch = INPUT_CHANNELS
    for i in range(CONV_LAYERS):
        w, b = _conv_weights(rng, channels, in_ch, gain_alpha)
        initializers += [numpy_helper.from_array(w, f"conv{i}.weight"),
                         numpy_helper.from_array(b, f"conv{i}.bias")]
        conv_out, act_out = f"conv{i}", f"act{i}"
        nodes.append(helper.make_node("Conv", [x, f"conv{i}.weight", f"conv{i}.bias"], [conv_out],
                                      name=f"conv{i}", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        if activation == "leaky_relu":
            nodes.append(helper.make_node("LeakyRelu", [conv_out], [act_out], name=f"leaky{i}", alpha=alpha))
        else:
            nodes.append(helper.make_node("Relu", [conv_out], [act_out], name=f"relu{i}"))
        x, in_ch = act_out, channels
    w, b = _upscale_weights(rng, in_ch)
    initializers += [numpy_helper.from_array(w, "upscale.weight"), numpy_helper.from_array(b, "upscale.bias")]
    nodes.append(helper.make_node("ConvTranspose", [x, "upscale.weight", "upscale.bias"], ["output"],
                                  name="upscale", kernel_shape=[UPSCALE_KERNEL] * 2, strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    n = "batch" if dynamic_batch else batch
    graph = helper.make_graph(
        nodes, f"cnn_{activation}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [n, INPUT_CHANNELS, height, width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [n, OUTPUT_CHANNELS, 2 * height, 2 * width])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="dmlopt.models", producer_version="1")
    model.ir_version = 8  # opset 17 needs IR 8; keeps the file loadable by ORT >= 1.14
    args = dict(activation=activation, alpha=alpha, channels=channels, height=height, width=width,
                batch=batch, dynamic_batch=dynamic_batch, seed=seed)
    helper.set_model_props(model, {"builder": "models.cnn.build_cnn", "args": json.dumps(args, sort_keys=True)})
    onnx.checker.check_model(model)
    return model


def build_cnn_relu(**kwargs) -> onnx.ModelProto:
    """The Relu twin of `build_cnn`: same layers, Relu instead of LeakyRelu (this one fuses)."""
    kwargs.pop("activation", None)
    return build_cnn(activation="relu", **kwargs)


def _conv_weights(rng, out_ch, in_ch, alpha):
    """He initialisation for a 3x3 Conv followed by LeakyRelu(alpha)."""
    fan_in = in_ch * 9
    std = np.sqrt(2.0 / ((1.0 + alpha * alpha) * fan_in))
    w = (rng.standard_normal((out_ch, in_ch, 3, 3)) * std).astype(np.float32)
    b = (rng.standard_normal(out_ch) * 0.05).astype(np.float32)
    return w, b


def _upscale_weights(rng, in_ch):
    """Stride-2 kernel-4 ConvTranspose: each output pixel sums in_ch * (4/2)^2 products."""
    fan_in = in_ch * (UPSCALE_KERNEL // 2) ** 2
    w = (rng.standard_normal((in_ch, OUTPUT_CHANNELS, UPSCALE_KERNEL, UPSCALE_KERNEL))
         * np.sqrt(1.0 / fan_in)).astype(np.float32)
    b = (rng.standard_normal(OUTPUT_CHANNELS) * 0.05).astype(np.float32)
    return w, b
