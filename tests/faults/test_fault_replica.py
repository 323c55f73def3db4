"""The coordinator's machine lost: its database restored from the Litestream replica.

``vast-manager serve --provider vast`` runs as its own process against the fake vast.ai
(in this test's event loop) with ``VM_REPLICA_URL`` a folder: the real Litestream binary
replicates the database. Two real agents on the simulated cuzk prove; each is asked to
benchmark again (results in flight) while their logs flow. Then replication is made to
fall behind (Litestream SIGSTOPped: the acknowledged writes after it never reach the
replica, the window an asynchronous replica can lose), the coordinator is SIGKILLed, its
database, WAL and SHM are deleted, ``vast-manager restore`` writes the replica into a new
path and ``serve`` starts on it at the same address, after ``down_s`` of outage.

Afterwards: every result and every log line an agent ever had acknowledged is stored
exactly once (the agents sent again what the restored database lacked); no instance was
destroyed on vast.ai or left unwatched (each is proving again in the restored
coordinator); no agent self-terminated.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from vast_manager.coordinator.providers.local.catalog import local_offers

from support.fakevast import FAKE_API_KEY, FakeVast, SimAgents
from support.fault_support import CoordinatorProcess, admin_call, process_env

TIME_SCALE = 240.0
OFFERS = (9003, 9001)  # 1x RTX 5070 Ti and 1x RTX 4090: both well above their minimum rates
IMAGE = "ghcr.io/example/vast-agent:replica-test"


def add_offer(fake: FakeVast, offer_id: int) -> None:
    (offer,) = [o for o in local_offers() if o["id"] == offer_id]
    fake.add_offer(offer_id, offer["machine_id"],
                   **{k: v for k, v in offer.items() if k not in ("id", "machine_id")})


async def until(cond: Any, what: str, timeout_s: float, poll_s: float = 0.5,
                seen: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(cond):
        if time.monotonic() > deadline:
            now = "" if seen is None else f"; {await asyncio.to_thread(seen)}"
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{now}")
        await asyncio.sleep(poll_s)


def litestream_of(coord: CoordinatorProcess) -> psutil.Process:
    assert coord.proc is not None
    (child,) = [c for c in psutil.Process(coord.proc.pid).children()
                if c.name() == "litestream"]
    return child


def acked_lines(spool: Path) -> collections.Counter[tuple[float, str, str]]:
    """Every log line of every batch the coordinator acknowledged (kept in acked/)."""
    lines: collections.Counter[tuple[float, str, str]] = collections.Counter()
    for path in spool.glob("acked/*-logs.json"):
        for line in json.loads(path.read_bytes())["lines"]:
            lines[(line["ts"], line["source"], line["text"])] += 1
    return lines


def audit(agents: SimAgents, db_path: Path) -> dict[str, int]:
    """Every acknowledged result and log line is stored exactly once; returns totals."""
    totals = {"results": 0, "log_lines": 0, "replayed": 0}
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        for vid in agents.processes:
            home = agents.log_path(vid).parent
            text = agents.log_path(vid).read_text(errors="replace")
            agent_id = agents.envs[vid]["VM_AGENT_ID"]
            delivered = set(re.findall(r"result (\S+) delivered", text))
            rows = dict(db.execute(
                "select result_id, count(*) from results where agent_id = ? "
                "and instr(coalesce(flags, ''), 'early_verdict') = 0 group by result_id",
                (agent_id,)).fetchall())
            assert all(n == 1 for n in rows.values()), (agent_id, rows)
            assert delivered <= set(rows), f"{agent_id}: acknowledged, not stored: " \
                f"{delivered - set(rows)}"
            spool = home / "state" / "spool"
            assert not list(spool.glob("*.json")), f"{agent_id}: items still pending"
            acked = acked_lines(spool)
            stored = collections.Counter(
                (ts, source, line) for ts, source, line in db.execute(
                    "select ts, source, text from logs where agent_id = ?", (agent_id,)))
            assert stored == acked, (
                f"{agent_id}: acknowledged but not stored {sum((acked - stored).values())} "
                f"lines, stored more than once or never acknowledged "
                f"{sum((stored - acked).values())}")
            totals["results"] += len(rows)
            totals["log_lines"] += sum(stored.values())
            totals["replayed"] += text.count("acknowledged item(s)")
    return totals


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("down_s", [
    pytest.param(1.0, id="restored-at-once"),
    # The same with a long outage: agents keep proving past it (VM_ORPHAN_TIMEOUT is
    # 1800 s); the restored coordinator times their silence from its own start.
    pytest.param(60.0, id="down-60s", marks=pytest.mark.slow),
    # Ten minutes down, almost all of it sleep: run on request (VM_TEST_LONG_OUTAGE=1),
    # so CI's slow set stays within its budget (docs/operations.md, "Losing the
    # coordinator").
    pytest.param(600.0, id="down-10min", marks=[pytest.mark.slow, pytest.mark.skipif(
        os.environ.get("VM_TEST_LONG_OUTAGE") != "1",
        reason="ten minutes of outage: set VM_TEST_LONG_OUTAGE=1 to run it")]),
])
async def test_machine_lost_restore_from_replica_loses_nothing_acknowledged(
        tmp_path: Path, down_s: float) -> None:
    agents = SimAgents(tmp_path / "instances", time_scale=TIME_SCALE)
    env = process_env(tmp_path, VM_NEXT_HEARTBEAT_S="1", VM_MONITOR_INTERVAL_S="1",
                      VM_TERMINATE_GRACE_S="3", VM_SIM_TIME_SCALE=str(TIME_SCALE),
                      VM_VAST_IMAGE=IMAGE, VAST_API_KEY=FAKE_API_KEY,
                      VM_LOG_LINES_PER_INSTANCE="1000000",
                      # No work command feeds these agents' cuzk: at 240x they would be
                      # idle (and stopped) within seconds of proving.
                      VM_IDLE_DESTROY_AFTER_S="0",
                      VM_REPLICA_URL=str(tmp_path / "replica"))
    coord = CoordinatorProcess(tmp_path, env, provider="vast")
    try:
        async with FakeVast(launcher=agents) as fake:
            env["VAST_URL"] = fake.url
            for offer_id in OFFERS:
                add_offer(fake, offer_id)
            await asyncio.to_thread(coord.start)
            for offer_id in OFFERS:
                await asyncio.to_thread(admin_call, coord.url, "POST", "/api/deploy",
                                        {"offer_id": offer_id})

            def fleet_now() -> str:
                rows = admin_call(coord.url, "GET", "/api/instances")
                return "; ".join(f"{r['id']}: {r['state']} {r['phase']} rate "
                                 f"{r['rate_per_hour']} pending {r.get('rebenchmark_pending')}"
                                 for r in rows)

            def proving() -> bool:
                rows = admin_call(coord.url, "GET", "/api/instances")
                return len(rows) == len(OFFERS) and all(
                    r["state"] == "proving" and r["rate_per_hour"] is not None
                    and not r.get("rebenchmark_pending") for r in rows)

            await until(proving, "both instances proving after their benchmark", 240,
                        seen=fleet_now)
            # Load: new results in flight and logs flowing, then replication falls behind.
            for row in await asyncio.to_thread(admin_call, coord.url, "GET", "/api/instances"):
                await asyncio.to_thread(admin_call, coord.url, "POST",
                                        f"/api/instances/{row['id']}/rebenchmark")
            await asyncio.sleep(1.0)
            replicator = litestream_of(coord)
            replicator.send_signal(signal.SIGSTOP)
            await asyncio.sleep(4.0)  # acknowledged writes the replica never gets
            coord.kill(signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                replicator.kill()
            for suffix in ("", "-wal", "-shm", ".lock"):
                Path(f"{coord.db_path}{suffix}").unlink(missing_ok=True)
            await asyncio.sleep(down_s)

            restore_at = time.monotonic()
            restored = tmp_path / "restored" / "fleet.db"
            restored.parent.mkdir()
            done = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "vast_manager.coordinator.cli", "restore",
                "--from", str(tmp_path / "replica"), "--db", str(restored)],
                env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert "integrity ok" in done.stdout
            restore_s = time.monotonic() - restore_at
            coord.db_path = restored
            env["VM_REPLICA_URL"] = str(tmp_path / "replica-after")
            await asyncio.to_thread(coord.start)

            def settled() -> bool:
                if not proving():
                    return False
                spools = [agents.log_path(v).parent / "state" / "spool" for v in agents.envs]
                return not any(list(s.glob("*.json")) for s in spools)

            await until(settled, "both proving again, every spool sent", 180, seen=fleet_now)
            back_s = time.monotonic() - restore_at
            await asyncio.sleep(3.0)  # a few more heartbeats and log batches
            totals = await asyncio.to_thread(audit, agents, restored)
            print(f"restored after {down_s:.0f} s down: {totals}; restore {restore_s:.1f} s; from "
                  f"the restore to every agent proving, every item stored {back_s:.1f} s")
            assert totals["replayed"] > 0, "the agents sent nothing again: no window was lost"
            for vid in agents.processes:
                assert agents.alive(vid), f"agent of instance {vid} ended"
                assert fake.destroys_of(vid) == [], f"instance {vid} was destroyed"
                assert vid in fake.instances
                text = agents.log_path(vid).read_text(errors="replace")
                assert "orphan" not in text.lower(), f"agent of instance {vid} felt orphaned"
            rows = await asyncio.to_thread(admin_call, coord.url, "GET", "/api/instances")
            assert {r["state"] for r in rows} == {"proving"}
    finally:
        coord.kill(signal.SIGKILL)
        await agents.close()
