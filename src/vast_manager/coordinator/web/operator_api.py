"""The operator API (docs/protocol.md, docs/openapi.yaml): bearer-token endpoints over the
core (deploy, destroy, offers, hosts, scaling, logs) and ``/metrics``."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, overload

import orjson
from aiohttp import web

from vast_manager.common.hardware_facts import GPU_SPECS, canonical_gpu_name
from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.decisions.earnings import break_even_usd_per_proof
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.exceptions import (
    CoordinatorError,
    InstanceGone,
    InvalidInput,
    NotFound,
    Refusal,
    error_body,
    http_status,
)
from vast_manager.coordinator.operations import faults, preflight, spend
from vast_manager.coordinator.operations import operator_commands as ops
from vast_manager.coordinator.operations.cluster import NO_FLEET_DELIVERED
from vast_manager.coordinator.operations.deploy import mint_agent_id
from vast_manager.coordinator.operations.hello import LEGACY_MAX_GPUS
from vast_manager.coordinator.providers.base import ProviderError
from vast_manager.coordinator.store.migrations import Row, loads
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.textsafe import has_unsafe
from vast_manager.coordinator.web import metrics, production_api
from vast_manager.coordinator.web.core import CORE, Core
from vast_manager.coordinator.web.dashboard import authorize_operator
from vast_manager.coordinator.web.http import (
    error_response,
    json_response,
    read_body,
    refusal_response,
)
from vast_manager.coordinator.web.json_views import (
    VIEW_COLUMNS,
    CostBasis,
    event_view,
    fault_view,
    finish_view,
    fleet_view,
    host_perf_view,
    instance_view,
    production_view,
    result_view,
    scaling_view,
)
from vast_manager.coordinator.web.production_api import authorize_production
from vast_manager.protocol import signing

log = logging.getLogger(__name__)

MAX_LOG_TAIL = 10000
MAX_LABEL_CHARS = 200
MAX_REASON_CHARS = 1000
#: The most instances one page of ``GET /api/instances`` holds.
MAX_INSTANCE_PAGE = 10_000
#: What the tables show for a proving instance that completes nothing (docs/operations.md,
#: "Idle"): a state filter may name it as it names the states.
IDLE = "idle"
#: The instance states a state filter may name, and ``idle``.
KNOWN_STATES: tuple[str, ...] = (*tuple(State), IDLE)
#: The parameters ``GET /api/instances`` takes (anything else is refused).
INSTANCE_LIST_PARAMETERS = ("state", "limit", "after_id", "gone_since")


async def _json_object(request: web.Request) -> dict[str, Any]:
    # The operator's bodies are small; they are read whole here, once the token is known
    # (the middleware checked it), and count against the same budget while read.
    budget = request.config_dict[CORE].guard.budget
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


@overload
def _query_int(request: web.Request, name: str, *, default: int,
               minimum: int, maximum: int) -> int: ...


@overload
def _query_int(request: web.Request, name: str, *, default: None,
               minimum: int, maximum: int) -> int | None: ...


def _query_int(request: web.Request, name: str, *, default: int | None,
               minimum: int, maximum: int) -> int | None:
    """The integer query parameter ``name`` (``default`` when absent), within bounds."""
    given = request.query.getall(name, [])
    if not given:
        return default
    if len(given) > 1:
        raise InvalidInput(f"'{name}' is given more than once.", field=name)
    try:
        value = int(given[0])
    except ValueError:
        raise InvalidInput(f"'{name}' must be an integer.", field=name) from None
    if not minimum <= value <= maximum:
        raise InvalidInput(f"'{name}' must be between {minimum} and {maximum}.", field=name)
    return value


def _query_states(request: web.Request) -> tuple[str, ...] | None:
    """The states of ``?state=`` (comma-separated, or the parameter repeated), each a known
    one, in the order first named; None when the parameter is absent."""
    given = request.query.getall("state", [])
    if not given:
        return None
    named = [part.strip() for value in given for part in value.split(",")]
    for state in named:
        if not state:
            raise InvalidInput("'state' must name one or more states, comma-separated.",
                               field="state")
        if state not in KNOWN_STATES:
            raise InvalidInput(f"'state' must be among {', '.join(KNOWN_STATES)}; "
                               f"{state[:64]!r} is not.", field="state")
    return tuple(dict.fromkeys(named))


def _only_parameters(request: web.Request, allowed: tuple[str, ...]) -> None:
    """Refuse a query parameter the endpoint does not take (a misspelt ``limit`` would
    otherwise answer with the whole fleet)."""
    for name in request.query:
        if name not in allowed:
            takes = ", ".join(allowed[:-1]) + f" and {allowed[-1]}" if allowed[1:] else allowed[0]
            raise InvalidInput(f"Unknown parameter {name[:64]!r}; {request.path} takes "
                               f"{takes}.", field=name[:64])


def _path_int(request: web.Request, name: str) -> int:
    text = request.match_info[name]
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"'{name}' must be an integer.", field=name) from None
    if not -(2**63) <= value < 2**63:
        raise InvalidInput(f"'{name}' is out of range.", field=name)
    return value


def cost_basis(core: Core) -> CostBasis:
    """The settings and the time the views' cost figures are computed with."""
    return CostBasis(now=core.clock(), setup_download_gb=core.settings.setup_download_gb,
                     kept_hours=core.settings.plan_horizon_hours)


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
        core = request.config_dict[CORE]
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



async def _issue_agent(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    label = _text(body, "label", required=True, max_chars=MAX_LABEL_CHARS)
    assert label is not None
    min_rate = _number(body, "min_rate_per_hour")
    # The GPUs its hello may list, declared once (docs/reliability.md, "No rate on a
    # host's word alone").
    gpus = _integer(body, "gpus", maximum=LEGACY_MAX_GPUS) or 1
    gpu_model_text = _text(body, "gpu_model", required=False, max_chars=64)
    gpu_model = canonical_gpu_name(gpu_model_text) if gpu_model_text else None
    if gpu_model is not None and gpu_model not in GPU_SPECS:
        raise InvalidInput(f"Field 'gpu_model' names no GPU model this coordinator knows "
                           f"({gpu_model_text!r}); known: {', '.join(sorted(GPU_SPECS))}.",
                           field="gpu_model")
    agent_id = mint_agent_id()
    key = signing.derive_agent_key(core.settings.newest_secret, agent_id)
    now = core.clock()

    await core.store.write(ops.issue_agent_job(agent_id, label=label, min_rate_per_hour=min_rate,
                                               max_gpus=gpus, gpu_model=gpu_model, now=now))
    # The one answer that carries a key: it is the operator's to hand over.
    return {"agent_id": agent_id, "agent_key": key.hex(),
            "coordinator_url": core.settings.coordinator_url}


async def _revoke_agent(core: Core, request: web.Request) -> Any:
    agent_id = request.match_info["agent_id"]
    if not signing.is_agent_id(agent_id) or core.store.get_agent(agent_id) is None:
        raise NotFound(f"No agent {agent_id!r}.")
    now = core.clock()
    changed = await core.store.write(ops.revoke_agent_job(agent_id, now))
    core.auth.mark_revoked(agent_id)
    core.monitor.wake()
    message = f"Agent {agent_id} revoked." if changed else f"Agent {agent_id} was already revoked."
    return {"ok": True, "agent_id": agent_id, "revoked": True, "message": message}


def _json_bytes(body: bytes) -> web.Response:
    """An answer encoded on the reader thread (a fleet-sized list is encoded there too)."""
    return web.Response(body=body, content_type="application/json")


async def _list_instances(core: Core, request: web.Request) -> Any:
    """Instances by id: all of them, or with ``limit`` a page whose ``Link: <...>;
    rel="next"`` names the next (``after_id`` = the page's last id) while more follow;
    ``state`` keeps those in the states it names. Read and encoded on the reader thread."""
    _only_parameters(request, INSTANCE_LIST_PARAMETERS)
    states = _query_states(request)
    limit = _query_int(request, "limit", default=None, minimum=1, maximum=MAX_INSTANCE_PAGE)
    after_id = _query_int(request, "after_id", default=None, minimum=0, maximum=2**63 - 1)
    # Gone instances only if they went at or after this unix time (status: the last day's).
    gone_since = _query_int(request, "gone_since", default=None, minimum=0,
                            maximum=2**40)
    id_at = VIEW_COLUMNS.index("id")
    basis = cost_basis(core)

    # ``idle`` is a proving instance that completes nothing: read as proving, then told
    # apart (and ``proving`` then means the proving ones that are not idle).
    read_states = (None if states is None else
                   tuple(dict.fromkeys(State.PROVING if s == IDLE else s for s in states)))

    def page(reads: Reads) -> tuple[bytes, int | None]:
        # One row past the page tells whether another follows. Only the view's columns,
        # and one dict a row built from the row's values.
        rows = reads.instance_values(VIEW_COLUMNS, states=read_states, after_id=after_id,
                                     limit=None if limit is None else limit + 1,
                                     gone_since=gone_since)
        more = limit is not None and len(rows) > limit
        if more:
            del rows[limit:]
        produced = core.monitor.production.view
        views = [production_view(
            finish_view(dict(zip(VIEW_COLUMNS, values, strict=True)), basis),
            produced(values[id_at]), core.started_at) for values in rows]
        if states is not None:
            views = [v for v in views if (IDLE if v["idle"] else v["state"]) in states]
        return orjson.dumps(views), int(rows[-1][id_at]) if more else None

    body, last_id = await core.store.read(page)
    response = _json_bytes(body)
    if last_id is not None:
        query = [("state", ",".join(states))] if states else []
        query += [("gone_since", str(gone_since))] if gone_since is not None else []
        query += [("limit", str(limit)), ("after_id", str(last_id))]
        response.headers["Link"] = (f"<{request.path}?{urllib.parse.urlencode(query)}>; "
                                    'rel="next"')
    return response


async def _fleet(core: Core, request: web.Request) -> Any:
    production = core.monitor.production
    view = await core.store.read(lambda reads: fleet_view(
        reads.instances_by_state(), production.idle_totals(),
        production.completed_total_per_hour()))
    # The break-even $/proof the minimum rates come from (the offers chart draws it).
    open_faults = await core.store.read(lambda reads: reads.fleet_faults(open_only=True))
    now = core.clock()
    spent = await core.store.read(lambda reads: spend.spend_view(reads, now))
    return {**view, **NO_FLEET_DELIVERED, **production.fleet_delivered,
            "cluster": core.monitor.cluster.view(),
            "account": core.monitor.account.view().as_dict(),
            "spend": spent,
            # Why deploys and the autopilot wait now (the account or a fault), or None.
            "deploys_paused": faults.pause_reason(core.monitor.account, core.store),
            "faults": [fault_view(r) for r in open_faults],
            "replica": core.runtime.replica_health().as_dict(core.clock()),
            "offer_cache": core.offers.view(),
            "pending_price_increases": list(core.monitor.price_increases.pending.values()),
            "max_usd_per_proof": break_even_usd_per_proof(core.settings),
            "max_deploy_dph_total": core.settings.max_deploy_dph_total,
            "provider": core.provider.name}



#: Results an instance view holds at most (``results_limit``'s default and bound): a
#: view of a flooded instance reads one page, never every row (docs/reliability.md).
RESULTS_PAGE = 20
RESULTS_PAGE_MAX = 200


async def _get_instance(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    basis = cost_basis(core)
    limit = _query_int(request, "results_limit", default=RESULTS_PAGE, minimum=1,
                       maximum=RESULTS_PAGE_MAX)
    before = _query_int(request, "results_before", default=None, minimum=1,
                        maximum=2**63 - 1)

    def detail(reads: Reads) -> dict[str, Any] | None:
        inst = reads.get_instance(instance_id)
        if inst is None:
            return None
        out = production_view(instance_view(inst, basis),
                              core.monitor.production.view(instance_id), core.started_at)
        out["host"] = loads(inst.get("host_json"))
        page, total, older = reads.results_page(instance_id, limit, before)
        out["results"] = [result_view(r) for r in page]
        out["results_total"] = total
        out["results_next"] = older  # the next (older) page's results_before; null: none
        out["events"] = [event_view(e) for e in reads.events(instance_id)]
        tele = reads.latest_telemetry(instance_id)
        out["telemetry"] = loads(tele["telemetry_json"]) if tele else None
        out["telemetry_at"] = tele["received_at"] if tele else None
        return out

    out = await core.store.read(detail)
    if out is None:
        raise NotFound(f"No instance {instance_id}.")
    return out


async def _destroy_instance(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    inst = _instance_or_404(core, instance_id)
    if inst["state"] in states.GONE:
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
    if inst["state"] in states.ENDING:
        raise InstanceGone(f"Instance {instance_id} is {inst['state']}; it cannot re-benchmark.")
    now = core.clock()

    await core.store.write(ops.rebenchmark_job(inst, now))
    return {"ok": True,
            "message": f"Instance {instance_id} will re-benchmark at its next heartbeat."}


async def _logs_view(core: Core, request: web.Request) -> Any:
    instance_id = _path_int(request, "id")
    _instance_or_404(core, instance_id)
    tail = _query_int(request, "tail", default=200, minimum=1, maximum=MAX_LOG_TAIL)
    source = request.query.get("source") or None
    if source is not None and len(source) > 64:
        raise InvalidInput("'source' is longer than 64 characters.", field="source")
    return await core.store.read(lambda reads: reads.logs(instance_id, tail, source))


MAX_HISTORY_POINTS = 2000


async def _telemetry_history(core: Core, request: web.Request) -> Any:
    """The instance's downsampled heartbeat history (docs/architecture.md), oldest first, with the
    latest telemetry appended when it is newer: what the dashboard's charts draw."""
    inst = _instance_or_404(core, _path_int(request, "id"))
    max_points = _query_int(request, "points", default=500, minimum=2,
                            maximum=MAX_HISTORY_POINTS)

    def history(reads: Reads) -> list[dict[str, Any]]:
        rows = reads.heartbeat_history(inst["agent_id"]) if inst.get("agent_id") else []
        points = [
            {"t": r["received_at"], "phase": r.get("phase"),
             "proofs_completed_total": r.get("proofs_completed_total"),
             "telemetry": loads(r.get("telemetry_json"))}
            for r in rows
        ]
        latest = reads.latest_telemetry(inst["id"])
        if latest is not None and (not points or latest["received_at"] > points[-1]["t"]):
            points.append({"t": latest["received_at"], "phase": inst.get("phase"),
                           "proofs_completed_total": inst.get("proofs_completed_total"),
                           "telemetry": loads(latest["telemetry_json"])})
        return points

    points = await core.store.read(history)
    if len(points) > max_points:
        # Even stride over the history, always keeping the newest point.
        step = len(points) / max_points
        points = [points[int(i * step)] for i in range(max_points - 1)] + [points[-1]]
    return {"instance_id": inst["id"], "points": points}


async def _recent_events(core: Core, request: web.Request) -> Any:
    limit = _query_int(request, "limit", default=100, minimum=1, maximum=1000)
    return await core.store.read(lambda reads: [event_view(e) for e in reads.events(None, limit)])


async def _metrics(request: web.Request) -> web.Response:
    core = request.config_dict[CORE]
    # The guard's counters and the tracker's counts are copied here, on the loop whose
    # requests change them.
    now, guard = core.clock(), metrics.GuardCounts.of(core.guard)
    paced = metrics.PaceFigures(core.tracker.load(), core.settings)
    bill = metrics.BillFigures(core.monitor.account.view(),
                               core.settings.autopilot_spend_window_h * 3600.0,
                               core.offers.view())
    replica = core.runtime.replica_health()
    body = await core.store.read(lambda reads: metrics.exposition(
        reads, now, guard, paced, bill, core.monitor.production, replica))
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})


async def _host_perf(core: Core, request: web.Request) -> Any:
    # One row a measured machine: fleet-sized, so read and encoded on the reader thread.
    return _json_bytes(await core.store.read(
        lambda reads: orjson.dumps([host_perf_view(r) for r in reads.host_perf()])))


async def _bad_hosts(core: Core, request: web.Request) -> Any:
    rows = await core.store.read(lambda reads: reads.bad_hosts())
    # vast.ai's renter reports on each blocked machine, as last read: the block's evidence.
    reports = core.monitor.machine_reports.by_machine
    return [{**r, "renter_reports": reports.get(str(r["machine_id"]), [])} for r in rows]


async def _add_bad_host(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    raw = body.get("machine_id")
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    machine_id = _text({"machine_id": raw}, "machine_id", required=True,
                       max_chars=MAX_LABEL_CHARS)
    reason = _text(body, "reason", required=False, max_chars=MAX_REASON_CHARS) or "by the operator"
    # Every block ends (docs/policy.md, "Blame"): unless the operator says, as a strikes block.
    hours = _number(body, "hours")
    if hours is not None and hours > 24 * 366:
        raise InvalidInput("Field 'hours' must be at most 8784 (a year).", field="hours")
    block_s = core.settings.strike_block_s if hours is None else hours * 3600.0
    assert machine_id is not None
    now = core.clock()

    await core.store.write(ops.add_bad_host_job(machine_id, reason, now, block_s))
    return {"ok": True, "machine_id": machine_id, "reason": reason, "expires_at": now + block_s,
            "message": f"Machine {machine_id} is on bad_hosts for {block_s / 3600:.0f} h."}


async def _forgive_bad_host(core: Core, request: web.Request) -> Any:
    machine_id = request.match_info["machine_id"]
    now = core.clock()
    if not await core.store.write(ops.forgive_job(machine_id, now)):
        raise NotFound(f"Machine {machine_id!r} has no block and no strike to forgive.")
    return {"ok": True, "machine_id": machine_id,
            "message": f"Machine {machine_id} forgiven: its block lifted, its strikes taken back."}


async def _preflight(core: Core, request: web.Request) -> Any:
    """Every preflight check of the configuration as it is now (nothing is deployed)."""
    checks = await preflight.run(core.settings)
    refused = preflight.refusal(checks)
    return {"ok": refused is None, "checks": [c.as_dict() for c in checks],
            "message": refused or "Preflight passed: nothing checked failed."}


async def _faults(core: Core, request: web.Request) -> Any:
    return await core.store.read(lambda reads: [fault_view(r) for r in reads.fleet_faults()])


async def _clear_fault(core: Core, request: web.Request) -> Any:
    raw = request.match_info["fault_id"]
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"Fault id must be a whole number, got {raw[:40]!r}.", field="id")
    body = await _json_object(request)
    note = _text(body, "note", required=False, max_chars=MAX_REASON_CHARS) or "fixed"
    assert note is not None
    now = core.clock()
    if not await core.store.write(ops.clear_fault_job(int(raw), note, now)):
        raise NotFound(f"No open fault {raw}.")
    return {"ok": True, "fault_id": int(raw),
            "message": f"Fault {raw} cleared: deploys and the autopilot resume."}


async def _remove_bad_host(core: Core, request: web.Request) -> Any:
    machine_id = request.match_info["machine_id"]
    if core.store.bad_host(machine_id) is None:
        raise NotFound(f"Machine {machine_id!r} is not on bad_hosts.")
    now = core.clock()

    await core.store.write(ops.remove_bad_host_job(machine_id, now))
    return {"ok": True, "machine_id": machine_id,
            "message": f"Machine {machine_id} removed from bad_hosts."}


async def _scaling(core: Core, request: web.Request) -> Any:
    return await core.store.read(lambda reads: [scaling_view(r) for r in reads.scaling()])


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


async def _production(core: Core, request: web.Request) -> Any:
    return await production_api.report_production(core, request, await _json_object(request))


async def _refusal(request: web.Request) -> web.Response | None:
    """The answer refusing a request without the admin token or a dashboard session
    (counted by the guard), or None when it may proceed."""
    core = request.config_dict[CORE]
    try:
        authorize_operator(request, core.settings.admin_token)
    except Refusal as err:
        core.guard.refused(err.code)
        return refusal_response(err)
    return None


@web.middleware
async def operator_auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """The operators' sub-application admits only the admin token or a dashboard session,
    checked before routing (an unknown /api path is a 401 to a stranger, as any other).
    ``/api`` alone is no operator path: it is answered as any unknown path."""
    if request.path == production_api.PATH and request.method == "POST":
        try:
            authorize_production(request, request.config_dict[CORE].settings.production_token)
        except Refusal as err:
            request.config_dict[CORE].guard.refused(err.code)
            return refusal_response(err)
    elif request.path.startswith("/api/"):
        refused = await _refusal(request)
        if refused is not None:
            return refused
    return await handler(request)


async def _guarded_metrics(request: web.Request) -> web.Response:
    """``/metrics`` for the operator only (unless ``metrics_public``)."""
    refused = await _refusal(request)
    return refused if refused is not None else await _metrics(request)


def operators_app() -> web.Application:
    """The operators' sub-application, mounted at ``/api``: every route behind
    ``operator_auth`` (the discovery routes too, ``discovery_api.add_routes``)."""
    app = web.Application(middlewares=[operator_auth])
    op = operator_endpoint
    app.router.add_post("/agents", op(_issue_agent))
    app.router.add_post("/agents/{agent_id}/revoke", op(_revoke_agent))
    app.router.add_get("/instances", op(_list_instances))
    app.router.add_get("/fleet", op(_fleet))
    app.router.add_get("/instances/{id}", op(_get_instance))
    app.router.add_post("/instances/{id}/destroy", op(_destroy_instance))
    app.router.add_post("/instances/{id}/rebenchmark", op(_rebenchmark))
    app.router.add_get("/instances/{id}/logs", op(_logs_view))
    app.router.add_get("/host-perf", op(_host_perf))
    app.router.add_get("/bad-hosts", op(_bad_hosts))
    app.router.add_post("/bad-hosts", op(_add_bad_host))
    app.router.add_delete("/bad-hosts/{machine_id}", op(_remove_bad_host))
    app.router.add_post("/bad-hosts/{machine_id}/forgive", op(_forgive_bad_host))
    app.router.add_get("/faults", op(_faults))
    app.router.add_post("/preflight", op(_preflight))
    app.router.add_post("/faults/{fault_id}/clear", op(_clear_fault))
    app.router.add_get("/scaling", op(_scaling))
    app.router.add_post("/deploy", op(_deploy))
    app.router.add_get("/instances/{id}/telemetry-history", op(_telemetry_history))
    app.router.add_get("/events", op(_recent_events))
    app.router.add_post("/production", op(_production))
    return app


def metrics_handler(core: Core) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``/metrics`` (served beside the sub-applications): public only when
    ``metrics_public`` says so."""
    return _metrics if core.settings.metrics_public else _guarded_metrics
