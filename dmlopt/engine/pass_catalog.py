"""What `dmlopt --help` and `dmlopt passes` show of the passes, without importing them.

Why: the passes import onnx, onnx_ir and onnxscript (about a second), and a user asking for help
or the list of passes should not wait for that.  ``dmlopt/data/pass_catalog.json`` holds each
pass's name, summary and options as the registry declares them; `build` makes it from the
registry, and tests/test_startup.py checks the two agree (and rewrites the file with
``DMLOPT_WRITE_CATALOG=1``).
"""

from __future__ import annotations

import importlib.resources
import json
from typing import Any, Iterable

CATALOG = "pass_catalog.json"


def build(pass_classes: Iterable[type]) -> list[dict[str, Any]]:
    """The catalog of registered pass classes (in pipeline order), JSON-ready."""
    return [{"name": cls.name, "summary": cls.summary,
             "options": [{"name": o.name, "flag": o.flag, "type": o.type.__name__, "default": o.default,
                          "choices": list(o.choices) if o.choices is not None else None, "help": o.help}
                         for o in cls.options]}
            for cls in pass_classes]


def load() -> list[dict[str, Any]]:
    return json.loads(importlib.resources.files("dmlopt.data").joinpath(CATALOG).read_text(encoding="utf-8"))


def text(catalog: list[dict[str, Any]]) -> str:
    """`dmlopt passes`: one line per pass, then its options."""
    lines = []
    for entry in catalog:
        lines.append(f"{entry['name']:<16} {entry['summary']}")
        for opt in entry["options"]:
            choices = f" {{{'|'.join(opt['choices'])}}}" if opt["choices"] else ""
            lines.append(f"{'':<16}   {opt['flag']}{choices}: {opt['help']} (default: {opt['default']})")
    return "\n".join(lines)
