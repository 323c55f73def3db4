"""The ingest fast paths keep the store's promises (issue 7).

One loop turn's writes travel to the writer together, each still in its own
savepoint; the latest telemetry lives in memory until flushed, yet every
read sees it; the bulk ``list[float]`` check names the same field as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.store import Store, Tx
from protocol.errors import ProtocolError
from protocol.messages import CpuTelemetry
from protocol.schema import converter


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


async def test_latest_telemetry_is_read_before_and_after_its_flush(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path, telemetry_flush_s=3600.0)
    try:
        await store.write(lambda tx: tx.upsert_telemetry(7, 1.0, '{"a": 1}'))
        await store.write(lambda tx: tx.upsert_telemetry(7, 2.0, '{"a": 2}'))
        row = store.latest_telemetry(7)
        assert row is not None and row["received_at"] == 2.0
        assert row["telemetry_json"] == '{"a": 2}'
        assert store.count_rows()["telemetry"] == 1  # held in memory, counted all the same

        def failing(tx: Tx) -> None:
            tx.upsert_telemetry(8, 3.0, "{}")
            raise ValueError("undone")

        with pytest.raises(ValueError):
            await store.write(failing)
        assert store.latest_telemetry(8) is None  # a failed job leaves no telemetry
    finally:
        store.close()
    reopened = Store(path)  # close flushed it to the table
    try:
        row = reopened.latest_telemetry(7)
        assert row is not None and row["telemetry_json"] == '{"a": 2}'
        assert reopened.count_rows()["telemetry"] == 1
    finally:
        reopened.close()


async def test_telemetry_flushes_on_its_own_when_idle(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db", telemetry_flush_s=0.05)
    try:
        await store.write(lambda tx: tx.upsert_telemetry(1, 1.0, "{}"))
        for _ in range(200):
            if not store._telemetry_pending:
                break
            await asyncio.sleep(0.01)
        assert not store._telemetry_pending
        assert store.db.execute("select count(*) from telemetry").fetchone()[0] == 1
    finally:
        store.close()


def test_float_lists_are_checked_in_bulk_with_the_same_errors() -> None:
    conv = converter(CpuTelemetry)
    base = {"util_pct_mean": 1.0, "load1": None, "iowait_pct_mean": None}
    cpu = conv({**base, "per_core_util_pct_mean": [1, 2.5]}, "cpu")
    assert cpu.per_core_util_pct_mean == [1.0, 2.5]
    assert all(type(v) is float for v in cpu.per_core_util_pct_mean)
    for bad, where in (([1.0, "x"], "[1]"), ([1.0, True], "[1]"), ([None], "[0]")):
        with pytest.raises(ProtocolError) as err:
            conv({**base, "per_core_util_pct_mean": bad}, "cpu")
        assert err.value.field == "cpu.per_core_util_pct_mean" + where
