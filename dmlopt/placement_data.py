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

from dmlopt.einsum_support import parse_version


def available_versions() -> list[str]:
    """ORT versions with a data file, oldest first."""
    names = [p.name for p in importlib.resources.files("dmlopt.data").iterdir()]
    found = [n[len("dml_ort_"):-len(".json")] for n in names if n.startswith("dml_ort_") and n.endswith(".json")]
    return sorted(found, key=parse_version)


def resolve_version(ort_version: str | None) -> str:
    """The data version that describes `ort_version`: the newest file not newer than it.

    None, "newest" or "latest" mean the newest file; a version older than every file gets
    the oldest one.
    """
    versions = available_versions()
    if ort_version is None or str(ort_version).lower() in ("newest", "latest"):
        return versions[-1]
    wanted = parse_version(ort_version)[:2]
    older = [v for v in versions if parse_version(v)[:2] <= wanted]
    return older[-1] if older else versions[0]


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
        return self.ops.get((_domain(domain), op), [])

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


def _domain(domain: str | None) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain
