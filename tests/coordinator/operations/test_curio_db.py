"""The read of Curio's HarmonyDB on a real PostgreSQL: a slow database times out into the
alert without holding a heartbeat, an unexpected schema is named, and the round's one query
uses Curio's index."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.curio_db import READ_SQL, ClusterUnavailable, CurioDb

from support.coord_support import start
from support.postgres import PostgresServer, record_tasks, register_node


async def test_a_slow_database_times_out_and_heartbeats_go_on(
    aiohttp_client: Any, tmp_path: Path, pg: PostgresServer
) -> None:
    h = await start(aiohttp_client, tmp_path, curio_db_url=pg.reader_url,
                    curio_read_timeout_s=2.0)
    agent = await h.issue("rig")
    assert (await agent.hello())[0] == 200
    blocker = await pg.admin()
    tx = blocker.transaction()
    await tx.start()
    # Holds the history table: the coordinator's read waits on the lock.
    await blocker.execute("LOCK TABLE harmony_task_history IN ACCESS EXCLUSIVE MODE")
    try:
        read = asyncio.ensure_future(h.core.monitor.cluster.refresh())
        await asyncio.sleep(0.2)
        assert not read.done()
        status, _ = await agent.heartbeat("proving")  # answered while the read waits
        assert status == 200 and not read.done()
        await asyncio.wait_for(read, 30)
    finally:
        await tx.rollback()
        await blocker.close()
    alert = h.core.monitor.cluster.alert
    assert alert is not None and "no answer within 2 s" in alert


async def test_an_unexpected_schema_is_named(pg: PostgresServer) -> None:
    db = CurioDb(pg.reader_url, "not_curio", 10.0)
    with pytest.raises(ClusterUnavailable, match="unexpected schema in 'not_curio'"):
        await db.read(0.0, ["PSProve"], "vm-")
    await db.close()


async def test_the_query_reads_curios_index(pg: PostgresServer) -> None:
    conn = await pg.admin()
    try:
        await register_node(conn, "vm-1", "203.0.113.1:1")
        # Enough old rows that a scan of the table would be the planner's worse choice.
        await conn.execute(
            "INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, "
            "result, completed_by_host_and_port, err) SELECT g, 'PSProve', now(), now(), "
            "now() - make_interval(secs => g), true, '203.0.113.1:1', '' "
            "FROM generate_series(1, 50000) g")
        await conn.execute("ANALYZE harmony_task_history")
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN " + READ_SQL, 1_800_000_000.0, ["PSProve"], "vm-%", 1_800_000_000.0))
    finally:
        await conn.close()
    assert "harmony_task_history_work_index" in plan or \
        "harmony_task_history_recent_task_result_idx" in plan, plan
    db = CurioDb(pg.reader_url, "curio", 10.0)
    rows = await db.read(0.0, ["PSProve"], "vm-")
    await db.close()
    assert rows.machines == (("vm-1", "203.0.113.1:1"),)
    assert rows.tallies["203.0.113.1:1"].completed == 50000




async def test_each_read_hands_out_the_tasks_since_the_previous_one_once(
    pg: PostgresServer,
) -> None:
    """The observation a round-by-round delivered test folds: each task in one read's
    increments only, beside the window's totals."""
    from vast_manager.coordinator.operations.cluster import ClusterWatch
    from vast_manager.coordinator.settings import DEFAULTS

    clock = [1_800_000_000.0]
    watch = ClusterWatch(DEFAULTS.with_values(curio_db_url=pg.reader_url), lambda: clock[0])
    rows = [{"id": 1, "state": "proving", "state_since": clock[0] - 3600,
             "rate_per_hour": 100.0, "min_rate_per_hour": 50.0, "dph_total": 0.5}]
    conn = await pg.admin()
    try:
        await register_node(conn, "vm-1", "203.0.113.1:1")
        await record_tasks(conn, "203.0.113.1:1", [clock[0] - 600 * k for k in range(6)])
        await watch.refresh()
        first = watch.assess(rows, {}, clock[0])
        assert first.increments[1].completed == 6  # the first read: the whole window
        assert watch.assess(rows, {}, clock[0]).increments == {}  # once per read
        clock[0] += 60
        await record_tasks(conn, "203.0.113.1:1", [clock[0] - 30, clock[0] - 10])
        await record_tasks(conn, "203.0.113.1:1", [clock[0] - 20], result=False, err="error: x")
        await watch.refresh()
        second = watch.assess(rows, {}, clock[0])
    finally:
        await conn.close()
        await watch.close()
    got = second.increments[1]
    assert (got.completed, got.failed, got.window_s, got.source) == (2, 1, 60.0, "cluster")
    assert second.views[1]["tasks_completed"] == 8  # the window's, as the views show
