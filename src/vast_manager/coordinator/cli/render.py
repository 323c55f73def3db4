"""Plain-text rendering for the terminal: tables, numbers and times (host text through
``textsafe.clean``)."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
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


def until(ts: Any, now: float | None = None) -> str:
    """When something ends, as time left ("in 6.9d"); "-" when it never does."""
    if ts is None:
        return "-"
    seconds = float(ts) - (now if now is not None else time.time())
    if seconds <= 0:
        return "expired"
    if seconds < 5400:
        return f"in {max(seconds, 60) / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"in {seconds / 3600:.1f}h"
    return f"in {seconds / 86400:.1f}d"


def terminal_width() -> int | None:
    """The width tables must fit: ``COLUMNS`` when set, else the terminal's when stdout is
    one; None (no limit) when printing into a pipe or a file, where a script reads whole
    cells."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return None


#: A column is never narrowed below this many characters (or its heading's width).
MIN_CELL = 6


def _fit(widths: list[int], headers: Sequence[str], width: int,
         shrink: Sequence[str] = ()) -> list[int]:
    """Narrow the columns named in ``shrink`` first, in that order, then the widest, one
    character at a time, until the line fits ``width`` (or nothing can narrow further)."""
    widths = list(widths)
    floor = [max(MIN_CELL, len(h)) for h in headers]

    def over() -> int:
        return sum(widths) + 2 * (len(widths) - 1) - width

    for name in shrink:
        if name in headers and over() > 0:
            i = list(headers).index(name)
            widths[i] = max(floor[i], widths[i] - over())
    while over() > 0:
        shrinkable = [i for i, w in enumerate(widths) if w > floor[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _cut(cell: str, w: int) -> str:
    return cell if len(cell) <= w else cell[: max(0, w - 1)] + "~"


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], width: int | None = None,
          shrink: Sequence[str] = ()) -> str:
    """Left-aligned text table; every cell passes through ``clean``. With ``width``, the
    columns named in ``shrink`` and then the widest are narrowed to fit it, a cut cell
    ending in ``~``."""
    body = [[clean(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    if width is not None:
        widths = _fit(widths, headers, width, shrink)
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(_cut(c, w).ljust(w)
                               for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def wrap(text: str, width: int | None, indent: str = "") -> str:
    """``text`` folded to ``width`` (unchanged without one), later lines indented."""
    if width is None or len(text) <= width:
        return text
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False)
