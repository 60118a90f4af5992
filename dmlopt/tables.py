"""Plain-text tables for the CLI, reports and benchmarks: one formatter, in the ground layer, so
that every layer prints its tables the same way without importing a layer above."""

from __future__ import annotations


def format_table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
