"""Models with dynamic spatial dims, as exported vision models have them (issue 22, item 1):
a U-Net with skip connections, a super-resolution CNN and a 16x16 patch-embedding ViT."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dmlopt.runtime import ort_model


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


def segformer(seed: int = 0, stages: int = 2) -> onnx.ModelProto:
    """A Segformer-like encoder (issue 31): per stage an overlapping patch Conv (stride 4, then 2)
    and efficient self-attention whose keys come from a spatial-reduction Conv (stride 8, then 4):
    the attention output is at the queries' stride.  Total stride 4*2 along a path = 8 (lcm with
    the reductions: 32)."""
    rng = np.random.default_rng(seed)
    c = 8
    inits = [numpy_helper.from_array(np.array([0, c, -1], np.int64), "flat")]
    nodes = []
    x = "image"
    for stage, (patch, reduce) in enumerate([(4, 8), (2, 4)][:stages]):
        cin = 3 if stage == 0 else c
        inits += [_w(rng, f"p{stage}", c, cin, patch, patch), _w(rng, f"r{stage}", c, c, reduce, reduce)]
        f, q, k, s, o = (f"{n}{stage}" for n in ("f", "q", "k", "s", "o"))
        nodes += [helper.make_node("Conv", [x, f"p{stage}"], [f], strides=[patch, patch]),
                  helper.make_node("Shape", [f], [f"shape{stage}"]),
                  helper.make_node("Reshape", [f, "flat"], [f"{q}_cn"]),
                  helper.make_node("Transpose", [f"{q}_cn"], [q], perm=[0, 2, 1]),
                  helper.make_node("Conv", [f, f"r{stage}"], [f"{k}_img"], strides=[reduce, reduce]),
                  helper.make_node("Reshape", [f"{k}_img", "flat"], [k]),
                  helper.make_node("MatMul", [q, k], [f"{s}_raw"]),
                  helper.make_node("Softmax", [f"{s}_raw"], [s], axis=-1),
                  helper.make_node("Transpose", [k], [f"{k}_t"], perm=[0, 2, 1]),
                  helper.make_node("MatMul", [s, f"{k}_t"], [f"{o}_nc"]),
                  helper.make_node("Transpose", [f"{o}_nc"], [f"{o}_cn"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", [f"{o}_cn", f"shape{stage}"], [f"{o}_img"]),
                  helper.make_node("Add", [f"{o}_img", f], [o])]
        x = o
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    return _model(nodes, [image], [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)


def dpt_head(seed: int = 0) -> onnx.ModelProto:
    """Depth Anything's shape (issue 31): a patch-14 embedding, then a reassemble branch upsampled
    x4 and downsampled x2 (stride 14/4*2 = 7) and one downsampled x2 (28): total stride 28."""
    rng = np.random.default_rng(seed)
    c = 4
    inits = [_w(rng, "patch", c, 3, 14, 14), _w(rng, "up", c, c, 4, 4), _w(rng, "down", c, c, 3, 3),
             _w(rng, "down2", c, c, 3, 3)]
    nodes = [helper.make_node("Conv", ["image", "patch"], ["t"], strides=[14, 14]),
             helper.make_node("ConvTranspose", ["t", "up"], ["a"], strides=[4, 4]),
             helper.make_node("Conv", ["a", "down"], ["b"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["t", "down2"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["b"], ["gb"]),
             helper.make_node("GlobalAveragePool", ["c"], ["gc"]),
             helper.make_node("Add", ["gb", "gc"], ["depth"])]
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    return _model(nodes, [image], [helper.make_tensor_value_info("depth", TensorProto.FLOAT, None)], inits)
