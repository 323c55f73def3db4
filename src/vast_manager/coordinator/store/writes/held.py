"""Rows a transaction holds back and writes together: steady heartbeats' instance
columns, the latest telemetry (on the instance's row too) and history, many rows a
statement, before anything else touches the database and before the COMMIT
(coordinator/store/writer.py says why)."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from vast_manager.coordinator.store.reads import INSTANCE_TELEMETRY_COLUMNS


class Gauges(NamedTuple):
    """What a steady heartbeat sets on its instance (``tx.heartbeats.hold``), which is also
    the agent's latest heartbeat (the ``heartbeats`` view), and the pace it was answered:
    one field a column, declared once (the held statement is written from these names)."""

    last_seq: int
    last_seen: float
    phase: str
    phase_started_at: float | None
    progress_json: str | None
    proofs_completed_total: int
    updated_at: float
    last_non_benchmark_at: float
    heartbeat_at: float
    proof_seconds_recent_json: str
    heartbeat_pace_s: int
    net_rx_bytes: int | None
    net_tx_bytes: int | None


#: ``Gauges``' columns, in statement order.
HEARTBEAT_COLUMNS: tuple[str, ...] = Gauges._fields
#: A ``heartbeat_history`` row's columns, in statement order.
HISTORY_ROW = ("agent_id", "instance_id", "received_at", "seq", "phase",
               "proofs_completed_total", "telemetry_json")


@functools.cache
def keep_newest(table: str, owner: str) -> str:
    """Retention: delete one owner's rows below its ``keep`` newest (parameters: the owner
    twice, then ``keep``). Rows are appended in time order, so the newest have the
    highest ids, found on the (owner, id) index."""
    return (f"delete from [{table}] where [{owner}] = ? and id <= (select id from [{table}] "
            f"where [{owner}] = ? order by id desc limit 1 offset ?)")


# Multi-row statements write held rows in a few steps, not one per row: each step lets go
# of the GIL, and getting it back from a busy event loop can take a switch interval
# (5 ms), so a step per row made the writer crawl exactly when the fleet was busiest.
_ROWS_PER_STATEMENT = 64
# Parameters a statement may have: 999 before SQLite 3.32, 32,766 since. A statement of
# 64 instance rows has 1,024.
_MAX_PARAMETERS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999

#: The instance columns a transaction's held rows set together (``Held.write``), each set
#: written through a view of its own on the writer's connection (``install``).
_COLUMN_SETS: dict[tuple[str, ...], str] = {
    HEARTBEAT_COLUMNS + INSTANCE_TELEMETRY_COLUMNS: "held_gauges_telemetry",
    HEARTBEAT_COLUMNS: "held_gauges",
    INSTANCE_TELEMETRY_COLUMNS: "held_telemetry",
}


def install(conn: sqlite3.Connection, table: str = "instances") -> None:
    """On the writer's connection, for each of ``_COLUMN_SETS``: a view of those instance
    columns, and a trigger that turns each row inserted into it into an update of its
    instance (an id no instance has updates nothing).

    One multi-row INSERT into the view then updates a batch's instances one by one inside
    SQLite, where ``UPDATE ... FROM (VALUES ...)`` first copied every row, its telemetry
    included, into two temporary tables (the values, then the rows to update with their
    new values): about 3.5 us of the writer's CPU less a heartbeat, a ninth of it
    (docs/performance.md, "What a heartbeat's rows cost the writer"). ``TEMP`` objects:
    the connection's own, so the database file's schema, its migrations and its replicas
    are as they were. (``table``: another table with these columns, for
    ``bench/writer.py --side-table``.)"""
    for columns, view in _COLUMN_SETS.items():
        conn.execute(f"drop view if exists temp.{view}")  # and its trigger
        conn.execute(f"create temp view {view} as select id, {', '.join(columns)} from {table}")
        sets = ", ".join(f"{c} = new.{c}" for c in columns)
        conn.execute(f"create temp trigger {view}_update instead of insert on {view} "
                     f"begin update {table} set {sets} where id = new.id; end")


def _chunks(rows: list[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    """Power-of-two pieces (at most ``_ROWS_PER_STATEMENT``, and within ``_MAX_PARAMETERS``):
    a handful of statement texts for SQLite's cache to keep compiled, whatever the batch
    size."""
    fits = min(_ROWS_PER_STATEMENT, _MAX_PARAMETERS // len(rows[0])) if rows else 1
    most = 1 << (fits.bit_length() - 1)
    start = 0
    while start < len(rows):
        size = min(most, 1 << ((len(rows) - start).bit_length() - 1))
        yield rows[start:start + size]
        start += size


@functools.cache
def _values(width: int, count: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return ", ".join([one] * count)


@functools.cache
def _instances_update(columns: tuple[str, ...], count: int) -> str:
    """``count`` instance rows' ``columns`` in one statement (rows: the id, then the values),
    through the columns' view (``install``)."""
    return (f"insert into {_COLUMN_SETS[columns]} (id, {', '.join(columns)}) "
            f"values {_values(1 + len(columns), count)}")


@functools.cache
def _history_insert(count: int) -> str:
    return (f"insert into heartbeat_history ({', '.join(HISTORY_ROW)}) "
            f"values {_values(len(HISTORY_ROW), count)}")


def _write_rows(conn: sqlite3.Connection, statement: Callable[[int], str],
                rows: list[tuple[Any, ...]]) -> None:
    for chunk in _chunks(rows):
        conn.execute(statement(len(chunk)), [v for row in chunk for v in row])


def _update_instances(conn: sqlite3.Connection, columns: tuple[str, ...],
                      rows: list[tuple[Any, ...]]) -> None:
    """Set ``columns`` on each row's instance (a row: the id, then the values)."""
    _write_rows(conn, functools.partial(_instances_update, columns), rows)


class Held:
    """Heartbeats' writes not yet in the database: steady heartbeats' instance gauges (by
    instance id, values in ``HEARTBEAT_COLUMNS`` order), and every heartbeat's latest
    telemetry (by instance), where a later heartbeat of the same instance replaces its
    earlier one; and history rows (in order), with the retention each agent's history is
    then trimmed to."""

    __slots__ = ("gauges", "history", "telemetry", "trims")

    def __init__(self) -> None:
        self.gauges: dict[int, tuple[Any, ...]] = {}
        self.telemetry: dict[int, tuple[int, float, str]] = {}
        self.history: list[tuple[Any, ...]] = []
        self.trims: dict[str, int] = {}  # agent id -> rows its history keeps

    def __bool__(self) -> bool:
        return bool(self.gauges or self.telemetry or self.history)

    def take(self, other: Held) -> None:
        self.gauges.update(other.gauges)
        self.telemetry.update(other.telemetry)
        self.history += other.history
        self.trims.update(other.trims)
        other.clear()

    def clear(self) -> None:
        self.gauges.clear()
        self.telemetry.clear()
        self.history.clear()
        self.trims.clear()

    def write(self, conn: sqlite3.Connection) -> None:
        # The telemetry is on the instance's row (migration 15): a steady heartbeat's gauges
        # and telemetry are one update of it, one record rebuilt and one page a heartbeat.
        telemetry = self.telemetry
        both: list[tuple[Any, ...]] = []
        gauges_only: list[tuple[Any, ...]] = []
        for instance_id, gauges in self.gauges.items():
            latest = telemetry.pop(instance_id, None)
            if latest is None:
                gauges_only.append((instance_id, *gauges))
            else:
                both.append((instance_id, *gauges, *latest[1:]))
        if both:
            _update_instances(conn, HEARTBEAT_COLUMNS + INSTANCE_TELEMETRY_COLUMNS, both)
        if gauges_only:
            _update_instances(conn, HEARTBEAT_COLUMNS, gauges_only)
        if telemetry:
            _update_instances(conn, INSTANCE_TELEMETRY_COLUMNS, list(telemetry.values()))
        if self.history:
            _write_rows(conn, _history_insert, self.history)
            # After every insert, so each agent keeps its newest rows, the new ones included.
            conn.executemany(keep_newest("heartbeat_history", "agent_id"),
                             [(a, a, keep) for a, keep in self.trims.items()])
        self.clear()
