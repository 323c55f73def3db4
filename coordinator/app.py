"""The coordinator's HTTP face: agent endpoints (DESIGN 3.6) and operator API (3.7).

``create_app(settings, store, provider, clock)`` builds the aiohttp
application; its state lives under one typed ``web.AppKey`` and the monitor
loop in ``cleanup_ctx``. Handlers decode, check and call the core
(``ingest``, ``deploy``, ``monitor``); every error answer is a DESIGN 3.5
JSON body, every agent answer carries ``X-VM-Server-Time`` and, once the
request's signature verified, ``X-VM-Signature``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import logging
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web

from coordinator import ingest, metrics, policy
from coordinator.auth import (
    MAX_BODY_BYTES,
    AgentAuth,
    AgentRecord,
    AuthFailure,
    VerifiedAgent,
    sign_response,
)
from coordinator.dashboard import authorize_operator, setup_dashboard
from coordinator.deploy import Deployer, mint_agent_id
from coordinator.errors import (
    CoordinatorError,
    InstanceGone,
    InvalidInput,
    NotFound,
    Refusal,
    error_body,
    http_status,
)
from coordinator.guard import BodyBudget, Guard, QuietLog
from coordinator.monitor import HeartbeatTracker, Monitor
from coordinator.providers.base import Provider, ProviderError
from coordinator.render import has_unsafe
from coordinator.settings import Settings
from coordinator.store import Reads, Row, Store, Tx, loads
from protocol import signing
from protocol.codec import decode
from protocol.errors import ProtocolError
from protocol.messages import Heartbeat, Hello, LogBatch, Result

log = logging.getLogger(__name__)

MAX_LOG_TAIL = 10000
MAX_LABEL_CHARS = 200
MAX_REASON_CHARS = 1000


@dataclass(slots=True)
class Core:
    """Everything the handlers share (one object under one AppKey; no module globals)."""

    settings: Settings
    store: Store
    provider: Provider
    clock: policy.Clock
    auth: AgentAuth
    tracker: HeartbeatTracker
    monitor: Monitor
    deployer: Deployer
    guard: Guard
    started_at: float  # when this process started watching (its clock)


CORE = web.AppKey("core", Core)


# --- answers --------------------------------------------------------------------


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


def too_large() -> Refusal:
    return Refusal(413, "body_too_large", f"The body is larger than {MAX_BODY_BYTES} bytes.")


def too_large_declared(request: web.Request, limit: int = MAX_BODY_BYTES) -> bool:
    """A declared Content-Length over the limit: DESIGN 3.3's first check, on headers."""
    return request.content_length is not None and request.content_length > limit


async def read_body(request: web.Request, limit: int = MAX_BODY_BYTES,
                    budget: BodyBudget | None = None, key: str = "") -> tuple[bytes, int]:
    """The exact request bytes, refusing more than ``limit`` before reading them all, and
    the bytes claimed from ``budget`` for ``key`` (release them once the request is
    answered). Claims the declared length up front, a chunked body as it arrives."""
    if too_large_declared(request, limit):
        raise too_large()
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
            raise too_large()
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
                    raise too_large()
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


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Operator auth on /api (and /metrics), JSON bodies for every error, server time on
    agent answers."""
    core = request.app[CORE]
    path = request.path
    is_agent = path.startswith("/v1/")
    response: web.StreamResponse
    refusal: Refusal | None = None
    if path.startswith("/api/") or (path == "/metrics" and not core.settings.metrics_public):
        try:
            authorize_operator(request, core.settings.admin_token)
        except Refusal as err:
            refusal = err
    if refusal is not None:
        core.guard.refused(refusal.code)
        response = refusal_response(refusal)
    else:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            code = _HTTP_CODES.get(exc.status, "http_error")
            response = error_response(exc.status, code, exc.reason or code.replace("_", " "))
            if exc.status == 405 and "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # A bug, not the client's fault; whoever found it may repeat it, so the
            # traceback is written once an interval and the rest counted.
            core.guard.quiet.report("internal-error", f"unhandled error on {request.method} "
                                    f"{request.path}", level=logging.ERROR,
                                    exc_info=(type(err), err, err.__traceback__))
            response = error_response(
                500, "internal_error", "The coordinator hit an internal error."
            )
    if is_agent and signing.HEADER_SERVER_TIME not in response.headers:
        response.headers[signing.HEADER_SERVER_TIME] = str(int(core.clock()))
    return response


def refusal_response(err: Refusal) -> web.Response:
    response = error_response(err.status, err.code, err.message)
    if err.retry_after_s is not None:
        response.headers["Retry-After"] = str(err.retry_after_s)
    return response


# --- agent endpoints ---------------------------------------------------------------

AgentHandler = Callable[[Core, VerifiedAgent, bytes], Awaitable[tuple[int, Any]]]


def agent_response(
    now: float, status: int, body: bytes, key: bytes | None, nonce: str
) -> web.Response:
    """An answer to an agent (DESIGN 3.4): server time, and signed once its key verified."""
    response = web.Response(body=body, status=status, content_type="application/json")
    response.headers[signing.HEADER_SERVER_TIME] = str(int(now))
    if key is not None:
        response.headers[signing.HEADER_SIGNATURE] = sign_response(key, nonce, status, body)
    return response


def _agent_answer(
    core: Core, status: int, payload: Any, key: bytes | None, nonce: str
) -> web.Response:
    return agent_response(core.clock(), status, orjson.dumps(payload), key, nonce)


def agent_failure(err: BaseException, agent_id: str, path: str,
                  quiet: QuietLog | None = None) -> tuple[int, Any]:
    """The status and body for an agent handler's exception (DESIGN 3.5)."""
    if isinstance(err, ProtocolError):
        return 400, err.to_body()
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


def agent_endpoint(fn: AgentHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Wrap an agent handler in DESIGN 3.3's checks and 3.4's response signature.

    The order: a declared body over 1 MiB (413), then, on the headers alone, an issued
    agent and well-formed signing headers (401), and only then is the body read, within
    the shared budget and a deadline, its signature verified, its nonce admitted."""

    async def handler(request: web.Request) -> web.Response:
        core = request.app[CORE]
        nonce = request.headers.get(signing.HEADER_NONCE, "")
        if too_large_declared(request):
            return _refused(core, request, 413, too_large().to_body(), None, nonce)
        try:
            agent_id = core.auth.screen(request.headers)
        except AuthFailure as failure:
            return _refused(core, request, failure.status, failure.to_body(), None, nonce)
        claimed = 0
        try:
            try:
                body, claimed = await read_body(request, budget=core.guard.budget, key=agent_id)
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
            try:
                status, payload = await fn(core, agent, body)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                status, payload = agent_failure(err, agent.agent_id, request.path,
                                                core.guard.quiet)
            return _agent_answer(core, status, payload, agent.key, agent.nonce)
        finally:
            core.guard.budget.release(agent_id, claimed)

    return handler


async def _hello(core: Core, agent: VerifiedAgent, body: bytes) -> tuple[int, Any]:
    hello = decode(Hello, body)
    now = core.clock()
    instance_id, directive = await core.store.write(
        ingest.hello_job(agent.agent_id, hello, core.settings, now)
    )
    core.tracker.touch(instance_id, now)
    return 200, directive  # a dataclass: orjson encodes it without asdict()'s deep copy


async def _heartbeat(core: Core, agent: VerifiedAgent, body: bytes) -> tuple[int, Any]:
    hb = decode(Heartbeat, body)
    now = core.clock()
    instance_id, directive = await core.store.write(
        ingest.heartbeat_job(agent.agent_id, hb, core.settings, now)
    )
    core.tracker.touch(instance_id, now)
    if directive.action == "terminate":
        core.monitor.wake()
    return 200, directive  # a dataclass: orjson encodes it without asdict()'s deep copy


async def _result(core: Core, agent: VerifiedAgent, body: bytes) -> tuple[int, Any]:
    result = decode(Result, body)
    now = core.clock()
    outcome = await core.store.write(ingest.result_job(agent.agent_id, result, core.settings, now,
                                                       core.started_at))
    core.tracker.touch(outcome.instance_id, now)
    if outcome.terminate:
        core.monitor.wake()
    return 200, {"ok": True, "duplicate": outcome.duplicate,
                 "directive": asdict(outcome.directive)}


async def _logs(core: Core, agent: VerifiedAgent, body: bytes) -> tuple[int, Any]:
    batch = decode(LogBatch, body)
    now = core.clock()
    await core.store.write(ingest.logs_job(agent.agent_id, batch, core.settings, now))
    return 200, {"ok": True}


# --- operator API: input helpers ------------------------------------------------------


async def _json_object(request: web.Request) -> dict[str, Any]:
    # The operator's bodies are small; they are read whole here, once the token is known
    # (the middleware checked it), and count against the same budget while read.
    budget = request.app[CORE].guard.budget
    raw, claimed = await read_body(request, budget=budget, key="operator")
    budget.release("operator", claimed)
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"The body is not valid JSON: {exc}.") from None
    if not isinstance(value, dict):
        raise InvalidInput("The body must be a JSON object.", field="body")
    return value


def _number(body: dict[str, Any], name: str, *, positive: bool = True) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"Field '{name}' must be a number.", field=name)
    out = float(value)
    if out != out or out in (float("inf"), float("-inf")) or (positive and out <= 0):
        raise InvalidInput(f"Field '{name}' must be a positive finite number.", field=name)
    return out


def _integer(body: dict[str, Any], name: str, *, required: bool = False,
             minimum: int = 1, maximum: int = 2**53) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidInput(f"Field '{name}' is missing.", field=name)
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"Field '{name}' must be an integer.", field=name)
    if not minimum <= value <= maximum:
        raise InvalidInput(f"Field '{name}' must be between {minimum} and {maximum}.", field=name)
    return value


def _text(body: dict[str, Any], name: str, *, required: bool, max_chars: int) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidInput(f"Field '{name}' is missing.", field=name)
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"Field '{name}' must be a string.", field=name)
    value = value.strip()
    if required and not value:
        raise InvalidInput(f"Field '{name}' must not be empty.", field=name)
    if len(value) > max_chars:
        raise InvalidInput(f"Field '{name}' is longer than {max_chars} characters.", field=name)
    if has_unsafe(value):
        raise InvalidInput(f"Field '{name}' must not hold control or bidi characters.",
                           field=name)
    return value


def _path_int(request: web.Request, name: str) -> int:
    text = request.match_info[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"'{name}' must be an integer.", field=name) from None
    if not -(2**63) <= value < 2**63:
        raise InvalidInput(f"'{name}' is out of range.", field=name)
    return value


def _instance_or_404(core: Core, instance_id: int) -> Row:
    inst = core.store.get_instance(instance_id)
    if inst is None:
        raise NotFound(f"No instance {instance_id}.")
    return inst


def operator_endpoint(
    fn: Callable[[Core, web.Request], Awaitable[Any]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Run an operator handler; map the core's named exceptions in one place."""

    async def handler(request: web.Request) -> web.Response:
        core = request.app[CORE]
        try:
            payload = await fn(core, request)
        except Refusal as err:
            return error_response(err.status, err.code, err.message)
        except (CoordinatorError, ProviderError) as err:
            return json_response(error_body(err), http_status(err))
        if isinstance(payload, web.Response):
            return payload
        return json_response(payload)

    return handler


# --- operator API: views ---------------------------------------------------------------

INSTANCE_FIELDS = (
    "id", "agent_id", "label", "kind", "state", "phase", "machine_id", "gpu_name", "num_gpus",
    "dph_total", "rate_per_hour", "min_rate_per_hour", "last_seen", "provider",
    "provider_instance_id", "offer_id", "geolocation", "cpu_name", "cpu_cores", "cpu_ram",
    "pcie_bw", "disk_gb", "proofs_completed_total", "terminate_reason", "created_at",
    "state_since", "destroyed_at", "agent_version", "rebenchmark_pending",
)


# What an instance's view is made from (the wide host_json is left out).
_VIEW_COLUMNS = (*INSTANCE_FIELDS, "progress_json")


def _finish_view(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` holds ``_VIEW_COLUMNS``; turn it into the view in place."""
    out["progress"] = loads(out.pop("progress_json"))
    out["usd_per_proof"] = policy.usd_per_proof(out["dph_total"], out["rate_per_hour"])
    out["rebenchmark_pending"] = bool(out["rebenchmark_pending"])
    return out


def instance_view(row: Row) -> dict[str, Any]:
    return _finish_view({name: row.get(name) for name in _VIEW_COLUMNS})


def result_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    for col in ("gpus_used", "proof_seconds", "telemetry", "runs", "evidence", "flag_reasons",
                "directive"):
        out[col] = loads(out.pop(f"{col}_json", None))
    out["flags"] = [f for f in (row.get("flags") or "").split(",") if f]
    out["counts_for_host_perf"] = bool(row.get("counts_for_host_perf"))
    return out


def event_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["data"] = loads(out.pop("data_json", None))
    return out


def scaling_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["agent_evidence"] = loads(out.pop("agent_evidence_json", None))
    out["evidence"] = loads(out.pop("evidence_json", None))
    return out


def host_perf_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["usd_per_proof"] = policy.usd_per_proof(row.get("dph_total"),
                                                row.get("median_rate_per_hour"))
    return out


# --- operator API: handlers -------------------------------------------------------------


async def _issue_agent(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    label = _text(body, "label", required=True, max_chars=MAX_LABEL_CHARS)
    assert label is not None
    min_rate = _number(body, "min_rate_per_hour")
    agent_id = mint_agent_id()
    key = signing.derive_agent_key(core.settings.newest_secret, agent_id)
    now = core.clock()

    def job(tx: Tx) -> None:
        tx.insert_agent(agent_id, label=label, kind="byo", min_rate_per_hour=min_rate,
                        issued_at=now)
        tx.insert_event(now, "agent_issued", f"bring-your-own agent for {label!r} issued",
                        agent_id=agent_id, machine_id=label)

    await core.store.write(job)
    # The one answer that carries a key: it is the operator's to hand over.
    return {"agent_id": agent_id, "agent_key": key.hex(),
            "coordinator_url": core.settings.coordinator_url}


async def _revoke_agent(core: Core, request: web.Request) -> Any:
    agent_id = request.match_info["agent_id"]
    if not signing.is_agent_id(agent_id) or core.store.get_agent(agent_id) is None:
        raise NotFound(f"No agent {agent_id!r}.")
    now = core.clock()
    reason = "revoked by the operator"

    def job(tx: Tx) -> bool:
        changed = tx.revoke_agent(agent_id, now=now, reason=reason)
        inst = tx.instance_by_agent(agent_id)
        if inst is not None and inst["state"] not in policy.GONE_STATES:
            if inst["kind"] == "byo":
                # Not ours to destroy: the machine simply stops counting as our instance.
                tx.update_instance(inst["id"], state="destroyed", state_since=now,
                                   destroyed_at=now, terminate_reason=reason, updated_at=now)
            else:
                # A deployed instance whose agent may not speak is destroyed: it bills.
                tx.update_instance(inst["id"], state="terminating", state_since=now,
                                   terminate_reason=reason, destroy_due_at=now, updated_at=now)
        if changed:
            tx.insert_event(now, "revoke", reason, agent_id=agent_id,
                            instance_id=inst["id"] if inst else None)
        return changed

    changed = await core.store.write(job)
    core.auth.mark_revoked(agent_id)
    core.monitor.wake()
    message = f"Agent {agent_id} revoked." if changed else f"Agent {agent_id} was already revoked."
    return {"ok": True, "agent_id": agent_id, "revoked": True, "message": message}


async def _list_instances(core: Core, request: web.Request) -> Any:
    # The fleet-sized answer: only the view's columns, and one dict a row built from the
    # row's values (not a dict per row and then the view from it).
    return [_finish_view(dict(zip(_VIEW_COLUMNS, values, strict=True)))
            for values in core.store.instance_values(_VIEW_COLUMNS)]


async def _get_instance(core: Core, request: web.Request) -> Any:
    inst = _instance_or_404(core, _path_int(request, "id"))
    out = instance_view(inst)
    out["host"] = loads(inst.get("host_json"))
    out["results"] = [result_view(r) for r in core.store.results_for_instance(inst["id"])]
    out["events"] = [event_view(e) for e in core.store.events(inst["id"])]
    tele = core.store.latest_telemetry(inst["id"])
    out["telemetry"] = loads(tele["telemetry_json"]) if tele else None
    out["telemetry_at"] = tele["received_at"] if tele else None
    return out


async def _destroy_instance(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    inst = _instance_or_404(core, instance_id)
    if inst["state"] in policy.GONE_STATES:
        return {"ok": True, "already": True,
                "message": f"Instance {instance_id} is already {inst['state']}."}
    changed = await core.monitor.destroy(instance_id, "destroyed by the operator",
                                         source="operator")
    message = (f"Instance {instance_id} destroyed." if changed
               else f"Instance {instance_id} is already destroyed.")
    return {"ok": True, "already": not changed, "message": message}


async def _rebenchmark(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    inst = _instance_or_404(core, instance_id)
    if inst["state"] in policy.STICKY_STATES:
        raise InstanceGone(f"Instance {instance_id} is {inst['state']}; it cannot re-benchmark.")
    now = core.clock()

    def job(tx: Tx) -> None:
        tx.update_instance(instance_id, rebenchmark_pending=1, updated_at=now)
        tx.insert_event(now, "rebenchmark", "the operator asked for a new benchmark",
                        instance_id=instance_id, agent_id=inst["agent_id"],
                        machine_id=inst["machine_id"])

    await core.store.write(job)
    return {"ok": True,
            "message": f"Instance {instance_id} will re-benchmark at its next heartbeat."}


async def _logs_view(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    _instance_or_404(core, instance_id)
    tail_text = request.query.get("tail", "200")
    try:
        tail = int(tail_text)
    except ValueError:
        raise InvalidInput("'tail' must be an integer.", field="tail") from None
    if not 1 <= tail <= MAX_LOG_TAIL:
        raise InvalidInput(f"'tail' must be between 1 and {MAX_LOG_TAIL}.", field="tail")
    source = request.query.get("source") or None
    if source is not None and len(source) > 64:
        raise InvalidInput("'source' is longer than 64 characters.", field="source")
    return core.store.logs(instance_id, tail, source)


MAX_HISTORY_POINTS = 2000


async def _telemetry_history(core: Core, request: web.Request) -> Any:
    """The instance's downsampled heartbeat history (DESIGN 4), oldest first, with the
    latest telemetry appended when it is newer: what the dashboard's charts draw."""
    inst = _instance_or_404(core, _path_int(request, "id"))
    points_text = request.query.get("points", "500")
    try:
        max_points = int(points_text)
    except ValueError:
        raise InvalidInput("'points' must be an integer.", field="points") from None
    if not 2 <= max_points <= MAX_HISTORY_POINTS:
        raise InvalidInput(f"'points' must be between 2 and {MAX_HISTORY_POINTS}.",
                           field="points")
    points = [
        {"t": r["received_at"], "phase": r.get("phase"),
         "proofs_completed_total": r.get("proofs_completed_total"),
         "telemetry": loads(r.get("telemetry_json"))}
        for r in (core.store.heartbeat_history(inst["agent_id"]) if inst.get("agent_id") else [])
    ]
    latest = core.store.latest_telemetry(inst["id"])
    if latest is not None and (not points or latest["received_at"] > points[-1]["t"]):
        points.append({"t": latest["received_at"], "phase": inst.get("phase"),
                       "proofs_completed_total": inst.get("proofs_completed_total"),
                       "telemetry": loads(latest["telemetry_json"])})
    if len(points) > max_points:
        # Even stride over the history, always keeping the newest point.
        step = len(points) / max_points
        points = [points[int(i * step)] for i in range(max_points - 1)] + [points[-1]]
    return {"instance_id": inst["id"], "points": points}


async def _recent_events(core: Core, request: web.Request) -> Any:
    limit_text = request.query.get("limit", "100")
    try:
        limit = int(limit_text)
    except ValueError:
        raise InvalidInput("'limit' must be an integer.", field="limit") from None
    if not 1 <= limit <= 1000:
        raise InvalidInput("'limit' must be between 1 and 1000.", field="limit")
    return [event_view(e) for e in core.store.events(None, limit)]


async def _metrics(request: web.Request) -> web.Response:
    core = request.app[CORE]
    text = metrics.render_metrics(core.store, core.clock, core.guard)
    return web.Response(body=text.encode(), headers={"Content-Type": metrics.CONTENT_TYPE})


async def _host_perf(core: Core, request: web.Request) -> Any:
    return [host_perf_view(r) for r in core.store.host_perf()]


async def _bad_hosts(core: Core, request: web.Request) -> Any:
    return core.store.bad_hosts()


async def _add_bad_host(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    raw = body.get("machine_id")
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    machine_id = _text({"machine_id": raw}, "machine_id", required=True,
                       max_chars=MAX_LABEL_CHARS)
    reason = _text(body, "reason", required=False, max_chars=MAX_REASON_CHARS) or "by the operator"
    assert machine_id is not None
    now = core.clock()

    def job(tx: Tx) -> None:
        tx.add_bad_host(machine_id, reason=reason, source="operator", now=now)
        tx.insert_event(now, "bad_host", f"{machine_id}: {reason} (operator)",
                        machine_id=machine_id)

    await core.store.write(job)
    return {"ok": True, "machine_id": machine_id, "reason": reason,
            "message": f"Machine {machine_id} is on bad_hosts."}


async def _remove_bad_host(core: Core, request: web.Request) -> Any:
    machine_id = request.match_info["machine_id"]
    if core.store.bad_host(machine_id) is None:
        raise NotFound(f"Machine {machine_id!r} is not on bad_hosts.")
    now = core.clock()

    def job(tx: Tx) -> bool:
        removed = tx.remove_bad_host(machine_id)
        if removed:
            tx.insert_event(now, "bad_host_removed", f"{machine_id} removed by the operator",
                            machine_id=machine_id)
        return removed

    await core.store.write(job)
    return {"ok": True, "machine_id": machine_id,
            "message": f"Machine {machine_id} removed from bad_hosts."}


async def _scaling(core: Core, request: web.Request) -> Any:
    return [scaling_view(r) for r in core.store.scaling()]


def fleet_scaling_efficiency(reads: Reads) -> float | None:
    """Median multi-GPU efficiency the fleet measured, by the coordinator's own reading of
    results that count (never a host's own figure, nor a flagged result's)."""
    values = reads.trusted_scaling_efficiencies(policy.RANKING_EXCLUDING_FLAGS)
    return statistics.median(values) if values else None


async def _offers(core: Core, request: web.Request) -> Any:
    filter_text = request.query.get("filter") or None
    try:
        offers = await core.provider.search_offers(filter_text)
    except ValueError as err:  # the filter parser's FilterError
        raise InvalidInput(f"Bad filter: {err}", field="filter") from None
    bad_ids = [b["machine_id"] for b in core.store.bad_hosts()]
    try:
        from coordinator.ranking import rank_offers
    except ImportError:
        bad = set(bad_ids)
        known = {str(r["machine_id"]) for r in core.store.host_perf()}
        return [
            {**o, "bad_host": str(o.get("machine_id")) in bad,
             "known": str(o.get("machine_id")) in known, "predicted_rate_per_hour": None,
             "predicted_usd_per_proof": None, "prediction_basis": "explore"}
            for o in offers
        ]
    # vast.ai machine ids are integers; a bring-your-own label never matches an offer.
    numeric_bad = {int(m) for m in bad_ids if m.isdigit()}
    return rank_offers(offers, core.store.host_perf(), numeric_bad,
                       fleet_scaling_efficiency(core.store),
                       min_instance_ram_gb=core.settings.min_instance_ram_gb,
                       machine_ram_gb=core.store.instance_ram_by_machine())


async def _deploy(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    offer_id = _integer(body, "offer_id", required=True, minimum=0)
    assert offer_id is not None
    min_rate = _number(body, "min_rate_per_hour")
    disk_gb = _integer(body, "disk_gb", minimum=1, maximum=100_000)
    max_dph = _number(body, "max_dph_total")
    deployed = await core.deployer.deploy(
        offer_id, min_rate_per_hour=min_rate, disk_gb=disk_gb, max_dph_total=max_dph
    )
    return {"ok": True, "instance_id": deployed.instance_id,
            "provider_instance_id": deployed.provider_instance_id,
            "agent_id": deployed.agent_id, "message": deployed.message}


# --- the published API description -----------------------------------------------------


@functools.cache
def openapi_document() -> bytes:
    """docs/openapi.yaml as JSON (packaged as coordinator/data/openapi.json)."""
    return (importlib.resources.files("coordinator") / "data" / "openapi.json").read_bytes()


async def _openapi(request: web.Request) -> web.Response:
    # No token: the description holds no secret, and clients need it before they have one.
    return web.Response(body=openapi_document(), content_type="application/json")


# --- the application ------------------------------------------------------------------


def agent_lookup(reads: Reads) -> Callable[[str], AgentRecord | None]:
    """``AgentAuth``'s lookup: an agent's record from the store (None: never issued)."""

    def lookup(agent_id: str) -> AgentRecord | None:
        row = reads.get_agent(agent_id)
        return None if row is None else AgentRecord(agent_id, bool(row["revoked"]))

    return lookup


def create_app(
    settings: Settings,
    store: Store,
    provider: Provider,
    clock: policy.Clock = time.time,
    *,
    run_monitor: bool = True,
) -> web.Application:
    """The coordinator application. ``run_monitor=False`` leaves the loop to the caller
    (tests drive ``app[CORE].monitor.tick()`` with an injected clock)."""
    started_second = int(clock())

    auth = AgentAuth(settings.fleet_secrets, agent_lookup(store), not_before=started_second,
                     nonces_per_agent=settings.nonces_per_agent)
    auth.preload(store.agent_states())
    tracker = HeartbeatTracker(settings.silence_ttl_s)
    monitor = Monitor(settings, store, provider, clock, tracker,
                      on_agent_revoked=auth.mark_revoked)
    monitor.seed(clock())
    guard = Guard(clock, settings.admin_failures_per_minute)
    core = Core(settings, store, provider, clock, auth, tracker, monitor,
                Deployer(settings, store, provider, clock, destroy=monitor.destroy), guard,
                float(started_second))

    # Bodies are read (and bounded) by read_body, so aiohttp's own limit never answers first.
    app = web.Application(middlewares=[error_middleware], client_max_size=2 * MAX_BODY_BYTES)
    app[CORE] = core

    app.router.add_post("/v1/hello", agent_endpoint(_hello))
    app.router.add_post("/v1/heartbeat", agent_endpoint(_heartbeat))
    app.router.add_post("/v1/result", agent_endpoint(_result))
    app.router.add_post("/v1/logs", agent_endpoint(_logs))

    op = operator_endpoint
    app.router.add_post("/api/agents", op(_issue_agent))
    app.router.add_post("/api/agents/{agent_id}/revoke", op(_revoke_agent))
    app.router.add_get("/api/instances", op(_list_instances))
    app.router.add_get("/api/instances/{id}", op(_get_instance))
    app.router.add_post("/api/instances/{id}/destroy", op(_destroy_instance))
    app.router.add_post("/api/instances/{id}/rebenchmark", op(_rebenchmark))
    app.router.add_get("/api/instances/{id}/logs", op(_logs_view))
    app.router.add_get("/api/host-perf", op(_host_perf))
    app.router.add_get("/api/bad-hosts", op(_bad_hosts))
    app.router.add_post("/api/bad-hosts", op(_add_bad_host))
    app.router.add_delete("/api/bad-hosts/{machine_id}", op(_remove_bad_host))
    app.router.add_get("/api/scaling", op(_scaling))
    app.router.add_get("/api/offers", op(_offers))
    app.router.add_post("/api/deploy", op(_deploy))
    app.router.add_get("/api/instances/{id}/telemetry-history", op(_telemetry_history))
    app.router.add_get("/api/events", op(_recent_events))
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/openapi.json", _openapi)
    setup_dashboard(app, admin_token=settings.admin_token, session_ttl_s=settings.session_ttl_s,
                    clock=clock, throttle=guard.credentials, on_refused=guard.refused)

    if run_monitor:
        app.cleanup_ctx.append(_monitor_ctx)
    return app


async def _monitor_ctx(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[CORE].monitor.run(), name="coordinator-monitor")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
