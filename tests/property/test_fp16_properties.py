"""fp16: the float16 model matches the float32 one within float16 tolerances, and with
keep_io_types its inputs and outputs keep their float32 types."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import fp16_cases


def io_types_kept(case):
    def check(result):
        if case.options["keep_io_types"]:
            assert [v.dtype.name for v in result.model.graph.inputs] == ["FLOAT"] * len(result.model.graph.inputs) \
                or any(v.dtype.name == "BOOL" for v in result.model.graph.inputs)
            assert all(v.dtype.name == "FLOAT" for v in result.model.graph.outputs)
    return check


def test_fp16_keeps_numerics_within_float16_tolerance():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=fp16_cases())
    def prop(case):
        run_case(case, "fp16", outcomes, then=io_types_kept(case))

    prop()
    outcomes.require(150)
