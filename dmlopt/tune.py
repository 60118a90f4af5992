"""Choosing among the variants a pass offers, by timing them on the target.

Passes only offer variants (an option with ``tunable=True``); this module measures
them.  Each candidate is the current model rewritten with one choice; candidates that
do not validate are dropped; the rest are timed in alternation on the target provider
and the fastest wins.  The unchanged model is always a candidate where the option has
a ``keep`` choice, so the result is never slower than the input beyond noise.  Where the
target provider is not on this machine, the option's documented default is used and
the report says how to tune on the target.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from dmlopt import runtime
from dmlopt.errors import ProviderError

TUNE_RUNS = 15
TUNE_WARMUP = 3


def choose(p, opt, work: ir.Model, original: ir.Model, context) -> tuple[str, dict[str, Any]]:
    """Return (choice, record) for option `opt` of pass `p`, which is set to 'auto'."""
    target = context.target
    candidates = [c for c in (opt.choices or ()) if c != "auto"]
    explicit_tune = bool(context.options.get("tune"))
    if not runtime.has_target(target):
        if explicit_tune:
            raise ProviderError(
                f"--tune needs the {runtime.PROVIDERS[target]} on this machine; providers present: "
                f"{', '.join(runtime.available_providers())}")
        default = (opt.auto_default or {}).get(target, opt.default if opt.default != "auto" else candidates[0])
        how = (f"default for --target {target}: {runtime.PROVIDERS[target]} is not on this machine, so nothing "
               f"was timed; run `dmlopt optimize --tune --target {target}` on the target machine to measure")
        return default, {"how": how, "candidates": {}}
    return measure(p, opt, candidates, work, original, context)


def measure(p, opt, candidates, work, original, context) -> tuple[str, dict[str, Any]]:
    from dmlopt import bench
    from dmlopt.validate import validate

    models: dict[str, ir.Model] = {}
    rejected: dict[str, str] = {}
    for choice in candidates:
        cand = work.clone()
        ctx = _with_option(context, opt.name, choice)
        trial = type(p)(ctx)
        cand = trial(cand).model
        v = validate(original, cand, shapes=context.shapes, dims=context.dims)
        if not v.passed:
            rejected[choice] = "failed validation"
            continue
        models[choice] = cand
    if not models:
        fallback = "keep" if "keep" in candidates else candidates[0]
        return fallback, {"how": "no candidate validated", "rejected": rejected, "candidates": {}}
    baseline = "keep" if "keep" in models else next(iter(models))
    timed = bench.compare(models, context.target, runs=TUNE_RUNS, warmup=TUNE_WARMUP, baseline=baseline,
                          shapes=context.shapes, dims=context.dims)
    best = min(timed["models"], key=lambda c: timed["models"][c]["ratio_median"])
    record = {
        "how": f"measured on {timed['provider']} ({TUNE_RUNS} alternating runs)",
        "candidates": {c: {"median_ms": m["latency_ms"]["median"], "ratio_vs_" + baseline: m["ratio_median"]}
                       for c, m in timed["models"].items()},
        "rejected": rejected,
    }
    return best, record


def _with_option(context, name: str, value: str):
    import dataclasses

    options = dict(context.options)
    options[name] = value
    return dataclasses.replace(context, options=options)
