"""copies: the rewrites that keep nodes off DirectML's CPU fallback keep numerics (n-ary
Sum/Max/Min/Mean, Gelu, LayerNormalization outputs and bias, Cast pairs, constant Ifs)."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import copies_cases


def test_copies_rewrites_keep_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=copies_cases())
    def prop(case):
        run_case(case, "copies", outcomes, copies_report="off")

    prop()
    outcomes.require(100)
