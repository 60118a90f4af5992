"""The optimize pipeline: passes in order, a check after each, then validation.

Why this shape: a pass that breaks the model must be caught where it happens, so after
every pass the model goes through onnx's checker and shape inference, and the report
records what the pass changed (nodes by op type before/after), why it declined sites,
and its time.  At the end the result is validated against the input on ORT; if that
fails, the passes are replayed one at a time to name the one that broke it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import time
from typing import Any, Callable, Mapping, Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from dmlopt.engine import fp16_repair
from dmlopt.graph import input_sizes
from dmlopt.runtime import bench, sessions as runtime
from dmlopt.targets import session_config
from dmlopt.report import optimize_report as report_mod
from dmlopt.engine import tune as tuning
from dmlopt.io.progress import ticking
from dmlopt.errors import TEXT_WIDTH, CheckFailed, DmlOptError, InputError, UsageError, printable
from dmlopt.targets.graph_capture import graph_capture_readiness, with_measured_placement
from dmlopt.targets.dml import placement
from dmlopt.graph.check import PassBroke, check_model, op_counts
from dmlopt.io.model import ModelLike, check_input, initializer_bytes, load
from dmlopt.passes import DmlPass, EngineSettings, Option, OptionStore, PassContext, all_passes
from dmlopt.graph.shapes import check_shapes
from dmlopt.target import Target
from dmlopt.targets.webgpu import kernels as webgpu_kernels
from dmlopt.targets.webgpu import placement as webgpu_placement
from dmlopt.targets.webgpu import validation as webgpu_validation
from dmlopt.targets.dml import real_ep
from dmlopt.runtime.validate import validate as run_validation

# The model's metadata entry naming the target dmlopt optimized it for.
TARGET_KEY = bench.TARGET_KEY
# Names pass options must not take: optimize()'s own keywords and the CLI's own flags (python spelling).
ENGINE_KEYWORDS = frozenset({
    "model", "shapes", "dims", "passes", "target", "ort_version", "validate", "tune", "inputs", "atol", "rtol",
    "progress", "retime", "options", "output", "shape", "dim", "report", "no_validate", "no_time", "force",
    "no_session_config", "json", "quiet", "version", "overwrite_input_shape", "fp32_sibling", "dml_host"})


@dataclasses.dataclass
class Result:
    """What `optimize` returns: the rewritten model and the report of what happened."""

    model: ir.Model
    report: report_mod.Report

    @property
    def passed(self) -> bool:
        real = self.report.real_ep or {}
        return (self.report.validation is None or self.report.validation.get("passed", False)) \
            and real.get("passed") is not False


def pass_options() -> dict[str, tuple[type[DmlPass], Option]]:
    """Every option of every registered pass by python name (unique: `all_passes` checks it; none
    may take a name of `optimize`'s own keywords, which the CLI flags mirror)."""
    found = {}
    for cls in all_passes().values():
        for opt in cls.options:
            if opt.name in ENGINE_KEYWORDS:
                raise TypeError(f"pass '{cls.name}' declares option '{opt.name}' ({opt.flag}), a setting of "
                                "dmlopt.optimize itself: option names must not clash with it")
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
        close = difflib.get_close_matches(unknown[0], list(registry), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise UsageError(f"unknown pass '{unknown[0]}'{hint} (known: {', '.join(registry)})")
    if not names:
        raise UsageError("no passes named")
    return [registry[n] for n in names]


def check_options(options: Mapping[str, Any]) -> OptionStore:
    """The user's pass options (keywords by option name; None: unset) as the store of every
    registered pass, each value converted and checked (UsageError: unknown name, bad value)."""
    pass_options()  # no option takes an engine keyword's name
    return OptionStore.build(all_passes().values(), options)


def check_precision_passes(pass_classes: Sequence[type[DmlPass]], store: OptionStore, *, explicit: bool,
                           tune: bool) -> None:
    """--fp16 and --passes must agree: the precision decides tolerances and per-precision defaults,
    so a float16 request that no pass carries out (or a named fp16 pass that would do nothing,
    unless --tune is to choose the precision) is a usage error."""
    if not explicit:
        return
    requested = store.settings().get(tuning.PRECISION_PASS, {}).get(tuning.PRECISION_OPTION)
    named = any(cls.name == tuning.PRECISION_PASS for cls in pass_classes)
    if requested is True and not named:
        raise UsageError(f"--fp16 converts with the {tuning.PRECISION_PASS} pass, which --passes leaves out: "
                         f"add {tuning.PRECISION_PASS} to --passes")
    if named and requested is None and not tune:
        raise UsageError(f"--passes names {tuning.PRECISION_PASS}, which converts only with --fp16: add --fp16")


def _as_given(options: Mapping[str, Any], store: OptionStore) -> dict[str, Any]:
    """The user's settings by option name, in the order given, as the store converted them (the report's "options")."""
    converted = {name: value for values in store.settings().values() for name, value in values.items()}
    return {name: converted[name] for name in options if name in converted}


def check_validatable(model: ir.Model) -> None:
    """Validation feeds tensors: a sequence or optional input is refused before any pass runs, with
    the remedy (before, the refusal named none, and a given list crashed as an array)."""
    for value in input_sizes.runtime_inputs(model):
        if value.type is not None and not isinstance(value.type, ir.TensorType):
            raise InputError(f"input '{printable(value.name, TEXT_WIDTH)}' is a {value.type}: validation feeds "
                             "tensors only; optimize without it with --no-validate (validate=False)")


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


def optimize(model: ModelLike, *, shapes: Mapping[str, Sequence[int]] | None = None,
             dims: Mapping[str, int] | None = None, passes: Sequence[str] | str | None = None,
             target: str = "dml", ort_version: str | None = None, validate: bool = True,
             tune: bool = False, inputs=None, atol: float | None = None, rtol: float | None = None,
             progress: Callable[[str], None] | None = None, retime: bool | None = None,
             dml_host: str | os.PathLike | None = None, **options: Any) -> Result:
    """Rewrite `model` for `target` and validate it against the input.

    `passes` names the passes to run (default: every pass that applies).  Pass options
    (``leaky_relu="conv-split"``, ...) are keywords; ``dmlopt passes`` lists them.
    The input model is never changed: the pipeline works on a copy.
    `retime`: time before/after on the target (report.timing); None (default) does so
    when the target's provider is on this machine, True requires it, False skips it.
    `dml_host`: the Wine host folder (else DMLOPT_DML_HOST) where the output is validated on the
    real DirectML EP too, for --target dml (real_ep; in this process on Windows).
    """
    resolved = Target.resolve(target, ort_version)  # once: every pass, tuning and the session config read it
    real = (real_ep.resolve(dml_host, ort_version, other_version_ok=True)
            if target == "dml" and validate else None)  # before any work: a missing version is exit 2
    tuning.require_validation(tune, validate)
    # A DirectML host whose device is a GPU times tuning's candidates as Windows would (asked only when
    # something is to be timed: naming the device costs a host run).
    host_timer = (real_ep.timer(real) if real is not None and real.host is not None
                  and (tune or retime or any(isinstance(v, str) and v == "auto" for v in options.values())) else None)
    if tune or retime:
        # before any work: exit 2 naming the providers present
        tuning.require_target(target, tuning=tune, on_host=host_timer is not None)
    if progress and isinstance(model, (str, os.PathLike)):
        progress(f"load {os.fspath(model)}")
    original = load(model)
    check_input(original)
    if shapes or dims:
        check_shapes(original, shapes, dims)
    if validate:
        check_validatable(original)
    if validate and inputs is None:
        runtime.input_specs(original, shapes, dims)  # dims nothing sizes are refused before any pass runs
    store = check_options(options)
    pass_classes = select_passes(passes)
    check_precision_passes(pass_classes, store, explicit=passes is not None, tune=tune)
    # WebGPU, where its EP runs here: fused sites are probed on it first (dmlopt.targets.webgpu.kernels).
    on_ep = resolved.ep == "webgpu" and validate and runtime.has_target("webgpu")
    context = PassContext(target=resolved,
                          shapes={k: list(v) for k, v in (shapes or {}).items()},
                          dims=dict(dims or {}), options=store,
                          engine=EngineSettings(tune=tune, kernel_check=webgpu_kernels.check if on_ep else None,
                                                timer=host_timer),
                          precision=tuning.precision_of(store))
    # The report's "options" keep their keys: the user's pass options and "tune".
    rep = report_mod.Report.start(original, target=target, ort_version=ort_version,
                                  options={**_as_given(options, store), "tune": tune})
    rep.target_resolved = resolved.describe()
    explicit = passes is not None
    run = PassRunner(pass_classes, context, explicit=explicit, strict=_strict_clean(original))
    # Options left to choose are decided first, each candidate as the whole pipeline's output (dmlopt.engine.tune);
    # the choices join the store apart from the user's settings.
    outcome = tuning.resolve(tuning.steps(pass_classes, context, validate_output=validate), original, context, run,
                             check=dict(inputs=inputs, atol=atol, rtol=rtol), progress=progress)
    chosen = store.with_choices(outcome.choices)
    context = run.context = dataclasses.replace(context, options=chosen, precision=tuning.precision_of(chosen))
    for pass_name, option, choice, record in outcome.records:
        rep.add_choice(pass_name, option, choice, record)

    def record(p: DmlPass, before: dict[str, int], after: ir.Model, modified: bool, seconds: float) -> None:
        rep.add_pass(p, before=before, after=op_counts(after), modified=modified, seconds=seconds)

    work = original.clone()
    fp16_at = _fp16_repair_position(run, outcome.only) if validate else None
    before_fp16 = None  # the model as the fp16 pass receives it: what the fp16 repair replays from
    if fp16_at is not None:
        work, _ = run(work, context.options, stop=fp16_at, only=outcome.only, on_pass=record, progress=progress)
        before_fp16 = work.clone()  # tensors are shared, not copied
    work, _ = run(work, context.options, start=fp16_at or 0, only=outcome.only, on_pass=record, progress=progress)
    rep.finish(work, initializer_bytes(original), initializer_bytes(work))
    work.metadata_props[TARGET_KEY] = resolved.ep  # bench says when a timing elsewhere does not represent it
    out = Result(work, rep)
    atol, rtol = tuning.validation_tolerances(context.precision, atol, rtol)
    if validate:
        v = run_validation(original, work, shapes=context.shapes, dims=context.dims, inputs=inputs,
                           atol=atol, rtol=rtol, progress=progress)
        rep.validation = v.to_dict()
        if not v.passed and before_fp16 is not None and not v.reference_nonfinite:
            out.model = _repair_fp16(original, out.model, before_fp16, fp16_at, run, outcome.only, rep,
                                     dict(inputs=inputs, atol=atol, rtol=rtol), progress)
        if out.passed and on_ep:
            with ticking(progress, "validate on the WebGPU EP"):
                found = webgpu_validation.on_ep(original, out.model, shapes=context.shapes, dims=context.dims,
                                                inputs=inputs, atol=atol, rtol=rtol)
            rep.validation = {**rep.validation, "cpu_passed": rep.validation["passed"], "webgpu": found,
                              "passed": found["passed"]}
            if not found["passed"]:  # the CPU EP agrees: the pass that broke it is found on the EP
                rep.broken_by = _bisect(original, pass_classes, context, explicit, inputs, atol, rtol, on_ep=True)
                return out
        elif resolved.ep == "webgpu":
            rep.validation = {**rep.validation, "webgpu": {"skipped": runtime.webgpu_missing()}}
        if out.passed and target == "dml":
            rep.real_ep = _validate_real(original, out.model, real, context, inputs, rep.validation, progress,
                                         ort_version)
        if not out.passed and not v.reference_nonfinite:  # no finite reference: the inputs' fault, no pass's
            rep.broken_by = _bisect(original, [cls for cls in pass_classes], context, explicit, inputs, atol, rtol)
    # Re-timing runs the model: not after --no-validate (nothing is run) unless asked for.  A DirectML
    # host on a GPU times as Windows would (each model in its own host process); a software one does not.
    gpu_host = (target == "dml" and real is not None and real.host is not None and not real.software
                and bool((rep.real_ep or {}).get("passed")) and retime is not False)
    rep.not_timed = ("validation failed" if not out.passed else "--no-time" if retime is False
                     else "--no-validate runs nothing" if not validate and not retime
                     else None if gpu_host
                     else _host_not_timed(rep.real_ep) if (rep.real_ep or {}).get("passed") is not None
                     else f"{runtime.PROVIDERS[target]}, the target's provider, is not on this machine"
                     if not runtime.has_target(target) else runtime.timing_refusal(target))
    # A software adapter (WebGPU on lavapipe) is timed only when asked, and the timing says so.
    on_machine = retime or (retime is None and validate and runtime.has_target(target)
                            and runtime.timing_refusal(target) is None)
    if out.passed and (gpu_host or on_machine):
        rep.not_timed = None
        if not any(p["modified"] for p in rep.passes):  # the same graph: a timing would only measure noise
            rep.timing = {"provider": runtime.PROVIDERS[target], "identical": True,
                          "verdict": "identical graph: no pass changed the model, nothing to time"}
        elif gpu_host:
            with ticking(progress, f"time before/after on the DirectML host (ORT {real.version})"):
                rep.timing = real_ep.retime(original, work, real, shapes=context.shapes, dims=context.dims,
                                            inputs=inputs)
        else:
            if progress:
                progress(f"time before/after on {target}")
            rep.timing = bench.retime(original, work, target, shapes=context.shapes, dims=context.dims,
                                      inputs=inputs, progress=progress)
    predicted = None
    if resolved.ep == "dml":  # the verdict DirectML users come for: CPU nodes, copies, partitions before -> after
        version = resolved.table_version
        prepared = placement.prepare(out.model)
        after = placement.predict(out.model, ort_version=version, prepared=prepared)
        rep.placement = {"before": placement.predict(original, ort_version=version).to_dict(),
                         "after": after.to_dict()}
        predicted = (after, prepared) if out.model is work else None  # the same model (no fp16 repair)
    if out.passed:
        _session_recommendation(rep, work, context, tune, progress, predicted)
    return out


def _host_not_timed(real: dict) -> str:
    """Why a model that ran on the DirectML host is not timed: said as such, not "not on this machine"."""
    host = real.get("host") or {}
    return (f"DmlExecutionProvider ran on the DirectML host (ORT {host.get('ort_version')}, "
            + ("software rendering: no basis for a speedup" if host.get("software") else "under Wine")
            + "), which optimize does not time; `dmlopt bench OUT --ep dml` times it there")


def _validate_real(original: ir.Model, model: ir.Model, real, context: PassContext, inputs, validation,
                   progress=None, ort_version: str | None = None) -> dict:
    """The output on the real DirectML EP against the input on the CPU EP, with the tolerances the
    CPU validation used; without a real EP, why not and how to get one."""
    if real is None:
        return {"passed": None, "skipped": real_ep.why_not(ort_version, "validation on the real DirectML EP")}
    per_output = {o["name"]: (o["atol"], o["rtol"]) for o in validation["outputs"]}
    with ticking(progress, f"validate on the real DirectML EP (ORT {real.version})"):
        return real_ep.validate_real(original, model, real, shapes=context.shapes, dims=context.dims,
                                     inputs=inputs, per_output=per_output)


def _session_recommendation(rep, work: ir.Model, context: PassContext, tune: bool, progress=None,
                            predicted: tuple[placement.Placement, tuple[ir.Model, int]] | None = None) -> None:
    """The report's graph-capture readiness and recommended session configuration for the target;
    with --tune on the target's machine the provider options are measured (bench.tune_ep) first.
    `predicted`: the DirectML placement of `work` and its prepared graph, made already (not again)."""
    target = context.target.ep
    readiness = None
    if target in ("dml", "cuda"):
        made = dict(zip(("placement", "prepared"), predicted)) if predicted else {}
        readiness = graph_capture_readiness(work, context.target, **made)
        real = rep.real_ep or {}
        if target == "dml" and real.get("passed") is not None and real.get("placement"):  # measured decides
            readiness = with_measured_placement(readiness, real["placement"], (real.get("host") or {}).get(
                "ort_version", "?"))
        rep.graph_capture = readiness.to_dict()
    elif target == "webgpu":  # measured from the EP where it runs (dmlopt.targets.webgpu.placement)
        with ticking(progress, "placement on the WebGPU EP"):
            measured = webgpu_placement.measure(work, dims=context.dims)
        readiness = webgpu_placement.readiness(work, measured)
        rep.graph_capture = {**readiness.to_dict(), "placement": measured}
    ep_tuning = None
    if tune and target in ("dml", "cuda", "webgpu") and runtime.has_target(target):
        if progress:
            progress(f"time provider options on {target}")
        ep_tuning = bench.tune_ep(work, target, runs=5, warmup=1, shapes=context.shapes, dims=context.dims,
                                  free_dims=context.dims)
    cfg = session_config.recommend(work, context.target, readiness=readiness,
                                   ep_tuning=ep_tuning, dims=_user_dims(work, context),
                                   precision=context.precision)
    rep.session_config = {"config": cfg, "path": None, "snippet": None}


def _user_dims(model: ir.Model, context: PassContext) -> dict[str, int]:
    """The named dims the user fixed: --dim, and the dims --shape gives a size (by position in
    `model`'s inputs).  The session file pins these only (session_config.recommend)."""
    found = {}
    for value in model.graph.inputs:
        shape = (context.shapes or {}).get(value.name)
        if shape is None or value.shape is None or len(shape) != len(value.shape.dims):
            continue
        for dim, size in zip(value.shape.dims, shape):
            name = getattr(dim, "value", None) if not isinstance(dim, int) else None
            if name:
                found[name] = int(size)
    return {**found, **(context.dims or {})}


class PassRunner:
    """The selected passes in order, each checked after it runs (tuning runs parts of it, the pipeline all).

    A pass that is not enabled under the options (fp16 without --fp16) is skipped unless the
    user named the passes."""

    def __init__(self, passes: Sequence[type[DmlPass]], context: PassContext, *, explicit: bool, strict: bool):
        self.passes = list(passes)
        self.context = context
        self.explicit = explicit
        self.strict = strict

    def __call__(self, model: ir.Model, options: OptionStore, *, start: int = 0, stop: int | None = None,
                 only: set[int] | None = None, on_pass=None, progress=None) -> tuple[ir.Model, dict[int, bool]]:
        context = dataclasses.replace(self.context, options=options, precision=tuning.precision_of(options))
        modified: dict[int, bool] = {}
        interface = model_interface(model)
        for index in range(start, len(self.passes) if stop is None else stop):
            p = self.passes[index](context)
            if (only is not None and index not in only) or (not self.explicit and not p.enabled()):
                continue
            if progress:
                progress(f"pass {p.name}")
            before = op_counts(model) if on_pass else {}
            t0 = time.perf_counter()
            result = p(model)
            model = result.model
            elapsed = time.perf_counter() - t0
            check_model(model, f"pass '{p.name}'", strict=self.strict)
            check_interface(interface, model, p)
            modified[index] = bool(result.modified)
            if on_pass:
                on_pass(p, before, model, result.modified, elapsed)
        return model, modified


def _fp16_repair_position(run: PassRunner, only: set[int] | None) -> int | None:
    """Index of the fp16 pass when it will run with repair on (validation runs too), else None."""
    for index, cls in enumerate(run.passes):
        p = cls(run.context)
        if cls.name == "fp16" and (only is None or index in only) and (run.explicit or p.enabled()):
            return index if p.option("fp16_repair") else None
    return None


def _repair_fp16(original, work, start, at, run, only, rep, check, progress) -> ir.Model:
    """float16 failed validation: keep in float32 the nodes that need it (dmlopt.engine.fp16_repair) by
    replaying fp16 and the passes after it (from `start`, the model before pass `at`) with a keep
    set.  The model that passed, or `work`."""
    common_passes.NameFixPass()(start)  # the keep set names nodes: every node needs a unique name
    context = run.context

    def replay(keep: frozenset[str]) -> fp16_repair.Trial:
        records = []

        def collect(p, before, after, modified, seconds):
            records.append(dict(p=p, before=before, after=op_counts(after), modified=modified, seconds=seconds))

        options = context.options.chose("fp16", "fp16_keep_nodes", tuple(sorted(keep)))
        model, _ = run(start.clone(), options, start=at, only=only, on_pass=collect)
        return fp16_repair.Trial(model, records)

    if progress:
        progress("fp16 repair")
    found = fp16_repair.repair(original, start, replay, shapes=context.shapes, dims=context.dims,
                               max_runs=run.passes[at](context).option("fp16_repair_runs"), progress=progress, **check)
    rep.fp16_repair = found.record
    if found.trial is None:
        return work
    for record in found.trial.passes:
        rep.add_pass(**record, replace=True)
    rep.finish(found.trial.model, initializer_bytes(original), initializer_bytes(found.trial.model))
    rep.validation = found.trial.validation.to_dict()
    return found.trial.model


def _bisect(original, pass_classes, context, explicit, inputs, atol, rtol, on_ep: bool = False) -> str | None:
    """Replay the passes one by one, validating after each: the first failure is the culprit.
    A pass that changed nothing is never blamed (nor any pass when none changed the model).
    `on_ep`: validated on the WebGPU EP (dmlopt.targets.webgpu.validation), where the CPU EP saw none."""
    work = original.clone()
    try:  # a model whose outputs cannot pass even unchanged (nothing finite to compare): no pass broke it
        if not on_ep and not run_validation(original, work, shapes=context.shapes, dims=context.dims, inputs=inputs,
                                            atol=atol, rtol=rtol).passed:
            return None
    except DmlOptError:
        return None
    for cls in pass_classes:
        p = cls(context)
        if not explicit and not p.enabled():
            continue
        result = p(work)
        work = result.model
        if not result.modified:
            continue
        try:
            if on_ep:
                if not webgpu_validation.on_ep(original, work, shapes=context.shapes, dims=context.dims,
                                               inputs=inputs, atol=atol, rtol=rtol)["passed"]:
                    return p.name
            elif not run_validation(original, work, shapes=context.shapes, dims=context.dims, inputs=inputs,
                                    atol=atol, rtol=rtol).passed:
                return p.name
        except DmlOptError:
            return p.name
    return None


def require_valid(result: Result) -> None:
    if not result.passed:
        raise CheckFailed(result.report.failure())
