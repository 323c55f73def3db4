"""Writes of a result: the ``results`` row, the ``measurements`` row it makes (the one
record of a measured rate), the ``scaling`` reading, and everything else it decided."""

from __future__ import annotations

from typing import Any, NamedTuple

from vast_manager.coordinator.store.migrations import loads
from vast_manager.coordinator.store.writes.instances import Ending, InstanceWrites


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
    benchmark_delivered: bool = False
    measurement: dict[str, Any] | None = None
    """The ``measurements`` row (its result's row id filled in here), for a result that
    counts: the one record of its rate (``host_perf`` is computed from them)."""
    scaling: tuple[dict[str, Any], str, str] | None = None
    """The ``scaling`` row (its result's row id filled in here), its event's reason, and
    the machine the event names."""


class ResultWrites(InstanceWrites):
    """One result's whole write, and the rows it is made of."""

    def write_result(self, w: ResultWrite) -> int:
        """Everything a result decided, in the order it is read back: its events, the
        instance (ended, or updated), the pace, the delivered rebenchmark, the result,
        the measurement it makes, the scaling reading. Returns the result's row id."""
        for kind, reason in w.events:
            self.insert_event(w.now, kind, reason, instance_id=w.instance_id,
                              agent_id=w.agent_id, machine_id=w.machine_id)
        if w.ending is not None:
            self.begin_terminating(w.instance_id, w.ending.reason, kind=w.ending.kind,
                                   now=w.now, destroy_due_at=w.ending.destroy_due_at,
                                   note=w.ending.note, bad_host_source=w.ending.bad_host_source,
                                   strike=w.ending.strike, **w.updates)
        else:
            self.update_instance(w.instance_id, **w.updates)
        if w.pace_s is not None:
            self.update_instance(w.instance_id, heartbeat_pace_s=w.pace_s)
        if w.benchmark_delivered:
            self.deliver_rebenchmark(w.instance_id, w.agent_id, w.machine_id, w.now)
        row_id = self.insert_result(w.result)
        if w.measurement is not None:
            self.insert_measurement({**w.measurement, "result_row_id": row_id})
        if w.scaling is not None:
            row, reason, machine_id = w.scaling
            self.insert_scaling({"result_row_id": row_id, **row})
            self.insert_event(w.now, "scaling", reason, instance_id=w.instance_id,
                              agent_id=w.agent_id, machine_id=machine_id)
        return row_id

    def insert_result(self, row: dict[str, Any]) -> int:
        return self._insert("results", row)

    def demote(self, instance_id: int, reason: str) -> int:
        """An instance found delivering far below the rate it was kept on (docs/reliability.md,
        "Judged by what it delivers"): its fleet measurements leave host_perf and the model, its
        counted results are flagged ``demoted`` with ``reason``. Returns the measurements
        taken out."""
        taken = self._exec("delete from measurements where instance_id = ? and source = 'fleet'",
                           (instance_id,)).rowcount
        self._exec(
            "update results set counts_for_host_perf = 0, "
            "flags = case when coalesce(flags, '') = '' then 'demoted' "
            "else flags || ',demoted' end, "
            "flag_reasons_json = json_insert(coalesce(flag_reasons_json, '[]'), '$[#]', ?) "
            "where instance_id = ? and counts_for_host_perf = 1",
            (f"demoted: {reason}", instance_id))
        return int(taken)

    def insert_measurement(self, row: dict[str, Any]) -> bool:
        """One measurement (``measurements``' columns but ``dph_total``, which is read from
        its offer here), the one record of a measured rate (``host_perf`` is computed from
        them); False when the same machine's rate at the same time is already there (a file
        imported twice, a fleet's own export)."""
        price = (loads(row["offer_json"]) or {}).get("dph_total")
        row = {**row, "dph_total": float(price) if isinstance(price, int | float)
               and not isinstance(price, bool) else None}
        cols = ", ".join(f"[{c}]" for c in row)
        marks = ", ".join("?" for _ in row)
        cur = self._exec(f"insert or ignore into measurements ({cols}) values ({marks})",
                         list(row.values()))
        return cur.rowcount > 0

    def insert_scaling(self, row: dict[str, Any]) -> int:
        return self._insert("scaling", row)
