"""JSON into the message Structs, checked by msgspec against their types.

The Structs of ``vast_manager.protocol.messages`` carry their constraints in their
annotations (``Annotated`` with ``msgspec.Meta``); msgspec parses a body straight into
them (``decode``), or checks an already parsed value (``convert``). What it accepts is
what the contract says (docs/protocol.md): an int where a float is due, never a bool
for a number, literal enums, integers within signed 64 bits, finite floats, bounded
strings and lists, nested messages, fields with a default may be absent, unknown fields
are ignored. A message's own rule (``_check``: the Hello's protocol version, a scaling
result's fields) runs on the decoded message.

Every refusal is a ``ProtocolError``: ``malformed_json`` for a body that is not JSON
(or nests deeper than the parser goes), else ``invalid_field`` (or the rule's own code)
with the dotted path of the field (``telemetry.gpus[0].index``) and one sentence.
msgspec's own error texts are turned into the contract's words here, in one place.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import msgspec

from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.messages import FLOAT_MAX, INT64_MAX, INT64_MIN

T = TypeVar("T")

_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def decode(cls: type[T], data: bytes | str) -> T:
    """Parse and check ``data`` as a ``cls`` message; ``ProtocolError`` names the field."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
    try:
        message = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _invalid(cls, str(exc)) from None
    except (msgspec.DecodeError, UnicodeError) as exc:
        raise ProtocolError("malformed_json", f"The body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise ProtocolError("malformed_json", "The body nests too deeply.") from None
    return _checked(message)


def convert(cls: type[T], value: Any) -> T:
    """Check an already parsed JSON value as a ``cls`` message, like ``decode``."""
    try:
        message = msgspec.convert(value, cls)
    except msgspec.ValidationError as exc:
        raise _invalid(cls, str(exc)) from None
    except RecursionError:
        raise ProtocolError("invalid_field", "Field 'body' nests too deeply.", "body") from None
    return _checked(message)


def _checked(message: T) -> T:
    check = getattr(message, "_check", None)
    if check is not None:
        check("")
    return message


# --- msgspec's errors in the contract's words --------------------------------------------

# "<what> - at `$.a.b[0]`"; a refusal of the whole body has no path.
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_TYPE = re.compile(r"^Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`$")
_BOUND = re.compile(r"^Expected `(?P<want>int|float)` (?P<op>>=|<=) (?P<bound>\S+)$")
_LENGTH = re.compile(r"^Expected `(?P<want>str|array)` of length <= (?P<n>\d+)$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")

_WANTED = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean",
           "array": "a list", "object": "an object"}
# What the body held, named as the Python value it parses to ("got dict", "got boolean").
_GOT = {"bool": "boolean", "null": "null", "array": "list", "object": "dict"}


def _invalid(cls: type, text: str) -> ProtocolError:
    match = _AT.match(text)
    what, path = (match["what"], match["path"] or "") if match else (text, "")
    path = path.removeprefix(".")
    if missing := _MISSING.match(what):
        name = f"{path}.{missing['name']}" if path else missing["name"]
        return _field(name, "is missing")
    field = path or "body"
    if typed := _TYPE.match(what):
        want = typed["want"].removesuffix(" | null")
        got = _GOT.get(typed["got"], typed["got"])
        return _field(field, f"must be {_WANTED.get(want, want)}, got {got}")
    if bound := _BOUND.match(what):
        limit = int(bound["bound"]) if bound["want"] == "int" else float(bound["bound"])
        if bound["want"] == "int" and limit in (INT64_MIN, INT64_MAX):
            return _field(field, "is outside the signed 64-bit range")
        if bound["want"] == "float" and abs(limit) == FLOAT_MAX:
            return _field(field, "must be finite")
        least = "at least" if bound["op"] == ">=" else "at most"
        return _field(field, f"must be {least} {limit:g}")
    if length := _LENGTH.match(what):
        if length["want"] == "str":
            return _field(field, f"is longer than {length['n']} characters")
        return _field(field, f"holds more than {length['n']} items")
    if what.startswith("Invalid enum value"):
        choices = _literal_at(cls, path)
        listed = f" one of: {', '.join(choices)}" if choices else " one of its listed values"
        return _field(field, "must be" + listed)
    if what == "Number out of range":
        return _field(field, "is a number out of range")
    return _field(field, f"is invalid ({what.rstrip('.')})")


def _field(path: str, says: str) -> ProtocolError:
    return ProtocolError("invalid_field", f"Field '{path}' {says}.", path)


def _literal_at(cls: Any, path: str) -> tuple[str, ...]:
    """The choices of the ``Literal`` field at ``path`` in ``cls`` (empty if none there)."""
    tp: Any = cls
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        tp = _bare(tp)
        if part.startswith("["):
            if get_origin(tp) is not list:
                return ()
            (tp,) = get_args(tp)
        else:
            hints = typing.get_type_hints(tp, include_extras=True) if isinstance(tp, type) else {}
            if part not in hints:
                return ()
            tp = hints[part]
    tp = _bare(tp)
    return tuple(get_args(tp)) if get_origin(tp) is Literal else ()


def _bare(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``| None``."""
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
            continue
        args = [a for a in get_args(tp) if a is not type(None)]
        if get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
            tp = args[0]
            continue
        return tp
