"""The HTTP layer both APIs share: JSON and error answers (docs/protocol.md), bounded body
reads, and the middleware that turns the core's exceptions into answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from vast_manager.coordinator.exceptions import (
    Refusal,
)
from vast_manager.coordinator.web.auth import (
    MAX_BODY_BYTES,
)
from vast_manager.coordinator.web.core import CORE
from vast_manager.coordinator.web.guard import BodyBudget, QuietLog
from vast_manager.protocol import signing

log = logging.getLogger(__name__)


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status,
                        content_type="application/json")


def error_response(status: int, code: str, message: str, field: str | None = None) -> web.Response:
    body = {"error": code, "message": message}
    if field is not None:
        body["field"] = field
    return json_response(body, status)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}


# A whole body must arrive within this many seconds (1 MiB in 60 s is 140 kbit/s), so a
# slow sender (slowloris) cannot hold a request open for ever.
BODY_READ_TIMEOUT_S = 60.0
# Bodies up to this size claim nothing from the budget of bodies in flight: aiohttp holds
# up to twice its 64 KiB read limit of a connection before pausing it, read or not.
UNBUDGETED_BODY_BYTES = 64 * 1024


def too_large(limit: int = MAX_BODY_BYTES) -> Refusal:
    return Refusal(413, "body_too_large", f"The body is larger than {limit} bytes.")


def too_large_declared(request: web.Request, limit: int = MAX_BODY_BYTES) -> bool:
    """A declared Content-Length over the limit: the first check of docs/protocol.md
    ("Request signing"), on the headers."""
    return request.content_length is not None and request.content_length > limit


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES,
                    budget: BodyBudget | None = None, key: str = "") -> tuple[bytes, int]:
    """The exact request bytes, refusing more than ``limit`` before reading them all, and
    the bytes claimed from ``budget`` for ``key`` (release them once the request is
    answered). Claims the declared length up front, a chunked body as it arrives."""
    if too_large_declared(request, limit):
        raise too_large(limit)
    claimed = 0

    def claim(n: int) -> None:
        nonlocal claimed
        if budget is None or n <= 0:
            return
        refused = budget.claim(key, n)
        if refused is not None:
            budget.release(key, claimed)
            raise Refusal(503, "busy", refused, retry_after_s=1)
        claimed += n

    content = request.content
    if content.is_eof():
        # The whole body is already buffered (a heartbeat fits in the packets that brought
        # its headers): take it without arming a timer, the common case of the hot path.
        body = content.read_nowait(-1)
        if len(body) > limit:
            raise too_large(limit)
        return body, claimed
    # A small body claims nothing: aiohttp buffers that much of a connection before
    # anyone reads anyway, and a full budget must never refuse a good heartbeat.
    declared = request.content_length
    if declared is not None and declared > UNBUDGETED_BODY_BYTES:
        claim(declared)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            while True:
                chunk = await request.content.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                if declared is None and size > UNBUDGETED_BODY_BYTES:
                    claim(size - claimed)
                chunks.append(chunk)
    except BaseException as err:
        if budget is not None:
            budget.release(key, claimed)
        if isinstance(err, TimeoutError):
            raise Refusal(408, "request_timeout",
                          f"The body did not arrive within {BODY_READ_TIMEOUT_S:g} s.") from None
        if isinstance(err, ConnectionError):
            # The client went away mid-body: nobody reads this answer, and nothing is
            # written.
            raise Refusal(400, "incomplete_body", "The connection closed mid-body.") from None
        raise
    return b"".join(chunks), claimed


#: Headers every answer carries (``dashboard`` adds the page-only ones elsewhere). An agent's
#: answer is built with them (``agent_api.agent_response``), so the response signal that
#: adds them to every other answer finds nothing to do there.
SECURITY_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def error_answer(request: web.BaseRequest, err: Exception, quiet: QuietLog) -> web.Response:
    """The JSON answer for an exception a handler raised: an ``HTTPException``'s status,
    else a bug's ``500`` (its traceback written once an interval, the rest counted)."""
    if isinstance(err, web.HTTPException):
        code = _HTTP_CODES.get(err.status, "http_error")
        response = error_response(err.status, code, err.reason or code.replace("_", " "))
        if err.status == 405 and "Allow" in err.headers:
            response.headers["Allow"] = err.headers["Allow"]
        return response
    # A bug, not the client's fault; whoever found it may repeat it, so the traceback is
    # written once an interval and the rest counted.
    quiet.report(
        "internal-error", f"unhandled error on {request.method} {request.path}",
        level=logging.ERROR, exc_info=(type(err), err, err.__traceback__))
    return error_response(500, "internal_error", "The coordinator hit an internal error.")


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """JSON bodies for every error, server time on agent answers. Who may ask is the
    agents' routes' own wrapper (``agent_api.agent_endpoint``) and the operators'
    sub-application's middleware (``operator_api.operator_auth``)."""
    response: web.StreamResponse
    try:
        response = await handler(request)
    except asyncio.CancelledError:
        raise
    except Exception as err:
        response = error_answer(request, err, request.app[CORE].guard.quiet)
    # An agent route's answer (``agent_endpoint``) carries the server time already, and
    # is known by that first.
    if signing.HEADER_SERVER_TIME not in response.headers and request.path.startswith("/v1/"):
        response.headers[signing.HEADER_SERVER_TIME] = str(int(request.app[CORE].clock()))
    return response


def refusal_response(err: Refusal) -> web.Response:
    response = error_response(err.status, err.code, err.message)
    if err.retry_after_s is not None:
        response.headers["Retry-After"] = str(err.retry_after_s)
    return response
