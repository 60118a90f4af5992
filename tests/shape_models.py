"""Models with dynamic spatial dims, as exported vision models have them (issue 22, item 1):
a U-Net with skip connections, a super-resolution CNN and a 16x16 patch-embedding ViT."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlopt import ort_model


def _w(rng, name, *shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits, **meta) -> onnx.ModelProto:
    m = ort_model.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits), {"": 17})
    for k, v in meta.items():
        m.metadata_props.add(key=k, value=str(v))
    return m


def unet(seed: int = 0, input_name: str = "image") -> onnx.ModelProto:
    """Two MaxPool levels down, Resize up, Concat skips: needs H, W divisible by 4."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    c = 4

    def conv(x, cin, cout, name):
        inits.append(_w(rng, f"{name}_w", cout, cin, 3, 3))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], pads=[1, 1, 1, 1], name=name))
        nodes.append(helper.make_node("Relu", [f"{name}_c"], [name], name=f"{name}_relu"))
        return name

    e1 = conv(input_name, 3, c, "e1")
    nodes.append(helper.make_node("MaxPool", [e1], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
    e2 = conv("p1", c, c, "e2")
    nodes.append(helper.make_node("MaxPool", [e2], ["p2"], kernel_shape=[2, 2], strides=[2, 2]))
    b = conv("p2", c, c, "b")
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    for level, skip in (("u2", e2), ("u1", e1)):
        src = b if level == "u2" else "d2"
        nodes.append(helper.make_node("Resize", [src, "", "scales"], [f"{level}_up"], mode="nearest"))
        nodes.append(helper.make_node("Concat", [f"{level}_up", skip], [f"{level}_cat"], axis=1))
        conv(f"{level}_cat", 2 * c, c, "d2" if level == "u2" else "d1")
    inits.append(_w(rng, "head_w", 1, c, 1, 1))
    nodes.append(helper.make_node("Conv", ["d1", "head_w"], ["mask"]))
    image = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 3, "height", "width"])
    return _model(nodes, [image],
                  [helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, "height", "width"])], inits)


def super_resolution(seed: int = 0) -> onnx.ModelProto:
    """Convs of stride 1 and a DepthToSpace x2: any H, W (unnamed dims)."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "w1", 8, 3, 3, 3), _w(rng, "w2", 12, 8, 3, 3)]
    nodes = [helper.make_node("Conv", ["lr", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("DepthToSpace", ["c2"], ["hr"], blocksize=2, mode="CRD")]
    return _model(nodes, [helper.make_tensor_value_info("lr", TensorProto.FLOAT, [1, 3, None, None])],
                  [helper.make_tensor_value_info("hr", TensorProto.FLOAT, [1, 3, None, None])], inits)


def patch_vit(image: int = 64, patch: int = 16, dim: int = 8, seed: int = 0, **meta) -> onnx.ModelProto:
    """A 16x16 patch Conv, flattened to tokens plus a static position table of (image/patch)**2 rows."""
    rng = np.random.default_rng(seed)
    tokens = (image // patch) ** 2
    inits = [_w(rng, "patch_w", dim, 3, patch, patch), _w(rng, "pos", 1, tokens, dim),
             _w(rng, "proj", dim, dim),
             numpy_helper.from_array(np.array([0, dim, -1], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["pixels", "patch_w"], ["emb"], kernel_shape=[patch, patch],
                              strides=[patch, patch]),
             helper.make_node("Reshape", ["emb", "flat"], ["seq"]),
             helper.make_node("Transpose", ["seq"], ["tok"], perm=[0, 2, 1]),
             helper.make_node("Add", ["tok", "pos"], ["x"]),
             helper.make_node("MatMul", ["x", "proj"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", tokens, dim])], inits, **meta)


def token_model(seed: int = 0) -> onnx.ModelProto:
    """A sequence dim nothing sizes: tokens through a MatMul."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "w", 8, 8)]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])], inits)
