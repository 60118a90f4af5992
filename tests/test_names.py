"""numbered_name: the numbering validate's float16-rounding copy relies on."""

from __future__ import annotations

from dmlopt.graph.names import numbered_name


def test_numbering_restarts_per_base_from_2_and_records_the_name():
    taken = {"x", "x_2", "y"}
    assert numbered_name(taken, "x") == "x_3"
    assert numbered_name(taken, "y") == "y_2"  # per base: not y_4
    assert numbered_name(taken, "z") == "z"
    assert {"x_3", "y_2", "z"} <= taken
    assert numbered_name(taken, "x") == "x_4"
