"""Choosing among the variants the passes offer, by timing them as they would be written.

Passes only offer variants (an option with ``tunable=True``); this module measures them.
`decide` says, for each tunable option, whether it is timed, takes its documented default or
keeps the user's value (its docstring lists the cases).  The choices go into the option store
apart from the user's settings (`OptionStore.with_choices`), so the user's values are never
overwritten and the report shows both.

Why candidates are whole pipelines: a variant's speed depends on what the later passes do
to it, above all on the precision (fused attention loses to MatMul+Softmax in float32 on
CUDA and wins in float16).  So a candidate is the pipeline's final output with that one
choice, the later passes at their current choices, fp16 included when it will run; it is
validated with the final precision's tolerances and timed in alternation with the other
candidates of the same option.  The option that sets the precision is decided first, then
the others in pipeline order, each starting from the model as the earlier passes left it
(one shared prefix, so the cost is one pipeline run per candidate that changes the graph).
A last round times the tuned output against the untuned default output (where they differ)
and, with ``--tune``, the input, and keeps the fastest; the tuned one stays unless another is
faster beyond noise (by the median of per-pair ratios and by median latency), so tuning never
makes the result slower than the default, nor with ``--tune`` than the input, beyond noise.

Nothing is run when nothing may be: without the target provider, or with validation off,
each option takes its documented default (per target and precision, ``Option.default_for``)
and the report says why nothing was timed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

import onnx_ir as ir

from dmlopt.runtime import bench, sessions as runtime
from dmlopt.errors import DmlOptError, ProviderError, UsageError
from dmlopt.passes import DmlPass, Option, OptionStore, PassContext
from dmlopt.runtime.validate import DEFAULT_TOLERANCES, validate

TUNE_RUNS = 15
TUNE_WARMUP = 3
# A result within this fraction of the fastest counts as as fast (alternating medians still vary this much).
NOISE = 0.02
# The option that decides the precision the model is written in (pass, option): decided before the others.
PRECISION_PASS, PRECISION_OPTION = "fp16", "fp16"



class Runner(Protocol):
    """The pipeline's passes as tuning runs them (dmlopt.engine.pipeline provides it)."""

    passes: Sequence[type[DmlPass]]

    def __call__(self, model: ir.Model, options: OptionStore, *, start: int = 0, stop: int | None = None,
                 only: set[int] | None = None) -> tuple[ir.Model, dict[int, bool]]:
        """Passes [start, stop) (only those indices, when given) on `model` in place, each checked as the
        pipeline checks it; returns the model and, per pass that ran, whether it changed the graph."""


def require_target(target: str, *, tuning: bool = True, on_host: bool = False) -> None:
    """--tune measures on the target: its provider must be here (exit 2 otherwise), on a device
    whose times may choose (not a software adapter); `on_host`: a DirectML host on a GPU times them."""
    if on_host:
        return
    refusal = runtime.timing_refusal(target) if tuning else None
    if refusal is not None:
        raise ProviderError(f"--tune on {runtime.PROVIDERS[target]}: {refusal}")
    if not runtime.has_target(target):
        raise ProviderError(
            f"--tune needs the {runtime.PROVIDERS[target]} on this machine; providers present: "
            f"{', '.join(runtime.available_providers())} (run --tune on the target machine, or pick --target "
            f"from the providers present)"
            + ("; a DirectML host under Wine times candidates only where its device is a GPU" if target == "dml" else ""))


def require_validation(tune: bool, validate: bool) -> None:
    """--tune runs and validates candidates; --no-validate promises nothing is run (exit 2)."""
    if tune and not validate:
        raise UsageError("--tune runs and validates every candidate, --no-validate runs nothing: drop one of them")


def precision_of(options: OptionStore) -> str:
    """The precision a pipeline with these options writes: float16 when the fp16 option is on, as
    set or as chosen (the engine decides it; passes read it from `PassContext.precision`)."""
    return "float16" if options.value(PRECISION_PASS, PRECISION_OPTION) is True else "float32"


@dataclasses.dataclass(frozen=True)
class Decision:
    """How one tunable option gets its value: "user" (the user's value or the option's plain
    default: nothing to choose), "timed", or "default" (the documented default; `why` nothing was timed)."""

    how: str
    why: str | None = None

    @property
    def pending(self) -> bool:
        return self.how != "user"


LEFT_AT_AUTO = "the documented default, not timed (--tune, or the option set to auto, measures the candidates)"


def decide(opt: Option, p: DmlPass, *, tune: bool, not_runnable: str | None) -> Decision:
    """Timed, documented default or the user's value, for option `opt` of pass `p`.

    `not_runnable`: None where candidates can be run here (the target's provider is present and
    validation is on), else why not (said in the report).
      1. Not tunable, or set by the user to a value other than "auto": the user's value (else the
         option's default); nothing to choose.
      2. Set to "auto" by the user: timed; where nothing can run, the documented default.
      3. Left unset, with --tune: timed, even where its default is not "auto" (fp16: off/on).
         --tune requires the target's provider and validation (checked before any work).
      4. Left unset at an "auto" default, without --tune: the documented default, untimed (a plain
         optimize times nothing but the result).
      5. Left unset at a default other than "auto", without --tune: the option's default (case 1).
    The documented default is per target and precision (`Option.default_for`).
    """
    values = p.own_options
    if not opt.tunable or values.is_set(opt.name) and values.settings[opt.name] != "auto":
        return Decision("user")  # case 1
    if values.is_set(opt.name) or tune:  # cases 2 and 3
        return Decision("timed") if not_runnable is None else Decision("default", not_runnable)
    if opt.default == "auto":  # case 4
        return Decision("default", LEFT_AT_AUTO if not_runnable is None else not_runnable)
    return Decision("user")  # case 5


def not_runnable(target: str, validate_output: bool, on_host: bool = False) -> str | None:
    """Why no candidate can be run here (None: they can; `on_host`: a DirectML host on a GPU times them)."""
    if not validate_output:
        return "not timed: --no-validate runs nothing"
    if on_host:
        return None
    if not runtime.has_target(target):
        return (f"not timed: {runtime.PROVIDERS[target]} is not on this machine; run `dmlopt optimize --tune "
                f"--target {target}` on the target machine to measure")
    refusal = runtime.timing_refusal(target)
    if refusal is not None:
        return f"not timed: {refusal}"
    return None


def pending(p: DmlPass, context: PassContext) -> list[Option]:
    """The options of pass `p` to choose now (timed or documented default: `decide`)."""
    return [opt for opt in p.options if decide(opt, p, tune=context.engine.tune, not_runnable=None).pending]


def candidates(opt) -> list:
    if opt.choices:
        return [c for c in opt.choices if c != "auto"]
    if opt.type is bool:
        return [False, True]
    return [opt.default]


def validation_tolerances(precision: str, atol: float | None, rtol: float | None) -> tuple[float | None, float | None]:
    """float16 tolerances for a model written in float16 (its outputs may be float32 with keep_io_types,
    the error is not)."""
    if precision != "float16":
        return atol, rtol
    half_atol, half_rtol = DEFAULT_TOLERANCES["float16"]
    return (half_atol if atol is None else atol), (half_rtol if rtol is None else rtol)


@dataclasses.dataclass(frozen=True)
class Step:
    """One option to choose: `option` of the pass at `index` in the pipeline, and how (`decide`)."""

    index: int
    pass_name: str
    option: Option
    decision: Decision = Decision("timed")


@dataclasses.dataclass
class Outcome:
    """What tuning decided: the value of every pending option (pass name -> option -> value, the
    engine's choices, kept apart from the user's settings), and the report's records."""

    choices: dict[str, dict[str, Any]]
    records: list[tuple[str, str, Any, dict[str, Any]]]  # (pass, option, choice, record)
    # Indices of the passes to run for the output (None: all); set when the input itself won.
    only: set[int] | None = None


def steps(pass_classes: Sequence[type[DmlPass]], context: PassContext, *,
          validate_output: bool = True) -> list[Step]:
    """The options to choose, each with its `decide` decision, in the order they are decided: the
    precision first, then pipeline order."""
    why = not_runnable(context.target.ep, validate_output, on_host=context.engine.timer is not None)
    found = []
    for index, cls in enumerate(pass_classes):
        p = cls(context)
        for opt in p.options:
            decision = decide(opt, p, tune=context.engine.tune, not_runnable=why)
            if decision.pending:
                found.append(Step(index, cls.name, opt, decision))
    return sorted(found, key=lambda s: (s.option.name != PRECISION_OPTION, s.index))


def resolve(order: Sequence[Step], original: ir.Model, context: PassContext, run: Runner, *,
            check: Mapping[str, Any] | None = None, progress=None) -> Outcome:
    """Choose every option of `order` (from `steps`): time those decided "timed", give the others
    their documented default."""
    if not order:
        return Outcome({}, [])
    if context.engine.tune:
        require_target(context.target.ep, on_host=context.engine.timer is not None)
    untimed = _documented_defaults([s for s in order if s.decision.how == "default"], context)
    timed = [s for s in order if s.decision.how == "timed"]
    if not timed:
        return untimed
    fixed = dataclasses.replace(context, options=context.options.with_choices(untimed.choices))
    outcome = _Tuner(timed, original, fixed, run, dict(check or {}), progress).tune()
    return Outcome(_merged(untimed.choices, outcome.choices), untimed.records + outcome.records, outcome.only)


def _merged(*choices: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for each in choices:
        for pass_name, values in each.items():
            merged.setdefault(pass_name, {}).update(values)
    return merged


def _by_pass(order: Sequence[Step], options: OptionStore) -> dict[str, dict[str, Any]]:
    """The values `options` holds for the options of `order`, pass name -> option -> value."""
    return _merged(*({s.pass_name: {s.option.name: options.value(s.pass_name, s.option.name)}} for s in order))


def _documented_defaults(order: Sequence[Step], context: PassContext) -> Outcome:
    """Each option of `order` at its documented default for the target and the precision written."""
    options = context.options
    records = []
    for step in order:  # the precision option comes first, so the others see its value
        precision = precision_of(options)
        value = step.option.default_for(context.target.ep, precision)
        options = options.chose(step.pass_name, step.option.name, value)
        source = step.option.default_provenance(context.target.ep, precision)
        records.append((step.pass_name, step.option.name, value, {
            "how": f"{step.decision.why}; {source}", "precision": precision, "default_from": source,
            "candidates": {}}))
    return Outcome(_by_pass(order, options), records)


@dataclasses.dataclass
class _Build:
    """A candidate: the pipeline's output under `options`, validated."""

    options: OptionStore
    model: ir.Model | None
    max_rel_error: float = 0.0
    rejected: str | None = None
    modified: dict[int, bool] = dataclasses.field(default_factory=dict)  # pass index -> changed the graph

    @property
    def precision(self) -> str:
        return precision_of(self.options)


class _Tuner:
    def __init__(self, order, original, context, run, check, progress):
        self.order = list(order)
        self.original = original
        self.context = context
        self.run = run
        self.check = check
        self.progress = progress
        self.plan: dict[str, Any] = {}  # the options decided so far
        self.names = [s.option.name for s in self.order]
        self.owners = {s.option.name: s.pass_name for s in self.order}
        self._prefix: tuple[int, ir.Model] | None = None  # (pass index, the model before it) under the plan
        self.default = self.build(self.resolved({}), label="the default pipeline")
        self.best = self.default

    # -- options --------------------------------------------------------------
    def resolved(self, plan: Mapping[str, Any]) -> OptionStore:
        """The store with every pending option chosen: as decided in `plan` (by option name), else
        at its default for the target and precision."""
        options = self.context.options
        for step in self.order:  # the precision option comes first, so the others see its value
            name = step.option.name
            value = plan[name] if name in plan else step.option.default_for(
                self.context.target.ep, precision_of(options))
            options = options.chose(step.pass_name, name, value)
        return options

    def value(self, options: OptionStore, name: str) -> Any:
        """The value of pending option `name` under `options`."""
        return options.value(self.owners[name], name)

    def key(self, options: OptionStore) -> tuple:
        return tuple((n, repr(self.value(options, n))) for n in self.names)

    # -- building candidates ----------------------------------------------------
    def build(self, options: OptionStore, *, label: str, start: int = 0, model: ir.Model | None = None,
              only: set[int] | None = None) -> _Build:
        """Run the pipeline (from pass `start` on `model`, else from the input) and validate the output."""
        if self.progress:
            self.progress(f"tuning: build {label}")
        try:
            out, modified = self.run(model if model is not None else self.original.clone(), options,
                                     start=start, only=only)
            atol, rtol = validation_tolerances(precision_of(options), self.check.get("atol"), self.check.get("rtol"))
            v = validate(self.original, out, shapes=self.context.shapes, dims=self.context.dims,
                         inputs=self.check.get("inputs"), atol=atol, rtol=rtol)
        except DmlOptError as e:  # a candidate that breaks is reported, never shipped, never fatal
            return _Build(options, None, rejected=f"invalid model: {e}")
        if not v.passed:
            return _Build(options, None, rejected="failed validation")
        return _Build(options, out, max((o.max_rel for o in v.outputs), default=0.0), modified=modified)

    def prefix(self, index: int) -> ir.Model:
        """A copy of the model before pass `index` under the plan (every earlier pass is decided by now)."""
        options = self.resolved(self.plan)
        if self._prefix is None or self._prefix[0] > index:
            self._prefix = (0, self.original.clone())
        at, model = self._prefix
        if at < index:
            model, _ = self.run(model, options, start=at, stop=index)
        self._prefix = (index, model)
        return model.clone()

    # -- deciding -----------------------------------------------------------------
    def tune(self) -> Outcome:
        records = [self.decide(step) for step in self.order]
        options, only = self.resolved(self.plan), None
        confirmed = None
        if any(record.get("baseline") is not None for *_, record in records):  # something was timed
            confirmed = self.confirm()
        if confirmed:
            final, winner = confirmed
            if winner == "default":
                options = self.resolved({})
            elif winner == "input":
                only = self.input_passes()
            for *_, record in records:
                if winner != "tuned":
                    record["overruled"] = f"the final comparison kept the {_RESULTS[winner]} (faster)"
            records.append(("pipeline", "result", winner, final))
        records = [(p, n, self.value(options, n) if p != "pipeline" else c, r) for p, n, c, r in records]
        return Outcome(_by_pass(self.order, options), records, only)

    def decide(self, step: Step) -> tuple[str, str, Any, dict[str, Any]]:
        """Choose `step`'s option: each candidate's whole-pipeline output, validated, timed together."""
        opt, name, index = step.option, step.option.name, step.index
        current = self.value(self.resolved(self.plan), name)
        choices = candidates(opt)
        builds: dict[Any, _Build] = {}
        same_output: dict[str, str] = {}
        changed = False
        if name == PRECISION_OPTION:  # the precision changes the earlier passes' defaults: whole pipelines
            for choice in choices:
                options = self.resolved({**self.plan, name: choice})
                reuse = self.best if self.key(options) == self.key(self.best.options) else None
                builds[choice] = build = reuse or self.build(options, label=f"{opt.flag} {choice}")
                changed = changed or build.rejected is not None or build.modified.get(index, False)
        else:
            # The pass alone on the shared prefix first: candidates that leave the graph alone share one
            # output, and where no candidate changes it nothing is built or timed.
            trials = {}
            for choice in sorted(choices, key=lambda c: c != current):  # first the current one (the best so far)
                options = self.resolved({**self.plan, name: choice})
                try:
                    model, done = self.run(self.prefix(index), options, start=index, stop=index + 1)
                except DmlOptError as e:  # this choice breaks the model: reported, never shipped
                    builds[choice] = _Build(options, None, rejected=f"invalid model: {e}")
                    continue
                trials[choice] = (options, model, done.get(index, False))
            changed = bool(builds) or any(modified for _, _, modified in trials.values())
            unchanged = None
            for choice, (options, model, modified) in trials.items() if changed else ():
                if not modified and unchanged is not None:
                    same_output[str(choice)] = str(unchanged)  # left the graph alone too: that output
                    continue
                unchanged = choice if unchanged is None and not modified else unchanged
                same = self.key(options) == self.key(self.best.options)
                builds[choice] = self.best if same else self.build(options, label=f"{opt.flag} {choice}",
                                                                   start=index + 1, model=model)
            del trials
            builds = {c: builds[c] for c in choices if c in builds}  # the report lists them in declared order
        if not changed:
            self.plan[name] = _baseline(choices, current)
            same = dataclasses.replace(self.best, options=self.resolved(self.plan))  # the same model
            self.default = same if self.best is self.default else self.default
            self.best = same
            return step.pass_name, name, self.plan[name], {
                "how": "not timed: no choice changes this graph (nothing for the pass to do)",
                "precision": self.best.precision, "candidates": {}, "rejected": {}}
        rejected = {str(c): b.rejected for c, b in builds.items() if b.rejected}
        good = {c: b for c, b in builds.items() if not b.rejected}
        if not good:
            self.plan[name] = current
            return step.pass_name, name, current, {"how": "no candidate validated", "precision": None,
                                                   "candidates": {}, "rejected": rejected}
        base = str(current if current in good else next(iter(good)))
        labels = {str(c): c for c in good}
        timed = self.time({str(c): b for c, b in good.items()}, base, f"{step.pass_name} {opt.flag}")
        best = labels[_fastest(timed["models"], preferred=[base])]
        self.plan[name], self.best = best, good[best]
        precisions = sorted({b.precision for b in good.values()})
        return step.pass_name, name, best, {
            "how": (f"measured on {timed['provider']}: each candidate is the whole pipeline's output in "
                    f"{' or '.join(precisions)} ({TUNE_RUNS} alternating runs), the fastest that validated"),
            "precision": self.best.precision, "baseline": base,
            "candidates": _candidates(timed, good, base), "rejected": rejected, "same_output": same_output}

    def confirm(self) -> tuple[dict[str, Any], str] | None:
        """Time the tuned output against the untuned default output and, with --tune, the input;
        the fastest wins.  None when there is nothing to compare it with."""
        entries = {"tuned": self.best}
        if self.default.model is not None and self.key(self.default.options) != self.key(self.best.options):
            entries["default"] = self.default
        rejected = {}
        if self.context.engine.tune:  # asked for the fastest output: the input is a candidate
            only = self.input_passes()
            if only:  # the user asked for float16: the input converted, nothing else
                entry = self.build(self.resolved(self.plan), label="the input in float16", only=only)
            else:
                entry = _Build(self.context.options, self.original)
            if entry.rejected:
                rejected["input"] = entry.rejected
            else:
                entries["input"] = entry
        if len(entries) == 1:
            return None
        baseline = "input" if "input" in entries else "default"
        timed = self.time(entries, baseline, "the result")
        winner = _fastest(timed["models"], preferred=["tuned", "default", "input"])
        against = " and ".join(_RESULTS[name] for name in entries if name != "tuned")
        return {"how": (f"measured on {timed['provider']}: the tuned output against the {against} "
                        f"({TUNE_RUNS} alternating runs); the fastest is written, the tuned one unless another "
                        f"is more than {NOISE:.0%} faster"),
                "precision": entries[winner].precision, "baseline": baseline,
                "candidates": _candidates(timed, entries, baseline), "rejected": rejected}, winner

    def input_passes(self) -> set[int]:
        """What 'the input' still goes through: the float16 conversion when the user asked for it, else nothing."""
        if self.context.options.value(PRECISION_PASS, PRECISION_OPTION) is not True:
            return set()
        return {i for i, cls in enumerate(self.run.passes) if cls.name == PRECISION_PASS}

    def time(self, builds: Mapping[str, _Build], baseline: str, what: str) -> dict[str, Any]:
        models = {label: b.model for label, b in builds.items()}
        common = dict(runs=TUNE_RUNS, warmup=TUNE_WARMUP, baseline=baseline, shapes=self.context.shapes,
                      dims=self.context.dims, progress=self.progress, label=f"tuning {what} ({len(builds)} candidates)")
        if self.context.engine.timer is not None:  # a DirectML host on a GPU
            return self.context.engine.timer(models, **common)
        return bench.compare(models, self.context.target.ep, graph_capture="as-deployed", **common)


_RESULTS = {"tuned": "tuned output", "default": "untuned default pipeline", "input": "input"}


def _baseline(choices: list, current: Any) -> Any:
    """The candidate that leaves the graph as it is: 'keep', off, or else the current choice."""
    if "keep" in choices:
        return "keep"
    if False in choices:
        return False
    return current


def _fastest(models: Mapping[str, Mapping[str, Any]], preferred: Sequence[str]) -> str:
    """The fastest by the median of per-pair ratios, unless a preferred one (first preferred first) is
    within NOISE of it by that ratio or by median latency: only a clear difference moves the choice."""
    fastest = min(models, key=lambda c: models[c]["ratio_median"])

    def as_fast(c: str) -> bool:
        m, f = models[c], models[fastest]
        return (m["ratio_median"] <= f["ratio_median"] * (1 + NOISE)
                or m["latency_ms"]["median"] <= f["latency_ms"]["median"] * (1 + NOISE))

    return next((c for c in preferred if c in models and as_fast(c)), fastest)


def _candidates(timed: Mapping[str, Any], builds: Mapping[Any, _Build], baseline: str) -> dict[str, Any]:
    by_label = {str(c): b for c, b in builds.items()}
    return {c: {"median_ms": m["latency_ms"]["median"], "min_ms": m["latency_ms"]["min"],
                "p90_ms": m["latency_ms"]["p90"], "ratio_vs_" + baseline: m["ratio_median"],
                "ratio": m["ratio_median"], "ratio_spread": m.get("ratio"), "copies": m["copies"],
                "max_rel_error": by_label[c].max_rel_error,
                "precision": by_label[c].precision}
            for c, m in timed["models"].items()}
