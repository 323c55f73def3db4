"""The coordinator's one write path to SQLite (through sqlite-utils), and the ``Store``.

Writes: one writer thread owns the only write connection. Callers submit a
job (a function of a ``Tx``) with ``await store.write(fn)``; the writes of
one commit window travel together, and the writer runs up to ``batch_max``
jobs in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (group commit), each job inside
its own savepoint so a job that raises leaves nothing behind and the others
still commit. A caller's future resolves only after the COMMIT returned.
Steady heartbeats hold their rows instead (``_Held``): written together as
multi-row statements before anything else touches the database, and before
the COMMIT.

Fleet-wide reads that would hold the event loop (the monitor's scans, the
operator's instance list, a ``/metrics`` scrape) run on a few reader threads, each
with a connection of its own (``Store.read``).

Durability: WAL mode with ``synchronous=FULL``. An agent deletes a result
from its spool when it sees our ``200``, so a ``200`` must mean the data is
on disk: with ``synchronous=NORMAL`` a WAL database survives a process crash
but may lose the last commits on power loss or an OS crash, and those would
be exactly the acknowledged ones. FULL fsyncs the WAL at every COMMIT; group
commit shares that fsync among every request of the batch, so the cost per
request shrinks as load grows. Restart needs no manual step: SQLite replays
the WAL on open, and migrations are idempotent.

Reads: a separate read connection (autocommit: each statement sees the
latest committed state, never a half-written job), used from the event
loop's thread. The path must be a file (WAL needs one); tests use tmp_path.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import sqlite_utils

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.store.migrations import ACTIVE_SQL, Row, T, dumps, loads, migrate
from vast_manager.coordinator.store.reads import Reads, one_row, rows_of

log = logging.getLogger(__name__)

# --- writes ---------------------------------------------------------------------


#: The instance columns a heartbeat's job decides on (``Tx.hot_instance``).
HOT_COLUMNS = ("id", "agent_id", "machine_id", "state", "last_seq", "terminate_reason",
               "rebenchmark_pending", "min_rate_per_hour", "directed_benchmark_id")
_HOT_SELECT = f"select {', '.join(HOT_COLUMNS)} from instances where agent_id = ?"
#: What a steady heartbeat sets on its instance (``Tx.hold_heartbeat``), which is also the
#: agent's latest heartbeat (the ``heartbeats`` view), and the pace it was answered.
HEARTBEAT_COLUMNS = ("last_seq", "last_seen", "phase", "phase_started_at", "progress_json",
                     "proofs_completed_total", "updated_at", "last_non_benchmark_at",
                     "heartbeat_at", "proof_seconds_recent_json", "heartbeat_pace_s",
                     "net_rx_bytes", "net_tx_bytes")
_HEARTBEAT_UPDATE = (
    f"update instances set {', '.join(f'{c} = ?' for c in HEARTBEAT_COLUMNS)} where id = ?"
)
#: A ``heartbeat_history`` row's columns, in statement order.
HISTORY_ROW = ("agent_id", "instance_id", "received_at", "seq", "phase",
               "proofs_completed_total", "telemetry_json")


class Ending(NamedTuple):
    """An instance sent to ``terminating`` by what its agent said (``Tx.begin_terminating``)."""

    reason: str
    kind: str
    destroy_due_at: float
    strike: Any = None  # a ``policy.StrikeRule`` when the trial counts against its machine
    note: str | None = None  # the event's text (None: the reason)
    bad_host_source: str | None = None  # lists the machine on ``bad_hosts`` as this source


class HeartbeatWrite(NamedTuple):
    """Everything one heartbeat writes, decided before any of it is written
    (``operations.ingest``): one ``Tx.write_heartbeat`` call."""

    instance_id: int
    agent_id: str
    machine_id: str | None
    now: float
    gauges: tuple[Any, ...] | None = None
    """A steady heartbeat's instance columns (``HEARTBEAT_COLUMNS`` order), held."""
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
    benchmark_delivered: bool = False
    """The answer carries the pending rebenchmark: it is pending no more."""


class ResultWrite(NamedTuple):
    """Everything one result writes, decided before any of it is written
    (``operations.ingest.result_job``): one ``Tx.write_result`` call."""

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


@functools.cache
def _keep_newest(table: str, owner: str) -> str:
    """Retention: delete one owner's rows below its ``keep`` newest (parameters: the owner
    twice, then ``keep``). Rows are appended in time order, so the newest have the
    highest ids, found on the (owner, id) index."""
    return (f"delete from [{table}] where [{owner}] = ? and id <= (select id from [{table}] "
            f"where [{owner}] = ? order by id desc limit 1 offset ?)")


# Multi-row statements write held rows in a few steps, not one per row: each step lets go
# of the GIL, and getting it back from a busy event loop can take a switch interval
# (5 ms), so a step per row made the writer crawl exactly when the fleet was busiest.
# 64 rows of up to 12 values stay under the 999 parameters older SQLite builds allow.
_ROWS_PER_STATEMENT = 64
# UPDATE ... FROM arrived in SQLite 3.33; older builds update row by row.
_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)


def _chunks(rows: list[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    """Power-of-two pieces (at most ``_ROWS_PER_STATEMENT``): a handful of statement texts
    for SQLite's cache to keep compiled, whatever the batch size."""
    start = 0
    while start < len(rows):
        size = min(_ROWS_PER_STATEMENT, 1 << ((len(rows) - start).bit_length() - 1))
        yield rows[start:start + size]
        start += size


@functools.cache
def _values(width: int, count: int) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return ", ".join([one] * count)


@functools.cache
def _gauges_update(count: int) -> str:
    cols = ("id", *HEARTBEAT_COLUMNS)
    return (
        f"with u({', '.join(cols)}) as (values {_values(len(cols), count)}) "
        f"update instances set {', '.join(f'{c} = u.{c}' for c in HEARTBEAT_COLUMNS)} "
        "from u where instances.id = u.id"
    )


@functools.cache
def _history_insert(count: int) -> str:
    return (f"insert into heartbeat_history ({', '.join(HISTORY_ROW)}) "
            f"values {_values(len(HISTORY_ROW), count)}")


@functools.cache
def _telemetry_replace(count: int) -> str:
    return ("insert or replace into telemetry (instance_id, received_at, telemetry_json) "
            f"values {_values(3, count)}")


def _write_rows(conn: sqlite3.Connection, statement: Callable[[int], str],
                rows: list[tuple[Any, ...]]) -> None:
    for chunk in _chunks(rows):
        conn.execute(statement(len(chunk)), [v for row in chunk for v in row])


class _Held:
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

    def take(self, other: _Held) -> None:
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
        if self.gauges:
            rows = [(k, *v) for k, v in self.gauges.items()]
            if _UPDATE_FROM:
                _write_rows(conn, _gauges_update, rows)
            else:
                conn.executemany(_HEARTBEAT_UPDATE, [(*r[1:], r[0]) for r in rows])
        if self.telemetry:
            _write_rows(conn, _telemetry_replace, list(self.telemetry.values()))
        if self.history:
            _write_rows(conn, _history_insert, self.history)
            # After every insert, so each agent keeps its newest rows, the new ones included.
            conn.executemany(_keep_newest("heartbeat_history", "agent_id"),
                             [(a, a, keep) for a, keep in self.trims.items()])
        self.clear()


class Tx(Reads):
    """The writer's view inside one job: reads see the transaction, writes join it.

    Only the writer thread ever holds a ``Tx``; it also keeps the writer's
    small caches (heartbeat history pacing) so they need no lock.
    """

    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        self._raw = db.conn
        # A steady heartbeat's job writes nothing at once: its rows are held (this job's,
        # then this transaction's) and written together, many rows a statement, before
        # anything else touches the database and before the commit. A job's savepoint
        # is opened only when it first touches the database, after the held rows of the
        # jobs before it are written, so undoing a failed job never undoes theirs.
        self._held_job = _Held()
        self._held_batch = _Held()
        self._savepoint = False
        self.write_error: BaseException | None = None  # a held write failed: fail the batch
        self._history_last_at: dict[str, float] = {}
        # The few instance columns a steady heartbeat decides on, and each agent's revoked
        # flag, as the writer last read or wrote them: every change to those tables goes
        # through this class, which keeps them current, so a heartbeat's job reads
        # nothing. Narrow on purpose (~0.5 kB an instance at 50,000 agents).
        self._hot_by_agent: dict[str, Row] = {}
        self._hot_by_id: dict[int, Row] = {}
        self._revoked: dict[str, bool] = {}

    @property
    def _conn(self) -> sqlite3.Connection:  # type: ignore[override]
        """The connection, once every held row is written and this job's savepoint open."""
        if not self._savepoint:
            self._write_held(self._held_batch)
            self._raw.execute("SAVEPOINT vm_job")
            self._savepoint = True
        if self._held_job:
            self._write_held(self._held_job)
        return self._raw

    @property
    def db(self) -> sqlite_utils.Database:
        self._conn  # noqa: B018 (the same preparation as every other statement)
        return self._db

    def _write_held(self, held: _Held) -> None:
        if not held:
            return
        try:
            held.write(self._raw)
        except Exception as exc:
            self.write_error = exc  # rows of jobs that succeeded are lost: fail the batch
            raise

    def begin_job(self) -> None:
        self._savepoint = False

    def end_job(self) -> None:
        """The job succeeded: release its savepoint; its held rows join the transaction's."""
        if self._savepoint:
            self._raw.execute("RELEASE SAVEPOINT vm_job")
            self._savepoint = False
        self._held_batch.take(self._held_job)

    def abort_job(self) -> None:
        """The job failed: undo what it wrote, forget what it held."""
        self._held_job.clear()
        self.drop_caches()
        if self._savepoint and self._raw.in_transaction:
            self._raw.execute("ROLLBACK TO SAVEPOINT vm_job")
            self._raw.execute("RELEASE SAVEPOINT vm_job")
        self._savepoint = False

    def before_commit(self) -> None:
        """Write the transaction's held rows (outside any job's savepoint)."""
        self._savepoint = True  # no savepoint for this: it is the transaction's own write
        try:
            self._write_held(self._held_batch)
        finally:
            self._savepoint = False

    def forget_transaction(self) -> None:
        """The transaction rolled back: nothing held or cached may outlive it."""
        self._held_job.clear()
        self._held_batch.clear()
        self._savepoint = False
        self.write_error = None
        self.drop_caches()

    def preload(self) -> None:
        """Fill the caches for every agent and every instance still on a machine: two scans
        at start instead of reads on each agent's first heartbeat after a restart."""
        # Outside any job: the raw connection (``_conn`` would open a job's savepoint).
        for row in rows_of(self._raw, f"select {', '.join(HOT_COLUMNS)} from instances "
                                    f"where {ACTIVE_SQL} and agent_id is not null"):
            self._hot_by_agent[row["agent_id"]] = self._hot_by_id[row["id"]] = row
        self._revoked.update(
            (agent_id, bool(revoked))
            for agent_id, revoked in self._raw.execute("select agent_id, revoked from agents")
        )
        # Each agent's newest history row (the newest id: rows are appended in time order),
        # found on the (agent_id, id) index: ~1 s for a million rows, once.
        self._history_last_at.update(self._raw.execute(
            "select h.agent_id, h.received_at from heartbeat_history h join "
            "(select max(id) as id from heartbeat_history group by agent_id) newest "
            "on h.id = newest.id"
        ))

    def drop_caches(self) -> None:
        """Forget every cached row: after a rollback they may describe undone writes."""
        self._hot_by_agent.clear()
        self._hot_by_id.clear()
        self._revoked.clear()
        self._history_last_at.clear()

    def agent_revoked(self, agent_id: str) -> bool | None:
        """Whether the agent is revoked; None when it was never issued."""
        revoked = self._revoked.get(agent_id)
        if revoked is None:
            agent = self.get_agent(agent_id)
            if agent is None:
                return None
            revoked = self._revoked[agent_id] = bool(agent["revoked"])
        return revoked

    def hot_instance(self, agent_id: str) -> Row | None:
        """The agent's instance, ``HOT_COLUMNS`` only, cached. Read-only for callers:
        ``update_instance`` is what changes it."""
        hot = self._hot_by_agent.get(agent_id)
        if hot is None:
            hot = one_row(self._conn, _HOT_SELECT, (agent_id,))
            if hot is None:
                return None
            self._hot_by_agent[agent_id] = self._hot_by_id[hot["id"]] = hot
        return hot

    def _exec(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        return self._conn.execute(sql, params)

    def _insert(self, table: str, row: dict[str, Any]) -> int:
        cols = ", ".join(f"[{c}]" for c in row)
        marks = ", ".join("?" for _ in row)
        cur = self._exec(f"insert into [{table}] ({cols}) values ({marks})", list(row.values()))
        return int(cur.lastrowid or 0)

    # agents

    def insert_agent(
        self,
        agent_id: str,
        *,
        label: str,
        kind: str,
        min_rate_per_hour: float | None,
        issued_at: float,
        max_gpus: int | None = None,
        gpu_model: str | None = None,
    ) -> None:
        """``max_gpus``/``gpu_model``: what a bring-your-own agent's hello may list
        (docs/reliability.md, "No rate on a host's word alone")."""
        self._insert(
            "agents",
            {
                "agent_id": agent_id,
                "label": label,
                "kind": kind,
                "min_rate_per_hour": min_rate_per_hour,
                "revoked": 0,
                "issued_at": issued_at,
                "max_gpus": max_gpus,
                "gpu_model": gpu_model,
            },
        )

    def revoke_agent(self, agent_id: str, *, now: float, reason: str) -> bool:
        """Revoke; False when it was already revoked (idempotent)."""
        cur = self._exec(
            "update agents set revoked = 1, revoked_at = ?, revoked_reason = ? "
            "where agent_id = ? and revoked = 0",
            (now, reason, agent_id),
        )
        self._revoked.pop(agent_id, None)
        return cur.rowcount > 0

    # instances

    def insert_instance(self, row: dict[str, Any]) -> int:
        return self._insert("instances", row)

    def update_instance(self, instance_id: int, **cols: Any) -> None:
        if not cols:
            return
        sets = ", ".join(f"[{c}] = ?" for c in cols)
        self._exec(f"update instances set {sets} where id = ?", [*cols.values(), instance_id])
        hot = self._hot_by_id.get(instance_id)
        if hot is not None:
            if "agent_id" in cols:  # re-keyed: read afresh when next asked
                del self._hot_by_id[instance_id]
                self._hot_by_agent.pop(hot["agent_id"], None)
                return
            for name in cols.keys() & hot.keys():
                hot[name] = cols[name]

    def begin_terminating(
        self, instance_id: int, reason: str, *, kind: str, now: float, destroy_due_at: float,
        note: str | None = None, data: Any = None, bad_host_source: str | None = None,
        strike: Any = None, **cols: Any,
    ) -> bool:
        """Send an instance to ``terminating``: the one way anything ends an instance.

        The monitor destroys it (or, bring-your-own, revokes its agent) at
        ``destroy_due_at``; until then its directive is ``terminate`` with the reason.
        An instance already ending keeps its state (``failed`` says what happened) and
        the first reason it was given; its destroy falls due at ``destroy_due_at`` (a
        revoke brings it forward, a failed destroy puts it back). Records the event
        ``kind`` (its text: ``note``, else the reason) and, with ``bad_host_source``,
        lists the machine on ``bad_hosts`` under that source. ``cols``: more columns
        to set in the same update. Returns False, writing nothing, for an instance
        that is gone (or unknown): there is no machine left to free.
        """
        inst = self.get_instance(instance_id)
        if inst is None or inst["state"] in states.GONE:
            return False
        updates: dict[str, Any] = {
            **cols,
            "terminate_reason": inst["terminate_reason"] or reason,
            "destroy_due_at": destroy_due_at,
            "updated_at": now,
        }
        if inst["state"] not in states.ENDING:
            updates.update(state=states.State.TERMINATING, state_since=now)
        self.update_instance(instance_id, **updates)
        ids = {"instance_id": instance_id, "agent_id": inst["agent_id"],
               "machine_id": inst["machine_id"]}
        self.insert_event(now, kind, reason if note is None else note, data=data, **ids)
        if bad_host_source is not None:
            machine_id = inst["machine_id"] or inst["label"]
            self.add_bad_host(machine_id, reason=reason, source=bad_host_source, now=now,
                              instance_id=instance_id)
            self.insert_event(now, "bad_host", f"{machine_id}: {reason}", **ids)
        elif strike is not None and inst["machine_id"] and inst["kind"] == "deployed":
            # A failed trial (``policy.StrikeRule``): counted against its machine.
            self.add_strike(str(inst["machine_id"]), reason, now=now, instance_id=instance_id,
                            limit=strike.limit, window_s=strike.window_s,
                            block_s=strike.block_s)
        return True

    def hold_heartbeat(self, instance_id: int, gauges: tuple[Any, ...]) -> None:
        """A steady heartbeat's instance columns (``HEARTBEAT_COLUMNS`` order), held (see
        ``__init__``)."""
        self._held_job.gauges[instance_id] = gauges
        hot = self._hot_by_id.get(instance_id)
        if hot is not None:
            hot["last_seq"] = gauges[0]

    def write_heartbeat(self, w: HeartbeatWrite) -> None:
        """Everything a heartbeat decided, in the order it is read back: the instance's
        columns (a steady heartbeat's held), its events, its end, its telemetry and
        history, the delivered rebenchmark."""
        if w.gauges is not None:
            self.hold_heartbeat(w.instance_id, w.gauges)
        if w.updates:
            self.update_instance(w.instance_id, **w.updates)
        for kind, reason in w.events:
            self.insert_event(w.now, kind, reason, instance_id=w.instance_id,
                              agent_id=w.agent_id, machine_id=w.machine_id)
        if w.ending is not None:
            self.begin_terminating(w.instance_id, w.ending.reason, kind=w.ending.kind,
                                   now=w.now, destroy_due_at=w.ending.destroy_due_at,
                                   strike=w.ending.strike)
        if w.telemetry_json is not None:
            self.upsert_telemetry(w.instance_id, w.now, w.telemetry_json)
        if w.history is not None:
            self._hold_history(w.history, w.history_interval_s, w.history_keep_rows)
        if w.benchmark_delivered:
            self.deliver_rebenchmark(w.instance_id, w.agent_id, w.machine_id, w.now)

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

    def deliver_rebenchmark(self, instance_id: int, agent_id: str | None,
                            machine_id: str | None, now: float) -> None:
        """A pending rebenchmark went out in a directive: it is pending no more."""
        self.update_instance(instance_id, rebenchmark_pending=0, updated_at=now)
        self.insert_event(now, "rebenchmark", "benchmark directive delivered to the agent",
                          instance_id=instance_id, agent_id=agent_id, machine_id=machine_id)

    def heartbeat_view(self, agent_id: str) -> Row | None:
        """The agent's instance (``HOT_COLUMNS``, cached) when the agent is issued and not
        revoked; None otherwise (the heartbeat then reads the whole row, which says why)."""
        return self.hot_instance(agent_id) if self.agent_revoked(agent_id) is False else None

    # events

    def insert_event(
        self,
        now: float,
        kind: str,
        reason: str,
        *,
        instance_id: int | None = None,
        agent_id: str | None = None,
        machine_id: str | None = None,
        data: Any = None,
    ) -> int:
        return self._insert(
            "events",
            {
                "ts": now,
                "kind": kind,
                "reason": reason,
                "instance_id": instance_id,
                "agent_id": agent_id,
                "machine_id": machine_id,
                "data_json": dumps(data),
            },
        )

    # results and measurements (host_perf is computed from them)

    def insert_result(self, row: dict[str, Any]) -> int:
        return self._insert("results", row)

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

    # the autopilot's switch

    def set_autopilot(self, state: str, *, now: float, by: str, reason: str) -> None:
        self._exec(
            "insert into autopilot (id, state, changed_at, changed_by, reason) "
            "values (1, ?, ?, ?, ?) on conflict (id) do update set state = excluded.state, "
            "changed_at = excluded.changed_at, changed_by = excluded.changed_by, "
            "reason = excluded.reason",
            (state, now, by, reason),
        )

    def note_exploration(self, now: float) -> None:
        self._exec("update autopilot set last_exploration_at = ? where id = 1", (now,))

    # bad hosts

    def add_bad_host(
        self,
        machine_id: str,
        *,
        reason: str,
        source: str,
        now: float,
        instance_id: int | None = None,
        expires_at: float | None = None,
    ) -> None:
        self._exec(
            "insert into bad_hosts (machine_id, reason, added_at, source, instance_id, "
            "expires_at) values (?, ?, ?, ?, ?, ?) on conflict (machine_id) do update set "
            "reason = excluded.reason, source = excluded.source, "
            "instance_id = coalesce(excluded.instance_id, instance_id), "
            "added_at = excluded.added_at, expires_at = excluded.expires_at",
            (machine_id, reason, now, source, instance_id, expires_at),
        )

    def add_paused(self, instance_id: int, *, rent_s: float, storage_s: float) -> None:
        """Seconds vast.ai billed no rent (not running) and no storage (offline)."""
        self._exec("update instances set rent_paused_s = coalesce(rent_paused_s, 0) + ?, "
                   "storage_paused_s = coalesce(storage_paused_s, 0) + ? where id = ?",
                   (rent_s, storage_s, instance_id))

    def add_strike(self, machine_id: str, reason: str, *, now: float, instance_id: int | None,
                   limit: int, window_s: float, block_s: float) -> str | None:
        """Count a failed trial against its machine (once per instance); with ``limit``
        strikes within ``window_s`` the machine is blocked for ``block_s`` with their
        reasons. Returns the block's reason when this strike made one."""
        cur = self._exec(
            "insert or ignore into machine_strikes (machine_id, instance_id, reason, at) "
            "values (?, ?, ?, ?)", (machine_id, instance_id, reason, now))
        if cur.rowcount == 0:
            return None
        recent = [str(r[0]) for r in self._exec(
            "select reason from machine_strikes where machine_id = ? and at > ? "
            "order by at, id", (machine_id, now - window_s)).fetchall()]
        self.insert_event(now, "strike", f"{machine_id}: {reason} ({len(recent)} of {limit} "
                          f"within {window_s / 3600:.0f} h)", instance_id=instance_id,
                          machine_id=machine_id)
        if len(recent) < limit:
            return None
        why = f"{len(recent)} failed trials: " + "; ".join(recent)
        self.add_bad_host(machine_id, reason=why[:1000], source="strikes", now=now,
                          instance_id=instance_id, expires_at=now + block_s)
        self.insert_event(now, "bad_host", f"{machine_id}: {why[:1000]} (blocked for "
                          f"{block_s / 3600:.0f} h)", instance_id=instance_id,
                          machine_id=machine_id)
        return why

    def remove_bad_host(self, machine_id: str) -> bool:
        return self._exec("delete from bad_hosts where machine_id = ?", (machine_id,)).rowcount > 0

    # heartbeats, telemetry

    def append_heartbeat_history(
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
        last = self._history_last_at.get(agent_id)
        if last is None:
            # The newest row by id is the newest in time (rows are appended as they come):
            # one index seek, where max(received_at) read every row of the agent. (A miss:
            # an agent's first heartbeat, or the first after a rollback dropped the cache.)
            found = one_row(
                self._conn,
                "select received_at as at from heartbeat_history where agent_id = ? "
                "order by id desc limit 1",
                (agent_id,),
            )
            last = float(found["at"]) if found and found["at"] is not None else float("-inf")
        if now - last < interval_s:
            self._history_last_at[agent_id] = last
            return False
        # Held like a steady heartbeat's rows: a read or a statement of its own here would
        # write the transaction's held rows early and open this job's savepoint, for one
        # in twenty heartbeats of a fleet at the default pace.
        self._held_job.history.append(row)
        self._held_job.trims[agent_id] = keep_rows
        self._history_last_at[agent_id] = now
        return True

    def upsert_telemetry(self, instance_id: int, now: float, telemetry_json: str) -> None:
        """Set an instance's latest telemetry: held, and written with its transaction's
        other telemetry in a few multi-row statements (see ``_Held``)."""
        self._held_job.telemetry[instance_id] = (instance_id, now, telemetry_json)

    # logs

    def insert_logs(
        self,
        instance_id: int,
        agent_id: str,
        now: float,
        lines: Iterable[tuple[float, str, str]],
        *,
        keep_lines: int,
    ) -> int:
        rows = [(instance_id, agent_id, ts, source, text, now) for ts, source, text in lines]
        self._conn.executemany(
            "insert into logs (instance_id, agent_id, ts, source, text, received_at) "
            "values (?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._exec(_keep_newest("logs", "instance_id"), (instance_id, instance_id, keep_lines))
        return len(rows)

    # scaling

    def insert_scaling(self, row: dict[str, Any]) -> int:
        return self._insert("scaling", row)


# --- the store -------------------------------------------------------------------


class _ReaderView(Reads):
    """``Reads`` on a connection of its own (the reader thread's, ``Store.read``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def close(self) -> None:
        self._conn.close()


@dataclass(slots=True)
class _Job:
    fn: Callable[[Tx], Any]
    future: concurrent.futures.Future[Any]


@dataclass(slots=True)
class _Group:
    """The ``write`` calls of one commit window (or loop turn): one queue item, one
    wake-up of the loop.

    A request's ``await store.write(fn)`` does not hop to the writer thread on
    its own: the loop collects the jobs of a window, hands them over together,
    and the writer resolves all their futures with one ``call_soon_threadsafe``.
    """

    loop: asyncio.AbstractEventLoop
    fns: list[Callable[[Tx], Any]]
    futures: list[asyncio.Future[Any]]
    queued: bool = False


def _resolve_group(
    futures: list[asyncio.Future[Any]], outcomes: list[tuple[Any, BaseException | None]]
) -> None:
    """On the group's loop: hand each caller its job's value or error."""
    for future, (value, error) in zip(futures, outcomes, strict=True):
        if future.done():  # the caller was cancelled; its job ran and committed anyway
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


_STOP = object()


def _connect(path: str, *, check_same_thread: bool) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves (sqlite-utils joins them).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


#: A commit window closes early once it holds this many writes.
WINDOW_FULL_JOBS = 64
#: Threads (each with its read connection) that run ``Store.read``.
READER_THREADS = 4


class Store(Reads):
    """The database: ``await write(fn)`` (group-committed) and plain read methods."""

    def __init__(
        self, path: str | Path, *, batch_max: int = 512, commit_window_s: float = 0.0,
    ) -> None:
        self.path = str(path)
        if self.path == ":memory:" or self.path.startswith("file:"):
            raise ValueError("the store needs a database file (WAL mode)")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.batch_max = batch_max
        # Writes of this long share one transaction: at 1,000 heartbeats/s and 20 ms that
        # is one fsync'ed commit per 20 requests instead of per request (each commit costs
        # ~85 us of CPU in SQLite alone, more in thread hand-offs).
        self.commit_window_s = commit_window_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False
        self._group: _Group | None = None  # the current window's writes, not yet queued
        self._group_lock = threading.Lock()
        # Fleet-sized reads run here, off the event loop: a few threads, each with its
        # own connection (WAL readers never wait for each other), so a long one (a
        # scrape of a large fleet) leaves the others and the monitor's scans moving.
        self._reader = concurrent.futures.ThreadPoolExecutor(
            READER_THREADS, thread_name_prefix="store-reader")
        self._reader_local = threading.local()
        self._reader_views: list[_ReaderView] = []
        self._reader_views_lock = threading.Lock()
        self.commits = 0  # transactions committed (tests and benchmarks read it)
        self._thread = threading.Thread(target=self._writer, name="store-writer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        # The read connection is used from the event loop's thread only, but the
        # Store may be built on another thread than the one that later runs the loop.
        self._conn = _connect(self.path, check_same_thread=False)
        self.db = sqlite_utils.Database(self._conn)

    # writer thread

    def _writer(self) -> None:
        try:
            conn = _connect(self.path, check_same_thread=True)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            # 64 MiB of page cache (the default is 2 MiB): a fleet's heartbeats touch every
            # instance's page in turn, and a miss costs a read from the OS.
            conn.execute("PRAGMA cache_size = -65536")
            db = sqlite_utils.Database(conn)
            applied = migrate(db)
            if applied:
                log.info("applied migrations %s to %s", applied, self.path)
            tx = Tx(db)
        except BaseException as exc:  # reported to the constructor's caller
            self._startup_error = exc
            self._ready.set()
            return
        try:
            # Before the constructor returns (~0.3 s at 50,000 agents), so a server that
            # tunes the garbage collector once started finds the caches already built.
            tx.preload()
        except Exception:  # a cache only: the jobs read what it lacks
            tx.drop_caches()
            log.exception("could not preload the writer's caches")
        self._ready.set()
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is _STOP:
                break
            batch: list[_Job | _Group] = [first]
            jobs = len(first.fns) if isinstance(first, _Group) else 1
            while jobs < self.batch_max:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stopping = True
                    break
                batch.append(nxt)
                jobs += len(nxt.fns) if isinstance(nxt, _Group) else 1
            self._run_batch(conn, tx, batch)
        conn.close()

    @staticmethod
    def _run_job(tx: Tx, fn: Callable[[Tx], Any]) -> tuple[Any, Any]:
        """One job in a savepoint of its own (opened when it first touches the database):
        a failing job undoes only itself. (A fixed savepoint name, so SQLite's statement
        cache keeps the statements compiled.)"""
        tx.begin_job()
        try:
            value = fn(tx)
        except Exception as exc:
            tx.abort_job()
            return None, exc
        except BaseException:
            tx.abort_job()
            raise
        tx.end_job()
        return value, None

    def _run_batch(
        self, conn: sqlite3.Connection, tx: Tx, batch: list[_Job | _Group]
    ) -> None:
        outcomes: list[list[tuple[Any, BaseException | None]]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for item in batch:
                fns = item.fns if isinstance(item, _Group) else [item.fn]
                outcomes.append([self._run_job(tx, fn) for fn in fns])
                if tx.write_error is not None:
                    raise tx.write_error
            tx.before_commit()
            conn.execute("COMMIT")
            self.commits += 1
        except Exception as exc:
            jobs = sum(len(i.fns) if isinstance(i, _Group) else 1 for i in batch)
            log.exception("store transaction failed; %d job(s) refused", jobs)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            # The writer's caches may describe rows that were rolled back.
            tx.forget_transaction()
            for item in batch:
                if isinstance(item, _Group):
                    self._hand_back(item, [(None, exc)] * len(item.fns))
                elif not item.future.done():
                    item.future.set_exception(exc)
            return
        for item, results in zip(batch, outcomes, strict=True):
            if isinstance(item, _Group):
                self._hand_back(item, results)
                continue
            value, error = results[0]
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result(value)

    @staticmethod
    def _hand_back(group: _Group, outcomes: list[tuple[Any, BaseException | None]]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            group.loop.call_soon_threadsafe(_resolve_group, group.futures, outcomes)

    def _queue_group(self, group: _Group) -> None:
        """When ``group``'s window closes or fills (without a window: at the end of the
        loop turn that opened it), hand it to the writer."""
        with self._group_lock:
            if self._group is group:
                self._group = None
            if group.queued:  # close() queued it already
                return
            group.queued = True
        self._queue.put(group)

    # public API

    def submit(self, fn: Callable[[Tx], T]) -> concurrent.futures.Future[T]:
        """Queue a write job; the future resolves after its transaction committed."""
        if self._closed:
            raise RuntimeError("the store is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put(_Job(fn, future))
        return future

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn(tx)`` on the writer thread; return its value once committed.

        The writes of one commit window (or, without one, of one event-loop turn) travel
        to the writer together (``_Group``)."""
        return await self.write_future(fn)

    def write_future(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        """``write`` without a coroutine: the future resolves once ``fn``'s transaction
        committed (for callers that answer from a callback; called on the loop)."""
        if self._closed:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._group_lock:
            group = self._group
            if group is None or group.loop is not loop:
                group = self._group = _Group(loop, [], [])
                if self.commit_window_s > 0:
                    loop.call_later(self.commit_window_s, self._queue_group, group)
                else:
                    loop.call_soon(self._queue_group, group)
            group.fns.append(fn)
            group.futures.append(future)
            if len(group.fns) == WINDOW_FULL_JOBS:
                # Enough to share one commit well: no need to wait out the window.
                loop.call_soon(self._queue_group, group)
        return future

    def write_blocking(self, fn: Callable[[Tx], T]) -> T:
        """``write`` for code without an event loop (scripts, setup)."""
        return self.submit(fn).result()

    async def read(self, fn: Callable[[Reads], T]) -> T:
        """Run the read-only ``fn`` on one of the store's reader threads, on that thread's
        connection, and return its value: a fleet-wide scan (50,000 rows) then never holds the
        event loop, which keeps answering heartbeats meanwhile. ``fn``'s statements share
        one read transaction, so they see one committed state (a scrape's counts and its
        rows agree)."""
        if self._closed:
            raise RuntimeError("the store is closed")
        return await asyncio.get_running_loop().run_in_executor(
            self._reader, self._run_read, fn
        )

    def _run_read(self, fn: Callable[[Reads], T]) -> T:
        view: _ReaderView | None = getattr(self._reader_local, "view", None)
        if view is None:  # a reader thread's first read: only this thread uses this one
            view = self._reader_local.view = _ReaderView(
                _connect(self.path, check_same_thread=False))
            with self._reader_views_lock:
                self._reader_views.append(view)
        conn = view._conn
        conn.execute("BEGIN")
        try:
            return fn(view)
        finally:
            conn.execute("COMMIT")  # a read transaction: nothing to keep or undo

    def close(self) -> None:
        """Finish the queued writes, stop the writer, close both connections."""
        if self._closed:
            return
        self._closed = True
        with self._group_lock:
            pending, self._group = self._group, None
            if pending is not None:  # its window has not closed: queue it before the stop
                pending.queued = True
                self._queue.put(pending)
        self._queue.put(_STOP)
        self._thread.join()
        self._reader.shutdown(wait=True)
        # The reader threads are done: their connections can close from here.
        with self._reader_views_lock:
            for view in self._reader_views:
                view.close()
            self._reader_views.clear()
        self._conn.close()

