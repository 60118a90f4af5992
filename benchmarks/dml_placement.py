"""Predicted vs real DirectML placement, per model and ORT version (the real EP under Wine).

    python -m benchmarks.dml_placement --kit /tmp/dmlkit                     # bundled models + dmlopt's outputs
    python -m benchmarks.dml_placement --kit /tmp/dmlkit --models a.onnx b.onnx --versions 1.19.2
    python -m benchmarks.dml_placement --kit /tmp/dmlkit --json out.json      # also the rows as JSON

Why: the placement model (dmlopt.targets.dml.placement) is only worth its tables if it equals the
real EP; this prints, for every model and version, the CPU nodes, Memcpy nodes and compiled DML
partitions (DmlFusedNode_*) that dmlopt predicts and that ORT's verbose log shows, and the
verdict first.  No timing: the kit renders on lavapipe (software), so nothing here is a speed claim.
By default the models are the bundled ones and dmlopt's optimized outputs of them (tests/measured/).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import onnx_ir as ir

from dmlopt.targets.dml import placement
from models.dml_real import KIT_SCRIPT, KIT_VERSIONS, run_real

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUNDLED = [ROOT / "dmlopt" / "data" / f"{m}.onnx" for m in ("sam_small", "sam_small_dynamic", "cnn_leaky", "cnn_relu")]
OPTIMIZED = sorted((ROOT / "tests" / "measured").glob("*.onnx"))
KEYS = ("cpu", "copies", "partitions")


def predicted_counts(model: ir.Model, version: str, prepared) -> dict:
    p = placement.predict(model, ort_version=version, prepared=prepared)
    return {"cpu": p.cpu_count, "copies": p.copy_count, "partitions": p.partitions["count"],
            "standalone": p.partitions["standalone_dml_kernels"], "table": p.data_source,
            "measured_table": p.measured_table}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", required=True, help="dml-wine host folder (setup.sh DEST)")
    ap.add_argument("--script", default=KIT_SCRIPT, help="the kit's run.sh")
    ap.add_argument("--versions", nargs="+", default=list(KIT_VERSIONS))
    ap.add_argument("--models", nargs="+", type=pathlib.Path, default=BUNDLED + OPTIMIZED)
    ap.add_argument("--logs", type=pathlib.Path, help="keep the ORT logs here (default: a temp folder)")
    ap.add_argument("--json", type=pathlib.Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    logs = args.logs or pathlib.Path(tempfile.mkdtemp(prefix="dml-placement-"))
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in args.models:
        model = ir.load(path)
        prepared = placement.prepare(model)
        for version in args.versions:
            pred = predicted_counts(model, version, prepared)
            try:
                real = run_real(args.kit, version, path, logs / f"{path.stem}-{version}.log", args.script)
            except (RuntimeError, OSError) as e:
                real = {"error": str(e)}
            agree = "error" not in real and all(pred[k] == real[k] for k in KEYS)
            rows.append({"model": path.name, "version": version, "predicted": pred, "real": real, "agree": agree})
            print(f"  {path.name} {version}: {'agree' if agree else 'DIFFER'}", file=sys.stderr)
    agreed = sum(r["agree"] for r in rows)
    print(f"placement prediction equals the real DirectML EP in {agreed}/{len(rows)} (model, version) pairs "
          f"(CPU nodes, Memcpy nodes, compiled partitions; graph fusion on)")
    print(f"{'model':32} {'ORT':7} {'table':18} {'CPU pred/real':>14} {'copies':>10} {'partitions':>11} "
          f"{'standalone':>11}  verdict")
    for r in rows:
        p, q = r["predicted"], r["real"]
        if "error" in q:
            print(f"{r['model']:32} {r['version']:7} {p['table']:18} real run failed: {q['error']}")
            continue
        cells = [f"{p[k]}/{q[k]}" for k in (*KEYS, "standalone")]
        print(f"{r['model']:32} {r['version']:7} {p['table']:18} {cells[0]:>14} {cells[1]:>10} {cells[2]:>11} "
              f"{cells[3]:>11}  {'agree' if r['agree'] else 'DIFFER'}")
    print("standalone: DML nodes outside compiled partitions (not compared: ORT's level-2 fusions after "
          "partitioning change their number); real runs: onnxruntime-node under Wine, vkd3d, lavapipe")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if agreed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
