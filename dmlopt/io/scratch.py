"""Scratch folders that an interrupt cannot leave behind.

A signal turned into an exception (Ctrl-C, or SIGTERM/SIGHUP by the command line) is raised
wherever Python runs next: inside ``mkdtemp`` after the folder exists but before the caller holds
its name, or in the middle of the ``rmtree`` that removes it.  Either way the folder (ORT's copy of
the weights, a half-written output) stays behind.  The command line's signal handlers therefore
call `raise_or_defer`, and the creation and removal of each scratch folder run `uninterrupted`:
an interrupt that arrives there is raised as soon as the block ends, the folder gone.  Outside
the command line (the Python API) the block itself defers Ctrl-C the same way, while it lasts.

A process that is killed (SIGKILL after a grace, by dmlopt's supervisor: dmlopt.cli.supervisor) runs
no cleanup at all, so every scratch path and every destination not yet complete is also noted in
a ledger, when the supervisor gave one (`created`, `settled`): the supervisor removes what is
left in it.  Temporary names are cut to a bounded length so that an output name that is itself
valid never fails only at its temporary folder's name.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import tempfile
import threading
from typing import Iterator

from dmlopt.errors import OutputError, printable

LEDGER_ENV = "DMLOPT_SCRATCH_LEDGER"  # set by dmlopt.cli.supervisor for its worker
# Characters of a destination's name kept in its temporary names (".NAME.XXXXXXXX.tmp").
TEMP_NAME_CHARS = 64

_depth = 0  # how many uninterrupted blocks are open (signal handlers run in the main thread only)
_pending: BaseException | None = None  # the first interrupt that arrived inside one


def raise_or_defer(exc: BaseException) -> None:
    """Raise `exc` now, or at the end of the open `uninterrupted` block (signal handlers call this)."""
    global _pending
    if _depth:
        if _pending is None:
            _pending = exc
        return
    raise exc


def _defer_sigint(_signum, _frame):
    """The API's Ctrl-C while an `uninterrupted` block is open: always deferred.  It is installed
    before the block counts itself and removed before the block ends, so a Ctrl-C landing in
    between is still the block's (raised at its end), never raised half-way or left installed."""
    global _pending
    if _pending is None:
        _pending = KeyboardInterrupt()


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Interrupts raised through `raise_or_defer` wait until the outermost block ends.  Python's
    own Ctrl-C handler (the API, outside the command line) is replaced by one that defers too."""
    global _depth, _pending
    previous = None
    if _depth == 0:
        _pending = None  # one left by a Ctrl-C that landed after a block's end was raised already
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous = signal.signal(signal.SIGINT, _defer_sigint)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


def temp_prefix(name: str) -> str:
    """The prefix of a temporary file or folder for destination `name`: ``.NAME.``, the name cut."""
    return f".{name[:TEMP_NAME_CHARS]}."


_ledger = None


def _note(mark: str, path) -> None:
    global _ledger
    where = os.environ.get(LEDGER_ENV)
    if not where:
        return
    if _ledger is None:
        _ledger = open(where, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives with the process
    _ledger.write(mark + json.dumps(os.path.abspath(os.fspath(path))) + "\n")


def created(path) -> None:
    """`path` now exists and is partial (scratch, or an output not yet complete): if the process
    is killed, the supervisor removes it."""
    _note("+", path)


def completed(path) -> None:
    """`path`, an output, is in place and complete: the supervisor names it if the run is killed."""
    _note("=", path)


def settled(path) -> None:
    """`path` is gone or complete: the supervisor leaves it alone."""
    _note("-", path)


def remove(path: str | os.PathLike) -> None:
    """Remove a scratch folder completely, an interrupt during the removal raised after it."""
    with uninterrupted():
        shutil.rmtree(path, ignore_errors=True)
        settled(path)


def make_folder(prefix: str, *, suffix: str | None = None, parent: str | os.PathLike | None = None) -> pathlib.Path:
    """A new scratch folder that the caller removes (`remove`), noted in the ledger.  Call it inside
    an `uninterrupted` block that also stores the result, or an interrupt may lose the name."""
    with uninterrupted():
        path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
        created(path)
    return path


def make_file(prefix: str, *, suffix: str | None = None, parent: str | os.PathLike | None = None
              ) -> tuple[int, str]:
    """A new scratch file (fd, path) that the caller removes or renames, noted in the ledger."""
    with uninterrupted():
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
        created(path)
    return fd, path


@contextlib.contextmanager
def folder(prefix: str, *, suffix: str | None = None, parent: str | os.PathLike | None = None
           ) -> Iterator[pathlib.Path]:
    """A new folder (in `parent`, else the system temp folder) removed on leaving, however it is left.
    OSError from creating it reaches the caller."""
    path: pathlib.Path | None = None
    try:
        with uninterrupted():
            path = make_folder(prefix, suffix=suffix, parent=parent)
        yield path
    except OSError as e:
        if path is None or _storage_error(e, path):
            where = os.fspath(parent) if parent is not None else tempfile.gettempdir()
            raise OutputError(f"cannot write temporary files in {printable(where)}: {e.strerror or e}"
                              + ("" if parent is not None else " (free space there, or set TMPDIR to another folder)")
                              ) from e
        raise
    finally:
        if path is not None:
            remove(path)


@contextlib.contextmanager
def capture_stderr() -> Iterator[dict[str, str]]:
    """Collect what is written to file descriptor 2 inside the block (ORT's logger and Dawn write
    there, not to Python's ``sys.stderr``); the text is in ``box["text"]`` afterwards, also when
    the block raised."""
    box = {"text": ""}
    with folder("dmlopt-stderr-") as tmp, open(tmp / "stderr.txt", "w+b") as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield box
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            box["text"] = held.read().decode("utf-8", "replace")


# What a full, read-only or limited folder raises while files are written into it.
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE,
                  errno.ENFILE, errno.ENAMETOOLONG}


def _storage_error(e: OSError, folder: pathlib.Path) -> bool:
    """Whether `e` is the scratch folder failing (no space, quota, file size limit...): one
    about a file inside it, or a write error that names no file."""
    if e.errno not in STORAGE_ERRNOS:
        return False
    name = e.filename
    if name is None:
        return True
    try:
        return pathlib.Path(os.fspath(name)).resolve().is_relative_to(folder.resolve())
    except (OSError, ValueError, TypeError):
        return False

