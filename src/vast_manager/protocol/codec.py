"""The codec of the message dataclasses: orjson encodes, msgspec decodes and checks
(``vast_manager.protocol.schema``)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson

from vast_manager.protocol import schema
from vast_manager.protocol.errors import ProtocolError

T = TypeVar("T")


def encode(obj: Any) -> bytes:
    """Encode a message (dataclass, dict or list of them) as UTF-8 JSON bytes."""
    return orjson.dumps(obj)


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
