"""Production as the cluster records it, on a real PostgreSQL holding Curio's own tables:
an instance that benchmarked 100/h but delivered 10/h is shown so, flagged with the
cluster's error and terminated below its minimum; an honest one is kept; two instances on
one host_and_port are unattributable and kept; a stopped database raises one alert,
destroys nothing, and the read recovers when it returns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.decisions.attribution import node_name
from vast_manager.coordinator.decisions.states import State

from support.coord_support import ADMIN, ADMIN_TOKEN, Agent, Harness, start
from support.postgres import PostgresServer, record_tasks, register_node

WINDOW_S = 3600.0
BENCH_RATE = 100.0
MIN_RATE = 50.0
SERIALIZATION = ("error: PSProve: proof failed self-check: serialization failure: "
                 "cbor input had wrong number of fields")


async def _proving(h: Harness, label: str) -> tuple[Agent, int]:
    agent = await h.issue(label, min_rate=MIN_RATE)
    status, _ = await agent.hello()
    assert status == 200
    await agent.heartbeat("proving")
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    ident = int(inst["id"])
    # Benchmarked at 100/h, proving for the whole window.
    await h.store.write(lambda tx: tx.instances.update(
        ident, rate_per_hour=BENCH_RATE, dph_total=0.5, state_since=h.clock() - WINDOW_S))
    return agent, ident


def _hourly(n: int, now: float) -> list[float]:
    """``n`` work_end times spread over the last hour."""
    return [now - WINDOW_S + (i + 0.5) * WINDOW_S / n for i in range(n)]


async def _round(h: Harness) -> None:
    await h.core.monitor.cluster.refresh()
    await h.core.monitor.tick()


async def _cli(h: Harness, *args: str) -> str:
    url = str(h.client.make_url("")).rstrip("/")
    env = {"VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "250"}
    out = await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env)
    assert out.exit_code == 0, out.output
    return str(out.output)


async def _metrics(h: Harness) -> dict[str, Any]:
    resp = await h.client.get("/metrics", headers=ADMIN)
    return {f.name: f for f in text_string_to_metric_families(await resp.text())}


async def test_delivered_beside_claimed_and_the_under_deliverer_ends(
    aiohttp_client: Any, tmp_path: Path, pg: PostgresServer
) -> None:
    h = await start(aiohttp_client, tmp_path, curio_db_url=pg.reader_url,
                    curio_window_s=WINDOW_S)
    _, liar = await _proving(h, "forger")
    _, honest = await _proving(h, "honest")
    now = h.clock()
    conn = await pg.admin()
    try:
        await register_node(conn, node_name(liar), "203.0.113.7:41230")
        await register_node(conn, node_name(honest), "198.51.100.9:40112")
        await register_node(conn, "someone-else", "192.0.2.50:12300")
        await record_tasks(conn, "203.0.113.7:41230", _hourly(10, now))
        await record_tasks(conn, "203.0.113.7:41230", _hourly(4, now), result=False,
                           err=SERIALIZATION)
        # A preempted task is handed back, not failed (recordCompletion's err 'preempted').
        await record_tasks(conn, "203.0.113.7:41230", [now - 60], result=False,
                           err="preempted")
        await record_tasks(conn, "198.51.100.9:40112", _hourly(100, now))
        # Older than the window, another task type, a node no instance holds.
        await record_tasks(conn, "203.0.113.7:41230", _hourly(500, now - WINDOW_S))
        await record_tasks(conn, "203.0.113.7:41230", _hourly(50, now), name="WdPost")
        await record_tasks(conn, "192.0.2.50:12300", _hourly(7, now))
    finally:
        await conn.close()

    await _round(h)

    _, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    forged, kept = by_id[liar], by_id[honest]
    assert forged["rate_per_hour"] == BENCH_RATE
    assert forged["delivered_rate_per_hour"] == pytest.approx(10.0)
    assert forged["delivered_source"] == "cluster"
    assert (forged["tasks_completed"], forged["tasks_failed"]) == (10, 4)
    assert forged["last_task_error"] == SERIALIZATION
    assert set(forged["cluster_flags"]) == {"below_claimed", "task_failures"}
    assert forged["state"] == State.TERMINATING
    assert "delivered 10.0/h" in forged["terminate_reason"]
    assert "below its minimum 50.0/h" in forged["terminate_reason"]
    assert kept["delivered_rate_per_hour"] == pytest.approx(100.0)
    assert kept["state"] == State.PROVING and kept["cluster_flags"] == {}

    _, fleet = await h.admin("GET", "/api/fleet")
    assert fleet["cluster"]["configured"] and fleet["cluster"]["alert"] is None
    assert fleet["unattributable_addresses"] == [
        {"host_and_port": "192.0.2.50:12300", "tasks_completed": 7, "tasks_failed": 0}]

    _status, events = await h.admin("GET", "/api/events?limit=100")
    kinds = {(e["instance_id"], e["kind"]) for e in events}
    assert {(liar, "delivered_below_claimed"), (liar, "delivered_task_failures"),
            (liar, "underdelivered")} <= kinds
    assert not {k for k in kinds if k[0] == honest and k[1].startswith(("delivered", "under"))}

    shown = await _cli(h, "instance", str(liar))
    assert "delivered 10/h" in shown and "benchmark 100/h" in shown
    assert SERIALIZATION in shown
    table = await _cli(h, "status")
    assert "DELIVERED" in table
    fams = await _metrics(h)
    delivered = {s.labels["instance_id"]: s.value
                 for s in fams["vm_instance_delivered_proofs_per_hour"].samples}
    assert delivered[str(liar)] == pytest.approx(10.0)
    assert delivered[str(honest)] == pytest.approx(100.0)
    failed = {s.labels["instance_id"]: s.value
              for s in fams["vm_instance_tasks_failed"].samples}
    assert failed[str(liar)] == 4
    assert fams["vm_cluster_source_up"].samples[0].value == 1


async def test_two_instances_on_one_host_and_port_are_unattributable_and_kept(
    aiohttp_client: Any, tmp_path: Path, pg: PostgresServer
) -> None:
    h = await start(aiohttp_client, tmp_path, curio_db_url=pg.reader_url,
                    curio_window_s=WINDOW_S)
    _, first = await _proving(h, "first")
    _, second = await _proving(h, "second")
    now = h.clock()
    conn = await pg.admin()
    try:
        # Two containers behind one NAT: both nodes report the same address.
        await register_node(conn, node_name(first), "172.17.0.2:12300")
        await register_node(conn, node_name(second), "172.17.0.2:12300")
        await record_tasks(conn, "172.17.0.2:12300", _hourly(3, now))  # 3/h < 50/h
    finally:
        await conn.close()

    await _round(h)

    _status, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    for ident, other in ((first, second), (second, first)):
        view = by_id[ident]
        assert view["cluster_status"].startswith("unattributable")
        assert f"also claimed by instance {other}" in view["cluster_status"]
        assert view["delivered_rate_per_hour"] is None
        assert view["state"] == State.PROVING and view["terminate_reason"] is None
    shown = await _cli(h, "instance", str(first))
    assert "unattributable" in shown


async def test_the_database_stopped_mid_run_alerts_destroys_nothing_and_recovers(
    aiohttp_client: Any, tmp_path: Path, pg: PostgresServer
) -> None:
    h = await start(aiohttp_client, tmp_path, curio_db_url=pg.reader_url,
                    curio_window_s=WINDOW_S, curio_read_timeout_s=5.0)
    agent, ident = await _proving(h, "rig")
    conn = await pg.admin()
    try:
        await register_node(conn, node_name(ident), "203.0.113.8:41000")
        await record_tasks(conn, "203.0.113.8:41000", _hourly(90, h.clock()))
    finally:
        await conn.close()
    await _round(h)
    _, view = await h.admin("GET", f"/api/instances/{ident}")
    assert view["delivered_rate_per_hour"] == pytest.approx(90.0)

    pg.stop()
    h.clock.advance(30)
    await agent.heartbeat("proving")
    await _round(h)  # one round: the alert is up
    _, fleet = await h.admin("GET", "/api/fleet")
    alert = fleet["cluster"]["alert"]
    assert alert is not None and alert.startswith("cluster database unavailable")
    assert "reader-pass" not in alert  # never the URL's password
    _, view = await h.admin("GET", f"/api/instances/{ident}")
    assert view["state"] == State.PROVING and view["terminate_reason"] is None
    assert view["delivered_rate_per_hour"] is None  # back to the agent's counter
    assert "unavailable" in view["cluster_status"]
    fams = await _metrics(h)
    assert fams["vm_cluster_source_up"].samples[0].value == 0
    page = await h.client.get("/static/app.js")
    assert "cluster-alert" in await page.text()  # the dashboard's banner reads the alert

    # Retried on the backoff, not every round: the next read waits.
    failed = h.core.monitor.cluster.reads_failed_total
    await h.core.monitor.cluster.refresh()
    assert h.core.monitor.cluster.reads_failed_total == failed

    pg.start()
    h.clock.advance(600)  # past the backoff (monitor interval, doubling, capped)
    await h.store.write(lambda tx: tx.instances.update(ident, state_since=h.clock() - WINDOW_S))
    conn = await pg.admin()
    try:
        await record_tasks(conn, "203.0.113.8:41000", _hourly(80, h.clock()))
    finally:
        await conn.close()
    await agent.heartbeat("proving")
    await _round(h)
    _, fleet = await h.admin("GET", "/api/fleet")
    assert fleet["cluster"]["alert"] is None
    _status, view = await h.admin("GET", f"/api/instances/{ident}")
    assert view["delivered_rate_per_hour"] == pytest.approx(80.0)


async def test_a_read_only_session_cannot_write(pg: PostgresServer) -> None:
    """The coordinator's role reads; the session refuses writes whatever the grants."""
    conn = await asyncpg.connect(pg.reader_url, server_settings={"search_path": "curio"})
    try:
        with pytest.raises(asyncpg.PostgresError):
            await conn.execute("DELETE FROM harmony_task_history")
    finally:
        await conn.close()


async def test_a_second_node_that_takes_over_an_address_makes_both_unattributable(
    aiohttp_client: Any, tmp_path: Path, pg: PostgresServer
) -> None:
    """As Curio really registers a node: one harmony_machines row per host_and_port, its
    details row overwritten by the next node there (resources.go's upsert, tasks.go's
    ON CONFLICT (machine_id)). The name seen before is remembered, so the rows are no one's."""
    h = await start(aiohttp_client, tmp_path, curio_db_url=pg.reader_url,
                    curio_window_s=WINDOW_S)
    _, first = await _proving(h, "first")
    _, second = await _proving(h, "second")
    conn = await pg.admin()
    try:
        machine = await register_node(conn, node_name(first), "172.17.0.2:12300")
        await record_tasks(conn, "172.17.0.2:12300", _hourly(60, h.clock()))
        await _round(h)
        _, view = await h.admin("GET", f"/api/instances/{first}")
        assert view["delivered_rate_per_hour"] == pytest.approx(60.0)
        await conn.execute("UPDATE harmony_machine_details SET machine_name = $1 "
                           "WHERE machine_id = $2", node_name(second), machine)
    finally:
        await conn.close()
    h.clock.advance(60)
    await _round(h)
    _, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    for ident in (first, second):
        assert by_id[ident]["cluster_status"].startswith("unattributable")
        assert by_id[ident]["delivered_rate_per_hour"] is None
        assert by_id[ident]["state"] == State.PROVING
