"""The monitor: silence, phase timeouts, pending destroys and reconciliation with the provider.

The heartbeat timer it reads (``decisions.pace.HeartbeatTracker``) lives beside
the pace it times. The clock is passed in, so tests never sleep. ``Monitor.tick`` does one round;
``Monitor.run`` repeats it every ``monitor_interval_s`` (sooner when a
destroy falls due). Every decision lands in ``events`` with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from vast_manager.common.retry import COORDINATOR_BACKOFF
from vast_manager.coordinator.decisions import policy, states
from vast_manager.coordinator.decisions.pace import HeartbeatTracker
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.account import Account
from vast_manager.coordinator.operations.cluster import ClusterWatch
from vast_manager.coordinator.operations.delivery import DeliveryVerdicts
from vast_manager.coordinator.operations.machine_reports import MachineReports
from vast_manager.coordinator.operations.price_increases import PriceIncreases
from vast_manager.coordinator.operations.production import (
    COLUMNS as PRODUCTION_COLUMNS,
)
from vast_manager.coordinator.operations.production import (
    ProductionTracker,
    duration,
    idle_warning,
)
from vast_manager.coordinator.operations.reconciliation import Reconciler
from vast_manager.coordinator.providers.base import (
    AuthError,
    Provider,
    ProviderError,
    ProviderInstance,
)
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)

def account_watch(provider: Provider, settings: Settings) -> Account:
    """The watch on ``provider``'s account balance, at the monitor's interval."""
    return Account(
        getattr(provider, "account", None), warn_usd=settings.balance_warn_usd,
        pause_usd=settings.balance_pause_usd, interval_s=settings.monitor_interval_s,
    )


class Monitor:
    """One round of watching (``tick``) and the loop that repeats it (``run``)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        clock: policy.Clock,
        tracker: HeartbeatTracker,
        *,
        on_agent_revoked: Callable[[str], None] | None = None,
        account: Account | None = None,
        cluster: ClusterWatch | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.clock = clock
        self.tracker = tracker
        self.limits = policy.PolicyLimits.from_settings(settings)
        self.on_agent_revoked = on_agent_revoked or (lambda agent_id: None)
        self.strike_rule = policy.StrikeRule.from_settings(settings)
        # The account watch the runtime built (one alone when the monitor is built alone).
        self.account = account if account is not None else account_watch(provider, settings)
        self._tick_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._seeded = False
        self.production = ProductionTracker(settings)
        # Delivered beats claimed: demotions and bounded rates learned (operations.delivery).
        self.delivery = DeliveryVerdicts(settings, store, self.production)
        # Hosts' price increases, judged each round (operations.price_increases).
        self.price_increases = PriceIncreases(settings, store, provider, self.production)
        # Renters' reports on blocked or struck machines (operations.machine_reports).
        self.machine_reports = MachineReports(store, provider)
        self.reconciler = Reconciler(settings, store, provider, clock, tracker, self.account,
                                     self.destroy,
                                     ended_by_us=self.price_increases.rejected)
        self.cluster = cluster if cluster is not None else ClusterWatch(settings, clock)
        self._flagged: set[tuple[int, str]] = set()

    # --- the loop ------------------------------------------------------------------

    _SEED_COLUMNS = ("id", "state", "heartbeat_pace_s")

    def seed(self, now: float) -> None:
        """Start the silence timers of running instances from ``now``, each on the pace its
        agent was last given.

        After a coordinator restart nobody could have heard the agents while it
        was down, so their timers start afresh rather than from ``last_seen``, and
        only after the longest wait an agent's backoff may still hold it to
        (``retry.COORDINATOR_BACKOFF``): an agent that reports within that window is
        never called ``lost`` (nor idle) for the restart.
        Synchronous, for ``create_app`` before the loop serves anyone; in the loop
        ``tick`` uses ``seed_async``.
        """
        self._seed_from(self.store.active_instances(self._SEED_COLUMNS), now)

    async def seed_async(self, now: float) -> None:
        """``seed`` with its fleet-wide scan on the store's reader thread."""
        cols = self._SEED_COLUMNS
        self._seed_from(await self.store.read(lambda r: r.active_instances(cols)), now)

    def _seed_from(self, instances: Iterable[Row], now: float) -> None:
        for inst in instances:
            instance_id = int(inst["id"])
            # Checked after the scan: a heartbeat heard meanwhile keeps its own time.
            untracked = self.tracker.last_seen(instance_id) is None
            if inst["state"] in states.ACTIVE_PHASES and untracked:
                self.tracker.touch(instance_id, now, inst["heartbeat_pace_s"], inst["state"],
                                   extra_s=COORDINATOR_BACKOFF.cap_s)
        self._seeded = True

    def wake(self) -> None:
        """Run a round soon (a destroy was scheduled)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("monitor round failed; retrying next round")
            timeout = self.settings.monitor_interval_s
            try:
                # On the reader thread with the monitor's other scans.
                due = await self.store.read(lambda r: r.next_destroy_due_at())
            except Exception:
                log.exception("could not read the next destroy time")
                due = None
            if due is not None:
                timeout = min(timeout, max(0.05, float(due) - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()

    async def tick(self) -> None:
        """One round: silence, timeouts, due destroys, reconciliation."""
        async with self._tick_lock:
            now = self.clock()
            if not self._seeded:
                await self.seed_async(now)
            was_zero = self.account.at_or_below_zero
            await self.account.refresh(now)
            if was_zero and not self.account.at_or_below_zero:
                await self.reconciler.funds_back(now)
            await self.expire_silent(now)
            if self.account.at_or_below_zero:
                # vast.ai stops every instance at zero funds: silence then is the account's,
                # not the hosts'; nothing is timed out until billing resumes.
                if not was_zero:
                    log.warning("vast.ai funds at or below zero: instances are stopped by "
                                "vast.ai, none timed out or destroyed for it")
            else:
                await self.enforce_timeouts(now)
            await self.finish_destroys(now)
            await self.watch_production(now)
            await self.reconciler.reconcile_with_provider()
            await self.price_increases.round(now)
            await self.machine_reports.round(now)

    # --- production: what kept instances complete (docs/operations.md) ----------------

    async def watch_production(self, now: float) -> None:
        """Measure each proving instance's completed rate; report an instance that turned
        idle (an event), and destroy one idle past ``idle_destroy_after_s``."""
        cols = tuple(dict.fromkeys(PRODUCTION_COLUMNS + self.cluster.columns()))
        rows = await self.store.read(lambda r: r.active_instances(cols))
        turned = self.production.observe(rows, now)
        await self.watch_delivered(rows, now)
        await self.delivery.learn_agreed(now)
        current = self.production.current
        if self.production.short_ids() and not self.account.at_or_below_zero \
                and await self.delivery.demote_short(now):
            self.wake()
        if turned:
            warnings = {i: idle_warning(current[i], now) for i in turned}

            def report(tx: Tx) -> None:
                for instance_id in turned:
                    inst = tx.get_instance(instance_id)
                    if inst is not None:
                        tx.audit.add(now, "idle", warnings[instance_id],
                                     instance_id=instance_id, agent_id=inst["agent_id"],
                                     machine_id=inst["machine_id"])

            await self.store.write(report)
            for instance_id in turned:
                log.warning("instance %s is idle: %s", instance_id, warnings[instance_id])
        limit = self.settings.idle_destroy_after_s
        # At zero funds vast.ai stops every instance: no proof moves, and that is no host's fault.
        if limit <= 0 or self.account.at_or_below_zero:
            return
        kinds = {int(r["id"]): r["kind"] for r in rows}
        due = [i for i, p in current.items()
               if p.idle and p.idle_since is not None and kinds.get(i) == "deployed"
               and (now - p.idle_since) * self.production.settings.sim_time_scale >= limit]
        if not due:
            return

        def terminate(tx: Tx) -> None:
            for instance_id in due:
                inst = tx.get_instance(instance_id)
                if inst is None or inst["state"] != State.PROVING or inst["terminate_reason"]:
                    continue
                tx.instances.begin_terminating(
                    instance_id, f"idle for {duration(limit)} (VM_IDLE_DESTROY_AFTER_S): "
                    f"{current[instance_id].idle_reason}", kind="idle", now=now,
                    destroy_due_at=now + self.settings.terminate_grace_s)

        await self.store.write(terminate)
        self.wake()

    async def watch_delivered(self, rows: list[Row], now: float) -> None:
        """What the cluster recorded each proving instance delivered (``operations.cluster``):
        a new flag is an event; an instance below its minimum is terminated (never while
        vast.ai's funds are out, nor on the agents' counters alone)."""
        cuzk = {i: p.completed_rate_per_hour for i, p in self.production.current.items()}
        # Where vast.ai says each instance's Curio port is, as the last reconciliation saw.
        self.cluster.addresses = self.reconciler.curio_addresses
        self.cluster.expire_reports(now)
        # Off the loop: a fleet's matching and bills are CPU the heartbeats must not wait on
        # (``assess`` reads only what each read and report replaced whole).
        found = await asyncio.to_thread(self.cluster.assess, rows, cuzk, now)
        self.production.delivered, self.production.fleet_delivered = found.views, found.fleet
        self.production.fold_cluster(found.increments)  # the delivery test's outside truth
        flags = {(i, name): why for i, j in found.judgements.items()
                 for name, why in j.flags.items()}
        fresh = {key: why for key, why in flags.items() if key not in self._flagged}
        self._flagged = set(flags)
        ending = {} if self.account.at_or_below_zero else {
            i: j.terminate for i, j in found.judgements.items() if j.terminate}
        if not fresh and not ending:
            return
        grace = self.settings.terminate_grace_s

        def job(tx: Tx) -> None:
            for (instance_id, name), why in fresh.items():
                inst = tx.get_instance(instance_id)
                if inst is not None:
                    tx.audit.add(now, f"delivered_{name}", why, instance_id=instance_id,
                                 agent_id=inst["agent_id"], machine_id=inst["machine_id"])
            for instance_id, reason in ending.items():
                inst = tx.get_instance(instance_id)
                if inst is None or inst["state"] != State.PROVING or inst["terminate_reason"]:
                    continue
                tx.instances.begin_terminating(instance_id, reason, kind="underdelivered", now=now,
                                               destroy_due_at=now + grace)

        await self.store.write(job)
        for (instance_id, name), why in fresh.items():
            log.warning("instance %s flagged %s: %s", instance_id, name, why)
        if ending:
            self.wake()

    # --- silence and timeouts -----------------------------------------------------------

    async def expire_silent(self, now: float) -> list[int]:
        """Mark instances whose tracker expired as ``lost``; return their ids."""
        expired = self.tracker.expire_stale(now)
        if not expired:
            return []
        ttl_of = self.tracker.ttl_s

        spoke: list[tuple[int, float, float, str]] = []

        def job(tx: Tx) -> list[int]:
            lost = []
            for instance_id, pace_s in expired:
                inst = tx.get_instance(instance_id)
                if inst is None or inst["state"] not in states.ACTIVE_PHASES:
                    continue
                seen = inst["last_seen"]
                ttl = ttl_of(pace_s)
                if seen is not None and now - float(seen) <= ttl:
                    # Spoke meanwhile (a log batch, a result): keep watching it, or
                    # it would never be found silent again.
                    spoke.append((instance_id, float(seen), pace_s, inst["state"]))
                    continue
                silent = "never heard" if seen is None else f"silent for {now - float(seen):.0f} s"
                tx.instances.update(instance_id, state=State.LOST, state_since=now, updated_at=now)
                tx.audit.add(
                    now, "lost", f"{silent} (TTL {ttl:.0f} s = 3 heartbeats at its "
                    f"{pace_s:.0f} s pace + grace)",
                    instance_id=instance_id, agent_id=inst["agent_id"],
                    machine_id=inst["machine_id"],
                )
                lost.append(instance_id)
            return lost

        lost = await self.store.write(job)
        for instance_id, seen, pace_s, state in spoke:
            self.tracker.touch(instance_id, seen, pace_s, state)
        return lost

    async def enforce_timeouts(self, now: float) -> list[int]:
        """Terminate instances that overstayed a phase (docs/policy.md's timeouts)."""
        limits = self.limits

        cols = ("id", "state", "state_since", "created_at", "rate_per_hour")

        def scan(reads: Reads) -> list[tuple[Row, str]]:
            # On the reader thread (50,000 instances held the loop for half a second),
            # with only the columns timed_out and the job read, of only the states that
            # can time out (on the state index: the proving fleet is not read).
            timed = states.ordered(policy.TIMED_STATES - states.ENDING)
            return [
                (inst, reason)
                for inst in (dict(zip(cols, values, strict=True))
                             for values in reads.instance_values(cols, states=timed))
                if (reason := policy.timed_out(instance_row(inst), now, limits)) is not None
            ]

        # The scan's snapshot may be a little older than the writer's state: the job
        # re-reads each instance in its transaction and skips any that moved on.
        overdue = await self.store.read(scan)
        # An outbid interruptible trial waiting for its host is silent by design.
        overdue = [(inst, why) for inst, why in overdue
                   if not self.reconciler.waits_outbid(int(inst["id"]))]
        if not overdue:
            return []
        grace = self.settings.terminate_grace_s

        def job(tx: Tx) -> list[int]:
            done = []
            for old, reason in overdue:
                inst = tx.get_instance(int(old["id"]))
                if inst is None or inst["state"] != old["state"]:
                    continue  # moved on meanwhile
                # An agent that is not listening (no hello, silent) gets no grace.
                listening = inst["state"] not in states.UNHEARD
                tx.instances.begin_terminating(
                    inst["id"], reason, kind="timeout", now=now,
                    destroy_due_at=now + (grace if listening else 0.0),
                    strike=self.strike_rule,
                )
                done.append(int(inst["id"]))
            return done

        ids = await self.store.write(job)
        for instance_id in ids:
            self.tracker.forget(instance_id)
        return ids

    # --- destroys -------------------------------------------------------------------

    async def finish_destroys(self, now: float) -> list[int]:
        """Destroy every instance whose ``destroy_due_at`` has come."""
        finished = []
        # On the reader thread (an index serves it: docs/performance.md). A row that changed
        # since is safe: destroy() re-reads it, and its write re-checks in the transaction.
        for inst in await self.store.read(lambda r: r.instances_due_for_destroy(now)):
            reason = inst["terminate_reason"] or "scheduled for destruction"
            try:
                if await self.destroy(int(inst["id"]), reason, source="monitor"):
                    finished.append(int(inst["id"]))
            except ProviderError as err:  # recorded by destroy; retried next round
                log.warning("destroy of instance %s failed: %s", inst["id"], err)
        return finished

    async def destroy(self, instance_id: int, reason: str, *, source: str) -> bool:
        """Destroy now: through the provider, or for a bring-your-own agent by revoking it.

        Idempotent: False when the instance was already gone. A provider failure
        is recorded and retried on the next round.
        """
        inst = self.store.get_instance(instance_id)
        if inst is None or inst["state"] in states.GONE:
            return False
        now = self.clock()
        agent_id = inst["agent_id"]
        byo = inst["kind"] == "byo"
        pid = inst["provider_instance_id"]
        if not byo and pid is not None:
            try:
                await self.provider.destroy_instance(int(pid))
            except ProviderError as err:
                if isinstance(err, AuthError):
                    self.account.refused(err)
                retry_at = now + self.settings.monitor_interval_s
                msg = f"destroy through {self.provider.name} failed ({err}); retrying"

                def failed(tx: Tx) -> None:
                    tx.instances.begin_terminating(instance_id, reason, kind="destroy_failed",
                                                   note=msg, now=now, destroy_due_at=retry_at)

                await self.store.write(failed)
                raise
        if byo:
            what = f"agent revoked (bring-your-own machine, not ours to destroy): {reason}"
        elif pid is None:
            what = f"never created by {self.provider.name}: {reason}"
        else:
            what = f"destroyed through {self.provider.name} ({source}): {reason}"

        def done(tx: Tx) -> bool:
            current = tx.get_instance(instance_id)
            if current is None or current["state"] in states.GONE:
                return False
            tx.instances.update(
                instance_id, state=State.DESTROYED, state_since=now, destroyed_at=now,
                terminate_reason=current["terminate_reason"] or reason, updated_at=now,
            )
            if agent_id:
                tx.agents.revoke(agent_id, now=now, reason=f"instance destroyed: {reason}")
            tx.audit.add(now, "destroy", what, instance_id=instance_id, agent_id=agent_id,
                         machine_id=inst["machine_id"])
            return True

        changed = await self.store.write(done)
        self.tracker.forget(instance_id)
        if agent_id:
            self.on_agent_revoked(agent_id)
        return changed

    @property
    def vast_seen(self) -> dict[int, dict[str, Any]]:
        """What vast.ai last showed of each instance it lists (``Reconciler.vast_seen``)."""
        return self.reconciler.vast_seen

    async def reconcile(self, provider_instances: list[ProviderInstance]) -> list[Any]:
        """One reconciliation with ``provider_instances`` (``Reconciler.reconcile``)."""
        return await self.reconciler.reconcile(provider_instances)
