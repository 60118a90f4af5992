"""Scratch folders that an interrupt cannot leave behind.

A signal turned into an exception (Ctrl-C, or SIGTERM/SIGHUP by the command line) is raised
wherever Python runs next: inside ``mkdtemp`` after the folder exists but before the caller holds
its name, or in the middle of the ``rmtree`` that removes it.  Either way the folder (ORT's copy of
the weights, a half-written output) stays behind.  The command line's signal handlers therefore
call `raise_or_defer`, and the creation and removal of each scratch folder run `uninterrupted`:
an interrupt that arrives there is raised as soon as the block ends, the folder gone.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from typing import Iterator

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


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Interrupts raised through `raise_or_defer` wait until the outermost block ends."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


def remove(path: str | os.PathLike) -> None:
    """Remove a scratch folder completely, an interrupt during the removal raised after it."""
    with uninterrupted():
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def folder(prefix: str, *, suffix: str | None = None, parent: str | os.PathLike | None = None
           ) -> Iterator[pathlib.Path]:
    """A new folder (in `parent`, else the system temp folder) removed on leaving, however it is left.
    OSError from creating it reaches the caller."""
    path: pathlib.Path | None = None
    try:
        with uninterrupted():
            path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
        yield path
    finally:
        if path is not None:
            remove(path)

