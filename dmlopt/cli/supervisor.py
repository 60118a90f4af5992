"""The `dmlopt` process: a small supervisor and a worker that does the command.

Why: Python runs a signal handler only between bytecodes of the main thread.  While ONNX
Runtime runs a model (a Loop that never ends) or onnx's C++ infers shapes, SIGINT and SIGTERM
wait, and `timeout` or `docker stop` could not end dmlopt.  So when dmlopt runs as a program
(``dmlopt ...``, ``python -m dmlopt ...``), the command runs in a forked worker in its own
process group, and the parent only waits:

  - SIGINT, SIGTERM or SIGHUP to the parent is passed on to the worker, whose own handlers
    (dmlopt.cli.commands) clean up as always and exit 130/143/129 with their one line;
  - a worker still alive `GRACE_S` seconds later (stuck in native code), or at a second
    signal, is killed with its group (SIGKILL), and with every process that left the group but
    inherited the worker's environment (dmlopt.runtime.process_tree: the DirectML host's Wine server and
    services), and the parent removes what it left: every
    scratch folder or file and every output not yet complete that the worker noted in its
    ledger (dmlopt.io.scratch.created/settled; outputs go in place as one transaction,
    dmlopt.io.outputs), then prints the same line the worker would have and exits 128 + signal.

A worker that dies by itself (out of memory, a crash in native code) is cleaned up the same way
and named.  `dmlopt.cli.commands.main(argv)` called from Python runs in-process, unsupervised (a host's
own signals are its own).  Without fork (Windows) the command runs in-process too: there,
Ctrl-C still cannot interrupt native code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Callable

from dmlopt.io import scratch
from dmlopt.runtime import process_tree
from dmlopt.errors import printable

GRACE_S = 3.0  # seconds the worker has to clean up after a signal before it is killed
POLL_S = 0.05
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP")


def available() -> bool:
    """Whether the command can run in a supervised worker here: fork exists, this is the main
    thread, no other thread runs (fork copies only the calling one), and we are no worker."""
    return (hasattr(os, "fork") and hasattr(os, "killpg") and not os.environ.get(scratch.LEDGER_ENV)
            and threading.current_thread() is threading.main_thread() and threading.active_count() == 1)


def run(work: Callable[[], int]) -> int:
    """`work()` in a supervised worker (see the module's docstring); its exit code."""
    if not available():
        return work()
    try:
        folder = tempfile.mkdtemp(prefix="dmlopt-ledger-")
    except OSError:  # no room for a ledger: the command runs, unsupervised, and says what it can
        return work()
    ledger = os.path.join(folder, "ledger")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    pid = os.fork()
    if pid == 0:
        _worker(work, ledger)  # never returns
    try:
        os.setpgid(pid, pid)  # as the worker does: whichever runs first, the group exists before a signal
    except OSError:
        pass
    try:
        return _supervise(pid, ledger)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _worker(work: Callable[[], int], ledger: str) -> None:
    code = 3
    try:
        os.setpgid(0, 0)  # its own group: the parent signals (and, if need be, kills) it as a whole
        os.environ[scratch.LEDGER_ENV] = ledger
        code = work()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - work() reports its own errors; this is the last resort
        code = 3
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code if isinstance(code, int) else 3)


def _supervise(pid: int, ledger: str) -> int:
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        _signal(pid, signal.SIGKILL if len(received) > 1 else signum)  # a second signal: at once

    previous = {}
    for name in FORWARDED:
        if hasattr(signal, name):
            previous[name] = signal.signal(getattr(signal, name), forward)
    try:
        return _wait_and_clean(pid, ledger, received)
    finally:
        # Held until the cleanup and the report are done. After a signal the program only exits (130 or 128+N),
        # so a further one (Ctrl-C pressed twice) is ignored rather than killing it with its exit status lost.
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), signal.SIG_IGN if received else handler)


def _wait_and_clean(pid: int, ledger: str, received: list[int]) -> int:
    """Wait for the worker (killing it after a second signal or the grace), end what it left, say what happened."""
    killed = False
    first_at = None
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            break
        if received and first_at is None:
            first_at = time.monotonic()  # the grace counts from here
        if received and not killed and (len(received) > 1 or time.monotonic() - first_at > GRACE_S):
            killed = True
            _signal(pid, signal.SIGKILL)
        time.sleep(POLL_S)
    _kill_group(pid)  # anything the worker started that outlived it
    process_tree.end_marked(scratch.LEDGER_ENV, ledger)  # and what left the group (the DirectML host's Wine)
    left, complete = read_ledger(ledger)
    remove_leftovers(left)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0 and not killed:
        return code  # the worker ended by itself and said what happened
    if received:
        name = signal.Signals(received[0]).name
        what = "interrupted" if received[0] == signal.SIGINT else f"terminated ({name})"
        _say(f"dmlopt: {what}; {written_message(complete)}")
        return 130 if received[0] == signal.SIGINT else 128 + received[0]
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
    hint = " (out of memory?)" if -code == signal.SIGKILL else ""
    _say(f"dmlopt: internal error: the worker process died of {name}{hint}; {written_message(complete)}")
    return 128 + (-code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _signal(pid: int, signum: int) -> None:
    """`signum` to the worker's group, or to the worker alone if its group is not there."""
    try:
        os.killpg(pid, signum)
    except OSError:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def read_ledger(path: str) -> tuple[list[str], list[str]]:
    """(paths still partial, in the order noted; outputs complete) from a worker's ledger."""
    partial: dict[str, None] = {}
    complete: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return [], []
    for line in lines:
        try:
            mark, where = line[0], json.loads(line[1:])
        except (IndexError, ValueError):
            continue  # a line cut by the kill
        if mark == "+":
            partial[where] = None
        elif mark == "-":
            partial.pop(where, None)
        elif mark == "=" and where not in complete:
            complete.append(where)
    return list(partial), complete


def remove_leftovers(paths: list[str]) -> None:
    for path in reversed(paths):  # folders' contents before the folders
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def written_message(complete: list[str]) -> str:
    if not complete:
        return "nothing was written"
    shown = ", ".join(printable(p) for p in complete[:3])
    more = f" and {len(complete) - 3} more" if len(complete) > 3 else ""
    return f"already written (complete): {shown}{more}"


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
