"""Plain-text tables for the `strata` commands (models, ps, plan): columns sized to their widest cell.

Public surface: `table(rows, columns) -> str`, `size_text(n_bytes) -> str`.
"""
from __future__ import annotations


def size_text(n_bytes) -> str:
    if not isinstance(n_bytes, (int, float)) or n_bytes <= 0:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{int(n_bytes)} B"


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """`columns`: (key, heading) pairs; a missing or None cell shows as "-"."""
    cells = [[heading for _, heading in columns]] + \
        [["-" if r.get(k) is None else str(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)
