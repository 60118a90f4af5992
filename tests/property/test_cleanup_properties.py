"""cleanup: folding constants and dropping dead nodes keeps numerics and never grows the
model's constants by more than 1% (plus a few KB of scalars on tiny models)."""

from __future__ import annotations

from hypothesis import given

from passes.cleanup import MAX_GROWTH
from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import fold_cases


def size_guard_held(result):
    before, after = result.report.input["initializer_bytes"], result.report.output["initializer_bytes"]
    assert after <= before * (1 + MAX_GROWTH) + 4096, (before, after)


def test_cleanup_keeps_numerics_and_size():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=fold_cases())
    def prop(case):
        run_case(case, "cleanup", outcomes, then=size_guard_held)

    prop()
    outcomes.require(200)
