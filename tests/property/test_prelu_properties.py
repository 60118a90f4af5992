"""prelu: PRelu -> LeakyRelu only where the slope is one value; numerics kept either way."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import prelu_cases


def test_prelu_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=prelu_cases())
    def prop(case):
        run_case(case, "prelu", outcomes)

    prop()
    outcomes.require(100)
    outcomes.require(30, of="declined")
