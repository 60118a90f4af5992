"""prelu: PRelu with one slope value -> LeakyRelu, which DirectML fuses into Conv.

DirectML's op fusion takes single-input activations only; PRelu has two inputs (x, slope) so it
never fuses (dml-facts.md section 4).  A PRelu whose slope is one constant value is a LeakyRelu:
  1. PRelu(x, s) -> LeakyRelu(x; alpha=s)    s a constant whose entries are all equal, any shape
     that broadcasts to x without changing the output shape ([1], [C,1,1] filled with one value, ...)

Declined, with the reason: a slope that is computed or a graph input, slopes that differ, a
non-finite slope, an integer PRelu (LeakyRelu is float-only), a slope that is not exactly a
float32 (LeakyRelu's alpha attribute is float32, so a float64 model would change), and a slope
whose broadcast would change the output's shape (or cannot be shown not to).  Runs before
``leaky-relu`` (order 20 < 30) so the LeakyRelus it makes get that pass's strategy.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from dmlopt.passes._base import DmlPass, SiteRule, apply_rules
from dmlopt.passes._shared import FLOAT_TYPES, all_nodes


def broadcast_keeps_shape(x_shape: ir.Shape | None, slope_shape: tuple[int, ...]) -> bool:
    """Whether broadcasting a slope of `slope_shape` against x leaves x's shape as the output's."""
    if not slope_shape:  # a scalar never changes the shape
        return True
    if x_shape is None or len(slope_shape) > len(x_shape):
        return False
    # Each slope dim must be 1 or x's (known) size; a symbolic x dim could be 1 and grow.
    return all(s == 1 or s == d for s, d in zip(reversed(slope_shape), reversed(list(x_shape.dims))))


class PReluToLeakyRelu(SiteRule):
    """``PRelu(x, s) -> LeakyRelu(x; alpha=s)`` when every entry of the constant s is the same."""

    def pattern(self, op, x, slope):
        return op.PRelu(x, slope, _outputs=["y"])

    def check(self, context, x, slope, y, **_):
        node = y.producer()
        reason = _slope_reason(x, slope)
        return self.decline(node, reason) if reason else True

    def rewrite(self, op, x, slope, y, **_):
        alpha = float(slope.const_value.numpy().flat[0])
        self.accepted(y.producer(), f"LeakyRelu(alpha={alpha:.6g})", alpha=alpha)
        return op.LeakyRelu(x, alpha=alpha)


def _slope_reason(x: ir.Value, slope: ir.Value) -> str | None:
    dtype = x.dtype or slope.dtype
    if dtype is not None and dtype not in FLOAT_TYPES:
        return f"PRelu on {dtype}: LeakyRelu has no integer form"
    if slope.const_value is None:
        return "slope is not a constant (a graph input or computed)"
    values = slope.const_value.numpy()
    if values.size == 0:
        return "slope is empty"
    first = values.flat[0]
    distinct = np.unique(values)
    if distinct.size > 1:
        return f"slope has {distinct.size} different values (LeakyRelu has one alpha)"
    if not math.isfinite(float(first)):
        return f"slope {first} is not finite"
    if float(np.float32(first)) != float(first):
        return f"slope {float(first)!r} is not exactly a float32 (LeakyRelu's alpha is a float32 attribute)"
    if not broadcast_keeps_shape(x.shape, tuple(values.shape)):
        return (f"slope of shape {list(values.shape)} may change the output shape of an input of shape "
                f"{list(x.shape.dims) if x.shape is not None else 'unknown'}")
    return None


class PReluPass(DmlPass):
    """PRelu with a single constant slope value -> LeakyRelu."""

    name = "prelu"
    summary = "PRelu with one slope value -> LeakyRelu (DirectML fuses LeakyRelu, never PRelu)"
    order = 20.0

    needs_names = "sites"
    needs_shapes = "onnx"  # the broadcast check needs x's shape

    def find_sites(self, model: ir.Model) -> list[ir.Node]:
        return [n for n in all_nodes(model) if n.op_type == "PRelu"]

    def shapes_missing(self, sites) -> bool:
        return any(n.inputs[0].shape is None for n in sites)

    def rewrite(self, model: ir.Model) -> bool:
        return apply_rules(model, [PReluToLeakyRelu.rule(self)]) > 0
