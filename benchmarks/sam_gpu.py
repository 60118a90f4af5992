"""SAM ViT-B 1024 image encoder on the CUDA EP: the export against dmlopt's outputs, in one run.

Exports the encoder itself (Meta's ImageEncoderViT, legacy TorchScript exporter, opset 17,
static 1x3x1024x1024 input, seeded random weights: models/sam_encoder.py), optimizes it with
dmlopt as a user would, then times every variant in alternation on the same inputs, IO binding
on the GPU, and prints medians and ratios against the export measured in that same run.

  export fp32                     the file as the exporter wrote it
  dmlopt fp32                     dmlopt optimize --target cuda
  dmlopt fp16                     dmlopt optimize --target cuda --fp16
  dmlopt fp16 tuned               dmlopt optimize --target cuda --fp16 --tune
  ... + CUDA graph                the same model run with enable_cuda_graph=1
  dmlopt fp16 relpos-bias=X       (--variants) the default's choices with --attention fuse --relpos-bias X

Each row names its precision; "rel L2" is the output's relative L2 distance from the export's
output on this provider.  Optimized models are cached in --work (reused when present), so a
run cut short by a time limit can be resumed and only the timing repeated.

    python benchmarks/sam_gpu.py                              # on a machine with onnxruntime-gpu
    python benchmarks/sam_gpu.py --variants --runs 40         # + the rel-pos fold variants
    python benchmarks/sam_gpu.py --small --ep cpu --no-tune   # the bundled 64 px SAM: a check of the script
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402

EXPORT = "export fp32"


def export_vit_b(work: pathlib.Path) -> pathlib.Path:
    from models import sam_encoder

    path = work / "sam_vit_b_1024.onnx"
    if path.exists():
        return path
    b = sam_encoder.VARIANTS["vit_b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sam_encoder.export_small(path.with_suffix(".tmp"), img_size=b.img_size, patch_size=b.patch_size,
                                 embed_dim=b.embed_dim, depth=b.depth, num_heads=b.num_heads,
                                 window_size=b.window_size, global_attn_indexes=b.global_attn_indexes,
                                 out_chans=b.out_chans)
    path.with_suffix(".tmp").rename(path)
    return path


def variants(args) -> dict[str, dict]:
    """name -> dmlopt.optimize keywords; "same_as" takes that variant's chosen options (nothing re-measured)."""
    # The rows that matter most first: a run cut short by a time limit keeps them (--work caches).
    out: dict[str, dict] = {"dmlopt fp16": {"fp16": True}}
    if not args.no_tune:
        out["dmlopt fp16 tuned"] = {"fp16": True, "tune": True}
    out["dmlopt fp32"] = {}
    if args.variants:
        for choice in ("keep", "fold", "fold-pad-v"):
            out[f"dmlopt fp16 relpos-bias={choice}"] = {"same_as": "dmlopt fp16", "attention": "fuse",
                                                       "relpos_bias": choice}
    return out


def optimized(source: pathlib.Path, work: pathlib.Path, name: str, options: dict, target: str,
              done: dict[str, dict]) -> dict:
    path = work / (name.replace(" ", "_").replace("=", "-") + ".onnx")
    info_path = path.with_suffix(".json")
    if path.exists() and info_path.exists():
        return {"path": path, **json.loads(info_path.read_text())}
    options = dict(options)
    base = options.pop("same_as", None)
    if base is not None:  # the base's choices, then this variant's own
        options = {**done[base]["choices"], "fp16": done[base]["fp16"], **options}
    t0 = time.perf_counter()
    result = dmlopt.optimize(str(source), target=target, retime=False, **options)
    seconds = time.perf_counter() - t0
    if not result.passed:
        raise SystemExit(f"{name}: dmlopt's validation failed (first failing pass: {result.report.broken_by})")
    choices = {c["option"]: c["choice"] for c in result.report.choices}
    explicit = {k: v for k, v in options.items() if k not in ("fp16", "tune")}
    shown = {**choices, **explicit}
    info = {"choices": shown, "fp16": bool(options.get("fp16")),
            "note": f"optimize {seconds:.0f}s; " + (", ".join(f"{k}={v}" for k, v in shown.items()) or "-")}
    dmlopt.save(result.model, path)
    info_path.write_text(json.dumps(info))
    print(f"{name}: {info['note']}", file=sys.stderr, flush=True)
    return {"path": path, **info}


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--runs", type=int, default=40, help="timed runs per model, alternating (default 40)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--work", default=str(ROOT / ".sam_gpu"), help="where the models are written and reused")
    parser.add_argument("--model", help="an exported encoder to use instead of exporting ViT-B")
    parser.add_argument("--small", action="store_true", help="the bundled 64 px SAM (a quick check of the script)")
    parser.add_argument("--no-tune", action="store_true", help="leave out the --tune row (it takes minutes)")
    parser.add_argument("--variants", action="store_true", help="add the default with each --relpos-bias choice")
    parser.add_argument("--prepare-only", action="store_true", help="export and optimize, time nothing")
    parser.add_argument("--export-only", action="store_true", help="export the encoder, nothing else")
    args = parser.parse_args(argv)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.small:
        source = ROOT / "dmlopt" / "data" / "sam_small.onnx"
    elif args.model:
        source = pathlib.Path(args.model)
    else:
        t0 = time.perf_counter()
        source = export_vit_b(work)
        print(f"export: {source} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    if args.export_only:
        return 0
    models = {EXPORT: {"path": source, "note": "as exported"}}
    for name, options in variants(args).items():
        models[name] = optimized(source, work, name, options, args.ep, models)
    if args.prepare_only:
        return 0
    if args.ep == "cuda":
        bench._preload_cuda()
    feeds = runtime.random_inputs(runtime.input_specs(dmlopt.load(str(source))), 0)
    timers: dict[str, bench.Timer] = {}
    loaded = {name: dmlopt.load(str(m["path"])) for name, m in models.items()}
    for name, model in loaded.items():
        timers[name] = bench.Timer(model, args.ep, feeds=feeds, profile=False)
    if args.ep == "cuda":
        for name in [n for n in models if n in ("dmlopt fp16", "dmlopt fp16 tuned")]:
            try:
                timers[name + " + CUDA graph"] = bench.Timer(loaded[name], "cuda", feeds=feeds, cuda_graph=True)
                models[name + " + CUDA graph"] = models[name]
            except dmlopt.DmlOptError as e:
                print(f"{name} + CUDA graph: {e}", file=sys.stderr)
    reference = timers[EXPORT].run_outputs()[0]
    errors = {name: rel_l2(t.run_outputs()[0], reference) for name, t in timers.items()}
    result = bench.alternate(timers, runs=args.runs, warmup=args.warmup, baseline=EXPORT)
    rows = [("variant", "precision", "median ms", "min ms", "p90 ms", "x export", "rel L2 vs export")]
    for name, m in result["models"].items():
        lat = m["latency_ms"]
        precision = "fp16" if "fp16" in name else "fp32"
        rows.append((name, precision, f"{lat['median']:.2f}", f"{lat['min']:.2f}", f"{lat['p90']:.2f}",
                     f"{1.0 / m['ratio_median']:.2f}", f"{errors[name]:.1e}"))
    print(f"SAM encoder {source.name} on {result['provider']} (onnxruntime {runtime.ort().__version__}), "
          f"{args.runs} alternating runs after {args.warmup} warm-up, IO binding "
          f"({timers[EXPORT].io_binding}); x export = median of per-run ratios export/variant")
    print(format_table(rows))
    for name in result["models"]:
        print(f"  {name}: {models[name]['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
