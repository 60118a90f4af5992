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

from dmlopt import bench, demo, runtime, scratch, session_config

from dmlopt.targets.dml import calibrate, emulate
from dmlopt import report as report_mod
from dmlopt.errors import DmlOptError, InputError, UsageError, printable
from dmlopt.graph_capture import graph_capture_readiness
from dmlopt.inspection import inspect, to_table
from dmlopt.jsontext import json_text
from dmlopt.model import check_destination, check_input, load, protected_paths, save
from dmlopt.passes import all_passes
from dmlopt.pipeline import optimize, pass_options
from dmlopt.progress import Steps, is_terminal
from dmlopt.shapes import parse_dim, parse_shape
from dmlopt.validate import validate
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
    """Step lines and bars on an interactive stderr (dmlopt.progress); None with -q or when piped."""
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
    p.add_argument("--target", default="dml", choices=["dml", "cuda", "cpu"], help="deployment provider (default dml)")
    p.add_argument("--ort-version", help="ONNX Runtime version deployed on the target, e.g. 1.14 (default: newest)")
    p.add_argument("--report", metavar="PATH", help="write the report: JSON if PATH ends in .json, HTML if .html")
    p.add_argument("--no-validate", action="store_true", help="run no model: no numerics check, auto options at their "
                   "documented defaults, no re-timing (not recommended)")
    p.add_argument("--no-time", dest="retime", action="store_false", default=None,
                   help="skip timing before/after on the target (done by default when its provider is here)")
    p.add_argument("--force", action="store_true", help="write the output even if validation fails (the report says so)")
    p.add_argument("--tune", action="store_true", help="measure pass variants on the target provider (must be present)")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs for validation instead of seeded random ones")
    p.add_argument("--atol", type=float, help="absolute tolerance for validation (default by dtype)")
    p.add_argument("--rtol", type=float, help="tolerance relative to the output's magnitude (default by dtype)")
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
        p.add_argument(opt.flag, dest=f"opt_{name}", choices=opt.choices, type=opt.type, default=None,
                       help=f"[{cls.name}] {opt.help} (default: {opt.default})")

    p = sub.add_parser("inspect", help="inputs, outputs, op histogram and what the passes would look at")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("--ep", choices=["dml"], help="predict placement on this provider (dml)")
    p.add_argument("--ort-version", help="ONNX Runtime version for the placement model (default: newest)")

    p = sub.add_parser("validate", help="compare two models' outputs on ORT's CPU EP",
                       description="Run REF and CAND on the same seeded random inputs (or --inputs) and compare "
                                   "every output: max abs error, max relative error, cosine. Exit 1 on mismatch.")
    p.add_argument("ref")
    p.add_argument("cand")
    _add_shape_args(p)
    p.add_argument("--inputs", metavar="FILE.npz")
    p.add_argument("--atol", type=float)
    p.add_argument("--rtol", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="time a model on a provider (session creation, latency, copies)",
                       description="Create a session, warm up (profiled: copies are counted from ORT's profile), "
                                   "then time N runs with fixed inputs (IO binding on GPU providers). Asking for a "
                                   "provider that is not here is an error, never a silent CPU run.")
    p.add_argument("model")
    p.add_argument("--ep", default="auto", choices=["auto", "dml", "cuda", "cpu"],
                   help="provider (default auto: DirectML, else CUDA, else CPU)")
    p.add_argument("--runs", type=int, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed, profiled runs first (default 3)")
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
    p.add_argument("--emulate", metavar="dml-VERSION",
                   help="time as DirectML of that ORT version would place the graph (e.g. dml-1.14): predicted "
                        "CPU nodes on the CPU EP, the rest on CUDA when present")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict (no progress, no tables)")

    _add_calibrate_parser(sub)

    sub.add_parser("passes", help="list every pass with a one-line description and its options")

    p = sub.add_parser("demo", help="optimize the bundled models and show a before/after table")
    p.add_argument("-o", "--output-dir", default="dmlopt-demo", help="where to write the optimized models")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("-q", "--quiet", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
        print(f"dmlopt: error: {printable(str(e))}", file=sys.stderr)  # a name in it cannot forge a line
        return e.exit_code
    except Terminated as e:
        print(f"dmlopt: terminated ({e}); {writes.message()}", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print(f"dmlopt: interrupted; {writes.message()}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dmlopt inspect m.onnx | head`: the reader left; not an error to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except Exception as e:  # noqa: BLE001 - a bug in dmlopt: still one line, unless debugging
        if os.environ.get("DMLOPT_DEBUG"):
            raise
        print(f"dmlopt: internal error: {type(e).__name__}: {printable(str(e).splitlines()[0]) if str(e) else ''} "
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
    check_destination(output, protected)
    check_destination(output + ".data", protected)
    written = {**protected, output: "the output model", output + ".data": "the output model's external data"}
    if args.report:
        _check_report_path(args.report, written)
    report_path = {args.report: "the report"} if args.report else {}
    session_path = _session_config_target(args, output, {**written, **report_path})
    options = {k[4:]: v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}
    result = optimize(args.model, shapes=shapes, dims=dims, passes=args.passes, target=args.target,
                             ort_version=args.ort_version, validate=not args.no_validate, tune=args.tune,
                             inputs=args.inputs, atol=args.atol, rtol=args.rtol, progress=_progress(args),
                             retime=args.retime, **options)
    rep = result.report
    ok = result.passed
    if ok or args.force:
        with args.writes.writing(output, output + ".data"):
            save(result.model, output, protect=tuple(protected))
        rep.written = os.fspath(output)
        rep.forced = not ok
        with args.writes.writing(session_path):
            _write_session_config(rep, output, session_path, written)
    if args.report:
        with args.writes.writing(args.report):
            report_mod.write(rep, args.report)
    print(rep.to_json() if args.json else "\n".join(map(printable, rep.verdict())) if args.quiet else rep.to_table())
    if not ok:
        where = f" (first failing pass: {rep.broken_by})" if rep.broken_by else ""
        if args.force:
            print(f"dmlopt: warning: validation FAILED{where}; output written anyway because of --force",
                  file=sys.stderr)
        else:
            print(f"dmlopt: error: the optimized model does not match the original{where}; nothing was written "
                  f"(--force writes it anyway)", file=sys.stderr)
        return EXIT_CHECK
    print(f"wrote {output}{_session_config_written(rep)}", file=sys.stderr)
    return EXIT_OK


def _add_session_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-session-config", dest="session_config", action="store_false", default=True,
                   help="do not write OUT.session.json (the recommended ONNX Runtime session for the target)")


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
    rep.session_config.update(path=path, snippet=session_config.snippet(path))


def _session_config_written(rep) -> str:
    path = (rep.session_config or {}).get("path")
    return f" and {path}" if path else ""


def _add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="run on the real DirectML EP: predicted vs actual placement, as JSON",
                       description="Create a DirectML session with ORT's verbose log and profiling, run the model "
                                   "once, and compare where ORT put each node, the copies and the compiled "
                                   "partitions with dmlopt's placement table for that ORT version. Needs "
                                   "onnxruntime-directml (Windows); elsewhere it exits 2.")
    p.add_argument("model")
    p.add_argument("--ort-version", default="auto",
                   help="placement table to compare with (default auto: the onnxruntime installed here)")
    p.add_argument("-o", "--output", metavar="CALIB.json", help="write the full comparison as JSON")
    _add_shape_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON instead of a table")


def cmd_calibrate(args) -> int:
    protected = protected_paths(args.model)
    if args.output:
        check_destination(args.output, protected, label="-o ")
        if not args.output.endswith(".json"):
            raise UsageError(f"-o {args.output}: the name must end in .json")
    shapes, dims = _shapes(args)
    model = load(args.model)
    check_input(model)
    result = calibrate.calibrate(model, ort_version=args.ort_version, shapes=shapes, dims=dims)
    result["model"] = os.path.basename(args.model)
    if args.output:
        with args.writes.writing(args.output):
            calibrate.write(result, args.output, protected)
    print(json_text(result) if args.json else calibrate.to_table(result))
    return EXIT_OK


def _check_report_path(report: str, protected: dict[str, str]) -> None:
    """A bad --report must fail before the model is written, not after (exit 2 with an output);
    it may not name the input, its data, the output or the output's data (the same rule as -o)."""
    if not report.endswith((".json", ".html")):
        raise UsageError(f"--report {printable(report)}: the name must end in .json or .html")
    check_destination(report, protected, label="--report ")


def cmd_inspect(args) -> int:
    info = inspect(args.model, ep=args.ep, ort_version=args.ort_version)
    print(json_text(info) if args.json else to_table(info))
    return EXIT_OK


def cmd_validate(args) -> int:
    shapes, dims = _shapes(args)
    ref, cand = load(args.ref), load(args.cand)
    check_input(ref, args.ref)  # cycles, undefined values, unknown opsets: one line, before ORT sees them
    check_input(cand, args.cand)
    v = validate(ref, cand, shapes=shapes, dims=dims, inputs=args.inputs, atol=args.atol,
                 rtol=args.rtol, seed=args.seed)
    # the table with output names escaped (a name must not forge a line); the JSON keeps them
    shown = dataclasses.replace(v, outputs=[dataclasses.replace(o, name=printable(o.name)) for o in v.outputs])
    print(json_text(v.to_dict()) if args.json else shown.to_table())
    return EXIT_OK if v.passed else EXIT_CHECK


def cmd_bench(args) -> int:
    if args.runs < 1 or args.warmup < 0:
        raise UsageError("--runs must be >= 1 and --warmup >= 0")
    if args.emulate and (args.compare or args.tune_ep or args.ep != "auto"):
        raise UsageError("--emulate picks its own providers: it cannot be combined with --ep, --compare or --tune-ep")
    if args.compare and args.tune_ep:
        raise UsageError("--tune-ep times one model: drop --compare")
    if args.profile and args.warmup < 1:
        raise UsageError("--profile reads ORT's profile of the warm-up runs: give --warmup >= 1")
    if args.cuda_graph and (args.profile or args.emulate):
        raise UsageError("--cuda-graph replays a captured graph, which has no per-node profile: drop "
                         + ("--profile" if args.profile else "--emulate"))
    shapes, dims = _shapes(args)
    progress = _progress(args)
    if args.emulate:
        emulate.parse_emulate(args.emulate)
        out = emulate.time_emulated(load(args.model), args.emulate, runs=args.runs, warmup=args.warmup,
                                  shapes=shapes, dims=dims, progress=progress)
        print(json_text(out) if args.json else bench.to_table(out))
        return EXIT_OK
    target = runtime.resolve_ep(args.ep)
    if args.cuda_graph and target != "cuda":
        raise UsageError(f"--cuda-graph applies to the CUDA EP (--ep cuda), not {target}")
    options = bench.parse_provider_options(target, args.provider_option,
                                           disable_metacommands=args.disable_metacommands)
    common = dict(runs=args.runs, warmup=args.warmup, shapes=shapes, dims=dims, free_dims=dims,
                  provider_options=options, progress=progress, cuda_graph=args.cuda_graph)
    model = load(args.model)
    try:
        if args.tune_ep:
            out = bench.tune_ep(model, target, **common)
        elif args.compare and _same_file_content(args.model, args.compare) and not runtime.has_external_data(model):
            # the same bytes (weights inside the file): timing them against each other measures only noise
            print(f"identical models: {printable(args.model)} and {printable(args.compare)} hold the same bytes; "
                  "nothing to time")
            return EXIT_OK
        elif args.compare:
            names = _model_labels(args.model, args.compare)
            out = bench.compare({names[0]: model, names[1]: load(args.compare)}, target, **common)
        else:
            out = bench.time_model(model, target, **common)
    except InputError as e:
        if not args.cuda_graph:
            raise
        # ORT's reason, then what the analysis says stops capture (which nodes, which dims).
        raise InputError(f"{e} ({graph_capture_readiness(model, 'cuda').line()})") from e
    note = bench.target_note([model, *([load(args.compare)] if args.compare else [])], out["provider"])
    if note:
        out["note"] = note
    print(json_text(out) if args.json else "\n".join(bench.verdict(out)) if args.quiet
          else bench.to_table(out, profile=args.profile))
    return EXIT_OK


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
