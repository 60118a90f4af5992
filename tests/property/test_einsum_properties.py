"""einsum: lowering any Einsum equation to Transpose/Reshape/MatMul/ReduceSum keeps numerics,
for both layouts, every --einsum choice (keep: only what the target runs itself is kept) and
every target/ORT version; or the equation is declined/kept."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import einsum_cases

RUNS = (("lower", "fewest-transposes"), ("lower", "largest-matmul"), ("auto", "auto"), ("keep", "auto"))


def test_einsum_lowering_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=einsum_cases())
    def prop(case):
        for choice, layout in RUNS:
            outcomes[(choice, layout, run_case(case, "einsum", einsum=choice, einsum_layout=layout))] += 1

    prop()
    outcomes.require(150, of=("lower", "fewest-transposes", "rewrote"))
    outcomes.require(150, of=("lower", "largest-matmul", "rewrote"))
