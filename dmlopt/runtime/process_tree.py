"""Ending every process a run started, even those that left its process group and session.

Why: the DirectML host (Wine) starts processes that leave any group dmlopt could signal: `timeout`
makes its own process group, and Wine's server and its services (wineserver, explorer.exe,
winedevice.exe) start sessions of their own.  Killed by process group, they outlived dmlopt
until the host's time limit.  What they all keep is the environment they were started with, so
a run marks it (a variable naming the run: the supervisor's ledger, or a host run's own token) and
everything of this user whose environment holds the mark is ended here: SIGTERM first (Xvfb
removes its /tmp/.X*-lock then), SIGKILL for what is left after a short grace.  Linux reads the
environments from /proc; elsewhere nothing is found and process groups remain the only handle.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["end_marked", "marked"]


def marked(name: str, value: str) -> list[int]:
    """Processes of this user (this one left out) whose environment holds NAME=VALUE."""
    needle = f"{name}={value}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me, uid = os.getpid(), os.getuid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def end_marked(name: str, value: str, grace_s: float = 2.0) -> list[int]:
    """End every process `marked(name, value)`: SIGTERM, then SIGKILL after `grace_s`; the pids."""
    pids = marked(name, value)
    _send(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in marked(name, value) if p in pids]
    _send(pids, signal.SIGKILL)
    for _ in range(40):  # a killed process leaves /proc once its parent reaps it: not ours to wait for
        if not [p for p in marked(name, value) if p in pids]:
            break
        time.sleep(0.05)
    return pids


def _send(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass
