"""Progress on a terminal: step lines and bars on stderr, nothing when it is not a TTY.

Why home-made: two small things are needed (a "step ... 1.2 s" line and a bar that
redraws itself with ``\\r``) and a dependency such as tqdm is not worth it.  Output goes
only to an interactive stderr, so logs, pipes and CI stay clean; ``-q`` turns it off.

    steps = Steps()                 # callable: steps("validate") prints a step line
    with steps.bar("timing", 40) as bar:
        for _ in range(40):
            ...
            bar.advance()
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TextIO

BAR_WIDTH = 28
# Redraw at most this often (seconds), so a fast loop does not flood the terminal.
REDRAW_S = 0.05
# A long step's elapsed time is redrawn this often (seconds).
TICK_S = 1.0


def is_terminal(stream: TextIO | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class Bar:
    """``label [#####.....] 12/40 3.1s`` redrawn in place; silent when disabled."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, enabled: bool | None = None):
        self.label = label
        self.total = max(int(total), 0)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self._start = time.perf_counter()
        self._drawn = 0.0
        self._closed = False
        self._draw(force=True)

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        self._draw(force=self.done == self.total)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self) -> str:
        elapsed = time.perf_counter() - self._start
        if self.total:
            filled = round(BAR_WIDTH * self.done / self.total)
            return (f"dmlopt: {self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                    f"{self.done}/{self.total} {elapsed:.1f}s")
        return f"dmlopt: {self.label} {self.done} {elapsed:.1f}s"

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._drawn < REDRAW_S:
            return
        self._drawn = now
        self.stream.write("\r" + self.line() + "\x1b[K")
        self.stream.flush()


class Steps:
    """The pipeline's progress callback: one line a step, with the time since the start.

    Whole lines only, so whatever the caller prints next starts on a fresh line and
    nothing needs closing."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self._start = time.perf_counter()

    def __call__(self, step: str) -> None:
        if self.enabled:
            self.stream.write(f"dmlopt: [{time.perf_counter() - self._start:6.1f}s] {step}\n")
            self.stream.flush()

    def bar(self, label: str, total: int) -> Bar:
        return Bar(label, total, self.stream, self.enabled)

    @contextlib.contextmanager
    def ticking(self, label: str):
        """One long step that reports nothing itself (a child process on the DirectML host, a
        WebGPU run): its line with the elapsed time, redrawn every TICK_S until it ends."""
        if not self.enabled:
            yield
            return
        start, stop = time.perf_counter(), threading.Event()

        def draw(end: str = "") -> None:
            self.stream.write(f"\rdmlopt: [{start - self._start:6.1f}s] {label} ... "
                              f"{time.perf_counter() - start:.0f}s\x1b[K{end}")
            self.stream.flush()

        def tick() -> None:
            while not stop.wait(TICK_S):
                draw()

        draw()
        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            draw("\n")


def bar_for(progress, label: str, total: int) -> Bar:
    """A bar from a progress callback that has ``.bar`` (Steps), else a silent one."""
    make = getattr(progress, "bar", None)
    if make is None:
        return Bar(label, total, enabled=False)
    return make(label, total)


def ticking(progress, label: str):
    """`Steps.ticking` from a progress callback that has it; else nothing is shown."""
    make = getattr(progress, "ticking", None)
    return make(label) if make is not None else contextlib.nullcontext()
