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
