"""What the two settings tables share: bounds in the row, one check, one docs table.

Both tables (the coordinator's ``coordinator/settings.py`` and the agent's
``agent/config.py``) build their rows on ``Bounds``: the keyword fields ``at_least``,
``above`` (exclusive), ``at_most``, ``below`` (exclusive) and ``choices``. ``check`` refuses a
value outside them with one sentence naming the variable; ``describe`` says the same
bounds in the docs (docs/operations.md, docs/architecture.md, ``vast-agent run
--help``), so what is refused and what is documented cannot drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """A row's bounds, given by keyword after its own positional fields (None: no such
    bound); ``above`` and ``below`` exclude the bound itself."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    choices: tuple[str, ...] | None = None


class Row(Protocol):
    """A settings row: its variable, default (None: unset), help, and ``Bounds``."""

    @property
    def env(self) -> str: ...
    @property
    def default(self) -> Any: ...
    @property
    def help(self) -> str: ...
    @property
    def at_least(self) -> float | None: ...
    @property
    def above(self) -> float | None: ...
    @property
    def at_most(self) -> float | None: ...
    @property
    def below(self) -> float | None: ...
    @property
    def choices(self) -> tuple[str, ...] | None: ...


def _number(value: float) -> str:
    """1 for 1 and 1.0, 0.5 for 0.5: bounds as a person writes them."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def describe(row: Row) -> str:
    """The bounds in words ("at least 1", "between 0 and 1000", "one of text, json"), or ""."""
    if row.choices is not None:
        return "one of " + ", ".join(row.choices)
    if row.at_least is not None and row.at_most is not None:
        return f"between {_number(row.at_least)} and {_number(row.at_most)}"
    parts = []
    if row.at_least is not None:
        parts.append(f"at least {_number(row.at_least)}")
    elif row.above is not None:
        parts.append(f"greater than {_number(row.above)}")
    if row.at_most is not None:
        parts.append(f"at most {_number(row.at_most)}")
    elif row.below is not None:
        parts.append(f"less than {_number(row.below)}")
    return " and ".join(parts)


def check(
    row: Row, value: object, error: type[ValueError] = ValueError
) -> None:
    """Raise ``error`` naming the variable when ``value`` (parsed) is out of ``row``'s
    bounds. NaN is no number for any setting."""
    if isinstance(value, float) and math.isnan(value):
        raise error(f"{row.env} must be a number, got {value!r}")
    if row.choices is not None:
        inside = value in row.choices
    elif isinstance(value, int | float) and not isinstance(value, bool):
        inside = not (
            (row.at_least is not None and value < row.at_least)
            or (row.above is not None and value <= row.above)
            or (row.at_most is not None and value > row.at_most)
            or (row.below is not None and value >= row.below)
        )
    else:
        inside = True  # bounds are for numbers and choices
    if not inside:
        raise error(f"{row.env} must be {describe(row)}, got {value!r}")


def markdown(rows: Iterable[Row]) -> str:
    """The docs' table of ``rows``: variable, default, allowed values, meaning."""
    lines = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for row in rows:
        default = "unset" if row.default is None else f"`{row.default}`"
        lines.append(f"| `{row.env}` | {default} | {describe(row)} | {row.help} |")
    return "\n".join(lines)
