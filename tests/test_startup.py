"""`dmlopt --help` and `dmlopt passes` answer at once (issue 22, item 8): no ONNX stack loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dmlopt.cli import commands as cli, launch
from dmlopt.engine import pass_catalog
from dmlopt.passes import all_passes

HEAVY = ("onnx", "onnx_ir", "onnxruntime", "onnxscript", "numpy")
# Generous: 0.07 s measured alone on the 2-core machine; the bound is for a loaded CI runner.
STARTUP_BOUND_S = 3.0


def _run(*args: str, code: str = "") -> subprocess.CompletedProcess:
    script = ("import sys\nfrom dmlopt.cli.launch import main\nrc = main(sys.argv[1:])\n"
              f"{code}\nsys.exit(rc)")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)


def test_the_catalog_is_the_registry():
    """dmlopt/data/pass_catalog.json as the passes declare themselves; DMLOPT_WRITE_CATALOG=1 rewrites it."""
    built = pass_catalog.build(all_passes().values())
    if os.environ.get("DMLOPT_WRITE_CATALOG"):
        path = os.path.join(os.path.dirname(os.path.dirname(pass_catalog.__file__)), "data", pass_catalog.CATALOG)
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(built, indent=1) + "\n")
    assert pass_catalog.load() == json.loads(json.dumps(built)), \
        "the pass catalog is stale: DMLOPT_WRITE_CATALOG=1 pytest tests/test_startup.py rewrites it"


@pytest.mark.parametrize("args", [("--help",), ("passes",), ("--version",), ()])
def test_help_and_passes_load_no_onnx_stack(args):
    loaded = "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & set(%r)), file=sys.stderr)" % (HEAVY,)
    t0 = time.perf_counter()
    r = _run(*args, code=loaded)
    elapsed = time.perf_counter() - t0
    assert r.returncode == (2 if not args else 0), r.stderr
    assert "LOADED []" in r.stderr
    assert elapsed < STARTUP_BOUND_S


def test_the_quick_answers_are_the_cli_answers(capsys):
    assert launch.top_parser().format_help() == cli.build_parser().format_help()
    assert cli.main(["passes"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == pass_catalog.text(pass_catalog.load())


def test_other_commands_go_to_the_cli():
    r = _run("inspect", "/nonexistent.onnx")
    assert r.returncode == 2 and r.stderr.startswith("dmlopt: error:")


def test_the_program_runs_the_command_supervised(monkeypatch):
    """Run as a program (no argv), a command goes to cli.main without argv, which runs it in
    dmlopt.cli.supervisor's child (a signal stops it even inside native code); with argv, in-process."""
    seen = []
    monkeypatch.setattr(cli, "main", lambda argv=None: seen.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["dmlopt", "inspect", "m.onnx"])
    assert launch.main() == 0 and launch.main(["inspect", "m.onnx"]) == 0
    assert seen == [None, ["inspect", "m.onnx"]]
