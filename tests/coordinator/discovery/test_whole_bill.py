"""The whole bill: rent, storage and bandwidth in every figure; statuses judged with the
agent; the account's funds and key; strikes per machine. On the fake vast.ai of
``fakevast.py`` (billing in dollars by part, docs/vast.md), with an injected clock."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.decisions import cost
from vast_manager.coordinator.discovery.autopilot_rules import ledger_of, rental_of
from vast_manager.coordinator.discovery.plan import PlanSettings, TrialCost, trial_cost
from vast_manager.coordinator.offers import parse_offer

from support.bill_support import HEARTBEAT_S, MONITOR_INTERVAL_S, BillEnv, bill_env

GB = 1e9


# --- the cost model, pure --------------------------------------------------------------


def test_prices_split_rent_from_the_storage_in_dph_total_and_price_another_disk() -> None:
    offer = {"dph_total": 0.40, "storage_cost": 0.18, "allocated_storage": 250.0,
             "inet_down_cost": 0.02, "inet_up_cost": 0.01}
    at_250 = cost.prices_of(parse_offer(offer))
    assert at_250 is not None
    assert at_250.storage_per_hour == pytest.approx(0.18 * 250 / 720)
    assert at_250.hourly_total == pytest.approx(0.40)  # dph_total at the disk it was priced at
    at_1000 = cost.prices_of(parse_offer(offer), 1000)
    assert at_1000 is not None
    assert at_1000.rent_per_hour == pytest.approx(at_250.rent_per_hour)
    assert at_1000.hourly_total == pytest.approx(0.40 + 0.18 * 750 / 720)
    # vast.ai's storage_total_cost, when given, is the storage inside dph_total.
    given = cost.prices_of(parse_offer({**offer, "storage_total_cost": 0.05}))
    assert given is not None and given.rent_per_hour == pytest.approx(0.35)
    # Bandwidth: per GB each way, in every status; storage in all but offline; rent running.
    assert at_250.bandwidth_usd(45 * GB, 2 * GB) == pytest.approx(0.92)
    assert at_250.per_hour(status="offline") == cost.Cost()
    assert at_250.per_hour(status="stopped").rent == 0.0
    assert at_250.per_hour(status="stopped").storage == pytest.approx(at_250.storage_per_hour)
    assert cost.prices_of(parse_offer({"dph_total": None})) is None


def test_the_setup_download_is_spread_over_a_kept_life_and_per_proof() -> None:
    prices = cost.prices_of(parse_offer({"dph_total": 0.40, "inet_down_cost": 0.02}))
    assert prices is not None
    kept = cost.kept_per_hour(prices, setup_down_bytes=50 * GB, kept_hours=100)
    assert kept.bandwidth == pytest.approx(1.0 / 100)
    proof = cost.per_proof(kept, 40.0)
    assert proof is not None and proof.total == pytest.approx(kept.total / 40)
    assert cost.per_proof(kept, None) is None and cost.per_proof(kept, 0) is None


# --- 1. a trial bills as the fake bills it -----------------------------------------------


def _metric(text: str, name: str, part: str) -> float:
    m = re.search(rf'^{name}{{part="{part}"}} (\S+)$', text, re.M)
    assert m is not None, f"{name} {part} missing"
    return float(m.group(1))


async def _until_running(env: BillEnv, vid: int) -> None:
    for _ in range(200):
        env.fake.accrue()
        if env.fake.instances[vid]["actual_status"] == "running":
            return
        env.clock.advance(5)
    raise AssertionError("never running")


async def test_a_trial_bills_as_the_fake_bills_it_by_part(tmp_path: Path) -> None:
    async with bill_env(tmp_path) as env:
        env.fake.add_offer(9401, 77001, dph_total=0.40, inet_down_cost=0.02,
                           inet_up_cost=0.01, storage_cost=0.20, inet_down=900.0)
        settings = env.h.core.settings
        offer = next(o for o in await env.provider.search_offers() if o.id == 9401)
        plan_settings = PlanSettings(trial_cost=TrialCost(download_gb=settings.setup_download_gb))
        rate = 30.0
        hours = plan_settings.trial_cost.hours(offer, rate)
        estimate = trial_cost(offer, hours, plan_settings)
        assert estimate.bandwidth == pytest.approx(settings.setup_download_gb * 0.02)

        started = env.clock.now
        data = await env.deploy(9401)
        vid = int(data["provider_instance_id"])
        assert env.fake.instances[vid]["actual_status"] is None  # scheduled, then loading
        await _until_running(env, vid)
        agent = env.h.agent(data["agent_id"])
        assert (await agent.hello())[0] == 200
        # The agent downloads the parameters over its fetch time, then warms and benchmarks
        # until the plan's hours are up; the fake bills every byte it moved.
        total_rx = int(settings.setup_download_gb * GB)
        fetch_s = total_rx * 8 / (900.0 * 1e6)
        rx = tx = 0
        last_tick = env.clock.now
        while env.clock.now - started < hours * 3600:
            env.clock.advance(HEARTBEAT_S)
            since = env.clock.now - started
            want_rx = min(total_rx, int(total_rx * since / fetch_s))
            want_tx = int(since * 50_000)  # heartbeats, logs, results
            env.fake.add_traffic(vid, want_rx - rx, want_tx - tx)
            rx, tx = want_rx, want_tx
            phase = "fetching_params" if rx < total_rx else "benchmarking"
            assert (await env.heartbeat(agent, phase, rx=rx, tx=tx))[0] == 200
            if env.clock.now - last_tick >= MONITOR_INTERVAL_S:
                await env.tick()
                last_tick = env.clock.now
        status, _ = await env.h.admin("POST", f"/api/instances/{data['instance_id']}/destroy")
        assert status == 200 and vid not in env.fake.instances

        billed = env.fake.billed_dollars(vid)
        assert billed["bandwidth"] > billed["rent"] > 0 and billed["storage"] > 0
        rows = env.h.store.spend_rows(0.0)
        ledger = ledger_of([rental_of(r) for r in rows], now=env.clock.now, since=0.0,
                           last_exploration_at=None)
        resp = await env.h.client.get("/metrics", headers={"Authorization": "Bearer " +
                                                           settings.admin_token})
        text = await resp.text()
        for part, mine in (("rent", ledger.rent_usd), ("storage", ledger.storage_usd),
                           ("bandwidth", ledger.bandwidth_usd)):
            assert mine == pytest.approx(billed[part], rel=0.05), part
            assert _metric(text, "vm_spend_dollars", part) == pytest.approx(billed[part],
                                                                             rel=0.05), part
        # The plan's estimate before the trial, within 25% of what the fake billed.
        assert estimate.total == pytest.approx(sum(billed.values()), rel=0.25)


# --- 2. offers, status and the instance page show the parts -------------------------------


async def test_offers_show_the_parts_and_rank_by_the_full_figure(tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        env.fake.add_offer(9501, 78001, dph_total=0.40, inet_down_cost=0.002)
        env.fake.add_offer(9502, 78002, dph_total=0.40, inet_down_cost=0.019)
        status, rows = await env.h.admin("GET", "/api/offers")
        assert status == 200, rows
        assert [r["id"] for r in rows] == [9501, 9502]
        for r in rows:
            assert set(r["usd_per_hour"]) == {"rent", "storage", "bandwidth", "total"}
            assert r["usd_per_hour"]["storage"] > 0 and r["usd_per_hour"]["bandwidth"] > 0
        # Only inet_down_cost differs: swap it, and the ranking swaps.
        env.fake.offers[9501]["inet_down_cost"] = 0.019
        env.fake.offers[9502]["inet_down_cost"] = 0.002
        # vast.ai's searches are budgeted: the cache answers again until its answer ages.
        _, rows = await env.h.admin("GET", "/api/offers")
        assert [r["id"] for r in rows] == [9501, 9502] and rows[0]["offers_age_s"] == 0
        env.clock.advance(env.h.core.offers.fresh_for_s)
        _, rows = await env.h.admin("GET", "/api/offers")
        assert [r["id"] for r in rows] == [9502, 9501]
        # The default filter caps inet_down_cost (docs/operations.md).
        env.fake.add_offer(9503, 78003, dph_total=0.10, inet_down_cost=0.05)
        env.clock.advance(env.h.core.offers.fresh_for_s)
        _, rows = await env.h.admin("GET", "/api/offers")
        assert 9503 not in [r["id"] for r in rows]

        data = await env.deploy(9502, disk_gb=400)
        agent = env.h.agent(data["agent_id"])
        await agent.hello()
        await env.heartbeat(agent, "proving", rx=int(40 * GB), tx=int(1 * GB))
        await env.h.store.write(lambda tx: tx.instances.update(data["instance_id"],
                                                               rate_per_hour=40.0))
        env.clock.advance(3600)
        _, listed = await env.h.admin("GET", "/api/instances")
        _, page = await env.h.admin("GET", f"/api/instances/{data['instance_id']}")
        for view in (listed[0], page):
            bill = view["cost"]
            for key in ("per_hour", "per_proof", "billed"):
                assert set(bill[key]) == {"rent", "storage", "bandwidth", "total"}, key
            assert bill["per_proof"]["total"] == pytest.approx(bill["per_hour"]["total"] / 40,
                                                               rel=1e-4)
            assert view["usd_per_proof"] == bill["per_proof"]["total"]
            # The deploy's own disk is priced: 400 GB, not the search's 250.
            assert bill["disk_gb"] == 400
            assert bill["per_hour"]["storage"] == pytest.approx(0.15 * 400 / 720, rel=1e-3)
            assert bill["billed"]["bandwidth"] == pytest.approx((40 * 0.002 + 1 * 0.005),
                                                                rel=1e-3)
        assert page["dph_total"] == pytest.approx(0.40 + 0.15 * 150 / 720, rel=1e-4)


# --- 3. statuses judged with the agent ------------------------------------------------------


async def _proving(env: BillEnv, offer_id: int, machine: int) -> tuple[dict[str, Any], Any, int]:
    env.fake.add_offer(offer_id, machine, dph_total=0.40)
    data = await env.deploy(offer_id)
    agent = env.h.agent(data["agent_id"])
    assert (await agent.hello())[0] == 200
    assert (await env.heartbeat(agent, "proving"))[0] == 200
    return data, agent, int(data["provider_instance_id"])


async def test_offline_with_a_heartbeating_agent_is_kept_and_silent_one_destroyed(
        tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        live, live_agent, live_vid = await _proving(env, 9601, 79001)
        quiet, _quiet_agent, quiet_vid = await _proving(env, 9602, 79002)
        env.fake.set_status(live_vid, "offline")
        env.fake.set_status(quiet_vid, "offline")
        for _ in range(10):
            for _ in range(int(MONITOR_INTERVAL_S / HEARTBEAT_S)):
                env.clock.advance(HEARTBEAT_S)
                assert (await env.heartbeat(live_agent, "proving"))[0] == 200
            await env.tick()
        assert live_vid in env.fake.instances
        assert env.h.store.get_instance(live["instance_id"])["state"] == "proving"
        kept = [e for e in env.h.store.events(live["instance_id"]) if e["kind"] == "kept"]
        assert len(kept) == 1 and "offline while its agent heartbeats" in kept[0]["reason"]
        # The silent one: its silence timer ran out, then the dead status was acted on.
        assert quiet_vid not in env.fake.instances
        assert env.h.store.get_instance(quiet["instance_id"])["state"] == "destroyed"
        # And the host comes back: nothing changed for the live one.
        env.fake.set_status(live_vid, "running")
        await env.tick()
        assert live_vid in env.fake.instances


# --- 4. the balance to zero and back -----------------------------------------------------


async def test_zero_funds_destroy_nothing_pause_deploys_and_resume(tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False, credit=2.5, autopilot=True,
                        autopilot_target_rate_per_hour=100.0, autopilot_max_dph_total=5.0,
                        autopilot_max_instances=4) as env:
        data, agent, vid = await _proving(env, 9701, 80001)
        await env.tick()
        assert env.h.core.monitor.account.funds == pytest.approx(2.5, abs=0.01)
        # Seven hours at $0.45/h: the credit runs out, vast.ai stops the instance.
        for _ in range(int(7 * 3600 / MONITOR_INTERVAL_S)):
            env.clock.advance(MONITOR_INTERVAL_S)
            if env.fake.credit > 0:
                await env.heartbeat(agent, "proving")
            await env.tick()
        assert env.fake.instances[vid]["actual_status"] == "stopped"
        assert vid in env.fake.instances  # never destroyed for it
        assert env.h.store.get_instance(data["instance_id"])["state"] not in (
            "destroyed", "terminating")
        env.fake.add_offer(9702, 80002, dph_total=0.30)
        status, refused = await env.h.admin("POST", "/api/deploy", {"offer_id": 9702})
        assert status == 409 and refused["error"] == "account_paused"
        assert "VM_BALANCE_PAUSE_USD" in refused["message"]
        _, fleet = await env.h.admin("GET", "/api/fleet")
        assert fleet["account"]["paused"] and fleet["account"]["funds_usd"] <= 0
        # vast.ai's view beside ours: its id and status, and the fleet's $/h is what
        # vast.ai bills now (storage only while stopped), in the API, /metrics and status.
        _, row = await env.h.admin("GET", f"/api/instances/{data['instance_id']}")
        assert (row["provider_instance_id"], row["provider_status"]) == (vid, "stopped")
        stopped_dph = row["billing_now_per_hour"]
        assert 0 <= stopped_dph < 0.1 < row["dph_total"]
        assert fleet["dollars_per_hour"] == pytest.approx(stopped_dph)
        text = await (await env.h.client.get(
            "/metrics", headers={"Authorization": "Bearer " + env.h.core.settings.admin_token}
        )).text()
        shown = re.search(r"^vm_fleet_dollars_per_hour (\S+)$", text, re.M)
        assert shown and float(shown.group(1)) == pytest.approx(stopped_dph)
        assert f'provider_instance_id="{vid}",provider_status="stopped"' in text
        url = str(env.h.client.make_url("")).rstrip("/")
        cli_env = {"VM_URL": url, "VM_ADMIN_TOKEN": env.h.core.settings.admin_token,
                   "COLUMNS": "200"}
        table = await asyncio.to_thread(CliRunner().invoke, cli, ["status"], env=cli_env)
        assert f"{vid} stopped" in table.output, table.output
        shown_one = await asyncio.to_thread(CliRunner().invoke, cli,
                                            ["instance", str(data["instance_id"])], env=cli_env)
        assert f"vast.ai instance {vid}: stopped" in shown_one.output, shown_one.output
        # Spend so far: the instance's bill is the fleet's all-time spend, shown by status
        # and cost-report.
        billed = row["cost"]["billed"]["total"]
        assert billed > 2.0  # seven hours at $0.45/h, less what the stop saved
        assert fleet["spend"]["all_time"]["total"] == pytest.approx(billed, rel=0.01)
        assert fleet["spend"]["week"]["total"] == pytest.approx(billed, rel=0.01)
        assert "Spent:" in table.output and "all time $" in table.output
        report = await asyncio.to_thread(CliRunner().invoke, cli, ["cost-report"], env=cli_env)
        assert report.exit_code == 0, report.output
        assert f"${billed:.2f}" in report.output and "last 7 days" in report.output
        tick = await env.h.core.autopilot._tick()
        assert tick.notes and tick.notes[0].startswith("paused:") and not tick.actions
        # Credit back: started again, deploys allowed.
        env.fake.add_credit(50.0)
        await env.tick()
        assert env.fake.instances[vid]["actual_status"] == "running"
        await env.tick()
        _, fleet = await env.h.admin("GET", "/api/fleet")
        assert fleet["dollars_per_hour"] > 0.1  # billing rent again
        assert any(e["kind"] == "resumed" for e in env.h.store.events(data["instance_id"]))
        assert env.h.core.monitor.account.pause_reason() is None
        assert (await env.h.admin("POST", "/api/deploy", {"offer_id": 9702}))[0] == 200


# --- 5. a revoked key ----------------------------------------------------------------------


async def test_a_revoked_key_alerts_within_a_round_and_destroys_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        data, agent, vid = await _proving(env, 9801, 81001)
        await env.tick()
        env.fake.revoke_account_key()
        env.fake.set_status(vid, "exited")  # even a dead status: the list cannot be read
        with caplog.at_level(logging.ERROR):
            await env.tick()
        assert any(r.levelno == logging.ERROR and "refused the API key" in r.getMessage()
                   for r in caplog.records)
        text = await (await env.h.client.get(
            "/metrics", headers={"Authorization": "Bearer " + env.h.core.settings.admin_token}
        )).text()
        assert re.search(r"^vm_vast_auth_ok 0\.0$", text, re.M)
        assert re.search(r"^vm_deploys_paused 1\.0$", text, re.M)
        env.fake.add_offer(9802, 81002, dph_total=0.30)
        status, refused = await env.h.admin("POST", "/api/deploy", {"offer_id": 9802})
        assert status == 409 and refused["error"] == "account_paused"
        assert "refuses the API key" in refused["message"]
        for _ in range(5):
            for _ in range(int(MONITOR_INTERVAL_S / HEARTBEAT_S)):
                env.clock.advance(HEARTBEAT_S)
                assert (await env.heartbeat(agent, "proving"))[0] == 200
            await env.tick()
        assert vid in env.fake.instances
        assert env.h.store.get_instance(data["instance_id"])["state"] == "proving"
        # The read is retried with a backoff, not every round.
        users = [r for r in env.fake.requests if r.path == "/api/v0/users/current"]
        assert 2 <= len(users) <= 5


# --- 6. strikes ---------------------------------------------------------------------------


async def test_three_failed_trials_block_the_machine_with_their_reasons(
        tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        env.fake.add_offer(9901, 82001, dph_total=0.40)
        # 1: never says hello.
        first = await env.deploy(9901)
        env.clock.advance(env.h.core.settings.no_hello_timeout_s + 1)
        await env.tick()
        await env.tick()
        assert int(first["provider_instance_id"]) not in env.fake.instances
        # 2: its cuzk crashes warming up, on the hardware (phase failed).
        second = await env.deploy(9901)
        agent = env.h.agent(second["agent_id"])
        await agent.hello()
        assert (await env.heartbeat(agent, "warming"))[0] == 200
        agent.seq += 1
        from support.coord_support import heartbeat_msg
        msg = heartbeat_msg(agent.seq, "failed")
        msg["failure"] = "cuzk exited with status 139"
        await agent.post("/v1/heartbeat", msg)
        env.clock.advance(env.h.core.settings.terminate_grace_s + 1)
        await env.tick()
        assert int(second["provider_instance_id"]) not in env.fake.instances
        # 3: its container exits.
        third = await env.deploy(9901)
        env.fake.set_status(int(third["provider_instance_id"]), "exited")
        await env.tick()
        await env.tick()
        assert int(third["provider_instance_id"]) not in env.fake.instances

        block = env.h.store.bad_host("82001", env.clock.now)
        assert block is not None and block["source"] == "strikes"
        for words in ("no hello", "cuzk exited with status 139", "exited"):
            assert words in block["reason"], words
        assert block["expires_at"] == pytest.approx(
            env.clock.now + env.h.core.settings.strike_block_s, abs=5)
        status, refused = await env.h.admin("POST", "/api/deploy", {"offer_id": 9901})
        assert status == 409 and refused["error"] == "bad_host"
        status, plan = await env.h.admin("GET", "/api/plan")
        assert status == 200
        assert all(p["machine_id"] != "82001" for p in plan["proposals"])
        # The block expires.
        assert env.h.store.bad_host("82001", env.clock.now + 8 * 86400) is None


def test_status_says_why_deploys_wait(capsys: pytest.CaptureFixture[str]) -> None:
    from vast_manager.coordinator.cli import commands

    class Client:
        def __init__(self, account: dict[str, Any]) -> None:
            self.account = account

        def get(self, path: str) -> dict[str, Any]:
            assert path == "/api/fleet"
            return {"account": self.account}

    base = {"balance_usd": 0.0, "credit_usd": -0.4, "funds_usd": -0.4, "checked_at": 1.0,
            "auth_ok": True, "auth_error": None, "warning": "vast.ai funds $-0.40 are below "
            "VM_BALANCE_WARN_USD $20.00", "paused": "vast.ai funds $-0.40 are below "
            "VM_BALANCE_PAUSE_USD $2.00; add credit"}
    commands._account_line(Client(base))  # type: ignore[arg-type]
    line = capsys.readouterr().out
    assert "vast.ai funds $-0.40" in line and "deploys and the autopilot paused" in line
    commands._account_line(Client({**base, "auth_ok": False, "auth_error": "HTTP 401",  # type: ignore[arg-type]
                                   "paused": "vast.ai refuses the API key (HTTP 401)"}))
    assert "API key refused: HTTP 401" in capsys.readouterr().out
    # Nothing to say with a provider that has no account.
    commands._account_line(Client({"funds_usd": None, "auth_ok": True}))  # type: ignore[arg-type]
    assert capsys.readouterr().out == ""


# --- interruptible trials (opt-in) ---------------------------------------------------------


async def test_an_outbid_trial_waits_while_cheaper_than_a_fresh_one(tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False, interruptible_trials=True) as env:
        env.fake.add_offer(9951, 83001, dph_total=0.40, min_bid=0.10, inet_down_cost=0.01)
        data = await env.h.core.deployer.deploy(9951, interruptible=True)
        vid = data.provider_instance_id
        row = env.h.store.get_instance(data.instance_id)
        assert row["bid_per_hour"] == pytest.approx(0.6 * (0.40 - 0.15 * 250 / 720), rel=1e-3)
        assert env.fake.instances[vid]["is_bid"] is True
        agent = env.h.agent(data.agent_id)
        await agent.hello()
        await env.heartbeat(agent, "benchmarking")
        # Outbid for 40 minutes: the agent is silent, vast.ai bills storage only.
        env.fake.outbid(vid, for_s=2400)
        for _ in range(int(2400 / MONITOR_INTERVAL_S) + 3):
            env.clock.advance(MONITOR_INTERVAL_S)
            env.fake.accrue()
            if env.fake.instances[vid]["actual_status"] == "running":
                assert (await env.heartbeat(agent, "benchmarking"))[0] == 200
            await env.tick()
        assert vid in env.fake.instances  # kept: waiting cost less than a fresh setup
        kept = [e for e in env.h.store.events(data.instance_id) if e["kind"] == "kept"]
        assert kept and kept[0]["reason"].startswith("outbid")
        assert env.fake.instances[vid]["actual_status"] == "running"
        assert env.h.store.get_instance(data.instance_id)["state"] == "benchmarking"
        assert any(e["kind"] == "resumed" for e in env.h.store.events(data.instance_id))
        billed = env.fake.billed_dollars(vid)
        assert billed["rent"] < 0.30 * 0.6  # rent at the bid, none while outbid
        # Outbid for good: destroyed once waiting would cost more than a fresh trial,
        # and no strike against the machine (being outbid is not its fault).
        env.fake.outbid(vid)
        for _ in range(int(30 * 3600 / MONITOR_INTERVAL_S)):
            env.clock.advance(MONITOR_INTERVAL_S)
            await env.tick()
            if vid not in env.fake.instances:
                break
        assert vid not in env.fake.instances
        assert env.h.store.strikes("83001") == []
        budget = kept[0]["reason"].split("kept up to ")[1].split(" h")[0]
        assert float(budget) > 1.0


async def test_the_fake_answers_429_inside_an_endpoints_minimum_interval(
        tmp_path: Path) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        env.fake.min_interval_s["GET /api/v0/users/current"] = 2.0
        client = env.provider.client
        await client.current_user()
        status = 0
        async with env.h.client.session.get(
                env.fake.url + "/api/v0/users/current",
                headers={"Authorization": f"Bearer {env.fake.api_key}"}) as resp:
            status = resp.status
        assert status == 429  # within two seconds of the last call to that endpoint
        env.clock.advance(2.5)
        assert (await client.current_user())["credit"] > 0
        # Another endpoint has its own interval.
        assert await client.list_instances() == []


async def test_the_fake_loads_for_the_image_pull_and_a_stalled_host_never_runs(
        tmp_path: Path) -> None:
    async with bill_env(tmp_path) as env:
        env.fake.image_gb = 9.0
        env.fake.add_offer(9961, 84001, inet_down=100.0)  # 9 GB at 100 Mb/s: 720 s
        env.fake.add_offer(9962, 84002)
        env.fake.never_loads.add(84002)
        a = int((await env.deploy(9961))["provider_instance_id"])
        b = int((await env.deploy(9962))["provider_instance_id"])
        seen = []
        for _ in range(20):
            env.clock.advance(60)
            env.fake.accrue()
            seen.append(env.fake.instances[a]["actual_status"])
        assert seen[0] == "loading" and seen[11] == "loading" and seen[-1] == "running"
        assert env.fake.instances[b]["actual_status"] == "loading"
        # No rent while loading, storage from the create.
        assert env.fake.billed_dollars(b)["rent"] == 0 < env.fake.billed_dollars(b)["storage"]
        env.fake.host_trouble(a, "rebooting", 120)
        env.clock.advance(60)
        env.fake.accrue()
        assert env.fake.instances[a]["actual_status"] == "rebooting"
        env.clock.advance(120)
        env.fake.accrue()
        assert env.fake.instances[a]["actual_status"] == "running"
