"""The autopilot: keeps the deployed fleet at its target rate for the least per proof.

Off unless ``serve --autopilot`` (with its caps as settings). Every
``autopilot_interval_s`` it reads the fleet, the offers and the latest rate model,
plans (``discovery.plan``), decides (``discovery.autopilot.decide``: caps, trim,
fill, explore, in that order) and carries the actions out: deploys through the
``Deployer`` with all its checks (and the price the decision saw as the ceiling),
terminations through the usual terminate path (the agent is told, the monitor
destroys). Every action is an ``autopilot`` event with its reason; what it held
back from is an event too, when that changes. ``stop`` persists in the store, so a
restart does not resume it silently; ``start`` resumes it. Bring-your-own machines
are never its to act on, and do not count toward its target.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from vast_manager.coordinator.decisions import policy, states
from vast_manager.coordinator.decisions.earnings import break_even_usd_per_proof
from vast_manager.coordinator.decisions.share import instance_share, shortfall
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.autopilot_rules import (
    Action,
    AutopilotCaps,
    Decision,
    FleetInstance,
    Ledger,
    decide,
    fleet_margin_usd_per_proof,
    fleet_on_offer,
    ledger_of,
    plan_reference_usd_per_proof,
    rental_of,
)
from vast_manager.coordinator.discovery.plan import (
    FleetView,
    Plan,
    PlanSettings,
    TrialCost,
    belief_tests,
    plan_trials,
)
from vast_manager.coordinator.discovery.served import ServedModel
from vast_manager.coordinator.discovery.structural_model import Prediction, Unpredictable
from vast_manager.coordinator.exceptions import AutopilotNotConfigured, CoordinatorError
from vast_manager.coordinator.offers import Offer, parse_offer, positive, stored_offer
from vast_manager.coordinator.operations import faults
from vast_manager.coordinator.operations.deploy import Deployer
from vast_manager.coordinator.operations.model_keeper import ModelKeeper
from vast_manager.coordinator.operations.monitor import Monitor
from vast_manager.coordinator.providers.base import Provider, ProviderError
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)

RUNNING, STOPPED = "running", "stopped"
EVENT = "autopilot"
#: How many proposals the plan lists for a decision (more than the trials allowed at once:
#: one over the price cap is skipped for the next).
PLAN_LENGTH = 10


def caps_of(settings: Settings) -> AutopilotCaps | None:
    """The autopilot's caps from the settings (None unless ``autopilot`` is on)."""
    if not settings.autopilot:
        return None
    assert settings.autopilot_target_rate_per_hour is not None
    assert settings.autopilot_max_dph_total is not None
    assert settings.autopilot_max_instances is not None
    caps = AutopilotCaps(
        target_rate_per_hour=settings.autopilot_target_rate_per_hour,
        max_dph_total=settings.autopilot_max_dph_total,
        max_instances=settings.autopilot_max_instances,
        max_explore_share=settings.autopilot_max_explore_share,
        max_concurrent_trials=settings.autopilot_max_concurrent_trials,
        explore_interval_s=settings.autopilot_explore_interval_s,
    )
    caps.validate()
    return caps


class _Memo:
    """A model's predictions of a list of offers, made once (``explain=False``) and handed
    back for the same offer objects; explanations are asked of the model."""

    def __init__(self, model: ServedModel, offers: Sequence[Offer]) -> None:
        self.model = model
        preds = model.predict_offers(offers, explain=False)
        self.by_id = {id(o): p for o, p in zip(offers, preds, strict=True)}

    def predict_offers(self, offers: Sequence[Offer], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        if explain:
            return self.model.predict_offers(offers, explain=True)
        return [self.by_id.get(id(o)) or self.model.predict_offers([o], explain=False)[0]
                for o in offers]


def fleet_instances(rows: Sequence[Row], model: ServedModel,
                    idle: frozenset[int] = frozenset(),
                    delivered: Mapping[int, float] | None = None, *,
                    delivery_watched: bool = False) -> list[FleetInstance]:
    """Our deployed instances still on a machine, as the decision core sees them: proving
    at the rate they deliver (``delivered``: instance id -> the completed rate over at
    least half an hour, docs/reliability.md "Judged by what it delivers"), else their
    measured rate (with ``delivery_watched``, marked as not yet delivered); on trial at
    the model's predicted rate for their offer; or leaving (terminating, silent, failed,
    or idle (``idle``: proving, completing nothing or far below their rate): billing, not
    proving)."""
    delivered = delivered or {}
    out = []
    for r in rows:
        if r["kind"] != "deployed" or r["state"] in states.GONE:
            continue
        dph = float(r["dph_total"] or 0.0)
        rate = r["rate_per_hour"]
        ident, machine = str(r["id"]), str(r["machine_id"])
        ending = r["terminate_reason"] or r["state"] in states.ENDING
        if ending or r["state"] == State.LOST or int(r["id"]) in idle:
            out.append(FleetInstance(ident, machine, dph, None, leaving=True))
        elif r["state"] == State.PROVING and rate:
            known = int(r["id"]) in delivered
            out.append(FleetInstance(ident, machine, dph,
                                     float(delivered.get(int(r["id"]), rate)),
                                     rate_delivered=known or not delivery_watched))
        else:
            offer = stored_offer(r["offer_json"]) or parse_offer(
                {k: r[k] for k in ("gpu_name", "num_gpus", "cpu_cores", "cpu_ram")})
            pred = model.predict_offers([msgspec.structs.replace(offer, machine_id=machine)],
                                        explain=False)[0]
            expected = pred.rate_per_hour if isinstance(pred, Prediction) else None
            out.append(FleetInstance(ident, machine, dph, None, expected))
    return out


def deployable(offers: Sequence[Offer], settings: Settings) -> list[Offer]:
    """The offers a deploy would not refuse for their share or price."""
    return [
        o for o in offers
        if shortfall(instance_share(o), settings.min_instance_ram_gb) is None
        and (dph := positive(o.dph_total)) is not None
        and dph <= settings.max_deploy_dph_total
    ]


def plan_for(
    offers: Sequence[Offer],
    model: ServedModel,
    fleet: Sequence[FleetInstance],
    *,
    target_rate_per_hour: float | None,
    busy: frozenset[str],
    bad: frozenset[str],
    settings: Settings,
    trials: int,
    budget_usd: float | None = None,
) -> Plan:
    """The plan against the reference a newcomer must beat (blocking: a worker thread).

    With a target (the autopilot's): the market's margin below it, the fleet's worst at
    it (``plan_reference_usd_per_proof``). Without one, the fleet's proving rate stands
    in for it. With nothing proving and no target, what the operator would otherwise
    get: the best fleet of ``plan_fleet_hosts`` the model builds from the offers
    (``fleet_margin_usd_per_proof``), predicted, or measured where its machines are.
    """
    memo = _Memo(model, offers)
    proving = [i for i in fleet if i.rate_per_hour and not i.leaving]
    best = min((i.usd_per_proof for i in proving), default=None)
    view = FleetView(best_usd_per_proof=best, busy_machines=busy, bad_machines=bad,
                     **_reference(offers, memo, fleet, target_rate_per_hour, settings))
    plan_settings = PlanSettings(max_usd_per_proof=break_even_usd_per_proof(settings),
                                 trials=trials,
                                 budget_usd=budget_usd, horizon_hours=settings.plan_horizon_hours,
                                 trial_cost=TrialCost(download_gb=settings.setup_download_gb),
                                 doubt=belief_tests(settings.plan_belief_test_share))
    return plan_trials(offers, memo, view, plan_settings)


def _reference(offers: Sequence[Offer], memo: _Memo, fleet: Sequence[FleetInstance],
               target_rate_per_hour: float | None, settings: Settings) -> dict[str, Any]:
    """``FleetView``'s reference and its source, for ``plan_for``."""
    supply = [(str(o.machine_id), float(o.dph_total or 0.0), p.rate_per_hour)
              for o in offers if isinstance(p := memo.by_id[id(o)], Prediction)]
    proving = [i for i in fleet if i.rate_per_hour and not i.leaving]
    rate = sum(i.rate_per_hour or 0.0 for i in proving)
    target = target_rate_per_hour or rate
    cap = break_even_usd_per_proof(settings)
    if target > 0:
        usd = plan_reference_usd_per_proof(fleet, supply, target, cap)
        at_target = bool(proving) and rate >= target
        what = ("the fleet's worst proving host, or the market's margin if cheaper"
                if at_target else "the market's margin (predicted, the fleet at its runs)")
        whose = (f"the autopilot's target {target:g}/h" if target_rate_per_hour
                 else f"the fleet's proving rate {target:.0f}/h")
        return {"reference_usd_per_proof": usd, "reference_source": f"{what}, at {whose}"}
    measured = frozenset(str(o.machine_id) for o in offers
                         if isinstance(p := memo.by_id[id(o)], Prediction) and p.machine_runs)
    hosts = settings.plan_fleet_hosts
    usd, known = fleet_margin_usd_per_proof(supply, hosts, cap, measured)
    kind = ("measured" if known >= hosts else "predicted" if known == 0
            else f"{known} of its hosts measured, the rest predicted")
    return {"reference_usd_per_proof": usd,
            "fleet_on_offer": fleet_on_offer(supply, hosts, cap),
            "reference_source": f"the last host of the best {hosts}-host fleet on offer "
                                f"({kind}; nothing proving)"}


@dataclass(slots=True)
class Tick:
    """One decision and what came of it (the last is shown by ``GET /api/autopilot``)."""

    at: float
    actions: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fleet_rate_per_hour: float = 0.0
    fleet_dph_total: float = 0.0
    instances: int = 0
    trials: int = 0
    ledger: dict[str, Any] = field(default_factory=dict)
    reference_usd_per_proof: float | None = None
    plan_stop_reason: str | None = None


class Autopilot:
    """The autopilot's loop, its switch, and the last decision."""

    def __init__(self, settings: Settings, store: Store, provider: Provider, deployer: Deployer,
                 monitor: Monitor, models: ModelKeeper, clock: policy.Clock) -> None:
        self.settings = settings
        self.caps = caps_of(settings)
        self.store = store
        self.provider = provider
        self.deployer = deployer
        self.offers = deployer.offers  # the one offer cache (operations.offer_cache)
        self.monitor = monitor
        self.models = models
        self.clock = clock
        self.last: Tick | None = None
        self._last_notes: tuple[str, ...] = ()
        self._lock = asyncio.Lock()  # one tick at a time

    @property
    def configured(self) -> bool:
        return self.caps is not None

    def switch(self) -> Row | None:
        return self.store.autopilot_state()

    def running(self) -> bool:
        row = self.switch()
        return self.configured and row is not None and row["state"] == RUNNING

    # --- the switch ------------------------------------------------------------------

    async def start_up(self) -> str:
        """At serve: run, unless the operator stopped it (that persists). The line says
        which, for the log."""
        if self.caps is None:
            return "autopilot off"
        row = self.switch()
        now = self.clock()
        caps = asdict(self.caps)
        if row is not None and row["state"] == STOPPED:
            line = (f"autopilot stays stopped: {row['reason']} (by {row['changed_by']}); "
                    "`vast-manager autopilot start` resumes it")
            await self.store.write(lambda tx: tx.audit.add(
                now, EVENT, line, data={"action": "held", "caps": caps}))
            return line
        line = ("autopilot running after a restart" if row is not None else "autopilot started"
                ) + f": {self._caps_text()}"
        await self.store.write(lambda tx: self._set(tx, RUNNING, now, "serve --autopilot",
                                                    line, {"action": "started", "caps": caps}))
        return line

    async def stop(self, *, by: str, reason: str) -> bool:
        """Stop now and across restarts; False when it was stopped already. Refused where
        no autopilot is configured: saying "stopped" there would claim a stop that did
        nothing."""
        if self.caps is None:
            raise AutopilotNotConfigured(
                "This coordinator runs no autopilot (it was served without --autopilot): "
                "nothing to stop.")
        now = self.clock()
        row = self.switch()
        if row is not None and row["state"] == STOPPED:
            return False
        await self.store.write(lambda tx: self._set(
            tx, STOPPED, now, by, f"stopped by {by}: {reason}", {"action": "stopped"}))
        return True

    async def start(self, *, by: str) -> bool:
        """Resume (only with caps configured); False when it was running already."""
        if self.caps is None:
            raise AutopilotNotConfigured(
                "The autopilot is not configured: serve with --autopilot and its caps.")
        now = self.clock()
        row = self.switch()
        if row is not None and row["state"] == RUNNING:
            return False
        await self.store.write(lambda tx: self._set(
            tx, RUNNING, now, by, f"started by {by}: {self._caps_text()}",
            {"action": "started", "caps": asdict(self.caps) if self.caps else None}))
        return True

    def _set(self, tx: Tx, state: str, now: float, by: str, reason: str,
             data: dict[str, Any]) -> None:
        tx.autopilot.set(state, now=now, by=by, reason=reason)
        tx.audit.add(now, EVENT, reason, data=data)

    def _caps_text(self) -> str:
        c = self.caps
        assert c is not None
        return (f"target {c.target_rate_per_hour:g}/h, at most ${c.max_dph_total:.2f}/h and "
                f"{c.max_instances} instances, trials within {c.max_explore_share:.0%} of "
                f"spend, {c.max_concurrent_trials} at once")

    # --- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("autopilot decision failed; retrying next interval")
            await asyncio.sleep(self.settings.autopilot_interval_s)

    async def tick(self) -> Tick | None:
        """One decision, carried out; None when the autopilot is not running."""
        async with self._lock:
            if not self.running():
                return None
            return await self._tick()

    async def _tick(self) -> Tick:
        caps = self.caps
        assert caps is not None
        settings = self.settings
        now = self.clock()
        paused = faults.pause_reason(self.monitor.account, self.store)
        if paused is not None:
            # Nothing deployed or ended while the account cannot pay or is not ours to use.
            tick = Tick(at=now, notes=[f"paused: {paused}"])
            self.last = tick
            return tick
        fitted = await self.models.current()
        rows = await self.store.read(lambda r: r.active_instances())
        idle = frozenset(self.monitor.production.idle_ids())
        fleet = await asyncio.to_thread(fleet_instances, rows, fitted.model, idle,
                                        self.monitor.production.settled_rates(),
                                        delivery_watched=settings.idle_after_s > 0)
        busy = frozenset(str(r["machine_id"]) for r in rows if r["machine_id"] is not None)
        bad = frozenset(str(b["machine_id"]) for b in self.store.bad_hosts(now))
        notes: list[str] = []
        try:
            answer = await self.offers.search(settings.autopilot_filter or settings.vast_filter)
            offers = deployable(answer.offers, settings)
            if answer.stale:
                notes.append(answer.label())
        except (ProviderError, ValueError) as err:
            offers = []
            notes.append(f"could not search the offers: {err}")
        plan = await asyncio.to_thread(
            plan_for, offers, fitted.model, fleet, target_rate_per_hour=caps.target_rate_per_hour,
            busy=busy, bad=bad, settings=settings, trials=PLAN_LENGTH)
        switch = self.switch()
        ledger = await self._ledger(now, switch)
        decision = decide(fleet, plan, caps, ledger, now=now)
        tick = Tick(
            at=now, notes=[*notes, *decision.notes],
            fleet_rate_per_hour=sum(i.rate_per_hour or 0.0 for i in fleet if not i.leaving),
            fleet_dph_total=sum(i.dph_total for i in fleet), instances=len(fleet),
            trials=sum(1 for i in fleet if i.on_trial),
            ledger={"total_usd": round(ledger.total_usd, 4),
                    "trials_usd": round(ledger.trials_usd, 4),
                    "rent_usd": round(ledger.rent_usd, 4),
                    "storage_usd": round(ledger.storage_usd, 4),
                    "bandwidth_usd": round(ledger.bandwidth_usd, 4),
                    "trial_share": ledger.trials_usd / ledger.total_usd
                    if ledger.total_usd else 0.0,
                    "window_h": settings.autopilot_spend_window_h},
            reference_usd_per_proof=plan.reference_usd_per_proof,
            plan_stop_reason=plan.stop_reason,
        )
        await self._carry_out(decision, tick)
        await self._note(tick)
        self.last = tick
        return tick

    async def _ledger(self, now: float, switch: Row | None) -> Ledger:
        since = now - self.settings.autopilot_spend_window_h * 3600.0
        rows = await self.store.read(lambda r: r.spend_rows(since))
        rentals = [rental_of(instance_row(r)) for r in rows]
        last = switch["last_exploration_at"] if switch else None
        return ledger_of(rentals, now=now, since=since, last_exploration_at=last)

    async def _carry_out(self, decision: Decision, tick: Tick) -> None:
        for action in decision.actions:
            if not self.running():  # stopped meanwhile: nothing more
                tick.notes.append("stopped before the rest of this decision was carried out")
                return
            if action.kind == "terminate":
                await self._terminate(action, tick)
            else:
                await self._deploy(action, tick)

    async def _terminate(self, action: Action, tick: Tick) -> None:
        assert action.instance_id is not None
        instance_id = int(action.instance_id)
        now = self.clock()
        reason = f"autopilot: {action.reason}"
        grace = self.settings.terminate_grace_s

        def job(tx: Tx) -> bool:
            inst = tx.get_instance(instance_id)
            if inst is None or inst["state"] in states.ENDING or inst["terminate_reason"]:
                return False  # ending already
            return tx.instances.begin_terminating(
                instance_id, reason, kind=EVENT, now=now, destroy_due_at=now + grace,
                note=f"terminate instance {instance_id}: {action.reason}",
                data={"action": "terminate", "dph_total": action.dph_total})

        if await self.store.write(job):
            self.monitor.wake()
            tick.actions.append({"action": "terminate", "instance_id": instance_id,
                                 "machine_id": action.machine_id, "reason": action.reason})

    async def _deploy(self, action: Action, tick: Tick) -> None:
        assert action.offer_id is not None
        data = {"action": "deploy", "offer_id": action.offer_id,
                "exploration": action.exploration, "trial_share": action.trial_share,
                "dph_total": action.dph_total,
                "expected_rate_per_hour": action.expected_rate_per_hour,
                "trial_cost_usd": round(action.trial_cost_usd, 4)}
        what = "explore" if action.exploration else "deploy"
        try:
            # The price the decision saw is the ceiling: it must not have risen since.
            deployed = await self.deployer.deploy(
                action.offer_id, max_dph_total=action.dph_total,
                interruptible=self.settings.interruptible_trials)
        except (CoordinatorError, ProviderError) as err:
            now = self.clock()
            message = getattr(err, "message", None) or str(err)
            line = f"{what} offer {action.offer_id} refused: {message}"
            await self.store.write(lambda tx: tx.audit.add(
                now, EVENT, line, machine_id=action.machine_id,
                data={**data, "action": "refused"}))
            tick.actions.append({**data, "action": "refused", "reason": message})
            return
        now = self.clock()

        def job(tx: Tx) -> None:
            tx.audit.add(now, EVENT, f"{what} offer {action.offer_id} as instance "
                         f"{deployed.instance_id}: {action.reason}",
                         instance_id=deployed.instance_id, agent_id=deployed.agent_id,
                         machine_id=action.machine_id,
                         data={**data, "instance_id": deployed.instance_id})
            if action.exploration:
                tx.autopilot.note_exploration(now)

        await self.store.write(job)
        tick.actions.append({**data, "instance_id": deployed.instance_id,
                             "reason": action.reason})

    async def _note(self, tick: Tick) -> None:
        """What it held back from, as an event when that changed (not every interval: the
        figures in a note move every time, so they do not count as a change)."""
        notes = tuple(tick.notes)
        key = tuple(re.sub(r"[0-9.]+", "#", n) for n in notes)
        if key == self._last_notes or not notes:
            self._last_notes = key
            return
        self._last_notes = key
        now = self.clock()
        await self.store.write(lambda tx: tx.audit.add(
            now, EVENT, "holding back: " + "; ".join(notes), data={"action": "note"}))

    def view(self) -> dict[str, Any]:
        """The autopilot for ``GET /api/autopilot``."""
        row = self.switch()
        state = "off" if not self.configured else (row["state"] if row else STOPPED)
        return {
            "configured": self.configured,
            "state": state,
            "switch": None if row is None else {k: row[k] for k in (
                "state", "changed_at", "changed_by", "reason", "last_exploration_at")},
            "caps": asdict(self.caps) if self.caps else None,
            "interval_s": self.settings.autopilot_interval_s,
            "last_tick": asdict(self.last) if self.last else None,
        }
