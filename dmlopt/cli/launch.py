"""The `dmlopt` entry point: help, version and the list of passes at once, the rest through dmlopt.cli.commands.

Why: dmlopt.cli.commands imports the whole ONNX stack (onnx, onnx_ir, onnxscript, numpy: about a
second, more on a loaded machine) to build its parser, whose optimize command has a flag per
pass option.  `dmlopt`, `dmlopt --help`, `dmlopt --version` and `dmlopt passes` need none of it:
they are answered here from the pass catalog (dmlopt.engine.pass_catalog).  Everything else, a
command's own --help included, goes to `dmlopt.cli.commands.main`, imported only then.
tests/test_startup.py checks that the answers here are the ones dmlopt.cli.commands gives.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dmlopt.engine import pass_catalog
from dmlopt.version import __version__

DESCRIPTION = "Prepare exported ONNX models for fast DirectML deployment."
# (command, help) in the order of dmlopt.cli.commands.build_parser.
COMMANDS = (
    ("optimize", "rewrite a model for the target, validate it, write it"),
    ("inspect", "inputs, outputs, op histogram and what the passes would look at"),
    ("validate", "compare two models' outputs on ORT's CPU EP"),
    ("bench", "time a model on a provider (session creation, latency, copies)"),
    ("calibrate", "run on the real DirectML EP: predicted vs actual placement, as JSON"),
    ("passes", "list every pass with a one-line description and its options"),
    ("demo", "optimize the bundled models and show a before/after table"),
)
EXIT_OK, EXIT_USAGE = 0, 2


def top_parser() -> argparse.ArgumentParser:
    """The top level of dmlopt.cli.commands's parser (the commands without their arguments), for --help."""
    parser = argparse.ArgumentParser(prog="dmlopt", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dmlopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, text in COMMANDS:
        sub.add_parser(name, help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args in (["-h"], ["--help"]):
        top_parser().print_help()
        return EXIT_OK if args else EXIT_USAGE
    if args == ["--version"]:
        print(f"dmlopt {__version__}")
        return EXIT_OK
    if args == ["passes"]:
        print(pass_catalog.text(pass_catalog.load()))
        return EXIT_OK
    from dmlopt.cli import commands as cli  # the ONNX stack: only for a command that uses it

    # Run as a program (no `argv`), the command works in dmlopt.cli.supervisor's child process, which a
    # signal can stop even inside native code; with `argv` it runs in this process.
    return cli.main(None if argv is None else args)
