"""attention: fusing attention into MultiHeadAttention keeps numerics for any head split,
scale placement and bias shape, on every target; what it cannot show exact it declines."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import attention_cases


def test_attention_fusion_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=attention_cases())
    def prop(case):
        for choice in ("fuse", "keep"):
            outcomes[(choice, run_case(case, "attention", attention=choice))] += 1

    prop()
    assert outcomes[("keep", "rewrote")] == 0
    outcomes.require(60, of=("fuse", "rewrote"))
