"""Copies before/after the dmlopt pipeline: predicted for DirectML, counted on CUDA, timed emulated.

For each model and variant (as exported; optimized for DirectML; optimized with the dynamic
batch frozen) it prints, in one run:
  - the placement model's prediction for DirectML (CPU nodes, copies, compiled partitions);
  - what ORT's CUDA EP really does (nodes on the CPU EP and Memcpy nodes, from a profile),
    when CUDA is here;
  - median latency on the GPU provider, and emulated DirectML (`dmlopt.targets.dml.emulate`: predicted
    CPU parts on the CPU EP, the rest on the GPU provider), with the ratio optimized/original.

    python benchmarks/copies.py [--ort-version 1.14] [--runs 40] [MODEL.onnx ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import dmlopt  # noqa: E402
from dmlopt.runtime import sessions as runtime  # noqa: E402
from dmlopt.targets.dml import emulate, placement

DATA = pathlib.Path(dmlopt.__file__).parent / "data"


def profile_counts(model, target: str) -> dict:
    """Nodes per provider and Memcpy nodes of one profiled run."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = runtime.session(model, target, profile_dir=tmp)
        sess.run(None, runtime.random_inputs(runtime.input_specs(model)))
        events = json.load(open(sess.end_profiling()))
    nodes = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes[e["name"]] = (e["args"].get("provider"), e["args"].get("op_name"))
    providers = collections.Counter(p for p, _ in nodes.values())
    memcpy = sum(1 for _, op in nodes.values() if op in ("MemcpyToHost", "MemcpyFromHost"))
    return {"cpu_ep_nodes": providers.get("CPUExecutionProvider", 0), "memcpy_nodes": memcpy}


def median_ms(fn, runs: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def measure(model, version: str, gpu: str, runs: int) -> dict:
    p = placement.predict(model, ort_version=version)
    row = {"pred_cpu": p.cpu_count, "pred_copies": p.copy_count, "pred_parts": p.partitions["count"],
           "compiled": p.partitions["compiled"]}
    if gpu != "cpu":
        row.update(profile_counts(model, gpu))
    feeds = runtime.random_inputs(runtime.input_specs(model))
    sess = runtime.session(model, gpu)
    row["gpu_ms"] = median_ms(lambda: sess.run(None, feeds), runs)
    em = emulate.EmulatedSession(model, p, gpu)
    row["emulated_ms"] = median_ms(lambda: em.run(feeds), runs)
    row["emulated_parts"] = len(em.parts)
    return row


def variants(path: pathlib.Path, version: str):
    """(label, model or the error that made it) for: as exported, optimized, optimized with dims frozen."""
    original = dmlopt.load(path)
    yield "as exported", original
    settings = [("optimized", {})]
    free = dmlopt.inspect(original)["free_dims"]
    if free:
        settings.append(("optimized, " + ",".join(f"{k}=1" for k in free), {"dims": {k: 1 for k in free}}))
    for label, extra in settings:
        try:
            yield label, dmlopt.optimize(original, target="dml", ort_version=version, **extra).model
        except dmlopt.DmlOptError as e:
            yield label, e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=pathlib.Path,
                    default=[DATA / "sam_small.onnx", DATA / "sam_small_dynamic.onnx"])
    ap.add_argument("--ort-version", default="1.14")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--json", type=pathlib.Path, help="also write the rows here")
    args = ap.parse_args(argv)
    gpu = "cuda" if runtime.has_target("cuda") else "cpu"
    if gpu == "cuda":
        runtime.ort().preload_dlls()
    rows = []
    for path in args.models:
        base = None
        for label, model in variants(path, args.ort_version):
            if isinstance(model, Exception):
                print(f"{path.stem} {label}: not measured ({model})", flush=True)
                continue
            row = {"model": path.stem, "variant": label, **measure(model, args.ort_version, gpu, args.runs)}
            base = base or row
            row["emulated_ratio"] = base["emulated_ms"] / row["emulated_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nDirectML {args.ort_version} predicted vs {runtime.PROVIDERS[gpu]} measured "
          f"(median of {args.runs} runs; emulated = predicted CPU parts on the CPU EP):")
    head = ["model", "variant", "pred CPU", "pred copies", "parts", "CPU-EP nodes", "Memcpy", "gpu ms",
            "emulated ms", "speed-up"]
    table = [head] + [[r["model"], r["variant"], r["pred_cpu"], r["pred_copies"], r["pred_parts"],
                       r.get("cpu_ep_nodes", "-"), r.get("memcpy_nodes", "-"), f"{r['gpu_ms']:.3f}",
                       f"{r['emulated_ms']:.3f}", f"{r['emulated_ratio']:.2f}x"] for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for n, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
