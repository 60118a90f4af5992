"""dmlopt's DirectML defaults measured on a GPU through the real DirectML EP (the Wine host on a GPU's Vulkan).

    DMLOPT_DML_HOST=/root/dmlkit python benchmarks/dml_gpu.py --work DIR [--ort-version 1.31.1] [--runs 20]

Two groups, each model in its own host process (ORT's Windows build under Wine, vkd3d on the GPU's Vulkan
driver), every model of a group timed in two passes (forward, then reversed order) so drift hits all alike;
the figure is the median over both passes' runs, each after two warm-up runs:
  - SAM ViT-B 1024 (dynamic-batch legacy export, random weights): the export, `--target dml` as it is, and
    each dml default changed on its own (attention, window layout, Einsum layout, rel-pos bias, fp16);
  - the 7-layer LeakyRelu CNN (270x480): every --leaky-relu strategy, its Relu twin, ConvTranspose kept.
Each row also gives CPU nodes, copies and compiled partitions from ORT's log, and the output's max |diff|
against the export on ORT's CPU EP.  Variants are written unvalidated (the diff column is their check).
On a software device (lavapipe) the times mean nothing: the script says so and gives no ratio.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.runtime import sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.targets.dml import real_ep  # noqa: E402
from dmlopt.runtime.validate import run as run_cpu  # noqa: E402

SAM_VARIANTS = {
    "dmlopt --target dml": {},
    "  --fp16": {"fp16": True, "fp16_repair": False},
    "  --attention keep": {"attention": "keep"},
    "  --window-layout keep": {"window_layout": "keep"},
    "  --relpos-bias fold": {"relpos_bias": "fold"},
}
CNN_VARIANTS = {f"--leaky-relu {s}": {"passes": ["leaky-relu"], "leaky_relu": s}
                for s in ("keep", "relu-split", "decompose", "conv-split", "channel-fold")}
CNN_VARIANTS["--conv-transpose subpixel"] = {"passes": ["conv-transpose"], "conv_transpose": "subpixel"}


def build(source, variants: dict, ort_version: str, dims) -> dict:
    models = {"export": dmlopt.load(source)}
    for name, options in variants.items():
        t0 = time.perf_counter()
        models[name] = dmlopt.optimize(source, target="dml", ort_version=ort_version, dims=dims, validate=False,
                                       retime=False, **options).model
        print(f"built {name.strip()} in {time.perf_counter() - t0:.0f} s", flush=True)
    return models


def measure(models: dict, ep, feeds, runs: int) -> dict:
    expected = run_cpu(models["export"], feeds)
    out = {name: {"run_ms": []} for name in models}
    order = list(models)
    for pass_order in (order, order[::-1]):
        for name in pass_order:
            r = ep.run(models[name], feeds, warmup=2, runs=runs)
            row = out[name]
            row["run_ms"] += list(r.run_ms)
            p = r.placement
            row.update(cpu_nodes=p["cpu_nodes"], copies=p["copies"], partitions=p["partitions"], session_ms=r.session_ms)
            row["max_abs"] = max(float(np.max(np.abs(r.outputs[k].astype(np.float64) - v)))
                                 for k, v in expected.items())
    for row in out.values():
        row["median_ms"] = statistics.median(row["run_ms"])
        row["min_ms"] = min(row["run_ms"])
    return out


def table(title: str, rows: dict, software: bool) -> None:
    base = rows["export"]["median_ms"]
    t = [("model", "median ms", "min ms", "x export" if not software else "x export (software: none)",
          "CPU nodes", "copies", "partitions", "max |diff| vs export (CPU EP)")]
    for name, r in rows.items():
        t.append((name, f"{r['median_ms']:.2f}", f"{r['min_ms']:.2f}",
                  "-" if software else f"{base / r['median_ms']:.3f}", r["cpu_nodes"], r["copies"],
                  "?" if r["partitions"] is None else r["partitions"], f"{r['max_abs']:.2g}"))
    print(f"\n{title}")
    print(format_table(t), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ort-version", default="1.31.1")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per model per pass (two passes)")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"))
    ap.add_argument("--dml-host", help="host folder (default: $DMLOPT_DML_HOST)")
    ap.add_argument("--cnn-size", default="270x480", help="CNN7 input HEIGHTxWIDTH (default 270x480)")
    ap.add_argument("--skip-sam", action="store_true")
    ap.add_argument("--skip-cnn", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--profile", action="store_true",
                    help="after the SAM table, ORT's profile of dmlopt's SAM on the host (ORT 1.24+)")
    args = ap.parse_args(argv)
    ep = real_ep.resolve(args.dml_host, args.ort_version, required=True, what="this benchmark")
    print(real_ep.host_line(ep.describe()), flush=True)
    software = ep.software
    if software:
        print("SOFTWARE DEVICE: times are CPU emulation, no ratio is given")
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    if not args.skip_cnn:
        from models.cnn import build_cnn, build_cnn_relu

        height, _, width = args.cnn_size.lower().partition("x")
        size = dict(height=int(height), width=int(width), channels=32, alpha=0.1)
        src = work / f"cnn7_{args.cnn_size}.onnx"
        dmlopt.save(dmlopt.load(build_cnn(activation="leaky_relu", **size)), src)
        models = build(str(src), CNN_VARIANTS, ep.version, None)
        models["Relu twin (export)"] = dmlopt.load(build_cnn_relu(**size))
        feeds = runtime.random_inputs(runtime.input_specs(models["export"]), 0)
        results["cnn"] = measure(models, ep, feeds, args.runs)
        table(f"CNN7 {args.cnn_size} on the real DirectML EP, ORT {ep.version}", results["cnn"], software)
    if not args.skip_sam:
        from benchmarks.dml_host import export_vit_b

        src = export_vit_b(work, 1024)
        models = build(str(src), SAM_VARIANTS, ep.version, {"batch": 1})
        feeds = runtime.random_inputs(runtime.input_specs(models["export"], dims={"batch": 1}), 0)
        results["sam"] = measure(models, ep, feeds, args.runs)
        table(f"SAM ViT-B 1024 (dynamic batch export, batch 1) on the real DirectML EP, ORT {ep.version}",
              results["sam"], software)
        if args.profile:  # where DirectML's time goes: CPU-side node times, the compiled partition as one node
            profiled = real_ep.time_model(models["dmlopt --target dml"], ep, runs=5, warmup=2, dims={"batch": 1},
                                          profile=True)
            results["sam_profile"] = profiled.get("profile")
            print("\nprofile of dmlopt --target dml:\n" + real_ep.time_table(profiled), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
