"""The ingest fast paths keep the store's promises.

One commit window's writes travel to the writer together, each still in its
own savepoint; the latest telemetry is held and written with its transaction,
in its table once answered; the bulk ``list[float]`` check names the same
field as before.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from vast_manager.coordinator.store.writer import WINDOW_FULL_JOBS, Store, Tx


async def test_one_turn_of_writes_commits_together_and_failures_stay_alone(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "s.db")
    try:
        def ok(i: int) -> Callable[[Tx], int]:
            def job(tx: Tx) -> int:
                tx.audit.add(float(i), "test", f"event {i}")
                return i
            return job

        def bad(tx: Tx) -> None:
            tx.audit.add(0.0, "test", "undone")
            raise ValueError("this job fails")

        commits = store.commits
        results = await asyncio.gather(
            *(store.write(ok(i)) for i in range(50)), store.write(bad),
            return_exceptions=True,
        )
        assert results[:50] == list(range(50))
        assert isinstance(results[50], ValueError)
        assert store.commits - commits == 1  # one loop turn, one transaction
        assert [e["reason"] for e in store.events()] == [f"event {i}" for i in range(50)]
    finally:
        store.close()


async def _add_instances(store: Store, *ids: int) -> None:
    for instance_id in ids:
        await store.write(lambda tx, i=instance_id: tx.instances.add(
            {"id": i, "kind": "deployed", "state": "booting", "created_at": 0.0}))


async def test_latest_telemetry_is_in_its_table_once_answered(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        await _add_instances(store, 7, 8)
        await store.write(lambda tx: tx.heartbeats.upsert_telemetry(7, 1.0, '{"a": 1}'))
        await store.write(lambda tx: tx.heartbeats.upsert_telemetry(7, 2.0, '{"a": 2}'))
        # Read on another connection: committed, not merely held in memory.
        with sqlite3.connect(path) as other:
            rows = other.execute("select instance_id, received_at, telemetry_json "
                                 "from telemetry").fetchall()
        assert rows == [(7, 2.0, '{"a": 2}')]

        def failing(tx: Tx) -> None:
            tx.heartbeats.upsert_telemetry(8, 3.0, "{}")
            raise ValueError("undone")

        with pytest.raises(ValueError):
            await store.write(failing)
        assert store.latest_telemetry(8) is None  # a failed job leaves no telemetry
        assert store.latest_telemetry(7) == {
            "instance_id": 7, "received_at": 2.0, "telemetry_json": '{"a": 2}'}
        # On the instance's row (migration 15), which whole-row reads leave out.
        assert "telemetry_json" not in (store.get_instance(7) or {})
    finally:
        store.close()


async def test_a_commit_window_gathers_writes_of_several_loop_turns(tmp_path: Path) -> None:
    # An hour's window: only filling it (WINDOW_FULL_JOBS writes) can close it here.
    store = Store(tmp_path / "s.db", commit_window_s=3600.0)
    try:
        commits = store.commits

        def event(i: int) -> Callable[[Tx], int]:
            return lambda tx: tx.audit.add(float(i), "test", f"e{i}")

        pending = []
        for i in range(WINDOW_FULL_JOBS - 1):
            pending.append(asyncio.ensure_future(store.write(event(i))))
            await asyncio.sleep(0)  # each write in a loop turn of its own
        for _ in range(10):
            await asyncio.sleep(0)
        # The window holds them all: nothing answered, nothing committed yet.
        assert not any(f.done() for f in pending) and store.commits == commits
        pending.append(asyncio.ensure_future(store.write(event(WINDOW_FULL_JOBS - 1))))
        ids = await asyncio.gather(*pending)  # the last one filled the window
        assert len(set(ids)) == WINDOW_FULL_JOBS
        assert store.commits - commits == 1  # one window, one transaction
        # Without a window each turn's writes go at once: a write awaited alone commits
        # alone (the next one is not even made yet).
        store.commit_window_s = 0.0
        commits = store.commits
        for i in range(3):
            await store.write(event(100 + i))
        assert store.commits - commits == 3
    finally:
        store.close()


async def test_held_rows_update_only_their_instances_and_leave_the_file_schema(
    tmp_path: Path,
) -> None:
    """Held rows go through the writer connection's own views (``held.install``): an id no
    instance has adds no row, the other instances keep their columns, and the database
    file holds no view or trigger of them (another connection sees none)."""
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        await _add_instances(store, 7, 8)
        for instance_id in (7, 99):
            await store.write(lambda tx, i=instance_id: tx.heartbeats.upsert_telemetry(
                i, 3.0, '{"a": 3}'))
        with sqlite3.connect(path) as other:
            rows = other.execute("select id, telemetry_at, telemetry_json from instances "
                                 "order by id").fetchall()
            assert rows == [(7, 3.0, '{"a": 3}'), (8, None, None)]
            assert other.execute(
                "select name from sqlite_master where name like 'held%'").fetchall() == []
    finally:
        store.close()
