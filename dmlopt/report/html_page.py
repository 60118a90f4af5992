"""The report as one self-contained HTML page (``--report out.html``).

For a person deciding whether to ship the rewritten model: a summary (nodes, weights,
latency, copies, numerics), then per pass what changed and why sites were declined, the
op histogram before/after, the predicted DirectML placement, every tuning candidate with
its timing, and validation per output.  Charts are inline SVG and the style is inline
CSS: the page loads nothing from anywhere, so it can be mailed or attached to an issue.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

from dmlopt.runtime.validate import RULE, result_text

# Bars in the op histogram (the rest are in the table).
HISTOGRAM_OPS = 24
# Op types the chart leaves out: their counts move with folding, not with what a pass did.
UNCHARTED = frozenset({"Constant"})
SITES_PER_PASS = 300
CPU_NODES_SHOWN = 60

CSS = """
:root { --fg: #1d2430; --muted: #5d6878; --line: #d9dee6; --bg: #f6f8fb; --card: #ffffff;
        --before: #9aa9bf; --after: #2f6fd6; --ok: #1f8a4c; --bad: #c0392b; --warn: #b7791f; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: var(--bg); }
main { max-width: 1140px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: var(--muted); margin: 0 0 18px; word-break: break-all; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 12px; color: #fff; font-weight: 600;
         font-size: 13px; vertical-align: middle; margin-left: 8px; }
.ok { background: var(--ok); } .bad { background: var(--bad); } .warn { background: var(--warn); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 20px; font-weight: 650; margin-top: 2px; }
.card .d { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line);
        margin: 6px 0 12px; font-size: 13px; }
th, td { text-align: left; padding: 5px 9px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef2f7; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td:first-child { white-space: nowrap; }
tr.chosen td { background: #eaf2ff; font-weight: 600; }
tr.fail td { background: #fdecea; }
.plus { color: var(--bad); } .minus { color: var(--ok); }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
details { background: var(--card); border: 1px solid var(--line); border-radius: 6px; margin: 6px 0;
          padding: 4px 10px; }
summary { cursor: pointer; padding: 4px 0; font-weight: 600; }
.note { color: var(--muted); margin: 4px 0; }
svg text { font-family: system-ui, "DejaVu Sans", sans-serif; }
.legend span { display: inline-block; margin-right: 16px; color: var(--muted); }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; vertical-align: -1px;
          margin-right: 5px; }
footer { color: var(--muted); margin-top: 36px; font-size: 12px; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def render(report) -> str:
    """The whole page for a `dmlopt.report.optimize_report.Report` (or its ``to_dict()``)."""
    r = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    sections = [
        _header(r),
        _verdict_section(r),
        _summary_cards(r),
        _timing_section(r),
        _passes_section(r),
        _histogram_section(r),
        _placement_section(r),
        _session_section(r),
        _choices_section(r),
        _validation_section(r),
    ]
    body = "\n".join(s for s in sections if s)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>dmlopt report: {esc(_model_name(r))}</title>\n<style>{CSS}</style>\n</head>\n'
            f'<body>\n<main>\n{body}\n<footer>dmlopt {esc(r.get("dmlopt_version"))}: every number on this '
            f'page is in the JSON report too (<code>--report out.json</code>).</footer>\n</main>\n</body>\n</html>\n')


# -- pieces -------------------------------------------------------------------------------

def _model_name(r: dict[str, Any]) -> str:
    inputs = r.get("input", {}).get("inputs") or []
    return r.get("written") or (", ".join(i["name"] for i in inputs) or "model")


def _status(r: dict[str, Any]) -> str:
    v = r.get("validation")
    if v is None:
        return '<span class="badge warn">not validated</span>'
    if v.get("passed"):
        return '<span class="badge ok">numerics match</span>'
    return '<span class="badge bad">numerics differ</span>'


def _header(r: dict[str, Any]) -> str:
    written = (f"written to <code>{esc(r['written'])}</code>" + (" (forced despite failed validation)"
               if r.get("forced") else "")) if r.get("written") else "nothing written"
    options = {k: v for k, v in (r.get("options") or {}).items() if k != "tune"}
    opts = ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"
    if (r.get("options") or {}).get("tune"):
        opts += " (--tune: variants measured on the target)"
    return (f'<header id="header"><h1>dmlopt report {_status(r)}</h1>'
            f'<p class="sub">target <b>{esc(_target_line(r))}</b> &middot; options: {esc(opts)} &middot; '
            f'{written}</p></header>')


def _target_line(r: dict[str, Any]) -> str:
    """The target and ORT version the job reasoned about (a report without target_resolved: as asked)."""
    return r.get("target_resolved") or f'{r.get("target")}, ORT {r.get("ort_version") or "newest"}'



def _card(key: str, value: str, detail: str = "") -> str:
    return (f'<div class="card"><div class="k">{esc(key)}</div><div class="v">{value}</div>'
            f'<div class="d">{detail}</div></div>')


def _summary_cards(r: dict[str, Any]) -> str:
    i, o = r.get("input", {}), r.get("output", {})
    cards = [_card("nodes", f"{esc(i.get('nodes', '?'))} &rarr; {esc(o.get('nodes', '?'))}",
                   _pct(i.get("nodes"), o.get("nodes"))),
             _card("weights", f"{_bytes(i.get('initializer_bytes'))} &rarr; {_bytes(o.get('initializer_bytes'))}",
                   _pct(i.get("initializer_bytes"), o.get("initializer_bytes")))]
    t = r.get("timing")
    if t and "before_ms" in t:
        cards.append(_card(f"latency ({_short_provider(t.get('provider'))})",
                           f"{t['before_ms']:.3g} &rarr; {t['after_ms']:.3g} ms",
                           esc(t.get("verdict")
                               or f"x{t['speedup']:.2f} (median of {t.get('runs')} alternating pairs)")))
        if t.get("copies_before") is not None:
            cards.append(_card("copies per run (measured)", f"{t['copies_before']} &rarr; {t.get('copies_after')}",
                               f"from ORT's profile on {esc(_short_provider(t.get('provider')))}"))
    p = r.get("placement") or {}
    if p.get("before") and p.get("after"):
        b, a = p["before"], p["after"]
        cards.append(_card(f"DirectML {esc(a.get('ort_version', ''))} predicted",
                           f"{len(b.get('cpu_nodes', []))} &rarr; {len(a.get('cpu_nodes', []))} CPU nodes",
                           f"copies {b.get('memcpy', {}).get('count', '?')} &rarr; "
                           f"{a.get('memcpy', {}).get('count', '?')}"))
    v = r.get("validation")
    if v and v.get("outputs"):
        worst = max(_rel_l2(o) for o in v["outputs"])
        cards.append(_card("max relative L2 error", f"{worst:.2g}",
                           f"{len(v['outputs'])} output(s), ORT CPU EP" + ("" if v.get("passed") else
                                                                          " &middot; <b>FAILED</b>")))
    return f'<section id="summary" class="cards">{"".join(cards)}</section>'


def _timing_section(r: dict[str, Any]) -> str:
    t = r.get("timing")
    if not t or "before_ms" not in t:
        return ""
    rows = []
    for label, key in (("before", "before"), ("after", "after")):
        lat = t.get(key) or {"median": t[f"{key}_ms"]}
        rows.append(_Bar(label, lat["median"], lat.get("min"), lat.get("p90"), "after" if key == "after" else "before"))
    chart = _bar_chart(rows, unit="ms", title=f"latency on {t.get('provider')}")
    table = _table(("", "median ms", "min ms", "p90 ms", "session load s", "copies"), [
        (label, _num(t.get(key, {}).get("median", t.get(f"{key}_ms"))), _num(t.get(key, {}).get("min")),
         _num(t.get(key, {}).get("p90")), _num(t.get(f"load_s_{key}")), esc(_dash(t.get(f"copies_{key}"))))
        for label, key in (("before", "before"), ("after", "after"))], table_id="timing", numeric_from=1)
    return (f'<section><h2>Latency</h2><p class="note">Original and optimized model timed in alternation on '
            f'{esc(t.get("provider"))}: {esc(t.get("verdict") or "")} (speedup &times;{t["speedup"]:.2f}, the median '
            f'of the per-pair ratios). '
            f'Bars show the median, whiskers min&ndash;p90.</p>{chart}{table}</section>')


def _passes_section(r: dict[str, Any]) -> str:
    passes = r.get("passes") or []
    if not passes:
        return '<section><h2>Passes</h2><p class="note">No pass ran.</p></section>'
    rows = []
    for p in passes:
        counts = _site_counts(p)
        rows.append((esc(p["name"]), "yes" if p.get("modified") else "no",
                     f"{p['nodes_before']} &rarr; {p['nodes_after']}", _delta_text(p.get("op_delta", {})),
                     str(counts["rewrote"]), str(counts["declined"]), str(counts["kept"]), f"{p['seconds']:.2f} s"))
    table = _table(("pass", "changed", "nodes", "op changes", "rewrote", "declined", "kept", "time"), rows,
                   table_id="passes", numeric_cols={2, 4, 5, 6, 7})
    details = [_pass_details(p) for p in passes if p.get("sites") or p.get("notes")]
    return (f'<section><h2>Passes</h2>{table}'
            + ("<h3>Sites: what each pass rewrote, declined (with the reason) or kept</h3>" + "".join(details)
               if details else "") + "</section>")


def _site_counts(p: dict[str, Any]) -> dict[str, int]:
    counts = {"rewrote": 0, "declined": 0, "kept": 0}
    for s in p.get("sites", []):
        counts[s.get("action", "kept")] = counts.get(s.get("action", "kept"), 0) + 1
    return counts


def _pass_details(p: dict[str, Any]) -> str:
    sites = p.get("sites", [])
    counts = _site_counts(p)
    summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "notes"
    rows = [(esc(s.get("action")), f'<span class="mono">{esc(s.get("node"))}</span>', esc(s.get("op")),
             esc(s.get("detail"))) for s in sites[:SITES_PER_PASS]]
    more = (f'<p class="note">&hellip; and {len(sites) - SITES_PER_PASS} more in the JSON report</p>'
            if len(sites) > SITES_PER_PASS else "")
    notes = "".join(f'<p class="note">note: {esc(n)}</p>' for n in p.get("notes", []))
    table = _table(("action", "node", "op", "detail"), rows) if rows else ""
    return (f'<details class="pass-sites" data-pass="{esc(p["name"])}"><summary>{esc(p["name"])}: {summary}'
            f'</summary>{notes}{table}{more}</details>')


def _histogram_section(r: dict[str, Any]) -> str:
    before = r.get("input", {}).get("op_counts") or {}
    after = r.get("output", {}).get("op_counts") or {}
    ops = sorted(set(before) | set(after), key=lambda op: (-max(before.get(op, 0), after.get(op, 0)), op))
    if not ops:
        return ""
    rows = [(esc(op), str(before.get(op, 0)), str(after.get(op, 0)),
             _signed(after.get(op, 0) - before.get(op, 0))) for op in ops]
    table = _table(("op", "before", "after", "change"), rows, table_id="ops", numeric_cols={1, 2, 3})
    changed = sorted((op for op in ops if before.get(op, 0) != after.get(op, 0) and op not in UNCHARTED),
                     key=lambda op: (-_change_in_kind(before.get(op, 0), after.get(op, 0)), op))
    charted = changed[:HISTOGRAM_OPS] or ops[:HISTOGRAM_OPS]
    chart = _paired_chart([(op, before.get(op, 0), after.get(op, 0)) for op in charted])
    shown = (f" The chart shows the {len(charted)} op types that changed most (appeared or vanished first; "
             "Constants left out); the table lists all." if changed else
             f" No op count changed; the chart shows the {len(charted)} most frequent.")
    return (f'<section><h2>Op histogram</h2><p class="note">Nodes by op type, before and after, subgraphs '
            f'included.{shown}</p>{_legend()}{chart}<details><summary>table ({len(ops)} op types)</summary>'
            f'{table}</details></section>')


def _change_in_kind(before: int, after: int) -> float:
    """How much an op count changed, an op that appeared or vanished (0 -> 12, 24 -> 0) ranking first."""
    return abs(after - before) / max(min(before, after), 1) + (1e6 if 0 in (before, after) else 0)


def _verdict_section(r: dict[str, Any]) -> str:
    """What the user came for, first: placement, numerics with the shapes used, timing."""
    lines = r.get("verdict") or []
    if not lines:
        return ""
    return ('<section id="verdict"><h2>Verdict</h2><ul>' + "".join(f"<li>{esc(line)}</li>" for line in lines)
            + "</ul></section>")


def _placement_section(r: dict[str, Any]) -> str:
    p = r.get("placement")
    if not p:
        return ""
    sides = [(k, p[k]) for k in ("before", "after") if p.get(k)]
    if not sides:
        return ""
    metrics = [
        ("nodes reaching the EP", lambda x: x.get("nodes")),
        ("folded away by ORT first (negative: bodies of function ops inlined)", lambda x: x.get("folded_by_ort")),
        ("on DirectML", lambda x: x.get("dml_nodes")),
        ("on CPU", lambda x: len(x.get("cpu_nodes", []))),
        ("copies (Memcpy) per run", lambda x: x.get("memcpy", {}).get("count")),
        ("copied bytes per run", lambda x: _bytes(x.get("memcpy", {}).get("bytes"))),
        ("compiled DML partitions", lambda x: x.get("partitions", {}).get("count")),
    ]
    rows = [(esc(name), *(esc(_dash(f(side))) for _, side in sides)) for name, f in metrics]
    version = sides[-1][1].get("ort_version", "")
    table = _table(("predicted", *(k for k, _ in sides)), rows, table_id="placement",
                   numeric_cols=set(range(1, len(sides) + 1)))
    last_name, last = sides[-1]
    cpu = last.get("cpu_nodes", [])
    cpu_table = ""
    if cpu:
        cpu_rows = [(f'<span class="mono">{esc(c.get("node"))}</span>', esc(c.get("op")), esc(c.get("reason")))
                    for c in cpu[:CPU_NODES_SHOWN]]
        more = f" (first {CPU_NODES_SHOWN} of {len(cpu)})" if len(cpu) > CPU_NODES_SHOWN else ""
        cpu_table = (f'<details><summary>nodes on the CPU {esc(last_name)}{more}</summary>'
                     f'{_table(("node", "op", "why"), cpu_rows)}</details>')
    blockers = last.get("partitions", {}).get("blockers") or []
    blocks = "".join(f'<p class="note">blocks one compiled graph: {esc(b)}</p>' for b in blockers)
    return (f'<section><h2>DirectML placement (predicted, ORT {esc(version)})</h2><p class="note">What the '
            f'placement model predicts the DirectML EP does with the graph: nodes left on the CPU and the '
            f'CPU&harr;GPU copies they cause.</p>{table}{blocks}{cpu_table}</section>')


def _session_section(r: dict[str, Any]) -> str:
    """Graph-capture readiness and the recommended session: each entry with its reason, and the
    Python that creates the session from the JSON written beside the model."""
    capture, session = r.get("graph_capture"), r.get("session_config")
    if not capture and not session:
        return ""
    parts = ['<section id="session"><h2>Session</h2>']
    if capture:
        badge = "ok" if capture.get("ready") else "warn"
        parts.append(f'<p><span class="badge {badge}">{"ready" if capture.get("ready") else "not ready"}</span> '
                     f'{esc(capture.get("line"))}</p><p class="note">{esc(capture.get("basis"))}</p>')
        rows = [(esc(b.get("kind")), esc(b.get("detail")),
                 f'<span class="mono">{esc(", ".join(b.get("nodes", [])[:20]))}</span>',
                 "ORT refuses it" if b.get("known") else "predicted") for b in capture.get("blockers", [])]
        if rows:
            parts.append(_table(("what stops it", "why", "nodes", "certainty"), rows, table_id="graph-capture"))
        parts.extend(f'<p class="note">{esc(w)}</p>' for w in capture.get("warnings", []))
    cfg = (session or {}).get("config")
    if cfg:
        rows = []
        for group in ("provider_options", "session_options", "session_config_entries", "free_dimension_overrides"):
            for key, value in (cfg.get(group) or {}).items():
                rows.append((esc(group), f'<code>{esc(key)}</code>', f'<code>{esc(value)}</code>',
                             esc(cfg.get("reasons", {}).get(f"{group}.{key}", ""))))
        for key, why in (cfg.get("not_set") or {}).items():
            rows.append(("not set", f"<code>{esc(key)}</code>", "-", esc(why)))
        where = (f' written to <code>{esc(session["path"])}</code>' if session.get("path") else
                 " (not written)")
        parts.append(f'<h3>Recommended for {esc(cfg.get("provider"))}{where}</h3>')
        parts.append(_table(("where", "key", "value", "why"), rows, table_id="session-config"))
        if session.get("snippet"):
            parts.append(f'<p class="note">Create the session from it:</p><pre class="mono">'
                         f'{esc(session["snippet"])}</pre>')
    parts.append("</section>")
    return "".join(parts)


def _choices_section(r: dict[str, Any]) -> str:
    choices = r.get("choices") or []
    if not choices:
        return ""
    parts = ['<section id="choices"><h2>Tuning</h2><p class="note">Options chosen among the variants the passes '
             'offer. Candidates that failed validation were dropped; the rest ran in alternation on the target.'
             '</p>']
    for c in choices:
        title = f"{c['pass']} --{c['option'].replace('_', '-')}: chose {c['choice']}"
        parts.append(f"<h3>{esc(title)}</h3><p class=\"note\">{esc(c.get('how', ''))}</p>")
        cands = c.get("candidates") or {}
        rejected = c.get("rejected") or {}
        if cands and all(m.get("ratio") is not None for m in cands.values()):
            # The choice is made on the per-pair ratio (alternating runs), so that is what the bars show.
            bars = [_Bar(str(name), m["ratio"], tone="after" if str(name) == str(c["choice"]) else "before",
                         text=f"\u00d7{m['ratio']:.3f}{_spread(m.get('ratio_spread'))} "
                              f"({m['median_ms']:.3g} ms median)")
                    for name, m in cands.items()]
            parts.append(_bar_chart(bars, unit="", title=f"time relative to {c.get('baseline', 'the baseline')} "
                                                         f"(median of per-pair ratios; chosen in blue)"))
        rows = []
        for name, m in cands.items():
            chosen = str(name) == str(c["choice"])
            rows.append(_Row((esc(name), _num(m.get("median_ms")), _num(m.get("min_ms")), _num(m.get("p90_ms")),
                              _num(m.get("ratio"), 3), _sci(m.get("max_rel_error")), esc(_dash(m.get("copies"))),
                              "chosen" if chosen else ""), "chosen" if chosen else ""))
        for name, why in rejected.items():
            rows.append(_Row((esc(name), "-", "-", "-", "-", "-", "-", esc(why)), "fail"))
        if rows:
            parts.append(_table(("candidate", "median ms", "min ms", "p90 ms",
                                 f"ratio vs {c.get('baseline', 'baseline')}", "max rel error", "copies", ""),
                                rows, table_id=f"choice-{c['pass']}-{c['option']}", numeric_cols={1, 2, 3, 4, 5, 6},
                                css_class="choice"))
    parts.append("</section>")
    return "".join(parts)


def _rel_l2(o: dict[str, Any]):
    """A row's relative L2 error (a report written before it was measured: its max rel)."""
    return o.get("rel_l2", o.get("max_rel"))


def _validation_section(r: dict[str, Any]) -> str:
    v = r.get("validation")
    if v is None:
        return '<section><h2>Validation</h2><p class="note">Not run (<code>--no-validate</code>).</p></section>'
    rows = [_Row((esc(o["name"]), esc(o.get("dtype")), esc("x".join(map(str, o.get("shape") or [])) or "scalar"),
                  _sci(_rel_l2(o)), _sci(o["max_abs"]), _sci(o["max_rel"]), f"{o['cosine']:.6f}",
                  f"rtol {o.get('rtol', 0):g}" + (f" atol {o['atol']:g}" if o.get("atol") else ""),
                  esc(result_text(o))), "" if o["passed"] else "fail")
            for o in v.get("outputs", [])]
    inputs = ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in (v.get("inputs") or {}).items())
    seed = f", seed {v['seed']}" if v.get("seed") is not None else " (user inputs)"
    broken = (f'<p class="note"><b>first failing pass: {esc(r["broken_by"])}</b></p>' if r.get("broken_by") else "")
    return (f'<section><h2>Validation</h2><p class="note">Original vs optimized on the ORT CPU EP, inputs '
            f'{esc(inputs)}{esc(seed)}.</p>{broken}'
            + f'<p class="note">Rule: {esc(RULE)}.</p>'
            + _table(("output", "dtype", "shape", "rel L2", "max abs", "max abs/range", "cosine", "tolerance", "result"),
                     rows, table_id="validation", numeric_cols={3, 4, 5, 6}) + _webgpu_part(v) + _fp16_repair_part(r) + _real_ep_part(r)
            + "</section>")


def _webgpu_part(v: dict[str, Any]) -> str:
    """Validation on the WebGPU EP (dmlopt.targets.webgpu.validation), when the target is WebGPU."""
    on_ep = v.get("webgpu")
    if on_ep is None:
        return ""
    if "skipped" in on_ep:
        return f'<p class="note">On the WebGPU EP: not run ({esc(on_ep["skipped"])}).</p>'
    worst = max((o["max_abs"] for o in on_ep["optimized"]["outputs"]), default=0.0)
    verdict = "passed" if on_ep["passed"] else "<b>FAILED</b>"
    return (f'<p class="note">On the WebGPU EP ({esc(on_ep["adapter"])}): {verdict}: {esc(on_ep["verdict"])} '
            f'(max abs {_sci(worst)}).</p>')


def _real_ep_part(r: dict[str, Any]) -> str:
    """The output on the real DirectML EP (--target dml), named by its host, or why it did not run."""
    real = r.get("real_ep")
    if not real:
        return ""
    if real.get("passed") is None:
        return f'<h3>On the real DirectML EP</h3><p class="note">Not run: {esc(real.get("skipped", ""))}</p>'
    h = real["host"]
    where = "in this process" if h.get("host") == "in-process" else f"under Wine on {h.get('vulkan_device')}"
    note = f" <b>{esc(h['note'])}</b>" if h.get("note") else ""
    p = real.get("placement") or {}
    rows = [_Row((esc(o["name"]), _sci(o["max_abs"]), _sci(o["max_rel"]), f"{o['cosine']:.6f}",
                  esc(result_text(o))), "" if o["passed"] else "fail")
            for o in real.get("outputs", [])]
    return (f'<h3>On the real DirectML EP ({"passed" if real["passed"] else "FAILED"})</h3><p class="note">'
            f'ONNX Runtime {esc(h.get("ort_version"))}, DirectML.dll {esc(h.get("directml_dll"))}, {esc(where)}.'
            f'{note} Optimized model on DirectML vs original on the CPU EP; {esc(p.get("cpu_nodes"))} CPU nodes, '
            f'{esc(p.get("copies"))} copies, {esc(p.get("partitions"))} compiled partitions.</p>'
            + _table(("output", "max abs", "max rel", "cosine", "result"), rows, table_id="validation-real-ep",
                     numeric_cols={1, 2, 3}))


def _fp16_repair_part(r: dict[str, Any]) -> str:
    """The nodes the fp16 repair kept in float32 and why, or why it refused."""
    rep = r.get("fp16_repair")
    if not rep:
        return ""
    runs = f"{rep['validation_runs']} of at most {rep['max_runs']} validation runs"
    if not rep["passed"]:
        return f'<h3>fp16 repair</h3><p class="note"><b>refused</b> ({esc(runs)}): {esc(rep["reason"])}</p>'
    rows = [(esc(k["node"]), esc(k["op"]), esc(k["found_by"]), esc(k["detail"])) for k in rep["kept"]]
    return (f'<h3>fp16 repair</h3><p class="note">{len(rep["kept"])} nodes kept in float32, '
            f'{rep["float16_nodes"]} in float16 ({esc(runs)}).</p>'
            + _table(("node", "op", "found by", "why"), rows, table_id="fp16-repair"))


# -- tables and charts -----------------------------------------------------------------------

class _Row(tuple):
    """Table cells (already escaped HTML) with a row class."""

    def __new__(cls, cells: Iterable[str], css: str = ""):
        row = super().__new__(cls, tuple(cells))
        row.css = css
        return row


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], *, table_id: str | None = None,
           numeric_cols: set[int] | None = None, numeric_from: int | None = None, css_class: str = "") -> str:
    """Cells are HTML already (escape values before); header cells are escaped here."""
    numeric = set(numeric_cols or ())
    if numeric_from is not None:
        numeric |= set(range(numeric_from, len(head)))
    num = ' class="n"'
    th = "".join(f"<th{num if i in numeric else ''}>{esc(h)}</th>" for i, h in enumerate(head))
    body = []
    for row in rows:
        css = getattr(row, "css", "")
        tds = "".join(f"<td{num if i in numeric else ''}>{cell}</td>" for i, cell in enumerate(row))
        row_class = f' class="{css}"' if css else ""
        body.append(f"<tr{row_class}>{tds}</tr>")
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (f' class="{css_class}"' if css_class else "")
    return f"<table{attrs}><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Bar:
    def __init__(self, label: str, value: float, low: float | None = None, high: float | None = None,
                 tone: str = "after", text: str | None = None):
        self.label, self.value, self.low, self.high, self.tone = label, float(value), low, high, tone
        self.text = text


def _bar_chart(bars: Sequence[_Bar], *, unit: str, title: str) -> str:
    """Horizontal bars with min-p90 whiskers, as inline SVG."""
    if not bars:
        return ""
    label_w, row_h, top = _label_width(b.label for b in bars), 30, 28
    width = label_w + 630
    plot_w = width - label_w - 210  # room for the value text right of the longest bar
    top_value = max(max(b.value, b.high or 0.0) for b in bars) or 1.0
    height = top + row_h * len(bars) + 10
    scale = plot_w / top_value
    parts = [f'<svg class="chart" role="img" aria-label="{esc(title)}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="0" y="16" font-size="13" fill="#5d6878">{esc(title)}</text>']
    for i, b in enumerate(bars):
        y = top + i * row_h
        color = "#2f6fd6" if b.tone == "after" else "#9aa9bf"
        w = max(b.value * scale, 1.0)
        parts.append(f'<text x="{label_w - 8}" y="{y + 17}" font-size="12" text-anchor="end" fill="#1d2430">'
                     f'{esc(b.label)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row_h - 10}" rx="3" fill="{color}">'
                     f'<title>{esc(b.label)}: {esc(b.text or f"{b.value:.4g} {unit}")}</title></rect>')
        if b.low is not None and b.high is not None:
            x0, x1, ym = label_w + b.low * scale, label_w + b.high * scale, y + row_h / 2 - 1
            parts.append(f'<line x1="{x0:.1f}" y1="{ym:.1f}" x2="{x1:.1f}" y2="{ym:.1f}" stroke="#1d2430" '
                         f'stroke-width="1.2"/>')
            for x in (x0, x1):
                parts.append(f'<line x1="{x:.1f}" y1="{ym - 5:.1f}" x2="{x:.1f}" y2="{ym + 5:.1f}" '
                             f'stroke="#1d2430" stroke-width="1.2"/>')
        end = label_w + max(w, (b.high or 0) * scale)
        text = b.text if b.text is not None else f"{b.value:.3g} {unit}"
        parts.append(f'<text x="{end + 6:.1f}" y="{y + 17}" font-size="12" fill="#1d2430">{esc(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _paired_chart(rows: Sequence[tuple[str, int, int]]) -> str:
    """Op counts before (grey) and after (blue) per op type, as inline SVG."""
    label_w, row_h, top = _label_width(op for op, _, _ in rows), 24, 8
    width = label_w + 570
    plot_w = width - label_w - 90  # room for "before -> after" right of the longest bar
    top_value = max(max(b, a) for _, b, a in rows) or 1
    height = top + row_h * len(rows) + 6
    scale = plot_w / top_value
    parts = [f'<svg class="chart" id="op-chart" role="img" aria-label="op histogram" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">']
    for i, (op, before, after) in enumerate(rows):
        y = top + i * row_h
        parts.append(f'<text x="{label_w - 8}" y="{y + 15}" font-size="12" text-anchor="end" fill="#1d2430">'
                     f'{esc(op)}</text>')
        for j, (count, color) in enumerate(((before, "#9aa9bf"), (after, "#2f6fd6"))):
            w = count * scale
            parts.append(f'<rect x="{label_w}" y="{y + 3 + j * 9}" width="{max(w, 0.5 if count else 0):.1f}" '
                         f'height="8" fill="{color}"><title>{esc(op)} {"after" if j else "before"}: {count}'
                         f'</title></rect>')
        parts.append(f'<text x="{label_w + max(before, after) * scale + 6:.1f}" y="{y + 15}" font-size="11" '
                     f'fill="#5d6878">{before} &#8594; {after}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _spread(r: dict[str, Any] | None) -> str:
    """`` (p10-p90 0.95-1.04, 10 pairs)`` for a ratio summary (bench.ratio_summary), else nothing."""
    if not r:
        return ""
    noise = ", no measurable difference" if r["verdict"] == "no measurable difference" else ""
    return f" (p10-p90 {r['p10']:.3f}-{r['p90']:.3f}, {r['runs']} pairs{noise})"


def _label_width(labels: Iterable[str]) -> int:
    """Room for the longest label at 12 px (about 7 px a character), so that none is clipped."""
    return max(190, 12 + 7 * max((len(str(label)) for label in labels), default=0))


def _legend() -> str:
    return ('<p class="legend"><span><i class="swatch" style="background:#9aa9bf"></i>before</span>'
            '<span><i class="swatch" style="background:#2f6fd6"></i>after</span></p>')


# -- formatting --------------------------------------------------------------------------------

def _bytes(n) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _pct(before, after) -> str:
    if not before or after is None:
        return ""
    change = (after - before) / before * 100
    return f"{change:+.0f}%"


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{float(value):.{digits}f}"


def _sci(value) -> str:
    return "-" if value is None else f"{float(value):.3g}"


def _signed(n: int) -> str:
    if n > 0:
        return f'<span class="plus">+{n}</span>'
    if n < 0:
        return f'<span class="minus">{n}</span>'
    return ""


def _delta_text(delta: dict[str, int]) -> str:
    return ", ".join(f"{esc(op)} {_signed(n)}" for op, n in delta.items()) or "-"


def _dash(value) -> Any:
    return "-" if value is None else value


def _short_provider(name) -> str:
    return str(name or "").replace("ExecutionProvider", "")
