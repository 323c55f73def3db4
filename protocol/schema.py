"""Type-checked conversion of decoded JSON into the message dataclasses.

Each dataclass gets one converter, built once from its type hints, so decoding
a heartbeat is a handful of dict lookups and isinstance checks: fast enough
for the coordinator's hot path, and every error names the dotted field path.

Supported field types: ``int``, ``float`` (an int is accepted), ``str``,
``bool``, ``list[T]``, ``T | None``, ``Literal[...]`` of strings, and nested
message dataclasses. Fields with a default may be absent; unknown fields are
ignored (forward compatibility, DESIGN 3.6). Field metadata may set ``min``
(numbers) and ``max_len`` (strings and lists).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

from protocol.errors import ProtocolError

T = TypeVar("T")
Converter = Callable[[Any, str], Any]

# Strings from hosts are untrusted; nothing in the contract needs more.
DEFAULT_MAX_STR_LEN = 65536

_CONVERTERS: dict[type, Converter] = {}


def _bad(path: str, expected: str, value: Any) -> ProtocolError:
    got = "null" if value is None else type(value).__name__
    if isinstance(value, bool):
        got = "boolean"
    return ProtocolError("invalid_field", f"Field '{path}' must be {expected}, got {got}.", path)


# Integers are stored as SQLite INTEGER (signed 64 bits); JSON allows any size.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _int_conv(meta: dict[str, Any]) -> Converter:
    minimum = meta.get("min")

    def conv(value: Any, path: str) -> int:
        if type(value) is not int:
            raise _bad(path, "an integer", value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' is outside the signed 64-bit range.", path
            )
        if minimum is not None and value < minimum:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' must be at least {minimum}.", path
            )
        return value

    return conv


def _float_conv(meta: dict[str, Any]) -> Converter:
    minimum = meta.get("min")

    def conv(value: Any, path: str) -> float:
        if type(value) is float:
            out = value
        elif type(value) is int:
            out = float(value)
        else:
            raise _bad(path, "a number", value)
        if not math.isfinite(out):
            raise ProtocolError("invalid_field", f"Field '{path}' must be finite.", path)
        if minimum is not None and out < minimum:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' must be at least {minimum}.", path
            )
        return out

    return conv


def _str_conv(meta: dict[str, Any]) -> Converter:
    max_len = meta.get("max_len", DEFAULT_MAX_STR_LEN)

    def conv(value: Any, path: str) -> str:
        if type(value) is not str:
            raise _bad(path, "a string", value)
        if len(value) > max_len:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' is longer than {max_len} characters.", path
            )
        return value

    return conv


def _bool_conv(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise _bad(path, "a boolean", value)
    return value


def _literal_conv(choices: tuple[str, ...]) -> Converter:
    allowed = frozenset(choices)
    listed = ", ".join(choices)

    def conv(value: Any, path: str) -> str:
        if type(value) is not str or value not in allowed:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' must be one of: {listed}.", path
            )
        return value

    return conv


def _optional_conv(inner: Converter) -> Converter:
    def conv(value: Any, path: str) -> Any:
        if value is None:
            return None
        return inner(value, path)

    return conv


def _list_conv(inner: Converter, meta: dict[str, Any]) -> Converter:
    max_len = meta.get("max_len")

    def conv(value: Any, path: str) -> list[Any]:
        if type(value) is not list:
            raise _bad(path, "a list", value)
        if max_len is not None and len(value) > max_len:
            raise ProtocolError(
                "invalid_field", f"Field '{path}' holds more than {max_len} items.", path
            )
        try:
            # Fast path: no per-item path string (a telemetry list holds hundreds of numbers).
            return [inner(item, path) for item in value]
        except ProtocolError:
            pass
        # Redo it naming the bad item's index: the error is the same, its path exact.
        return [inner(item, f"{path}[{i}]") for i, item in enumerate(value)]

    return conv


def _float_list_conv(item_meta: dict[str, Any], meta: dict[str, Any]) -> Converter:
    """``list[float]``: checked in bulk (telemetry carries one number per CPU core, and a
    benchmark one per proof); any doubt falls back to the item-by-item converter, so
    errors still name the exact item."""
    minimum = item_meta.get("min")
    slow = _list_conv(_float_conv(item_meta), meta)
    max_len = meta.get("max_len")

    def conv(value: Any, path: str) -> list[float]:
        if type(value) is list and (max_len is None or len(value) <= max_len):
            kinds = set(map(type, value))
            if kinds <= _FLOAT_KINDS:
                out = value if int not in kinds else [float(v) for v in value]
                if all(map(math.isfinite, out)) and (
                    minimum is None or not out or min(out) >= minimum
                ):
                    return out if out is not value else list(value)
        return slow(value, path)

    return conv


_FLOAT_KINDS = frozenset({float, int})


def _converter_for(tp: Any, meta: dict[str, Any]) -> Converter:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return _optional_conv(_converter_for(args[0], meta))
    if origin is list:
        (item_tp,) = get_args(tp)
        item_meta = {k[5:]: v for k, v in meta.items() if k.startswith("item_")}
        if item_tp is float:
            return _float_list_conv(item_meta, meta)
        return _list_conv(_converter_for(item_tp, item_meta), meta)
    if origin is Literal:
        return _literal_conv(tuple(get_args(tp)))
    if tp is bool:
        return _bool_conv
    if tp is int:
        return _int_conv(meta)
    if tp is float:
        return _float_conv(meta)
    if tp is str:
        return _str_conv(meta)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return converter(tp)
    raise TypeError(f"unsupported field type {tp!r}")


def converter(cls: type[T]) -> Callable[[Any, str], T]:
    """Return (building once) the converter from a JSON object to ``cls``."""
    cached = _CONVERTERS.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    specs: list[tuple[str, Converter, bool]] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        specs.append((f.name, _converter_for(hints[f.name], dict(f.metadata)), has_default))
    check = getattr(cls, "_check", None)

    def conv(value: Any, path: str) -> T:
        if type(value) is not dict:
            raise _bad(path or "body", "an object", value)
        kwargs: dict[str, Any] = {}
        prefix = f"{path}." if path else ""
        for name, field_conv, optional in specs:
            if name in value:
                kwargs[name] = field_conv(value[name], prefix + name)
            elif not optional:
                raise ProtocolError(
                    "invalid_field", f"Field '{prefix}{name}' is missing.", prefix + name
                )
        obj = cls(**kwargs)
        if check is not None:
            check(obj, prefix)
        return obj

    _CONVERTERS[cls] = conv
    return conv
