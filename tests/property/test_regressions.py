"""Failures the property tests found, one named test each, kept after the fix.

Each builds the smallest model that showed the bug and states what must hold.  A new
failure lands here first as a strict xfail; the fix turns it into an XPASS failure and
the marker is removed.
"""

from __future__ import annotations

import numpy as np
import pytest

import dmlopt
from tests.property.strategies import Builder, embed, finish


def _conv_leaky_in_loop(alpha: float):
    """Loop(M=2, cond="") whose body is LeakyRelu(Conv(x; W)), W an outer initializer."""
    b = Builder(0)
    x = b.input([1, 2, 5])
    w = b.const(b.weights([2, 2, 3]))
    y = embed(b, x, lambda sb, v: sb.op("LeakyRelu", [sb.op("Conv", [v, w], kernel_shape=[3])], alpha=alpha),
              "loop", [])
    return finish(b, [y])


@pytest.mark.parametrize("strategy", ["conv-split", "channel-fold"])
def test_leaky_relu_in_loop_body_keeps_the_loops_empty_cond_input(strategy):
    model = _conv_leaky_in_loop(alpha=0.3)
    result = dmlopt.optimize(model, passes=["leaky-relu"], leaky_relu=strategy, retime=False)
    assert result.passed
    loop = next(n for n in result.model.graph if n.op_type == "Loop")
    assert len(loop.inputs) == 2 and loop.inputs[1] is None


@pytest.mark.parametrize("layout", ["fewest-transposes", "largest-matmul"])
def test_einsum_full_reduction_of_a_constant_is_a_scalar(layout):
    b = Builder(0)
    total = b.op("Einsum", [b.const(b.weights([2, 3]))], equation="ab->")
    y = b.op("Add", [total, b.input([])])
    result = dmlopt.optimize(finish(b, [y]), passes=["einsum"], einsum="lower", einsum_layout=layout, retime=False)
    assert result.passed
    assert result.report.passes[0]["op_counts_after"].get("Einsum", 0) == 0


def test_transpose_sunk_through_reducesum_in_if_branch_keeps_the_models_opset():
    b = Builder(0)
    b.opset = 11
    x = b.input([2, 3])

    def pattern(sb, v):
        return sb.op("ReduceSum", [sb.op("Transpose", [sb.op("Relu", [v])], perm=[1, 0])], axes=[0], keepdims=0)

    feeds = []
    y = embed(b, x, pattern, "if", feeds)
    result = dmlopt.optimize(finish(b, [y]), passes=["transpose"], retime=False)
    assert result.passed
    assert result.report.passes[0]["op_counts_after"].get("Transpose", 0) == 0
