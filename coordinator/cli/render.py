"""Plain-text rendering for the terminal: tables, numbers and times (host text through
``textsafe.clean``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from vast_manager.coordinator.textsafe import clean


def num(value: Any, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    try:
        return f"{float(value):.{digits}f}{suffix}"
    except (TypeError, ValueError):
        return clean(value)


def usd(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"${float(value):.{digits}f}"


def ago(ts: Any, now: float | None = None) -> str:
    if ts is None:
        return "never"
    seconds = (now if now is not None else time.time()) - float(ts)
    if seconds < 0:
        seconds = 0
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    """Left-aligned text table; every cell passes through ``clean``."""
    body = [[clean(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)
