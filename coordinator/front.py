"""A front process: answers the agents' heartbeats on the coordinator's port.

``vast-manager serve --fronts N`` runs N of these beside the coordinator's
own process, which then keeps what must be in one place: the store and its
writer, the nonce memory, the monitor. All of them accept on the one
listening socket (inherited), so the kernel spreads connections over them.

A front does the per-request work that needs no shared state, which is most
of a heartbeat's CPU: HTTP, the body limit, the agent's key and signature
(DESIGN 3.3 steps 1-4, from a key cache of its own), decoding and
validating, encoding the JSON columns, and signing the answer. It relays the
verified heartbeat to the writer's process (``coordinator.relay``), which
checks the nonce and the revocation, writes, and decides the directive.
Every other request (hello, results, logs, the operator API, the dashboard)
goes to the writer's process unchanged, over HTTP on a Unix socket, so it is
answered exactly as without fronts.

A front exits when its link to the writer's process closes: it never
outlives the coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from coordinator import relay
from coordinator.app import (
    agent_lookup,
    agent_response,
    read_body,
    too_large,
    too_large_declared,
)
from coordinator.auth import MAX_BODY_BYTES, AgentAuth, AuthFailure
from coordinator.errors import Refusal
from coordinator.ingest import steady_fields
from coordinator.store import open_reads
from protocol import signing
from protocol.codec import decode
from protocol.errors import ProtocolError
from protocol.messages import Heartbeat

log = logging.getLogger(__name__)

HEARTBEAT_PATH = "/v1/heartbeat"
# Hop-by-hop headers (RFC 9110 7.6.1), the ones aiohttp sets from the body it sends, and
# Expect (this front already answered the 100-continue; the body is read whole).
_NOT_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "content-length", "expect",
})
_INTERNAL = orjson.dumps({"error": "internal_error",
                          "message": "The coordinator hit an internal error."})
_UNAVAILABLE = orjson.dumps({"error": "unavailable",
                             "message": "The coordinator is restarting; try again."})


@dataclass(frozen=True, slots=True)
class FrontSpec:
    """What the coordinator's process hands a front on its stdin (JSON)."""

    listen_fd: int
    relay_path: str
    proxy_path: str
    db_path: str
    fleet_secrets: list[str]  # hex, newest first
    tls_cert: str | None = None
    tls_key: str | None = None
    log_format: str = "text"
    redact: tuple[str, ...] = ()


class Front:
    """The front's request handlers over its link and its proxy session."""

    def __init__(self, auth: AgentAuth, link: relay.FrontSide, proxy: aiohttp.ClientSession,
                 clock: Callable[[], float] = time.time) -> None:
        self.auth = auth
        self.link = link
        self.proxy = proxy
        self.clock = clock

    async def heartbeat(self, request: web.Request) -> web.Response:
        nonce = request.headers.get(signing.HEADER_NONCE, "")
        try:
            if not too_large_declared(request):
                self.auth.screen(request.headers)  # a stranger's body is never read
        except AuthFailure as failure:
            return agent_response(self.clock(), failure.status,
                                  orjson.dumps(failure.to_body()), None, nonce)
        try:
            body, _ = await read_body(request)
        except Refusal as err:
            return agent_response(self.clock(), err.status, orjson.dumps(err.to_body()), None,
                                  nonce)
        try:
            agent = self.auth.authenticate(method=request.method, path_qs=request.raw_path,
                                           headers=request.headers, body=body)
        except AuthFailure as failure:
            return agent_response(self.clock(), failure.status,
                                  orjson.dumps(failure.to_body()), failure.verified_key, nonce)
        try:
            hb = decode(Heartbeat, body)
        except ProtocolError as err:
            invalid: ProtocolError | None = err
        else:
            invalid = None
        try:
            ids = [agent.agent_id, agent.nonce, agent.timestamp]
            if invalid is not None:
                header, blobs = await self.link.call("admit", ids)
            else:
                f = steady_fields(hb)
                header, blobs = await self.link.call(
                    "hb", [*ids, f.seq, f.phase, f.phase_started_at, f.proofs_completed_total],
                    [body, (f.progress_json or "").encode(),
                     f.proof_seconds_recent_json.encode(), (f.telemetry_json or "").encode()])
        except ConnectionError:
            return agent_response(self.clock(), 503, _UNAVAILABLE, None, nonce)
        except Exception:
            # As in one process: a bug answers this request, signed, and the front goes on.
            log.exception("agent %s: /v1/heartbeat failed in a front", agent.agent_id)
            return agent_response(self.clock(), 500, _INTERNAL, agent.key, agent.nonce)
        _, status, signed = header
        if status == 0 and invalid is not None:
            return agent_response(self.clock(), 400, orjson.dumps(invalid.to_body()), agent.key,
                                  agent.nonce)
        return agent_response(self.clock(), status, blobs[0], agent.key if signed else None,
                              agent.nonce)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """Any other request, to the writer's process as it came, and its answer back."""
        agent_side = request.path.startswith("/v1/")
        if agent_side and request.method == "POST":
            # As the writer's process would answer, before reading: a stranger's body is
            # never read.
            if too_large_declared(request):
                return self._plain(413, orjson.dumps(too_large().to_body()), True)
            try:
                self.auth.screen(request.headers)
            except AuthFailure as failure:
                return self._plain(failure.status, orjson.dumps(failure.to_body()), True)
        try:
            # Twice the agents' limit: the writer's process applies its own limits, this
            # only bounds what a front holds.
            body, _ = await read_body(request, 2 * MAX_BODY_BYTES)
        except Refusal as err:
            return self._plain(err.status, orjson.dumps(err.to_body()), agent_side)
        headers = CIMultiDict((k, v) for k, v in request.headers.items()
                              if k.lower() not in _NOT_FORWARDED)
        if request.secure:
            # The writer's process hears plain HTTP on its Unix socket: tell it the browser
            # spoke HTTPS, so the dashboard's cookie stays Secure.
            headers["X-Forwarded-Proto"] = "https"
        try:
            async with self.proxy.request(
                request.method, URL("http://coordinator" + request.raw_path, encoded=True),
                headers=headers, data=body if body else None, allow_redirects=False,
            ) as resp:
                data = await resp.read()
                out = CIMultiDict((k, v) for k, v in resp.headers.items()
                                  if k.lower() not in _NOT_FORWARDED)
                return web.Response(status=resp.status, reason=resp.reason, headers=out,
                                    body=data)
        except (aiohttp.ClientError, OSError):
            return self._plain(503, _UNAVAILABLE, agent_side)

    def _plain(self, status: int, body: bytes, agent_side: bool) -> web.Response:
        if agent_side:
            return agent_response(self.clock(), status, body, None, "")
        return web.Response(body=body, status=status, content_type="application/json")


def front_app(front: Front) -> web.Application:
    # Bodies are read (and bounded) by read_body, so aiohttp's own limit never answers first.
    app = web.Application(client_max_size=4 * MAX_BODY_BYTES)
    app.router.add_post(HEARTBEAT_PATH, front.heartbeat)
    app.router.add_route("*", "/{tail:.*}", front.forward)
    return app


async def serve_front(spec: FrontSpec) -> None:
    """Serve on the inherited socket until SIGTERM or the writer's process goes away."""
    from coordinator.server import tls_context, tune_gc

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Ctrl-C reaches the whole process group: the coordinator's process stops its fronts
    # itself (after their requests in flight), so they do not stop on their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reads = open_reads(spec.db_path)
    # The nonce memory here is never used: admitting is the writer's process's work.
    auth = AgentAuth([bytes.fromhex(s) for s in spec.fleet_secrets], agent_lookup(reads),
                     not_before=0)
    auth.preload(reads.agent_states())
    link = await relay.connect(spec.relay_path)
    proxy = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=spec.proxy_path),
                                  auto_decompress=False,
                                  skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding",
                                                     "Content-Type"))
    ssl_context = (tls_context(spec.tls_cert, spec.tls_key)
                   if spec.tls_cert and spec.tls_key else None)
    runner = web.AppRunner(front_app(Front(auth, link, proxy)), access_log=None,
                           handle_signals=False, shutdown_timeout=5.0)
    sock = socket.socket(fileno=spec.listen_fd)
    try:
        await runner.setup()
        await web.SockSite(runner, sock, ssl_context=ssl_context).start()
        tune_gc()
        link.closed.add_done_callback(lambda _: stop.set())
        await stop.wait()
        if link.closed.done():
            log.warning("front %d: the coordinator's process went away; stopping", os.getpid())
    finally:
        await runner.cleanup()
        await proxy.close()
        if link.transport is not None:
            link.transport.close()
        reads.close()


def main() -> None:
    """``python -m coordinator.front``: the spec arrives as JSON on stdin."""
    raw = orjson.loads(sys.stdin.buffer.read())
    spec = FrontSpec(**{**raw, "redact": tuple(raw.get("redact", ()))})
    from coordinator.server import JsonFormatter, RedactingFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(list(spec.redact)) if spec.log_format == "json"
        else RedactingFormatter(list(spec.redact),
                                "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_front(spec))


if __name__ == "__main__":
    main()
