"""The report: each rewritten site carries the strategy chosen for it and the timings behind it."""

from __future__ import annotations

import json

import dmlopt
from dmlopt.passes import all_passes
from dmlopt.report.optimize_report import Report
from tests.conftest import conv_leaky_model


def test_rewritten_sites_carry_the_choice_and_its_timings():
    model = dmlopt.load(conv_leaky_model())
    rep = Report.start(model, target="cpu", ort_version=None, options={})
    rep.add_choice("leaky-relu", "leaky_relu", "decompose", {
        "how": "measured on CPUExecutionProvider", "candidates": {
            "keep": {"median_ms": 2.0, "ratio": 1.0}, "decompose": {"median_ms": 1.5, "ratio": 0.75}}})
    p = all_passes()["leaky-relu"]()
    p.rewrote("leaky", "decompose")
    p.declined("other", "no constant weights")
    rep.add_pass(p, before={"LeakyRelu": 1}, after={"Max": 1, "Mul": 1}, modified=True, seconds=0.1)
    rewrote, declined = rep.passes[0]["sites"]
    assert rewrote["chosen_by"] == [{"option": "leaky_relu", "choice": "decompose",
                                     "how": "measured on CPUExecutionProvider",
                                     "median_ms": {"keep": 2.0, "decompose": 1.5}}]
    assert "chosen_by" not in declined
    assert json.loads(rep.to_json())["passes"][0]["sites"][0]["chosen_by"][0]["choice"] == "decompose"


def test_optimize_report_records_the_strategy_per_site():
    result = dmlopt.optimize(conv_leaky_model(), passes=["leaky-relu"], leaky_relu="decompose", retime=False)
    (entry,) = result.report.passes
    (site,) = [s for s in entry["sites"] if s["action"] == "rewrote"]
    assert site["node"] == "leaky" and site["strategy"] == "decompose"
    assert entry["op_delta"] == {"Constant": 1, "LeakyRelu": -1, "Max": 1, "Mul": 1}  # the alpha scalar


def test_declines_are_said_once_per_reason_in_the_table():
    """Twenty sites declined for one reason are one line (with the count and an example); the JSON keeps them all."""
    model = dmlopt.load(conv_leaky_model())
    rep = Report.start(model, target="dml", ort_version=None, options={})
    p = all_passes()["copies"]()
    for i in range(20):
        p.declined(f"gather_{i}", "still predicted on the CPU: shape arithmetic", op="Gather")
    p.declined("mod_0", "Mod has no DirectML kernel for int64", op="Mod")
    rep.add_pass(p, before={"Gather": 20}, after={"Gather": 20}, modified=False, seconds=0.1)
    table = rep.to_table()
    lines = [line for line in table.splitlines() if line.startswith("  copies: ")]
    assert lines == ["  copies: 20 sites, e.g. gather_0 (Gather): still predicted on the CPU: shape arithmetic",
                     "  copies: mod_0 (Mod): Mod has no DirectML kernel for int64"]
    assert len(json.loads(rep.to_json())["passes"][0]["sites"]) == 21
