"""Export vs dmlopt on the WebGPU EP: the CNN7 pair with every LeakyRelu strategy, SAM small, SAM ViT-B.

    python benchmarks/webgpu.py                      # CNN7 (256x256) and the bundled small SAM
    python benchmarks/webgpu.py --vit-b --runs 10    # + SAM ViT-B 1024 (exported here: minutes)

Every group is one run of ``dmlopt.runtime.bench.compare`` on WebGpuExecutionProvider: the models timed in
alternation (A B ..., then reversed), ratios are medians of per-round ratios to the group's
baseline (the export), outputs read back to the host so a run includes the GPU's work.  Beside the
times: the nodes ORT runs on each provider and its CPU<->GPU copies (measured from the EP's log),
and each output's relative L2 distance on the EP from the export's output on the CPU EP, which is
where a kernel that computes differently on this adapter shows (``--target dml`` writes
MultiHeadAttention at 64 tokens, which lavapipe computes wrongly; ``--target webgpu`` declines it).

The adapter is named first.  On a software adapter (Mesa's lavapipe) the times are printed under
that label and mean nothing about a GPU: placement, copies and numerics are the results there.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.runtime.validate import run as run_model  # noqa: E402
from dmlopt.runtime import vulkan as adapter  # noqa: E402
from dmlopt.targets.webgpu import placement  # noqa: E402
from models.cnn import build_cnn, build_cnn_relu  # noqa: E402

EXPORT = "export"
TWIN = "Relu twin (export)"
OTHER_MODELS = {TWIN}  # not the export rewritten: no distance to the export's output
LEAKY_STRATEGIES = ("decompose", "relu-split", "conv-split", "channel-fold")


def rel_l2(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def optimized(model, label: str, **options):
    result = dmlopt.optimize(model, retime=False, **options)
    if not result.passed:
        raise SystemExit(f"{label}: dmlopt's validation failed:\n{result.report.to_table()}")
    return result.model


def cnn_group(args) -> dict:
    size = dict(height=args.cnn_size[0], width=args.cnn_size[1], channels=32, alpha=0.1)
    original = dmlopt.load(build_cnn(activation="leaky_relu", **size))
    models = {EXPORT: original, TWIN: dmlopt.load(build_cnn_relu(**size)),
              "dmlopt --target webgpu": optimized(original, "cnn webgpu", target="webgpu")}
    for strategy in LEAKY_STRATEGIES:
        models[f"leaky-relu={strategy}"] = optimized(original, strategy, target="webgpu", leaky_relu=strategy)
    return models


def sam_group(source: pathlib.Path, args) -> dict:
    export = dmlopt.load(str(source))
    models = {EXPORT: export, "dmlopt --target webgpu": optimized(export, "sam webgpu", target="webgpu")}
    if not args.no_dml_row:
        models["dmlopt --target dml (run on WebGPU)"] = optimized(export, "sam dml", target="dml")
    return models


def report(title: str, models: dict, args) -> None:
    feeds = runtime.random_inputs(runtime.input_specs(models[EXPORT]), 0)
    reference = next(iter(run_model(models[EXPORT], feeds).values()))
    result = bench.compare(models, "webgpu", runs=args.runs, warmup=args.warmup, baseline=EXPORT,
                           feeds=feeds)
    software = runtime.timing_refusal("webgpu") is not None
    rows = [("model", "median ms" + (" (software)" if software else ""), "x export" + (" (software)" if software else ""),
             "nodes on WebGPU", "on CPU", "copies", "rel L2 vs CPU EP", "rel L2 vs export")]
    for name, model in models.items():
        m = result["models"][name]
        measured = placement.measure(model)
        counts = measured.get("nodes_by_provider", {})
        got = next(iter(run_model(model, feeds, target="webgpu").values()))
        own = next(iter(run_model(model, feeds).values()))  # the same model on the CPU EP
        rows.append((name, f"{m['latency_ms']['median']:.2f}", f"{1.0 / m['ratio_median']:.3f}",
                     counts.get("WebGpuExecutionProvider", 0), counts.get("CPUExecutionProvider", 0),
                     len(measured.get("copies", [])), f"{rel_l2(got, own):.1e}",
                     "- (another model)" if name in OTHER_MODELS else f"{rel_l2(got, reference):.1e}"))
    print(f"\n{title}: {args.runs} alternating rounds after {args.warmup} warm-up, float32; x export = median of "
          "per-round ratios export/model; rel L2: the output on the WebGPU EP against the same model on the CPU EP, "
          "and against the export on the CPU EP")
    print(format_table(rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed rounds per group (default 10)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--cnn-size", default="256x256", help="CNN7 input HEIGHTxWIDTH (default 256x256)")
    parser.add_argument("--vit-b", action="store_true", help="also SAM ViT-B 1024 (exports it into --work)")
    parser.add_argument("--work", default=str(ROOT / ".sam_gpu"), help="where ViT-B is exported and reused")
    parser.add_argument("--no-dml-row", action="store_true", help="leave out the --target dml model on WebGPU")
    args = parser.parse_args(argv)
    height, _, width = args.cnn_size.lower().partition("x")
    args.cnn_size = (int(height), int(width))
    runtime.resolve_ep("webgpu")  # exit with the reason where the EP cannot run
    chosen, why = adapter.chosen()
    ort = runtime.ort()
    print(f"WebGPU EP: onnxruntime {ort.__version__}, plug-in {runtime.webgpu_host.plugin_version()}, adapter "
          f"{chosen.line() if chosen else 'unknown (' + why + ')'}")
    offered = runtime.webgpu_host.offered_how(ort)
    if offered:
        print(offered)
    refusal = runtime.timing_refusal("webgpu")
    if refusal:
        print(f"SOFTWARE ADAPTER: {refusal}. The times below are CPU emulation, printed for completeness only.")
    report(f"CNN7 {args.cnn_size[0]}x{args.cnn_size[1]}, every LeakyRelu strategy", cnn_group(args), args)
    report("SAM small (bundled, 64 px)", sam_group(ROOT / "dmlopt" / "data" / "sam_small.onnx", args), args)
    if args.vit_b:
        from benchmarks.sam_gpu import export_vit_b

        work = pathlib.Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        report("SAM ViT-B 1024", sam_group(export_vit_b(work), args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
