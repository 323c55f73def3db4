"""Writes of ``bad_hosts`` and ``machine_strikes``: machines refused, and failed trials
counted against them."""

from __future__ import annotations

from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.tx_base import TxBase


class BadHostWrites:
    """A machine listed or unlisted, a strike counted (each with its event)."""

    def __init__(self, tx: TxBase, events: EventWrites) -> None:
        self._tx = tx
        self._events = events

    def add(
        self,
        machine_id: str,
        *,
        reason: str,
        source: str,
        now: float,
        instance_id: int | None = None,
        expires_at: float | None = None,
    ) -> None:
        self._tx._exec(
            "insert into bad_hosts (machine_id, reason, added_at, source, instance_id, "
            "expires_at) values (?, ?, ?, ?, ?, ?) on conflict (machine_id) do update set "
            "reason = excluded.reason, source = excluded.source, "
            "instance_id = coalesce(excluded.instance_id, instance_id), "
            "added_at = excluded.added_at, expires_at = excluded.expires_at",
            (machine_id, reason, now, source, instance_id, expires_at),
        )

    def strike(self, machine_id: str, reason: str, *, now: float, instance_id: int | None,
                   limit: int, window_s: float, block_s: float) -> str | None:
        """Count a failed trial against its machine (once per instance); with ``limit``
        strikes within ``window_s`` the machine is blocked for ``block_s`` with their
        reasons. Returns the block's reason when this strike made one."""
        cur = self._tx._exec(
            "insert or ignore into machine_strikes (machine_id, instance_id, reason, at) "
            "values (?, ?, ?, ?)", (machine_id, instance_id, reason, now))
        if cur.rowcount == 0:
            return None
        recent = [str(r[0]) for r in self._tx._exec(
            "select reason from machine_strikes where machine_id = ? and at > ? "
            "order by at, id", (machine_id, now - window_s)).fetchall()]
        self._events.add(now, "strike", f"{machine_id}: {reason} ({len(recent)} of {limit} "
                         f"within {window_s / 3600:.0f} h)", instance_id=instance_id,
                         machine_id=machine_id)
        if len(recent) < limit:
            return None
        why = f"{len(recent)} failed trials: " + "; ".join(recent)
        self.add(machine_id, reason=why[:1000], source="strikes", now=now,
                          instance_id=instance_id, expires_at=now + block_s)
        self._events.add(now, "bad_host", f"{machine_id}: {why[:1000]} (blocked for "
                         f"{block_s / 3600:.0f} h)", instance_id=instance_id,
                         machine_id=machine_id)
        return why

    def remove(self, machine_id: str) -> bool:
        cur = self._tx._exec("delete from bad_hosts where machine_id = ?", (machine_id,))
        return cur.rowcount > 0
