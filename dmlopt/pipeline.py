"""The optimize pipeline: passes in order, a check after each, then validation.

Why this shape: a pass that breaks the model must be caught where it happens, so after
every pass the model goes through onnx's checker and shape inference, and the report
records what the pass changed (nodes by op type before/after), why it declined sites,
and its time.  At the end the result is validated against the input on ORT; if that
fails, the passes are replayed one at a time to name the one that broke it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from typing import Any, Callable, Mapping, Sequence

import onnx
import onnx_ir as ir

from dmlopt import report as report_mod
from dmlopt.errors import CheckFailed, DmlOptError, UsageError
from dmlopt.model import ModelLike, check_input, initializer_bytes, load, without_external_data
from dmlopt.passes import DmlPass, Option, PassContext, all_passes

TARGETS = ("dml", "cuda", "cpu")


@dataclasses.dataclass
class Result:
    """What `optimize` returns: the rewritten model and the report of what happened."""

    model: ir.Model
    report: report_mod.Report

    @property
    def passed(self) -> bool:
        return self.report.validation is None or self.report.validation.get("passed", False)


def op_counts(model: ir.Model) -> dict[str, int]:
    """Op type -> count, all graphs included (subgraphs, not functions)."""
    counts = collections.Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    return dict(sorted(counts.items()))


def pass_options() -> dict[str, tuple[type[DmlPass], Option]]:
    """Every option of every registered pass by python name."""
    found = {}
    for cls in all_passes().values():
        for opt in cls.options:
            found[opt.name] = (cls, opt)
    return found


def select_passes(names: Sequence[str] | str | None) -> list[type[DmlPass]]:
    registry = all_passes()
    if names is None:
        return list(registry.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise UsageError(f"unknown pass '{unknown[0]}' (known: {', '.join(registry)})")
    if not names:
        raise UsageError("no passes named")
    return [registry[n] for n in names]


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    known = pass_options()
    checked = {}
    for name, value in options.items():
        if value is None:
            continue
        if name not in known:
            raise UsageError(f"unknown option '{name}' (known: {', '.join(sorted(known)) or 'none'})")
        opt = known[name][1]
        if opt.choices is not None and value not in opt.choices:
            raise UsageError(f"{opt.flag}: '{value}' is not one of {', '.join(opt.choices)}")
        checked[name] = value
    return checked


def check_model(model: ir.Model, where: str, *, strict: bool = True) -> None:
    """onnx checker + shape inference; raise if a pass produced an invalid model.

    `strict` makes shape-inference errors fatal (a wrong attribute, a rank mismatch); it is
    turned off only for inputs whose export already fails strict inference.  The large weights
    are checked as typed graph inputs: the checker needs their types and shapes, and copying
    them into a proto after every pass cost seconds a pass on SAM ViT-B."""
    from dmlopt.shape_inference import weightless_proto

    proto = without_external_data(weightless_proto(model))
    try:
        onnx.checker.check_model(proto)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=strict)
    except Exception as e:  # noqa: BLE001
        raise PassBroke(f"{where} produced an invalid model: {str(e).strip().splitlines()[0][:300]}") from e


def _strict_clean(model: ir.Model) -> bool:
    try:
        check_model(model, "input", strict=True)
        return True
    except PassBroke:
        return False


def model_interface(model: ir.Model) -> dict[str, list[tuple[str, str]]]:
    """What a caller of the model sees: input and output names in order, with their types."""
    def described(values):
        return [(v.name, str(v.type)) for v in values]
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    return {"inputs": described(inputs), "outputs": described(model.graph.outputs)}


def check_interface(before: dict[str, list[tuple[str, str]]], model: ir.Model, p: DmlPass) -> None:
    """Refuse (a dmlopt bug) a pass that renamed, reordered, added, dropped or retyped a graph input
    or output; fp16 without keep_io_types may change their float types, as asked."""
    after = model_interface(model)
    for kind in ("inputs", "outputs"):
        old, new = before[kind], after[kind]
        old_names, new_names = [n for n, _ in old], [n for n, _ in new]
        if old_names != new_names:
            raise PassBroke(f"pass '{p.name}' changed the model's {kind} from {old_names} to {new_names} "
                            "(a dmlopt bug; nothing written)")
        if p.changes_interface_types():
            continue
        for (name, was), (_, now) in zip(old, new):
            if was != now and was != "None":  # a pass may type an output the input left untyped
                raise PassBroke(f"pass '{p.name}' changed the type of {kind[:-1]} '{name}' from {was} to {now} "
                                "(a dmlopt bug; nothing written)")


class PassBroke(DmlOptError):
    """A pass produced a model the checker rejects: a dmlopt bug, reported as such."""

    exit_code = 1


def optimize(model: ModelLike, *, shapes: Mapping[str, Sequence[int]] | None = None,
             dims: Mapping[str, int] | None = None, passes: Sequence[str] | str | None = None,
             target: str = "dml", ort_version: str | None = None, validate: bool = True,
             tune: bool = False, inputs=None, atol: float | None = None, rtol: float | None = None,
             progress: Callable[[str], None] | None = None, retime: bool | None = None,
             **options: Any) -> Result:
    """Rewrite `model` for `target` and validate it against the input.

    `passes` names the passes to run (default: every pass that applies).  Pass options
    (``leaky_relu="conv-split"``, ...) are keywords; ``dmlopt passes`` lists them.
    The input model is never changed: the pipeline works on a copy.
    `retime`: time before/after on the target (report.timing); None (default) does so
    when the target's provider is on this machine, True requires it, False skips it.
    """
    from dmlopt import tune as tuning

    if target not in TARGETS:
        raise UsageError(f"unknown target '{target}' (choose from {', '.join(TARGETS)})")
    if tune or retime:
        tuning.require_target(target)  # before any work: exit 2 naming the providers present
    if progress and isinstance(model, (str, os.PathLike)):
        progress(f"load {os.fspath(model)}")
    original = load(model)
    check_input(original)
    if shapes or dims:
        from dmlopt.shapes import check_shapes

        check_shapes(original, shapes, dims)
    checked = check_options(options)
    pass_classes = select_passes(passes)
    context = PassContext(target=target, ort_version=ort_version,
                          shapes={k: list(v) for k, v in (shapes or {}).items()},
                          dims=dict(dims or {}), options=checked)
    context.options["tune"] = tune
    work = original.clone()
    rep = report_mod.Report.start(original, target=target, ort_version=ort_version, options=checked)
    explicit = passes is not None
    strict = _strict_clean(original)
    interface = model_interface(original)
    for cls in pass_classes:
        p = cls(context)
        if not explicit and not p.enabled() and not tuning.pending(p, context):
            continue
        if progress:
            progress(f"pass {p.name}")
        before = op_counts(work)
        t0 = time.perf_counter()
        _resolve_auto(p, work, original, context, rep, dict(inputs=inputs, atol=atol, rtol=rtol), progress)
        if not explicit and not p.enabled():
            continue  # tuning left it off (e.g. fp16 measured slower)
        result = p(work)
        work = result.model
        elapsed = time.perf_counter() - t0
        check_model(work, f"pass '{p.name}'", strict=strict)
        check_interface(interface, work, p)
        rep.add_pass(p, before=before, after=op_counts(work), modified=result.modified, seconds=elapsed)
    rep.finish(work, initializer_bytes(original), initializer_bytes(work))
    out = Result(work, rep)
    atol, rtol = tuning.validation_tolerances(context.options, atol, rtol)
    if validate:
        if progress:
            progress("validate")
        from dmlopt.validate import validate as run_validation

        v = run_validation(original, work, shapes=context.shapes, dims=context.dims, inputs=inputs,
                           atol=atol, rtol=rtol)
        rep.validation = v.to_dict()
        if not v.passed:
            rep.broken_by = _bisect(original, [cls for cls in pass_classes], context, explicit, inputs, atol, rtol)
    from dmlopt import bench, runtime

    if out.passed and (retime or (retime is None and runtime.has_target(target))):
        if progress:
            progress(f"time before/after on {target}")
        rep.timing = bench.retime(original, work, target, shapes=context.shapes, dims=context.dims, inputs=inputs,
                                  progress=progress)
    return out


def _resolve_auto(p: DmlPass, work: ir.Model, original: ir.Model, context: PassContext, rep,
                  check: dict[str, Any] | None = None, progress=None) -> None:
    """Turn an option left at 'auto' (or, with --tune, any tunable option the user did not
    set) into a concrete choice: measured, or the documented default (dmlopt.tune)."""
    from dmlopt import tune

    for opt in tune.pending(p, context):
        choice, record = tune.choose(p, opt, work, original, context, check, progress)
        context.options[opt.name] = choice
        rep.add_choice(p.name, opt.name, choice, record)


def _bisect(original, pass_classes, context, explicit, inputs, atol, rtol) -> str | None:
    """Replay the passes one by one, validating after each: the first failure is the culprit."""
    from dmlopt.validate import validate as run_validation

    work = original.clone()
    for cls in pass_classes:
        p = cls(context)
        if not explicit and not p.enabled():
            continue
        work = p(work).model
        try:
            if not run_validation(original, work, shapes=context.shapes, dims=context.dims, inputs=inputs,
                                  atol=atol, rtol=rtol).passed:
                return p.name
        except DmlOptError:
            return p.name
    return None


def require_valid(result: Result) -> None:
    if not result.passed:
        culprit = f" (first failing pass: {result.report.broken_by})" if result.report.broken_by else ""
        raise CheckFailed(f"the optimized model does not match the original{culprit}")
