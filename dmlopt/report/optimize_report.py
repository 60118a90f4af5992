"""The report: what each pass changed or declined, what was measured; JSON and a table.

The JSON schema (documented in README.md, key names are stable):
  verdict      the lines the table opens with: DirectML placement before -> after, numerics with the
               shapes used, timing with its spread (or why none)
  dmlopt_version, target, ort_version (as asked; null: the default), target_resolved (the target and
  the ORT version dmlopt reasoned about, one line), options,
  input  {nodes, op_counts, initializer_bytes, inputs, outputs}
  output {nodes, op_counts, initializer_bytes}
  passes [{name, modified, seconds, nodes_before, nodes_after, op_delta, sites, notes}]
  choices [{pass, option, choice, how, precision, baseline, candidates {choice: {median_ms, min_ms, p90_ms,
           ratio, copies, max_rel_error, precision}}, rejected {choice: reason}, same_output {choice: the
           candidate whose output it shares (neither changed the graph)}, overruled,
           default_from (where an untimed default comes from)}]
           options resolved from "auto" (each candidate timed as the whole pipeline's output, in the
           precision it names), then {pass: "pipeline", option: "result", choice: tuned|default|input}:
           the final comparison of the tuned output, the untuned default output and (--tune) the input
  validation {passed, inputs, input_basis (where each chosen size came from), seed,
              outputs [{name, max_abs, max_rel, cosine, ...}]}
  real_ep      --target dml: the output on the real DirectML EP against the input on the CPU EP,
               {passed, host {ort_version, directml_dll, vulkan_device, software, note}, outputs [...],
               placement {cpu_nodes, copies, partitions, ...}}, or {passed: null, skipped: why}
  broken_by    first pass that broke numerics (when validation failed)
  fp16_repair  {passed, validation_runs, max_runs, kept [{node, op, found_by, detail, max_abs}],
               float16_nodes, reason, note} when float16 failed validation and the repair ran
  timing       {provider, before_ms, after_ms, speedup, ratio_median, ratio {median, p10, p90, runs, verdict},
               verdict, inputs, input_basis, runs, before{}, after{}, load_s_before, load_s_after,
               copies_before, copies_after, io_binding, graph_capture (WebGPU: "on, ..." when both were timed
               under capture as the session file runs them, "off: why" otherwise)} when re-timed;
               {provider, identical: true, verdict} when no pass changed the graph (nothing timed)
  not_timed    why there is no timing (null when timed)
  placement    {before, after} predicted DirectML placement, when computed
  graph_capture  {target, provider, ort_version, ready, line, basis, blockers [{kind, summary, detail,
               nodes, known}], warnings}: graph-capture readiness of the output (targets dml, cuda)
  session_config {config, path, snippet}: the recommended session (dmlopt.targets.session_config), the file
               written beside the output (null with --no-session-config) and the Python that loads it
  written      the output path, or null when nothing was written
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import onnx_ir as ir

from dmlopt.report import html_page as html_report
from dmlopt.errors import TEXT_WIDTH, UsageError, printable, printable_tree
from dmlopt.graph.check import describe_values, op_counts
from dmlopt.targets.dml import real_ep
from dmlopt.io.jsontext import json_text
from dmlopt.io.model import initializer_bytes, write_text
from dmlopt.io.tables import format_table
from dmlopt.runtime.validate import RULE, output_rows, shapes_text
from dmlopt.version import __version__

DML_PROVIDER = "DmlExecutionProvider"


@dataclasses.dataclass
class Report:
    target: str
    ort_version: str | None
    options: dict[str, Any]
    input: dict[str, Any]
    output: dict[str, Any] = dataclasses.field(default_factory=dict)
    passes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    choices: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    validation: dict[str, Any] | None = None
    real_ep: dict[str, Any] | None = None
    broken_by: str | None = None
    fp16_repair: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    placement: dict[str, Any] | None = None
    graph_capture: dict[str, Any] | None = None
    session_config: dict[str, Any] | None = None
    written: str | None = None
    forced: bool = False
    target_resolved: str | None = None
    not_timed: str | None = None  # why there is no timing (None when timed)

    @classmethod
    def start(cls, model: ir.Model, *, target: str, ort_version: str | None, options: dict[str, Any]) -> "Report":
        counts = op_counts(model)
        return cls(target=target, ort_version=ort_version, options=dict(options),
                   input={"nodes": sum(counts.values()), "op_counts": counts,
                          "initializer_bytes": initializer_bytes(model),
                          "inputs": describe_values(model.graph.inputs),
                          "outputs": describe_values(model.graph.outputs)})

    def add_pass(self, p, *, before: dict[str, int], after: dict[str, int], modified: bool, seconds: float,
                 replace: bool = False) -> None:
        """Record a pass run; `replace` puts it in the place of an earlier run of the same pass."""
        delta = {op: after.get(op, 0) - before.get(op, 0) for op in sorted(set(before) | set(after))
                 if after.get(op, 0) != before.get(op, 0)}
        chosen = [_choice_summary(c) for c in self.choices if c["pass"] == p.name]
        sites = []
        for site in p.sites:
            entry = site.to_dict()
            if chosen and site.action in ("rewrote", "kept"):
                entry["chosen_by"] = chosen  # the strategy of this site and the timings behind it
            sites.append(entry)
        entry = {
            "name": p.name, "modified": bool(modified), "seconds": round(seconds, 4),
            "nodes_before": sum(before.values()), "nodes_after": sum(after.values()),
            "op_counts_before": before, "op_counts_after": after, "op_delta": delta,
            "sites": sites, "notes": list(p.notes),
        }
        earlier = [i for i, e in enumerate(self.passes) if e["name"] == p.name] if replace else []
        if earlier:
            self.passes[earlier[-1]] = entry
        else:
            self.passes.append(entry)

    def add_choice(self, pass_name: str, option: str, choice: str, record: dict[str, Any]) -> None:
        self.choices.append({"pass": pass_name, "option": option, "choice": choice, **record})

    def finish(self, model: ir.Model, bytes_in: int, bytes_out: int) -> None:
        counts = op_counts(model)
        self.output = {"nodes": sum(counts.values()), "op_counts": counts, "initializer_bytes": bytes_out}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d = {"verdict": self.verdict(), "dmlopt_version": __version__, **d}
        return d

    def failure(self) -> str:
        """Why the output was refused, in one sentence: the input model's own non-finite outputs,
        else the mismatch and the first pass that changed and broke it."""
        v = self.validation or {}
        if v.get("reference_nonfinite") and not v.get("cpu_passed", v.get("passed")):
            return f"numerics not comparable: {_no_finite_reference(v)}"
        culprit = f" (first failing pass: {self.broken_by})" if self.broken_by else ""
        return f"the optimized model does not match the original{culprit}"

    def verdict(self) -> list[str]:
        """What the user came for, one line each: DirectML placement before -> after, numerics with
        the shapes used, timing (or why none)."""
        lines = []
        p = self.placement or {}
        if p.get("before") and p.get("after"):
            b, a = p["before"], p["after"]
            def count(side, key):
                value = side.get(key)
                return len(value) if isinstance(value, list) else (value or {}).get("count", "?")
            lines.append(f"DirectML (ORT {a.get('ort_version')}, predicted): CPU nodes {count(b, 'cpu_nodes')} -> "
                         f"{count(a, 'cpu_nodes')}, copies {count(b, 'memcpy')} -> {count(a, 'memcpy')}, "
                         f"partitions {count(b, 'partitions')} -> {count(a, 'partitions')}")
        t = self.timing or {}
        if t.get("provider") == DML_PROVIDER and t.get("copies_before") is not None:
            lines.append(f"DirectML (measured): copies {t['copies_before']} -> {t['copies_after']}")
        v = self.validation
        if v is None:
            lines.append("numerics: not checked (--no-validate)")
        else:
            where = shapes_text(v.get("inputs") or {}, v.get("input_basis"))
            worst = max((o.get("rel_l2", o["max_rel"]) for o in v["outputs"]), default=0.0)
            blame = f" (first failing pass: {self.broken_by})" if self.broken_by else ""
            cpu_passed = v.get("cpu_passed", v["passed"])
            state = (f"match (max relative L2 error {worst:.2g})" if cpu_passed else
                     f"not comparable: {_no_finite_reference(v)}" if v.get("reference_nonfinite") else "DIFFER" + blame)
            lines.append(f"numerics (ORT CPU EP): {state} on {where}")
            on_ep = v.get("webgpu")
            if on_ep is not None:  # the optimized model on the WebGPU EP itself (dmlopt.targets.webgpu.validation)
                lines.append("numerics (WebGPU EP): " + (f"not run ({on_ep['skipped']})" if "skipped" in on_ep else
                             f"{'match' if on_ep['passed'] else 'DIFFER'} on {on_ep['adapter']}"
                             + ("" if on_ep["passed"] or not cpu_passed else blame)))
        if self.real_ep is not None:  # the optimized model on the real DirectML EP
            r = self.real_ep
            if r.get("passed") is None:
                lines.append(f"numerics (real DirectML EP): not run ({r.get('skipped', '')})")
            else:
                h, p = r.get("host") or {}, r.get("placement") or {}
                lines.append(f"numerics (real DirectML EP, ORT {h.get('ort_version')}): "
                             f"{'match' if r['passed'] else 'DIFFER'}; measured: CPU nodes {p.get('cpu_nodes')}, "
                             f"copies {p.get('copies')}, compiled partitions {p.get('partitions')}"
                             + (f" ({h['note']})" if h.get("note") else ""))
        if t.get("identical"):
            lines.append(f"timing: {t['verdict']}")
        elif t and isinstance(t.get("before_ms"), (int, float)) and isinstance(t.get("after_ms"), (int, float)):
            shapes = f" with {shapes_text(t['inputs'])}" if t.get("inputs") else ""
            lines.append(f"timing on {t.get('provider')}{shapes}: {t['before_ms']:.3f} ms -> {t['after_ms']:.3f} ms, "
                         + t.get("verdict", f"x{t['speedup']:.2f}"))
            if t.get("graph_capture"):
                lines.append(f"graph capture while timing: {t['graph_capture']}")
            if t.get("device_note"):
                lines.append(t["device_note"])
            if self.target == "dml" and t.get("provider") != DML_PROVIDER:
                lines.append(f"note: timed on {t.get('provider')}, which does not represent DirectML")
        elif t:
            lines.append("timing: see the JSON report")
        else:
            lines.append(f"timing: none ({self.not_timed or 'not asked for'})")
        return lines

    def to_json(self) -> str:
        return json_text(self.to_dict())

    def to_table(self) -> str:
        """A readable summary for a terminal: per pass, then validation and timing (names
        escaped: a node name from the model must not forge a line)."""
        passes, choices = printable_tree(self.passes), printable_tree(self.choices)
        validation = printable_tree(self.validation)
        rows = [("pass", "nodes", "changed", "rewrote", "declined", "time")]
        idle = [p["name"] for p in passes if not p["modified"] and not p["sites"]]
        for p in passes:
            if p["name"] in idle:
                continue
            rewrote = sum(1 for s in p["sites"] if s["action"] == "rewrote")
            declined = sum(1 for s in p["sites"] if s["action"] == "declined")
            delta = ", ".join(f"{op} {n:+d}" for op, n in p["op_delta"].items()) or "-"
            rows.append((p["name"], f"{p['nodes_before']} -> {p['nodes_after']}", delta[:60], rewrote, declined,
                         f"{p['seconds']:.2f}s"))
        verdict = "\n".join(printable(line) for line in self.verdict())
        if self.target_resolved:
            verdict += f"\ntarget: {printable(self.target_resolved)}"
        parts = [verdict, format_table(rows) if len(rows) > 1 else "no pass changed the graph"]
        if idle:
            parts[-1] += f"\nchanged nothing: {', '.join(idle)}"
        declines = _declines_by_reason(passes)
        if declines:
            parts.append("declined:\n" + "\n".join(declines[:40]))
            if len(declines) > 40:
                parts.append(f"  ... and {len(declines) - 40} more reasons (see the JSON report)")
        notes = [(p["name"], n) for p in passes for n in p["notes"]]
        if notes:
            parts.append("notes:\n" + "\n".join(f"  {name}: {n}" for name, n in notes))
        parts.extend(_choices_text(choices, {p["name"] for p in passes if p["modified"]}))
        if self.fp16_repair is not None:
            parts.append(_fp16_repair_text(printable_tree(self.fp16_repair)))
        if validation is not None:
            parts.append(_validation_table(validation))
            if self.real_ep is not None:
                parts.append(real_ep.report_text(printable_tree(self.real_ep)))
        parts.extend(_session_text(self.graph_capture, self.session_config))
        return "\n\n".join(parts)


def _declines_by_reason(passes: list[dict[str, Any]]) -> list[str]:
    """One line per (pass, reason), the sites counted with the first as the example: twenty nodes
    declined for one reason are one thing to say, not twenty lines (the JSON lists every site)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in passes:
        for site in p["sites"]:
            if site["action"] == "declined":
                groups.setdefault((p["name"], site["detail"]), []).append(site)
    lines = []
    for (name, detail), sites in groups.items():
        first = f"{sites[0]['node']} ({sites[0]['op']})"
        where = first if len(sites) == 1 else f"{len(sites)} sites, e.g. {first}"
        lines.append(f"  {name}: {where}: {detail}")
    return lines


def _session_text(capture: dict[str, Any] | None, session: dict[str, Any] | None) -> list[str]:
    """The readiness line and, once the configuration file is written, the snippet that loads it."""
    parts = []
    if capture:
        parts.append(printable(capture["line"], TEXT_WIDTH))  # holds dim and node names from the model
    if session and session.get("path"):  # the Python that loads it is in the JSON and HTML reports
        parts.append(f"session configuration: {printable(session['path'])} (the Python that creates the "
                     "session from it: `session_config.snippet` in --json or --report)")
    return parts


def _choices_text(choices: list[dict[str, Any]], modified: set[str]) -> list[str]:
    """One line per option that was timed or that acted on a pass that changed the graph; the
    options left at their documented default in passes that touched nothing, in one line."""
    lines, untouched = [], []
    by_reason: dict[str, list[str]] = {}
    for c in choices:
        flag = f"--{c['option'].replace('_', '-')}"
        if c.get("candidates") or c["pass"] == "pipeline":
            lines.append(f"{c['pass']} {flag}: chose {c['choice']} ({c.get('how', '')})")
        elif c["pass"] in modified:  # untimed: one line per reason, not one sentence per option
            by_reason.setdefault(c.get("how", ""), []).append(f"{flag} {c['choice']}")
        else:
            untouched.append(flag)
    for how, chosen in by_reason.items():
        lines.append(f"chose {', '.join(chosen)} ({how})")
    if untouched:
        lines.append(f"left at their documented defaults, in passes that changed nothing: {', '.join(untouched)}")
    return lines


def _choice_summary(choice: dict[str, Any]) -> dict[str, Any]:
    """What a site needs to know of the option resolved for its pass: the choice, how it was
    made, and each candidate's median latency (the choice is per model, applied to every site)."""
    return {"option": choice["option"], "choice": choice["choice"], "how": choice.get("how", ""),
            "median_ms": {str(c): m.get("median_ms") for c, m in (choice.get("candidates") or {}).items()}}


def _fp16_repair_text(r: dict[str, Any]) -> str:
    n = r["validation_runs"]
    runs = f"{n} validation run{'' if n == 1 else 's'}, at most {r['max_runs']}"
    if not r["passed"]:
        return f"fp16 repair: FAILED ({runs}): {r['reason']}"
    lines = [f"fp16 repair: {len(r['kept'])} nodes kept in float32, {r['float16_nodes']} in float16 ({runs}):"]
    rows = [("node", "op", "found by", "why")]
    rows += [(k["node"], k["op"], k["found_by"], k["detail"]) for k in r["kept"][:40]]
    lines.append(format_table(rows))
    if len(r["kept"]) > 40:
        lines.append(f"  ... and {len(r['kept']) - 40} more (see the JSON report)")
    if r.get("note"):
        lines.append(r["note"])
    return "\n".join(lines)


def _no_finite_reference(v: dict[str, Any]) -> str:
    names = ", ".join(f"'{printable(n)}'" for n in v["reference_nonfinite"])
    return (f"the input model computes no finite values on these inputs (output {names} all NaN/inf); validate "
            "on real data with --inputs FILE.npz")


def _validation_table(v: dict[str, Any]) -> str:
    """The rows the verdict is made of: on the CPU EP, then on the WebGPU EP when it ran there
    (each row's result is that row's own; the WebGPU rows decide when present)."""
    text = ("validation per output (ORT CPU EP, " + ("passed" if v.get("cpu_passed", v["passed"]) else "FAILED")
            + f"; rule: {RULE}):\n" + output_rows(v["outputs"]))
    on_ep = v.get("webgpu")
    if on_ep is not None and "skipped" in on_ep:
        text += f"\nvalidation on the WebGPU EP: not run ({on_ep['skipped']}): validate on the target machine"
    elif on_ep is not None:  # dmlopt.targets.webgpu.validation: the optimized model on the WebGPU EP
        text += (f"\nvalidation on the WebGPU EP ({on_ep['adapter']}): {'passed' if on_ep['passed'] else 'FAILED'}: "
                 f"{on_ep['verdict']}\n" + output_rows(on_ep["optimized"]["outputs"]))
    return text


def write(rep: Report, path) -> None:
    """Write the report atomically: JSON for a .json path, a self-contained page for .html."""
    path = os.fspath(path)
    if path.endswith(".json"):
        text = rep.to_json()
    elif path.endswith(".html"):
        text = html_report.render(rep)
    else:
        raise UsageError(f"--report {path}: the name must end in .json or .html")
    write_text(path, text, "the report", label="--report ")
