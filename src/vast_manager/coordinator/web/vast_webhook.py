"""``POST /v1/vast/webhook``: vast.ai's notification webhooks, verified, wake the monitor.

vast.ai signs each delivery (docs ``guides/reference/notification-webhooks.mdx``, in
docs/vast.md "Webhooks"): ``X-Vast-Signature-256`` is ``sha256=`` and the hex HMAC-SHA256,
keyed by the webhook's secret, of ``"<X-Vast-Timestamp>.<raw body>"``; deliveries are at
least once, deduplicated by ``X-Vast-Event-Id``. A delivery is refused (one sentence,
nothing written, nothing woken) when the signature does not verify, the timestamp is more
than ``WINDOW_S`` from our clock (the docs' own example rejects beyond 300 s), or its event
id was seen inside that window (``protocol.nonces``: bounded memory).

The payload names no instance (``event_id``, ``user_id``, ``notif_type``, ``subject``,
``message``, ``timestamp``), so an accepted event does not act by itself: it runs the
monitor's round now, which lists the instances and decides as every round does. Polling
stays the ground truth; a webhook only makes it sooner (an ``offline`` seen in a second
instead of a round).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

import orjson
from aiohttp import web

from vast_manager.coordinator.textsafe import neutralise
from vast_manager.coordinator.web.core import CORE
from vast_manager.coordinator.web.http import error_response, read_body
from vast_manager.protocol.nonces import NonceMemory, NonceVerdict

log = logging.getLogger(__name__)

PATH = "/v1/vast/webhook"
#: Seconds a delivery's ``X-Vast-Timestamp`` may be from our clock.
WINDOW_S = 300
#: A notification is a few hundred bytes; anything far larger is not vast.ai's.
MAX_BODY_BYTES = 64 * 1024
#: Event ids remembered at once (inside the window); beyond, 429 (vast.ai retries it).
MAX_EVENTS = 10_000
#: The longest event id kept.
MAX_EVENT_ID_CHARS = 200

_MEMORY = web.AppKey("vast_webhook_events", NonceMemory)


def expected_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, ``"<timestamp>.<body>"``)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _refuse(status: int, code: str, message: str) -> web.Response:
    return error_response(status, code, message)


async def receive(request: web.Request) -> web.Response:
    core = request.config_dict[CORE]
    secret = core.settings.vast_webhook_secret
    if not secret:
        return _refuse(404, "not_found", "No vast.ai webhook is configured "
                       "(VM_VAST_WEBHOOK_SECRET is unset).")
    raw, _ = await read_body(request, limit=MAX_BODY_BYTES)
    stamp = request.headers.get("X-Vast-Timestamp", "")
    signature = request.headers.get("X-Vast-Signature-256", "")
    event_id = request.headers.get("X-Vast-Event-Id", "")
    if not stamp.isdigit() or len(stamp) > 12:
        return _refuse(400, "bad_timestamp", "X-Vast-Timestamp must be an integer Unix time.")
    if not hmac.compare_digest(signature.encode(), expected_signature(secret, stamp, raw).encode()):
        return _refuse(401, "bad_signature", "X-Vast-Signature-256 does not verify with the "
                       "configured secret.")
    if not event_id or len(event_id) > MAX_EVENT_ID_CHARS or not event_id.isprintable():
        return _refuse(400, "bad_event_id", "X-Vast-Event-Id is missing or malformed.")
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _refuse(400, "bad_body", "The body is not JSON.")
    if not isinstance(payload, dict):
        return _refuse(400, "bad_body", "The body must be a JSON object.")
    verdict = request.app[_MEMORY].check_and_remember("vast.ai", event_id, int(stamp),
                                                     core.clock())
    if verdict is NonceVerdict.STALE:
        return _refuse(400, "stale_timestamp", f"X-Vast-Timestamp is more than {WINDOW_S} s "
                       "from the coordinator's clock.")
    if verdict is NonceVerdict.REPLAYED:
        return _refuse(409, "replayed", f"Event {neutralise(event_id)} was received already.")
    if verdict is NonceVerdict.TOO_MANY:
        return _refuse(429, "too_many", "Too many vast.ai events at once; retry later.")
    kind = _field(payload, "notif_type")
    log.info("vast.ai webhook %s (%s): %s; monitor round now", kind, neutralise(event_id),
             _field(payload, "subject"))
    core.monitor.wake()
    return web.Response(status=204)


def _field(payload: dict[str, Any], name: str) -> str:
    value = payload.get(name)
    return neutralise(str(value))[:200] if value is not None else "-"


def add_routes(app: web.Application) -> None:
    """Mount the receiver (``POST /v1/vast/webhook``, beside the agents' ``/v1`` routes)."""
    app[_MEMORY] = NonceMemory(window_s=WINDOW_S, max_per_agent=MAX_EVENTS)
    app.router.add_post(PATH, receive)
