"""Writes of a heartbeat: its instance's columns (a steady one's held), its history
(downsampled, held) and telemetry (held), and everything else it decided."""

from __future__ import annotations

from typing import Any, NamedTuple

from vast_manager.coordinator.rows import InstanceRow, instance_row
from vast_manager.coordinator.store.reads import one_row
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.held import HISTORY_ROW, Gauges
from vast_manager.coordinator.store.writes.instances import Ending, InstanceWrites
from vast_manager.coordinator.store.writes.tx_base import TxBase


class HeartbeatWrite(NamedTuple):
    """Everything one heartbeat writes, decided before any of it is written
    (``operations.heartbeat``): one ``Tx.write_heartbeat`` call."""

    instance_id: int
    agent_id: str
    machine_id: str | None
    now: float
    gauges: Gauges | None = None
    """A steady heartbeat's instance columns, held."""
    updates: dict[str, Any] | None = None
    """Any other heartbeat's instance columns, written at once."""
    events: tuple[tuple[str, str], ...] = ()
    """(kind, reason) of each event about the instance, in order."""
    ending: Ending | None = None
    telemetry_json: str | None = None
    history: tuple[Any, ...] | None = None
    """A ``heartbeat_history`` row (``HISTORY_ROW`` order), kept if its interval is up."""
    history_interval_s: float = 0.0
    history_keep_rows: int = 0


class HeartbeatWrites:
    """One heartbeat's whole write, and the held rows it is made of."""

    def __init__(self, tx: TxBase, instances: InstanceWrites, events: EventWrites) -> None:
        self._tx = tx
        self._instances = instances
        self._events = events

    def hold(self, instance_id: int, gauges: Gauges) -> None:
        """A steady heartbeat's instance columns, held (see
        ``__init__``)."""
        self._tx._held_job.gauges[instance_id] = gauges
        hot = self._tx._hot_by_id.get(instance_id)
        if hot is not None:
            hot["last_seq"] = gauges.last_seq

    def write(self, w: HeartbeatWrite) -> None:
        """Everything a heartbeat decided, in the order it is read back: the instance's
        columns (a steady heartbeat's held), its events, its end, its telemetry and
        history."""
        if w.gauges is not None:
            self.hold(w.instance_id, w.gauges)
        if w.updates:
            self._instances.update(w.instance_id, **w.updates)
        for kind, reason in w.events:
            self._events.add(w.now, kind, reason, instance_id=w.instance_id,
                             agent_id=w.agent_id, machine_id=w.machine_id)
        if w.ending is not None:
            self._instances.begin_terminating(w.instance_id, w.ending.reason, kind=w.ending.kind,
                                              now=w.now, destroy_due_at=w.ending.destroy_due_at,
                                              strike=w.ending.strike, failed_in=w.ending.failed_in)
        if w.telemetry_json is not None:
            self.upsert_telemetry(w.instance_id, w.now, w.telemetry_json)
        if w.history is not None:
            self._hold_history(w.history, w.history_interval_s, w.history_keep_rows)

    def view(self, agent_id: str) -> InstanceRow | None:
        """The agent's instance (``HOT_COLUMNS``, cached) when the agent is issued and not
        revoked; None otherwise (the heartbeat then reads the whole row, which says why)."""
        tx = self._tx
        hot = tx.hot_instance(agent_id) if tx.agent_revoked(agent_id) is False else None
        return None if hot is None else instance_row(hot)

    def append_history(
        self, row: dict[str, Any], *, interval_s: float, keep_rows: int
    ) -> bool:
        """Keep at most one history row per agent per ``interval_s``, and ``keep_rows`` of them.

        Returns whether a row was written (downsampling drops the others).
        """
        return self._hold_history(tuple(row[c] for c in HISTORY_ROW), interval_s, keep_rows)

    def _hold_history(self, row: tuple[Any, ...], interval_s: float, keep_rows: int) -> bool:
        """``append_heartbeat_history`` of a row in ``HISTORY_ROW`` order."""
        agent_id = row[0]
        now = float(row[2])
        last = self._tx._history_last_at.get(agent_id)
        if last is None:
            # The newest row by id is the newest in time (rows are appended as they come):
            # one index seek, where max(received_at) read every row of the agent. (A miss:
            # an agent's first heartbeat, or the first after a rollback dropped the cache.)
            found = one_row(
                self._tx._conn,
                "select received_at as at from heartbeat_history where agent_id = ? "
                "order by id desc limit 1",
                (agent_id,),
            )
            last = float(found["at"]) if found and found["at"] is not None else float("-inf")
        if now - last < interval_s:
            self._tx._history_last_at[agent_id] = last
            return False
        # Held like a steady heartbeat's rows: a read or a statement of its own here would
        # write the transaction's held rows early and open this job's savepoint, for one
        # in twenty heartbeats of a fleet at the default pace.
        self._tx._held_job.history.append(row)
        self._tx._held_job.trims[agent_id] = keep_rows
        self._tx._history_last_at[agent_id] = now
        return True

    def upsert_telemetry(self, instance_id: int, now: float, telemetry_json: str) -> None:
        """Set an instance's latest telemetry: held, and written with its transaction's
        other telemetry in a few multi-row statements (see ``_Held``)."""
        self._tx._held_job.telemetry[instance_id] = (instance_id, now, telemetry_json)
