"""SAM encoders before/after dmlopt's einsum, transpose and attention passes, and against ORT's optimizer.

For each model, in one run: nodes, Transposes, Einsums and MultiHeadAttention nodes of every
variant, whether it validates against the export (ORT CPU EP, graph rewrites off), and its
latency on the chosen execution provider, timed in alternation with the export (the speedup
is the median of per-pair ratios).  Variants:

  export                    the file as the exporter wrote it
  cleanup                   dmlopt's constant folding alone (what the other rows start from)
  dmlopt keep               + einsum (largest-matmul) + transpose, attention kept
  dmlopt fuse               + attention fused into com.microsoft MultiHeadAttention
  dmlopt keep/fuse gemv     the same with einsum_layout=fewest-transposes (batched vector products)
  dmlopt fuse einsum-kept   cleanup + transpose + attention, Einsum left to ORT (the CUDA default)
  dmlopt fuse by-size       einsum_layout=by-size: vector products for small contractions only
  ... windows               each of those, then tokens kept in window layout between windowed
                            blocks (freeze-shapes + window-layout: no merge/partition pairs)
  ort vit / ort sam2        onnxruntime.transformers.optimizer.optimize_model(model_type=...)

dmlopt runs with --target dml (what would ship); the timing is on the provider here.

A second table times SAM ViT-B's two relative-position Einsums alone (global attention:
b = 12 heads, 64x64 tokens; windowed: b = 25 windows x 12 heads, 14x14), as ORT runs them
and lowered in each einsum_layout: the figures behind the einsum pass's per-target defaults.

    python benchmarks/attention.py                      # bundled small SAM + a medium SAM, CPU EP
    python benchmarks/attention.py --ep cuda --vit-b    # adds SAM ViT-B at 1024 (random weights)
    python benchmarks/attention.py --ep cuda --vit-b-512  # SAM ViT-B's layers at 512 px
    python benchmarks/attention.py --model enc.onnx --heads 12 --hidden 768
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import tempfile
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx_ir as ir  # noqa: E402

import dmlopt  # noqa: E402
from dmlopt.runtime import bench, sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.runtime.validate import validate  # noqa: E402

MHA = "com.microsoft.MultiHeadAttention"
DMLOPT_VARIANTS = {  # name -> (passes, options); dmlopt runs with --target dml
    "cleanup": ("cleanup", {}),
    "dmlopt keep": ("cleanup,einsum,transpose", {"einsum": "lower", "einsum_layout": "largest-matmul",
                                                  "attention": "keep"}),
    "dmlopt fuse": ("cleanup,einsum,transpose,attention", {"einsum": "lower", "einsum_layout": "largest-matmul",
                                                            "attention": "fuse"}),
    "dmlopt keep gemv": ("cleanup,einsum,transpose", {"einsum": "lower", "einsum_layout": "fewest-transposes",
                                                       "attention": "keep"}),
    "dmlopt fuse gemv": ("cleanup,einsum,transpose,attention", {"einsum": "lower",
                                                                 "einsum_layout": "fewest-transposes",
                                                                 "attention": "fuse"}),
    "dmlopt fuse einsum-kept": ("cleanup,transpose,attention", {"attention": "fuse"}),
    "dmlopt fuse by-size": ("cleanup,einsum,transpose,attention", {"einsum": "lower", "einsum_layout": "by-size",
                                                                    "attention": "fuse"}),
}
# The same, then tokens kept in window layout between windowed blocks (window-layout pass).
DMLOPT_VARIANTS.update({
    f"{name} windows": (passes.replace("cleanup,", "cleanup,freeze-shapes,") + ",window-layout",
                        {**options, "window_layout": "merge"})
    for name, (passes, options) in list(DMLOPT_VARIANTS.items()) if name != "cleanup"})
ALL_VARIANTS = ("export", *DMLOPT_VARIANTS, "ort vit", "ort sam2")


def sam_models(folder: pathlib.Path, medium: bool, vit_b: bool, vit_b_512: bool = False
               ) -> dict[str, tuple[pathlib.Path, int, int]]:
    """name -> (ONNX file, heads, hidden size)."""
    models = {}
    bundled = ROOT / "dmlopt" / "data" / "sam_small.onnx"
    from models import sam_encoder

    if not bundled.exists():
        bundled = sam_encoder.export_small(folder / "sam_small.onnx")
    models["SAM small (64px, 3 blocks)"] = (bundled, sam_encoder.SMALL.num_heads, sam_encoder.SMALL.embed_dim)
    if medium:
        path = sam_encoder.export_small(folder / "sam_medium.onnx", img_size=256, patch_size=16, embed_dim=192,
                                        depth=6, num_heads=6, window_size=7, global_attn_indexes=(2, 5),
                                        out_chans=64)
        models["SAM medium (256px, 6 blocks)"] = (path, 6, 192)
    b = sam_encoder.VARIANTS["vit_b"]
    for wanted, size in ((vit_b_512, 512), (vit_b, b.img_size)):
        if wanted:
            path = sam_encoder.export_small(folder / f"sam_vit_b_{size}.onnx", img_size=size, patch_size=b.patch_size,
                                            embed_dim=b.embed_dim, depth=b.depth, num_heads=b.num_heads,
                                            window_size=b.window_size, global_attn_indexes=b.global_attn_indexes,
                                            out_chans=b.out_chans)
            models[f"SAM ViT-B ({size}px, random weights)"] = (path, b.num_heads, b.embed_dim)
    return models


def counts(model: ir.Model) -> dict[str, int]:
    ops = collections.Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    return {"nodes": sum(ops.values()), "Transpose": ops["Transpose"], "Einsum": ops["Einsum"], "MHA": ops[MHA]}


def variants(path: pathlib.Path, heads: int, hidden: int, ep: str, wanted) -> dict[str, dict]:
    export = dmlopt.load(str(path))
    out = {"export": {"model": export, "seconds": 0.0}}
    for name, (passes, options) in DMLOPT_VARIANTS.items():
        if name not in wanted:
            continue
        t0 = time.perf_counter()
        result = dmlopt.optimize(export, passes=passes, target="dml", validate=False, **options)
        out[name] = {"model": result.model, "seconds": time.perf_counter() - t0}
    for model_type in ("vit", "sam2"):
        if f"ort {model_type}" in wanted:
            out[f"ort {model_type}"] = ort_optimizer(path, model_type, heads, hidden, ep)
    return out


def ort_optimizer(path: pathlib.Path, model_type: str, heads: int, hidden: int, ep: str) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimized = optimize_model(str(path), model_type=model_type, num_heads=heads, hidden_size=hidden,
                                       use_gpu=ep == "cuda")
        return {"model": ir.from_proto(optimized.model), "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 - report the optimizer's failure as a row
        return {"model": None, "seconds": time.perf_counter() - t0, "error": str(e).splitlines()[0][:80]}


def measure(name: str, path: pathlib.Path, heads: int, hidden: int, ep: str, runs: int, warmup: int,
            wanted=ALL_VARIANTS) -> str:
    found = variants(path, heads, hidden, ep, wanted)
    export = found["export"]["model"]
    timed = {}
    for variant, info in found.items():
        if info["model"] is None:
            continue
        info["counts"] = counts(info["model"])
        check = validate(export, info["model"])
        info["valid"] = check.passed
        info["max_rel"] = max(o.max_rel for o in check.outputs)
        timed[variant] = info["model"]
    timing = bench.compare(timed, ep, runs=runs, warmup=warmup, baseline="export")
    base = found["export"]["counts"]
    rows = [("variant", "nodes", "Transpose", "Einsum", "MHA", "validates", "max rel err", "median ms",
             "speedup", "Transpose ratio", "optimize s")]
    for variant, info in found.items():
        if info["model"] is None:
            rows.append((variant, "-", "-", "-", "-", f"failed: {info['error']}", "-", "-", "-", "-",
                         f"{info['seconds']:.1f}"))
            continue
        c = info["counts"]
        t = timing["models"][variant]
        rows.append((variant, c["nodes"], c["Transpose"], c["Einsum"], c["MHA"], "yes" if info["valid"] else "NO",
                     f"{info['max_rel']:.1e}", f"{t['latency_ms']['median']:.3f}", f"x{1 / t['ratio_median']:.2f}",
                     f"{c['Transpose'] / max(base['Transpose'], 1):.2f}", f"{info['seconds']:.1f}"))
    header = (f"{name} on {timing['provider']} ({runs} alternating runs after {warmup} warm-up; speedup = "
              f"median of export/variant per pair)")
    return header + "\n" + format_table(rows)


EINSUM_CASES = {  # equation, (b, h, w, c) of the query, k: SAM ViT-B rel-pos terms
    "global bhwc,hkc->bhwk": ("bhwc,hkc->bhwk", (12, 64, 64, 64), 64),
    "global bhwc,wkc->bhwk": ("bhwc,wkc->bhwk", (12, 64, 64, 64), 64),
    "window bhwc,hkc->bhwk": ("bhwc,hkc->bhwk", (300, 14, 14, 64), 14),
    "window bhwc,wkc->bhwk": ("bhwc,wkc->bhwk", (300, 14, 14, 64), 14),
}


def einsum_table(ep: str, runs: int, warmup: int) -> str:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from dmlopt.passes import PassContext
    from dmlopt.passes.einsum import EinsumPass

    rows = [("einsum", "layout", "nodes after", "median ms", "speedup vs Einsum")]
    for name, (equation, q_shape, k) in EINSUM_CASES.items():
        b, h, w, c = q_shape
        rel = np.random.default_rng(0).standard_normal((h if equation.split(",")[1][0] == "h" else w, k, c))
        graph = helper.make_graph([helper.make_node("Einsum", ["q", "r"], ["y"], equation=equation)], "einsum",
                                  [helper.make_tensor_value_info("q", TensorProto.FLOAT, list(q_shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(rel.astype(np.float32), "r")])
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        models = {"Einsum": ir.from_proto(proto)}
        for layout in ("fewest-transposes", "largest-matmul"):
            model = ir.from_proto(proto)
            EinsumPass(PassContext(target=ep, options={"einsum": "lower", "einsum_layout": layout}))(model)
            models[layout] = model
        timing = bench.compare(models, ep, runs=runs, warmup=warmup, baseline="Einsum")
        for variant, model in models.items():
            t = timing["models"][variant]
            ops = collections.Counter(n.op_type for n in model.graph if n.op_type != "Constant")
            rows.append((name, variant, ", ".join(f"{o} x{c}" if c > 1 else o for o, c in sorted(ops.items())),
                         f"{t['latency_ms']['median']:.3f}", f"x{1 / t['ratio_median']:.2f}"))
    return (f"SAM ViT-B rel-pos Einsums on {runtime.PROVIDERS[ep]} ({runs} alternating runs)\n"
            + format_table(rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="cpu", choices=("cpu", "cuda", "dml"), help="execution provider to time on")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-medium", action="store_true", help="skip the medium SAM (256px, 6 blocks)")
    parser.add_argument("--vit-b", action="store_true", help="add SAM ViT-B at 1024x1024 with random weights")
    parser.add_argument("--vit-b-512", action="store_true", help="add SAM ViT-B's layers at 512x512 (random weights)")
    parser.add_argument("--model", help="time this encoder instead (with --heads and --hidden)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--no-einsum", action="store_true", help="skip the rel-pos Einsum table")
    parser.add_argument("--only-einsum", action="store_true", help="only the rel-pos Einsum table")
    parser.add_argument("--variants", default=",".join(ALL_VARIANTS),
                        help=f"comma-separated rows to make (default all: {', '.join(ALL_VARIANTS)})")
    args = parser.parse_args(argv)
    ep = runtime.resolve_ep(args.ep)
    if not args.no_einsum:
        print(einsum_table(ep, args.runs, args.warmup), end="\n\n", flush=True)
    if args.only_einsum:
        return 0
    with tempfile.TemporaryDirectory(prefix="dmlopt-attention-") as tmp:
        if args.model:
            models = {pathlib.Path(args.model).name: (pathlib.Path(args.model), args.heads, args.hidden)}
        else:
            models = sam_models(pathlib.Path(tmp), medium=not args.no_medium, vit_b=args.vit_b,
                                    vit_b_512=args.vit_b_512)
        for name, (path, heads, hidden) in models.items():
            print(measure(name, path, heads, hidden, ep, args.runs, args.warmup, args.variants.split(",")),
                  end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
