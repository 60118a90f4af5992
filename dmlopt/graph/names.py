"""Unused names for the values and nodes validate's float16-rounding copy adds: `numbered_name(taken, base)`.

Why here: validate (below the passes) needs names that no value of the model already has.  The
suffix restarts per base and starts at 2 (``x``, ``x_2``, ``x_3``).  The passes take theirs from
`DmlPass.fresh` (passes/_base.fresh_names), whose one counter runs across every base from 1
(``x_1``, then ``y_2``): the two number differently, and each keeps its own so that the names
either gives stay as they were.
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
