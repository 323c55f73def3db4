"""The SQLite store: migrations, durability settings, the one group-committing write path."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.store.migrations import MIGRATIONS, TABLES
from vast_manager.coordinator.store.writer import Store, Tx

from support.coord_support import database_before_migration
from support.paths import FIXTURES


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "db.sqlite")
    yield s
    s.close()


def test_migrations_are_recorded_and_run_once(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    first = Store(path)
    rows = list(first.db.query("select id, name from migrations"))
    assert [r["id"] for r in rows] == [m[0] for m in MIGRATIONS]
    assert set(TABLES) <= set(first.db.table_names())
    assert "heartbeats" in first.db.view_names()  # a view since migration 3
    first.write_blocking(lambda tx: tx.blocklist.add("m1", reason="r", source="test", now=1.0,
                                                     expires_at=2.0))
    first.close()
    again = Store(path)  # reopening applies nothing twice and keeps the data
    assert len(list(again.db.query("select id from migrations"))) == len(MIGRATIONS)
    assert [b["machine_id"] for b in again.bad_hosts()] == ["m1"]
    again.close()


def test_durability_settings(store: Store) -> None:
    assert store._conn.execute("pragma journal_mode").fetchone()[0] == "wal"

    # synchronous is per connection: ask the writer's own.
    def read_level(tx: Tx) -> int:
        return int(tx._conn.execute("pragma synchronous").fetchone()[0])

    level = store.write_blocking(read_level)
    assert level == 2  # FULL


async def test_concurrent_writes_share_transactions(store: Store) -> None:
    gate = threading.Event()
    # Hold the writer on one job so the others queue up behind it.
    blocker = store.submit(lambda tx: gate.wait(5))

    def event(i: int) -> Callable[[Tx], int]:
        return lambda tx: tx.audit.add(float(i), "test", f"event {i}")

    jobs = [asyncio.wrap_future(store.submit(event(i))) for i in range(50)]
    commits_before = store.commits
    gate.set()
    ids = await asyncio.gather(*jobs)
    assert blocker.result() is True
    assert len(set(ids)) == 50
    assert store.count_rows()["events"] == 50
    # 50 jobs committed in far fewer transactions than jobs (group commit).
    assert store.commits - commits_before < 10


async def test_a_failing_job_writes_nothing_and_spares_the_others(store: Store) -> None:
    def bad(tx: Tx) -> None:
        tx.audit.add(1.0, "test", "half-written")
        raise ValueError("refused")

    good = store.write(lambda tx: tx.audit.add(2.0, "test", "kept"))
    with pytest.raises(ValueError, match="refused"):
        await asyncio.gather(store.write(bad), good)
    assert [e["reason"] for e in store.events()] == ["kept"]


def measure(store: Store, result_id: str, rate: float, *, counts: bool = True) -> None:
    def job(tx: Tx) -> None:
        tx.results.add(
            {
                "agent_id": "ag_00000000000000000000",
                "result_id": result_id,
                "kind": "benchmark",
                "received_at": 1.0,
                "directive_json": "{}",
                "machine_id": "m",
                "gpu_name": "g",
                "num_gpus": 1,
                "recomputed_rate_per_hour": rate,
                "counts_for_host_perf": int(counts),
            }
        )
        if counts:  # as ingest writes a counted benchmark: its one measurement
            tx.results.add_measurement({
                "machine_id": "m", "gpu_name": "g", "num_gpus": 1, "rate_per_hour": rate,
                "measured_at": 1.0 + len(result_id) + ord(result_id[0]), "source": "fleet",
                "offer_json": '{"dph_total": 0.5}', "recorded_at": 1.0,
            })

    store.write_blocking(job)


def test_best_rate_is_never_lowered_and_median_counts_everything(store: Store) -> None:
    measure(store, "a", 61.4)
    measure(store, "b", 46.2)  # the origin's overwrite bug: must not lower the best
    measure(store, "c", 50.0)
    measure(store, "d", 10.0, counts=False)  # flagged: not a sample
    (row,) = store.host_perf()
    assert row["best_rate_per_hour"] == pytest.approx(61.4)
    assert row["last_rate_per_hour"] == pytest.approx(50.0)
    assert row["samples"] == 3
    assert row["median_rate_per_hour"] == pytest.approx(50.0)
    assert row["dph_total"] == pytest.approx(0.5)


def test_host_perf_answers_as_the_table_did(tmp_path: Path) -> None:
    """A database written by the store when host_perf was a table it updated (fleet
    benchmarks as ingest wrote them, flagged results, imports through the import job, one
    file imported twice; tests/fixtures/host_perf_before.*, with the table's rows as they
    read then): opened now, its migration drops the table, and host_perf, computed from the
    measurements, reads as the table did."""
    db = tmp_path / "before.db"
    with sqlite3.connect(db) as conn:  # the old store's database, as SQL text
        conn.executescript((FIXTURES / "host_perf_before.sql").read_text())
    before = orjson.loads((FIXTURES / "host_perf_before.json").read_bytes())
    store = Store(str(db))
    try:
        after = store.host_perf()
        measured = store.measurements()
        assert len(measured) > len(before)
    finally:
        store.close()

    def key(row: dict[str, Any]) -> tuple[str, str, int]:
        return row["machine_id"], row["gpu_name"], row["num_gpus"]

    assert len(before) == 99 and sorted(map(key, after)) == sorted(map(key, before))
    now = {key(r): r for r in after}
    corrected: dict[tuple[str, str, int], set[str]] = {}
    for old in before:
        new = now[key(old)]
        assert set(new) == set(old)
        differ = {c for c, v in old.items()
                  if new[c] != (pytest.approx(v) if isinstance(v, float) else v)}
        if differ:
            corrected[key(old)] = differ
    # Every fleet-measured configuration reads exactly as before. The table folded an
    # imported file into a configuration with the last line of it alone: the best missed
    # a faster line earlier in the file, and the price was lost when that last line had
    # none. The view takes the best of every line and the latest price known.
    assert all(now[k]["imported_samples"] > 0 for k in corrected), corrected
    assert set().union(*corrected.values()) <= {"best_rate_per_hour", "dph_total"}, corrected
    for k in corrected:
        old_row = next(r for r in before if key(r) == k)
        assert now[k]["best_rate_per_hour"] >= old_row["best_rate_per_hour"]
        assert old_row["dph_total"] in (None, pytest.approx(now[k]["dph_total"]))
    assert 0 < len(corrected) < len(before) // 4
    for k, row in now.items():
        rates = [m["rate_per_hour"] for m in measured if key(m) == k]
        assert row["best_rate_per_hour"] == max(rates) and row["samples"] == len(rates)
    assert [key(r) for r in after] == [key(r) for r in sorted(
        before, key=lambda r: (-r["median_rate_per_hour"], r["machine_id"]))]


def test_result_id_is_unique_per_agent(store: Store) -> None:
    measure(store, "same", 10.0, counts=False)
    with pytest.raises(Exception, match="UNIQUE"):
        measure(store, "same", 10.0, counts=False)
    assert store.count_rows()["results"] == 1


def test_logs_and_heartbeat_history_are_bounded(store: Store) -> None:
    def logs(tx: Tx) -> None:
        for batch in range(3):
            tx.audit.add_logs(
                1, "ag_x", 1.0, [(float(i), "s", f"{batch}-{i}") for i in range(4)], keep_lines=5
            )

    store.write_blocking(logs)
    assert [r["text"] for r in store.logs(1, 100)] == ["1-3", "2-0", "2-1", "2-2", "2-3"]

    def beats(tx: Tx) -> int:
        written = 0
        for t in range(0, 1000, 10):  # one heartbeat every 10 s
            written += tx.heartbeats.append_history(
                {
                    "agent_id": "ag_x",
                    "instance_id": 1,
                    "received_at": float(t),
                    "seq": t,
                    "phase": "proving",
                    "proofs_completed_total": 0,
                    "telemetry_json": None,
                },
                interval_s=100.0,
                keep_rows=4,
            )
        return written

    assert store.write_blocking(beats) == 10  # downsampled to one per 100 s
    history = store.heartbeat_history("ag_x")
    assert [h["received_at"] for h in history] == [600.0, 700.0, 800.0, 900.0]


def test_store_refuses_memory_databases() -> None:
    with pytest.raises(ValueError):
        Store(":memory:")


def test_migration_3_moves_the_latest_heartbeats_onto_their_instances(tmp_path: Path) -> None:
    """A database from before migration 3 keeps every agent's latest heartbeat, now read
    through the ``heartbeats`` view."""
    path = tmp_path / "old.sqlite"
    db = database_before_migration(path, 3)
    db["agents"].insert({"agent_id": "ag_" + "1" * 20, "label": "a", "kind": "byo",
                         "revoked": 0, "issued_at": 1.0})
    for instance_id, agent in ((1, "ag_" + "1" * 20), (2, "ag_" + "2" * 20)):
        db["instances"].insert({"id": instance_id, "agent_id": agent, "kind": "byo",
                                "state": "proving", "last_seq": 7, "phase": "proving",
                                "phase_started_at": 5.0, "progress_json": None,
                                "proofs_completed_total": 40, "created_at": 1.0,
                                "updated_at": 1.0})
    db["heartbeats"].insert({"agent_id": "ag_" + "1" * 20, "instance_id": 1,
                             "received_at": 99.0, "seq": 7, "phase": "proving",
                             "phase_started_at": 5.0, "progress_json": None,
                             "proofs_completed_total": 40,
                             "proof_seconds_recent_json": "[30.5,31.0]"})
    db.conn.close()
    store = Store(path)
    try:
        assert store.latest_heartbeat("ag_" + "1" * 20) == {
            "agent_id": "ag_" + "1" * 20, "instance_id": 1, "received_at": 99.0, "seq": 7,
            "phase": "proving", "phase_started_at": 5.0, "progress_json": None,
            "proofs_completed_total": 40, "proof_seconds_recent_json": "[30.5,31.0]"}
        # An instance that never sent a heartbeat has none.
        assert store.latest_heartbeat("ag_" + "2" * 20) is None
        assert "heartbeats" not in store.db.table_names()
    finally:
        store.close()


def test_migration_15_moves_the_latest_telemetry_onto_its_instances(tmp_path: Path) -> None:
    """A database from before migration 15 keeps every instance's latest telemetry, now on
    its row and read through the ``telemetry`` view; whole-row reads leave it out."""
    path = tmp_path / "old.sqlite"
    db = database_before_migration(path, 15)
    for instance_id in (1, 2):
        db["instances"].insert({"id": instance_id, "kind": "deployed", "state": "proving",
                                "created_at": 1.0})
    db["telemetry"].insert({"instance_id": 1, "received_at": 99.0,
                            "telemetry_json": '{"window_s": 15}'})
    db.conn.close()
    store = Store(path)
    try:
        assert store.latest_telemetry(1) == {
            "instance_id": 1, "received_at": 99.0, "telemetry_json": '{"window_s": 15}'}
        assert store.latest_telemetry(2) is None  # never sent any
        assert [r[0] for r in store.live_telemetry(["proving"])] == [1]
        assert "telemetry" not in store.db.table_names()
        assert "telemetry_json" not in (store.get_instance(1) or {})
        assert "telemetry_json" not in store.list_instances()[0]
    finally:
        store.close()


def test_the_database_and_its_wal_are_created_readable_by_the_owner_alone(
    tmp_path: Path,
) -> None:
    """The probe found the database created 0644 (world-readable): agent ids, hosts,
    decisions. Now 0600, and SQLite gives the -wal and -shm files the same."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "private.db")
        try:
            store.write_blocking(lambda tx: tx.audit.add(1.0, "test", "a write"))
            modes = {suffix: stat.S_IMODE(os.stat(f"{tmp_path / 'private.db'}{suffix}").st_mode)
                     for suffix in ("", "-wal", "-shm")}
        finally:
            store.close()
    finally:
        os.umask(old)
    assert modes == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
