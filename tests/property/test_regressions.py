"""Failures the property tests found, one named test each (strict xfail until the pass is fixed).

Each builds the smallest model that shows the bug and states what must hold; when the
pass is fixed the xfail turns into an XPASS failure (strict), and the marker is removed.
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


@pytest.mark.xfail(strict=True, reason="leaky-relu: conv-split/channel-fold in a Loop body drop the Loop's empty "
                                       "optional cond input (Loop(M, '') -> Loop(M)): invalid model")
@pytest.mark.parametrize("strategy", ["conv-split", "channel-fold"])
def test_leaky_relu_in_loop_body_keeps_the_loops_empty_cond_input(strategy):
    model = _conv_leaky_in_loop(alpha=0.3)
    result = dmlopt.optimize(model, passes=["leaky-relu"], leaky_relu=strategy, retime=False)
    assert result.passed
    loop = next(n for n in result.model.graph if n.op_type == "Loop")
    assert len(loop.inputs) == 2 and loop.inputs[1] is None
