"""The `dmlopt` command: optimize | inspect | validate | bench | calibrate | passes | demo.

Exit codes: 0 ok, 1 a check failed (numerics), 2 bad input or usage.  Every error the
user can act on is one line on stderr, never a traceback (DMLOPT_DEBUG=1 shows it).
SIGTERM and SIGHUP (what `timeout`, `docker stop` and CI send) are handled like Ctrl-C: the
cleanup of temporary files runs, nothing half-written is left, and the message names the files
that were already put in place (complete), or says that nothing was written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import filecmp
import logging
import os
import signal
import sys
import threading
from typing import Iterator, Sequence

from dmlopt.cli import arg_types, demo, supervisor
from dmlopt.io import outputs, scratch
from dmlopt.runtime import bench, sessions as runtime
from dmlopt.targets import session_config

from dmlopt.targets.dml import calibrate, emulate, real_ep
from dmlopt.targets.dml import host as dml_host
from dmlopt.targets.webgpu import placement as webgpu_placement
from dmlopt.report import optimize_report as report_mod
from dmlopt.errors import LINE_WIDTH, CheckFailed, DmlOptError, InputError, UsageError, printable, printable_tree
from dmlopt.targets.graph_capture import graph_capture_readiness
from dmlopt.io.inputs_file import open_npz
from dmlopt.report.inspection import inspect, to_table
from dmlopt.io.jsontext import json_text
from dmlopt.io.model import check_destination, check_input, load, protected_paths, save
from dmlopt.passes import all_passes
from dmlopt.engine.pipeline import optimize, pass_options
from dmlopt.io.progress import Steps, is_terminal, ticking
from dmlopt.graph.shapes import parse_dim, parse_shape
from dmlopt.runtime.validate import validate
from dmlopt.io.tables import format_table
from dmlopt.version import __version__

EXIT_OK, EXIT_CHECK, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
# Libraries whose log records (onnxscript's "Skipping constant folding ...") would otherwise
# reach stderr through logging's last-resort handler, between dmlopt's own lines.
LIBRARY_LOGGERS = ("onnxscript", "onnx_ir")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Python next runs so that every cleanup written for
    Ctrl-C (temporary folders beside the output, ORT's copy of the weights) runs too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum, _frame):
    for name in ("SIGTERM", "SIGHUP"):  # a second signal must not break off the cleanup
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    scratch.raise_or_defer(Terminated(signum))  # deferred while a scratch folder is made or removed


def _interrupt(_signum, _frame):
    """Ctrl-C, as Python's own handler but deferred like `_terminate`."""
    scratch.raise_or_defer(KeyboardInterrupt())


@contextlib.contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    """SIGTERM/SIGHUP -> Terminated for the run, the previous handlers restored after it
    (main() may be called in-process).  Signals can only be set from the main thread."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                previous[name] = signal.signal(getattr(signal, name), _terminate)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not a host's own handler
            previous["SIGINT"] = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


class WrittenFiles:
    """The files a command has put in place, so that an interrupt names them instead of saying
    that nothing was written.  A file counts once it differs from what was there before the
    write: a signal may arrive after the output's rename but before `save` returns."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    @contextlib.contextmanager
    def writing(self, *paths: str | os.PathLike | None) -> Iterator[None]:
        """Around one write of the files `paths` (None: no file)."""
        before = {os.fspath(p): _identity(os.fspath(p)) for p in paths if p is not None}
        try:
            yield
        finally:
            for path, identity in before.items():
                if _identity(path) not in (None, identity) and path not in self.paths:
                    self.paths.append(path)

    @contextlib.contextmanager
    def writing_in(self, folder: str | os.PathLike) -> Iterator[None]:
        """Around writes of files directly in `folder` (the demo's models)."""
        folder = os.fspath(folder)
        before = {p: _identity(p) for p in _files_in(folder)}
        try:
            yield
        finally:
            for p in _files_in(folder):
                if _identity(p) not in (None, before.get(p)) and p not in self.paths:
                    self.paths.append(p)

    def message(self) -> str:
        if not self.paths:
            return "nothing was written"
        shown = ", ".join(printable(p) for p in self.paths[:3])
        more = f" and {len(self.paths) - 3} more" if len(self.paths) > 3 else ""
        return f"already written (complete): {shown}{more}"


def _identity(path: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _files_in(folder: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(folder) if e.is_file(follow_symlinks=False))
    except OSError:
        return []


def _quiet_library_logs() -> None:
    """The command's stderr carries dmlopt's lines only; DMLOPT_DEBUG=1 lets the libraries' logs
    through.  A NullHandler stops logging's last-resort printing and still lets records
    propagate to any handler a caller configured."""
    if os.environ.get("DMLOPT_DEBUG"):
        return
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), not usage + error."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D0,D1,...",
                   help="fix an input's shape (repeatable); NAME:[D0,D1] (Polygraphy style) also accepted")
    p.add_argument("--overwrite-input-shape", dest="shape", action="append", help=argparse.SUPPRESS)
    p.add_argument("--dim", action="append", default=[], metavar="DIM=VALUE",
                   help="fix a named dynamic dimension everywhere, e.g. --dim batch=1 (repeatable)")


def _add_dml_host_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dml-host", metavar="DIR",
                   help=f"a DirectML host: a folder with Wine and ONNX Runtime's DirectML builds, made by "
                        f"{dml_host.SETUP} (default: ${dml_host.ENV_VAR}); not needed on Windows with "
                        "onnxruntime-directml")


def _shapes(args) -> tuple[dict, dict]:
    shapes, dims = {}, {}
    if not (args.shape or args.dim):
        return shapes, dims
    for text in args.shape or []:
        shapes.update(parse_shape(text))
    for text in args.dim or []:
        dims.update(parse_dim(text))
    return shapes, dims


def _progress(args):
    """Step lines and bars on an interactive stderr (dmlopt.io.progress); None with -q or when piped."""
    if getattr(args, "quiet", False) or not is_terminal(sys.stderr):
        return None
    return Steps(sys.stderr)


def build_parser() -> Parser:
    parser = Parser(prog="dmlopt", description="Prepare exported ONNX models for fast DirectML deployment.")
    parser.add_argument("--version", action="version", version=f"dmlopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("optimize", help="rewrite a model for the target, validate it, write it",
                       description="Run the default pipeline (or --passes), check numerics against the input "
                                   "and write the output only if it matches (exit 1 otherwise).")
    p.add_argument("model", help="input .onnx")
    p.add_argument("output_pos", nargs="?", metavar="OUT", help="output .onnx (or use -o)")
    p.add_argument("-o", "--output", help="output .onnx (never the input)")
    _add_shape_args(p)
    p.add_argument("--passes", help="comma-separated pass names (default: every pass that applies); see `dmlopt passes`")
    p.add_argument("--target", default="dml", choices=["dml", "cuda", "cpu", "webgpu"], help="deployment provider (default dml)")
    p.add_argument("--ort-version", help="ONNX Runtime version deployed on the target, e.g. 1.14 (default: newest)")
    _add_dml_host_arg(p)
    p.add_argument("--report", metavar="PATH", help="write the report: JSON if PATH ends in .json, HTML if .html")
    p.add_argument("--no-validate", action="store_true", help="run no model: no numerics check, auto options at their "
                   "documented defaults, no re-timing (not recommended)")
    p.add_argument("--no-time", dest="retime", action="store_false", default=None,
                   help="skip timing before/after on the target (done by default when its provider is here)")
    p.add_argument("--force", action="store_true", help="write the output even if validation fails (the report says so)")
    p.add_argument("--tune", action="store_true", help="measure pass variants on the target provider (must be present)")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs for validation instead of seeded random ones")
    p.add_argument("--atol", type=arg_types.tolerance, help="absolute error to ignore in validation (default 0)")
    p.add_argument("--rtol", type=arg_types.tolerance, help="relative L2 error allowed per output; the worst element may be off 10x this of the "
                   "reference's range (default by dtype: float32 1e-4, float16 1e-2)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict lines and the written paths")
    _add_session_config_args(p)
    seen = set()
    for name, (cls, opt) in pass_options().items():
        if opt.flag in seen:
            continue
        seen.add(opt.flag)
        if opt.type is bool:  # --fp16 / --no-fp16 (argparse's type=bool would read "False" as true)
            p.add_argument(opt.flag, dest=f"opt_{name}", action=argparse.BooleanOptionalAction, default=None,
                           help=f"[{cls.name}] {opt.help} (default: {'on' if opt.default else 'off'})")
            continue
        p.add_argument(opt.flag, dest=f"opt_{name}", choices=opt.choices, type=arg_types.checked(opt.type), default=None,
                       help=f"[{cls.name}] {opt.help} (default: {opt.default})")

    p = sub.add_parser("inspect", help="inputs, outputs, op histogram and what the passes would look at")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("--ep", choices=["dml", "webgpu"],
                   help="placement on this provider: dml predicted from its table (and measured on a DirectML host), "
                        "webgpu measured on the EP")
    p.add_argument("--ort-version", help="ONNX Runtime version for the placement model (default: newest); with a "
                   "DirectML host, the installed version run beside the prediction (default: its newest)")
    _add_dml_host_arg(p)
    _add_shape_args(p)

    p = sub.add_parser("validate", help="compare two models' outputs on ORT's CPU EP",
                       description="Run REF and CAND on the same seeded random inputs (or --inputs) and compare "
                                   "every output against the reference's own scale: relative L2 error, max abs over the "
                                   "reference's range, cosine (README: Validation rule). Exit 1 on mismatch.")
    p.add_argument("ref")
    p.add_argument("cand")
    _add_shape_args(p)
    p.add_argument("--inputs", metavar="FILE.npz")
    p.add_argument("--atol", type=arg_types.tolerance, help="absolute error to ignore (default 0)")
    p.add_argument("--rtol", type=arg_types.tolerance,
                   help="relative L2 error allowed per output (default by dtype: float32 1e-4, float16 1e-2)")
    p.add_argument("--seed", type=arg_types.integer(0, arg_types.SEED_MAX), default=0)
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="an output with no finite value passes if both hold the same NaN/inf in the same places")
    p.add_argument("--ep", default="cpu", choices=["cpu", "cuda", "dml", "webgpu"],
                   help="run CAND on this provider too (REF stays on the CPU EP, the reference; default cpu); "
                        "dml: the real DirectML EP (in this process on Windows, else the DirectML host)")
    p.add_argument("--ort-version", help="--ep dml: the ONNX Runtime version of the DirectML host to run "
                   "(default: its newest)")
    _add_dml_host_arg(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="time a model on a provider (session creation, latency, copies)",
                       description="Create a session, warm up (profiled: copies are counted from ORT's profile), "
                                   "then time N runs with fixed inputs (IO binding on GPU providers). Asking for a "
                                   "provider that is not here is an error, never a silent CPU run.")
    p.add_argument("model")
    p.add_argument("--ep", default="auto", choices=["auto", "dml", "cuda", "cpu", "webgpu"],
                   help="provider (default auto: DirectML, else CUDA, else CPU; webgpu only when named)")
    p.add_argument("--runs", type=arg_types.integer(1), default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=arg_types.integer(0), default=3, help="untimed, profiled runs first (default 3)")
    _add_shape_args(p)
    p.add_argument("--compare", metavar="OTHER", help="time OTHER in alternation with MODEL and report ratios")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="provider option (repeatable): DirectML device_id, performance_preference, "
                        "disable_metacommands; CUDA cudnn_conv_algo_search, prefer_nhwc, use_tf32; "
                        "session.* keys are session config entries")
    p.add_argument("--disable-metacommands", action="store_true",
                   help="DirectML: run without vendor metacommands (= --provider-option disable_metacommands=true)")
    p.add_argument("--tune-ep", action="store_true",
                   help="time every combination of the provider's options that matter and report the best")
    p.add_argument("--profile", action="store_true",
                   help="also print node time by op type and the slowest nodes, from ORT's profile of the warm-up "
                        "runs (CUDA EP: set CUDA_LAUNCH_BLOCKING=1 so each node's time includes its kernel)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="CUDA EP: run the model as a CUDA graph (enable_cuda_graph=1, inputs and outputs bound "
                        "once on the GPU); a model that cannot be captured is an error naming why")
    p.add_argument("--graph-capture", action="store_true",
                   help="CUDA or WebGPU EP: capture one run and replay it, as dmlopt's session file runs a model "
                        "that is ready for it (enable_cuda_graph=1 / enableGraphCapture=1, inputs and outputs "
                        "bound once on the GPU; WebGPU's outputs still read back each run)")
    p.add_argument("--emulate", metavar="dml-VERSION",
                   help="time as DirectML of that ORT version would place the graph (e.g. dml-1.14): predicted "
                        "CPU nodes on the CPU EP, the rest on CUDA when present")
    p.add_argument("--ort-version", help="--ep dml on a DirectML host: the ONNX Runtime version to run (default: "
                   "its newest)")
    _add_dml_host_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict (no progress, no tables)")

    _add_calibrate_parser(sub)

    sub.add_parser("passes", help="list every pass with a one-line description and its options")

    p = sub.add_parser("demo", help="optimize the bundled models and show a before/after table")
    p.add_argument("-o", "--output-dir", default="dmlopt-demo", help="where to write the optimized models")
    p.add_argument("--runs", type=arg_types.integer(1), default=10)
    p.add_argument("-q", "--quiet", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command.  Run as a program (no `argv`: the console script, ``python -m dmlopt``) it
    works in a supervised child process that a signal can stop even inside native code
    (dmlopt.cli.supervisor); called with `argv` it runs in this process."""
    if argv is None:
        return supervisor.run(lambda: _main(sys.argv[1:]))
    return _main(argv)


def _main(argv: Sequence[str]) -> int:
    _quiet_library_logs()
    writes = WrittenFiles()
    try:
        with _signals_as_interrupts():
            parser = build_parser()
            args = parser.parse_args(argv)
            if not args.command:
                parser.print_help()
                return EXIT_USAGE
            args.writes = writes
            return COMMANDS[args.command](args)
    except DmlOptError as e:
        print(f"dmlopt: error: {printable(str(e), LINE_WIDTH)}", file=sys.stderr)  # a name cannot forge a line
        return e.exit_code
    except Terminated as e:
        print(f"dmlopt: terminated ({e}); {writes.message()}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print(f"dmlopt: interrupted; {writes.message()}", file=sys.stderr)
        return 130
    except OSError as e:
        if isinstance(e, BrokenPipeError):  # `dmlopt inspect m.onnx | head`: the reader left; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 141
        if e.errno not in scratch.STORAGE_ERRNOS:
            return _internal_error(e)
        # a full or limited disk anywhere dmlopt writes: the user's to act on, not a bug
        where = f"{printable(os.fspath(e.filename), LINE_WIDTH)}: " if e.filename else ""
        print(f"dmlopt: error: {where}{e.strerror or e}; {writes.message()}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - a bug in dmlopt: still one line, unless debugging
        return _internal_error(e)


def _internal_error(e: Exception) -> int:
    if os.environ.get("DMLOPT_DEBUG"):
        raise e
    print(f"dmlopt: internal error: {type(e).__name__}: {printable(str(e).splitlines()[0], LINE_WIDTH) if str(e) else ''} "
          f"(set DMLOPT_DEBUG=1 for the traceback)", file=sys.stderr)
    return EXIT_INTERNAL


def cmd_optimize(args) -> int:
    output = args.output or args.output_pos
    if not output:
        raise UsageError("no output given: dmlopt optimize MODEL -o OUT")
    if args.output and args.output_pos:
        raise UsageError("give the output once: either OUT or -o OUT")
    shapes, dims = _shapes(args)
    protected = protected_paths(args.model)
    if args.inputs:  # an input, never a destination
        protected.setdefault(args.inputs, "the --inputs file")
    check_destination(output, protected)
    check_destination(output + ".data", protected)
    written = {**protected, output: "the output model", output + ".data": "the output model's external data"}
    if args.report:
        _check_report_path(args.report, written)
    report_path = {args.report: "the report"} if args.report else {}
    session_path = _session_config_target(args, output, {**written, **report_path})
    sibling_path = _sibling_path(args, output, {**written, **report_path,
                                                **({session_path: "the session configuration"} if session_path else {})})
    options = {k[4:]: v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}
    inputs = open_npz(args.inputs) if args.inputs else None  # opened once, before any work; read by header
    common = dict(shapes=shapes, dims=dims, passes=args.passes, target=args.target, ort_version=args.ort_version,
                  validate=not args.no_validate, inputs=inputs, atol=args.atol, rtol=args.rtol,
                  progress=_progress(args), dml_host=args.dml_host)
    result = optimize(args.model, tune=args.tune, retime=args.retime, **common, **options)
    rep = result.report
    ok = result.passed
    sibling = None
    if sibling_path and (ok or args.force):  # the float32 twin: the main run's choices, no fp16
        chosen = {c["option"]: c["choice"] for c in rep.choices}
        sibling = optimize(args.model, retime=False, **common, **{**chosen, **options, "fp16": False})
        if not sibling.passed and not args.force:
            raise CheckFailed(f"the float32 sibling ({printable(sibling_path)}) does not match the original; "
                              "nothing was written")
    sibling_files = (sibling_path, sibling_path + ".data") if sibling is not None else ()
    # One transaction: every file is staged first, then all are renamed (dmlopt.io.outputs).
    with (args.writes.writing(output, output + ".data", session_path, args.report, *sibling_files),
          outputs.transaction()):
        if ok or args.force:
            save(result.model, output, protect=tuple(protected))
            rep.written = os.fspath(output)
            rep.forced = not ok
            if sibling is not None:
                save(sibling.model, sibling_path, protect=tuple(protected))
                if rep.session_config:
                    rep.session_config["config"]["fp32_model"] = os.path.basename(sibling_path)
                    rep.session_config["config"]["reasons"]["fp32_model"] = (
                        "the same passes in float32 (--fp32-sibling), for an adapter the float16 model cannot run on")
            _write_session_config(rep, output, session_path, written)
            stale = session_config.earlier_config(output) if rep.session_config is None else None
            if stale:  # --no-session-config: the previous model's configuration goes with it
                outputs.put_in_place(outputs.Staged("the removal of the earlier session configuration", [],
                                                    removals=[stale]))
        if args.report:
            report_mod.write(rep, args.report)
    print(rep.to_json() if args.json else "\n".join(map(printable, rep.verdict())) if args.quiet else rep.to_table())
    if not ok:
        if args.force:
            print(f"dmlopt: warning: validation FAILED: {rep.failure()}; output written anyway because of --force",
                  file=sys.stderr)
        else:
            print(f"dmlopt: error: {rep.failure()}; nothing was written (--force writes it anyway)", file=sys.stderr)
        return EXIT_CHECK
    print(f"wrote {printable(output)}{_session_config_written(rep)}"
          + (f" and the float32 sibling {printable(sibling_path)}" if sibling is not None else ""), file=sys.stderr)
    return EXIT_OK


def _add_session_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-session-config", dest="session_config", action="store_false", default=True,
                   help="do not write OUT.session.json (the recommended ONNX Runtime session for the target)")
    p.add_argument("--fp32-sibling", action="store_true",
                   help="with --fp16: also write OUT.fp32.onnx (the same passes in float32), which the session "
                        "configuration names for adapters without float16 (WebGPU's shader-f16)")


def _sibling_path(args, output: str, protected: dict[str, str]) -> str | None:
    """Where --fp32-sibling writes the float32 model (None without it); checked before the work."""
    if not args.fp32_sibling:
        return None
    if not getattr(args, "opt_fp16", None):
        raise UsageError("--fp32-sibling is the float32 twin of a --fp16 model: add --fp16")
    root, ext = os.path.splitext(output)
    path = (root if ext.lower() == ".onnx" else output) + ".fp32.onnx"
    check_destination(path, protected)
    check_destination(path + ".data", protected)
    return path


def _session_config_target(args, output: str, protected: dict[str, str]) -> str | None:
    """Where the session configuration goes (None with --no-session-config); checked before the work."""
    if not args.session_config:
        return None
    path = session_config.config_path(output)
    session_config.check_path(path, protected)
    return path


def _write_session_config(rep, output: str, path: str | None, protected: dict[str, str]) -> None:
    """Write the recommended session beside the written model; without it the report keeps no snippet."""
    if path is None or not rep.session_config:
        rep.session_config = None
        return
    session_config.write(rep.session_config["config"], path, output, protected=protected)
    rep.session_config["config"]["model"] = os.path.basename(output)
    target = rep.session_config["config"]["target"]
    rep.session_config.update(path=path, snippet=session_config.snippet(path, target))


def _session_config_written(rep) -> str:
    path = (rep.session_config or {}).get("path")
    return f" and {printable(path)}" if path else ""


def _add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="run on the real DirectML EP: predicted vs actual placement, as JSON",
                       description="Create a DirectML session with ORT's verbose log and profiling, run the model "
                                   "once, and compare where ORT put each node, the copies and the compiled "
                                   "partitions with dmlopt's placement table for that ORT version. Needs "
                                   "onnxruntime-directml (Windows) or a DirectML host (--dml-host DIR, made by "
                                   f"{dml_host.SETUP}); without either it exits 2.")
    p.add_argument("model")
    p.add_argument("--ort-version", default="auto",
                   help="placement table to compare with (default auto: the onnxruntime installed here; with a "
                        "DirectML host, the installed version to run and compare, default its newest)")
    _add_dml_host_arg(p)
    p.add_argument("-o", "--output", metavar="CALIB.json", help="write the full comparison as JSON")
    p.add_argument("--ep", default="dml", choices=["dml", "webgpu"],
                   help="the EP to calibrate against (default dml; webgpu: dmlopt's WebGPU table vs the plug-in EP)")
    _add_shape_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON instead of a table")


def cmd_calibrate(args) -> int:
    protected = protected_paths(args.model)
    if args.output:
        check_destination(args.output, protected, label="-o ")
        if not args.output.endswith(".json"):
            raise UsageError(f"-o {args.output}: the name must end in .json")
    shapes, dims = _shapes(args)
    ep = (real_ep.resolve(args.dml_host, args.ort_version, what="calibrate")
          if dml_host.configured(args.dml_host) else None)  # else in this process, as before
    model = load(args.model)
    check_input(model)
    if args.ep == "webgpu":
        runtime.resolve_ep("webgpu")  # calibration needs the EP: exit 2 with the reason
        result = webgpu_placement.calibrate(model, dims=dims)
        table = webgpu_placement.calibration_table(result)
    else:
        result = calibrate.calibrate(model, ort_version=args.ort_version, shapes=shapes, dims=dims, ep=ep)
        table = None
    result["model"] = os.path.basename(args.model)
    if args.output:
        with args.writes.writing(args.output):
            calibrate.write(result, args.output, protected)
    print(json_text(result) if args.json else table or calibrate.to_table(result))
    return EXIT_OK


def _check_report_path(report: str, protected: dict[str, str]) -> None:
    """A bad --report must fail before the model is written, not after (exit 2 with an output);
    it may not name the input, its data, the output or the output's data (the same rule as -o)."""
    if not report.endswith((".json", ".html")):
        raise UsageError(f"--report {printable(report)}: the name must end in .json or .html")
    check_destination(report, protected, label="--report ")


def cmd_inspect(args) -> int:
    real = None
    if args.ep == "dml":
        real = real_ep.resolve(args.dml_host, args.ort_version, other_version_ok=True)
    elif args.dml_host:
        raise UsageError("--dml-host runs the real DirectML EP beside the prediction: add --ep dml")
    info = inspect(args.model, ep=args.ep, ort_version=args.ort_version or (real.version if real else None))
    if args.ep == "dml":
        if real is None:
            info["placement_actual"] = {"measured": False, "why": real_ep.unavailable("the actual placement")}
        else:
            shapes, dims = _shapes(args)
            info["placement_actual"] = {"measured": True, **real_ep.placement(load(args.model), real,
                                                                               shapes=shapes, dims=dims)}
    print(json_text(info) if args.json else to_table(info) + _actual_placement_text(info))
    return EXIT_OK


def _actual_placement_text(info) -> str:
    """The real EP's placement beside the prediction, each labelled."""
    actual = info.get("placement_actual")
    if actual is None:
        return ""
    if not actual["measured"]:
        return f"\n\nactual placement: not measured ({actual['why']})"
    p = info["placement"]
    rows = [("", f"predicted (table {p['ort_version']})", f"actual (real EP, ORT {actual['host']['ort_version']})"),
            ("nodes on CPU", len(p["cpu_nodes"]), actual["cpu_nodes"]),
            ("copies (Memcpy)", p["memcpy"]["count"], actual["copies"]),
            ("compiled DML partitions", p["partitions"]["count"],
             "?" if actual["partitions"] is None else actual["partitions"])]
    return ("\n\n" + real_ep.host_line(actual["host"]) + "\n" + format_table(rows) + "\n"
            + real_ep.placement_line(actual))


def cmd_validate(args) -> int:
    shapes, dims = _shapes(args)
    real = None
    if args.ep == "dml":
        real = real_ep.resolve(args.dml_host, args.ort_version, required=True, what="validate --ep dml")
    elif args.dml_host or args.ort_version:
        raise UsageError("--dml-host and --ort-version choose the real DirectML EP: add --ep dml")
    inputs = open_npz(args.inputs) if args.inputs else None  # opened once, before any work; read by header
    ref, cand = load(args.ref), load(args.cand)
    check_input(ref, args.ref)  # cycles, undefined values, unknown opsets: one line, before ORT sees them
    check_input(cand, args.cand)
    v = validate(ref, cand, shapes=shapes, dims=dims, inputs=inputs, atol=args.atol, rtol=args.rtol, seed=args.seed,
                 ep="cpu" if args.ep == "dml" else runtime.resolve_ep(args.ep), allow_nonfinite=args.allow_nonfinite,
                 progress=_progress(args))
    # the table with output names escaped (a name must not forge a line); the JSON keeps them
    shown = dataclasses.replace(v, outputs=[dataclasses.replace(o, name=printable(o.name)) for o in v.outputs])
    if real is None:
        print(json_text(v.to_dict()) if args.json else shown.to_table())
        return EXIT_OK if v.passed else EXIT_CHECK
    on_dml = real_ep.validate_real(ref, cand, real, shapes=shapes, dims=dims, inputs=inputs, atol=args.atol,
                                   rtol=args.rtol, seed=args.seed)
    passed = v.passed and on_dml["passed"]
    if args.json:
        print(json_text({"passed": passed, "cpu": v.to_dict(), "dml": on_dml}))
    else:
        print(f"{'passed' if passed else 'FAILED'}: CAND against REF on the CPU EP "
              f"({'passed' if v.passed else 'FAILED'}) and on the real DirectML EP "
              f"({'passed' if on_dml['passed'] else 'FAILED'})\n\nCPU EP:\n{shown.to_table()}\n\n"
              f"{real_ep.validation_table(printable_tree(on_dml))}")
    return EXIT_OK if passed else EXIT_CHECK


def cmd_bench(args) -> int:
    if args.emulate and (args.compare or args.tune_ep or args.ep != "auto"):
        raise UsageError("--emulate picks its own providers: it cannot be combined with --ep, --compare or --tune-ep")
    if args.compare and args.tune_ep:
        raise UsageError("--tune-ep times one model: drop --compare")
    if args.profile and args.warmup < 1:
        raise UsageError("--profile reads ORT's profile of the warm-up runs: give --warmup >= 1")
    capture_flag = "--cuda-graph" if args.cuda_graph else "--graph-capture" if args.graph_capture else None
    if capture_flag and (args.profile or args.emulate):
        raise UsageError(f"{capture_flag} replays a captured graph, which has no per-node profile: drop "
                         + ("--profile" if args.profile else "--emulate"))
    shapes, dims = _shapes(args)
    progress = _progress(args)
    if args.emulate:
        emulate.parse_emulate(args.emulate)
        out = emulate.time_emulated(load(args.model), args.emulate, runs=args.runs, warmup=args.warmup,
                                  shapes=shapes, dims=dims, progress=progress)
        print(json_text(out) if args.json else bench.to_table(out))
        return EXIT_OK
    if args.ep == "dml" and (dml_host.configured(args.dml_host) or not runtime.has_target("dml")):
        return _bench_real_dml(args, shapes, dims)
    if args.ep == "auto" and dml_host.configured(args.dml_host) and not runtime.has_target("dml"):
        return _bench_real_dml(args, shapes, dims)  # the DirectML host configured here is where DirectML runs
    if args.dml_host or args.ort_version:
        raise UsageError("--dml-host and --ort-version run the real DirectML EP under Wine: add --ep dml")
    target = runtime.resolve_ep(args.ep)
    if args.cuda_graph and target != "cuda":
        raise UsageError(f"--cuda-graph applies to the CUDA EP (--ep cuda), not {target}: --graph-capture "
                         "covers CUDA and WebGPU")
    if args.graph_capture and target not in bench.GRAPH_CAPTURE:
        raise UsageError(f"--graph-capture applies to the CUDA and WebGPU EPs (--ep cuda, --ep webgpu), not {target}")
    options = bench.parse_provider_options(target, args.provider_option,
                                           disable_metacommands=args.disable_metacommands)
    common = dict(runs=args.runs, warmup=args.warmup, shapes=shapes, dims=dims, free_dims=dims,
                  provider_options=options, progress=progress, graph_capture=bool(capture_flag))
    model, other = load(args.model), None
    try:
        if args.tune_ep:
            out = bench.tune_ep(model, target, **common)
        elif _identical_models(args, model):
            return EXIT_OK
        elif args.compare:
            other = load(args.compare)
            names = _model_labels(args.model, args.compare)
            out = bench.compare({names[0]: model, names[1]: other}, target, **common)
        else:
            out = bench.time_model(model, target, **common)
    except InputError as e:
        if not capture_flag:
            raise
        # ORT's reason, then what the analysis says stops capture (which nodes, which dims).
        raise InputError(f"{e} ({_capture_readiness(model, target, dims).line()})") from e
    note = bench.target_note([m for m in (model, other) if m is not None], out["provider"])
    if note:
        out["note"] = note
    print(json_text(out) if args.json else "\n".join(bench.verdict(out)) if args.quiet
          else bench.to_table(out, profile=args.profile))
    return EXIT_OK


def _capture_readiness(model, target: str, dims=None):
    """What stops graph capture of `model` on `target`, as inspect and optimize say it (WebGPU: placement
    measured on the EP, with the --dim overrides bench ran)."""
    if target == "webgpu":
        return webgpu_placement.readiness(model, webgpu_placement.measure(model, dims=dims))
    return graph_capture_readiness(model, target)


def _bench_real_dml(args, shapes, dims) -> int:
    """bench --ep dml on the Wine host: each model in its own host process; the report names the device.
    --compare runs where the host's device is a GPU (a software device's times compare nothing)."""
    ep = real_ep.resolve(args.dml_host, args.ort_version, required=True, what="bench --ep dml")
    refused = [flag for flag, on in (("--tune-ep", args.tune_ep), ("--cuda-graph", args.cuda_graph),
                                     ("--graph-capture", args.graph_capture),
                                     ("--provider-option", args.provider_option),
                                     ("--disable-metacommands", args.disable_metacommands)) if on]
    if refused:
        raise UsageError(f"{refused[0]} is not available with the DirectML host under Wine (its runner takes "
                         "no provider options)")
    if args.profile and args.compare:
        raise UsageError("--profile on the DirectML host profiles one model: drop --compare")
    progress = _progress(args)
    model = load(args.model)
    if _identical_models(args, model):
        return EXIT_OK
    if args.compare:
        if ep.software:
            raise UsageError(f"--compare on the DirectML host: its device is {dml_host.SOFTWARE_NOTE}, whose "
                             "times compare nothing (run it where the host's DirectML is on a GPU)")
        models = dict(zip(_model_labels(args.model, args.compare), (model, load(args.compare))))
        with ticking(progress, f"bench on the real DirectML EP (ORT {ep.version}, {args.warmup} warm-up + "
                               f"{args.runs} runs, each model in its own host process, twice)"):
            out = real_ep.compare_on_host(models, ep, runs=args.runs, warmup=args.warmup, shapes=shapes, dims=dims,
                                  progress=progress)
        print(json_text(out) if args.json else "\n".join(bench.verdict(out)) if args.quiet
              else bench.to_table(out))
        return EXIT_OK
    with ticking(progress, f"bench {printable(os.path.basename(args.model))} on the real DirectML EP "
                           f"(ORT {ep.version}, {args.warmup} warm-up + {args.runs} runs, one host process)"):
        out = real_ep.time_model(model, ep, runs=args.runs, warmup=args.warmup, shapes=shapes,
                                 dims=dims, profile=args.profile)
    print(json_text(out) if args.json else real_ep.time_table(printable_tree(out)))
    return EXIT_OK


def _identical_models(args, model) -> bool:
    """--compare OTHER holding the same bytes as MODEL (weights inside the file): timing them against each
    other measures only noise; says so."""
    if not (args.compare and _same_file_content(args.model, args.compare) and not runtime.has_external_data(model)):
        return False
    print(f"identical models: {printable(args.model)} and {printable(args.compare)} hold the same bytes; "
          "nothing to time")
    return True


def _same_file_content(a: str, b: str) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def _model_labels(*paths: str) -> list[str]:
    """Each model by its file name; the whole paths when two names are the same."""
    names = [os.path.basename(p) for p in paths]
    return names if len(set(names)) == len(names) else [os.fspath(p) for p in paths]


def cmd_passes(args) -> int:
    for name, cls in all_passes().items():
        print(f"{name:<16} {cls.summary}")
        for opt in cls.options:
            choices = f" {{{'|'.join(opt.choices)}}}" if opt.choices else ""
            print(f"{'':<16}   {opt.flag}{choices}: {opt.help} (default: {opt.default})")
    return EXIT_OK


def cmd_demo(args) -> int:
    if os.path.lexists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise UsageError(f"-o {printable(args.output_dir)}: exists and is not a folder")
    with args.writes.writing_in(args.output_dir):
        return demo.run(output_dir=args.output_dir, runs=args.runs, quiet=args.quiet)


COMMANDS = {
    "optimize": cmd_optimize,
    "inspect": cmd_inspect,
    "validate": cmd_validate,
    "bench": cmd_bench,
    "calibrate": cmd_calibrate,
    "passes": cmd_passes,
    "demo": cmd_demo,
}

if __name__ == "__main__":
    sys.exit(main())
