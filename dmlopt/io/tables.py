"""Plain-text tables for the CLI, reports and benchmarks: one formatter, in the ground layer, so
that every layer prints its tables the same way without importing a layer above."""

from __future__ import annotations

from dmlopt.errors import CELL_WIDTH, printable


def format_table(rows: list[tuple]) -> str:
    """Rows of cells as aligned columns, the first row a header.  Every cell is escaped and cut to
    CELL_WIDTH (errors.printable): a name from a model can neither forge a line nor, by its
    length, pad every row."""
    rows = [tuple(printable(str(c), CELL_WIDTH) for c in row) for row in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
