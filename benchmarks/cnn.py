"""The 7-layer LeakyRelu CNN: every LeakyRelu strategy and the sub-pixel ConvTranspose, timed.

    python benchmarks/cnn.py                               # CPU EP, 256x256 and 540x960
    python benchmarks/cnn.py --ep cuda --sizes 256x256,1080x1920 --runs 20

Per input size, one run of ``dmlopt.runtime.bench.compare`` times in alternation (A B ..., then reversed)
the original model, its Relu twin (same layers, Relu: the form DirectML fuses) and each
rewrite, so every ratio comes from rounds timed side by side.  "vs original" is the median of
the per-round ratios to the original, "vs Relu twin" the median of the per-round ratios to the
twin.  Every rewritten model is validated against the original on the CPU EP first (skip with
--no-validate).  Neither the CPU EP nor the CUDA EP is DirectML: the CPU EP fuses LeakyRelu into
its Conv and the CUDA EP fuses no activation at all, so these figures show what each rewrite
costs where fusion does not reward it; on DirectML measure with ``dmlopt optimize --tune``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.graph.check import op_counts  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from models.cnn import build_cnn, build_cnn_relu  # noqa: E402

ORIGINAL, TWIN = "original (LeakyRelu)", "Relu twin"
# label -> dmlopt.optimize keywords
VARIANTS = {
    "leaky: decompose": dict(passes=["leaky-relu"], leaky_relu="decompose"),
    "leaky: relu-split": dict(passes=["leaky-relu"], leaky_relu="relu-split"),
    "leaky: conv-split": dict(passes=["leaky-relu"], leaky_relu="conv-split"),
    "leaky: channel-fold": dict(passes=["leaky-relu"], leaky_relu="channel-fold"),
    "convT: subpixel": dict(passes=["conv-transpose"], conv_transpose="subpixel"),
    "conv-split + subpixel": dict(passes=["leaky-relu", "conv-transpose"], leaky_relu="conv-split",
                                                conv_transpose="subpixel"),
}


def parse_size(text: str) -> tuple[int, int]:
    height, sep, width = text.lower().partition("x")
    if not sep or not height.isdigit() or not width.isdigit() or int(height) < 1 or int(width) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: expected HEIGHTxWIDTH, e.g. 540x960")
    return int(height), int(width)


def build_models(height: int, width: int, args) -> dict:
    kwargs = dict(alpha=args.alpha, channels=args.channels, height=height, width=width)
    original = dmlopt.load(build_cnn(activation="leaky_relu", **kwargs))
    models = {ORIGINAL: original, TWIN: dmlopt.load(build_cnn_relu(**kwargs))}
    for label, options in VARIANTS.items():
        result = dmlopt.optimize(original, target=args.ep, validate=not args.no_validate, **options)
        if not result.passed:
            raise SystemExit(f"{label} at {height}x{width} does not match the original:\n"
                             f"{result.report.to_table()}")
        models[label] = result.model
    return models


def ratio_to(result: dict, name: str, reference: str) -> float:
    """Median over rounds of name's time / reference's time (both were timed against the baseline)."""
    mine, theirs = result["models"][name]["ratios"], result["models"][reference]["ratios"]
    return statistics.median(a / b for a, b in zip(mine, theirs))


def rows_for(size: str, models: dict, result: dict) -> list[tuple]:
    rows = []
    for name, model in models.items():
        m = result["models"][name]
        counts = op_counts(model)
        ops = ", ".join(f"{op} {n}" for op, n in counts.items() if op != "Constant")
        rows.append((size, name, f"{m['latency_ms']['median']:.2f}", f"{m['ratio_median']:.3f}",
                     f"{ratio_to(result, name, TWIN):.3f}", ops))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", choices=("cpu", "cuda"), default="cpu", help="execution provider (default cpu)")
    parser.add_argument("--sizes", default="256x256,540x960",
                        help="comma-separated HEIGHTxWIDTH input sizes (default 256x256,540x960; 1080x1920 on a GPU)")
    parser.add_argument("--runs", type=int, default=10, help="timed rounds per size (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--channels", type=int, default=32, help="CNN width (default 32)")
    parser.add_argument("--alpha", type=float, default=0.1, help="LeakyRelu alpha (default 0.1)")
    parser.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                        help="provider option, e.g. cudnn_conv_algo_search=HEURISTIC (repeatable)")
    parser.add_argument("--no-validate", action="store_true", help="skip checking the rewrites against the original")
    args = parser.parse_args(argv)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    target = runtime.resolve_ep(args.ep)  # a missing provider is an error, never a CPU run
    provider_options = bench.parse_provider_options(target, args.provider_option)

    rows = [("size", "model", "median ms", "vs original", "vs Relu twin", "compute nodes")]
    provider = None
    for height, width in sizes:
        models = build_models(height, width, args)
        result = bench.compare(models, target, runs=args.runs, warmup=args.warmup, baseline=ORIGINAL,
                               provider_options=provider_options or None)
        provider = result["provider"]
        rows += rows_for(f"{height}x{width}", models, result)
    ort = runtime.ort()
    print(f"7-layer CNN ({args.channels} channels, LeakyRelu alpha {args.alpha}, output 2x the input) on {provider}"
          f" (onnxruntime {ort.__version__}, {os.cpu_count()} CPUs{', ' + str(provider_options) if provider_options else ''});"
          f" {args.runs} alternating rounds after {args.warmup} warm-up; ratios are medians of per-round ratios")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
