"""Run a model on the real DirectML EP with the dml-wine kit and read what ORT placed.

Why: the placement prediction is checked against the real EP (benchmarks/dml_placement.py, the
dml_host tests); both read the verbose log the same way.  The counts are those dmlopt predicts:
nodes on the CPU EP, Memcpy nodes, compiled DML partitions (DmlFusedNode_*), and DML nodes that
run as standalone kernels (Memcpy not counted).
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from dmlopt.targets.dml import ort_log

# The kit beside the checkout (../shared/dml-wine), as in CI; DMLOPT_DML_KIT_SCRIPT names another run.sh.
KIT_SCRIPT = os.environ.get("DMLOPT_DML_KIT_SCRIPT",
                            str(pathlib.Path(__file__).resolve().parents[2] / "shared" / "dml-wine" / "run.sh"))
KIT_VERSIONS = ("1.17.3", "1.19.2", "1.24.3", "1.31.1")
PROBE_NAMES = {"dmlkit_probe", "dmlopt_probe"}  # the disconnected CPU node --list-nodes adds


def read_log(text: str) -> dict:
    """{"cpu", "copies", "partitions", "standalone", "cpu_ops"} from a run.sh log (the DML session only),
    through dmlopt's own reader of ORT's placement lines (dmlopt.targets.dml.ort_log)."""
    cpu_ops: dict[str, int] = {}
    copies = partitions = standalone = 0
    for provider, entry in ort_log.parse_placements(text.split("SMOKE =====")[0]).items():
        for node in entry["nodes"]:
            op = node["op"]
            if node["name"] in PROBE_NAMES:
                continue
            if op in ort_log.COPY_OPS:
                copies += 1
            elif provider == "CPUExecutionProvider":
                cpu_ops[op] = cpu_ops.get(op, 0) + 1
            elif op.startswith(ort_log.FUSED_PREFIXES):
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
