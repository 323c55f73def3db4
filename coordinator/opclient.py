"""A small synchronous client of the operator API (DESIGN 3.7), for the CLI.

The CLI stays thin: it calls these functions and turns ``OperatorError`` into
a one-line message and an exit code.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

DEFAULT_URL = "http://127.0.0.1:8420"


class OperatorError(Exception):
    """The coordinator refused the request, or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class OperatorClient:
    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
    ) -> Any:
        if not self.token:
            raise OperatorError("VM_ADMIN_TOKEN is not set; the operator API needs it.")
        url = self.url + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                url += "?" + urllib.parse.urlencode(clean)
        data = orjson.dumps(body) if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                payload = orjson.loads(raw)
                message = str(payload.get("message") or payload.get("error"))
                code = payload.get("error")
            except (orjson.JSONDecodeError, AttributeError):
                message, code = f"HTTP {err.code}", None
            raise OperatorError(message, status=err.code, code=code) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise OperatorError(f"Cannot reach the coordinator at {self.url}: {reason}.") from None
        if not raw:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise OperatorError(f"The coordinator at {self.url} sent a non-JSON answer.") from None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
