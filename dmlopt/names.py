"""Unused names for values and nodes a rewrite adds: `numbered_name(taken, base)`.

Why: fp16 (its casts) and validate (the float16-rounding copy) each need names that no value of
the model already has; one helper keeps them the same.  The suffix restarts per base and starts
at 2 (``x``, ``x_2``, ``x_3``), unlike passes/_shared.fresh_names, whose one counter runs across
every base from 1 (``x_1``, then ``y_2``): the two number differently, so each keeps its own.
"""

from __future__ import annotations


def numbered_name(taken: set[str], base: str) -> str:
    """The first of `base`, `base`_2, `base`_3... not in `taken`; it is added to `taken`."""
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
