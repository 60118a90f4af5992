"""Errors that the command turns into one line on stderr and an exit code.

Exit codes (stable, documented in the README): 0 ok, 1 a check failed (numerics),
2 bad input or usage.  Anything else escaping is a bug in dmlopt.
"""

from __future__ import annotations


class DmlOptError(Exception):
    """Base class: an error the user can act on, shown as one line."""

    exit_code = 2


class UsageError(DmlOptError):
    """Bad command-line or API arguments (unknown pass, malformed --shape, ...)."""

    exit_code = 2


class InputError(DmlOptError):
    """The input model cannot be read or is not a valid ONNX model."""

    exit_code = 2


class OutputError(DmlOptError):
    """The output cannot be written (unwritable path, would overwrite the input)."""

    exit_code = 2


class ProviderError(DmlOptError):
    """An execution provider was asked for but is not available here."""

    exit_code = 2


class CheckFailed(DmlOptError):
    """A numerics check failed; the output was not written."""

    exit_code = 1


# Longest text from a model (a name, a sentence holding names) that a table or line shows; the
# rest is cut and its length said.  A 2 MB name must not pad every row of a table (318 MB).
TEXT_WIDTH = 300
# Widest cell of a table (dmlopt.io.tables.format_table): every row is padded to the widest.
CELL_WIDTH = 100
# Longest error line (`dmlopt: error: ...`).
LINE_WIDTH = 1000


def printable(text: str, width: int | None = None) -> str:
    """`text` with control codes, newlines and other unprintable characters written as escapes
    (``\\x1b``, ``\\n``, ``\\u202e``): a tensor name or a damaged file's bytes must not move the
    cursor, recolour the terminal or forge a line of dmlopt's output.  `width`: at most that many
    characters, the cut said (``...(N chars)``).  The one escaping of everything dmlopt prints."""
    if width is None:
        return _escaped(text)
    head = _escaped(text[:width + 1])  # escaping never shortens: enough to know whether it fits
    if len(text) <= width and len(head) <= width:
        return head
    tail = f"...({len(text)} chars)"
    return head[:max(width - len(tail), 1)] + tail


def _escaped(text: str) -> str:
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif c in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c])
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
    return "".join(out)


def printable_tree(obj, width: int = TEXT_WIDTH):
    """`obj` (dicts, lists, strings: a JSON-ready description) with every string, keys
    included, made printable and cut to `width`: for tables built from names a model file chose."""
    if isinstance(obj, str):
        return printable(obj, width)
    if isinstance(obj, dict):
        return {printable_tree(k, width): printable_tree(v, width) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [printable_tree(v, width) for v in obj]
    return obj
