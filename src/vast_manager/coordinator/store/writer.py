"""The coordinator's one write path to SQLite (through sqlite-utils), and the ``Store``.

Writes: one writer thread owns the only write connection. Callers submit a
job (a function of a ``Tx``) with ``await store.write(fn)``; the writes of
one commit window travel together, and the writer runs up to ``batch_max``
jobs in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (group commit), each job inside
its own savepoint so a job that raises leaves nothing behind and the others
still commit. A caller's future resolves only after the COMMIT returned.
Steady heartbeats hold their rows instead (``store.writes.held.Held``): written together as
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
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from vast_manager.coordinator.store.migrations import Row, T, migrate
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writes.agents import AgentWrites
from vast_manager.coordinator.store.writes.autopilot import AutopilotWrites
from vast_manager.coordinator.store.writes.bad_hosts import BadHostWrites
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.heartbeats import HeartbeatWrite, HeartbeatWrites
from vast_manager.coordinator.store.writes.held import HEARTBEAT_COLUMNS, HISTORY_ROW, Gauges
from vast_manager.coordinator.store.writes.instances import Ending, InstanceWrites
from vast_manager.coordinator.store.writes.results import ResultWrite, ResultWrites
from vast_manager.coordinator.store.writes.spool_marks import SpoolMarkWrites
from vast_manager.coordinator.store.writes.tx_base import HOT_COLUMNS, TxBase

# The names callers import from here: the writer's parts live in ``store.writes``.
__all__ = ["HEARTBEAT_COLUMNS", "HISTORY_ROW", "HOT_COLUMNS", "WINDOW_FULL_JOBS", "Ending",
           "Gauges", "HeartbeatWrite", "ResultWrite", "Row", "Store", "Tx"]

log = logging.getLogger(__name__)

# --- writes ---------------------------------------------------------------------


class Tx(TxBase):
    """The writer's view inside one job: reads see the transaction, writes join it.

    Its writes are those of each table (``store.writes``), one writer a table over this
    ``TxBase``'s one connection, savepoint and caches: ``tx.instances.update(...)``,
    ``tx.audit.add(...)``, ``tx.results.write(...)``. Only the writer thread ever holds
    a ``Tx``.
    """

    def __init__(self, db: sqlite_utils.Database) -> None:
        super().__init__(db)
        self.audit = EventWrites(self)  # the audit trail: events, and agents' log lines
        self.agents = AgentWrites(self)
        self.blocklist = BadHostWrites(self, self.audit)  # bad_hosts and strikes
        self.instances = InstanceWrites(self, self.audit, self.blocklist)
        self.heartbeats = HeartbeatWrites(self, self.instances, self.audit)
        self.results = ResultWrites(self, self.instances, self.audit)
        self.autopilot = AutopilotWrites(self)
        self.replay = SpoolMarkWrites(self)  # spool_marks (docs/protocol.md, "Replay")


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


def create_private(path: str) -> None:
    """Create the database file readable by its owner alone (0600) when it does not exist:
    it holds the fleet's agent ids, hosts and the operator's decisions. SQLite gives the
    ``-wal`` and ``-shm`` files the database file's permissions, so they are 0600 too
    (tests/coordinator/store/test_coord_store.py checks all three)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _connect(path: str, *, check_same_thread: bool) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves (sqlite-utils joins them).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


#: WAL pages between automatic checkpoints (SQLite's default is 1,000). A fleet's
#: heartbeats rewrite the same instance and telemetry pages over and over; a checkpoint
#: copies each page once however often the WAL holds it, so rarer checkpoints copy fewer
#: pages a heartbeat (at 2,000 agents the writer's CPU a heartbeat fell by an eighth, at
#: 50,000 it did not move: docs/performance.md). The WAL grows to about 16 MiB.
WAL_AUTOCHECKPOINT_PAGES = 4000
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
        create_private(self.path)
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
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
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

