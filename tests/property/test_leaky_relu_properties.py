"""leaky-relu: every strategy keeps numerics on any LeakyRelu graph (or declines)."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import leaky_relu_cases

STRATEGIES = ("keep", "decompose", "relu-split", "conv-split", "channel-fold")


def test_every_strategy_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=leaky_relu_cases())
    def prop(case):
        for strategy in STRATEGIES:
            if strategy in ("conv-split", "channel-fold") and "loop-empty-cond" in case.tags:
                continue  # test_regressions.py::test_leaky_relu_in_loop_body_keeps_the_loops_empty_cond_input
            outcomes[(strategy, run_case(case, "leaky-relu", leaky_relu=strategy))] += 1

    prop()
    for strategy in STRATEGIES[1:]:
        outcomes.require(30, of=(strategy, "rewrote"))
