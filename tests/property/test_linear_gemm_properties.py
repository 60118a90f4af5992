"""linear-gemm: Add(MatMul(a, W), b) -> Gemm (with the Reshapes around it) keeps numerics
for any rank, bias shape and MLP activation; dynamic shapes are declined."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import linear_cases


def test_linear_gemm_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=linear_cases())
    def prop(case):
        run_case(case, "linear-gemm", outcomes)

    prop()
    outcomes.require(100)
