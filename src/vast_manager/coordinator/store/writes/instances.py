"""Writes of ``instances``: inserted, updated (the hot columns' cache kept current),
sent to ``terminating``, paused billing, a rebenchmark delivered."""

from __future__ import annotations

from typing import Any, NamedTuple

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.settings import DEFAULTS
from vast_manager.coordinator.store.writes.bad_hosts import BadHostWrites
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.tx_base import TxBase


class _StrikeDefaults(NamedTuple):
    block_s: float = DEFAULTS.strike_block_s


DEFAULT_STRIKES = _StrikeDefaults()


class Ending(NamedTuple):
    """An instance sent to ``terminating`` by what its agent said
    (``Tx.instances.begin_terminating``)."""

    reason: str
    kind: str
    destroy_due_at: float
    strike: Any = None  # a ``policy.StrikeRule`` when the trial counts against its machine
    note: str | None = None  # the event's text (None: the reason)
    bad_host_source: str | None = None  # lists the machine on ``bad_hosts`` as this source
    failed_in: str | None = None  # the state the instance failed in (``decisions.blame``)


class InstanceWrites:
    """An instance's row, and the one way anything ends an instance."""

    def __init__(self, tx: TxBase, events: EventWrites, bad_hosts: BadHostWrites) -> None:
        self._tx = tx
        self._events = events
        self._bad_hosts = bad_hosts

    def add(self, row: dict[str, Any]) -> int:
        return self._tx._insert("instances", row)

    def update(self, instance_id: int, **cols: Any) -> None:
        if not cols:
            return
        sets = ", ".join(f"[{c}] = ?" for c in cols)
        self._tx._exec(f"update instances set {sets} where id = ?", [*cols.values(), instance_id])
        hot = self._tx._hot_by_id.get(instance_id)
        if hot is not None:
            if "agent_id" in cols:  # re-keyed: read afresh when next asked
                del self._tx._hot_by_id[instance_id]
                self._tx._hot_by_agent.pop(hot["agent_id"], None)
                return
            for name in cols.keys() & hot.keys():
                hot[name] = cols[name]

    def begin_terminating(
        self, instance_id: int, reason: str, *, kind: str, now: float, destroy_due_at: float,
        note: str | None = None, data: Any = None, bad_host_source: str | None = None,
        strike: Any = None, failed_in: str | None = None, **cols: Any,
    ) -> bool:
        """Send an instance to ``terminating``: the one way anything ends an instance.

        The monitor destroys it (or, bring-your-own, revokes its agent) at
        ``destroy_due_at``; until then its directive is ``terminate`` with the reason.
        An instance already ending keeps its state (``failed`` says what happened) and
        the first reason it was given; its destroy falls due at ``destroy_due_at`` (a
        revoke brings it forward, a failed destroy puts it back). Records the event
        ``kind`` (its text: ``note``, else the reason) and, with ``bad_host_source``,
        lists the machine on ``bad_hosts`` under that source; with ``strike``, judges the
        failure (``failed_in``: the state it failed in, if no longer the row's). ``cols``:
        more columns
        to set in the same update. Returns False, writing nothing, for an instance
        that is gone (or unknown): there is no machine left to free.
        """
        inst = self._tx.get_instance(instance_id)
        if inst is None or inst["state"] in states.GONE:
            return False
        failed_in = failed_in or str(inst["state"])
        updates: dict[str, Any] = {
            **cols,
            "terminate_reason": inst["terminate_reason"] or reason,
            "destroy_due_at": destroy_due_at,
            "updated_at": now,
        }
        if inst["state"] not in states.ENDING:
            updates.update(state=states.State.TERMINATING, state_since=now)
        self.update(instance_id, **updates)
        ids = {"instance_id": instance_id, "agent_id": inst["agent_id"],
               "machine_id": inst["machine_id"]}
        self._events.add(now, kind, reason if note is None else note, data=data, **ids)
        if bad_host_source is not None:
            # Evidence against the machine at its own price: blocked, never for ever.
            machine_id = inst["machine_id"] or inst["label"]
            block_s = (strike or DEFAULT_STRIKES).block_s
            self._bad_hosts.add(machine_id, reason=reason, source=bad_host_source, now=now,
                                instance_id=instance_id, expires_at=now + block_s)
            self._events.add(now, "bad_host", f"{machine_id}: blocked for "
                             f"{block_s / 3600:.0f} h: {reason}", **ids)
        elif strike is not None and inst["machine_id"] and inst["kind"] == "deployed":
            # A failed trial (``policy.StrikeRule``): judged (``decisions.blame``), and
            # counted against its machine when it is the host's fault.
            self._bad_hosts.strike(str(inst["machine_id"]), reason, now=now,
                                   instance_id=instance_id, limit=strike.limit,
                                   window_s=strike.window_s, block_s=strike.block_s, kind=kind,
                                   state=failed_in)
        return True

    def add_paused(self, instance_id: int, *, rent_s: float, storage_s: float) -> None:
        """Seconds vast.ai billed no rent (not running) and no storage (offline)."""
        self._tx._exec("update instances set rent_paused_s = coalesce(rent_paused_s, 0) + ?, "
                   "storage_paused_s = coalesce(storage_paused_s, 0) + ? where id = ?",
                   (rent_s, storage_s, instance_id))

