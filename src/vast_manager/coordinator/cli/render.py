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


#: Providers whose instances run the simulated cuzk: the local fleet, and the fake vast.ai
#: of ``serve --provider fake`` (whose dollars are simulated too).
SIMULATED_PROVIDERS = {"local": "local provider", "fake": "fake vast.ai"}


def simulated(row: dict[str, Any]) -> str | None:
    """Where an instance's simulated numbers come from, or None for a real one."""
    return SIMULATED_PROVIDERS.get(str(row.get("provider")))


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


def _fit(widths: list[int], headers: Sequence[str], width: int, shrink: Sequence[str] = (),
         drop: Sequence[str] = (), keep: Sequence[str] = ()) -> tuple[list[int], list[str]]:
    """The columns' priorities, lowest first, until the line fits ``width``: narrow those
    named in ``shrink`` (in that order); failing that, leave out the fewest of ``drop``
    (in that order) that makes it fit; failing that too, narrow the widest of the others
    one character at a time, the columns in ``keep`` last of all. Returns the widths (0:
    left out) and the headings left out."""
    names = list(headers)
    floor = [max(MIN_CELL, len(h)) for h in headers]

    def over(ws: list[int]) -> int:
        shown = [w for w in ws if w > 0]
        return sum(shown) + 2 * (len(shown) - 1) - width

    def narrowed(ws: list[int]) -> list[int]:
        ws = list(ws)
        for name in shrink:
            if name in names and ws[names.index(name)] > 0 and over(ws) > 0:
                i = names.index(name)
                ws[i] = max(floor[i], ws[i] - over(ws))
        return ws

    droppable = [name for name in drop if name in names]
    for k in range(len(droppable) + 1):
        ws = [0 if name in droppable[:k] else w for name, w in zip(names, widths, strict=True)]
        ws = narrowed(ws)
        if over(ws) <= 0 or k == len(droppable):
            break
    dropped = droppable[:k]
    for last in (False, True):
        while over(ws) > 0:
            shrinkable = [i for i, w in enumerate(ws)
                          if w > floor[i] and (last or names[i] not in keep)]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: ws[i])
            ws[widest] -= 1
    return ws, dropped


def _cut(cell: str, w: int) -> str:
    return cell if len(cell) <= w else cell[: max(0, w - 1)] + "~"


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], width: int | None = None,
          shrink: Sequence[str] = (), drop: Sequence[str] = (),
          keep: Sequence[str] = ()) -> str:
    """Left-aligned text table; every cell passes through ``clean``. With ``width``, the
    columns give way by priority (``_fit``): ``shrink`` narrowed first, ``drop`` left out
    next (a last line names them), then the widest, ``keep`` last; a cut cell ends in
    ``~``."""
    body = [[clean(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in body:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    dropped: list[str] = []
    if width is not None:
        widths, dropped = _fit(widths, headers, width, shrink, drop, keep)
    shown = [i for i, w in enumerate(widths) if w > 0]
    lines = ["  ".join(headers[i].ljust(widths[i]) for i in shown).rstrip()]
    lines.append("  ".join("-" * widths[i] for i in shown))
    for row in body:
        lines.append("  ".join(_cut(row[i], widths[i]).ljust(widths[i]) for i in shown).rstrip())
    if dropped:
        lines.append(wrap(f"(left out at {width} columns: {', '.join(dropped)}; a wider "
                          "terminal or --json shows them)", width))
    return "\n".join(lines)


def wrap(text: str, width: int | None, indent: str = "") -> str:
    """``text`` folded to ``width`` (unchanged without one), later lines indented."""
    if width is None or len(text) <= width:
        return text
    return textwrap.fill(text, width, subsequent_indent=indent, break_on_hyphens=False)
