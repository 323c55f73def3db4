"""What every part of the writer's ``Tx`` stands on: the connection inside one job (its
savepoint, the held rows written first), the job's lifecycle, and the writer's caches
of hot instance columns and revoked flags (coordinator/store/writer.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import sqlite_utils

from vast_manager.coordinator.store.migrations import ACTIVE_SQL, Row
from vast_manager.coordinator.store.reads import Reads, one_row, rows_of
from vast_manager.coordinator.store.writes.held import Held, install

#: The instance columns a heartbeat's job decides on (``Tx.hot_instance``).
HOT_COLUMNS = ("id", "agent_id", "machine_id", "state", "last_seq", "terminate_reason",
               "rebenchmark_pending", "min_rate_per_hour", "directed_benchmark_id")
_HOT_SELECT = f"select {', '.join(HOT_COLUMNS)} from instances where agent_id = ?"


class TxBase(Reads):
    """The writer's view inside one job: reads see the transaction, writes join it.

    Only the writer thread ever holds one; it also keeps the writer's small caches
    (hot instance columns, revoked flags, heartbeat history pacing) so they need no lock.
    The writes of each table are its writers' (``store.writes``), held by ``Tx``.
    """

    def __init__(self, db: sqlite_utils.Database) -> None:
        self._db = db
        self._raw = db.conn
        # A steady heartbeat's job writes nothing at once: its rows are held (this job's,
        # then this transaction's) and written together, many rows a statement, before
        # anything else touches the database and before the commit. A job's savepoint
        # is opened only when it first touches the database, after the held rows of the
        # jobs before it are written, so undoing a failed job never undoes theirs.
        self._held_job = Held()
        self._held_batch = Held()
        install(self._raw)  # the views the held rows are written through
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

    def _write_held(self, held: Held) -> None:
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
        # An agent without a row has none until this writer adds one (and the cache with
        # it): its first heartbeat need not look, a read that would write the transaction's
        # held rows early and open a savepoint.
        for agent_id in self._revoked:
            self._history_last_at.setdefault(agent_id, float("-inf"))

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
        ``Tx.instances.update`` is what changes it."""
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
