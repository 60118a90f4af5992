"""All the files of one run put in place together, or none of them.

Why: `optimize` writes up to four files (the model, its ``.data``, ``OUT.session.json``, the
report).  Written one after the other, a full disk or a bad report folder could fail after the
model was already renamed into place: exit 2 with a new model on disk, or a new model beside the
previous run's session file.  Inside `transaction()` every writer only *stages* its file (a
temporary file or folder beside the destination, complete and flushed); the renames run when the
block ends without error, all of them inside one `scratch.uninterrupted` block (an interrupt
waits until they are done), in the order they were staged.  An error or interrupt before that
removes every staged file: nothing was written.  A rename that still fails (the folder was
removed under us) raises an OutputError that names exactly which files are complete.

Outside a transaction, `put_in_place` renames at once (the API's `dmlopt.save`).  Each group of
renames (a model's ``.data`` then the model) is all or nothing: an earlier rename of the group
is undone when a later one fails, so a new model never points at missing weights and new weights
are never left without their model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from typing import Iterator

from dmlopt.io import scratch
from dmlopt.errors import OutputError, printable


@dataclasses.dataclass
class Staged:
    """Files ready beside their destinations: (temporary path, destination) renamed in order,
    then `folder` (a temporary folder holding them, if any) removed."""

    what: str
    renames: list[tuple[str, str]]
    folder: str | None = None
    removals: list[str] = dataclasses.field(default_factory=list)  # stale files the group replaces

    def discard(self) -> None:
        with scratch.uninterrupted():
            for tmp, _ in self.renames:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                scratch.settled(tmp)
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                scratch.settled(self.folder)

    def commit(self) -> None:
        """Rename every file of the group, or (on an OSError) none of them stays renamed."""
        done = []
        with scratch.uninterrupted():
            try:
                for tmp, dest in self.renames:
                    os.replace(tmp, dest)
                    done.append(dest)
                    scratch.created(dest)  # until the group is complete, the new file here is partial
                for path in self.removals:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                for dest in done:
                    scratch.completed(dest)
            except BaseException:
                for dest in done:  # the group's earlier files without the rest are partial
                    with contextlib.suppress(OSError):
                        os.unlink(dest)
                raise
            finally:
                for _, dest in self.renames:
                    scratch.settled(dest)
                self.discard()


class Transaction:
    """The staged groups of one run, in the order they were staged."""

    def __init__(self) -> None:
        self.groups: list[Staged] = []

    def commit(self) -> list[str]:
        with scratch.uninterrupted():  # an interrupt waits until every group is in place
            return self._commit()

    def _commit(self) -> list[str]:
        complete: list[str] = []
        for n, group in enumerate(self.groups):
            try:
                group.commit()
            except OSError as e:
                for later in self.groups[n + 1:]:
                    later.discard()
                done = ", ".join(printable(p) for p in complete) or "none"
                raise OutputError(f"cannot put {group.what} in place ({printable(group.renames[-1][1])}: "
                                  f"{e.strerror or e}); complete: {done}; not written: "
                                  f"{', '.join(g.what for g in self.groups[n:])}") from e
            complete.extend(dest for _, dest in group.renames)
        self.groups = []
        return complete

    def discard(self) -> None:
        for group in self.groups:
            group.discard()
        self.groups = []


_open: Transaction | None = None


@contextlib.contextmanager
def transaction() -> Iterator[Transaction]:
    """Writes inside the block are staged; they are put in place together when it ends without
    an error, and removed when it ends with one (an interrupt included)."""
    global _open
    if _open is not None:  # nested: the outer block decides
        yield _open
        return
    tx = _open = Transaction()
    try:
        yield tx
        _open = None
        tx.commit()
    finally:
        _open = None
        tx.discard()


def put_in_place(group: Staged) -> None:
    """Rename `group`'s files now, or when the open transaction commits."""
    if _open is not None:
        _open.groups.append(group)
        return
    group.commit()


def creation_mode() -> int:
    """The mode a new file gets from the process umask (0o644 under the usual 022): temporary
    files made by mkstemp are 0o600 and are given this before they are put in place."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask
