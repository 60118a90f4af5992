"""Helpers and rewrite rules that more than one pass uses (one copy, imported by each)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from dmlopt.passes._base import SiteRule


def is_static(value: ir.Value | None) -> bool:
    """Whether `value` has a known shape made of integers only."""
    return value is not None and value.shape is not None and all(isinstance(d, int) for d in value.shape.dims)


def show_shape(shape: ir.Shape | None) -> str:
    """``[1,3,N,?]``: a shape for the report, symbolic dims by name."""
    if shape is None:
        return "[?]"
    return "[" + ",".join(str(d) if isinstance(d, int) else (d.value or "?") for d in shape.dims) + "]"


class ReshapeNoOp(SiteRule):
    """``Reshape(x, s)`` -> x when static shapes show it keeps x's shape (``s`` may hold -1 or 0)."""

    def pattern(self, op, x, shape):
        return op.Reshape(x, shape, _allow_other_attributes=True)

    def check(self, context, x, shape, **_):
        out = context.output_values[0]
        if not (is_static(x) and is_static(out)) or x.shape.dims != out.shape.dims:
            return pattern.MatchResult().fail("shape changes or is not static")
        return pattern.MatchResult()

    def rewrite(self, op, x, shape, **_):
        return op.Identity(x)
