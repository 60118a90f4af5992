"""Memory and time of `dmlopt optimize` on a SAM ViT-B encoder, against onnxscript's optimizer.

    python benchmarks/memory.py                     # SAM ViT-B, 1024 px, random weights (as exported)
    python benchmarks/memory.py --img-size 256      # ViT-B's weights at 256 px (quicker export, same weights)
    python benchmarks/memory.py --tuning            # timing and --tune on a wide CNN (models/cnn.py)

The encoder is Meta's ImageEncoderViT with ViT-B's sizes and seeded random weights, exported
with the TorchScript exporter (models/sam_encoder.py).  Each row runs in a fresh subprocess:
load, optimize, save.  Peak memory is that process's peak RSS (``getrusage``, imports included);
time is from the call to the end of the save (imports excluded).  Rows:
  - `dmlopt optimize` (default target dml, validation on ORT's CPU EP),
  - `dmlopt optimize --no-validate`,
  - ``onnx.load`` + ``onnxscript.optimizer.optimize`` + ``onnx.save`` (the baseline),
  - ORT alone: a bare InferenceSession of the input, then of dmlopt's output, run once each on
    seeded random inputs (CPU EP, ORT's rewrites off, as validation runs them).
Ratios: peak RSS to the model file's bytes, time to the onnxscript row of the same run.  The
validation criterion: what dmlopt adds on top of ORT's own peak for the larger of the two models
("x model above ORT"), which is the memory a caller that validates pays for dmlopt.
Validation runs the original and the rewritten encoder on ORT: at 1024 px the activations
of the attention blocks (12 x 4096 x 4096 floats each) are part of that peak.

``--tuning``: the timing sessions instead, on models/cnn.py's CNN with `--channels` (512: 47 MB of
Conv weights, 32 x 32 px so activations are small; its LeakyRelu has 5 strategies to tune):
`dmlopt optimize --target cpu` (validation, then the input and the output timed in alternation)
and `... --tune` (every candidate of an option timed together).  Peak is the growth of the
process's peak RSS during the call (VmHWM reset after the imports), as a multiple of the model.
"""

from __future__ import annotations

import argparse
import os
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = {
    "dmlopt optimize": ["--no-time"],
    "dmlopt optimize --no-validate": ["--no-time", "--no-validate"],
    "onnxscript optimizer": None,
}
ORT_ROWS = ("ORT alone: input", "ORT alone: dmlopt's output")
TUNING_ROWS = {
    "dmlopt optimize --target cpu": ["--target", "cpu"],
    "dmlopt optimize --target cpu --tune": ["--target", "cpu", "--tune"],
}


def status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def tuning_worker(row: str, source: str, dest: str) -> dict:
    """One tuning row: the peak's growth during the call (Linux: VmHWM reset after the imports)."""
    from dmlopt.cli import commands as cli

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    code = cli.main(["optimize", source, "-o", dest, "-q", *TUNING_ROWS[row]])
    if code != 0:
        raise SystemExit(f"dmlopt optimize exited {code}")
    return {"seconds": time.perf_counter() - t0, "peak_bytes": (status_kb("VmHWM") - base) * 1024}


def worker(row: str, source: str, dest: str) -> dict:
    """Run one row in this (fresh) process; its time and this process's peak RSS."""
    if row in TUNING_ROWS:
        return tuning_worker(row, source, dest)
    if row in ORT_ROWS:
        t0 = time.perf_counter()
        ort_alone(source)
    elif ROWS[row] is None:
        import onnx
        import onnxscript

        t0 = time.perf_counter()
        proto = onnxscript.optimizer.optimize(onnx.load(source))
        onnx.save(proto, dest)
    else:
        from dmlopt.cli import commands as cli

        t0 = time.perf_counter()
        code = cli.main(["optimize", source, "-o", dest, "-q", *ROWS[row]])
        if code != 0:
            raise SystemExit(f"dmlopt optimize exited {code}")
    seconds = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    return {"seconds": seconds, "peak_bytes": peak_kb * 1024}


def ort_alone(path: str) -> None:
    """A bare InferenceSession of the file, run once: ORT's own peak, nothing of dmlopt loaded."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    feeds = {}
    for i in sess.get_inputs():
        if i.type not in types or not all(isinstance(d, int) for d in i.shape):
            raise SystemExit(f"input {i.name}: {i.type} {i.shape}: only static float inputs are generated")
        feeds[i.name] = rng.standard_normal(i.shape).astype(types[i.type])
    sess.run(None, feeds)


def export(folder: pathlib.Path, img_size: int) -> pathlib.Path:
    from models import sam_encoder

    b = sam_encoder.VARIANTS["vit_b"]
    return sam_encoder.export_small(folder / f"sam_vit_b_{img_size}.onnx", img_size=img_size,
                                    patch_size=b.patch_size, embed_dim=b.embed_dim, depth=b.depth,
                                    num_heads=b.num_heads, window_size=b.window_size,
                                    global_attn_indexes=b.global_attn_indexes, out_chans=b.out_chans)


def run_row(row: str, source: pathlib.Path, dest: pathlib.Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", row, str(source), str(dest)],
                          capture_output=True, text=True, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{row} failed: {tail}")
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        print("RESULT " + json.dumps(worker(*argv[1:4])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img-size", type=int, default=1024, help="image size of the encoder (default 1024)")
    parser.add_argument("--model", help="an existing .onnx to measure instead of exporting one")
    parser.add_argument("--tuning", action="store_true", help="the timing sessions: a wide CNN, timed and tuned")
    parser.add_argument("--channels", type=int, default=512, help="the CNN's width with --tuning (default 512)")
    args = parser.parse_args(argv)

    from dmlopt.runtime.validate import format_table

    if args.tuning:
        return tuning(args.channels, format_table)

    with tempfile.TemporaryDirectory(prefix="dmlopt_memory_bench.") as tmp:
        folder = pathlib.Path(tmp)
        t0 = time.perf_counter()
        source = pathlib.Path(args.model) if args.model else export(folder, args.img_size)
        exported = time.perf_counter() - t0
        size = source.stat().st_size
        results = {row: run_row(row, source, folder / f"out{i}.onnx") for i, row in enumerate(ROWS)}
        results[ORT_ROWS[0]] = run_row(ORT_ROWS[0], source, folder / "unused.onnx")
        validated = folder / f"out{list(ROWS).index('dmlopt optimize')}.onnx"  # what validation ran against the input
        results[ORT_ROWS[1]] = run_row(ORT_ROWS[1], validated, folder / "unused.onnx")
    base = results["onnxscript optimizer"]["seconds"]
    ort_peak = max(results[row]["peak_bytes"] for row in ORT_ROWS)
    rows = [("run", "seconds", "x onnxscript time", "peak RSS MB", "x model bytes", "x model above ORT")]
    for row, r in results.items():
        above = f"{(r['peak_bytes'] - ort_peak) / size:.2f}" if row == "dmlopt optimize" else ""
        rows.append((row, f"{r['seconds']:.2f}", f"{r['seconds'] / base:.2f}" if row not in ORT_ROWS else "",
                     f"{r['peak_bytes'] / 1e6:.0f}", f"{r['peak_bytes'] / size:.2f}", above))

    print(f"model: {source.name if args.model else f'SAM ViT-B {args.img_size} px, random weights'}, "
          f"{size / 1e6:.1f} MB ({'given' if args.model else f'exported in {exported:.0f} s'}); "
          f"{os.cpu_count()} CPUs")
    print(format_table(rows))
    return 0


def tuning(channels: int, format_table) -> int:
    import onnx

    from models.cnn import build_cnn

    with tempfile.TemporaryDirectory(prefix="dmlopt_memory_bench.") as tmp:
        source = pathlib.Path(tmp) / "cnn.onnx"
        onnx.save(build_cnn(channels=channels, height=32, width=32), source)
        size = source.stat().st_size
        results = {row: run_row(row, source, pathlib.Path(tmp) / f"out{i}.onnx") for i, row in enumerate(TUNING_ROWS)}
    rows = [("run", "seconds", "peak RSS growth MB", "x model bytes")]
    for row, r in results.items():
        rows.append((row, f"{r['seconds']:.1f}", f"{r['peak_bytes'] / 1e6:.0f}", f"{r['peak_bytes'] / size:.2f}"))
    print(f"model: models/cnn.py build_cnn(channels={channels}, height=32, width=32), {size / 1e6:.1f} MB; "
          f"{os.cpu_count()} CPUs")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
