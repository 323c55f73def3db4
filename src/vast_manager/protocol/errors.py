"""The one exception the protocol raises; it carries the wire error code."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A message that does not follow the contract.

    ``code`` is the snake_case error of docs/protocol.md (``malformed_json``,
    ``invalid_field``, ``unsupported_protocol``); ``field`` is the dotted path
    of the offending field where there is one.
    """

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def to_body(self) -> dict[str, str]:
        body = {"error": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body
