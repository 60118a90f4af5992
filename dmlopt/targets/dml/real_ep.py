"""The real DirectML EP behind dmlopt's commands: where it runs, and its placement, numerics and times.

Why: every command that means DirectML (calibrate, inspect --ep dml, validate --ep dml, optimize
--target dml, bench --ep dml) must use the real provider when it is here, and say which one it
used.  On Windows that is onnxruntime-directml in this process; elsewhere the Wine host of
``host.py`` when one is configured (``--dml-host DIR`` or ``DMLOPT_DML_HOST``), at the ORT version
asked for among those installed there.  Without either, commands predict as before and say how
to get the host.  Timings from a software Vulkan device (lavapipe) are printed as such and never
chosen by.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Mapping

import numpy as np
import onnx_ir as ir

from dmlopt.io import scratch
from dmlopt.runtime import sessions as runtime
from dmlopt.errors import ProviderError, UsageError
from dmlopt.io.tables import format_table
from dmlopt.targets.dml import host as host_mod
from dmlopt.runtime.validate import compare, make_inputs, output_rows, run as run_cpu
from dmlopt.runtime.bench import before_after, profile_summary, profile_table, ratio_summary, same_inputs
from dmlopt.runtime.bench import summary as latency_summary

__all__ = ["RealEP", "compare_on_host", "host_line", "placement", "resolve", "retime", "time_model", "time_models", "timer",
           "unavailable", "validate_real"]

IN_PROCESS = "in-process"


@dataclasses.dataclass(frozen=True)
class RealEP:
    """Where the real DmlExecutionProvider runs: this process (Windows) or a Wine host folder."""
    kind: str  # IN_PROCESS or "wine"
    version: str  # ONNX Runtime version
    host: host_mod.Host | None = None

    def describe(self) -> dict[str, Any]:
        if self.host is not None:
            return self.host.describe(self.version)
        return {"host": IN_PROCESS, "folder": None, "ort_version": self.version, "directml_dll": "as installed",
                "vulkan_device": None, "software": False, "note": None}

    @property
    def software(self) -> bool:
        return bool(self.describe()["software"])

    def run(self, model: ir.Model, feeds: Mapping[str, np.ndarray], *, level: str = "all",
            list_nodes: bool = True, warmup: int = 0, runs: int = 1, profile: bool = False) -> host_mod.HostRun:
        if self.host is not None:
            return self.host.run(model, feeds, self.version, level=level, list_nodes=list_nodes,
                                 warmup=warmup, runs=runs, profile=profile)
        return _run_in_process(model, feeds, level=level, warmup=warmup, runs=runs, described=self.describe())


def _installed() -> str:
    return ".".join(runtime.ort().__version__.split(".")[:3])


def resolve(flag: str | os.PathLike | None = None, ort_version: str | None = None, *,
            required: bool = False, what: str = "this command", other_version_ok: bool = False) -> RealEP | None:
    """The real EP to use, or None (none here; `required`: a ProviderError saying how to get one).

    In this process when onnxruntime has DirectML (then `ort_version`, when given, must be the
    installed one's MAJOR.MINOR[.PATCH], else None with `other_version_ok`, else an error); else
    the host folder; an ORT version the host does not have is an error naming the installed ones."""
    if runtime.has_target("dml") and not host_mod.configured(flag):
        installed = _installed()
        if ort_version not in (None, "", "auto") and not (installed + ".").startswith(ort_version + "."):
            if other_version_ok:
                return None
            raise UsageError(f"--ort-version {ort_version}: the DirectML EP here is onnxruntime {installed} "
                             "(install that version, or use a host folder: --dml-host DIR)")
        return RealEP(IN_PROCESS, installed)
    host = host_mod.find(flag)
    if host is None:
        if required:
            raise ProviderError(unavailable(what))
        return None
    return RealEP("wine", host.choose(ort_version), host)


def why_not(ort_version: str | None, what: str) -> str:
    """Why `resolve(..., other_version_ok=True)` gave None."""
    if runtime.has_target("dml"):
        return f"--ort-version {ort_version}: the DirectML EP in this process is onnxruntime {_installed()}"
    return unavailable(what)


def unavailable(what: str = "this command") -> str:
    return (f"DirectML is missing: {what} needs the real DmlExecutionProvider (onnxruntime-directml on Windows); "
            f"{host_mod.HOW_TO}")


def host_line(described: Mapping[str, Any]) -> str:
    """One line naming the real EP a result came from."""
    where = ("in this process" if described["host"] == IN_PROCESS else
             f"under Wine ({described['folder']}) on Vulkan device {described['vulkan_device']}")
    note = f" [{described['note']}]" if described.get("note") else ""
    return (f"real DirectML EP: ONNX Runtime {described['ort_version']}, DirectML.dll {described['directml_dll']}, "
            f"{where}{note}")


def placement(model: ir.Model, ep: RealEP, *, feeds: Mapping[str, np.ndarray] | None = None, shapes=None,
              dims=None) -> dict[str, Any]:
    """Where the real EP put the nodes of `model` (ORT's rewrites on, as deployed): CPU nodes,
    copies, compiled partitions, and the host."""
    if feeds is None:
        feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims))
    result = ep.run(model, feeds)
    return {**result.placement, "host": result.host}


def validate_real(ref: ir.Model, cand: ir.Model, ep: RealEP, *, shapes=None, dims=None, inputs=None,
                  atol: float | None = None, rtol: float | None = None, seed: int = 0,
                  feeds: Mapping[str, np.ndarray] | None = None,
                  per_output: Mapping[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """`cand` on the real EP (ORT's rewrites on, as deployed) against `ref` on the CPU EP (rewrites
    off: the reference validation's own outputs), output by output with validation's tolerances
    (`per_output`: the (atol, rtol) the CPU validation used for each output)."""
    if feeds is None:
        feeds = make_inputs(ref, cand, shapes, dims, inputs, seed)
    expected = run_cpu(ref, feeds)
    result = ep.run(cand, {k: v for k, v in feeds.items() if k in {i.name for i in cand.graph.inputs}})
    per_output = per_output or {}
    checks = [compare(name, expected[name], result.outputs.get(name), *per_output.get(name, (atol, rtol)))
              for name in expected]
    return {"passed": all(c.passed for c in checks), "host": result.host,
            "outputs": [c.to_dict() for c in checks], "placement": result.placement,
            "inputs": {k: list(np.shape(v)) for k, v in feeds.items()}, "seed": None if inputs else seed}


def validation_table(result: Mapping[str, Any]) -> str:
    """Verdict first, then the host, then one row per output, then where the nodes ran."""
    verdict = "passed" if result["passed"] else "FAILED"
    lines = [f"validation on the real DirectML EP ({verdict}):", "  " + host_line(result["host"])]
    lines.append(output_rows(result["outputs"]))
    lines.append("  " + placement_line(result["placement"]))
    return "\n".join(lines)


def report_text(result: Mapping[str, Any]) -> str:
    """The optimize report's part: the table, or the one line saying why it did not run."""
    if result.get("passed") is None:
        return f"validation on the real DirectML EP: not run ({result.get('skipped', '')})"
    return validation_table(result)


def placement_line(p: Mapping[str, Any]) -> str:
    if not p.get("found"):
        return "placement: ORT's log had no node placement (not verbose?)"
    parts = [f"{p['cpu_nodes']} CPU nodes", f"{p['copies']} copies",
             f"{'?' if p['partitions'] is None else p['partitions']} compiled DML partitions"]
    if p.get("dml_standalone"):
        parts.append(f"{p['dml_standalone']} DML nodes outside compiled partitions")
    ops = ", ".join(f"{op} x{n}" for op, n in list(p["cpu_ops"].items())[:8])
    return "actual placement: " + ", ".join(parts) + (f" (CPU: {ops})" if ops else "")


def time_model(model: ir.Model, ep: RealEP, *, runs: int = 20, warmup: int = 3, shapes=None,
               dims=None, profile: bool = False) -> dict[str, Any]:
    """Session creation and latency of `model` on the real EP, in one process; a software device's
    times are labelled and carry no speed claim.  `profile`: ORT's profile of the runs, summarised
    as `bench --profile` does (the host's node binding writes one from ORT 1.24)."""
    feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims))
    result = ep.run(model, feeds, warmup=warmup, runs=runs, profile=profile)
    out = {"provider": "DmlExecutionProvider", "host": result.host, "software": bool(result.host["software"]),
           "session_ms": result.session_ms, "warmup_ms": result.warmup_ms, "runs": runs,
           "latency_ms": latency_summary(result.run_ms), "placement": result.placement,
           "note": result.host["note"]}
    if profile:
        out["profile"] = profile_summary(result.profile) if result.profile else None
        if out["profile"] is None:
            out["profile_missing"] = (f"ONNX Runtime {ep.version}'s node binding wrote no profile (onnxruntime-node "
                                      "writes one from 1.24: --ort-version)")
    return out


def time_models(models: Mapping[str, ir.Model], ep: RealEP, feeds: Mapping[str, np.ndarray], *,
                baseline: str | None = None, runs: int = 10, warmup: int = 3, progress=None) -> dict[str, Any]:
    """Several models on the real EP where it is a GPU, in ``bench.compare``'s shape.

    Each model runs in its own host process, in the order A B ... B A, so drift over the processes
    hits every model alike; run i of a model is paired with run i of the baseline for its ratio.
    A software device is refused (ProviderError): its times choose nothing."""
    if ep.software:
        raise ProviderError(f"the real DirectML EP here is {host_mod.SOFTWARE_NOTE}: its times compare nothing")
    names = list(models)
    baseline = baseline or names[0]
    times: dict[str, list[float]] = {n: [] for n in names}
    sessions: dict[str, list[float]] = {n: [] for n in names}
    placements: dict[str, dict[str, Any]] = {}
    described: dict[str, Any] = {}
    for index, name in enumerate(names + names[::-1]):
        if progress:
            progress(f"host process {index + 1}/{2 * len(names)}: {name}")
        wanted = {v.name for v in models[name].graph.inputs}
        result = ep.run(models[name], {k: v for k, v in feeds.items() if k in wanted}, warmup=warmup, runs=runs)
        times[name] += list(result.run_ms)
        sessions[name].append(result.session_ms)
        placements[name] = result.placement
        described = result.host
    out: dict[str, Any] = {}
    for name in names:
        pairs = min(len(times[name]), len(times[baseline]))
        ratios = [a / b for a, b in zip(times[name][:pairs], times[baseline][:pairs]) if b > 0]
        ratio = ratio_summary(ratios)
        out[name] = {"load_s": min(sessions[name]) / 1e3, "latency_ms": latency_summary(times[name]),
                     "ratios": ratios, "ratio": ratio, "ratio_median": ratio["median"],
                     "copies": placements[name].get("copies"), "placement": placements[name]}
    return {"provider": "DmlExecutionProvider", "baseline": baseline, "models": out, "host": described,
            "adapter": host_line(described), "inputs": {k: list(np.shape(v)) for k, v in feeds.items()},
            "how": "each model in its own host process (A B ... B A), runs paired in order"}


def retime(before: ir.Model, after: ir.Model, ep: RealEP, *, shapes=None, dims=None, inputs=None,
           runs: int = 10, warmup: int = 3) -> dict[str, Any]:
    """Before/after on the real EP where it is a GPU (a Wine host on a GPU's Vulkan, or Windows): the
    report's ``timing``, from `time_models` (before, after, after, before)."""
    basis: list[str] = []
    feeds = make_inputs(before, after, shapes, dims, inputs, basis=basis)
    result = time_models({"before": before, "after": after}, ep, feeds, baseline="before", runs=runs, warmup=warmup)
    return {**before_after(result, feeds, basis, result["models"]["after"]["ratio"]["runs"]),
            "host": result["host"], "how": result["how"]}


def compare_on_host(models: Mapping[str, ir.Model], ep: RealEP, *, baseline: str | None = None, runs: int = 10,
                    warmup: int = 3, shapes=None, dims=None, progress=None) -> dict[str, Any]:
    """`time_models` on one set of inputs every model accepts (``bench.same_inputs``), as ``bench.compare``
    does: `bench --ep dml --compare` and tuning's candidates on a host whose device is a GPU."""
    feeds, basis = same_inputs(models, shapes, dims)
    return {**time_models(models, ep, feeds, baseline=baseline, runs=runs, warmup=warmup, progress=progress),
            "input_basis": basis}


def timer(ep: RealEP | None):
    """`compare_on_host` bound to `ep` as tuning calls it (``EngineSettings.timer``, called as ``bench.compare``
    is), or None where `ep` is no GPU: no host, or a software device."""
    if ep is None or ep.software:
        return None

    def time_on_host(models, *, label=None, progress=None, **kw):
        if progress and label:
            progress(f"{label} on the real DirectML EP (ORT {ep.version})")
        return compare_on_host(models, ep, progress=progress, **kw)
    return time_on_host


def time_table(result: Mapping[str, Any]) -> str:
    lat = result["latency_ms"]
    lines = [host_line(result["host"])]
    if result["software"]:
        lines.append(f"times below are {host_mod.SOFTWARE_NOTE} (a CPU emulates the GPU); they show only "
                     "that the model runs")
    rows = [("session creation", "runs", "median", "p90", "min"),
            (f"{result['session_ms']:.0f} ms", result["runs"], f"{lat['median']:.2f} ms", f"{lat['p90']:.2f} ms",
             f"{lat['min']:.2f} ms")]
    lines.append(format_table(rows))
    lines.append(placement_line(result["placement"]))
    if result.get("profile"):
        lines.append(profile_table(result["profile"], "DmlExecutionProvider"))
    elif result.get("profile_missing"):
        lines.append(f"profile: none ({result['profile_missing']})")
    return "\n".join(lines)


def _run_in_process(model: ir.Model, feeds: Mapping[str, np.ndarray], *, level: str, warmup: int, runs: int,
                    described: dict[str, Any]) -> host_mod.HostRun:
    """The same run with onnxruntime-directml in this process (Windows)."""
    levels = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED", "basic": "ORT_ENABLE_BASIC",
              "disabled": "ORT_DISABLE_ALL"}
    with scratch.capture_stderr() as box:
        t0 = time.perf_counter()
        sess = runtime.session(model, "dml", log_severity=0, level=levels[level])
        session_ms = (time.perf_counter() - t0) * 1e3
        wanted = {i.name for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        given = {k: v for k, v in feeds.items() if k in wanted}
        times, values = [], []
        for _ in range(warmup + max(1, runs)):
            t = time.perf_counter()
            values = sess.run(names, given)
            times.append((time.perf_counter() - t) * 1e3)
        del sess
    return host_mod.HostRun(outputs=dict(zip(names, (np.asarray(v) for v in values))), session_ms=session_ms,
                            warmup_ms=times[:warmup], run_ms=times[warmup:], log=box["text"],
                            placement=host_mod.placement_summary(box["text"]), host=described)
