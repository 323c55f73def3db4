"""With a proof's price set, every view shows revenue, the full bill and profit per
instance and for the fleet, and the minimum rate a deploy sets is the break-even rate of
the full bill; without one, nothing changes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.decisions import earnings
from vast_manager.coordinator.settings import DEFAULTS

from support.coord_support import ADMIN, ADMIN_TOKEN, Harness, start
from support.fakes_provider import FakeProvider, offer

PRICE_FIL, FIL_USD = 0.005, 4.0  # $0.02 a proof


async def _setup(aiohttp_client: Any, tmp_path: Path, **settings: Any) -> tuple[Harness, int,
                                                                                 int]:
    provider = FakeProvider([offer(9001, 4242, dph_total=0.4, num_gpus=1)])
    h = await start(aiohttp_client, tmp_path, provider=provider, **settings)
    status, data = await h.admin("POST", "/api/deploy", {"offer_id": 9001})
    assert status == 200, data
    agent = await h.issue("rig")
    assert (await agent.hello())[0] == 200
    await agent.heartbeat("proving")
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    await h.store.write(lambda tx: tx.instances.update(int(inst["id"]), rate_per_hour=100.0,
                                                      dph_total=0.5))
    await h.core.monitor.tick()
    return h, int(data["instance_id"]), int(inst["id"])


async def test_with_a_price_every_view_shows_revenue_cost_and_profit(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h, deployed, proving = await _setup(aiohttp_client, tmp_path,
                                        proof_price_fil=PRICE_FIL, fil_usd=FIL_USD)
    _, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    rig = by_id[proving]
    full = rig["cost"]["per_hour"]["total"]
    # Earned at its benchmark rate while nothing delivered or counted is known.
    assert rig["revenue_basis"] == "benchmark"
    assert rig["revenue_per_hour"] == pytest.approx(100.0 * 0.02)
    assert rig["cost_per_hour"] == pytest.approx(full)
    assert rig["profit_per_hour"] == pytest.approx(2.0 - full)

    # The minimum rate of the deploy is the break-even rate of its full bill.
    new = by_id[deployed]
    assert new["min_rate_per_hour"] == pytest.approx(new["cost"]["per_hour"]["total"] / 0.02)
    _status, fleet = await h.admin("GET", "/api/fleet")
    assert fleet["max_usd_per_proof"] == pytest.approx(0.02)
    assert fleet["revenue_per_hour"] == pytest.approx(2.0)
    assert fleet["cost_per_hour"] == pytest.approx(full + new["cost"]["per_hour"]["total"])
    assert fleet["profit_per_hour"] == pytest.approx(2.0 - fleet["cost_per_hour"])

    resp = await h.client.get("/metrics", headers=ADMIN)
    fams = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    revenue = {s.labels["instance_id"]: s.value
               for s in fams["vm_instance_revenue_dollars_per_hour"].samples}
    assert revenue[str(proving)] == pytest.approx(2.0)
    profit = {s.labels["instance_id"]: s.value
              for s in fams["vm_instance_profit_dollars_per_hour"].samples}
    assert profit[str(proving)] == pytest.approx(2.0 - full)
    assert fams["vm_fleet_profit_dollars_per_hour"].samples[0].value == pytest.approx(
        fleet["profit_per_hour"])
    assert fams["vm_fleet_cost_dollars_per_hour"].samples[0].value == pytest.approx(
        fleet["cost_per_hour"])

    url = str(h.client.make_url("")).rstrip("/")
    env = {"VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "250"}
    runner = CliRunner()
    table = await asyncio.to_thread(runner.invoke, cli, ["status"], env=env)
    assert table.exit_code == 0, table.output
    assert f"Fleet earns $2.00/h, costs ${fleet['cost_per_hour']:.2f}/h" in table.output
    assert "PROFIT/H" in table.output
    line = next(x for x in table.output.splitlines() if x.startswith(f"{proving} "))
    assert f"${2.0 - full:.3f}" in line
    shown = await asyncio.to_thread(runner.invoke, cli, ["instance", str(proving)], env=env)
    assert f"earns $2.000/h (at its benchmark rate), costs ${full:.3f}/h" in shown.output

    # The dashboard draws the same fields (its tiles and columns read them).
    page = await (await h.client.get("/static/app.js")).text()
    for field in ("revenue_per_hour", "profit_per_hour", "cost_per_hour"):
        assert f"summary.{field}" in page
    assert "r.profit_per_hour" in page and "inst.revenue_per_hour" in page


async def test_without_a_price_nothing_changes(aiohttp_client: Any, tmp_path: Path) -> None:
    h, deployed, proving = await _setup(aiohttp_client, tmp_path)
    _, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    assert by_id[proving]["revenue_per_hour"] is None
    assert by_id[proving]["profit_per_hour"] is None
    new = by_id[deployed]
    assert new["min_rate_per_hour"] == pytest.approx(
        new["cost"]["per_hour"]["total"] / DEFAULTS.max_usd_per_proof)
    _status, fleet = await h.admin("GET", "/api/fleet")
    assert fleet["revenue_per_hour"] is None
    assert fleet["max_usd_per_proof"] == DEFAULTS.max_usd_per_proof


def test_the_price_in_dollars_or_fil() -> None:
    usd = DEFAULTS.with_values(proof_price_usd=0.03)
    fil = DEFAULTS.with_values(proof_price_fil=0.01, fil_usd=2.5)
    assert earnings.proof_price_usd(usd) == 0.03
    assert earnings.proof_price_usd(fil) == pytest.approx(0.025)
    assert earnings.proof_price_usd(DEFAULTS) is None
    assert earnings.break_even_usd_per_proof(DEFAULTS) == DEFAULTS.max_usd_per_proof
    made = earnings.earnings(0.02, 50.0, "delivered", 1.5)
    assert (made.revenue_per_hour, made.profit_per_hour) == (pytest.approx(1.0),
                                                            pytest.approx(-0.5))
    assert earnings.earned_rate(10.0, 60.0, 100.0) == (10.0, "delivered")
    assert earnings.earned_rate(None, 60.0, 100.0) == (60.0, "completed")
    assert earnings.earned_rate(None, None, None) == (None, None)
