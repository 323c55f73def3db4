"""Writes of a result: the ``results`` row, the ``measurements`` row it makes (the one
record of a measured rate), the ``scaling`` reading, and everything else it decided."""

from __future__ import annotations

from typing import Any, NamedTuple

from vast_manager.coordinator.store.migrations import loads
from vast_manager.coordinator.store.reads import rows_of
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.instances import Ending, InstanceWrites
from vast_manager.coordinator.store.writes.tx_base import TxBase


class ResultWrite(NamedTuple):
    """Everything one result writes, decided before any of it is written
    (``operations.result.result_job``): one ``Tx.write_result`` call."""

    instance_id: int
    agent_id: str
    machine_id: str | None
    now: float
    updates: dict[str, Any]
    """The instance's columns (with its end, ``begin_terminating``'s own columns)."""
    events: tuple[tuple[str, str], ...]
    """(kind, reason) of each event about the instance, before its end, in order."""
    result: dict[str, Any]
    """The ``results`` row."""
    ending: Ending | None = None
    pace_s: int | None = None
    """The pace answered, when it is not the one stored."""
    measurement: dict[str, Any] | None = None
    """The ``measurements`` row (its result's row id filled in here), for a result that
    counts: the one record of its rate (``host_perf`` is computed from them)."""
    scaling: tuple[dict[str, Any], str, str] | None = None
    """The ``scaling`` row (its result's row id filled in here), its event's reason, and
    the machine the event names."""


class ResultWrites:
    """One result's whole write, and the rows it is made of."""

    def __init__(self, tx: TxBase, instances: InstanceWrites, events: EventWrites) -> None:
        self._tx = tx
        self._instances = instances
        self._events = events

    def write(self, w: ResultWrite) -> int:
        """Everything a result decided, in the order it is read back: its events, the
        instance (ended, or updated), the pace, the result,
        the measurement it makes, the scaling reading. Returns the result's row id."""
        for kind, reason in w.events:
            self._events.add(w.now, kind, reason, instance_id=w.instance_id,
                             agent_id=w.agent_id, machine_id=w.machine_id)
        if w.ending is not None:
            e = w.ending
            self._instances.begin_terminating(
                w.instance_id, e.reason, kind=e.kind, now=w.now, destroy_due_at=e.destroy_due_at,
                note=e.note, bad_host_source=e.bad_host_source, strike=e.strike, **w.updates)
        else:
            self._instances.update(w.instance_id, **w.updates)
        if w.pace_s is not None:
            self._instances.update(w.instance_id, heartbeat_pace_s=w.pace_s)
        row_id = self.add(w.result)
        if w.measurement is not None:
            self.add_measurement({**w.measurement, "result_row_id": row_id})
        if w.scaling is not None:
            row, reason, machine_id = w.scaling
            self.add_scaling({"result_row_id": row_id, **row})
            self._events.add(w.now, "scaling", reason, instance_id=w.instance_id,
                             agent_id=w.agent_id, machine_id=machine_id)
        return row_id

    def add(self, row: dict[str, Any]) -> int:
        return self._tx._insert("results", row)

    def demote(self, instance_id: int, reason: str) -> int:
        """An instance found delivering far below the rate it was kept on (docs/reliability.md,
        "Judged by what it delivers"): its fleet measurements leave host_perf and the model, its
        counted results are flagged ``demoted`` with ``reason``. Returns the measurements
        taken out."""
        taken = self._tx._exec(
            "delete from measurements where instance_id = ? and source = 'fleet'",
            (instance_id,)).rowcount
        self._tx._exec(
            "update results set counts_for_host_perf = 0, "
            "flags = case when coalesce(flags, '') = '' then 'demoted' "
            "else flags || ',demoted' end, "
            "flag_reasons_json = json_insert(coalesce(flag_reasons_json, '[]'), '$[#]', ?) "
            "where instance_id = ? and counts_for_host_perf = 1",
            (f"demoted: {reason}", instance_id))
        return int(taken)

    def learn_delivered(self, instance_id: int, delivered_rate_per_hour: float) -> int:
        """An instance whose delivered work agreed with the rate it was kept on: its fleet
        measurements learned bounded (``model_cap_per_hour``) are read up to what it
        delivered (wholly at or above their rate). Returns the measurements raised. Each
        is written anew (a new id), so the measurements' version changes and the model
        keeper refits."""
        rows = rows_of(self._tx._conn,
                       "select * from measurements where instance_id = ? and source = 'fleet' "
                       "and model_cap_per_hour < ?", (instance_id, delivered_rate_per_hour))
        for found in rows:
            self._tx._exec("delete from measurements where id = ?", (found.pop("id"),))
            found["model_cap_per_hour"] = None if float(found["rate_per_hour"]) \
                <= delivered_rate_per_hour else delivered_rate_per_hour
            self._tx._insert("measurements", found)
        return len(rows)

    def add_measurement(self, row: dict[str, Any]) -> bool:
        """One measurement (``measurements``' columns but ``dph_total``, which is read from
        its offer here), the one record of a measured rate (``host_perf`` is computed from
        them); False when the same machine's rate at the same time is already there (a file
        imported twice, a fleet's own export)."""
        price = (loads(row["offer_json"]) or {}).get("dph_total")
        row = {**row, "dph_total": float(price) if isinstance(price, int | float)
               and not isinstance(price, bool) else None}
        cols = ", ".join(f"[{c}]" for c in row)
        marks = ", ".join("?" for _ in row)
        cur = self._tx._exec(f"insert or ignore into measurements ({cols}) values ({marks})",
                         list(row.values()))
        return cur.rowcount > 0

    def add_scaling(self, row: dict[str, Any]) -> int:
        return self._tx._insert("scaling", row)
