"""Measurements behind validation's rule (dmlopt.runtime.validate): what honest float16 rounding and
honest float32 rewrites score on each metric, and what wrong outputs score.

    python benchmarks/validation_rule.py [--img 448] [--work DIR]

Models: SAM ViT-B's encoder (Meta's ImageEncoderViT, ViT-B hyperparameters, seeded weights, at
--img pixels), the bundled small SAM and super-resolution CNN.  For each: the float32 export
against itself optimized for DirectML (float32) and with --fp16, run as float16 hardware rounds
(dmlopt.runtime.validate.with_float16_rounding) and as ORT's CPU EP runs it; then wrong outputs made from
the reference (all zeros, sign flipped, permuted, scaled by 1.05, one element off by the range).
Printed per case: relative L2, max abs / the reference's range, cosine, and the verdict.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import warnings

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import dmlopt  # noqa: E402
from dmlopt.runtime import sessions as runtime  # noqa: E402
from dmlopt.io.tables import format_table  # noqa: E402
from dmlopt.runtime.validate import compare, make_inputs, run  # noqa: E402


def export_vit_b(work: pathlib.Path, img: int) -> pathlib.Path:
    from models import sam_encoder

    path = work / f"sam_vit_b_{img}.onnx"
    if not path.exists():
        b = sam_encoder.VARIANTS["vit_b"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sam_encoder.export_small(path, img_size=img, patch_size=b.patch_size, embed_dim=b.embed_dim,
                                     depth=b.depth, num_heads=b.num_heads, window_size=b.window_size,
                                     global_attn_indexes=b.global_attn_indexes, out_chans=b.out_chans)
    return path


def wrong(ref: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    off = ref.copy()
    off.flat[ref.size // 2] += np.ptp(ref)
    return {"all zeros": np.zeros_like(ref), "sign flipped": -ref,
            "permuted": rng.permutation(ref.ravel()).reshape(ref.shape),
            "channels swapped": np.roll(ref, 1, axis=1) if ref.ndim > 1 else ref[::-1],
            "scaled x1.05": ref * np.float32(1.05), "one element off by the range": off}


def row(model: str, case: str, ref, got, half: bool) -> tuple:
    c = compare("y", ref.astype(np.float16) if half else ref, got)
    return (model, case, f"{c.rel_l2:.2e}", f"{c.max_abs:.3g}", f"{c.range:.3g}", f"{c.max_abs / c.range:.2e}"
            if c.range else "-", f"{c.cosine:.6f}", "pass" if c.passed else f"FAIL ({c.decided_by})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--img", type=int, default=448, help="SAM ViT-B image size (1024 is the real one)")
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    work = pathlib.Path(args.work or tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    data = pathlib.Path(dmlopt.__file__).parent / "data"
    models = {f"SAM ViT-B {args.img}px": export_vit_b(work, args.img),
              "small SAM": data / "sam_small.onnx", "CNN (LeakyRelu)": data / "cnn_leaky.onnx"}
    rows = [("model", "case", "rel L2", "max abs", "ref range", "max abs/range", "cosine", "verdict")]
    for name, path in models.items():
        original = dmlopt.load(path)
        feeds = make_inputs(original, original, dims={"batch": 1})
        ref = next(iter(run(original, feeds).values()))
        fp32 = dmlopt.optimize(original, target="dml", validate=False, retime=False).model
        rows.append(row(name, "float32 optimized", ref, next(iter(run(fp32, feeds).values())), False))
        for target in ("dml", "webgpu"):
            half = dmlopt.optimize(original, target=target, fp16=True, keep_io_types=False, validate=False,
                                   retime=False).model
            rounded = next(iter(run(half, feeds).values()))
            rows.append(row(name, f"--fp16 --target {target}, float16 rounding", ref, rounded, True))
        cpu_ep = runtime.session(half, "cpu", optimize=False).run(None, {
            k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()})[0]
        rows.append(row(name, "--fp16 --target webgpu, ORT CPU EP", ref, cpu_ep, True))
        for case, got in wrong(ref).items():
            rows.append(row(name, case + " (float32)", ref, got, False))
            rows.append(row(name, case + " (float16)", ref, got.astype(np.float16), True))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
