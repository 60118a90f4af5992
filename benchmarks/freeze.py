"""Freezing dynamic axes: dmlopt's freeze-shapes (+ linear-gemm) against onnxsim and onnxslim.

    python benchmarks/freeze.py                    # small SAM (TorchScript), SAM via dynamo, CNN
    python benchmarks/freeze.py --rounds 9 --medium   # adds a wider/deeper SAM (256x256 image)

Every tool gets the same dynamic-batch model and the same static input shape (batch 1).  Each
tool runs in its own subprocess, after a warm-up run on a one-node model (so imports count in
neither time nor memory); peak memory is the growth of the process's peak RSS during the
optimization (VmHWM reset just before, C++ allocations included); then, in this process:
node count (all nodes, and compute nodes without Constant), Shape/Size nodes and values with a
dynamic dim left, the file size, ORT session creation time on the CPU EP (the tools' outputs
created in alternation, ``--rounds`` times, median; wall time and process CPU time, the
latter steadier on a busy machine), and the numerics of each output against the
original (ORT CPU, ORT rewrites off).  Ratios are to dmlopt's figure in the same run.

onnxsim and onnxslim are not dependencies of dmlopt: install them for this script only
(``pip install onnxsim onnxslim``); a tool that is missing is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOOLS = ("dmlopt", "onnxsim", "onnxslim")
# freeze-shapes, then linear-gemm (MatMul + bias -> Gemm, which onnxsim/onnxslim also do)
DMLOPT_PASSES = ["freeze-shapes", "linear-gemm"]


# ** the worker: one tool, one model, in its own process **

def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak_rss() -> None:
    """Set the process's peak RSS (VmHWM) back to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _prepare(tool: str, source: str, dest: str, input_name: str, shape: list[int]):
    """Load `source` for `tool`; return (optimize, save) closures."""
    import onnx

    if tool == "dmlopt":
        import dmlopt

        model = dmlopt.load(source)
        return (lambda: dmlopt.optimize(model, shapes={input_name: shape}, passes=DMLOPT_PASSES,
                                        validate=False, retime=False).model,
                lambda out: dmlopt.save(out, dest))
    proto = onnx.load(source)
    if tool == "onnxsim":
        import onnxsim

        return (lambda: onnxsim.simplify(proto, overwrite_input_shapes={input_name: shape})[0],
                lambda out: onnx.save(out, dest))
    if tool == "onnxslim":
        import onnxslim

        return (lambda: onnxslim.slim(proto, input_shapes=[f"{input_name}:{','.join(map(str, shape))}"]),
                lambda out: onnx.save(out, dest))
    raise SystemExit(f"unknown tool {tool}")


def _warm_up(tool: str) -> None:
    """Optimize a one-node model first: modules imported on first use then count in neither
    the tool's time nor its memory."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "warm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    with tempfile.TemporaryDirectory(prefix="dmlopt_warm.") as tmp:
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), f"{tmp}/w.onnx")
        optimize, save = _prepare(tool, f"{tmp}/w.onnx", f"{tmp}/out.onnx", "x", [1, 4])
        save(optimize())


def run_tool(tool: str, source: str, dest: str, input_name: str, shape: list[int]) -> dict:
    """Load, optimize with `tool`, save; time and peak-memory growth of the optimization only."""
    _warm_up(tool)
    optimize, save = _prepare(tool, source, dest, input_name, shape)
    _reset_peak_rss()
    base = _status_mb("VmRSS")
    t0 = time.perf_counter()
    out = optimize()
    seconds = time.perf_counter() - t0
    peak = _status_mb("VmHWM")
    save(out)
    return {"seconds": seconds, "peak_mb": max(peak - base, 0.0)}


def worker_main(argv) -> int:
    tool, source, dest, input_name, shape = argv
    result = run_tool(tool, source, dest, input_name, [int(d) for d in shape.split(",")])
    print("RESULT " + json.dumps(result))
    return 0


# ** the parent: build models, run every tool, measure the outputs **

def build_models(folder: pathlib.Path, medium: bool) -> dict[str, tuple[pathlib.Path, str, list[int]]]:
    """name -> (dynamic-batch file, input name, static shape to freeze to)."""
    import onnx

    from models import cnn, sam_encoder

    models = {}
    bundled = ROOT / "dmlopt" / "data" / "sam_small_dynamic.onnx"
    sam = bundled if bundled.exists() else sam_encoder.export_small(folder / "sam_small_dynamic.onnx",
                                                                     dynamic_batch=True)
    models["SAM small, TorchScript"] = (sam, sam_encoder.INPUT_NAME, [1, 3, 64, 64])
    dynamo = sam_encoder.export_dynamo(folder / "sam_small_dynamo.onnx", dynamic_batch=True)
    models["SAM small, dynamo"] = (dynamo, sam_encoder.INPUT_NAME, [1, 3, 64, 64])
    if medium:
        config = sam_encoder.EncoderConfig(embed_dim=192, depth=6, num_heads=6, global_attn_indexes=(2, 5),
                                           img_size=256, patch_size=16, window_size=7, out_chans=64)
        path = folder / "sam_medium_dynamic.onnx"
        sam_encoder.export_small(path, dynamic_batch=True, img_size=config.img_size,
                                 patch_size=config.patch_size, embed_dim=config.embed_dim, depth=config.depth,
                                 num_heads=config.num_heads, window_size=config.window_size,
                                 global_attn_indexes=config.global_attn_indexes, out_chans=config.out_chans)
        models["SAM medium, TorchScript"] = (path, sam_encoder.INPUT_NAME, [1, 3, 256, 256])
    cnn_path = folder / "cnn_dynamic.onnx"
    onnx.save(cnn.build_cnn(dynamic_batch=True, channels=32, height=256, width=256), cnn_path)
    models["7-layer CNN"] = (cnn_path, "input", [1, 3, 256, 256])
    return models


def available(tool: str) -> bool:
    import importlib.util

    return tool == "dmlopt" or importlib.util.find_spec(tool) is not None


def optimize_all(name: str, source: pathlib.Path, input_name: str, shape: list[int], folder: pathlib.Path,
                 tools) -> dict[str, dict]:
    outputs = {}
    for tool in tools:
        dest = folder / f"{name.replace(' ', '_').replace(',', '')}.{tool}.onnx"
        proc = subprocess.run([sys.executable, __file__, "--worker", tool, str(source), str(dest), input_name,
                               ",".join(map(str, shape))], capture_output=True, text=True, cwd=ROOT)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            outputs[tool] = {"error": tail[:160]}
            continue
        outputs[tool] = dict(json.loads(line[len("RESULT "):]), path=dest)
    return outputs


def census(path: pathlib.Path) -> dict:
    import onnx_ir as ir

    import dmlopt

    model = dmlopt.load(path)
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    values = [v for g in model.graphs() for v in [*g.inputs, *(o for n in g for o in n.outputs)]]
    dynamic = sum(1 for v in values if v.shape is None or not all(isinstance(d, int) for d in v.shape.dims))
    return {"nodes": len(nodes), "compute": sum(n.op_type != "Constant" for n in nodes),
            "shape_ops": sum(n.op_type in ("Shape", "Size") for n in nodes), "dynamic": dynamic,
            "bytes": path.stat().st_size + sum(f.stat().st_size for f in dmlopt.io.model.external_data_files(path))}


def session_times(paths: dict[str, pathlib.Path], rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median ORT (CPU EP, default optimizations) session creation time, wall and CPU (all
    threads of this process: steadier than wall time on a busy machine), tools in alternation."""
    import onnxruntime as ort

    wall = {k: [] for k in paths}
    cpu = {k: [] for k in paths}
    order = list(paths)
    for r in range(rounds + 1):  # round 0 warms the file cache and ORT's kernel registry
        for key in (order if r % 2 else reversed(order)):
            t0, c0 = time.perf_counter(), time.process_time()
            ort.InferenceSession(str(paths[key]), providers=["CPUExecutionProvider"])
            if r:
                wall[key].append(time.perf_counter() - t0)
                cpu[key].append(time.process_time() - c0)
    return ({k: statistics.median(v) * 1000 for k, v in wall.items()},
            {k: statistics.median(v) * 1000 for k, v in cpu.items()})


def numerics_ok(source: pathlib.Path, path: pathlib.Path, input_name: str, shape: list[int]) -> str:
    import dmlopt

    try:
        v = dmlopt.validate(source, path, shapes={input_name: shape})
    except dmlopt.DmlOptError as e:
        return f"error: {str(e)[:60]}"
    return "ok" if v.passed else "FAIL " + ", ".join(f"{o.name} {o.max_abs:.2g}" for o in v.outputs if not o.passed)


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}" if reference else "-"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="session creations per output (default 7)")
    parser.add_argument("--medium", action="store_true", help="also a wider, deeper SAM (256x256, 6 blocks)")
    args = parser.parse_args(argv)
    tools = [t for t in TOOLS if available(t)]
    missing = [t for t in TOOLS if t not in tools]

    from dmlopt.io.tables import format_table

    rows = [("model", "tool", "nodes", "compute", "x dmlopt", "Shape/Size", "dyn values", "optimize s", "x dmlopt",
             "peak MB", "file KB", "x input", "session ms", "x dmlopt", "cpu ms", "x dmlopt", "numerics")]
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="dmlopt_freeze_bench.") as tmp:
        folder = pathlib.Path(tmp)
        for name, (source, input_name, shape) in build_models(folder, args.medium).items():
            outputs = optimize_all(name, source, input_name, shape, folder, tools)
            done = {t: o for t, o in outputs.items() if "error" not in o}
            paths = {"input": source, **{t: o["path"] for t, o in done.items()}}
            sessions, session_cpu = session_times(paths, args.rounds)
            counts = {k: census(p) for k, p in paths.items()}
            mine = counts.get("dmlopt")
            for key in paths:
                c, o = counts[key], done.get(key, {})
                rows.append((name, "(dynamic input)" if key == "input" else key, c["nodes"], c["compute"],
                             ratio(c["compute"], mine["compute"]) if mine else "-", c["shape_ops"], c["dynamic"],
                             f"{o['seconds']:.2f}" if o else "-",
                             ratio(o["seconds"], done["dmlopt"]["seconds"]) if o and "dmlopt" in done else "-",
                             f"{o['peak_mb']:.0f}" if o else "-", f"{c['bytes'] / 1024:.0f}",
                             ratio(c["bytes"], counts["input"]["bytes"]), f"{sessions[key]:.1f}",
                             ratio(sessions[key], sessions["dmlopt"]) if "dmlopt" in sessions else "-",
                             f"{session_cpu[key]:.1f}",
                             ratio(session_cpu[key], session_cpu["dmlopt"]) if "dmlopt" in session_cpu else "-",
                             "-" if key == "input" else numerics_ok(source, paths[key], input_name, shape)))
            for tool, o in outputs.items():
                if "error" in o:
                    rows.append((name, tool, *["-"] * 14, f"failed: {o['error']}"))
            peers = [t for t in done if t != "dmlopt"]
            if mine and peers:
                best_nodes = min(counts[t]["nodes"] for t in peers)
                best_compute = min(counts[t]["compute"] for t in peers)
                best_session = min(sessions[t] for t in peers)
                best_cpu = min(session_cpu[t] for t in peers)
                verdicts.append(f"{name}: nodes {mine['nodes']} vs best peer {best_nodes}, compute nodes "
                                f"{mine['compute']} vs {best_compute}, session {sessions['dmlopt']:.1f} ms vs "
                                f"{best_session:.1f} ms ({sessions['dmlopt'] / best_session:.2f}x), session CPU "
                                f"{session_cpu['dmlopt']:.1f} ms vs {best_cpu:.1f} ms "
                                f"({session_cpu['dmlopt'] / best_cpu:.2f}x)")
    import onnxruntime

    versions = [f"onnxruntime {onnxruntime.__version__}"]
    for tool in ("onnxsim", "onnxslim"):
        if tool in tools:
            versions.append(f"{tool} {__import__(tool).__version__}")
    print(f"freeze dynamic batch -> 1: dmlopt {' + '.join(DMLOPT_PASSES)} vs onnxsim, onnxslim ({', '.join(versions)}, "
          f"{os.cpu_count()} CPUs; session creation: CPU EP, median of {args.rounds} alternating rounds, wall and process CPU time)")
    print(format_table(rows))
    for line in verdicts:
        print(line)
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (pip install {' '.join(missing)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
