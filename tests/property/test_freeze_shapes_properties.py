"""freeze-shapes: fixing dynamic axes and folding the shape arithmetic keeps numerics at the
given sizes; with nothing given the model is left as it is."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import shape_chain_cases


def test_freeze_shapes_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=shape_chain_cases())
    def prop(case):
        outcome = run_case(case, "freeze-shapes", outcomes)
        if not case.options:
            assert outcome == "declined"

    prop()
    outcomes.require(150)
