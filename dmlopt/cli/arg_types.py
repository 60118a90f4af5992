"""Types for the command line's numeric options: each value is checked when it is parsed.

Why: a value argparse accepts as an int or float can still be one the work cannot use (a
negative seed, a NaN tolerance, zero timed runs), and was found only after models were
loaded, rewritten and written.  These raise argparse's own error instead, so the parser
refuses it (exit 2, one line) before any work.
"""

from __future__ import annotations

import argparse
import math

SEED_MAX = 2**32 - 1  # numpy's legacy seeding range; default_rng takes any non-negative int


def integer(minimum: int, maximum: int | None = None):
    """An int option of at least `minimum` (and at most `maximum`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: it must be {bound}")
        return value

    parse.__name__ = "integer"
    return parse


def tolerance(text: str) -> float:
    """A finite, non-negative float (atol, rtol): NaN or infinity would pass or fail everything."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return value


def checked(kind):
    """The checked parser for a pass option declared with `kind` (int: >= 0, float: a tolerance)."""
    if kind is int:
        return integer(0)
    if kind is float:
        return tolerance
    return kind
