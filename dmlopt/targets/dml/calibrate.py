"""`dmlopt calibrate`: predicted vs actual DirectML placement, from a real session.

Why: the placement tables (``dmlopt/data/dml_ort_<version>.json``) are read from ORT's source;
1.14's is derived from older sources and unverified.  Only a run on the real DirectML EP
settles them, so this runs the model once with ORT's verbose log and profiling on, reads
where each node went, the copies and the compiled partitions (``dmlopt.ort_log``), and lines
that up against ``placement.predict`` for the same ORT version.  The JSON it writes is what a
user attaches to an issue so the table can be corrected.

What can be matched: ORT lists nodes outside compiled DirectML partitions by name; nodes
inside a partition are replaced by one ``DmlFusedNode_*`` node, and nodes ORT fused or
renamed at level 2 keep no name of the model, so the session runs at ORT_ENABLE_BASIC (placement
is decided after level 1 and before level 2, so it is the same).  Nodes not listed are reported
as such, never counted as agreeing.  Unnamed nodes cannot be matched (dmlopt names them
``Op_index``).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import onnx_ir as ir

from dmlopt.io import scratch
from dmlopt.runtime import sessions as runtime

from dmlopt.targets.dml import host, ort_log, real_ep
from dmlopt.targets.dml import placement as placement_mod
from dmlopt.errors import ProviderError
from dmlopt.io.jsontext import json_text
from dmlopt.io.model import write_text

__all__ = ["actual_placement", "calibrate", "compare", "observe", "to_table", "write"]

CPU = runtime.PROVIDERS["cpu"]
# Placement is decided after ORT's level-1 rewrites (which the placement model replays) and before
# level 2/3, whose fusions rename nodes; basic keeps the placement and the model's node names.
LEVEL = "ORT_ENABLE_BASIC"
LEVEL_NAME = "basic"  # the same level, as onnxruntime-node names it
NOT_LISTED = "inside a compiled DirectML partition, or folded, fused or renamed by ORT"


def installed_version() -> str:
    return ".".join(runtime.ort().__version__.split(".")[:3])


def calibrate(model: ir.Model, *, ort_version: str | None = "auto", target: str = "dml", shapes=None, dims=None,
              feeds: Mapping[str, Any] | None = None, ep: real_ep.RealEP | None = None) -> dict[str, Any]:
    """Run `model` on `target` (DirectML; the CPU EP stands in for tests) and compare with the
    placement predicted for `ort_version` ("auto": the onnxruntime installed here).  `ep`: a
    Wine host (real_ep.resolve) runs it instead, and its ORT version is the one compared."""
    if ep is not None and ep.host is not None:
        return calibrate_on_host(model, ep, shapes=shapes, dims=dims, feeds=feeds)
    if target == "dml" and not runtime.has_target("dml"):
        raise ProviderError("DirectML is missing: this onnxruntime has no DmlExecutionProvider (providers: "
                            f"{', '.join(runtime.available_providers())}); calibrate runs on Windows with "
                            f"onnxruntime-directml; {host.HOW_TO}")
    installed = installed_version()
    version = installed if ort_version in (None, "auto") else ort_version
    prepared = placement_mod.prepare(model)  # one copy serves the prediction and the comparison
    predicted = placement_mod.predict(model, ort_version=version, prepared=prepared)
    observed = observe(model, target, shapes=shapes, dims=dims, feeds=feeds)
    actual = actual_placement(observed["log"], observed["events"])
    result = compare(model, predicted.to_dict(), actual, gpu_provider=runtime.PROVIDERS[target],
                     prepared=prepared)
    result.update({"ort_installed": installed, "ort_version_asked": version, "provider": observed["providers"][0],
                   "stand_in": None if target == "dml" else f"{runtime.PROVIDERS[target]} stood in for DirectML"})
    return result


def calibrate_on_host(model: ir.Model, ep: real_ep.RealEP, *, shapes=None, dims=None,
                      feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The same comparison from one run on the Wine host (its log; the bindings there write no
    profile before ORT 1.24, and the log lists every node anyway: the probe node makes it)."""
    prepared = placement_mod.prepare(model)
    predicted = placement_mod.predict(model, ort_version=ep.version, prepared=prepared)
    if feeds is None:
        feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims))
    observed = ep.run(model, feeds, level=LEVEL_NAME)
    actual = actual_placement(observed.log, [], rename=observed.rename)
    if not actual["log_has_placements"]:
        raise ProviderError(f"the DirectML host's log (ORT {ep.version}) has no node placement: nothing to compare")
    actual["by_node"].pop(host.PROBE_NODE, None)
    actual["ops"].pop(host.PROBE_NODE, None)
    for entry in actual["placements"].values():
        kept = [n for n in entry["nodes"] if n["name"] != host.PROBE_NODE]
        entry["count"] -= len(entry["nodes"]) - len(kept)
        entry["nodes"] = kept
    result = compare(model, predicted.to_dict(), actual, gpu_provider=runtime.PROVIDERS["dml"], prepared=prepared)
    result.update({"ort_installed": ep.version, "ort_version_asked": ep.version, "provider": "DmlExecutionProvider",
                   "stand_in": None, "host": observed.host})
    return result


def observe(model: ir.Model, target: str, *, shapes=None, dims=None, feeds: Mapping[str, Any] | None = None,
            runs: int = 1) -> dict[str, Any]:
    """One verbose, profiled session of `model` on `target` and `runs` runs: {log, events, providers}."""
    with scratch.folder("dmlopt-calibrate-") as tmp:
        with scratch.capture_stderr() as box:
            sess = runtime.session(model, target, profile_dir=str(tmp), log_severity=0, level=LEVEL)
            if feeds is None:
                feeds = runtime.random_inputs(runtime.input_specs(model, shapes, dims))
            for _ in range(runs):
                sess.run(None, dict(feeds))
            profile = sess.end_profiling()
            providers = sess.get_providers()
            del sess  # its last log lines belong in the capture too
        with open(profile, encoding="utf-8") as f:
            events = json.load(f)
        return {"log": box["text"], "events": events, "providers": providers}


def actual_placement(log: str, events, rename=None) -> dict[str, Any]:
    """Where ORT put each node it lists (log, then profile), its copies and fused partitions.
    `rename`: the model's own name for a name in the log (a host run's safe names: host_names)."""
    placements = ort_log.parse_placements(log)
    copies_added = ort_log.parse_copies(log)
    if rename is not None:
        for entry in placements.values():
            entry["nodes"] = [{"op": rename(n["op"]), "name": rename(n["name"])} for n in entry["nodes"]]
        copies_added = [{**c, "value": rename(c["value"])} for c in copies_added]
    by_node: dict[str, str] = {}
    ops: dict[str, str] = {}
    for provider, entry in placements.items():
        for node in entry["nodes"]:
            if node["name"]:
                by_node[node["name"]] = provider
                ops[node["name"]] = node["op"]
    profiled = ort_log.profile_nodes(events)
    for name, info in profiled.items():
        if info["provider"]:
            by_node.setdefault(name, info["provider"])
            ops.setdefault(name, info["op"])
    all_on = next((p for p, e in placements.items() if e["all"]), None) if len(placements) == 1 else None
    copy_nodes = [n for n, op in ops.items() if op in ort_log.COPY_OPS]
    listed_copies = sum(1 for e in placements.values() for n in e["nodes"] if n["op"] in ort_log.COPY_OPS)
    fused = sorted({n for n in by_node if n.startswith(ort_log.FUSED_PREFIXES)}
                   | {n["op"] for e in placements.values() for n in e["nodes"]
                      if n["op"].startswith(ort_log.FUSED_PREFIXES)})
    return {"placements": placements, "by_node": by_node, "ops": ops, "all_on": all_on,
            "copies": {"count": max(listed_copies, len(copy_nodes)), "added": copies_added},
            "fused_partitions": fused, "log_has_placements": bool(placements), "profiled": bool(profiled)}


def compare(model: ir.Model, predicted: Mapping[str, Any], actual: Mapping[str, Any], *,
            gpu_provider: str = "DmlExecutionProvider",
            prepared: tuple[ir.Model, int] | None = None) -> dict[str, Any]:
    """Node by node: predicted device ('cpu'/'gpu') vs the provider ORT used; copies; partitions.

    `prepared` is `placement.prepare(model)` when the caller made it already (it is only read)."""
    work = prepared[0] if prepared is not None else placement_mod.prepared_graph(model)
    nodes = [n for n in work.graph if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
    cpu_pred = {c["node"]: c for c in predicted["cpu_nodes"] if "graph" not in c}
    rows, mismatches = [], []
    seen = 0
    for i, node in enumerate(nodes):
        name = placement_mod.node_label(node, i)
        pred = "cpu" if name in cpu_pred else "gpu"
        provider = actual["by_node"].get(name)
        if provider is None and not actual.get("profiled"):  # "All nodes placed on [EP]" and no profile
            provider = actual.get("all_on")
        act = None if provider is None else ("cpu" if provider == CPU else "gpu")
        row = {"node": name, "op": node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}",
               "predicted": pred, "actual": act, "actual_provider": provider,
               "agrees": None if act is None else act == pred}
        if name in cpu_pred:
            row["predicted_reason"] = cpu_pred[name]["reason"]
        rows.append(row)
        if act is not None:
            seen += 1
            if act != pred:
                mismatches.append(row)
    known = {r["node"] for r in rows}
    extra = sorted(n for n in actual["by_node"] if n not in known)
    actual_cpu = sum(1 for r in rows if r["actual"] == "cpu")
    return {
        "ort_version_table": predicted["ort_version"], "data_source": predicted["data_source"],
        "gpu_provider": gpu_provider,
        "summary": {"nodes": len(rows), "seen": seen, "agree": seen - len(mismatches),
                    "mismatches": len(mismatches), "not_listed": len(rows) - seen,
                    "cpu_predicted": len(cpu_pred), "cpu_actual": actual_cpu,
                    "copies_predicted": predicted["memcpy"]["count"], "copies_actual": actual["copies"]["count"],
                    "partitions_predicted": predicted["partitions"]["count"],
                    "partitions_actual": len(actual["fused_partitions"]) if gpu_provider != CPU else None},
        "mismatches": mismatches,
        "nodes": rows,
        "not_listed_means": NOT_LISTED,
        "actual": {"placements": actual["placements"], "copies_added": actual["copies"]["added"],
                   "fused_partitions": actual["fused_partitions"], "other_nodes": extra},
        "predicted": {"cpu_nodes": predicted["cpu_nodes"], "memcpy": predicted["memcpy"],
                      "partitions": predicted["partitions"]},
    }


def to_table(result: Mapping[str, Any], *, limit: int = 40) -> str:
    """Readable form of `calibrate`'s result."""
    s = result["summary"]
    head = (f"calibration on {result.get('provider', result['gpu_provider'])} (onnxruntime "
            f"{result.get('ort_installed', '?')}), predicted with {result['data_source']}")
    if result.get("stand_in"):
        head += f"  [{result['stand_in']}]"
    lines = [head]
    if result.get("host"):
        lines.append(real_ep.host_line(result["host"]))
    lines.append("")
    rows = [("", "predicted", "actual"),
            ("nodes on CPU", s["cpu_predicted"], s["cpu_actual"]),
            ("copies (Memcpy)", s["copies_predicted"], s["copies_actual"]),
            ("compiled DML partitions", s["partitions_predicted"], "-" if s["partitions_actual"] is None
             else s["partitions_actual"])]
    lines.append(placement_mod.clipped_table(rows))
    lines.append("")
    lines.append(f"nodes: {s['agree']} of {s['seen']} listed by ORT agree with the table; {s['not_listed']} not "
                 f"listed ({result['not_listed_means']})")
    if result["mismatches"]:
        lines.append("")
        lines.append("mismatches (send the JSON: -o calib.json):")
        rows = [("node", "op", "predicted", "actual", "table's reason")]
        for m in result["mismatches"][:limit]:
            rows.append((m["node"], m["op"], m["predicted"], m["actual_provider"], m.get("predicted_reason", "-")))
        lines.append(placement_mod.clipped_table(rows))
        if len(result["mismatches"]) > limit:
            lines.append(f"... and {len(result['mismatches']) - limit} more (the JSON lists all)")
    return "\n".join(lines)


def write(result: Mapping[str, Any], path: str, protected: dict[str, str] | None = None) -> None:
    """Write the comparison as JSON atomically, never over `protected` paths (the model, its data)."""
    write_text(path, json_text(result) + "\n", "the calibration", protected, label="-o ")
