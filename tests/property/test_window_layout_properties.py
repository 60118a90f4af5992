"""window-layout: keeping tokens in window layout between windowed blocks keeps numerics for any
geometry (batch, odd sizes, padding or none, both spellings), block order and what lies between
the blocks, and never ends with more Transposes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from models.windowed import ACTIVATIONS, BETWEEN, SPELLINGS, windowed_model
from tests.property.harness import PROPERTY_SETTINGS, Outcomes, run_case
from tests.property.strategies import Case


# Block orders (w windowed, g global): mostly with a windowed pair to merge, some without.
BLOCKS = st.sampled_from(["ww"] * 3 + ["www", "wwg", "gww", "wwgww", "wgw", "w", "g"])


@st.composite
def windowed_cases(draw):
    h, w = draw(st.integers(2, 9)), draw(st.integers(2, 9))
    ws = draw(st.integers(2, 5))
    if -(-h // ws) * -(-w // ws) < 2:  # one window: no partition to speak of
        ws = max(2, min(h, w) - 1) if max(h, w) > 2 else 2
        h, w = max(h, ws + 1), max(w, ws + 1)
    opset = draw(st.sampled_from([13, 17, 18]))
    blocks = draw(BLOCKS)
    if draw(st.integers(0, 3)) == 0:  # a window size per block (two geometries over one grid)
        ws = tuple(draw(st.integers(2, 5)) for _ in blocks)
    args = dict(b=draw(st.integers(1, 2)), h=h, w=w, c=draw(st.integers(1, 6)), ws=ws, blocks=blocks, spelling=draw(st.sampled_from(SPELLINGS)),
                opset=opset, tail=draw(st.sampled_from(["transpose", "none"])),
                decomposed_norm=opset < 17 or draw(st.booleans()), activation=draw(st.sampled_from(ACTIVATIONS)),
                between=draw(st.sampled_from(("none",) * 3 + BETWEEN)), seed=draw(st.integers(0, 2**16)))
    return Case(windowed_model(**args), options={"window_layout": "merge"}, label=repr(args))


def fewer_transposes_or_unchanged(result):
    entry = result.report.passes[0]
    before, after = entry["op_counts_before"].get("Transpose", 0), entry["op_counts_after"].get("Transpose", 0)
    assert after < before if entry["modified"] else after == before, (before, after)


def test_window_layout_pass_keeps_numerics():
    outcomes = Outcomes()

    @PROPERTY_SETTINGS
    @given(case=windowed_cases())
    def prop(case):
        run_case(case, "window-layout", outcomes, then=fewer_transposes_or_unchanged)

    prop()
    outcomes.require(80)
    outcomes.require(30, of="declined")
