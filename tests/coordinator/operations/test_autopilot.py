"""The autopilot on the real app: a fake clock, the local provider's catalog, agents played
through the signed wire. It never passes a cap, replaces what it terminates or loses,
explores only within its share, logs every action with its reason, and a stop survives
a restart. Every rate here comes from the simulated cuzk's hardware model: simulated.

The catalog is served by the in-memory provider (``fakes_provider``): the local provider
itself would start agent processes, whose clocks a fake clock cannot move.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.discovery.autopilot_rules import Rental, ledger_of
from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.local.catalog import catalog_offers
from vast_manager.coordinator.providers.local.provider import instance_profile
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app
from vast_manager.coordinator.web.json_views import event_view
from vast_manager.sim.hardware import Profile
from vast_manager.sim.physics import capacities

from support.coord_support import Agent, Harness, make_settings, result_msg, start
from support.fakes_provider import FakeClock, FakeProvider

STEP_S = 300.0
CAPS: dict[str, Any] = {
    "autopilot": True,
    "autopilot_target_rate_per_hour": 200.0,
    "autopilot_max_dph_total": 1.3,
    "autopilot_max_instances": 4,
    "autopilot_max_explore_share": 0.15,
    "autopilot_max_concurrent_trials": 2,
    "autopilot_explore_interval_s": 3600.0,
    "max_deploy_dph_total": 2.0,
    "lost_timeout_s": 900.0,
}


def true_rate(offer: dict[str, Any]) -> float:
    """The simulated cuzk's steady-state rate of the offer's instance (simulated)."""
    return capacities(Profile.from_offer(instance_profile(parse_offer(offer)))).rate_per_hour


class Fleet:
    """Plays every deployed instance's agent: hello, a benchmark at its simulated rate,
    then proving heartbeats, until it is told to terminate (or ``silent``)."""

    def __init__(self, h: Harness, provider: FakeProvider) -> None:
        self.h = h
        self.provider = provider
        self.agents: dict[int, Agent] = {}
        self.bench_started: dict[int, float] = {}
        self.silent: set[int] = set()

    def offer_of(self, inst: dict[str, Any]) -> dict[str, Any]:
        return self.provider.offers[int(inst["offer_id"])]

    async def step(self) -> None:
        h = self.h
        for inst in h.store.active_instances():
            iid = int(inst["id"])
            if inst["kind"] != "deployed" or iid in self.silent:
                continue
            if inst["state"] in ("terminating", "failed", "lost"):
                continue
            agent = self.agents.get(iid)
            if agent is None:
                agent = self.agents[iid] = h.agent(inst["agent_id"])
                assert (await agent.hello(gpus=int(inst["num_gpus"])))[0] == 200
            if iid not in self.bench_started:
                assert (await agent.heartbeat("benchmarking"))[0] == 200
                self.bench_started[iid] = h.clock()
                continue
            if inst["state"] == "benchmarking":
                rate = true_rate(self.offer_of(inst))
                wall = 12 * 3600.0 / rate
                if h.clock() - self.bench_started[iid] >= wall + 30:
                    status, data = await agent.post("/v1/result", result_msg(
                        f"bench-{iid}", proofs=12, wall_seconds=wall, finished_at=h.clock(),
                        gpus_used=list(range(int(inst["num_gpus"])))))
                    assert status == 200, data
                    if data["directive"]["action"] != "terminate":
                        await agent.heartbeat("proving")
                else:
                    await agent.heartbeat("benchmarking")
                continue
            await agent.heartbeat("proving")


def billing(h: Harness) -> list[dict[str, Any]]:
    return [i for i in h.store.active_instances() if i["kind"] == "deployed"]


def assert_within_caps(h: Harness) -> None:
    rows = billing(h)
    assert len(rows) <= CAPS["autopilot_max_instances"], rows
    assert sum(float(r["dph_total"]) for r in rows) <= CAPS["autopilot_max_dph_total"] + 1e-9


def pilot_events(h: Harness) -> list[dict[str, Any]]:
    return [event_view(e) for e in h.store.events_of_kind("autopilot", 1000)]


async def run(h: Harness, fleet: Fleet, steps: int) -> None:
    """Steps of STEP_S: the agents speak, the monitor and the autopilot decide; the caps
    are checked after every one of them."""
    for _ in range(steps):
        await fleet.step()
        await h.core.models.refresh()
        await h.core.monitor.tick()
        assert_within_caps(h)
        await h.core.autopilot.tick()
        assert_within_caps(h)
        h.clock.advance(STEP_S)


@pytest.fixture
async def pilot(aiohttp_client: Any, tmp_path: Path) -> tuple[Harness, Fleet]:
    provider = FakeProvider(catalog_offers())
    h = await start(aiohttp_client, tmp_path, provider=provider, **CAPS)
    return h, Fleet(h, provider)


async def test_it_fills_to_its_target_within_every_cap_and_says_why(
    pilot: tuple[Harness, Fleet],
) -> None:
    h, fleet = pilot
    await run(h, fleet, 60)
    events = pilot_events(h)
    assert events[0]["data"]["action"] == "started"
    deploys = [e for e in events if e["data"]["action"] == "deploy"]
    # Every instance the provider created is one the autopilot deployed, with its reason.
    created = {c["instance_id"] for c in fleet.provider.created}
    ours = {int(r["provider_instance_id"]) for r in h.store.list_instances()}
    assert created == ours and len(deploys) == len(created) >= 3
    for e in deploys:
        assert e["instance_id"] is not None and e["reason"]
        assert ("of the 200.0/h target" in e["reason"]) != e["data"]["exploration"]
        assert "break-even" in e["reason"] and "predicted" in e["reason"]
    # It reached its target: the proving fleet makes 200/h or more.
    proving = [r for r in billing(h) if r["state"] == "proving" and r["rate_per_hour"]]
    assert sum(float(r["rate_per_hour"]) for r in proving) >= 200.0
    # What it held back from is logged when it changes, not every interval.
    notes = [e["reason"] for e in events if e["data"]["action"] == "note"]
    assert notes and len(notes) < 20
    # Every instance it terminated has its event and its reason.
    ended = [r for r in h.store.list_instances()
             if (r["terminate_reason"] or "").startswith("autopilot:")]
    terminations = {e["instance_id"] for e in events if e["data"]["action"] == "terminate"}
    assert {r["id"] for r in ended} == terminations


async def test_explorations_stay_within_their_share_of_spend(
    pilot: tuple[Harness, Fleet],
) -> None:
    h, fleet = pilot
    await run(h, fleet, 150)
    explorations = [e for e in pilot_events(h)
                    if e["data"]["action"] == "deploy" and e["data"]["exploration"]]
    assert len(explorations) >= 2
    window = h.core.settings.autopilot_spend_window_h * 3600.0
    for e in explorations:
        assert e["data"]["trial_share"] <= CAPS["autopilot_max_explore_share"]
        # The ledger as the store has it just before: the trials' share of the spend.
        rows = h.store.spend_rows(e["ts"] - window)
        rentals = [Rental(float(r["dph_total"]), float(r["created_at"]),
                          r["ended_at"], r["verdict_at"]) for r in rows
                   if r["created_at"] < e["ts"]]
        ledger = ledger_of(rentals, now=e["ts"], since=e["ts"] - window,
                           last_exploration_at=None)
        assert ledger.trials_usd <= CAPS["autopilot_max_explore_share"] * ledger.total_usd
    starts = sorted(e["ts"] for e in explorations)
    assert all(b - a >= CAPS["autopilot_explore_interval_s"]
               for a, b in itertools.pairwise(starts))


async def test_it_replaces_a_host_it_loses(pilot: tuple[Harness, Fleet]) -> None:
    h, fleet = pilot
    await run(h, fleet, 40)
    proving = [r for r in billing(h) if r["state"] == "proving"]
    assert proving
    gone = max(proving, key=lambda r: float(r["rate_per_hour"]))
    before = len(fleet.provider.created)
    fleet.silent.add(int(gone["id"]))  # its machine went away: no more heartbeats
    await run(h, fleet, 20)
    assert h.store.get_instance(int(gone["id"]))["state"] in ("destroyed", "lost", "terminating")
    assert len(fleet.provider.created) > before, "the lost host was not replaced"


async def test_a_stop_holds_across_a_restart_until_started(
    pilot: tuple[Harness, Fleet], aiohttp_client: Any, tmp_path: Path,
) -> None:
    h, fleet = pilot
    await run(h, fleet, 3)
    status, answer = await h.admin("POST", "/api/autopilot/stop", {"reason": "budget review"})
    assert status == 200 and answer["changed"] is True, answer
    created = len(fleet.provider.created)
    assert await h.core.autopilot.tick() is None
    await run(h, fleet, 10)
    assert len(fleet.provider.created) == created
    _, view = await h.admin("GET", "/api/autopilot")
    assert view["state"] == "stopped" and "budget review" in view["switch"]["reason"]

    # A restart with --autopilot does not resume it silently.
    store = Store(tmp_path / "coord.db")
    app = create_app(make_settings(tmp_path, **CAPS), store, fleet.provider, h.clock,
                     run_monitor=False)
    app.on_cleanup.append(lambda _app: _close(store))
    client = await aiohttp_client(app)
    again = Harness(client, h.clock, fleet.provider)
    _, view = await again.admin("GET", "/api/autopilot")
    assert view["state"] == "stopped"
    assert view["events"][-1]["data"]["action"] == "held"
    assert "autopilot start" in view["events"][-1]["reason"]
    assert await again.core.autopilot.tick() is None
    status, answer = await again.admin("POST", "/api/autopilot/start")
    assert status == 200 and answer["state"] == "running"
    assert await again.core.autopilot.tick() is not None


async def _close(store: Store) -> None:
    store.close()


async def test_over_a_lowered_cap_it_terminates_down_to_it(
    aiohttp_client: Any, tmp_path: Path,
) -> None:
    provider = FakeProvider(catalog_offers())
    caps = {**CAPS, "autopilot_max_instances": 1}
    h = await start(aiohttp_client, tmp_path, provider=provider, clock=FakeClock(), **caps)
    await h.admin("POST", "/api/autopilot/stop", {"reason": "deploying by hand"})
    for offer_id in (9002, 9003, 9004):  # by hand, before the autopilot runs
        status, data = await h.admin("POST", "/api/deploy", {"offer_id": offer_id})
        assert status == 200, data
    await h.admin("POST", "/api/autopilot/start")
    tick = await h.core.autopilot.tick()
    assert tick is not None
    ending = [r for r in billing(h) if not r["terminate_reason"]]
    assert len(ending) == 1
    reasons = [a["reason"] for a in tick.actions if a["action"] == "terminate"]
    assert len(reasons) == 2 and all("over the cap of 1" in r for r in reasons)


async def test_without_autopilot_it_is_off_and_cannot_start(
    aiohttp_client: Any, tmp_path: Path,
) -> None:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(catalog_offers()))
    _, view = await h.admin("GET", "/api/autopilot")
    assert view["state"] == "off" and view["configured"] is False and view["caps"] is None
    before = h.store.count_rows()
    status, answer = await h.admin("POST", "/api/autopilot/start")
    assert status == 409 and answer["error"] == "autopilot_not_configured"
    assert h.store.count_rows() == before
    assert await h.core.autopilot.tick() is None


async def test_an_open_fault_pauses_it_until_cleared(pilot: tuple[Harness, Fleet]) -> None:
    """A failure that is not one host's (docs/policy.md, "Blame") pauses the autopilot as
    it pauses deploys; clearing the fault lets it decide again."""
    from vast_manager.coordinator.decisions import blame

    h, _fleet = pilot
    reason = "the agent reported failed: C1 file /data/zk/c1.json cannot be read"
    await h.store.write(lambda tx: tx.blocklist.strike("41001", reason, now=h.clock(),
                                                       instance_id=None, limit=3, window_s=3600.0,
                                                       block_s=3600.0, kind=blame.AGENT_FAILED,
                                                       state="booting"))
    tick = await h.core.autopilot._tick()
    assert tick.notes[0].startswith("paused: fault 1") and "c1.json" in tick.notes[0]
    assert not tick.actions and h.provider.created == []
    await h.store.write(lambda tx: tx.blocklist.clear_fault(1, "fixed", h.clock()))
    tick = await h.core.autopilot._tick()
    assert tick.actions and h.provider.created
