"""The monitor: silence, phase timeouts, pending destroys and reconciliation with the provider.

``HeartbeatTracker`` is Nomad's heartbeat timer as one small object: the
agent handlers ``touch`` an instance with the pace they answered, the loop
calls ``expire_stale``; each instance's silence is timed on its own pace, and
the tracker's count of the agents heard sets the next pace (``pace``). The
clock is passed in, so tests never sleep. ``Monitor.tick`` does one round;
``Monitor.run`` repeats it every ``monitor_interval_s`` (sooner when a
destroy falls due). Every decision lands in ``events`` with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from vast_manager.coordinator.decisions import pace, policy, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.production import (
    COLUMNS as PRODUCTION_COLUMNS,
)
from vast_manager.coordinator.operations.production import (
    ProductionTracker,
    duration,
)
from vast_manager.coordinator.providers.base import Provider, ProviderError, ProviderInstance
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.schema import Row
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)

#: Reconciliation rounds in a row an instance must be missing from the provider's
#: list before it is marked vanished.
VANISHED_AFTER_ROUNDS = 2
#: Rounds in a row an instance must be seen in a status that never runs
#: (``reconcile.never_runs``) before it is destroyed: one odd answer ends nothing,
#: and a dead instance bills for at most two rounds.
DEAD_AFTER_ROUNDS = 2
#: Agent ids per ``in (...)`` query: below SQLite's oldest bound on query parameters.
_IDS_PER_QUERY = 500


def known_agent_ids(reads: Reads, agent_ids: Collection[str]) -> set[str]:
    """Those of ``agent_ids`` the agents table holds, revoked ones included.

    Reconciliation asks only about the agents named by the provider's labels: a
    primary-key lookup per label, not a read of every agent (50,000 rows).
    """
    ids = sorted(set(agent_ids))
    known: set[str] = set()
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start:start + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(chunk))
        cur = reads._conn.execute(
            f"select agent_id from agents where agent_id in ({marks})", chunk
        )
        known.update(str(row[0]) for row in cur)
    return known


class HeartbeatTracker:
    """Last-seen times and paces per instance; an instance silent for longer than its TTL
    (``policy.silence_ttl_s`` of the pace its agent was last given) expires."""

    def __init__(self, grace_s: float, base_pace_s: float) -> None:
        self.grace_s = grace_s
        self.base_pace_s = base_pace_s
        self._heard: dict[int, tuple[float, float]] = {}  # id -> (last seen, pace)
        # id -> when it expires: what the monitor's minute pass compares, at 200,000
        # instances a scan of floats rather than a TTL computed for each.
        self._expires: dict[int, float] = {}
        self._quick: set[int] = set()  # heard last in a quick phase (``pace.is_quick``)
        self._load: pace.FleetLoad | None = None  # the counts, until they change

    def touch(self, instance_id: int, now: float, pace_s: float | None = None,
              phase: str | None = None) -> None:
        """Heard from now, and told to report again within ``pace_s`` (None: the pace it
        was last given); ``phase`` (None: unchanged) says how it is paced."""
        known = self._heard.get(instance_id)
        if known is None:
            self._load = None
        if pace_s is None:
            pace_s = known[1] if known is not None else self.base_pace_s
        self._heard[instance_id] = (now, pace_s)
        self._expires[instance_id] = now + self.ttl_s(pace_s)
        if phase is not None and pace.is_quick(phase) != (instance_id in self._quick):
            self._load = None
            if pace.is_quick(phase):
                self._quick.add(instance_id)
            else:
                self._quick.discard(instance_id)

    def forget(self, instance_id: int) -> None:
        if self._heard.pop(instance_id, None) is not None:
            self._load = None
        self._expires.pop(instance_id, None)
        self._quick.discard(instance_id)

    def last_seen(self, instance_id: int) -> float | None:
        heard = self._heard.get(instance_id)
        return None if heard is None else heard[0]

    def pace_s(self, instance_id: int) -> float | None:
        """The pace the instance's agent was last given, if it is tracked."""
        heard = self._heard.get(instance_id)
        return None if heard is None else heard[1]

    def ttl_s(self, pace_s: float) -> float:
        """How long an agent told ``pace_s`` may stay silent."""
        return policy.silence_ttl_s(pace_s, self.grace_s)

    def load(self) -> pace.FleetLoad:
        """The agents heard from, by how they are paced."""
        if self._load is None:
            quick = len(self._quick)
            self._load = pace.FleetLoad(quick, len(self._heard) - quick)
        return self._load

    def expire_stale(self, now: float) -> list[tuple[int, float]]:
        """Remove and return the instances silent for longer than their TTL, each with the
        pace it was last given."""
        stale = [i for i, expires in self._expires.items() if now > expires]
        out = [(i, self._heard[i][1]) for i in stale]
        for instance_id in stale:
            self.forget(instance_id)
        return out

    def __len__(self) -> int:
        return len(self._heard)


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
    ) -> None:
        self.settings = settings
        self.store = store
        self._missing_rounds: dict[int, int] = {}
        self._dead_rounds: dict[int, int] = {}
        self.provider = provider
        self.clock = clock
        self.tracker = tracker
        self.limits = policy.PolicyLimits.from_settings(settings)
        self.on_agent_revoked = on_agent_revoked or (lambda agent_id: None)
        self._tick_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._seeded = False
        self.production = ProductionTracker(settings)

    # --- the loop ------------------------------------------------------------------

    _SEED_COLUMNS = ("id", "state", "heartbeat_pace_s")

    def seed(self, now: float) -> None:
        """Start the silence timers of running instances from ``now``, each on the pace its
        agent was last given.

        After a coordinator restart nobody could have heard the agents while it
        was down, so their timers start afresh rather than from ``last_seen``.
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
                self.tracker.touch(instance_id, now, inst["heartbeat_pace_s"], inst["state"])
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
            await self.expire_silent(now)
            await self.enforce_timeouts(now)
            await self.finish_destroys(now)
            await self.watch_production(now)
            await self.reconcile_with_provider()

    # --- production: what kept instances complete (docs/operations.md) ----------------

    async def watch_production(self, now: float) -> None:
        """Measure each proving instance's completed rate; report an instance that turned
        idle (an event), and destroy one idle past ``idle_destroy_after_s``."""
        rows = await self.store.read(lambda r: r.active_instances(PRODUCTION_COLUMNS))
        turned = self.production.observe(rows, now)
        current = self.production.current
        if turned:
            def report(tx: Tx) -> None:
                for instance_id in turned:
                    inst = tx.get_instance(instance_id)
                    if inst is not None:
                        tx.insert_event(now, "idle", str(current[instance_id].idle_reason),
                                        instance_id=instance_id, agent_id=inst["agent_id"],
                                        machine_id=inst["machine_id"])

            await self.store.write(report)
            for instance_id in turned:
                log.info("instance %s is idle: %s", instance_id,
                            current[instance_id].idle_reason)
        limit = self.settings.idle_destroy_after_s
        if limit <= 0:
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
                tx.begin_terminating(
                    instance_id, f"idle for {duration(limit)} (VM_IDLE_DESTROY_AFTER_S): "
                    f"{current[instance_id].idle_reason}", kind="idle", now=now,
                    destroy_due_at=now + self.settings.terminate_grace_s)

        await self.store.write(terminate)
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
                tx.update_instance(instance_id, state=State.LOST, state_since=now, updated_at=now)
                tx.insert_event(
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
                if (reason := policy.timed_out(inst, now, limits)) is not None
            ]

        # The scan's snapshot may be a little older than the writer's state: the job
        # re-reads each instance in its transaction and skips any that moved on.
        overdue = await self.store.read(scan)
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
                tx.begin_terminating(
                    inst["id"], reason, kind="timeout", now=now,
                    destroy_due_at=now + (grace if listening else 0.0),
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
                retry_at = now + self.settings.monitor_interval_s
                msg = f"destroy through {self.provider.name} failed ({err}); retrying"

                def failed(tx: Tx) -> None:
                    tx.begin_terminating(instance_id, reason, kind="destroy_failed", note=msg,
                                         now=now, destroy_due_at=retry_at)

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
            tx.update_instance(
                instance_id, state=State.DESTROYED, state_since=now, destroyed_at=now,
                terminate_reason=current["terminate_reason"] or reason, updated_at=now,
            )
            if agent_id:
                tx.revoke_agent(agent_id, now=now, reason=f"instance destroyed: {reason}")
            tx.insert_event(now, "destroy", what, instance_id=instance_id, agent_id=agent_id,
                            machine_id=inst["machine_id"])
            return True

        changed = await self.store.write(done)
        self.tracker.forget(instance_id)
        if agent_id:
            self.on_agent_revoked(agent_id)
        return changed

    # --- reconciliation -------------------------------------------------------------

    async def reconcile_with_provider(self) -> None:
        try:
            provider_instances = await self.provider.list_instances()
        except ProviderError as err:
            log.warning("could not list provider instances: %s", err)
            return
        await self.reconcile(provider_instances)

    async def reconcile(self, provider_instances: list[ProviderInstance]) -> list[Any]:
        """Apply ``coordinator.reconcile.plan`` to the provider's list; return its actions.

        Does nothing when that module is not installed.
        """
        try:
            from vast_manager.coordinator.decisions import reconcile as reconcile_module
        except ImportError:
            return []
        now = self.clock()
        parse_label = reconcile_module.parse_label
        # plan() asks whether an agent is known only for labels carrying our fleet id.
        labelled = set()
        for inst in provider_instances:
            parsed = parse_label(inst.get("label"))
            if parsed is not None and parsed[0] == self.settings.fleet_id:
                labelled.add(parsed[1])

        def scan(reads: Reads) -> tuple[list[Row], set[str]]:
            return self._deployed_rows(reads), known_agent_ids(reads, labelled)

        # Read on the reader thread, off the loop. Every write below re-checks the
        # row in its transaction (destroy, adopt) or acts on the provider's state.
        rows, known = await self.store.read(scan)
        if await self._adopt(provider_instances, rows, parse_label, now):
            rows = await self.store.read(self._deployed_rows)
        ours = [
            {
                "instance_id": r["provider_instance_id"],
                "agent_id": r["agent_id"],
                "state": r["state"],
                "created_at": r["created_at"],
            }
            for r in rows
        ]
        by_pid: dict[int, Row] = {
            int(r["provider_instance_id"]): r for r in rows if r["provider_instance_id"] is not None
        }
        actions = reconcile_module.plan(
            provider_instances, ours, self.settings.fleet_id, known, now,
            self.settings.unowned_grace_s,
        )
        # One list that misses an instance (a provider hiccup) must not end a
        # healthy instance: mark vanished only after consecutive rounds agree.
        missing = {int(a.instance_id) for a in actions if a.kind == "mark_vanished"}
        self._missing_rounds = {
            pid: self._missing_rounds.get(pid, 0) + 1 for pid in missing
        }
        # Likewise a status that never runs must be seen twice before a destroy.
        dead = {int(a.instance_id) for a in actions if a.kind == "destroy_dead"}
        self._dead_rounds = {pid: self._dead_rounds.get(pid, 0) + 1 for pid in dead}
        actions = [
            a for a in actions
            if (a.kind != "mark_vanished"
                or self._missing_rounds[int(a.instance_id)] >= VANISHED_AFTER_ROUNDS)
            and (a.kind != "destroy_dead"
                 or self._dead_rounds[int(a.instance_id)] >= DEAD_AFTER_ROUNDS)
        ]
        for action in actions:
            try:
                await self._apply(action, by_pid.get(int(action.instance_id)), now)
            except ProviderError as err:
                log.warning("reconcile %s of %s failed: %s", action.kind, action.instance_id, err)
        return list(actions)

    #: What reconciliation reads of each record (not the hello's wide ``host_json``).
    _RECONCILE_COLUMNS = ("id", "agent_id", "machine_id", "provider", "provider_instance_id",
                          "state", "created_at", "terminate_reason")

    def _deployed_rows(self, reads: Reads) -> list[Row]:
        """Our records of instances this provider rented (not bring-your-own machines,
        not another provider's rows left in the same database); run on the reader thread."""
        name = self.provider.name
        return [
            # Filtered in SQL, on the kind index: a large bring-your-own fleet costs nothing.
            r for r in reads.instances_of_kind("deployed", self._RECONCILE_COLUMNS)
            if r["provider"] in (None, name)
        ]

    async def _adopt(
        self,
        provider_instances: list[ProviderInstance],
        rows: list[Row],
        parse_label: Callable[[Any], tuple[str, str] | None],
        now: float,
    ) -> bool:
        """Give records without a provider instance id (the create's answer was lost,
        or the coordinator stopped mid-create) the instance that carries their label.

        Without this, such an instance would never be matched to its record: once the
        record is destroyed (no hello), reconciliation would see a known agent and
        leave a paid instance running. The label is ours (fleet id) and names the
        record's agent, so the match is exact. Returns whether anything changed.
        """
        waiting = {
            str(r["agent_id"]): r for r in rows
            if r["provider_instance_id"] is None and r["agent_id"]
        }
        if not waiting:
            return False
        taken = {int(r["provider_instance_id"]) for r in rows
                 if r["provider_instance_id"] is not None}
        labelled: list[tuple[int, str]] = []
        for inst in provider_instances:
            parsed = parse_label(inst.get("label"))
            if parsed is None or parsed[0] != self.settings.fleet_id:
                continue
            try:
                labelled.append((int(inst["id"]), parsed[1]))
            except (KeyError, TypeError, ValueError):
                continue
        found: list[tuple[Row, int]] = []
        # Lowest id first, as the provider's own lookup by label picks; a second
        # instance with the same label is a double sale, destroyed as leaked.
        for pid, agent_id in sorted(labelled):
            row = waiting.pop(agent_id, None)
            if row is not None and pid not in taken:
                found.append((row, pid))
        if not found:
            return False

        def adopt(tx: Tx) -> None:
            for row, pid in found:
                current = tx.get_instance(int(row["id"]))
                if current is None or current["provider_instance_id"] is not None:
                    continue
                tx.update_instance(row["id"], provider_instance_id=pid, updated_at=now)
                tx.insert_event(
                    now, "adopted",
                    f"{self.provider.name} instance {pid} carries this agent's label",
                    instance_id=row["id"], agent_id=row["agent_id"],
                    machine_id=row["machine_id"],
                )

        await self.store.write(adopt)
        return True

    async def _apply(self, action: Any, row: Row | None, now: float) -> None:
        kind, pid, reason = action.kind, int(action.instance_id), action.reason
        if kind == "mark_vanished":
            if row is None:
                return

            def vanish(tx: Tx) -> None:
                tx.update_instance(
                    row["id"], state=State.VANISHED, state_since=now, destroyed_at=now,
                    terminate_reason=row["terminate_reason"] or reason, updated_at=now,
                )
                tx.insert_event(now, "vanished", reason, instance_id=row["id"],
                                agent_id=row["agent_id"], machine_id=row["machine_id"])

            await self.store.write(vanish)
            self.tracker.forget(int(row["id"]))
            return
        # destroy_dead, destroy_leaked
        if kind == "destroy_dead":
            reason = f"{reason}, seen in {self._dead_rounds.get(pid, 0)} rounds in a row"
        if row is not None and row["state"] not in states.GONE:
            await self.destroy(int(row["id"]), reason, source=kind)
            return
        await self.provider.destroy_instance(pid)
        await self.store.write(
            lambda tx: tx.insert_event(
                now, kind, f"{self.provider.name} instance {pid}: {reason}",
                instance_id=row["id"] if row else None,
                agent_id=row["agent_id"] if row else None,
                data={"provider_instance_id": pid},
            )
        )
