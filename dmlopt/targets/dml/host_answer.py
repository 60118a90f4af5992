"""Reading the DirectML host's answer: result.json against its schema, each .npy output against
the model.

Why: every byte the host's runner writes back is untrusted input (a broken kit, a runner from
another version, a hostile host folder).  A string where a number belongs, a list where a map
belongs, a missing or extra output file, a path out of the outputs folder, a symlink, or an array
whose shape or dtype is not the model's output must be one line naming the host and what was
wrong (``HostAnswerError``, exit 2), never a KeyError or ValueError deep in a command (exit 3).
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import stat
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dmlopt import limits
from dmlopt.errors import ProviderError, printable

__all__ = ["HostAnswerError", "Answer", "read_outputs", "read_profile", "read_result"]

# What the runner names its files: out<k>.npy in the outputs folder, nothing else.
OUTPUT_FILE = re.compile(r"^out\d{1,6}\.npy$")
MAX_FIELD = 200  # a bad value is quoted at most this long
PROFILE_EVENTS = 200_000  # ORT's profile of a host run: events read at most


class HostAnswerError(ProviderError):
    """The host's answer does not have the form its runner writes."""


class Answer(dict):
    """result.json once checked: ok, error, session_ms, warmup_ms, run_ms, outputs."""


def _bad(what: str, value: Any = None, shown: bool = True) -> HostAnswerError:
    quoted = f" (got {printable(repr(value), MAX_FIELD)})" if shown else ""
    return HostAnswerError(f"result.json: {what}{quoted}")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _bad(f"{what} is not a finite number of milliseconds >= 0", value)
    return float(value)


def _times(value: Any, what: str, count: int) -> list[float]:
    if not isinstance(value, list):
        raise _bad(f"{what} is not a list", value)
    if len(value) != count:
        raise _bad(f"{what} holds {len(value)} times, not the {count} asked for", None, False)
    return [_number(v, f"{what}[{i}]") for i, v in enumerate(value)]


def read_result(data: Any, *, warmup: int, runs: int, outputs: Sequence[str]) -> Answer:
    """Check the parsed result.json; `outputs`: the model's outputs the runner writes (every one
    but string outputs), each listed once, no other."""
    if not isinstance(data, dict):
        raise _bad("is not a JSON object", data)
    ok = data.get("ok")
    if not isinstance(ok, bool):
        raise _bad("'ok' is not true or false", ok)
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        raise _bad("'error' is not text", error)
    if not ok:
        return Answer(ok=False, error=printable(error, 500) if error else None)
    session_ms = _number(data.get("session_ms"), "'session_ms'")
    warmup_ms = _times(data.get("warmup_ms"), "'warmup_ms'", warmup)
    run_ms = _times(data.get("run_ms"), "'run_ms'", max(1, runs))
    listed = data.get("outputs")
    if not isinstance(listed, list):
        raise _bad("'outputs' is not a list", listed)
    wanted, seen, files, entries = set(outputs), set(), set(), []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise _bad(f"outputs[{i}] is not an object", entry)
        name, file = entry.get("name"), entry.get("file")
        if not isinstance(name, str) or name not in wanted:
            raise _bad(f"outputs[{i}] names no output of the model", name)
        if name in seen:
            raise _bad(f"output {printable(name, MAX_FIELD)!r} is listed twice", None, False)
        if not isinstance(file, str) or not OUTPUT_FILE.match(file) or file in files:
            raise _bad(f"outputs[{i}]'s file is not a fresh out<k>.npy in the outputs folder", file)
        seen.add(name)
        files.add(file)
        entries.append({"name": name, "file": file})
    missing = [n for n in outputs if n not in seen]
    if missing:
        raise _bad(f"output {printable(missing[0], MAX_FIELD)!r} of the model is not in 'outputs'", None, False)
    return Answer(ok=True, error=None, session_ms=session_ms, warmup_ms=warmup_ms, run_ms=run_ms, outputs=entries)


def read_outputs(folder: pathlib.Path, answer: Answer, expected: Mapping[str, tuple[np.dtype | None, Sequence]],
                 cap: int = limits.INPUT_BYTES) -> dict[str, np.ndarray]:
    """The arrays the answer lists, each a regular file in `folder` whose .npy header is read and
    matched with `expected` (name -> (dtype or None, dims: an int fixes one, anything else is
    free)) before its data is; all together at most `cap` bytes."""
    arrays, total = {}, 0
    for entry in answer["outputs"]:
        name, shown = entry["name"], printable(entry["name"], MAX_FIELD)
        path = folder / entry["file"]
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError as e:
            raise HostAnswerError(f"output {shown!r}: its file {entry['file']} cannot be read "
                                  f"({e.strerror or e})") from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise HostAnswerError(f"output {shown!r}: {entry['file']} is not a regular file")
            try:
                version = np.lib.format.read_magic(f)
                header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                    else np.lib.format.read_array_header_2_0
                shape, _fortran, dtype = header(f)
            except (ValueError, OSError, EOFError) as e:
                raise HostAnswerError(f"output {shown!r}: {entry['file']} is not a .npy array "
                                      f"({printable(str(e), MAX_FIELD)})") from None
            want_dtype, want_dims = expected[name]
            if dtype.hasobject or (want_dtype is not None and dtype != want_dtype):
                raise HostAnswerError(f"output {shown!r} came back as {dtype}, the model's output is {want_dtype}")
            wrong_rank = want_dims is not None and len(shape) != len(want_dims)
            if wrong_rank or any(isinstance(w, int) and w != s for w, s in zip(want_dims or (), shape)):
                raise HostAnswerError(f"output {shown!r} came back with shape {list(shape)}, the model declares "
                                      f"{[w if isinstance(w, int) else '?' for w in want_dims or ()]}")
            nbytes = math.prod(shape) * dtype.itemsize
            total += nbytes
            if nbytes > info.st_size or total > cap:
                raise HostAnswerError(f"output {shown!r} declares {nbytes} bytes: more than its file holds or the "
                                      f"{cap / 2**30:.3g} GiB limit")
            try:
                f.seek(0)
                arrays[name] = np.lib.format.read_array(f, allow_pickle=False)
            except (ValueError, OSError, EOFError) as e:
                raise HostAnswerError(f"output {shown!r}: {entry['file']} is damaged "
                                      f"({printable(str(e), MAX_FIELD)})") from None
    return arrays


def read_profile(events: Any, rename: Callable[[str], str], file: str) -> list[dict[str, Any]]:
    """ORT's profile of a host run, parsed: a list of events, of which those with the fields dmlopt reads
    (cat and name as text, ts and dur finite numbers >= 0, op_name and provider as text) are kept, named
    by `rename`; anything else in the list is left out, and a file that is no list is a HostAnswerError."""
    if not isinstance(events, list):
        raise HostAnswerError(f"{file} is not a list of profile events")
    kept = []
    for e in events[:PROFILE_EVENTS]:
        if not (isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("cat"), str)
                and all(_plain_number(e.get(k, 0)) for k in ("dur", "ts"))):
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        kept.append({"cat": e["cat"][:40], "name": rename(e["name"][:400]), "dur": float(e.get("dur", 0)),
                     "ts": float(e.get("ts", 0)),
                     "args": {k: v[:MAX_FIELD] for k, v in args.items()
                              if k in ("op_name", "provider") and isinstance(v, str)}})
    return kept


def _plain_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
