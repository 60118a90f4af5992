"""Windowed-attention encoders in SAM's block structure, at any size, for the window-layout tests.

Each block: ``x + attn(LN(x))`` then ``x + MLP(LN(x))``; a windowed block partitions
LN(x) into windows (zero Pad to a multiple of the window, Reshape, Transpose, Reshape) and
merges the attention output back (Reshape, Transpose, Reshape, crop), as
segment_anything's ``window_partition``/``window_unpartition`` export.  The attention is a
stand-in that mixes the tokens of a window (their mean, pads included, as attention sees
them), so a wrong value on a padded token shows in the output.  onnx + numpy only.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from models.onnx_builder import Graph

SPELLINGS = ("sam", "einops")
ACTIVATIONS = ("silu", "relu", "gelu-erf")
BETWEEN = ("none", "position", "token-mix", "output")


def partition(g: Graph, x, b, h, w, c, ws, spelling="sam"):
    """Pad to a multiple of ws and cut into windows; returns (windows, (Hp, Wp))."""
    hp, wp = -(-h // ws) * ws, -(-w // ws) * ws
    if (hp, wp) != (h, w):
        x = g("Pad", x, g.const([0, 0, 0, 0, 0, hp - h, wp - w, 0], np.int64))
    nh, nw = hp // ws, wp // ws
    if spelling == "sam":
        x = g("Reshape", x, g.const([b, nh, ws, nw, ws, c], np.int64))
        x = g("Transpose", x, perm=[0, 1, 3, 2, 4, 5])
        return g("Reshape", x, g.const([-1, ws, ws, c], np.int64)), (hp, wp)
    # einops 'b (nh wh) (nw ww) c -> (b nh nw) (wh ww) c' through a rank-5 view with b and nh merged
    x = g("Reshape", x, g.const([b * nh, ws, nw, ws, c], np.int64))
    x = g("Transpose", x, perm=[0, 2, 1, 3, 4])
    return g("Reshape", x, g.const([b * nh * nw, ws * ws, c], np.int64)), (hp, wp)


def unpartition(g: Graph, y, b, h, w, c, ws, padded, spelling="sam"):
    hp, wp = padded
    nh, nw = hp // ws, wp // ws
    if spelling == "sam":
        y = g("Reshape", y, g.const([b, nh, nw, ws, ws, c], np.int64))
        y = g("Transpose", y, perm=[0, 1, 3, 2, 4, 5])
    else:
        y = g("Reshape", y, g.const([b * nh, nw, ws, ws, c], np.int64))
        y = g("Transpose", y, perm=[0, 2, 1, 3, 4])
    y = g("Reshape", y, g.const([b, hp, wp, c], np.int64))
    if (hp, wp) != (h, w):
        y = g("Slice", y, g.const([0, 0], np.int64), g.const([h, w], np.int64), g.const([1, 2], np.int64))
    return y


def mix_tokens(g: Graph, x, c):
    """Attention stand-in: each token plus the mean of its window (axis 1), then a projection."""
    if g.opset >= 18:
        mean = g("ReduceMean", x, g.const([1], np.int64), keepdims=1)
    else:
        mean = g("ReduceMean", x, axes=[1], keepdims=1)
    return g("MatMul", g("Add", x, mean), g.weight(c, c))


def norm(g: Graph, x, c, decomposed=False):
    if not decomposed:
        return g("LayerNormalization", x, g.weight(c), g.weight(c), axis=-1)
    axes = {"axes": [-1]} if g.opset < 18 else {}
    extra = [g.const([-1], np.int64)] if g.opset >= 18 else []
    mean = g("ReduceMean", x, *extra, keepdims=1, **axes)  # LayerNorm as opset-11 exports write it
    d = g("Sub", x, mean)
    var = g("ReduceMean", g("Pow", d, g.const(2.0)), *extra, keepdims=1, **axes)
    return g("Add", g("Mul", g("Div", d, g("Sqrt", g("Add", var, g.const(1e-5)))), g.weight(c)), g.weight(c))


def mlp(g: Graph, x, c, decomposed_norm=False, activation="silu"):
    n = norm(g, x, c, decomposed_norm)
    hidden = g("Add", g("MatMul", n, g.weight(c, 2 * c)), g.weight(2 * c))
    if activation == "silu":
        act = g("Mul", hidden, g("Sigmoid", hidden))
    elif activation == "relu":
        act = g("Relu", hidden)
    else:  # SAM's GELU as the TorchScript exporter writes it
        act = g("Mul", g("Mul", hidden, g("Add", g("Erf", g("Div", hidden, g.const(1.4142135))), g.const(1.0))),
                g.const(0.5))
    return g("Add", x, g("Add", g("MatMul", act, g.weight(2 * c, c)), g.weight(c)))


def windowed_model(b=1, h=8, w=8, c=6, ws=5, blocks="ww", spelling="sam", opset=17, tail="transpose",
                   decomposed_norm=False, activation="silu", between="none", seed=0):
    """`blocks`: a letter a block, w windowed, g global (no partition); `ws`: the window size, or one
    per block.  `between` puts something
    after the first block: a position-dependent Add ("position"), an op that mixes tokens across
    windows ("token-mix"), or a second graph output ("output").  `tail`: "transpose" ends in
    SAM's neck layout (NCHW), "none" leaves the tokens as the output."""
    g = Graph(seed, opset)
    x = "x"
    extra_outputs = []
    sizes = list(ws) if isinstance(ws, (list, tuple)) else [ws] * len(blocks)
    for i, (kind, size) in enumerate(zip(blocks, sizes)):
        shortcut = x
        n = norm(g, x, c, decomposed_norm)
        if kind == "w":
            p, padded = partition(g, n, b, h, w, c, size, spelling)
            a = unpartition(g, mix_tokens(g, p, c), b, h, w, c, size, padded, spelling)
        else:
            a = g("Reshape", mix_tokens(g, g("Reshape", n, g.const([b, h * w, c], np.int64)), c),
                  g.const([b, h, w, c], np.int64))
        x = mlp(g, g("Add", shortcut, a), c, decomposed_norm, activation)
        if i == 0 and between == "position":
            x = g("Add", x, g.weight(1, h, w, c))
        elif i == 0 and between == "token-mix":
            x = g("Add", x, g("ReduceMean", x, axes=[1, 2], keepdims=1) if opset < 18 else
                  g("ReduceMean", x, g.const([1, 2], np.int64), keepdims=1))
        elif i == 0 and between == "output":
            extra_outputs.append(x)
    out_shape = [b, h, w, c]
    if tail == "transpose":  # SAM's neck reads NCHW
        x = g("Transpose", x, perm=[0, 3, 1, 2])
        out_shape = [b, c, h, w]
    model = g.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, h, w, c])], x, shape=out_shape)
    for name in extra_outputs:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [b, h, w, c]))
    return model
