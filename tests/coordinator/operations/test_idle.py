"""Production is measured, not assumed: a proving instance whose cuzk completes nothing
(no work command) shows idle on every view and is not fleet output; one that proves
shows what cuzk completed beside its benchmark rate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.operations.autopilot_loop import fleet_instances

from support.coord_support import ADMIN, ADMIN_TOKEN, Agent, Harness, heartbeat_msg, start

IDLE_AFTER_S = 600.0
BENCH_RATE = 100.0


async def _proving(h: Harness, label: str) -> tuple[Agent, int]:
    agent = await h.issue(label)
    status, _ = await agent.hello()
    assert status == 200
    await agent.heartbeat("proving")
    status, rows = await h.admin("GET", "/api/instances")
    ident = next(r["id"] for r in rows if r["label"] == label)
    await h.store.write(lambda tx: tx.instances.update(ident, rate_per_hour=BENCH_RATE,
                                                       dph_total=0.5))
    return agent, ident


async def _beat(agent: Agent, completed: int) -> None:
    agent.seq += 1
    msg = heartbeat_msg(agent.seq, "proving")
    msg["proofs_completed_total"] = completed
    status, data = await agent.post("/v1/heartbeat", msg)
    assert status == 200, data


async def test_an_instance_with_no_work_shows_idle_everywhere(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, idle_after_s=IDLE_AFTER_S)
    idle_agent, idle_id = await _proving(h, "no-work")
    busy_agent, busy_id = await _proving(h, "busy")
    for minute in range(12):  # one heartbeat a minute; the busy one completes a proof each
        h.clock.advance(60)
        await _beat(idle_agent, 0)
        await _beat(busy_agent, minute + 1)
        await h.core.monitor.tick()

    status, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    idle, busy = by_id[idle_id], by_id[busy_id]
    assert idle["idle"] is True and "VM_WORK_CMD" in idle["idle_reason"]
    assert idle["usd_per_proof"] is None  # it bills and proves nothing
    assert busy["idle"] is False and busy["idle_reason"] is None
    assert busy["completed_rate_per_hour"] == pytest.approx(60.0)  # cuzk's, not 100
    assert busy["rate_per_hour"] == BENCH_RATE
    status, detail = await h.admin("GET", f"/api/instances/{idle_id}")
    assert status == 200 and detail["idle"] is True

    # Not fleet output: the fleet's rate is the busy one's alone.
    status, fleet = await h.admin("GET", "/api/fleet")
    assert fleet["idle"] == 1 and fleet["proving"] == 1
    assert fleet["proofs_per_hour"] == pytest.approx(BENCH_RATE)
    assert fleet["completed_proofs_per_hour"] == pytest.approx(60.0)
    assert fleet["dollars_per_proof"] == pytest.approx(1.0 / BENCH_RATE)

    # /metrics says so per instance and for the fleet.
    resp = await h.client.get("/metrics", headers=ADMIN)
    fams = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    idle_gauge = {s.labels["instance_id"]: s.value for s in fams["vm_instance_idle"].samples}
    assert idle_gauge == {str(idle_id): 1.0, str(busy_id): 0.0}
    assert fams["vm_fleet_idle_instances"].samples[0].value == 1.0
    assert fams["vm_fleet_proofs_per_hour"].samples[0].value == pytest.approx(BENCH_RATE)

    # Reported once, as an event with the reason.
    status, events = await h.admin("GET", "/api/events?limit=50")
    assert [e["instance_id"] for e in events if e["kind"] == "idle"] == [idle_id]

    # The CLI: IDLE in status with a warning; the instance view says why.
    url = str(h.client.make_url("")).rstrip("/")
    env = {"VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"}
    runner = CliRunner()
    table = await asyncio.to_thread(runner.invoke, cli, ["status"], env=env)
    assert table.exit_code == 0, table.output
    line = next(x for x in table.output.splitlines() if x.startswith(f"{idle_id} "))
    assert " idle " in line
    assert f"instance {idle_id} is idle" in table.output
    busy_line = next(x for x in table.output.splitlines() if x.startswith(f"{busy_id} "))
    assert "60.0" in busy_line and " idle " not in busy_line
    shown = await asyncio.to_thread(runner.invoke, cli, ["instance", str(idle_id)], env=env)
    assert "IDLE: no proof completed in" in shown.output
    shown = await asyncio.to_thread(runner.invoke, cli, ["instance", str(busy_id)], env=env)
    assert "completed 60.0/h" in shown.output

    # The autopilot counts it as billing, not proving.
    active = await h.store.read(lambda r: r.active_instances())
    deployed = [{**r, "kind": "deployed", "offer_json": None} for r in active]
    fitted = await h.core.models.current()
    fleet_seen = fleet_instances(deployed, fitted.model, frozenset({idle_id}))
    seen = {int(i.instance_id): i for i in fleet_seen}
    assert seen[idle_id].leaving and seen[idle_id].rate_per_hour is None
    assert seen[busy_id].rate_per_hour == BENCH_RATE

    # Once it completes a proof again it is no longer idle.
    h.clock.advance(60)
    await _beat(idle_agent, 1)
    await h.core.monitor.tick()
    status, rows = await h.admin("GET", "/api/instances")
    assert not next(r for r in rows if r["id"] == idle_id)["idle"]


async def test_an_idle_deployed_instance_is_destroyed_when_told(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, idle_after_s=IDLE_AFTER_S,
                    idle_destroy_after_s=300.0)
    agent, ident = await _proving(h, "no-work")
    await h.store.write(lambda tx: tx.instances.update(ident, kind="deployed"))
    for _ in range(17):
        h.clock.advance(60)
        await _beat(agent, 0)
        await h.core.monitor.tick()
    inst = h.store.get_instance(ident)
    assert inst is not None and inst["state"] in ("terminating", "destroyed")
    assert "idle for 5 min" in inst["terminate_reason"]


async def test_idle_instances_are_stopped_by_default_after_a_warning(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """No setting given: an idle instance we rented is warned about when it turns idle,
    then destroyed VM_IDLE_DESTROY_AFTER_S (default 900 s, not 0) later."""
    from vast_manager.coordinator.settings import DEFAULTS

    assert DEFAULTS.idle_destroy_after_s == 900.0
    h = await start(aiohttp_client, tmp_path, idle_after_s=IDLE_AFTER_S)
    agent, ident = await _proving(h, "no-work")
    await h.store.write(lambda tx: tx.instances.update(ident, kind="deployed"))
    warned_at = None
    for _ in range(40):
        h.clock.advance(60)
        await _beat(agent, 0)
        await h.core.monitor.tick()
        inst = h.store.get_instance(ident)
        assert inst is not None
        warnings = [e for e in h.store.events(ident) if e["kind"] == "idle"]
        if warnings and warned_at is None:
            warned_at = h.clock.now
            assert inst["state"] == "proving"  # warned first, still running
            assert "will be destroyed in 15 min unless a proof completes" in \
                warnings[0]["reason"]
            status, row = await h.admin("GET", f"/api/instances/{ident}")
            assert status == 200
            assert row["idle_stop_at"] == pytest.approx(warned_at + 900.0)
        if inst["state"] != "proving":
            break
    assert warned_at is not None and inst["state"] in ("terminating", "destroyed")
    assert h.clock.now - warned_at == pytest.approx(900.0, abs=60.0)
    assert "idle for 15 min (VM_IDLE_DESTROY_AFTER_S)" in inst["terminate_reason"]


async def test_status_says_which_agents_have_not_spoken_since_a_restart(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path)
    await h.store.write(lambda tx: tx.instances.add(
        {"label": "before", "kind": "byo", "state": "proving", "created_at": 1.0,
         "last_seen": h.core.started_at - 180}))
    await _proving(h, "spoke")
    status, rows = await h.admin("GET", "/api/instances")
    assert status == 200
    heard = {r["label"]: r["heard_since_start"] for r in rows}
    assert heard == {"before": False, "spoke": True}
    url = str(h.client.make_url("")).rstrip("/")
    env = {"VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"}
    table = await asyncio.to_thread(CliRunner().invoke, cli, ["status"], env=env)
    (line,) = [x for x in table.output.splitlines() if x.rstrip().endswith("before")]
    assert "(before restart)" in line
    (line,) = [x for x in table.output.splitlines() if x.rstrip().endswith("spoke")]
    assert "(before restart)" not in line


def test_the_completed_rate_follows_the_last_hour_in_constant_memory(tmp_path: Path) -> None:
    from vast_manager.coordinator.operations.production import ProductionTracker

    from support.coord_support import make_settings

    tracker = ProductionTracker(make_settings(tmp_path, idle_after_s=900.0,
                                              monitor_interval_s=60.0))
    row = {"id": 1, "kind": "byo", "state": "proving", "rate_per_hour": 100.0,
           "dph_total": 0.5}
    total, now = 0, 0.0
    for _ in range(180):  # three hours, a reading a minute: 2 proofs a minute, then none
        now += 60
        total += 2 if now <= 7200 else 0
        tracker.observe([{**row, "proofs_completed_total": total}], now)
        if now == 7200:
            assert tracker.view(1)["completed_rate_per_hour"] == pytest.approx(120.0)
        if now == 7200 + 900:
            assert tracker.view(1)["idle"]  # 15 minutes without a proof
    made = tracker.view(1)
    assert made["idle"] and made["completed_rate_per_hour"] == 0.0
    assert "15 min" not in str(made["idle_reason"]) and "60 min" in str(made["idle_reason"])
    # An agent that restarts its counter starts its rate afresh, never negative; what it
    # delivered before stands (delivering far below its rate: still idle, and why).
    tracker.observe([{**row, "proofs_completed_total": 0}], now + 60)
    view = tracker.view(1)
    assert view["completed_rate_per_hour"] is None and view["idle"]
    assert "of the 100.0/h it was kept on" in str(view["idle_reason"])


def test_the_clusters_record_feeds_the_delivery_test_in_place_of_cuzks(tmp_path: Path) -> None:
    """Where the cluster's record covers an instance, its per-read increments are what
    the delivery test folds: a host whose counter says it proves at its rate while the
    cluster received nothing is found short, in the cluster's words."""
    from vast_manager.coordinator.decisions.cluster_verdict import CLUSTER, Delivered
    from vast_manager.coordinator.operations.production import ProductionTracker

    from support.coord_support import make_settings

    tracker = ProductionTracker(make_settings(tmp_path, idle_after_s=3600.0))
    row = {"id": 1, "kind": "byo", "state": "proving", "rate_per_hour": 431.0,
           "dph_total": 0.5}
    total, now = 0, 0.0
    for _ in range(30):
        now += 60
        total += 7  # cuzk's counter: 420/h, its claim
        tracker.observe([{**row, "proofs_completed_total": total}], now)
        tracker.fold_cluster({1: Delivered(0, 0, 60.0, CLUSTER)})
    view = tracker.view(1)
    assert view["idle"] and "the cluster's record" in str(view["idle_reason"])
    assert tracker.short_ids() == [1]
