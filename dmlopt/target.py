"""The deployment target: an execution provider and the ONNX Runtime version it runs, resolved once.

Why one object: passes, tuning, placement and the session recommendation each used to read
``ort_version=None`` their own way (old ORT for one, new ORT for another, the newest table for a
third).  ``Target.resolve`` gives None one meaning for every consumer, and the version comparisons
(``target.at_least("1.15")``) live here instead of being re-parsed in each pass.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.resources
import re

from dmlopt.errors import UsageError

EPS = ("dml", "cuda", "cpu", "webgpu")
# Distributions that install the `onnxruntime` module, in the order they are looked up.
ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml")


def parse_version(version: str | None) -> tuple[int, ...] | None:
    """'1.18.1' -> (1, 18, 1); '1.17.0-dev' -> (1, 17, 0); None -> None."""
    if version is None:
        return None
    numbers = re.findall(r"\d+", str(version).split("-")[0].split("+")[0])
    if not numbers:
        raise ValueError(f"cannot read an ONNX Runtime version from {version!r}")
    return tuple(int(n) for n in numbers[:3])


def available_versions() -> list[str]:
    """ORT versions with a DirectML data table (``dmlopt/data/dml_ort_<version>.json``), oldest first."""
    names = [p.name for p in importlib.resources.files("dmlopt.data").iterdir()]
    found = [n[len("dml_ort_"):-len(".json")] for n in names if n.startswith("dml_ort_") and n.endswith(".json")]
    return sorted(found, key=parse_version)


def resolve_version(ort_version: str | None) -> str:
    """The DirectML data table that describes `ort_version`: the newest table not newer than it.

    None, "newest" or "latest" mean the newest table; a version older than every table gets
    the oldest one.
    """
    versions = available_versions()
    if ort_version is None or str(ort_version).lower() in ("newest", "latest"):
        return versions[-1]
    wanted = parse_version(ort_version)[:2]
    older = [v for v in versions if parse_version(v)[:2] <= wanted]
    return older[-1] if older else versions[0]


def installed_ort_version() -> str | None:
    """The version of the onnxruntime installed here (from its distribution metadata), or None."""
    for dist in ORT_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclasses.dataclass(frozen=True)
class Target:
    """An execution provider (`ep`) and the ONNX Runtime version deployed with it.

    `ort_version` is the version passes reason about: the one asked for, else (DirectML) the
    newest DirectML table or (CUDA, CPU) the onnxruntime installed here.  `table_version` is the
    DirectML data table that describes it (the newest table at or below it), None off DirectML.
    `asked` keeps what the user gave (None: the default), for the report.
    """

    ep: str = "dml"
    ort_version: str | None = None
    table_version: str | None = None
    asked: str | None = None

    @classmethod
    def resolve(cls, ep: str = "dml", ort_version: str | None = None) -> "Target":
        """Check `ep` and fix the version once (bad input: UsageError)."""
        if ep not in EPS:
            raise UsageError(f"unknown target '{ep}' (choose from {', '.join(EPS)})")
        asked = None if ort_version is None else str(ort_version)
        if asked is not None:
            try:
                parse_version(asked) if asked.lower() not in ("newest", "latest") else None
            except ValueError:
                raise UsageError(f"--ort-version: cannot read an ONNX Runtime version from {asked!r}") from None
        if ep == "dml":
            table = resolve_version(asked)
            version = table if asked is None or asked.lower() in ("newest", "latest") else asked
            return cls(ep, version, table, asked)
        version = asked if asked is not None and asked.lower() not in ("newest", "latest") else installed_ort_version()
        return cls(ep, version, None, asked)

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return parse_version(self.ort_version)

    def at_least(self, version: str | tuple[int, ...]) -> bool:
        """Whether the deployed ORT is `version` ('1.15' or (1, 15)) or newer; an unknown version
        (CUDA/CPU without onnxruntime metadata) counts as newer."""
        mine = self.version_tuple
        wanted = version if isinstance(version, tuple) else parse_version(version)
        return mine is None or mine >= wanted

    def older_than(self, version: str | tuple[int, ...]) -> bool:
        return not self.at_least(version)

    @property
    def predicted_version(self) -> str | None:
        """The version whose kernel registry predicts what this target runs: on DirectML the data
        table (placement and graph capture are predicted from it, not from a version between tables);
        elsewhere the version asked for, None meaning this machine's onnxruntime build."""
        return self.table_version if self.ep == "dml" else self.asked

    @property
    def deployed_version(self) -> str | None:
        """The version a session configuration names for deployment: on DirectML the version passes
        reasoned about (the one asked for, else the newest table); elsewhere the version asked for,
        None meaning the caller names the version it checked against."""
        return self.ort_version if self.ep == "dml" else self.asked

    def describe(self) -> str:
        """One line for reports: 'dml, ORT 1.23 (the newest DirectML table)'."""
        if self.ort_version is None:
            return f"{self.ep}, ORT version unknown"
        how = ""
        if self.asked is None:
            how = " (the newest DirectML table)" if self.ep == "dml" else " (the onnxruntime installed here)"
        elif self.table_version is not None and self.table_version != self.ort_version:
            how = f" (DirectML table {self.table_version})"
        return f"{self.ep}, ORT {self.ort_version}{how}"


DEFAULT_TARGET = Target.resolve("dml", None)
"""What a pass run alone (no pipeline) targets: DirectML on the newest DirectML table."""
