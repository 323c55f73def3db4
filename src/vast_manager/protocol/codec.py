"""The codec of the messages: orjson encodes, msgspec decodes and checks
(``vast_manager.protocol.schema``)."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import orjson

from vast_manager.protocol import schema
from vast_manager.protocol.errors import ProtocolError

T = TypeVar("T")

#: What orjson cannot encode itself: a message (a ``msgspec.Struct``), as its fields in
#: declaration order, shallow (orjson comes back here for each Struct inside). orjson,
#: not msgspec's encoder, writes the bytes: they are the ones the wire always carried
#: (msgspec writes ``1e20`` where orjson writes ``1e+20``; tests/protocol/test_wire_bytes.py).
struct_fields = msgspec.structs.asdict


def encode(obj: Any) -> bytes:
    """Encode a message (a Struct, or a dict or list holding them) as UTF-8 JSON bytes."""
    return orjson.dumps(obj, default=struct_fields)


def parse_json(data: bytes | str) -> Any:
    """Parse JSON, turning a parse failure into ``malformed_json``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("malformed_json", f"The body is not valid JSON: {exc}.") from None


def from_obj(cls: type[T], obj: Any) -> T:
    """Check an already parsed JSON value against ``cls`` and build it."""
    return schema.convert(cls, obj)


def decode(cls: type[T], data: bytes | str) -> T:
    """Parse and type-check ``data`` as a ``cls`` message.

    Raises ``ProtocolError`` naming the first bad field.
    """
    return schema.decode(cls, data)
