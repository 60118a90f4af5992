"""fp16 that repairs itself: when the float16 model fails validation, find the nodes to keep in float32.

Why here and not in the fp16 pass: the search runs ONNX Runtime (a pass uses only the IR).
The repair never converts anything itself: each trial re-runs the fp16 pass on the model as
it was before fp16, with ``fp16_keep_nodes`` set, so there is one converter.

Two steps, each trial validated exactly as the pipeline validates:
  1. Range detection.  The float32 model runs on the validation inputs with its intermediate
     values exposed as outputs (a copy, in batches so that memory stays bounded).  A value
     beyond float16's range (|x| > 65504), or one whose every nonzero value is below float16's
     smallest normal (flushed to zero or a subnormal), is a reason to keep the node that makes
     it *and* the nodes that read it in float32: a reader in float16 would cast it back.
  2. Bisection, when that is not enough (an error of precision, not of range): over the
     converted nodes in topological order, the shortest prefix kept in float32 that passes is
     found by bisection; its last node is needed, the search repeats inside the prefix until
     the set found passes on its own.  Every set reported passed validation.
The number of validation runs is bounded (``--fp16-repair-runs``); past it, the run refuses
as without repair, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import onnx_ir as ir

from dmlopt.errors import DmlOptError, UsageError
from dmlopt.passes import DmlPass
from dmlopt.graph.shape_inference import infer_shapes
from dmlopt.runtime.validate import Validation, compare, make_inputs, run

FP16_MAX = float(np.finfo(np.float16).max)
FP16_TINY = float(np.finfo(np.float16).tiny)  # smallest normal, 2**-14
PROBE_BATCH_VALUES = 64  # intermediate values exposed per probe run
PROBE_BATCH_BYTES = 256 * 2**20  # and at most this many bytes of them (by static shape)
UNKNOWN_SIZE_BYTES = PROBE_BATCH_BYTES // 8  # what a value of unknown shape is counted as


@dataclasses.dataclass
class Trial:
    """One conversion with a keep set: the model, the passes that made it, its validation."""

    model: ir.Model
    passes: list[dict[str, Any]]  # what Report.add_pass takes: {p, before, after, modified, seconds}
    validation: Validation | None = None
    error: str = ""

    @property
    def fp16(self) -> DmlPass:
        return self.passes[0]["p"]

    @property
    def passed(self) -> bool:
        return self.validation is not None and self.validation.passed


# keep set -> the model made with it; the pipeline replays fp16 (and the passes after it).
Replay = Callable[[frozenset[str]], Trial]


@dataclasses.dataclass
class Repair:
    """What the repair found: the passing trial (None when it refused) and the report record."""

    trial: Trial | None
    record: dict[str, Any]


class _OutOfRuns(Exception):
    pass


def repair(original: ir.Model, before_fp16: ir.Model, replay: Replay, *, shapes=None, dims=None, inputs=None,
           atol=None, rtol=None, max_runs: int = 24, progress=None) -> Repair:
    """Find a small set of nodes of `before_fp16` that, kept in float32, make validation pass."""
    if int(max_runs) < 1:
        raise UsageError(f"--fp16-repair-runs: {max_runs} is not a positive number of validation runs")
    search = _Search(original, before_fp16, replay, shapes, dims, inputs, atol, rtol, int(max_runs), progress)
    return search.run()


class _Search:
    def __init__(self, original, before_fp16, replay, shapes, dims, inputs, atol, rtol, max_runs, progress):
        self.before_fp16 = before_fp16
        self.replay = replay
        self.atol, self.rtol = atol, rtol
        self.max_runs = max_runs
        self.progress = progress
        self.runs = 0
        self.feeds = make_inputs(original, before_fp16, shapes, dims, inputs)
        self.seed = None if inputs is not None else 0
        self.reference = run(original, self.feeds)
        self.results: dict[frozenset[str], bool] = {}
        self.best: tuple[frozenset[str], Trial] | None = None
        self.note = ""

    def run(self) -> Repair:
        candidates = self.replay(frozenset()).fp16.converted  # topological order
        try:
            why = range_reasons(self.before_fp16, self.feeds, set(candidates))
        except DmlOptError as e:  # the probe could not run: bisection alone
            why, self.note = {}, f"range detection skipped: {e}"
        try:
            keep = frozenset(why)
            if not keep or not self.passes(keep):
                pool = [c for c in candidates if c not in keep]
                if not self.passes(keep | frozenset(pool)):
                    return self._refuse("validation fails even with every float16 node kept in float32: the error "
                                        "does not come from float16 arithmetic", why)
                keep = self._bisect(keep, pool, why)
        except _OutOfRuns:
            return self._refuse(f"no set of float32 nodes made validation pass within {self.max_runs} validation "
                                f"runs (--fp16-repair-runs)", why)
        trial = self._trial_of(keep)
        kept = [{"node": n, "op": self._op(n), **why[n]} for n in candidates if n in keep]
        record = {"passed": True, "validation_runs": self.runs, "max_runs": self.max_runs, "kept": kept,
                  "float16_nodes": len(trial.fp16.converted), "reason": "", "note": self.note}
        return Repair(trial, record)

    def _bisect(self, keep: frozenset[str], pool: list[str], why: dict) -> frozenset[str]:
        """`keep | pool` passes and `keep` does not: add to `keep` the last node of the shortest
        passing prefix of `pool`, and search again before it, until `keep` passes alone."""
        while True:
            lo, hi = 0, len(pool)  # keep | pool[:lo] fails, keep | pool[:hi] passes
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.passes(keep | frozenset(pool[:mid])):
                    hi = mid
                else:
                    lo = mid
            needed = pool[hi - 1]
            why[needed] = {"found_by": "bisection",
                           "detail": "needed for validation to pass (found by bisection over the float16 nodes)"}
            keep, pool = keep | {needed}, pool[:hi - 1]
            if not pool or self.passes(keep):
                return keep

    def passes(self, keep: frozenset[str], *, counted: bool = True) -> bool:
        if keep in self.results and counted:
            return self.results[keep]
        if counted:
            if self.runs >= self.max_runs:
                raise _OutOfRuns
            self.runs += 1
        if self.progress:
            self.progress(f"fp16 repair: validation {self.runs} ({len(keep)} nodes in float32)")
        trial = self.replay(keep)
        try:
            out = run(trial.model, self.feeds)
            checks = [compare(name, self.reference[name], out.get(name), self.atol, self.rtol)
                      for name in self.reference]
            trial.validation = Validation(checks, {k: list(v.shape) for k, v in self.feeds.items()}, self.seed)
        except DmlOptError as e:
            trial.error = str(e)
        self.results[keep] = trial.passed
        if trial.passed:
            self.best = (keep, trial)  # only the latest passing model is held
        return trial.passed

    def _trial_of(self, keep: frozenset[str]) -> Trial:
        if self.best is not None and self.best[0] == keep:
            return self.best[1]
        self.passes(keep, counted=False)  # known to pass, but its model was not held: built again
        return self.best[1]

    def _op(self, name: str) -> str:
        node = next((n for n in self.before_fp16.graph if n.name == name), None)
        return node.op_type if node is not None else ""

    def _refuse(self, reason: str, why: dict) -> Repair:
        tried = [{"node": n, "op": self._op(n), **r} for n, r in why.items()]
        return Repair(None, {"passed": False, "validation_runs": self.runs, "max_runs": self.max_runs,
                             "kept": [], "tried": tried, "reason": reason, "note": self.note})


def range_reasons(model: ir.Model, feeds: Mapping[str, np.ndarray], candidates: set[str]) -> dict[str, dict]:
    """Candidate node name -> why it must stay float32, from the float32 values on `feeds`."""
    probe = model.clone()
    infer_shapes(probe)  # every value typed, so that it can be a graph output (weights not serialized)
    ranges = value_ranges(probe, feeds)
    reasons: dict[str, dict] = {}

    def mark(node: ir.Node, found_by: str, detail: str, peak: float) -> None:
        if node.name in candidates and node.name not in reasons:
            reasons[node.name] = {"found_by": found_by, "detail": detail, "max_abs": peak}

    for value in _float_values(probe.graph):
        peak, all_tiny = ranges.get(value.name, (0.0, False))
        if peak > FP16_MAX:
            found_by, what = "overflow", f"'{value.name}' reaches |x| = {peak:.4g}, beyond float16's {FP16_MAX:g}"
        elif all_tiny:
            found_by, what = "underflow", (f"'{value.name}' has |x| <= {peak:.3g}, below float16's smallest normal "
                                           f"{FP16_TINY:.3g} (flushed to zero or subnormal)")
        else:
            continue
        producer = value.producer()
        if producer is not None:
            mark(producer, found_by, f"its output {what}", peak)
        for reader, _ in value.uses():
            mark(reader, found_by, f"reads {what}", peak)
    return reasons


def value_ranges(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[float, bool]]:
    """Value name -> (largest finite |x|, whether every nonzero |x| is below float16's smallest normal)
    for the graph inputs and the float32 node outputs of the main graph (typed: shape inference
    ran), run on ORT's CPU EP.  `model`'s outputs are set back when done."""
    ranges = {name: _range(np.asarray(array)) for name, array in feeds.items()
              if np.asarray(array).dtype == np.float32}
    values = [v for v in _float_values(model.graph) if v.producer() is not None]
    outputs = list(model.graph.outputs)
    try:
        for batch in _batches(values):
            model.graph.outputs.clear()
            model.graph.outputs.extend(batch)
            for name, array in run(model, feeds).items():
                ranges[name] = _range(np.asarray(array))
    finally:
        model.graph.outputs.clear()
        model.graph.outputs.extend(outputs)
    return ranges


def _float_values(graph: ir.Graph) -> Iterable[ir.Value]:
    seen = set()
    for value in (*graph.inputs, *(o for node in graph for o in node.outputs)):
        if value.name and value.name not in seen and value.dtype == ir.DataType.FLOAT \
                and isinstance(value.type, ir.TensorType) and not value.is_initializer():
            seen.add(value.name)
            yield value


def _batches(values: list[ir.Value]) -> Iterable[list[ir.Value]]:
    batch, size = [], 0
    for value in values:
        nbytes = _static_bytes(value)
        if batch and (len(batch) >= PROBE_BATCH_VALUES or size + nbytes > PROBE_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(value)
        size += nbytes
    if batch:
        yield batch


def _static_bytes(value: ir.Value) -> int:
    if value.shape is None or not all(isinstance(d, int) for d in value.shape.dims):
        return UNKNOWN_SIZE_BYTES
    return int(np.prod(value.shape.dims, dtype=np.int64)) * 4


def _range(array: np.ndarray) -> tuple[float, bool]:
    finite = np.abs(array[np.isfinite(array)])
    if not finite.size:
        return 0.0, False
    peak = float(finite.max())
    return peak, 0.0 < peak < FP16_TINY
