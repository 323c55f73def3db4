"""The operator API of discovery (docs/discovery.md): offers with predicted intervals, the
plan, measurements in and out, the rate model, and the autopilot's switch.

Handlers only read, check and call: predictions and plans run on a worker thread (the
model is the latest fit, ``operations.model_keeper``; never fitted per request), imports
are one transaction, and the autopilot's actions are its own (``operations.autopilot``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from vast_manager.coordinator.decisions import belief
from vast_manager.coordinator.discovery.measurements import (
    MAX_IMPORT_BYTES,
    NDJSON,
    LineError,
    Measurement,
    parse_lines,
)
from vast_manager.coordinator.discovery.plan import MeasuredOffer, Plan, Proposal
from vast_manager.coordinator.discovery.ranking import prediction_fields, rank_offers
from vast_manager.coordinator.exceptions import InvalidInput, InvalidMeasurement
from vast_manager.coordinator.operations.autopilot_loop import deployable, fleet_instances, plan_for
from vast_manager.coordinator.operations.hosts_import import import_job, measurement_row
from vast_manager.coordinator.operations.model_keeper import fit_rows
from vast_manager.coordinator.operations.offer_cache import OfferAnswer
from vast_manager.coordinator.providers.vast.filters import parse_filter
from vast_manager.coordinator.store.migrations import Row, loads
from vast_manager.coordinator.textsafe import has_unsafe
from vast_manager.coordinator.web.core import Core
from vast_manager.coordinator.web.http import read_body
from vast_manager.coordinator.web.json_views import event_view
from vast_manager.coordinator.web.operator_api import _json_object, _text

Handler = Callable[[Core, web.Request], Awaitable[Any]]

MAX_TRIALS = 100
_IMPORT_LOCK = web.AppKey("hosts_import_lock", asyncio.Lock)


def _query_number(request: web.Request, name: str, *, integer: bool,
                  minimum: float, maximum: float) -> float | None:
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InvalidInput(f"'{name}' must be {kind}.", field=name) from None
    if not minimum <= value <= maximum:
        raise InvalidInput(f"'{name}' must be between {minimum:g} and {maximum:g}.", field=name)
    return value


async def _search(core: Core, filter_text: str | None) -> OfferAnswer:
    """The offers through the one cache (``operations.offer_cache``), with their age."""
    try:
        if filter_text:
            parse_filter(filter_text)  # refused alike whichever provider answers
        return await core.offers.search(filter_text)
    except ValueError as err:  # the filter parser's FilterError
        raise InvalidInput(f"Bad filter: {err}", field="filter") from None


# --- offers and the plan -------------------------------------------------------------------


async def offers(core: Core, request: web.Request) -> Any:
    answer = await _search(core, request.query.get("filter") or None)
    found = answer.offers
    fitted = await core.models.current()
    bad = [str(b["machine_id"]) for b in core.store.bad_hosts(core.clock())]
    known = core.store.measured_machines()
    ranked = await asyncio.to_thread(rank_offers, found, fitted.model, bad, known,
                                     min_instance_ram_gb=core.settings.min_instance_ram_gb,
                                     setup_download_gb=core.settings.setup_download_gb,
                                     kept_hours=core.settings.plan_horizon_hours)
    # Each row says how old the offers are (a list answer has no room for one label).
    fresh = {**core.models.freshness(fitted), **answer.fields()}
    return [{**row, **fresh} for row in ranked]


def proposal_view(p: Proposal) -> dict[str, Any]:
    o = p.offer
    return {
        "offer_id": p.offer_id,
        "machine_id": p.machine_id,
        "gpu_name": o.raw.get("gpu_name"),
        "num_gpus": o.raw.get("num_gpus"),
        "geolocation": o.raw.get("geolocation"),
        "dph_total": p.dph_total,
        **prediction_fields(p.prediction, p.hourly.total or p.dph_total),
        "usd_per_hour": p.hourly.as_dict(),
        "trial_cost": p.trial.as_dict(4),
        "break_even_rate_per_hour": round(p.break_even_rate_per_hour, 3),
        "break_even_vs_reference": round(p.break_even_vs_reference, 3),
        "break_even_vs_best": None if p.break_even_vs_best is None
        else round(p.break_even_vs_best, 3),
        "probability_passes": round(p.probability_passes, 4),
        "probability_beats_best": None if p.probability_beats_best is None
        else round(p.probability_beats_best, 4),
        "probability_worth_keeping": round(p.probability_worth_keeping, 4),
        "trial_hours": round(p.trial_hours, 3),
        "trial_cost_usd": round(p.trial_cost_usd, 4),
        "expected_saving_per_hour_usd": round(p.expected_saving_per_hour_usd, 4),
        "expected_value_usd": round(p.expected_value_usd, 4),
        "hypothesis": p.hypothesis,
    }


def measured_view(m: MeasuredOffer) -> dict[str, Any]:
    o = m.offer
    return {
        "offer_id": m.offer_id,
        "machine_id": m.machine_id,
        "gpu_name": o.raw.get("gpu_name"),
        "num_gpus": o.raw.get("num_gpus"),
        "dph_total": m.dph_total,
        **prediction_fields(m.prediction, m.hourly.total or m.dph_total),
        "usd_per_hour": m.hourly.as_dict(),
        "worth_deploying": m.worth_deploying,
    }


def plan_view(plan: Plan, best: float | None, target: float | None) -> dict[str, Any]:
    return {
        "proposals": [proposal_view(p) for p in plan.proposals],
        "measured": [measured_view(m) for m in plan.measured],
        "considered": plan.considered,
        "worth_trying": plan.worth_trying,
        "reference_usd_per_proof": plan.reference_usd_per_proof,
        "reference_source": plan.reference_source,
        "best_usd_per_proof": best,
        "target_rate_per_hour": target,
        "stop_reason": plan.stop_reason,
    }


async def plan(core: Core, request: web.Request) -> Any:
    trials = _query_number(request, "trials", integer=True, minimum=1, maximum=MAX_TRIALS)
    budget = _query_number(request, "budget_usd", integer=False, minimum=0.0,
                           maximum=1_000_000.0)
    answer = await _search(core, request.query.get("filter") or None)
    found = deployable(answer.offers, core.settings)
    fitted = await core.models.current()
    rows = await core.store.read(lambda r: r.active_instances())
    busy = frozenset(str(r["machine_id"]) for r in rows if r["machine_id"] is not None)
    bad = frozenset(str(b["machine_id"]) for b in core.store.bad_hosts(core.clock()))
    target = core.autopilot.caps.target_rate_per_hour if core.autopilot.caps else None
    idle = frozenset(core.monitor.production.idle_ids())
    delivered = core.monitor.production.settled_rates()

    def work() -> dict[str, Any]:
        fleet = fleet_instances(rows, fitted.model, idle, delivered)
        made = plan_for(found, fitted.model, fleet, target_rate_per_hour=target, busy=busy,
                        bad=bad, settings=core.settings, trials=int(trials or 5),
                        budget_usd=budget)
        best = min((i.usd_per_proof for i in fleet if i.rate_per_hour and not i.leaving),
                   default=None)
        return {**plan_view(made, best, target), "model": fitted.summary(),
                "horizon_hours": core.settings.plan_horizon_hours,
                **core.models.freshness(fitted), **answer.fields()}

    return await asyncio.to_thread(work)


async def model(core: Core, request: web.Request) -> Any:
    fitted = await core.models.current()
    return {**fitted.summary(), **core.models.freshness(fitted)}


# --- measurements in and out ---------------------------------------------------------------


#: Offers a dry run lists (those whose rank moves most).
DRY_RUN_MOVES = 20


def ranking_moves(before: list[dict[str, Any]], after: list[dict[str, Any]],
                  limit: int = DRY_RUN_MOVES) -> list[dict[str, Any]]:
    """The offers whose rank or predicted rate an import would change, most moved first."""
    rank_after = {o["id"]: (i, o) for i, o in enumerate(after)}
    moves = []
    for i, o in enumerate(before):
        j, new = rank_after.get(o["id"], (None, None))
        if new is None:
            continue
        rate_before, rate_after = o.get("predicted_rate_per_hour"), new.get(
            "predicted_rate_per_hour")
        if j == i and rate_before == rate_after:
            continue
        moves.append({"offer_id": o["id"], "machine_id": o.get("machine_id"),
                      "gpu_name": o.get("gpu_name"), "num_gpus": o.get("num_gpus"),
                      "rank_before": i + 1, "rank_after": j + 1 if j is not None else None,
                      "rate_before": rate_before, "rate_after": rate_after})
    moves.sort(key=lambda m: (-abs(m["rank_before"] - (m["rank_after"] or 0)),
                              m["rank_before"]))
    return moves[:limit]


async def _dry_run(core: Core, found: list[Measurement], now: float) -> dict[str, Any]:
    """How the ranking would move with ``found`` imported, nothing written."""
    offers_now = (await _search(core, None)).offers
    fitted = await core.models.current()
    rows = await core.store.read(lambda r: r.measurements())
    bad = [str(b["machine_id"]) for b in core.store.bad_hosts()]
    known = core.store.measured_machines()
    extra = [{**measurement_row(m, now), "id": None} for m in found]

    def work() -> dict[str, Any]:
        after = fit_rows([*rows, *extra], fitted.version, now)
        min_ram = core.settings.min_instance_ram_gb
        ranked_before = rank_offers(offers_now, fitted.model, bad, known,
                                    min_instance_ram_gb=min_ram)
        ranked_after = rank_offers(offers_now, after.model, bad,
                                   known | {m.machine_id for m in found},
                                   min_instance_ram_gb=min_ram)
        return {"ok": True, "dry_run": True, "imported": 0, "duplicates": 0,
                "measurements": len(found),
                "moves": ranking_moves(ranked_before, ranked_after),
                "message": f"Dry run: {len(found)} measurement(s) read; nothing was written."}

    return await asyncio.to_thread(work)


async def hosts_import(core: Core, request: web.Request) -> Any:
    app = request.config_dict
    dry_run = request.query.get("dry_run", "") in ("1", "true")
    async with app[_IMPORT_LOCK]:  # one at a time: one body of the limit in memory
        raw, _ = await read_body(request, limit=MAX_IMPORT_BYTES)
        now = core.clock()
        try:
            found = await asyncio.to_thread(
                parse_lines, raw, now=now,
                max_rate_per_gpu_per_hour=core.settings.max_rate_per_gpu_per_hour,
                is_unsafe_text=has_unsafe, ceiling_per_gpu=belief.ceiling_per_gpu)
        except LineError as err:
            raise InvalidMeasurement(err.message[0].upper() + err.message[1:],
                                     field=err.field or None, line=err.line) from None
        if not found:
            raise InvalidInput("The body holds no measurement (JSON Lines, one a line).",
                               field="body")
        if dry_run:
            return await _dry_run(core, found, now)
        lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
        answer = await core.store.write(import_job(found, now, lines))
        # Every later answer uses what was imported: the import returns once the model
        # is refitted on it (on a worker thread; the event loop keeps serving).
        fitted = await core.models.refresh()
    answer["model"] = {"fitted_at": fitted.fitted_at, "fit_seconds": round(fitted.fit_seconds, 3),
                       "measurements_used": fitted.measurements_used}
    answer["message"] += (f" The rate model was refitted on {fitted.measurements_used} "
                          f"measurement(s) in {fitted.fit_seconds:.1f} s.")
    return answer


def export_record(row: Row) -> dict[str, Any]:
    """A stored measurement as its ``hosts export`` line (the shape ``hosts import`` reads)."""
    out = {"machine_id": row["machine_id"], "offer": loads(row["offer_json"]),
           "rate_per_hour": row["rate_per_hour"], "measured_at": row["measured_at"],
           "source": row["source"]}
    if row.get("bottleneck") is not None:
        out["bottleneck"] = row["bottleneck"]
    return out


async def hosts_export(core: Core, request: web.Request) -> Any:
    source = request.query.get("source") or None
    if source not in (None, "fleet", "imported"):
        raise InvalidInput("'source' must be fleet or imported.", field="source")
    rows = await core.store.read(lambda r: r.measurements(source))

    def lines() -> bytes:
        return b"".join(orjson.dumps(export_record(r)) + b"\n" for r in rows)

    return web.Response(body=await asyncio.to_thread(lines), content_type=NDJSON)


# --- the autopilot ---------------------------------------------------------------------------

MAX_REASON_CHARS = 1000


async def autopilot(core: Core, request: web.Request) -> Any:
    limit = _query_number(request, "limit", integer=True, minimum=1, maximum=1000) or 50
    out = core.autopilot.view()
    out["events"] = [event_view(e) for e in await core.store.read(
        lambda r: r.events_of_kind("autopilot", int(limit)))]
    return out


async def autopilot_stop(core: Core, request: web.Request) -> Any:
    body = await _json_object(request)
    reason = _text(body, "reason", required=False, max_chars=MAX_REASON_CHARS) or "no reason given"
    changed = await core.autopilot.stop(by="the operator", reason=reason)
    message = ("The autopilot is stopped; it stays stopped across restarts until "
               "`vast-manager autopilot start`." if changed
               else "The autopilot was stopped already.")
    return {"ok": True, "state": "stopped", "changed": changed, "message": message}


async def autopilot_start(core: Core, request: web.Request) -> Any:
    changed = await core.autopilot.start(by="the operator")
    message = "The autopilot is running." if changed else "The autopilot was running already."
    return {"ok": True, "state": "running", "changed": changed, "message": message}


def add_routes(app: web.Application,
               endpoint: Callable[[Handler], Callable[[web.Request], Awaitable[web.Response]]]
               ) -> None:
    """Register the discovery routes on the operators' sub-application (mounted at /api)."""
    app[_IMPORT_LOCK] = asyncio.Lock()
    app.router.add_get("/offers", endpoint(offers))
    app.router.add_get("/plan", endpoint(plan))
    app.router.add_get("/model", endpoint(model))
    app.router.add_post("/hosts/import", endpoint(hosts_import))
    app.router.add_get("/hosts/export", endpoint(hosts_export))
    app.router.add_get("/autopilot", endpoint(autopilot))
    app.router.add_post("/autopilot/stop", endpoint(autopilot_stop))
    app.router.add_post("/autopilot/start", endpoint(autopilot_start))

