"""Replication with the real Litestream binary and a file replica, and ``restore``.

S3 is not exercised here: a local S3 server (moto[server]) would add a dependency and a
process for what Litestream's own tests cover; the replica URL is passed to Litestream
as given, so the file replica runs the same code of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.runtime import Runtime
from vast_manager.coordinator.store.dbfile import DbLock
from vast_manager.coordinator.store.replica import Replicator, config_text, replica_url
from vast_manager.coordinator.store.restore import RestoreError, live_reason, restore
from vast_manager.coordinator.store.writer import Store

from support.coord_support import make_settings
from support.fakes_provider import FakeProvider


def _fleet_db(path: Path) -> None:
    """A coordinator database (migrated), closed."""
    Store(path).close()


def _count(path: Path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return int(db.execute(f"select count(*) from {table}").fetchone()[0])


def _add_agents(path: Path, n: int, start: int = 0) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        for i in range(start, start + n):
            db.execute("insert into spool_marks (agent_id, result_seq, logs_seq) "
                       "values (?, ?, ?)", (f"ag_{i:020x}", i, i))
            db.commit()


def test_the_configuration_names_the_database_the_replica_and_the_socket(
        tmp_path: Path) -> None:
    text = config_text(str(tmp_path / "a.db"), str(tmp_path / "rep"), "/tmp/x.sock")
    assert f'"url": "file://{tmp_path / "rep"}"' in text
    assert '"path": "/tmp/x.sock"' in text and '"enabled": true' in text
    assert replica_url("s3://bucket/fleet") == "s3://bucket/fleet"


async def test_replicated_writes_restore_whole_and_checked(tmp_path: Path) -> None:
    db, rep = tmp_path / "fleet.db", tmp_path / "replica"
    _fleet_db(db)
    replicator = Replicator(str(db), str(rep), time.time, probe_interval_s=0.2)
    await replicator.start()
    try:
        first = replicator.health()
        assert first.running and first.last_sync_at is not None and first.error is None
        _add_agents(db, 50)
        await replicator.durable()
        lag = replicator.health().lag_s(time.time())
        assert lag is not None and lag < 5
        watch = asyncio.create_task(replicator.watch())
        await asyncio.sleep(0.6)
        assert replicator.health().last_sync_at > first.last_sync_at  # type: ignore[operator]
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    finally:
        await replicator.stop()
    assert not replicator.health().running
    out = tmp_path / "restored.db"
    done = await asyncio.to_thread(restore, str(rep), str(out))
    assert done.db_path == str(out) and done.instances == 0
    assert _count(out, "spool_marks") == 50
    with contextlib.closing(sqlite3.connect(out)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_a_replica_that_cannot_be_written_refuses_the_start(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    _fleet_db(db)
    (tmp_path / "file").write_text("not a folder")
    # Refused when the first sync is not confirmed in time (60 s by default).
    replicator = Replicator(str(db), str(tmp_path / "file" / "replica"), time.time,
                            start_timeout_s=3.0)
    with pytest.raises(Exception, match="could not be written"):
        await replicator.start()
    assert not replicator.health().running


def test_restore_refuses_a_live_database(tmp_path: Path) -> None:
    rep, db = tmp_path / "replica", tmp_path / "fleet.db"
    _fleet_db(db)
    lock = DbLock(str(db))  # what a serving coordinator holds
    try:
        with pytest.raises(RestoreError, match="refusing to overwrite a live database: "
                           "another coordinator"):
            restore(str(rep), str(db), force=True)
    finally:
        lock.release()
    # Not served, but its WAL holds writes not yet in the file.
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("insert into spool_marks (agent_id) values ('ag_x')")
    conn.commit()
    try:
        assert "holds writes not yet in" in (live_reason(str(db)) or "")
        with pytest.raises(RestoreError, match="live database"):
            restore(str(rep), str(db), force=True)
    finally:
        conn.close()  # the last connection folds the WAL in
    assert live_reason(str(db)) is None
    with pytest.raises(RestoreError, match="exists; pass --force"):
        restore(str(rep), str(db))


async def test_restore_at_a_time_and_over_an_old_file_with_force(tmp_path: Path) -> None:
    db, rep = tmp_path / "fleet.db", tmp_path / "replica"
    _fleet_db(db)
    replicator = Replicator(str(db), str(rep), time.time)
    await replicator.start()
    await asyncio.sleep(1.5)
    between = datetime.now(UTC).replace(microsecond=0)
    await asyncio.sleep(1.5)
    _add_agents(db, 3)
    await replicator.durable()
    await replicator.stop()
    old = tmp_path / "old.db"
    _fleet_db(old)
    done = await asyncio.to_thread(restore, str(rep), str(old), force=True)
    assert _count(Path(done.db_path), "spool_marks") == 3
    with pytest.raises(RestoreError, match="holds no backup at that time"):
        await asyncio.to_thread(restore, str(rep), str(tmp_path / "x.db"),
                                at=datetime(2000, 1, 1, tzinfo=UTC))
    assert not (tmp_path / "x.db").exists()
    early = await asyncio.to_thread(restore, str(rep), str(tmp_path / "early.db"), at=between)
    assert _count(Path(early.db_path), "spool_marks") == 0  # the state before the writes


def _corrupt(replica: Path) -> None:
    for ltx in replica.rglob("*.ltx"):
        data = bytearray(ltx.read_bytes())
        for i in range(120, len(data) - 16, 5):
            data[i] ^= 0x5A
        ltx.write_bytes(bytes(data))


async def test_the_cli_restores_and_says_a_corrupt_replica_in_one_line(tmp_path: Path) -> None:
    db, rep = tmp_path / "fleet.db", tmp_path / "replica"
    _fleet_db(db)
    replicator = Replicator(str(db), str(rep), time.time)
    await replicator.start()
    _add_agents(db, 2)
    await replicator.durable()
    await replicator.stop()
    runner = CliRunner()
    out = tmp_path / "restored.db"
    ok = await asyncio.to_thread(runner.invoke, cli, ["restore", "--from", str(rep),
                                                      "--db", str(out)])
    assert ok.exit_code == 0, ok.output
    assert f"restored {out} from {rep}" in ok.output and "integrity ok" in ok.output
    _corrupt(rep)
    bad = await asyncio.to_thread(runner.invoke, cli, ["restore", "--from", str(rep),
                                                       "--db", str(tmp_path / "b.db")])
    assert bad.exit_code != 0
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "is corrupt" in lines[0], bad.output
    assert not (tmp_path / "b.db").exists()
    nothing = await asyncio.to_thread(runner.invoke, cli, [
        "restore", "--from", str(tmp_path / "empty"), "--db", str(tmp_path / "c.db")])
    assert nothing.exit_code != 0 and "holds no backup" in nothing.output


async def test_serve_without_a_replica_says_the_state_is_on_one_disk(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    runtime = await Runtime.open(make_settings(tmp_path), FakeProvider())
    await runtime.stop()
    said = [r.getMessage() for r in caplog.records if "one disk" in r.getMessage()]
    assert len(said) == 1 and "VM_REPLICA_URL" in said[0]
    assert not runtime.replica_health().configured


async def test_serve_with_a_replica_runs_litestream_and_stops_it(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, replica_url=str(tmp_path / "replica"))
    runtime = await Runtime.open(settings, FakeProvider())
    try:
        await runtime.start(loops=False)
        health = runtime.replica_health()
        assert health.configured and health.running and health.last_sync_at is not None
        await runtime.durable()
    finally:
        await runtime.stop()
    assert not runtime.replica_health().running
    assert list((tmp_path / "replica").rglob("*.ltx"))


def test_status_says_the_replica_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from vast_manager.coordinator.cli import commands

    class Client:
        def __init__(self, replica: dict[str, object] | None) -> None:
            self.replica = replica

        def get(self, path: str) -> dict[str, object]:
            assert path == "/api/fleet"
            return {} if self.replica is None else {"replica": self.replica}

    for replica, said in (
        ({"configured": False}, "replica: none, the fleet's state is on one disk"),
        ({"configured": True, "url": "s3://b/f", "running": True, "lag_s": 3.2,
          "error": None}, "replica s3://b/f: last sync 3 s ago"),
        ({"configured": True, "url": "/bk", "running": False, "lag_s": None,
          "error": "litestream exited with status 1; restarting"},
         "replica /bk: never confirmed; NOT replicating: litestream exited"),
    ):
        commands._replica_line(Client(replica))  # type: ignore[arg-type]
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and said in out, out
    commands._replica_line(Client(None))  # type: ignore[arg-type]
    assert capsys.readouterr().out == ""  # an older coordinator says nothing of it
