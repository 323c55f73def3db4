"""A small synchronous client of the operator API (DESIGN 3.7), for the CLI.

The CLI stays thin: it calls these functions and turns ``OperatorError`` into
a one-line message and an exit code.
"""

from __future__ import annotations

import http.client
import urllib.parse
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
        """The decoded JSON answer (None for an empty one); OperatorError otherwise."""
        raw = self.request_raw(method, path, body, query)
        if not raw:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise OperatorError(f"The coordinator at {self.url} sent a non-JSON answer.") from None

    def request_raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        *,
        data: bytes | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        """The answer's bytes as the coordinator sent them (a 2xx); OperatorError otherwise.
        ``data``: a body sent as it is (``content_type``), instead of ``body`` as JSON."""
        if not self.token:
            raise OperatorError("VM_ADMIN_TOKEN is not set; the operator API needs it.")
        target = urllib.parse.urlsplit(self.url)
        try:
            port = target.port
        except ValueError:
            port = -1
        if target.scheme not in ("http", "https") or not target.hostname or port == -1:
            raise OperatorError(f"The coordinator URL {self.url!r} is not an http(s) URL.")
        # http.client, not urllib.request: that was the CLI's costliest import, and
        # `vast-manager status` is run by hand and by scripts alike.
        path = target.path.rstrip("/") + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                path += "?" + urllib.parse.urlencode(clean)
        if data is None and body is not None:
            data = orjson.dumps(body)
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        connection_class = (http.client.HTTPSConnection if target.scheme == "https"
                            else http.client.HTTPConnection)
        conn = connection_class(target.hostname, port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
            location = resp.getheader("Location")
        except (OSError, http.client.HTTPException) as err:
            raise OperatorError(f"Cannot reach the coordinator at {self.url}: {err}.") from None
        finally:
            conn.close()
        if 300 <= status < 400 and location:
            # Not followed: a redirect would carry the admin token to another address.
            raise OperatorError(
                f"{self.url} redirects to {location}; set VM_URL (or --url) to the "
                "coordinator's own address.", status=status)
        if not 200 <= status < 300:
            try:
                payload = orjson.loads(raw)
                message = str(payload.get("message") or payload.get("error"))
                code = payload.get("error")
            except (orjson.JSONDecodeError, AttributeError):
                message, code = f"HTTP {status}", None
            raise OperatorError(message, status=status, code=code)
        return raw

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def get_json_bytes(self, path: str, **query: Any) -> bytes:
        """A GET's JSON answer unparsed, for passing on as it is (a fleet-sized list
        costs more to parse and re-encode than to fetch). Only its first character is
        checked: an object or an array, not an error page from something in between."""
        raw = self.request_raw("GET", path, query=query)
        if raw.lstrip()[:1] not in (b"[", b"{"):
            raise OperatorError(f"The coordinator at {self.url} sent a non-JSON answer.")
        return raw

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
