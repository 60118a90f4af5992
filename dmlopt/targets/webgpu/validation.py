"""Validation on the WebGPU EP itself, beside the CPU EP's: the optimized model run on the EP
against the input model on the CPU EP, with the input model on the EP as the baseline.

Why: dmlopt's validation runs both models on the CPU EP, which says nothing of a kernel that the
target computes differently (WebGPU's MultiHeadAttention from 32 tokens on under lavapipe gave
rel L2 2.9e-2 on a SAM that passed on the CPU EP).  The baseline keeps the EP's own float
differences (an adapter's fast math, a kernel dmlopt did not write) from being blamed on dmlopt:
the optimized model fails only where it is off and the input model on the same EP is not, or
is off by clearly more (x2 its error).
"""

from __future__ import annotations

from typing import Any, Mapping

from dmlopt.validate import Validation, validate
from dmlopt import vulkan as adapter

WORSE_THAN_BASELINE = 2.0


def _worst(v: Validation) -> float:
    return max((o.max_abs for o in v.outputs), default=0.0)


def on_ep(original, optimized, *, shapes=None, dims=None, inputs=None, atol=None, rtol=None) -> dict[str, Any]:
    """The report's ``validation_webgpu``: both models on the EP against the input on the CPU EP."""
    base = validate(original, original, shapes=shapes, dims=dims, inputs=inputs, atol=atol, rtol=rtol,
                                 ep="webgpu")
    cand = validate(original, optimized, shapes=shapes, dims=dims, inputs=inputs, atol=atol, rtol=rtol,
                                 ep="webgpu")
    chosen, why = adapter.chosen()
    if cand.passed:
        passed, verdict = True, "the optimized model on the WebGPU EP matches the input on the CPU EP"
    elif not base.passed and _worst(cand) <= WORSE_THAN_BASELINE * _worst(base):
        passed, verdict = True, ("off on the WebGPU EP as the input model is (the EP's own numerics, not a "
                                 "rewrite): not blamed on dmlopt")
    else:
        passed, verdict = False, ("the optimized model computes differently on the WebGPU EP"
                                  + ("" if base.passed else " and further off than the input model there"))
    return {"passed": passed, "verdict": verdict, "provider": "WebGpuExecutionProvider",
            "adapter": chosen.line() if chosen is not None else f"unknown ({why})",
            "optimized": cand.to_dict(), "input_model": base.to_dict()}


def summary(result: Mapping[str, Any]) -> str:
    worst = max((o["max_rel"] for o in result["optimized"]["outputs"]), default=0.0)
    return (f"{'ok' if result['passed'] else 'FAIL'} on the WebGPU EP ({result['adapter']}): {result['verdict']}; "
            f"max rel {worst:.3g}")
