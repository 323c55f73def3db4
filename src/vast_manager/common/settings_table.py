"""What the two settings declarations share: rows read off one msgspec ``Struct``, one
check, one docs table.

Each setting is declared once, as a field of a ``msgspec.Struct`` (the coordinator's
``Settings`` in ``coordinator/settings.py``, the agent's ``AgentConfig`` in
``agent/config.py``): its name, its type, its default, and a ``msgspec.Meta`` holding the
help text (``description``) and the bounds (``ge``, ``gt``, ``le``, ``lt``; a ``Literal``
type gives the choices). ``declared`` reads those fields into ``Declared`` rows; everything
else (the environment parsing, ``check``, the docs tables, ``--help``) works from the rows,
so what is refused, what is documented and what the program runs with cannot drift apart.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec


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


def shown_default(row: Row) -> str | None:
    """The default as the docs show it (None: unset); ``Meta(extra={"shown": ...})`` names
    a default whose value is None but has a word of its own (``auto``)."""
    shown = getattr(row, "extra", {}).get("shown")
    if shown is not None:
        return str(shown)
    return None if row.default in (None, "") else str(row.default)


def markdown(rows: Iterable[Row]) -> str:
    """The docs' table of ``rows``: variable, default, allowed values, meaning."""
    lines = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for row in rows:
        shown = shown_default(row)
        default = "unset" if shown is None else f"`{shown}`"
        lines.append(f"| `{row.env}` | {default} | {describe(row)} | {row.help} |")
    return "\n".join(lines)


def default_text(row: Row) -> str:
    """`` [default: X]`` for a help line ("" when unset)."""
    shown = shown_default(row)
    return f" [default: {shown}]" if shown is not None else ""


def help_text(rows: Iterable[Row]) -> str:
    """The rows as plain text, one line each, for a command's ``--help``."""
    lines = []
    for row in rows:
        allowed = describe(row)
        allowed = f" ({allowed})" if allowed else ""
        lines.append(f"{row.env}: {row.help}{allowed}{default_text(row)}")
    return "\n".join(lines)


# --- reading a declaration ---------------------------------------------------------------

_META_BOUNDS = {"ge": "at_least", "gt": "above", "le": "at_most", "lt": "below"}


@dataclass(frozen=True, kw_only=True)
class Declared(Bounds):
    """One setting as its ``Struct`` field declares it."""

    name: str  # the field
    env: str  # the environment variable
    default: Any  # None: unset, with the meaning the help text gives
    help: str
    kind: type  # what the text parses to: int, float, str or bool
    optional: bool  # None is a value of the field
    extra: Mapping[str, Any] = field(default_factory=dict)  # ``Meta(extra=...)``

    @property
    def parse_type(self) -> type:
        return self.kind


def _unwrap(tp: Any, metas: list[msgspec.Meta]) -> tuple[Any, bool]:
    """The field's base type and whether None is allowed, collecting its ``Meta``s."""
    optional = False
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            metas.extend(m for m in tp.__metadata__ if isinstance(m, msgspec.Meta))
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            members = [m for m in typing.get_args(tp) if m is not type(None)]
            optional = True
            if len(members) != 1:
                raise TypeError(f"a setting has one type besides None, not {tp!r}")
            tp = members[0]
        else:
            return tp, optional


def declared(
    struct: type[msgspec.Struct],
    env_of: Callable[[str, Mapping[str, Any]], str],
    skip: Iterable[str] = (),
) -> tuple[Declared, ...]:
    """The rows of ``struct``'s fields, in their order, less ``skip`` (resolved fields that
    are no settings). ``env_of(name, extra)`` names each field's environment variable."""
    hints = typing.get_type_hints(struct, include_extras=True)
    skipped = set(skip)
    rows = []
    for info in msgspec.structs.fields(struct):
        if info.name in skipped:
            continue
        metas: list[msgspec.Meta] = []
        tp, optional = _unwrap(hints[info.name], metas)
        bounds: dict[str, Any] = {}
        help_text, extra = "", dict[str, Any]()
        for meta in metas:
            for key, word in _META_BOUNDS.items():
                if getattr(meta, key) is not None:
                    bounds[word] = getattr(meta, key)
            help_text = meta.description or help_text
            extra = {**extra, **(meta.extra or {})}
        if typing.get_origin(tp) is Literal:
            bounds["choices"] = tuple(typing.get_args(tp))
            tp = str
        default = None if info.default is msgspec.NODEFAULT else info.default
        rows.append(Declared(
            name=info.name, env=env_of(info.name, extra), default=default, help=help_text,
            kind=tp, optional=optional, extra=extra, **bounds,
        ))
    return tuple(rows)
