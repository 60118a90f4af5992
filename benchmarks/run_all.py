"""Reproduce the README's performance table: every bundled model, before/after, on each provider here.

    python benchmarks/run_all.py                 # CPU EP always, CUDA EP too when onnxruntime-gpu is here
    python benchmarks/run_all.py --markdown      # the table as README markdown
    python benchmarks/run_all.py --only-table    # skip the per-topic scripts (cnn.py, freeze.py, attention.py)

For each bundled model the optimizer runs once for ``--target dml --ort-version 1.14`` (what a
user ships to the oldest runtime the placement model knows), then,
per provider, the original and the optimized model are timed in alternation in this one run
(``dmlopt.runtime.bench.compare``): the speedup is the median of the per-pair ratios, never two medians
taken apart.  Copies are counted from ORT's profile on that provider; "DML 1.14 CPU/copies" is
the placement model's prediction for DirectML in ORT 1.14 (no DirectML on Linux).  With CUDA
present, the dynamic SAM is also timed as DirectML 1.14 would split it (``--emulate``): CPU
parts on the CPU EP, the rest on CUDA, copies between them.  Then the per-topic scripts in this
folder run with ``--ep`` for each provider and print their own tables.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.targets.dml import emulate
from dmlopt.cli.demo import bundled_path  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402

PREDICT_ORT = "1.14"
# label, bundled file, dmlopt.optimize keywords (besides target="dml")
CASES = (
    ("cnn-leaky", "cnn_leaky.onnx", {}),
    ("cnn-leaky fp16", "cnn_leaky.onnx", {"fp16": True}),
    ("sam-small", "sam_small.onnx", {}),
    ("sam-small fp16", "sam_small.onnx", {"fp16": True}),
    ("sam-small-dynamic", "sam_small_dynamic.onnx", {"dims": {"batch": 1}}),
)
SCRIPTS = ("cnn.py", "freeze.py", "attention.py")
HEAD = ("model", "provider", "nodes", f"DML {PREDICT_ORT} CPU nodes", f"DML {PREDICT_ORT} copies", "copies",
        "before ms", "after ms", "speedup", "max rel err")


def predicted(model) -> tuple[int, int] | None:
    try:
        from dmlopt.targets.dml import placement
    except ImportError:
        return None
    p = placement.predict(model, ort_version=PREDICT_ORT)
    return p.cpu_count, p.copy_count


def pair(before, after) -> str:
    return "-" if before is None or after is None else f"{before} -> {after}"


def optimize_cases(say) -> list[tuple[str, object, object, dict]]:
    """(label, original, optimized, keywords) for every bundled model that exists."""
    out = []
    for label, filename, options in CASES:
        path = bundled_path(filename)
        if not path.is_file():
            say(f"skip {label}: {path} not built (python models/build_bundled.py)")
            continue
        original = dmlopt.load(path)
        # Optimized for the runtime whose placement the table predicts (MultiHeadAttention, say,
        # is fused only where that DirectML registers it).
        result = dmlopt.optimize(original, target="dml", ort_version=PREDICT_ORT, retime=False, **options)
        if not result.passed:
            raise SystemExit(f"{label}: the optimized model does not match the original:\n"
                             f"{result.report.to_table()}")
        out.append((label, original, result, options))
    return out


def table_rows(cases, target: str, runs: int, warmup: int, say) -> list[tuple]:
    rows = []
    for label, original, result, options in cases:
        say(f"timing {label} on {target}")
        dims = options.get("dims")
        timing = bench.retime(original, result.model, target, dims=dims, runs=runs, warmup=warmup)
        nodes = (result.report.input["nodes"], result.report.output["nodes"])
        before_p, after_p = predicted(original), predicted(result.model)
        worst = max(o["max_rel"] for o in result.report.validation["outputs"])
        rows.append((label, timing["provider"].replace("ExecutionProvider", ""), pair(*nodes),
                     pair(before_p and before_p[0], after_p and after_p[0]),
                     pair(before_p and before_p[1], after_p and after_p[1]),
                     pair(timing["copies_before"], timing["copies_after"]),
                     f"{timing['before_ms']:.3f}", f"{timing['after_ms']:.3f}", f"x{timing['speedup']:.2f}",
                     f"{worst:.1e}"))
    return rows


def emulated_rows(cases, runs: int, warmup: int, say) -> list[tuple]:
    """The dynamic SAM as DirectML 1.14 would split it, GPU parts on CUDA: before and after."""
    rows = []
    for label, original, result, options in cases:
        if "dynamic" not in label:
            continue
        say(f"timing {label} as emulated DirectML {PREDICT_ORT}")
        dims = options.get("dims")
        b = emulate.time_emulated(original, f"dml-{PREDICT_ORT}", runs=runs, warmup=warmup, dims=dims, gpu_target="cuda")
        a = emulate.time_emulated(result.model, f"dml-{PREDICT_ORT}", runs=runs, warmup=warmup, dims=dims,
                                gpu_target="cuda")
        before_ms, after_ms = b["latency_ms"]["median"], a["latency_ms"]["median"]
        rows.append((label, f"emulated DML {PREDICT_ORT} on CUDA", "-", pair(b["predicted_cpu_nodes"],
                     a["predicted_cpu_nodes"]), pair(b["predicted_copies"], a["predicted_copies"]),
                     pair(b["copies"], a["copies"]), f"{before_ms:.3f}", f"{after_ms:.3f}",
                     f"x{before_ms / after_ms:.2f} (medians)", "-"))
    return rows


def markdown(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join("---" for _ in rows[0]) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def run_scripts(targets: list[str], say) -> int:
    failures = 0
    for script in SCRIPTS:
        path = ROOT / "benchmarks" / script
        if not path.is_file():
            say(f"skip {script}: not in benchmarks/")
            continue
        usage = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True)
        # A script without --ep times on the CPU EP only: run it once.
        commands = ([["--ep", t] for t in targets] if "--ep" in usage.stdout else [[]])
        for extra in commands:
            title = " ".join([script, *extra])
            print(f"\n## {title}\n", flush=True)
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, str(path), *extra], cwd=ROOT)
            if done.returncode:
                failures += 1
                print(f"{title}: exit {done.returncode}", file=sys.stderr)
            say(f"{title}: {time.perf_counter() - t0:.0f} s")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="alternating pairs per model (default 20)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (README)")
    parser.add_argument("--only-table", action="store_true", help="do not run the per-topic scripts")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    say = (lambda *a: None) if args.quiet else (lambda *a: print("run_all:", *a, file=sys.stderr, flush=True))
    targets = ["cpu"] + (["cuda"] if runtime.has_target("cuda") else [])
    cases = optimize_cases(say)
    rows = [HEAD]
    for target in targets:
        rows += table_rows(cases, target, args.runs, args.warmup, say)
    if "cuda" in targets:
        rows += emulated_rows(cases, args.runs, args.warmup, say)
    ort = runtime.ort()
    print(f"dmlopt {dmlopt.__version__}, onnxruntime {ort.__version__}, {os.cpu_count()} CPUs; models optimized "
          f"with --target dml --ort-version {PREDICT_ORT}; {args.runs} alternating pairs after {args.warmup} warm-up per model and provider; "
          f"speedup = median of per-pair ratios (before/after)")
    print(markdown(rows) if args.markdown else format_table(rows))
    if args.only_table:
        return 0
    return 1 if run_scripts(targets, say) else 0


if __name__ == "__main__":
    sys.exit(main())
