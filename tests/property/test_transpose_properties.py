"""transpose: cancelling, merging, folding and sinking Transposes keeps numerics around
MatMul/Gemm, Softmax, reductions and elementwise ops, and never adds a Transpose."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import transpose_cases


def no_more_transposes(result):
    before = result.report.passes[0]["op_counts_before"].get("Transpose", 0)
    after = result.report.passes[0]["op_counts_after"].get("Transpose", 0)
    assert after <= before, (before, after)


def test_transpose_pass_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=transpose_cases())
    def prop(case):
        run_case(case, "transpose", outcomes, then=no_more_transposes)

    prop()
    outcomes.require(100)
