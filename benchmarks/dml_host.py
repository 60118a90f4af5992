"""SAM ViT-B with a dynamic batch on the real DirectML EP (Wine host): the export against dmlopt's output.

The seed's story, measured on the real provider instead of predicted: before ORT 1.19 (#21114) the
DirectML EP runs SAM's relative-position Einsums on the CPU, so the export is split into many
partitions with copies between them.  This exports Meta's ImageEncoderViT (ViT-B, seeded random
weights, legacy TorchScript exporter, opset 17, dynamic batch; models/sam_encoder.py), runs it on
the real DirectML EP of --ort-version, runs `dmlopt optimize --target dml --ort-version V --dim
batch=1` and runs the output there too, and prints for both: CPU nodes, copies, compiled
partitions, max |diff| against the export on ORT's CPU EP, session creation and run time.

The host is software (lavapipe) on machines without a GPU: placement and numerics are DirectML's
own, the times are not GPU times, so no speed ratio is printed for a software device.

    DMLOPT_DML_HOST=/tmp/dmlkit python benchmarks/dml_host.py                 # ViT-B, 512 px, ORT 1.17.3
    DMLOPT_DML_HOST=/tmp/dmlkit python benchmarks/dml_host.py --small         # the bundled 64 px SAM
    DMLOPT_DML_HOST=/tmp/dmlkit python benchmarks/dml_host.py --ort-version 1.19.2 --img-size 1024

Memory: a DirectML session under lavapipe holds GBs (ViT-B 512: ~3.5 GB; up to ~9 GB for the export
split into many partitions at 1.17.3/1.19.2).  One model per child process, each in turn.
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
from dmlopt.runtime import sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.targets.dml import real_ep  # noqa: E402
from dmlopt.runtime.validate import run as run_cpu  # noqa: E402


def export_vit_b(work: pathlib.Path, img_size: int) -> pathlib.Path:
    from models import sam_encoder

    path = work / f"sam_vit_b_{img_size}_dynamic.onnx"
    if path.exists():
        return path
    b = sam_encoder.VARIANTS["vit_b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sam_encoder.export_small(path.with_suffix(".tmp"), dynamic_batch=True, img_size=img_size,
                                 patch_size=b.patch_size, embed_dim=b.embed_dim, depth=b.depth,
                                 num_heads=b.num_heads, window_size=b.window_size,
                                 global_attn_indexes=b.global_attn_indexes, out_chans=b.out_chans)
    path.with_suffix(".tmp").rename(path)
    return path


def measure(model, ep, feeds, expected, runs: int) -> dict:
    t0 = time.perf_counter()
    result = ep.run(model, feeds, runs=runs)
    wall = time.perf_counter() - t0
    diff = max(float(np.max(np.abs(result.outputs[k].astype(np.float64) - v))) for k, v in expected.items())
    scale = max(float(np.max(np.abs(v))) for v in expected.values())
    p = result.placement
    return {"cpu_nodes": p["cpu_nodes"], "copies": p["copies"], "partitions": p["partitions"],
            "cpu_ops": p["cpu_ops"], "max_abs_vs_cpu_ep": diff, "max_rel_vs_cpu_ep": diff / max(scale, 1e-30),
            "session_ms": result.session_ms, "run_ms": result.run_ms, "wall_s": wall, "host": result.host}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ort-version", default="1.17.3")
    ap.add_argument("--img-size", type=int, default=512)
    ap.add_argument("--small", action="store_true", help="the bundled 64 px SAM (dynamic batch) instead of ViT-B")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"), help="exports and outputs are cached here")
    ap.add_argument("--dml-host", help="host folder (default: $DMLOPT_DML_HOST)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    ep = real_ep.resolve(args.dml_host, args.ort_version, required=True, what="this benchmark")
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = (pathlib.Path(dmlopt.__file__).parent / "data" / "sam_small_dynamic.onnx" if args.small
              else export_vit_b(work, args.img_size))
    print(f"model: {source.name}; {real_ep.host_line(ep.describe())}", flush=True)

    t0 = time.perf_counter()
    result = dmlopt.optimize(source, target="dml", ort_version=ep.version, dims={"batch": 1}, retime=False,
                             validate=True, dml_host=ep.host.root if ep.host else None)
    optimize_s = time.perf_counter() - t0
    if not result.passed:
        print(result.report.to_table())
        print("dmlopt's output failed validation: nothing measured", file=sys.stderr)
        return 1
    export = dmlopt.load(source)
    feeds = runtime.random_inputs(runtime.input_specs(export, dims={"batch": 1}))
    expected = run_cpu(export, feeds)
    rows = {"export": measure(export, ep, feeds, expected, args.runs)}
    print("export measured", flush=True)
    rows["dmlopt"] = measure(result.model, ep, feeds, expected, args.runs)

    software = ep.software
    table = [("model", "CPU nodes", "copies", "DML partitions", "max |diff| vs CPU EP", "max rel",
              "session (s)", "run (s)")]
    for name, r in rows.items():
        table.append((name, r["cpu_nodes"], r["copies"], "?" if r["partitions"] is None else r["partitions"],
                      f"{r['max_abs_vs_cpu_ep']:.3g}", f"{r['max_rel_vs_cpu_ep']:.3g}", f"{r['session_ms'] / 1e3:.1f}",
                      "/".join(f"{t / 1e3:.1f}" for t in r["run_ms"])))
    print(format_table(table))
    print(f"export's CPU ops: {rows['export']['cpu_ops'] or 'none'}")
    print(f"dmlopt optimize: {optimize_s:.1f} s (includes its CPU-EP and real-EP validation)")
    if software:
        print("times are software rendering: not GPU speed (no ratio is given)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"model": source.name, "ort_version": ep.version,
                                                       "rows": rows, "optimize_s": optimize_s}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
