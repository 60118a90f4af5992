"""`dmlopt demo`: optimize the bundled models and show what changed and what it gained.

The bundled models (package data, built reproducibly by ``models/build_bundled.py``):
the 7-layer LeakyRelu CNN of the public DirectML report and its Relu twin, and a
small Segment Anything image encoder (Meta's ImageEncoderViT at a reduced size, legacy
TorchScript export, opset 17) in a static and a dynamic-batch variant.  Each is
optimized for DirectML, validated against the original, timed before/after on the best
provider on this machine, and written to the output folder.
"""

from __future__ import annotations

import importlib.resources
import os
import pathlib
import sys
import time

from dmlopt.runtime import bench, sessions as runtime

from dmlopt.targets.dml import placement
from dmlopt.report.inspection import inspect
from dmlopt.io.model import load, save
from dmlopt.engine.pipeline import optimize
from dmlopt.io.tables import format_table

BUNDLED = (
    # (label, file, what it shows)
    ("cnn-leaky", "cnn_leaky.onnx", "Conv+LeakyRelu CNN (DirectML report)"),
    ("cnn-relu", "cnn_relu.onnx", "its Relu twin"),
    ("sam-small", "sam_small.onnx", "SAM image encoder, small, static"),
    ("sam-small-dynamic", "sam_small_dynamic.onnx", "SAM image encoder, small, dynamic batch"),
)
# The placement model predicts copies for the oldest runtime users still deploy.
PREDICT_ORT = "1.14"


def bundled_path(filename: str) -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("dmlopt.data").joinpath(filename)))


def _predicted(model, ort_version: str):
    p = placement.predict(model, ort_version=ort_version).to_dict()
    return len(p["cpu_nodes"]), p["memcpy"]["count"]


# Each timed sample repeats the run for at least this long: the bundled models run in well under a
# millisecond on a CPU, where one run per sample gave spreads like x0.40-14.94.
MIN_SAMPLE_MS = 20.0
# A p10-p90 spread wider than this (p90/p10 of the per-pair ratios) says nothing about the speedup.
MEANINGLESS_SPREAD = 2.0


def _speed(ratio: dict) -> str:
    """``x1.31 (1.20-1.40)`` (speedup, p10-p90 of the per-pair speedups), no measurable difference,
    or "too fast to time here" when the spread is too wide to mean anything."""
    spread = f"x{1 / ratio['p90']:.2f}-{1 / ratio['p10']:.2f}"
    if ratio["p10"] <= 0 or ratio["p90"] / ratio["p10"] > MEANINGLESS_SPREAD:
        return f"too fast to time here ({spread})"
    if ratio["verdict"] == "no measurable difference":
        return f"none measurable ({spread})"
    return f"x{1 / ratio['median']:.2f} ({spread})"


def run(output_dir: str = "dmlopt-demo", runs: int = 10, quiet: bool = False) -> int:
    """Optimize each bundled model twice: for DirectML (what a user ships; its placement is
    predicted, since DirectML is Windows-only) and for the best provider here, which is timed
    before/after, so the speedup column is a measurement, not a prediction."""
    out_dir = pathlib.Path(output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    local = runtime.resolve_ep("auto")
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    rows = [("model", "nodes (dml)", "Einsum", "Transpose", f"DML {PREDICT_ORT} CPU nodes/copies", "max abs err",
             f"{local} ms before", f"after (--target {local})", "speedup")]
    failed = False
    t_start = time.perf_counter()
    for label, filename, what in BUNDLED:
        path = bundled_path(filename)
        if not path.is_file():
            say(f"dmlopt demo: {filename} is not bundled in this install; skipped")
            continue
        say(f"dmlopt demo: {label}: {what}")
        original = load(path)
        dims = {d: 1 for d in inspect(original)["free_dims"]}
        shipped = optimize(original, dims=dims, target="dml", ort_version=PREDICT_ORT)
        here = optimize(original, dims=dims, target=local, retime=False)
        for result, suffix in ((shipped, "dml"), (here, local)):
            if result.passed:
                save(result.model, out_dir / f"{label}.{suffix}.onnx")
            else:
                failed = True
                say(f"dmlopt demo: {label} (--target {suffix}): validation FAILED; not written")
        before_counts, after_counts = shipped.report.input["op_counts"], shipped.report.output["op_counts"]
        err = max((o["max_abs"] for r in (shipped, here) for o in r.report.validation["outputs"]), default=0.0)
        if any(p["modified"] for p in here.report.passes):
            timed = bench.compare({"before": original, "after": here.model}, local, runs=runs, warmup=2,
                                  baseline="before", dims=dims, free_dims=dims, min_sample_ms=MIN_SAMPLE_MS)
            b, a = timed["models"]["before"], timed["models"]["after"]
            before_ms, after_ms = f"{b['latency_ms']['median']:.2f}", f"{a['latency_ms']['median']:.2f}"
            speed = _speed(a["ratio"])
        else:  # the same graph: timing it twice would only measure noise
            before_ms, after_ms, speed = "-", "-", "identical graph"
        pb, pa = _predicted(original, PREDICT_ORT), _predicted(shipped.model, PREDICT_ORT)
        placement_text = f"{pb[0]}/{pb[1]} -> {pa[0]}/{pa[1]}" if pb and pa else "n/a"
        rows.append((label, f"{shipped.report.input['nodes']} -> {shipped.report.output['nodes']}",
                     f"{before_counts.get('Einsum', 0)} -> {after_counts.get('Einsum', 0)}",
                     f"{before_counts.get('Transpose', 0)} -> {after_counts.get('Transpose', 0)}",
                     placement_text, f"{err:.2g}", before_ms, after_ms, speed))
    print(format_table(rows))
    print(f"\nWritten to {os.fspath(out_dir)}/: <model>.dml.onnx (optimized for DirectML, ONNX Runtime {PREDICT_ORT}; "
          f"its CPU nodes and copies are predicted, see `dmlopt inspect MODEL --ep dml`) and <model>.{local}.onnx "
          f"(optimized for {runtime.PROVIDERS[local]}, timed here: median of {runs} alternating samples of at least "
          f"{MIN_SAMPLE_MS:.0f} ms each (a fast model's runs repeated); speedup is the "
          f"median per-pair ratio with its p10-p90 spread; a spread across 1 is no measurable difference)."
          + ("" if local == "dml" else f" The {local} timings do not represent DirectML.")
          + f" Took {time.perf_counter() - t_start:.0f}s.")
    return 1 if failed else 0
