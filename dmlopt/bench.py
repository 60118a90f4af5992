"""Timing: session creation, warm-up, then min/median/p90 latency with fixed inputs.

Noise on shared machines is large, so comparisons run the models in alternation
(A B A B ...) inside one process and report the ratio per pair and its median,
not two separately taken medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dmlopt import runtime


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


class Timer:
    """One model's session and fixed inputs, ready to be run repeatedly."""

    def __init__(self, model: ir.Model, target: str, *, shapes=None, dims=None, feeds=None,
                 provider_options: Mapping[str, Any] | None = None, free_dims: Mapping[str, int] | None = None,
                 seed: int = 0):
        t0 = time.perf_counter()
        self.session = runtime.session(model, target, provider_options=provider_options, free_dims=free_dims)
        self.load_s = time.perf_counter() - t0
        self.provider = self.session.get_providers()[0]
        if feeds is None:
            feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims or free_dims), seed)
        wanted = {i.name for i in self.session.get_inputs()}
        self.feeds = {k: v for k, v in feeds.items() if k in wanted}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def once(self) -> float:
        t0 = time.perf_counter()
        self.session.run(self.outputs, self.feeds)
        return (time.perf_counter() - t0) * 1000.0


def summary(times_ms: Sequence[float]) -> dict[str, float]:
    return {"min": float(min(times_ms)), "median": float(statistics.median(times_ms)),
            "p90": _percentile(times_ms, 90), "runs": len(times_ms)}


def time_model(model: ir.Model, target: str = "cpu", *, runs: int = 20, warmup: int = 3, **kw) -> dict[str, Any]:
    timer = Timer(model, target, **kw)
    for _ in range(warmup):
        timer.once()
    times = [timer.once() for _ in range(runs)]
    return {"provider": timer.provider, "load_s": timer.load_s, "latency_ms": summary(times)}


def compare(models: Mapping[str, ir.Model], target: str = "cpu", *, runs: int = 20, warmup: int = 3,
            baseline: str | None = None, **kw) -> dict[str, Any]:
    """Time several models in alternation; ratios are each model's time over the baseline's, per round."""
    timers = {name: Timer(m, target, **kw) for name, m in models.items()}
    names = list(timers)
    baseline = baseline or names[0]
    for _ in range(warmup):
        for name in names:
            timers[name].once()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(timers[name].once())
    out = {"provider": timers[baseline].provider, "baseline": baseline, "models": {}}
    for name in names:
        ratios = [t / b for t, b in zip(times[name], times[baseline])]
        out["models"][name] = {"load_s": timers[name].load_s, "latency_ms": summary(times[name]),
                               "ratio_median": float(statistics.median(ratios))}
    return out


def to_table(result: dict[str, Any]) -> str:
    """Readable form of `time_model` or `compare` output."""
    from dmlopt.validate import format_table

    if "models" not in result:
        lat = result["latency_ms"]
        rows = [("provider", "load s", "min ms", "median ms", "p90 ms", "runs"),
                (result["provider"], f"{result['load_s']:.3f}", f"{lat['min']:.3f}", f"{lat['median']:.3f}",
                 f"{lat['p90']:.3f}", lat["runs"])]
        return format_table(rows)
    rows = [("model", "load s", "min ms", "median ms", "p90 ms", f"ratio vs {result['baseline']}")]
    for name, m in result["models"].items():
        lat = m["latency_ms"]
        rows.append((name, f"{m['load_s']:.3f}", f"{lat['min']:.3f}", f"{lat['median']:.3f}", f"{lat['p90']:.3f}",
                     f"{m['ratio_median']:.3f}"))
    return f"provider: {result['provider']}\n" + format_table(rows)
