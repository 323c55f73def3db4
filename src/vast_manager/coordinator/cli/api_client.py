"""A small synchronous client of the operator API (docs/protocol.md), for the CLI.

The CLI stays thin: it calls these functions and turns ``OperatorError`` into
a one-line message and an exit code.
"""

from __future__ import annotations

import http.client
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import orjson

from vast_manager.coordinator.settings import DEFAULTS

DEFAULT_URL = f"http://{DEFAULTS.host}:{DEFAULTS.port}"


_NEXT_LINK = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?', re.IGNORECASE)


def next_after_id(link: str | None) -> int | None:
    """The ``after_id`` of the next page a ``Link`` header names; None when it names none
    (ValueError when it names one without an integer ``after_id``)."""
    found = _NEXT_LINK.search(link or "")
    if found is None:
        return None
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(found.group(1)).query).get("after_id")
    if not values:
        raise ValueError("the next page's link has no after_id")
    return int(values[0])


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
            raise OperatorError(f"The coordinator at {self.url} sent a non-JSON answer; is "
                               "--url (VM_URL) a vast-manager coordinator?") from None

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
        return self._exchange(method, path, body, query, data=data,
                              content_type=content_type)[0]

    def _exchange(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        *,
        data: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[bytes, str | None]:
        """``request_raw``'s bytes, and the answer's ``Link`` header (None without one)."""
        if not self.token:
            raise OperatorError("VM_ADMIN_TOKEN is not set and no <VM_DB_PATH>.admin-token "
                                "can be read; the operator API needs the admin token.")
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
            location, link = resp.getheader("Location"), resp.getheader("Link")
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
                code = payload.get("error")
                message = str(payload.get("message") or code)
            except (orjson.JSONDecodeError, AttributeError):
                code = None
            if not isinstance(code, str) or not code:
                # Every refusal of the coordinator is {"error", "message"} (docs/protocol.md):
                # anything else is another server (or a proxy's page) at that address.
                raise OperatorError(
                    f"{self.url} answered HTTP {status} but is not a vast-manager coordinator "
                    "(no coordinator error in its answer); set --url (or VM_URL) to the "
                    "coordinator's address")
            raise OperatorError(message, status=status, code=code)
        return raw, link

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def pages(self, path: str, page_size: int, **query: Any) -> Iterator[bytes]:
        """Each page of a paged list (docs/openapi.yaml: ``limit``, ``after_id``, and the
        next page named by the answer's ``Link: <...>; rel="next"``), unparsed, first to
        last. Only each page's first character is checked: an array, not an error page
        from something in between."""
        query = {**query, "limit": page_size}
        while True:
            raw, link = self._exchange("GET", path, query=query)
            if raw.lstrip()[:1] != b"[":
                raise OperatorError(f"The coordinator at {self.url} sent a non-JSON answer.")
            yield raw
            try:
                after = next_after_id(link)
            except ValueError:
                after = -1  # named, but not as this client can follow: refused below
            if after is None:
                return
            if after <= int(query.get("after_id", -1)):
                raise OperatorError(f"The coordinator at {self.url} named a next page this "
                                    "client cannot follow (its Link header).")
            query["after_id"] = after

    def get_list_bytes(self, path: str, page_size: int, **query: Any) -> bytes:
        """Every page of a paged list as one JSON array, unparsed (a fleet-sized list costs
        more to parse and re-encode than to fetch)."""
        items = [inner for raw in self.pages(path, page_size, **query)
                 if (inner := raw.strip()[1:-1].strip())]
        return b"[" + b",".join(items) + b"]"

    def get_list(self, path: str, page_size: int, **query: Any) -> list[Any]:
        """Every page of a paged list, decoded, as one list."""
        out: list[Any] = []
        for raw in self.pages(path, page_size, **query):
            try:
                out += orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise OperatorError(
                    f"The coordinator at {self.url} sent a non-JSON answer.") from None
        return out

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
