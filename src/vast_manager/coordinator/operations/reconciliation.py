"""Reconciliation with the provider (docs/operations.md): the provider's list of instances
against our records (``decisions.reconcile``), round by round; a status that never runs
destroyed only when neither the agent nor the account explains it.

The monitor runs one reconciliation a round (``Monitor.tick``) and hands it its destroy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from vast_manager.coordinator.decisions import cost, outbid, policy, states
from vast_manager.coordinator.decisions import reconcile as reconcile_rules
from vast_manager.coordinator.decisions.attribution import listed_address
from vast_manager.coordinator.decisions.earnings import break_even_usd_per_proof
from vast_manager.coordinator.decisions.pace import HeartbeatTracker
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.plan import TrialCost
from vast_manager.coordinator.offers import stored_offer
from vast_manager.coordinator.operations.account import Account
from vast_manager.coordinator.operations.adoption import adopt_job, adoptions
from vast_manager.coordinator.providers.base import (
    AuthError,
    Provider,
    ProviderError,
    ProviderInstance,
)
from vast_manager.coordinator.rows import listed_instances, our_records
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)

#: Reconciliation rounds in a row an instance must be missing from the provider's
#: list before it is marked vanished.
VANISHED_AFTER_ROUNDS = 2
#: Rounds in a row an instance must be seen in a status that never runs
#: (``reconcile.never_runs``) before it is destroyed: one odd answer ends nothing,
#: and a dead instance bills for at most two rounds.
DEAD_AFTER_ROUNDS = 2
#: Rounds a `stopped` instance is given to start again once the account's funds are back.
RESUME_ROUNDS = 5
#: vast.ai statuses that a host's own trouble shows for a while (its link to vast.ai, a
#: reboot): while the instance's agent still heartbeats to us, it is proving and kept
#: (docs/operations.md, "Statuses judged with the agent").
HOST_TROUBLE_STATUSES = frozenset({"offline", "unknown", "rebooting"})
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


#: The monitor's destroy: (instance id, reason, source) -> whether it changed anything.
Destroy = Callable[..., Awaitable[bool]]


class Reconciler:
    """What reconciliation remembers between rounds (missing and dead rounds, instances
    kept and told once, outbid and resuming ones) and the round itself."""

    def __init__(self, settings: Settings, store: Store, provider: Provider,
                 clock: policy.Clock, tracker: HeartbeatTracker, account: Account,
                 destroy: Destroy, *, ended_by_us: Collection[int] = ()) -> None:
        self.settings = settings
        # Provider instance ids whose contract our own answer ended (a rejected price
        # increase): their stop is no fault of the machine.
        self.ended_by_us = ended_by_us
        # What vast.ai last showed of each instance it lists: vast id -> actual_status,
        # status_msg and when (a webhook's round updates it within a second).
        self.vast_seen: dict[int, dict[str, Any]] = {}
        self.store = store
        self.provider = provider
        self.clock = clock
        self.tracker = tracker
        self.account = account
        self.destroy = destroy
        self.strike_rule = policy.StrikeRule.from_settings(settings)
        self._missing_rounds: dict[int, int] = {}
        self._dead_rounds: dict[int, int] = {}
        # Where vast.ai says each of our instances' Curio port is (instance id -> public
        # IP:port, ``decisions.attribution.listed_address``), as of the last list.
        self.curio_addresses: dict[int, str] = {}
        # Instances kept although vast.ai showed a status that never runs: told once.
        self._kept_told: dict[int, str] = {}
        # Instances started again after the funds came back: until when a `stopped` still
        # means "starting", not dead.
        self._resuming: dict[int, float] = {}
        # Interruptible instances seen outbid (stopped, funds fine): since when, by row id.
        self._outbid_since: dict[int, float] = {}
        # When each of our vast.ai instances was last listed, for the paused seconds.
        self._listed_at: dict[int, float] = {}

    def waits_outbid(self, instance_id: int) -> bool:
        """Whether the instance is an outbid interruptible trial waiting for its host
        (silent by design)."""
        return instance_id in self._outbid_since

    async def reconcile_with_provider(self) -> None:
        try:
            provider_instances = await self.provider.list_instances()
        except AuthError as err:
            # An alert, not a reason to act: nothing is destroyed on a list we cannot read.
            self.account.refused(err)
            return
        except ProviderError as err:
            log.warning("could not list provider instances: %s", err)
            return
        now = self.clock()
        self.vast_seen = {
            int(inst["id"]): {"actual_status": inst.get("actual_status"),
                              "status_msg": inst.get("status_msg"), "seen_at": now}
            for inst in provider_instances if isinstance(inst.get("id"), int)}
        await self.reconcile(provider_instances)

    async def reconcile(self, provider_instances: list[ProviderInstance]) -> list[Any]:
        """Apply ``decisions.reconcile.plan`` to the provider's list; return its actions."""
        now = self.clock()
        parse_label = reconcile_rules.parse_label
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
        if await self._adopt(provider_instances, rows, now):
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
        self.curio_addresses = {
            int(by_pid[int(p["id"])]["id"]): address for p in provider_instances
            if p.get("id") is not None and int(p["id"]) in by_pid
            and (address := listed_address(p)) is not None}
        actions = reconcile_rules.plan(
            listed_instances(provider_instances), our_records(ours), self.settings.fleet_id,
            known, now,
            self.settings.unowned_grace_s,
            # Local instances are never said to be vast.ai's.
            "vast.ai" if self.provider.name == "vast" else f"the {self.provider.name} provider",
        )
        # One list that misses an instance (a provider hiccup) must not end a
        # healthy instance: mark vanished only after consecutive rounds agree.
        missing = {int(a.instance_id) for a in actions if a.kind == "mark_vanished"}
        self._missing_rounds = {
            pid: self._missing_rounds.get(pid, 0) + 1 for pid in missing
        }
        await self._note_paused(provider_instances, by_pid, now)
        await self._note_provider_view(provider_instances, by_pid)
        # A dead status the agent or the account explains is no reason to destroy.
        actions = await self._keep_explained(actions, provider_instances, by_pid, now)
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

    async def _note_paused(self, provider_instances: list[ProviderInstance],
                           by_pid: dict[int, Row], now: float) -> None:
        """Count the seconds vast.ai showed each of our instances not running after its
        hello (no rent) and offline (no storage either), round by round: the bill's
        figures take them out (docs/operations.md, "What an instance costs")."""
        listed: dict[int, float] = {}
        paused: list[tuple[int, float, float]] = []
        for inst in provider_instances:
            try:
                pid = int(inst["id"])
            except (KeyError, TypeError, ValueError):
                continue
            row = by_pid.get(pid)
            if row is None or row["state"] in states.GONE:
                continue
            listed[pid] = now
            last = self._listed_at.get(pid)
            if last is None or now <= last:
                continue
            status = inst.get("actual_status")
            hello = row.get("hello_at")
            rent = now - last if (status != "running" and hello is not None
                                  and float(hello) <= last) else 0.0
            storage = now - last if status == "offline" else 0.0
            if rent or storage:
                paused.append((int(row["id"]), rent, storage))
        self._listed_at = listed
        if not paused:
            return

        def add(tx: Tx) -> None:
            for instance_id, rent, storage in paused:
                tx.instances.add_paused(instance_id, rent_s=rent, storage_s=storage)

        await self.store.write(add)

    async def _note_provider_view(self, provider_instances: list[ProviderInstance],
                                  by_pid: dict[int, Row]) -> None:
        """Keep vast.ai's own view of each of our instances beside ours: its
        ``actual_status``, its ``status_msg`` and what that status bills per hour (rent
        while running, storage unless offline: ``cost.Prices.per_hour``), written when it
        changes (docs/operations.md, "vast.ai's view")."""
        changed: list[tuple[int, str | None, str | None]] = []
        for inst in provider_instances:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                row = by_pid.get(int(inst["id"]))
                if row is None or row["state"] in states.GONE:
                    continue
                status = inst.get("actual_status")
                status = None if status is None else str(status)[:40]
                msg = inst.get("status_msg")
                # status_msg is the host's docker error: untrusted (every view neutralises
                # it), possibly long and multi-line.
                msg = " ".join(str(msg).split())[:300] if msg else None
                if (status, msg) != (row.get("provider_status"), row.get("provider_status_msg")):
                    changed.append((int(row["id"]), status, msg))
        if not changed:
            return

        def note(tx: Tx) -> None:
            for instance_id, status, msg in changed:
                full = tx.get_instance(instance_id)
                offer = stored_offer(full["offer_json"]) if full is not None else None
                prices = (cost.prices_of(offer, full["disk_gb"], full["bid_per_hour"])
                          if full is not None and offer is not None else None)
                billing = (None if prices is None or status is None
                           else prices.per_hour(status=status).total)
                tx.instances.update(instance_id, provider_status=status,
                                    provider_status_msg=msg, billing_per_hour=billing)

        await self.store.write(note)

    async def _outbid_wait(self, row: Row, now: float) -> str | None:
        """Why an outbid interruptible instance is kept (its bid raised within its cap, or
        waiting for its host: ``decisions.outbid``), or None once waiting has cost what a
        fresh trial's setup would (``cost.resume_budget_s``): the dead-status rule ends it."""
        since = self._outbid_since.setdefault(int(row["id"]), now)
        full = self.store.get_instance(int(row["id"]))
        offer = stored_offer(full["offer_json"]) if full is not None else None
        if full is None or offer is None:
            return None
        prices = cost.prices_of(offer, full["disk_gb"], full["bid_per_hour"])
        if prices is None:
            return None
        trial = TrialCost()
        mbps = offer.inet_down or trial.default_inet_down_mbps
        setup_bytes = self.settings.setup_download_gb * cost.BYTES_PER_GB
        setup_s = trial.boot_s + trial.warmup_s + setup_bytes * 8 / (mbps * 1e6)
        budget = cost.resume_budget_s(prices, setup_down_bytes=setup_bytes, setup_s=setup_s,
                                      cap_s=self.settings.lost_timeout_s * 24)
        choice = outbid.choose(
            prices, bid_per_hour=float(full["bid_per_hour"]), rate_per_hour=full["rate_per_hour"],
            max_usd_per_proof=break_even_usd_per_proof(self.settings),
            max_bid_per_hour=self.settings.max_bid_per_hour,
            max_deploy_dph_total=self.settings.max_deploy_dph_total,
            waited_s=now - since, wait_budget_s=budget)
        change = getattr(self.provider, "change_bid", None)
        if choice.action == "raise" and change is not None and choice.bid_per_hour is not None:
            pid, bid = int(full["provider_instance_id"]), choice.bid_per_hour
            try:
                await change(pid, bid)
            except ProviderError as err:
                return f"{choice.reason}; vast.ai refused the new bid ({err}): tried next round"
            await self.store.write(lambda tx: tx.instances.update(
                int(row["id"]), bid_per_hour=bid, updated_at=now))
            return choice.reason
        return None if choice.action == "destroy" else choice.reason

    async def _requeue_if_trial(self, row: Row, now: float) -> None:
        """An interruptible trial outbid before its benchmark ended: neither the host's
        failure nor a measurement. Said once; its machine stays free to be tried again."""
        full = self.store.get_instance(int(row["id"]))
        if full is None or full["rate_per_hour"] is not None or row.get("bid_per_hour") is None:
            return

        def note(tx: Tx) -> None:
            tx.audit.add(now, "requeued", "outbid mid-trial and not back in time: "
                         "destroyed with no strike, no measurement; its machine may be "
                         "tried again", instance_id=row["id"], agent_id=row["agent_id"],
                         machine_id=row["machine_id"])

        await self.store.write(note)

    async def funds_back(self, now: float) -> None:
        """Funds are back above zero: start the instances vast.ai stopped for them and give
        each a fresh silence clock (docs/operations.md, "The account")."""
        held = [rid for rid, why in self._kept_told.items() if why.startswith("stopped")]
        start = getattr(self.provider, "start_instance", None)
        rows = [r for r in (self.store.get_instance(rid) for rid in held) if r is not None]
        for row in rows:
            if start is not None and row["provider_instance_id"] is not None:
                try:
                    await start(int(row["provider_instance_id"]))
                except ProviderError as err:
                    log.warning("could not start instance %s again: %s", row["id"], err)

        def resume(tx: Tx) -> None:
            for row in rows:
                updates: dict[str, Any] = {"updated_at": now}
                if row["state"] == State.LOST:
                    updates["state_since"] = now  # the lost timeout starts afresh
                tx.instances.update(row["id"], **updates)
                tx.audit.add(now, "resumed", "the account's funds are back above zero: "
                             "started again", instance_id=row["id"],
                             agent_id=row["agent_id"], machine_id=row["machine_id"])

        if rows:
            await self.store.write(resume)
        for row in rows:
            self._kept_told.pop(int(row["id"]), None)
            self._resuming[int(row["id"])] = now + RESUME_ROUNDS * self.settings.monitor_interval_s

    async def _keep_explained(self, actions: list[Any], provider_instances: list[ProviderInstance],
                              by_pid: dict[int, Row], now: float) -> list[Any]:
        """Drop the ``destroy_dead`` actions that are not the host's end: ``offline``,
        ``unknown`` or ``rebooting`` while the instance's agent still heartbeats (its
        silence timer has not run out), and ``stopped`` while the account's funds are at
        or below zero (vast.ai stops every instance then, docs/vast.md). Each is told once
        as an event; the silence rules still act if the agent goes quiet."""
        status_of = {}
        for inst in provider_instances:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                status_of[int(inst["id"])] = inst.get("actual_status")
        kept: list[tuple[Row, str]] = []
        explained: set[int] = set()
        out = []
        for action in actions:
            row = by_pid.get(int(action.instance_id))
            status = status_of.get(int(action.instance_id))
            why = None
            if action.kind == "destroy_dead" and row is not None:
                if status in HOST_TROUBLE_STATUSES and \
                        self.tracker.last_seen(int(row["id"])) is not None:
                    why = (f"vast.ai shows {status} while its agent heartbeats: kept, "
                           "proving (the silence rules act if the agent goes quiet)")
                elif status == "stopped" and self.account.at_or_below_zero:
                    why = ("stopped by vast.ai at zero funds: an account event, kept until "
                           "billing resumes; add credit")
                elif status == "stopped" and self._resuming.get(int(row["id"]), 0.0) > now:
                    why = "being started again now that the account's funds are back"
                elif status == "stopped" and row.get("bid_per_hour") is not None:
                    why = await self._outbid_wait(row, now)
            if why is None or row is None:
                out.append(action)
                continue
            self._dead_rounds.pop(int(action.instance_id), None)
            explained.add(int(row["id"]))
            if self._kept_told.get(int(row["id"])) != why:
                kept.append((row, why))
        self._kept_told = {k: v for k, v in self._kept_told.items() if k in explained}
        self._resuming = {k: t for k, t in self._resuming.items() if t > now}
        outbid_now = {int(r["id"]) for r in by_pid.values()
                      if r.get("bid_per_hour") is not None
                      and status_of.get(int(r["provider_instance_id"] or 0)) == "stopped"}
        back = [k for k in self._outbid_since if k not in outbid_now]
        self._outbid_since = {k: t for k, t in self._outbid_since.items() if k in outbid_now}
        if back:
            # Its host again: the agent restarts with the container; its silence timeout
            # starts afresh rather than from before the wait.
            def resumed(tx: Tx) -> None:
                for instance_id in back:
                    inst = tx.get_instance(instance_id)
                    if inst is None or inst["state"] in states.ENDING:
                        continue
                    if inst["state"] == State.LOST:
                        tx.instances.update(instance_id, state_since=now, updated_at=now)
                    tx.audit.add(now, "resumed", "no longer outbid: running again",
                                 instance_id=instance_id, agent_id=inst["agent_id"],
                                 machine_id=inst["machine_id"])

            await self.store.write(resumed)
        if kept:
            def note(tx: Tx) -> None:
                for row, why in kept:
                    tx.audit.add(now, "kept", why, instance_id=row["id"],
                                 agent_id=row["agent_id"], machine_id=row["machine_id"])
            await self.store.write(note)
            for row, why in kept:
                self._kept_told[int(row["id"])] = why
        return out

    #: What reconciliation reads of each record (not the hello's wide ``host_json``).
    _RECONCILE_COLUMNS = ("id", "agent_id", "machine_id", "provider", "provider_instance_id",
                          "state", "created_at", "terminate_reason", "hello_at",
                          "bid_per_hour", "provider_status", "provider_status_msg")

    def _deployed_rows(self, reads: Reads) -> list[Row]:
        """Our records of instances this provider rented (not bring-your-own machines,
        not another provider's rows left in the same database); run on the reader thread."""
        name = self.provider.name
        return [
            # Filtered in SQL, on the kind index: a large bring-your-own fleet costs nothing.
            r for r in reads.instances_of_kind("deployed", self._RECONCILE_COLUMNS)
            if r["provider"] in (None, name)
        ]

    async def _adopt(self, provider_instances: list[ProviderInstance], rows: list[Row],
                     now: float) -> bool:
        """Records without a provider instance id given the instance carrying their label
        (``operations.adoption``); whether anything changed."""
        found = adoptions(provider_instances, rows, self.settings.fleet_id)
        if found:
            await self.store.write(adopt_job(found, self.provider.name, now))
        return bool(found)

    async def _apply(self, action: Any, row: Row | None, now: float) -> None:
        kind, pid, reason = action.kind, int(action.instance_id), action.reason
        if kind == "mark_vanished":
            if row is None:
                return

            def vanish(tx: Tx) -> None:
                tx.instances.update(
                    row["id"], state=State.VANISHED, state_since=now, destroyed_at=now,
                    terminate_reason=row["terminate_reason"] or reason, updated_at=now,
                )
                tx.audit.add(now, "vanished", reason, instance_id=row["id"],
                             agent_id=row["agent_id"], machine_id=row["machine_id"])

            await self.store.write(vanish)
            self.tracker.forget(int(row["id"]))
            return
        # destroy_dead, destroy_leaked
        if kind == "destroy_dead":
            reason = f"{reason}, seen in {self._dead_rounds.get(pid, 0)} rounds in a row"
        if row is not None and row["state"] not in states.GONE:
            if kind == "destroy_dead" and "status stopped" in reason and (
                    row.get("bid_per_hour") is not None or pid in self.ended_by_us):
                # An outbid interruptible instance, or a contract ended by our rejection
                # of its price increase: no fault of its machine.
                await self._requeue_if_trial(row, now)
            elif kind == "destroy_dead":
                # A trial that never ran (exited, a container that could not start): a
                # strike against its machine.
                rule = self.strike_rule

                def strike(tx: Tx) -> None:
                    tx.instances.begin_terminating(int(row["id"]), reason, kind="dead", now=now,
                                                   destroy_due_at=now, strike=rule)

                await self.store.write(strike)
            await self.destroy(int(row["id"]), reason, source=kind)
            return
        await self.provider.destroy_instance(pid)
        await self.store.write(
            lambda tx: tx.audit.add(
                now, kind, f"{self.provider.name} instance {pid}: {reason}",
                instance_id=row["id"] if row else None,
                agent_id=row["agent_id"] if row else None,
                data={"provider_instance_id": pid},
            )
        )
