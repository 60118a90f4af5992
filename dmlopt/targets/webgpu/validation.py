"""Validation on the WebGPU EP itself, beside the CPU EP's: the optimized model run on the EP
against the input model on the CPU EP, with the input model on the EP as the baseline.

Why: dmlopt's validation runs both models on the CPU EP, which says nothing of a kernel that the
target computes differently (WebGPU's MultiHeadAttention from 32 tokens on under lavapipe gave
rel L2 2.9e-2 on a SAM that passed on the CPU EP).  The baseline keeps the EP's own float
differences (an adapter's fast math, a kernel dmlopt did not write) from being blamed on dmlopt:
the optimized model fails only where it is off and the input model on the same EP is not, or
is off by clearly more (x2 its error).  That is decided output by output, and the verdict is
made of the rows, so a row and the verdict never disagree.
"""

from __future__ import annotations

from typing import Any, Mapping

from dmlopt.runtime.validate import validate
from dmlopt.runtime import vulkan as adapter

WORSE_THAN_BASELINE = 2.0


def excused(cand: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """One output's row on the EP: the optimized model's, passed also where the input model on
    the same EP is off and the optimized one by at most x2 its relative L2 error and max abs."""
    if cand["passed"] or base is None or base["passed"]:
        return dict(cand)
    within = all(cand[k] is not None and base[k] is not None and cand[k] <= WORSE_THAN_BASELINE * base[k]
                 for k in ("rel_l2", "max_abs"))
    if not within:
        return {**cand, "reason": f"{cand['reason']}, and further off than the input model on the EP".strip(", ")}
    return {**cand, "passed": True, "reason": "", "decided_by": "off as the input model is on the EP"}


def on_ep(original, optimized, *, shapes=None, dims=None, inputs=None, atol=None, rtol=None) -> dict[str, Any]:
    """The report's ``validation_webgpu``: both models on the EP against the input on the CPU EP."""
    base = validate(original, original, shapes=shapes, dims=dims, inputs=inputs, atol=atol, rtol=rtol,
                                 ep="webgpu")
    cand = validate(original, optimized, shapes=shapes, dims=dims, inputs=inputs, atol=atol, rtol=rtol,
                                 ep="webgpu")
    chosen, why = adapter.chosen()
    return {**judged(cand.to_dict(), base.to_dict()), "provider": "WebGpuExecutionProvider",
            "adapter": chosen.line() if chosen is not None else f"unknown ({why})"}


def judged(cand: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """`passed`, `verdict` and the rows of the optimized model on the EP (`excused`), the verdict
    made of the rows."""
    base_rows = {o["name"]: o for o in base["outputs"]}
    rows = [excused(o, base_rows.get(o["name"])) for o in cand["outputs"]]
    passed = all(o["passed"] for o in rows)
    if cand["passed"]:
        verdict = "the optimized model on the WebGPU EP matches the input on the CPU EP"
    elif passed:
        verdict = ("off on the WebGPU EP as the input model is (the EP's own numerics, not a rewrite): not "
                   "blamed on dmlopt")
    else:
        verdict = ("the optimized model computes differently on the WebGPU EP"
                   + ("" if base["passed"] else " and further off than the input model there"))
    return {"passed": passed, "verdict": verdict, "optimized": {**cand, "outputs": rows, "passed": passed},
            "input_model": base}


def summary(result: Mapping[str, Any]) -> str:
    worst = max((o["rel_l2"] for o in result["optimized"]["outputs"]), default=0.0)
    return (f"{'ok' if result['passed'] else 'FAIL'} on the WebGPU EP ({result['adapter']}): {result['verdict']}; "
            f"max rel L2 {worst:.3g}")
