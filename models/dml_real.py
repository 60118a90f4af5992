"""Run a model on the real DirectML EP with the dml-wine kit and read what ORT placed.

Why: the placement prediction is checked against the real EP (benchmarks/dml_placement.py, the
dml_host tests); both read the verbose log the same way.  The counts are those dmlopt predicts:
nodes on the CPU EP, Memcpy nodes, compiled DML partitions (DmlFusedNode_*), and DML nodes that
run as standalone kernels (Memcpy not counted).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

KIT_SCRIPT = os.environ.get("DMLOPT_DML_KIT_SCRIPT", "/work/shared/dml-wine/run.sh")
KIT_VERSIONS = ("1.17.3", "1.19.2", "1.24.3", "1.31.1")
NODE_LINE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{2,}(\S+) \((.*)\)\s*$")
HEADER = re.compile(r"placed on \[(\w+)\]")
PROBE_NAMES = {"dmlkit_probe", "dmlopt_probe"}  # the disconnected CPU node --list-nodes adds


def read_log(text: str) -> dict:
    """{"cpu", "copies", "partitions", "standalone", "cpu_ops"} from a run.sh log (the DML session only)."""
    text = text.split("SMOKE =====")[0]
    ep = None
    cpu_ops: dict[str, int] = {}
    copies = partitions = standalone = 0
    for line in text.splitlines():
        line = line.rstrip("\r")
        if "VerifyEachNodeIsAssignedToAnEp" not in line:
            continue
        header = HEADER.search(line)
        if header:
            ep = header.group(1)
            continue
        m = NODE_LINE.search(line)
        if not m:
            continue
        op, name = m.groups()
        if name in PROBE_NAMES:
            continue
        if op.startswith("Memcpy"):
            copies += 1
        elif ep == "CPUExecutionProvider":
            cpu_ops[op] = cpu_ops.get(op, 0) + 1
        elif op.startswith("DmlFusedNode"):
            partitions += 1
        else:
            standalone += 1
    return {"cpu": sum(cpu_ops.values()), "copies": copies, "partitions": partitions, "standalone": standalone,
            "cpu_ops": dict(sorted(cpu_ops.items(), key=lambda kv: -kv[1]))}


def run_real(kit: str, version: str, model: str | os.PathLike, log: str | os.PathLike,
             script: str = KIT_SCRIPT, timeout_s: int = 900) -> dict:
    """Run `model` on ORT `version` of the kit in `kit` (graph fusion on, every node listed); its counts."""
    env = dict(os.environ, LOG=str(log))
    subprocess.run(["bash", script, kit, version, str(model), "--list-nodes", "--no-cpu-check"], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=timeout_s)
    path = pathlib.Path(log)
    text = path.read_text(errors="replace") if path.exists() else ""
    if "VerifyEachNodeIsAssignedToAnEp" not in text:
        raise RuntimeError(f"no placement in {log} (the session failed before partitioning)")
    return read_log(text)
