"""Choosing among the variants a pass offers, by timing them on the target.

Passes only offer variants (an option with ``tunable=True``); this module measures
them.  Each candidate is the current model rewritten with one choice; candidates that
do not validate are dropped; the rest are timed in alternation on the target provider
and the fastest wins.  The unchanged model is always a candidate where the option has
a ``keep`` choice (or is a bool: off), so the result is never slower than the input
beyond noise.  Which options are chosen here:
  1. a tunable option left at ``auto`` (measured when the target provider is here, else
     the option's documented default for the target);
  2. with ``--tune``, every tunable option the user did not set, even one whose default is
     not ``auto`` (fp16: off/on), and the target provider must be on this machine
     (``require_target`` raises before any work).
Where no candidate changes the graph (no site for the pass), nothing is timed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from dmlopt import runtime
from dmlopt.errors import ProviderError

TUNE_RUNS = 15
TUNE_WARMUP = 3


def require_target(target: str) -> None:
    """--tune measures on the target: its provider must be here (exit 2 otherwise)."""
    if not runtime.has_target(target):
        raise ProviderError(
            f"--tune needs the {runtime.PROVIDERS[target]} on this machine; providers present: "
            f"{', '.join(runtime.available_providers())} (run --tune on the target machine, or pick --target "
            f"from the providers present)")


def pending(p, context) -> list:
    """The options of pass `p` to choose now (cases 1 and 2 of the module docstring)."""
    tuning = bool(context.options.get("tune"))
    return [opt for opt in p.options if opt.tunable and (
        p.option(opt.name) == "auto" or (tuning and opt.name not in context.options))]


def candidates(opt) -> list:
    if opt.choices:
        return [c for c in opt.choices if c != "auto"]
    if opt.type is bool:
        return [False, True]
    return [opt.default]


def validation_tolerances(options, atol: float | None, rtol: float | None) -> tuple[float | None, float | None]:
    """float16 tolerances when fp16 ran (its outputs may be float32 with keep_io_types, the error is not)."""
    if not options.get("fp16"):
        return atol, rtol
    from dmlopt.validate import DEFAULT_TOLERANCES

    half_atol, half_rtol = DEFAULT_TOLERANCES["float16"]
    return (half_atol if atol is None else atol), (half_rtol if rtol is None else rtol)


def choose(p, opt, work: ir.Model, original: ir.Model, context, check: dict[str, Any] | None = None,
           progress=None) -> tuple[Any, dict[str, Any]]:
    """Return (choice, record) for option `opt` of pass `p`.

    `check` holds the validation settings (inputs, atol, rtol) the candidates must pass."""
    target = context.target
    choices = candidates(opt)
    explicit_tune = bool(context.options.get("tune"))
    if not runtime.has_target(target):
        if explicit_tune:
            require_target(target)
        default = (opt.auto_default or {}).get(target, opt.default if opt.default != "auto" else choices[0])
        how = (f"default for --target {target}: {runtime.PROVIDERS[target]} is not on this machine, so nothing "
               f"was timed; run `dmlopt optimize --tune --target {target}` on the target machine to measure")
        return default, {"how": how, "candidates": {}}
    return measure(p, opt, choices, work, original, context, check or {}, progress)


def _baseline(opt, choices: list) -> Any:
    """The candidate that leaves the graph as it is: 'keep', off, or the default."""
    if "keep" in choices:
        return "keep"
    if False in choices:
        return False
    return opt.default if opt.default in choices else choices[0]


def measure(p, opt, choices, work, original, context, check=None, progress=None) -> tuple[Any, dict[str, Any]]:
    from dmlopt import bench
    from dmlopt.errors import DmlOptError
    from dmlopt.pipeline import check_model
    from dmlopt.validate import validate

    check = check or {}
    models: dict[Any, ir.Model] = {}
    errors: dict[Any, float] = {}
    rejected: dict[str, str] = {}
    changed = []
    for choice in choices:
        ctx = _with_option(context, opt.name, choice)
        trial = type(p)(ctx)
        result = trial(work.clone())
        if result.modified:
            changed.append(choice)
        atol, rtol = validation_tolerances(ctx.options, check.get("atol"), check.get("rtol"))
        try:
            # The same checks the pipeline applies to every pass: a candidate that fails them
            # is rejected with its reason, never shipped and never a crash of the whole run.
            check_model(result.model, f"pass '{p.name}' with {opt.flag} {choice}")
            v = validate(original, result.model, shapes=context.shapes, dims=context.dims,
                         inputs=check.get("inputs"), atol=atol, rtol=rtol)
        except DmlOptError as e:
            rejected[str(choice)] = f"invalid model: {e}"
            continue
        if not v.passed:
            rejected[str(choice)] = "failed validation"
            continue
        models[choice] = result.model
        errors[choice] = max((o.max_rel for o in v.outputs), default=0.0)
    baseline = _baseline(opt, choices)
    if not changed:
        return baseline, {"how": "not timed: no choice changes this graph (nothing for the pass to do)",
                          "candidates": {}, "rejected": rejected}
    if not models:
        return baseline, {"how": "no candidate validated", "rejected": rejected, "candidates": {}}
    if baseline not in models:
        baseline = next(iter(models))
    labels = {str(c): c for c in models}
    timed = bench.compare({str(c): m for c, m in models.items()}, context.target, runs=TUNE_RUNS,
                          warmup=TUNE_WARMUP, baseline=str(baseline), shapes=context.shapes, dims=context.dims,
                          progress=progress, label=f"tuning {p.name} {opt.flag} ({len(models)} candidates)")
    best = min(timed["models"], key=lambda c: timed["models"][c]["ratio_median"])
    record = {
        "how": f"measured on {timed['provider']} ({TUNE_RUNS} alternating runs, fastest that validated)",
        "baseline": str(baseline),
        "candidates": {c: {"median_ms": m["latency_ms"]["median"], "min_ms": m["latency_ms"]["min"],
                           "p90_ms": m["latency_ms"]["p90"], "ratio_vs_" + str(baseline): m["ratio_median"],
                           "ratio": m["ratio_median"], "copies": m["copies"], "max_rel_error": errors[labels[c]]}
                       for c, m in timed["models"].items()},
        "rejected": rejected,
    }
    return labels[best], record


def _with_option(context, name: str, value):
    options = dict(context.options)
    options[name] = value
    return dataclasses.replace(context, options=options)
