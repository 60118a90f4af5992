"""conv-transpose: the sub-pixel Conv + DepthToSpace form equals ConvTranspose for any
kernel, stride, pads, output_padding, groups and activation (or the site is declined)."""

from __future__ import annotations

from hypothesis import given

from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import conv_transpose_cases


def test_subpixel_and_keep_keep_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=conv_transpose_cases())
    def prop(case):
        for strategy in ("keep", "subpixel"):
            outcomes[(strategy, run_case(case, "conv-transpose", conv_transpose=strategy))] += 1

    prop()
    assert outcomes[("keep", "rewrote")] == 0
    outcomes.require(100, of=("subpixel", "rewrote"))
