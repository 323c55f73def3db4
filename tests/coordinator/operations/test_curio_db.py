"""The read of Curio's HarmonyDB on a real PostgreSQL: a slow database times out into the
alert without holding a heartbeat, an unexpected schema is named, and the round's one query
uses Curio's index."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.curio_db import READ_SQL, ClusterUnavailable, CurioDb

from support.coord_support import start
from support.postgres import PostgresServer, postgres_server, register_node


@pytest.fixture
async def pg() -> AsyncIterator[PostgresServer]:
    with postgres_server() as server:
        await server.prepare()
        yield server


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
            "EXPLAIN " + READ_SQL, 1_800_000_000.0, ["PSProve"], "vm-%"))
    finally:
        await conn.close()
    assert "harmony_task_history_work_index" in plan or \
        "harmony_task_history_recent_task_result_idx" in plan, plan
    db = CurioDb(pg.reader_url, "curio", 10.0)
    rows = await db.read(0.0, ["PSProve"], "vm-")
    await db.close()
    assert rows.machines == (("vm-1", "203.0.113.1:1"),)
    assert rows.tallies["203.0.113.1:1"].completed == 50000


