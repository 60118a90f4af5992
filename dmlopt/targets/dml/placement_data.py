"""The DirectML EP's registration tables, one ``dmlopt/data/dml_ort_<version>.json`` per ORT version.

Why: every placement step reads what the EP registers (ops, since-versions, types, CPU-memory
slots) and its rules; the table for an ORT version is chosen in one place (`resolve_version`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import json
from typing import Any

from dmlopt.target import resolve_version  # the newest table at or below a version


@dataclasses.dataclass(frozen=True)
class Registration:
    """One row group of the EP's registration table for an op."""

    since: tuple[int, ...]
    types: dict[str, frozenset[str]]
    cpu_inputs: frozenset[int] = frozenset()
    cpu_outputs: frozenset[int] = frozenset()
    graph: bool = True
    graph_input_count: int | None = None
    query: str | None = None
    int64_from_any_ep: bool = False
    source: str = ""


class DmlData:
    """One ``dml_ort_<version>.json``: registrations by (domain, op) and the placement rules."""

    def __init__(self, raw: dict[str, Any], name: str):
        self.raw = raw
        self.name = name
        self.version: str = raw["ort_version"]
        self.rules: dict[str, Any] = raw["rules"]
        groups = raw["type_groups"]
        self.ops: dict[tuple[str, str], list[Registration]] = {}
        for key, rows in raw["ops"].items():
            domain, _, op = key.rpartition("::")
            self.ops[(domain, op)] = [self._row(r, groups) for r in rows]
        self.device_unsupported = frozenset(self.rules["device"]["unsupported"])
        # Measured on the real EP (models/dml_probe.py) or derived (transcribed from ORT's sources).
        self.measured: bool = "measured" in raw

    @staticmethod
    def _row(row: dict[str, Any], groups: dict[str, list[str]]) -> Registration:
        types = {}
        for param, spec in row.get("types", {}).items():
            names: set[str] = set()
            for part in spec.split("+"):
                names.update(groups.get(part, [part]))
            types[param] = frozenset(names)
        return Registration(
            since=tuple(row["since"]), types=types, cpu_inputs=frozenset(row.get("cpu_inputs", ())),
            cpu_outputs=frozenset(row.get("cpu_outputs", ())), graph=row.get("graph", True),
            graph_input_count=row.get("graph_input_count"), query=row.get("query"),
            int64_from_any_ep=row.get("int64_from_any_ep", False), source=row.get("source", ""))

    def registrations(self, domain: str, op: str) -> list[Registration]:
        return self.ops.get((canonical_domain(domain), op), [])

    def has_op(self, domain: str, op: str, since: int | None = None) -> bool:
        rows = self.registrations(domain, op)
        return any(since is None or since in r.since for r in rows)


@functools.lru_cache(maxsize=None)
def load_data(ort_version: str | None = None) -> DmlData:
    """The placement data for `ort_version` (see `resolve_version`)."""
    version = resolve_version(ort_version)
    name = f"dml_ort_{version}.json"
    text = (importlib.resources.files("dmlopt.data") / name).read_text()
    return DmlData(json.loads(text), name)


def canonical_domain(domain: str | None) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain
