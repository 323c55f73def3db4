"""The agent endpoints (docs/protocol.md): signed requests screened before their bodies are
read, decoded, written through ``operations`` (one module per message), answered signed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import msgspec
from aiohttp import hdrs, web

from vast_manager.coordinator.decisions import belief, policy
from vast_manager.coordinator.discovery.structural_model import Prediction
from vast_manager.coordinator.exceptions import (
    CoordinatorError,
    Refusal,
    UnknownAgent,
    error_body,
    http_status,
)
from vast_manager.coordinator.offers import Offer
from vast_manager.coordinator.operations import replay
from vast_manager.coordinator.operations.agent_logs import logs_job
from vast_manager.coordinator.operations.beliefs import Expectation
from vast_manager.coordinator.operations.heartbeat import heartbeat_job
from vast_manager.coordinator.operations.hello import hello_job
from vast_manager.coordinator.operations.result import result_job
from vast_manager.coordinator.providers.base import ProviderError
from vast_manager.coordinator.web.auth import (
    AuthFailure,
    VerifiedAgent,
    sign_response,
)
from vast_manager.coordinator.web.core import CORE, Core
from vast_manager.coordinator.web.guard import ADDRESS_KEY_PREFIX, QuietLog, address_key
from vast_manager.coordinator.web.http import (
    SECURITY_HEADERS,
    error_answer,
    read_body,
    too_large,
    too_large_declared,
)
from vast_manager.protocol import signing
from vast_manager.protocol.codec import decode, encode
from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.messages import Heartbeat, Hello, LogBatch, Result

log = logging.getLogger(__name__)


def agent_response(
    now: float, status: int, body: bytes, key: bytes | None, nonce: str
) -> web.Response:
    """An answer to an agent (docs/protocol.md): server time, and signed once its key verified."""
    # The headers handed over whole: aiohttp takes them as they are, where its
    # ``content_type`` argument and each header set later cost a pass of their own. The
    # security headers every answer carries are among them: on the agents' own path
    # (``serve_agents_first``) no response signal adds them.
    headers = {"Content-Type": "application/json", signing.HEADER_SERVER_TIME: str(int(now)),
               **SECURITY_HEADERS}
    if key is not None:
        headers[signing.HEADER_SIGNATURE] = sign_response(key, nonce, status, body)
    return web.Response(body=body, status=status, headers=headers)


def _agent_answer(
    core: Core, status: int, payload: Any, key: bytes | None, nonce: str
) -> web.Response:
    return agent_response(core.clock(), status, encode(payload), key, nonce)


def agent_failure(err: BaseException, agent_id: str, path: str,
                  quiet: QuietLog | None = None) -> tuple[int, Any]:
    """The status and body for an agent handler's exception (docs/protocol.md, Errors)."""
    if isinstance(err, ProtocolError):
        return 400, err.to_body()
    if isinstance(err, Refusal):  # a flood's throttle (coordinator/operations/result.py)
        return err.status, err.to_body()
    if isinstance(err, (CoordinatorError, ProviderError)):
        return http_status(err), error_body(err)
    if quiet is None:
        log.error("agent %s: %s failed", agent_id, path, exc_info=err)
    else:
        quiet.report("internal-error", f"agent {agent_id}: {path} failed", level=logging.ERROR,
                     exc_info=(type(err), err, err.__traceback__))
    return 500, error_body(err)


def _refused(core: Core, request: web.Request, status: int, body: dict[str, str],
             key: bytes | None, nonce: str, retry_after_s: int | None = None) -> web.Response:
    """An agent request refused before its handler: counted, answered, and when part of
    its body is still on the way, the connection closed (aiohttp drains what is left of
    it for a few seconds, discarding it, then drops it)."""
    core.guard.refused(body["error"])
    response = _agent_answer(core, status, body, key, nonce)
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    if not request.content.is_eof():
        response.force_close()
    return response


def _internal_error(core: Core, request: web.Request, err: Exception) -> web.Response:
    """What the application's error middleware answers a handler's bug with, built here:
    on the agents' own path (``serve_agents_first``) no middleware or signal runs."""
    response = error_answer(request, err, core.guard.quiet)
    response.headers.update(SECURITY_HEADERS)
    response.headers[signing.HEADER_SERVER_TIME] = str(int(core.clock()))
    return response


#: An agent route's aiohttp handler.
Endpoint = Callable[[web.Request], Awaitable[web.Response]]
#: An agent handler: the core, the agent verified and the exact body it signed, in; the
#: answer's payload out (encoded, stamped and signed by ``agent_endpoint``).
AgentHandler = Callable[[Core, VerifiedAgent, bytes], Awaitable[Any]]


def agent_endpoint(core: Core, fn: AgentHandler) -> Endpoint:
    """An agent route: the request checks and the response signature of docs/protocol.md
    around ``fn``.

    The order: a declared body over 1 MiB (413), then, on the headers alone, an issued
    agent and well-formed signing headers (401), and only then is the body read, within
    the shared budget and a deadline, its signature verified, its nonce admitted. A path
    or method no route serves is answered as anywhere else (404, 405), unverified.

    A route of the application itself, not a sub-application's middleware: an agent's
    request is most of the coordinator's traffic, and a sub-application's routing and
    middleware chain cost a heartbeat more than the rest of these checks
    (docs/performance.md, "Heartbeat cost"). It needs nothing of the application's
    (``core`` is its own), so ``serve_agents_first`` can call it before the router."""

    async def handler(request: web.Request) -> web.Response:
        try:
            nonce = request.headers.get(signing.HEADER_NONCE, "")
            if too_large_declared(request):
                return _refused(core, request, 413, too_large().to_body(), None, nonce)
            try:
                agent_id = core.auth.screen(request.headers)
            except AuthFailure as failure:
                return _refused(core, request, failure.status, failure.to_body(), None, nonce)
            claimed = 0
            # Until its signature verifies, a body is held against its sender's address: an
            # agent id alone (in every vast.ai label) must not spend that agent's allowance.
            holder = ADDRESS_KEY_PREFIX + address_key(request.remote)
            try:
                try:
                    body, claimed = await read_body(request, budget=core.guard.budget, key=holder)
                except Refusal as err:
                    return _refused(core, request, err.status, err.to_body(), None, nonce,
                                    err.retry_after_s)
                try:
                    agent = core.auth.verify(
                        # raw_path: the path and query exactly as the agent sent and signed them.
                        method=request.method, path_qs=request.raw_path, headers=request.headers,
                        body=body, now=core.clock(), screened_id=agent_id,
                    )
                except AuthFailure as failure:
                    return _refused(core, request, failure.status, failure.to_body(),
                                    failure.verified_key, nonce)
                refused = core.guard.budget.transfer(holder, agent_id, claimed)
                if refused is not None:
                    return _refused(core, request, 503, {"error": "busy", "message": refused},
                                    agent.key, nonce, 1)
                holder = agent_id
                try:
                    status, payload = 200, await fn(core, agent, body)
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    status, payload = agent_failure(err, agent.agent_id, request.path,
                                                    core.guard.quiet)
                return _agent_answer(core, status, payload, agent.key, agent.nonce)
            finally:
                core.guard.budget.release(holder, claimed)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug: answered as the error middleware would
            return _internal_error(core, request, err)

    return handler


def expectation(core: Core) -> Expectation | None:
    """The fitted rate model's 90th percentile for an offer's hardware and what it never
    measured of it (None without a model), what a benchmark result is held against
    (docs/reliability.md, "No rate on a host's word alone")."""
    fitted = core.models.latest
    if fitted is None:
        return None
    model = fitted.model

    def high(offer: Offer) -> belief.Expected | None:
        # As a new host's: the machine's own runs never raise its own line.
        (p,) = model.predict_offers([msgspec.structs.replace(offer, machine_id=None)],
                                    explain=False)
        return belief.Expected(float(p.rate_high), p.novelty) \
            if isinstance(p, Prediction) else None

    return high


async def _hello(core: Core, agent: VerifiedAgent, body: bytes) -> Any:
    hello = decode(Hello, body)
    now = core.clock()
    instance_id, directive = await core.store.write(
        hello_job(agent.agent_id, hello, core.settings, now, core.tracker.load(), core.rng)
    )
    # A hello changes no phase but an unheard instance's (to booting, paced steady).
    core.tracker.touch(instance_id, now, directive.next_heartbeat_s)
    return directive


async def _heartbeat(core: Core, agent: VerifiedAgent, body: bytes) -> Any:
    hb = decode(Heartbeat, body)
    now = core.clock()
    # The store's future awaited here, not through ``Store.write``'s coroutine: one frame
    # less to build and to pass through when the commit wakes it, on every heartbeat.
    instance_id, directive = await core.store.write_future(
        heartbeat_job(agent.agent_id, hb, core.settings, now, core.tracker.load(), core.rng)
    )
    core.tracker.touch(instance_id, now, directive.next_heartbeat_s, hb.phase)
    if directive.action == "terminate":
        core.monitor.wake()
    return core.spool_marks.answer(agent.agent_id, directive, hb.acked_seq)


async def _result(core: Core, agent: VerifiedAgent, body: bytes) -> Any:
    result = decode(Result, body)
    core.spool_marks.refuse_lacking(agent.agent_id, "result", result.spool_seq,
                                    result.prev_acked_seq)
    now = core.clock()
    secrets = core.settings.fleet_secrets
    outcome = await core.store.write(result_job(
        agent.agent_id, result, core.settings, now, core.started_at, core.tracker.load(),
        expectation(core), core.rng,
        receipted=replay.receipted(secrets, agent.agent_id, result)))
    core.spool_marks.raised(agent.agent_id, "result", result.spool_seq)
    core.tracker.touch(outcome.instance_id, now, outcome.directive.next_heartbeat_s)
    if outcome.terminate:
        core.monitor.wake()
    if outcome.flood == policy.REVOKED:
        core.auth.mark_revoked(agent.agent_id)
        raise UnknownAgent("This agent's key was revoked: it sent "
                           f"{policy.FLOOD_REVOKE_AT} results nobody asked for within "
                           f"{policy.FLOOD_WINDOW_S / 3600:.0f} h.")
    if outcome.flood == policy.THROTTLED:
        raise Refusal(429, "throttled", "Too many results nobody asked for; this one is "
                      "stored as a summary. Send results only for the benchmarks the "
                      "coordinator directs.", retry_after_s=60)
    if not outcome.duplicate:
        core.models.wake()  # a counted benchmark is a new measurement for the rate model
    return {"ok": True, "duplicate": outcome.duplicate, "directive": outcome.directive,
            "receipt": replay.receipt_for(secrets[0], agent.agent_id, result)}


async def _logs(core: Core, agent: VerifiedAgent, body: bytes) -> Any:
    batch = decode(LogBatch, body)
    core.spool_marks.refuse_lacking(agent.agent_id, "logs", batch.spool_seq,
                                    batch.prev_acked_seq)
    now = core.clock()
    await core.store.write(logs_job(agent.agent_id, batch, core.settings, now))
    core.spool_marks.raised(agent.agent_id, "logs", batch.spool_seq)
    return {"ok": True}


#: The agents' routes (all ``POST``), in the wire contract's paths.
AGENT_ROUTES: tuple[tuple[str, AgentHandler], ...] = (
    ("/v1/hello", _hello), ("/v1/heartbeat", _heartbeat),
    ("/v1/result", _result), ("/v1/logs", _logs))
#: Where ``add_routes`` keeps each route's handler (path -> handler) for ``serve_agents_first``.
AGENT_HANDLERS: web.AppKey[dict[str, Endpoint]] = web.AppKey("agent_handlers")


def add_routes(app: web.Application) -> None:
    """The agents' routes (``/v1/*``), each behind ``agent_endpoint``, on ``app`` (whose
    core is already set)."""
    handlers = {path: agent_endpoint(app[CORE], fn) for path, fn in AGENT_ROUTES}
    for path, handler in handlers.items():
        app.router.add_post(path, handler)
    app[AGENT_HANDLERS] = handlers


def serve_agents_first(server: web.Server, app: web.Application,
                       elsewhere: Callable[[web.BaseRequest], bool] | None = None) -> None:
    """Hand an agent's ``POST`` to its route's handler straight from aiohttp's ``server``,
    before ``app``'s router, middleware and response signal; every other request (and an
    agent path with a query, another method, or arriving where ``elsewhere`` says agents
    are not served) goes through ``app`` as before.

    Agents' requests are nearly all of the coordinator's traffic, and the application's
    layers (route resolution, two middleware frames on every call and every resumption,
    the response signal) cost a heartbeat about 5 us that the agents' handler, which
    does its own checks and builds its own complete answer, never needed
    (docs/performance.md, "The agents' path"). The handler answers its own bugs as the
    error middleware would (``_internal_error``)."""
    handlers = app[AGENT_HANDLERS]
    through_app = server.request_handler

    def first(request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        # raw_path: the path exactly as sent; anything but a plain agent path goes the
        # general way, which answers it as it always has (as it does an ``Expect:
        # 100-continue``, which the application's route answers before the body). A
        # function, not a coroutine: the handler's own coroutine is what aiohttp awaits.
        handler = handlers.get(request.raw_path) if request.method == "POST" else None
        if (handler is None or hdrs.EXPECT in request.headers
                or (elsewhere is not None and elsewhere(request))):
            return through_app(request)
        # A web.Request all the same (the server's request factory is the app's).
        return handler(cast(web.Request, request))

    server.request_handler = first
