"""Type-checked conversion of decoded JSON into the message dataclasses.

Each dataclass gets one converter, built once from its type hints, and every
error names the dotted field path. That converter is the reference. The hot
path (``decoder``, used by ``vast_manager.protocol.codec``) runs a function generated from
the same hints with the checks inlined, and hands anything it does not accept
to the reference, so the errors are the reference's by construction.

Supported field types: ``int``, ``float`` (an int is accepted), ``str``,
``bool``, ``list[T]``, ``T | None``, ``Literal[...]`` of strings, and nested
message dataclasses. Fields with a default may be absent; unknown fields are
ignored (forward compatibility, DESIGN 3.6). Field metadata may set ``min``
(numbers) and ``max_len`` (strings and lists), and ``item_min`` / ``item_max_len``
for a list's items.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

from vast_manager.protocol.errors import ProtocolError

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


# --- fast path ---------------------------------------------------------------------------
#
# The converters above cost one closure call and one path string per field: about 25 us
# for a heartbeat, five times orjson's parse. For each dataclass, ``fast_builder`` instead
# generates (once) one plain function with every scalar check inlined and no paths at all.
# It can only accept and build, or give up by raising (``_Miss``, or any exception: a
# missing key is a KeyError). ``decoder`` then runs the reference converter from the top,
# so which field is reported first, and its code, message and path, cannot drift from the
# reference. The tests hold the two to the same accepted set and equal results.
#
# The generated source is built only from our own dataclass definitions: field names
# (written as string literals via repr), numbers from field metadata (repr of a checked
# int or finite float) and names we choose (``a0``, ``_k3``). Every other constant (the
# class, defaults, literal choices, nested builders) is passed in the function's globals.
# Nothing from a message ever reaches the source.


class _Miss(Exception):
    """The fast path does not accept the value; the reference converter will say why."""


_ABSENT = object()
_DECODERS: dict[type, Callable[[Any], Any]] = {}
_FAST: dict[type, Callable[[Any], Any]] = {}


def _float_list(value: list[Any], minimum: float | None) -> list[float]:
    """A fresh ``list[float]`` of ``value`` (ints become floats), checked in bulk."""
    kinds = list(map(type, value))  # exact types: bool, and float subclasses, are refused
    floats = kinds.count(float)
    if floats == len(kinds):
        out = value.copy()
    elif floats + kinds.count(int) == len(kinds):
        out = list(map(float, value))
    else:
        raise _Miss
    total = sum(out)
    # An inf or nan item makes the sum inf or nan, so a finite sum proves every item
    # finite; an infinite sum of finite items (overflow) is rare, so check those one by one.
    if total - total != 0.0 and not all(map(math.isfinite, out)):
        raise _Miss
    if minimum is not None and out and min(out) < minimum:
        raise _Miss
    return out


def _number(value: Any) -> str:
    """Source text for a metadata number (never from a message)."""
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)
    raise TypeError(f"unsupported metadata number {value!r}")


class _Source:
    """The source of one dataclass's builder, and the globals it runs with."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {"_Miss": _Miss, "_ABSENT": _ABSENT,
                                        "_float_list": _float_list, "_new": object.__new__}

    def line(self, indent: int, text: str) -> None:
        self.lines.append("    " * indent + text)

    def const(self, value: Any) -> str:
        name = f"_k{len(self.globals)}"
        self.globals[name] = value
        return name

    def check(self, tp: Any, meta: dict[str, Any], var: str, indent: int,
              nullable: bool = False) -> None:
        """Statements that check ``var`` as ``_converter_for(tp, meta)`` would (``None``
        too if ``nullable``), rebinding it to the converted value, or raise."""
        origin = get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            if len(args) != 1:
                raise TypeError(f"unsupported union {tp!r}")
            if get_origin(args[0]) is list or _is_dataclass(args[0]):
                self.line(indent, f"if {var} is not None:")
                self.check(args[0], meta, var, indent + 1)
            else:
                self.check(args[0], meta, var, indent, nullable=True)
            return
        if origin is list:
            (item_tp,) = get_args(tp)
            item_meta = {k[5:]: v for k, v in meta.items() if k.startswith("item_")}
            max_len = meta.get("max_len")
            too_long = "" if max_len is None else f" or len({var}) > {_number(max_len)}"
            self.line(indent, f"if type({var}) is not list{too_long}:")
            self.line(indent + 1, "raise _Miss")
            if item_tp is float:
                minimum = item_meta.get("min")
                bound = "None" if minimum is None else _number(minimum)
                self.line(indent, f"{var} = _float_list({var}, {bound})")
            elif _is_dataclass(item_tp):
                build = self.const(fast_builder(item_tp))
                self.line(indent, f"{var} = [{build}(x) for x in {var}]")
            else:
                item, out = f"{var}_i", f"{var}_o"  # unique per nesting level
                self.line(indent, f"{out} = []")
                self.line(indent, f"for {item} in {var}:")
                self.check(item_tp, item_meta, item, indent + 1)
                self.line(indent + 1, f"{out}.append({item})")
                self.line(indent, f"{var} = {out}")
            return
        if _is_dataclass(tp):
            self.line(indent, f"{var} = {self.const(fast_builder(tp))}({var})")
            return
        # A scalar: one test accepts the usual value as it is; the rest (None, an int
        # for a float) is handled under it, so the common case costs a single branch.
        minimum = meta.get("min")
        if origin is Literal:
            ok = f"type({var}) is str and {var} in {self.const(frozenset(get_args(tp)))}"
        elif tp is bool:
            ok = f"type({var}) is bool"
        elif tp is int:
            low = INT64_MIN if minimum is None else max(INT64_MIN, minimum)
            ok = f"type({var}) is int and {_number(low)} <= {var} <= {INT64_MAX}"
        elif tp is float:
            # x - x is 0.0 for a finite x, nan for inf or nan.
            ok = f"type({var}) is float and {var} - {var} == 0.0"
            if minimum is not None:
                ok += f" and {var} >= {_number(minimum)}"
        elif tp is str:
            max_len = meta.get("max_len", DEFAULT_MAX_STR_LEN)
            ok = f"type({var}) is str and len({var}) <= {_number(max_len)}"
        else:
            raise TypeError(f"unsupported field type {tp!r}")
        self.line(indent, f"if not ({ok}):")
        keyword = "if"
        if nullable:
            self.line(indent + 1, f"if {var} is None:")
            self.line(indent + 2, "pass")
            keyword = "elif"
        if tp is float:
            self.line(indent + 1, f"{keyword} type({var}) is int:")
            self.line(indent + 2, f"{var} = float({var})")
            if minimum is not None:
                self.line(indent + 2, f"if {var} < {_number(minimum)}:")
                self.line(indent + 3, "raise _Miss")
            keyword = "elif"
        if keyword == "if":
            self.line(indent + 1, "raise _Miss")
        else:
            self.line(indent + 1, "else:")
            self.line(indent + 2, "raise _Miss")


def _is_dataclass(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp) and isinstance(tp, type)


def fast_builder(cls: type[T]) -> Callable[[Any], T]:
    """Return (generating once) the fast builder of ``cls`` from a parsed JSON value.

    It raises on anything it does not accept, without a useful error: use ``decoder``,
    which falls back to the reference converter. Exposed for the tests and the bench.
    """
    cached = _FAST.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    src = _Source()
    src.line(0, "def build(d):")
    src.line(1, "if type(d) is not dict:")
    src.line(2, "raise _Miss")
    args: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if not f.init or not f.name.isidentifier():
            raise TypeError(f"unsupported field {cls.__name__}.{f.name}")
        var = f"a{i}"
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            src.line(1, f"{var} = d[{f.name!r}]")  # absent: KeyError, a miss like any other
            src.check(hints[f.name], dict(f.metadata), var, 1)
        else:
            # Absent: pass what the dataclass would have used, as if not passed at all.
            src.line(1, f"{var} = d.get({f.name!r}, _ABSENT)")
            src.line(1, f"if {var} is _ABSENT:")
            if f.default is not dataclasses.MISSING:
                src.line(2, f"{var} = {src.const(f.default)}")
            else:
                src.line(2, f"{var} = {src.const(f.default_factory)}()")
            src.line(1, "else:")
            src.check(hints[f.name], dict(f.metadata), var, 2)
        args.append(f"{f.name}={var}" if f.kw_only else var)
    if type(cls) is type and cls.__new__ is object.__new__:
        # Exactly what cls(...) does for a plain class (object.__new__, then __init__),
        # without type.__call__'s overhead: about a fifth of building a GpuTelemetry.
        src.line(1, f"obj = _new({src.const(cls)})")
        src.line(1, f"{src.const(cls.__init__)}(obj, {', '.join(args)})")
    else:
        src.line(1, f"obj = {src.const(cls)}({', '.join(args)})")
    check = getattr(cls, "_check", None)
    if check is not None:
        # The prefix only shapes the error, and any error is redone by the reference.
        src.line(1, f"{src.const(check)}(obj, '')")
    src.line(1, "return obj")
    # exec: see the comment above _Miss for why, and what the source is made of.
    exec(compile("\n".join(src.lines), f"<fast_builder {cls.__qualname__}>", "exec"),
         src.globals)
    built: Callable[[Any], T] = src.globals["build"]
    _FAST[cls] = built
    return built


def decoder(cls: type[T]) -> Callable[[Any], T]:
    """Return (building once) the checked builder of ``cls`` from a parsed JSON value:
    the fast builder, and the reference converter whenever that one gives up."""
    cached = _DECODERS.get(cls)
    if cached is not None:
        return cached
    fast = fast_builder(cls)
    reference = converter(cls)

    def decode_value(value: Any) -> T:
        try:
            return fast(value)
        except Exception:  # whatever the fast path refused: the reference names the error
            pass
        return reference(value, "")

    _DECODERS[cls] = decode_value
    return decode_value
