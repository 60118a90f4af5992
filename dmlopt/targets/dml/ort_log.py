"""Reading what ONNX Runtime says about a session: its verbose log and its profile.

Why: the placement tables can only be corrected from what the real provider did, and ORT
tells it in two places.  At ``log_severity_level=0`` the session state's
``VerifyEachNodeIsAssignedToAnEp`` logs ``Node placements`` and, per provider, either
`` All nodes placed on [EP]. Number of nodes: N`` or `` Node(s) placed on [EP]. Number of
nodes: N`` followed by one ``OpType (node name)`` per node (recent releases log each on a line
of its own, older ones as continuation lines of one message); ``transformer_memcpy.cc`` logs
``Add MemcpyFromHost after <value> for <EP>`` / ``Add MemcpyToHost before <value> for <EP>``.
The profile's node events (``cat: Node``, ``name: <node>_kernel_time``) carry ``args.op_name``
and ``args.provider``.

``scratch.capture_stderr`` collects ORT's log: its default logger writes to the process's stderr
(file descriptor 2), not to Python's ``sys.stderr``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

__all__ = ["FUSED_PREFIXES", "parse_copies", "parse_placements", "profile_nodes"]

PLACED = re.compile(r"(All nodes|Node\(s\)) placed on \[([^\]]+)\]\. Number of nodes: (\d+)")
# A node line: "OpType (name)", after the log prefix or alone as a continuation line.
NODE = re.compile(r"^(?:.*VerifyEachNodeIsAssignedToAnEp\]\s+|\s*)([A-Za-z_][\w.]*) \((.*)\)\s*$")
LOG_PREFIX = re.compile(r"\[[VIWEF]:onnxruntime:")
COPY = re.compile(r"Add (MemcpyFromHost|MemcpyToHost) (after|before) (.+) for (\S+)\s*$")
# Nodes ORT makes for a compiled DirectML partition (DmlGraphFusionTransformer,
# DmlRuntimeGraphFusionTransformer).
FUSED_PREFIXES = ("DmlFusedNode_", "DmlRuntimeFusedNode_")
COPY_OPS = ("MemcpyFromHost", "MemcpyToHost")


def parse_placements(text: str) -> dict[str, dict[str, Any]]:
    """Provider -> {count, all, nodes: [{op, name}]} from a verbose session log (empty when the
    log has no placement summary, e.g. it was not verbose)."""
    found: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = PLACED.search(line)
        if m:
            entry = {"count": int(m.group(3)), "all": m.group(1) == "All nodes", "nodes": []}
            found[m.group(2)] = entry
            current = None if entry["all"] else entry
            continue
        if current is None:
            continue
        node = NODE.match(line)
        if node and (LOG_PREFIX.search(line) is None or "VerifyEachNodeIsAssignedToAnEp" in line):
            current["nodes"].append({"op": node.group(1), "name": node.group(2)})
        elif LOG_PREFIX.search(line):
            current = None  # another log message: the node list ended
    return found


def parse_copies(text: str) -> list[dict[str, str]]:
    """Every copy node ORT's memcpy transformer added: {op, value, provider}."""
    found = []
    for line in text.splitlines():
        m = COPY.search(line)
        if m:
            found.append({"op": m.group(1), "value": m.group(3).strip(), "provider": m.group(4)})
    return found


def profile_nodes(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Node name -> {op, provider} from the node events of an ORT profile (chrome trace JSON)."""
    found: dict[str, dict[str, str]] = {}
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        args = e.get("args") or {}
        node = name[: -len("_kernel_time")]
        found.setdefault(node, {"op": str(args.get("op_name", "")), "provider": str(args.get("provider", ""))})
    return found
