"""The ingest fast paths keep the store's promises (issue 7).

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

from vast_manager.coordinator.store.writer import Store, Tx


async def test_one_turn_of_writes_commits_together_and_failures_stay_alone(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "s.db")
    try:
        def ok(i: int) -> Callable[[Tx], int]:
            def job(tx: Tx) -> int:
                tx.insert_event(float(i), "test", f"event {i}")
                return i
            return job

        def bad(tx: Tx) -> None:
            tx.insert_event(0.0, "test", "undone")
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


async def test_latest_telemetry_is_in_its_table_once_answered(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    try:
        await store.write(lambda tx: tx.upsert_telemetry(7, 1.0, '{"a": 1}'))
        await store.write(lambda tx: tx.upsert_telemetry(7, 2.0, '{"a": 2}'))
        # Read on another connection: committed, not merely held in memory.
        with sqlite3.connect(path) as other:
            rows = other.execute("select instance_id, received_at, telemetry_json "
                                 "from telemetry").fetchall()
        assert rows == [(7, 2.0, '{"a": 2}')]

        def failing(tx: Tx) -> None:
            tx.upsert_telemetry(8, 3.0, "{}")
            raise ValueError("undone")

        with pytest.raises(ValueError):
            await store.write(failing)
        assert store.latest_telemetry(8) is None  # a failed job leaves no telemetry
        assert store.count_rows()["telemetry"] == 1
    finally:
        store.close()


async def test_a_commit_window_gathers_writes_of_several_loop_turns(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db", commit_window_s=0.5)
    try:
        commits = store.commits

        async def one(i: int) -> int:
            await asyncio.sleep(0.01 * i)  # each in a loop turn of its own
            return await store.write(lambda tx: tx.insert_event(float(i), "test", f"e{i}"))

        ids = await asyncio.gather(*(one(i) for i in range(5)))
        assert len(set(ids)) == 5
        assert store.commits - commits == 1  # one window, one transaction
        # Without a window each turn's writes go at once: five turns, five commits.
        store.commit_window_s = 0.0
        commits = store.commits
        await asyncio.gather(*(one(i) for i in range(5)))
        assert store.commits - commits == 5
    finally:
        store.close()
