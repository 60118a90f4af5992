"""Numerics check: the rewritten model against the original, on ORT's CPU EP.

Both models run with ORT's own graph rewrites off (so dmlopt's graph is what is
compared) on the same seeded random inputs, or the user's .npz.  Per output: max abs
error, max error relative to the output's magnitude, cosine similarity.  A float output
passes when ``max_abs <= atol + rtol * max|ref|``: scaled by the output's magnitude, so
deep ViTs' float noise is not flagged (onnxsim's fixed allclose is, peers.md) while a
wrong rewrite (relative error ~1) always is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import numpy as np

from dmlopt import runtime
from dmlopt.errors import InputError, UsageError
from dmlopt.model import ModelLike, load

# dtype kind/name -> (atol, rtol)
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}


@dataclasses.dataclass
class OutputCheck:
    name: str
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float
    cosine: float
    atol: float
    rtol: float
    passed: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Validation:
    outputs: list[OutputCheck]
    inputs: dict[str, list[int]]
    seed: int | None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "inputs": self.inputs, "seed": self.seed,
                "outputs": [o.to_dict() for o in self.outputs]}

    def to_table(self) -> str:
        rows = [("output", "dtype", "shape", "max abs", "max rel", "cosine", "tolerance", "result")]
        for o in self.outputs:
            rows.append((o.name, o.dtype, "x".join(map(str, o.shape)) or "scalar", f"{o.max_abs:.3g}",
                         f"{o.max_rel:.3g}", f"{o.cosine:.6f}", f"{o.atol:g}+{o.rtol:g}*|ref|",
                         "ok" if o.passed else f"FAIL {o.reason}".strip()))
        return format_table(rows)


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_inputs(path: str | os.PathLike) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError as e:
        raise InputError(f"{path}: no such inputs file") from e
    except Exception as e:  # noqa: BLE001
        raise InputError(f"{path}: not a readable .npz file of inputs ({e})") from e


def make_inputs(ref, cand, shapes=None, dims=None, inputs=None, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs both models accept: given ones, else seeded random ones of the most static shapes."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = load_inputs(inputs)
    specs = runtime.input_specs(ref, shapes, dims)
    cand_specs = runtime.input_specs(cand, shapes, dims)
    for name, (shape, dtype) in cand_specs.items():
        if name in specs and _static(cand, name):
            specs[name] = (shape, specs[name][1])
    given = set(inputs or ())
    feeds = runtime.random_inputs({k: v for k, v in specs.items() if k not in given}, seed)
    if inputs:
        unknown = set(inputs) - set(specs)
        if unknown:
            raise UsageError(f"inputs file names {', '.join(sorted(unknown))}, which the model does not have "
                             f"(inputs: {', '.join(specs)})")
        feeds.update({k: np.asarray(v) for k, v in inputs.items()})
    return feeds


def _static(model, name: str) -> bool:
    for v in model.graph.inputs:
        if v.name == name:
            return v.shape is not None and all(isinstance(d, int) for d in v.shape.dims)
    return False


def validate(ref: ModelLike, cand: ModelLike, *, shapes: Mapping[str, list[int]] | None = None,
             dims: Mapping[str, int] | None = None, inputs=None, atol: float | None = None,
             rtol: float | None = None, seed: int = 0) -> Validation:
    """Run both models on the same inputs (CPU EP, ORT rewrites off) and compare every output."""
    ref_model, cand_model = load(ref), load(cand)
    if shapes or dims:
        from dmlopt.shapes import check_shapes

        check_shapes(ref_model, shapes, dims)
    feeds = make_inputs(ref_model, cand_model, shapes, dims, inputs, seed)
    ref_out = run(ref_model, feeds)
    cand_out = run(cand_model, feeds)
    checks = [compare(name, ref_out[name], cand_out.get(name), atol, rtol) for name in ref_out]
    return Validation(checks, {k: list(v.shape) for k, v in feeds.items()}, None if inputs else seed)


def run(model, feeds: Mapping[str, np.ndarray], target: str = "cpu") -> dict[str, np.ndarray]:
    sess = runtime.session(model, target, optimize=False, share_weights=target == "cpu")
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name: i.type for i in sess.get_inputs()}
    try:
        values = sess.run(names, {k: as_input_type(v, wanted[k]) for k, v in feeds.items() if k in wanted})
    except Exception as e:  # noqa: BLE001
        raise InputError(f"ONNX Runtime failed to run the model: {runtime._first_line(e)}") from e
    # Copies: an output array may keep the session's memory arena (all its activations) alive,
    # and validation holds the reference outputs while the candidate runs.
    return {name: np.array(value, copy=True) for name, value in zip(names, values)}


def as_input_type(value, ort_type: str) -> np.ndarray:
    """A float feed in the float type the session takes (a float16-interface model gets the
    float32 inputs rounded), anything else unchanged."""
    value = np.asarray(value)
    want = runtime.NUMPY_TYPES.get(ort_type)
    if want is not None and value.dtype != want and value.dtype.kind == "f" and np.dtype(want).kind == "f":
        return value.astype(want)
    return value


def tolerances(dtype: np.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    default = DEFAULT_TOLERANCES.get(np.dtype(dtype).name, (0.0, 0.0))
    return (default[0] if atol is None else atol, default[1] if rtol is None else rtol)


def compare(name: str, ref: np.ndarray, cand: np.ndarray | None, atol=None, rtol=None) -> OutputCheck:
    ref = np.asarray(ref)
    a, r = tolerances(ref.dtype, atol, rtol)
    if cand is None:
        return OutputCheck(name, str(ref.dtype), list(ref.shape), float("inf"), float("inf"), 0.0, a, r,
                           False, "output missing")
    cand = np.asarray(cand)
    if cand.shape != ref.shape:
        return OutputCheck(name, str(ref.dtype), list(ref.shape), float("inf"), float("inf"), 0.0, a, r,
                           False, f"shape {list(cand.shape)} != {list(ref.shape)}")
    x = ref.astype(np.float64)
    y = cand.astype(np.float64)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    if not np.array_equal(nan_x, nan_y):
        return OutputCheck(name, str(ref.dtype), list(ref.shape), float("nan"), float("nan"), 0.0, a, r,
                           False, "NaNs differ")
    finite = ~nan_x
    x, y = x[finite], y[finite]
    same_inf = np.isinf(x) & (x == y)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same inf: masked to 0 here
        diff = np.where(same_inf, 0.0, np.abs(x - y))
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(np.where(np.isinf(x), 0.0, x)).max()) if x.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    xv, yv = np.where(np.isinf(x), 0.0, x), np.where(np.isinf(y), 0.0, y)
    nx, ny = float(np.linalg.norm(xv)), float(np.linalg.norm(yv))
    cosine = float(np.dot(xv, yv) / (nx * ny)) if nx > 0 and ny > 0 else (1.0 if nx == ny else 0.0)
    passed = bool(np.isfinite(max_abs) and max_abs <= a + r * scale)
    return OutputCheck(name, str(ref.dtype), list(ref.shape), max_abs, max_rel, cosine, a, r, passed,
                       "" if passed else "error above tolerance")
