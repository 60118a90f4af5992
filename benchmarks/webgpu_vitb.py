"""SAM ViT-B 1024 on the WebGPU EP: the export against dmlopt's outputs, timed in one run, with a GPU profile.

    python benchmarks/webgpu_vitb.py --work DIR [--runs 10] [--variants] [--graph-capture] [--profile-out DIR]

Rows: the export (float32, the baseline), `--target webgpu`, `--target webgpu --fp16` (validated on the CPU EP
with dmlopt's float16 rule; the row says whether it passed) and, with --variants, the options the issue asks
about (relative-position bias folded, attention kept unfused).  Every row is timed by ``bench.compare`` in
alternation against the export, outputs read back to the host; ratios are medians of per-round ratios.
Numerics: each output on the WebGPU EP against the export on the CPU EP (relative L2).

Profile: one session per row with ORT's profiling on; the WebGPU EP adds its GPU kernel times (timestamp
queries, ``cat == "Api"`` events) to ORT's CPU-side node events where the adapter supports them.  The summary
(GPU ms by op type, the slowest kernels) is printed and, with --profile-out, written as JSON beside the raw
profile.  The adapter is named first; on a software adapter the times mean nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.runtime import vulkan as adapter  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.runtime.validate import run as run_model  # noqa: E402

EXPORT = "export fp32"


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def variants(args) -> dict[str, dict]:
    # fp16_repair off: the repair replays validation many times (minutes on ViT-B); the row says whether the
    # float16 model as written passes dmlopt's validation.
    out = {"dmlopt webgpu fp32": {}, "dmlopt webgpu fp16": {"fp16": True, "fp16_repair": False, "validate": args.validate_fp16},
           # every op in float16, WebGPU's inaccurate float16 matrix products too (registry.FP16_KEEP_FLOAT32)
           "dmlopt webgpu fp16 every op": {"fp16": True, "fp16_target_keep": False, "validate": False}}
    for ops in args.fp16_keep:  # float16 with these op types kept in float32: where the EP's error comes from
        out[f"dmlopt webgpu fp16 keep {ops} fp32"] = {"fp16": True, "fp16_keep_ops": ops, "validate": False}
    if args.variants:
        # Explorations, not validated (their rel L2 on the EP is in the table).
        explore = {
            "fp32 relpos-bias=fold-pad-v": {"relpos_bias": "fold-pad-v"},
            "fp32 attention=keep": {"attention": "keep"},
            "fp16 relpos-bias=fold-pad-v": {"fp16": True, "relpos_bias": "fold-pad-v"},
            "fp16 keep LayerNorm fp32": {"fp16": True, "fp16_keep_ops": "LayerNormalization,SkipLayerNormalization"},
            "fp16 keep attention fp32": {"fp16": True, "fp16_keep_ops": "MultiHeadAttention,Softmax"},
            "fp16 keep Gelu+Add fp32": {"fp16": True, "fp16_keep_ops": "Gelu,Erf,Add"},
            "fp16 keep reductions fp32": {"fp16": True, "fp16_keep_ops": "ReduceMean,Pow,Sqrt,Div"},
            "fp16 keep norms+reductions fp32": {"fp16": True, "fp16_keep_ops": "LayerNormalization,"
                                                "SkipLayerNormalization,ReduceMean,Pow,Sqrt,Div"},
        }
        for name, options in explore.items():
            out[f"dmlopt webgpu {name}"] = {**options, "validate": False}
    return out


def build(export, args, feeds=None, reference=None) -> tuple[dict, dict]:
    """The rows' models; with `feeds`, each one's error on the WebGPU EP is printed as soon as it is built."""
    models, notes = {EXPORT: export}, {EXPORT: "-"}
    for name, options in variants(args).items():
        t0 = time.perf_counter()
        result = dmlopt.optimize(export, target="webgpu", retime=False, **options)
        verdict = ("not validated" if not options.get("validate", True) else
                   "validated" if result.passed else "REFUSED by validation")
        fused = sum(1 for n in result.model.graph.all_nodes() if n.op_type == "MultiHeadAttention")
        notes[name] = f"{verdict}; {fused} MultiHeadAttention; optimize {time.perf_counter() - t0:.0f} s"
        if feeds is not None:
            got = next(iter(run_model(result.model, feeds, target="webgpu").values()))
            notes[name] += f"; rel L2 on the EP {rel_l2(got, reference):.1e}"
        print(f"{name}: {notes[name]}", flush=True)
        models[name] = result.model
        if verdict.startswith("REFUSED"):
            print(result.report.to_table(), flush=True)
    return models, notes


def gpu_profile(model, feeds, runs: int, raw_out: pathlib.Path | None) -> dict:
    """ORT's profile of `runs` runs after one warm-up (bench.profile_summary): CPU-side node ms by op type
    and, where the EP adds them, GPU kernel ms (its timestamp-query events)."""
    with tempfile.TemporaryDirectory() as tmp:
        session = runtime.session(model, "webgpu", profile_dir=tmp)
        for _ in range(runs + 1):
            session.run(None, feeds)
        path = session.end_profiling()
        events = json.load(open(path))
        if raw_out:
            raw_out.write_text(json.dumps(events))
    return bench.profile_summary(events) or {}


def captured_table(models: dict, feeds: dict, args) -> None:
    """Every row again as dmlopt's session file runs it (enableGraphCapture=1, device inputs/outputs bound once,
    outputs read back each run), beside the export as ORT runs it by default; one alternation."""
    timers, notes = {f"{EXPORT} (no capture)": bench.Timer(models[EXPORT], "webgpu", feeds=feeds, profile=False)}, {}
    for name, model in models.items():
        try:
            timers[f"{name} (graph capture)"] = bench.Timer(model, "webgpu", feeds=feeds, profile=False,
                                                            graph_capture=True)
        except Exception as e:  # noqa: BLE001 - the row says why it cannot be captured
            notes[name] = str(e).splitlines()[0]
    result = bench.alternate(timers, runs=args.runs, warmup=args.warmup)
    rows = [("model", "median ms", "min-p90 ms", "x export (no capture)")]
    for name in timers:
        m, lat = result["models"][name], result["models"][name]["latency_ms"]
        rows.append((name, f"{lat['median']:.2f}", f"{lat['min']:.1f}-{lat['p90']:.1f}", f"{1.0 / m['ratio_median']:.3f}"))
    rows += [(f"{name} (graph capture)", "-", "-", f"not captured: {why}") for name, why in notes.items()]
    print("\nas the session file runs them: graph capture, inputs and outputs on the device (read back each run)")
    print(format_table(rows), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=str(ROOT / ".sam_gpu"), help="where ViT-B is exported and reused")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--profile-runs", type=int, default=3)
    parser.add_argument("--recommended-options", action="store_true",
                        help="time again with the provider options dmlopt's session file recommends")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--validate-fp16", action="store_true",
                        help="validate the fp16 row (on the CPU EP and the WebGPU EP: minutes when it fails)")
    parser.add_argument("--profile-out", default=None)
    parser.add_argument("--graph-capture", action="store_true",
                        help="time every row again under graph capture, as dmlopt's session file runs a ready model")
    parser.add_argument("--fp16-keep", action="append", default=[], metavar="OPS",
                        help="add a float16 row keeping these comma-separated op types in float32 (repeatable)")
    args = parser.parse_args(argv)
    runtime.resolve_ep("webgpu")
    chosen, why = adapter.chosen()
    ort = runtime.ort()
    print(f"WebGPU EP: onnxruntime {ort.__version__}, plug-in {runtime.webgpu_host.plugin_version()}, adapter "
          f"{chosen.line() if chosen else 'unknown (' + why + ')'}", flush=True)
    refusal = runtime.timing_refusal("webgpu")
    if refusal:
        print(f"SOFTWARE ADAPTER: {refusal}. Times below are CPU emulation.")
    from benchmarks.sam_gpu import export_vit_b

    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    export = dmlopt.load(str(export_vit_b(work)))
    print(f"export ready in {time.perf_counter() - t0:.0f} s", flush=True)
    feeds = runtime.random_inputs(runtime.input_specs(export), 0)
    reference = next(iter(run_model(export, feeds).values()))
    models, notes = build(export, args, feeds, reference)
    result = bench.compare(models, "webgpu", runs=args.runs, warmup=args.warmup, baseline=EXPORT, feeds=feeds)
    rows = [("model", "median ms", "min-p90 ms", "x export", "rel L2 on EP vs export (CPU EP)",
             "dmlopt validate --ep webgpu", "dmlopt")]
    for name, model in models.items():
        m = result["models"][name]
        got = next(iter(run_model(model, feeds, target="webgpu").values()))
        lat = m["latency_ms"]
        # dmlopt's validation rule, this model on the WebGPU EP against the export on the CPU EP
        check = dmlopt.validate(export, model, inputs=feeds, ep="webgpu")
        judged = "; ".join(f"{'ok' if o.passed else 'DIFFER'} by {o.to_dict().get('decided_by', '?')}"
                           for o in check.outputs)
        rows.append((name, f"{lat['median']:.2f}", f"{lat['min']:.1f}-{lat['p90']:.1f}",
                     f"{1.0 / m['ratio_median']:.3f}", f"{rel_l2(got, reference):.1e}", judged, notes[name]))
    print(f"\nSAM ViT-B 1024 on WebGpuExecutionProvider ({chosen.line() if chosen else 'adapter unknown'}): "
          f"{args.runs} alternating rounds after {args.warmup} warm-up; x export = median of per-round ratios")
    print(format_table(rows), flush=True)
    if args.recommended_options:
        options = {"validationMode": "disabled", "storageBufferCacheMode": "bucket", "powerPreference": "high-performance"}
        again = bench.compare(models, "webgpu", runs=args.runs, warmup=args.warmup, baseline=EXPORT, feeds=feeds,
                              provider_options=options)
        rows = [("model", "median ms", "min-p90 ms", "x export")]
        for name in models:
            m, lat = again["models"][name], again["models"][name]["latency_ms"]
            rows.append((name, f"{lat['median']:.2f}", f"{lat['min']:.1f}-{lat['p90']:.1f}", f"{1.0 / m['ratio_median']:.3f}"))
        print(f"\nthe same with provider options {options} (every model)")
        print(format_table(rows), flush=True)
    if args.graph_capture:
        captured_table(models, feeds, args)
    out = pathlib.Path(args.profile_out) if args.profile_out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for i, (name, model) in enumerate(models.items() if not args.no_profile else ()):
        summary = gpu_profile(model, feeds, args.profile_runs, out / f"profile{i}.json" if out else None)
        summaries[name] = summary
        print(f"\nprofile {name}:")
        print(bench.profile_table(summary, "WebGpuExecutionProvider"))
    if out:
        (out / "summary.json").write_text(json.dumps({"timing": result, "profiles": summaries}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
