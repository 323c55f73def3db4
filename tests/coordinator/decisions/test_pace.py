"""The heartbeat pace (docs/operations.md, "Heartbeat pace"): the coordinator stretches each
agent's ``next_heartbeat_s`` so the fleet stays under ``max_heartbeats_per_second``,
warming and benchmarking agents first, and times each agent's silence on its own pace."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.agent import config as agent_config
from vast_manager.agent.lifecycle import HEARTBEATS_PER_ORPHAN_TIMEOUT, heartbeat_interval_s
from vast_manager.common.retry import COORDINATOR_BACKOFF
from vast_manager.coordinator import settings as coord_settings
from vast_manager.coordinator.decisions import pace, policy
from vast_manager.coordinator.decisions.pace import FleetLoad, HeartbeatTracker, PaceLimits
from vast_manager.coordinator.operations.monitor import Monitor
from vast_manager.coordinator.store.writer import Store
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import Result

from support.coord_support import (
    ADMIN,
    Agent,
    Harness,
    database_before_migration,
    make_settings,
    response_signature,
    result_msg,
    start,
)
from support.fakes_provider import FakeProvider

LIMITS = PaceLimits(next_heartbeat_s=15, max_next_heartbeat_s=300,
                    max_heartbeats_per_second=1000.0)


def steady(agents: int, limits: PaceLimits = LIMITS) -> int:
    return pace.next_heartbeat_s("proving", FleetLoad(steady=agents), limits)


# --- the pure function at its edges ---------------------------------------------------------


def test_the_base_pace_holds_until_the_fleet_would_exceed_the_budget() -> None:
    assert steady(0) == 15
    assert steady(1) == 15
    assert steady(15_000) == 15  # exactly 1,000 a second at 15 s
    assert steady(15_001) == 16  # one more agent: the least whole pace that fits
    assert steady(100_000) == 100
    assert steady(150_001) == 151


def test_the_pace_stops_at_the_longest_and_the_budget_is_then_exceeded() -> None:
    assert steady(300_000) == 300
    assert steady(300_001) == 300
    assert steady(10_000_000) == 300
    over = FleetLoad(steady=600_000)
    assert pace.heartbeats_per_second(over, LIMITS) == pytest.approx(2000.0)


def test_the_fleet_stays_under_the_budget_up_to_the_longest_pace() -> None:
    for quick in (0, 1, 50, 2_000):
        for agents in (10, 14_999, 15_000, 15_001, 40_000, 123_457, 250_000, 299_000):
            fleet = FleetLoad(quick=quick, steady=agents)
            paces = pace.paces(fleet, LIMITS)
            assert 15 <= paces.quick_s <= paces.steady_s <= 300
            if paces.steady_s < 300:
                assert pace.heartbeats_per_second(fleet, LIMITS) <= 1000.0 + 1e-9, fleet
            # ...and no pace is longer than it needs to be: a second less would exceed it.
            if paces.steady_s > 15:
                faster = quick / paces.quick_s + agents / (paces.steady_s - 1)
                assert faster > 1000.0, fleet


def test_warming_and_benchmarking_agents_draw_on_the_budget_first() -> None:
    fleet = FleetLoad(quick=100, steady=30_000)
    for phase in ("warming", "benchmarking"):
        assert pace.next_heartbeat_s(phase, fleet, LIMITS) == 15
    # The others share what the quick ones leave: 1,000 - 100 / 15 a second.
    for phase in ("booting", "fetching_params", "proving", "terminating", None):
        assert pace.next_heartbeat_s(phase, fleet, LIMITS) == 31
    # Quick agents alone over the budget stretch too, and leave nothing: the others wait
    # at the longest pace.
    crowd = FleetLoad(quick=20_000, steady=10)
    assert pace.next_heartbeat_s("benchmarking", crowd, LIMITS) == 20
    assert pace.next_heartbeat_s("proving", crowd, LIMITS) == 300


def test_a_small_budget_and_a_longest_pace_below_the_base() -> None:
    small = PaceLimits(next_heartbeat_s=15, max_next_heartbeat_s=300,
                       max_heartbeats_per_second=0.5)
    assert steady(7, small) == 15
    assert steady(10, small) == 20
    # The longest pace is never below the base: the base wins.
    inverted = PaceLimits(next_heartbeat_s=60, max_next_heartbeat_s=30,
                          max_heartbeats_per_second=1.0)
    assert steady(0, inverted) == 60
    assert steady(1_000, inverted) == 60


def test_the_limits_come_from_the_settings(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, next_heartbeat_s=5, max_next_heartbeat_s=120,
                             max_heartbeats_per_second=40.0)
    assert pace.paces(FleetLoad(0, 1_000), settings) == pace.Paces(5, 25)  # 1,000 / 40
    with pytest.raises(ValueError, match="VM_MAX_NEXT_HEARTBEAT_S must be between 1 and 600"):
        make_settings(tmp_path, max_next_heartbeat_s=601)
    with pytest.raises(ValueError, match="VM_MAX_HEARTBEATS_PER_SECOND must be greater than 0"):
        make_settings(tmp_path, max_heartbeats_per_second=0.0)


# --- the coordinator answers it ------------------------------------------------------------


async def fleet_of(h: Harness, phases: list[str]) -> list[Agent]:
    """Agents that said hello and heartbeat once each in their phase."""
    agents = []
    for i, phase in enumerate(phases):
        agent = await h.issue(f"rig-{i}")
        status, _ = await agent.hello(boot_id=f"boot-{i}")
        assert status == 200
        status, _ = await agent.heartbeat(phase)
        assert status == 200
        agents.append(agent)
    return agents


def instance_of(h: Harness, agent: Agent) -> dict[str, Any]:
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    return inst


async def test_the_app_answers_a_longer_pace_when_the_fleet_exceeds_the_budget(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # 0.2 heartbeats a second: the base pace (15 s) holds for 3 agents.
    h = await start(aiohttp_client, tmp_path, max_heartbeats_per_second=0.2)
    first, *_ = await fleet_of(h, ["proving"] * 3)
    _status, directive = await first.heartbeat("proving")
    assert directive["next_heartbeat_s"] == 15
    fourth, fifth = await fleet_of(h, ["proving"] * 2)
    # Five agents heard: 5 / 0.2 = 25 s, in the signed answer, and stored as given.
    first.seq += 1
    status, directive, (resp, raw, nonce) = await first.post_raw(
        "/v1/heartbeat",
        orjson.dumps({"seq": first.seq, "phase": "proving", "phase_started_at": 1.8e9,
                      "progress": None, "proofs_completed_total": 0,
                      "proof_seconds_recent": [], "telemetry": None}))
    assert status == 200 and directive["next_heartbeat_s"] == 25
    assert resp.headers["X-VM-Signature"] == response_signature(first.key, nonce, 200, raw)
    assert instance_of(h, first)["heartbeat_pace_s"] == 25
    # A hello and a result are answered at the fleet's pace too.
    _status, directive = await fifth.hello(boot_id="boot-4")
    assert directive["next_heartbeat_s"] == 25
    status, ack = await fourth.post("/v1/result", result_msg("res-1", finished_at=h.clock()))
    assert status == 200 and ack["directive"]["next_heartbeat_s"] == 25
    # A replayed result gets the same directive, pace included, and the pace is what the
    # agent's silence is then timed on.
    h.clock.advance(1)
    await fleet_of(h, ["proving"])  # a sixth agent: the pace moves on to 30 s
    _status, again = await fourth.post("/v1/result", result_msg("res-1", finished_at=h.clock()))
    assert again["duplicate"] and again["directive"]["next_heartbeat_s"] == 25
    assert instance_of(h, fourth)["heartbeat_pace_s"] == 25
    assert h.core.tracker.pace_s(instance_of(h, fourth)["id"]) == 25


async def test_a_benchmarking_agent_keeps_a_quicker_pace(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, max_heartbeats_per_second=0.2)
    bench, warm, *proving = await fleet_of(
        h, ["benchmarking", "warming", "proving", "proving", "proving", "proving"])
    # Two quick agents at 15 s take 0.133 of the 0.2 a second; four proving agents share
    # the rest: 4 / 0.0667 = 60 s.
    _status, directive = await bench.heartbeat("benchmarking")
    assert directive["next_heartbeat_s"] == 15
    _status, directive = await warm.heartbeat("warming")
    assert directive["next_heartbeat_s"] == 15
    _status, directive = await proving[0].heartbeat("proving")
    assert directive["next_heartbeat_s"] == 60
    # The benchmark over, the agent proves: it is paced with the others, and leaves the
    # quick share: five proving agents share 0.2 - 1 / 15 a second.
    _status, directive = await bench.heartbeat("proving")
    assert directive["next_heartbeat_s"] == 60
    _status, directive = await proving[1].heartbeat("proving")
    assert directive["next_heartbeat_s"] == 38
    # Each stored as last given (the third proving agent was heard when three were).
    assert [instance_of(h, a)["heartbeat_pace_s"] for a in (bench, warm, *proving)] == [
        60, 15, 60, 38, 45, 60]


async def test_metrics_show_the_pace_the_agents_heard_and_the_budget(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    from prometheus_client import parser

    h = await start(aiohttp_client, tmp_path, max_heartbeats_per_second=0.2)
    await fleet_of(h, ["benchmarking", "proving", "proving", "proving", "proving"])
    resp = await h.client.get("/metrics", headers=ADMIN)
    assert resp.status == 200
    samples = {(s.name, s.labels.get("pace")): s.value
               for f in parser.text_string_to_metric_families(await resp.text())
               for s in f.samples}
    assert samples[("vm_heartbeat_pace_seconds", "quick")] == 15
    assert samples[("vm_heartbeat_pace_seconds", "steady")] == 30  # 4 / (0.2 - 1 / 15)
    assert samples[("vm_agents_heard", "quick")] == 1
    assert samples[("vm_agents_heard", "steady")] == 4
    assert samples[("vm_heartbeats_per_second_paced", None)] == pytest.approx(1 / 15 + 4 / 30)
    assert samples[("vm_heartbeats_per_second_budget", None)] == 0.2


async def test_an_agent_on_a_long_pace_is_lost_only_after_its_own_ttl(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, max_heartbeats_per_second=0.05)
    slow, other = await fleet_of(h, ["proving", "proving"])
    _status, directive = await slow.heartbeat("proving")
    assert directive["next_heartbeat_s"] == 40  # 2 agents / 0.05 a second
    _status, directive = await other.heartbeat("proving")
    assert directive["next_heartbeat_s"] == 40
    slow_id = instance_of(h, slow)["id"]
    # TTL: 3 x 40 + 30 = 150 s, where the base pace's would be 3 x 15 + 30 = 75 s.
    h.clock.advance(150)
    await h.core.monitor.tick()
    assert instance_of(h, slow)["state"] == "proving"
    h.clock.advance(1)
    await h.core.monitor.tick()
    assert instance_of(h, slow)["state"] == "lost"
    [event] = [e for e in h.store.events(slow_id) if e["kind"] == "lost"]
    assert "silent for 151 s" in event["reason"] and "TTL 150 s" in event["reason"]
    assert "40 s pace" in event["reason"]


async def test_after_a_restart_silence_is_timed_on_the_pace_stored(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, max_heartbeats_per_second=0.05)
    slow, other = await fleet_of(h, ["proving", "proving"])
    await slow.heartbeat("proving")
    slow_id = instance_of(h, slow)["id"]
    assert instance_of(h, slow)["heartbeat_pace_s"] == 40
    # A coordinator starting on this database (its tracker empty) seeds each timer with
    # the pace stored on the instance's row.
    settings = h.core.settings
    tracker = HeartbeatTracker(settings.silence_grace_s, settings.next_heartbeat_s)
    monitor = Monitor(settings, h.store, FakeProvider(), h.clock, tracker)
    monitor.seed(h.clock())
    assert tracker.pace_s(slow_id) == 40
    # Its TTL (3 x 40 + 30 s), after the longest wait an agent's backoff may still hold it.
    h.clock.advance(150 + COORDINATOR_BACKOFF.cap_s)
    await monitor.expire_silent(h.clock())
    assert instance_of(h, slow)["state"] == "proving"
    h.clock.advance(1)
    assert await monitor.expire_silent(h.clock()) == [slow_id, instance_of(h, other)["id"]]


async def test_a_restart_with_40_s_of_downtime_fires_no_lost_event(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """The coordinator is down 40 s: its agents retry with the backoff they use
    (``retry.COORDINATOR_BACKOFF``), so after the restart one may wait out up to its cap
    before its next heartbeat. Silence is timed from the restart plus that wait: an
    agent reporting within it is never ``lost``; one silent past it is."""
    h = await start(aiohttp_client, tmp_path, next_heartbeat_s=10)
    quick, late, dead = await fleet_of(h, ["proving", "proving", "proving"])
    ids = {a: instance_of(h, a)["id"] for a in (quick, late, dead)}
    ttl = 3 * 10 + h.core.settings.silence_grace_s
    # The agents' last heartbeats, then 40 s with no coordinator.
    h.clock.advance(40)
    settings = h.core.settings
    tracker = HeartbeatTracker(settings.silence_grace_s, settings.next_heartbeat_s)
    monitor = Monitor(settings, h.store, FakeProvider(), h.clock, tracker)
    monitor.seed(h.clock())
    restart = h.clock()
    # One reports at once, one as late as a backoff at its cap allows; both then keep
    # their pace. The third never reports again.
    window_end = restart + COORDINATOR_BACKOFF.cap_s + ttl
    first = {quick: restart + 5, late: window_end - 5}
    lost_at: dict[int, float] = {}
    while h.clock() < window_end + 20:
        h.clock.advance(5)
        for agent, since in first.items():
            if h.clock() >= since and (h.clock() - since) % 10 == 0:
                assert (await agent.heartbeat("proving"))[0] == 200
                tracker.touch(ids[agent], h.clock(), 10, "proving")
        for instance_id in await monitor.expire_silent(h.clock()):
            lost_at[instance_id] = h.clock()
    assert list(lost_at) == [ids[dead]] and lost_at[ids[dead]] > window_end
    assert [e["instance_id"] for e in h.store.events() if e["kind"] == "lost"] == [ids[dead]]


def test_migration_8_gives_older_instances_the_base_pace(tmp_path: Path) -> None:
    """A database from before migration 8: its instances have no pace stored, and are
    timed on the base pace until their agents are answered."""
    path = tmp_path / "coord.db"
    db = database_before_migration(path, 8)
    assert "heartbeat_pace_s" not in db["instances"].columns_dict
    db["instances"].insert({"id": 1, "agent_id": "ag_" + "1" * 20, "kind": "byo",
                            "state": "proving", "created_at": 1.0, "updated_at": 1.0})
    db.conn.close()
    store = Store(path)
    try:
        assert store.get_instance(1)["heartbeat_pace_s"] is None  # type: ignore[index]
        settings = make_settings(tmp_path)
        tracker = HeartbeatTracker(settings.silence_grace_s, settings.next_heartbeat_s)
        Monitor(settings, store, FakeProvider(), lambda: 0.0, tracker).seed(100.0)
        assert tracker.pace_s(1) == 15
        grace = COORDINATOR_BACKOFF.cap_s  # the agents' backoff after a restart
        assert tracker.expire_stale(175.0 + grace) == []
        assert tracker.expire_stale(176.0 + grace) == [(1, 15)]
    finally:
        store.close()


# --- what else follows the agent's pace -------------------------------------------------------


def test_the_benchmark_window_allows_one_interval_of_the_agents_own_pace() -> None:
    """A result may claim benchmarking from a little before the coordinator saw the phase
    begin: a heartbeat interval, of the pace the agent was on."""
    now = 1_800_010_000.0
    result = from_obj(Result, result_msg("r", proofs=10, wall_seconds=1100.0,
                                         proof_seconds=[400.0] * 10, finished_at=now))

    def check(pace_s: float | None) -> list[str]:
        watch = policy.Watch(now=now, window_start=now - 1000, window_after_result=False,
                             benchmarking_seen=True, reported_gpus=frozenset({0}),
                             pace_s=pace_s)
        return policy.check_result(result, watch=watch, limits=policy.PolicyLimits()).reasons

    assert any("started_at" in r for r in check(None))  # 100 s early: beyond 15 + 15 s
    assert any("started_at" in r for r in check(15))
    assert check(100) == []  # within 100 + 15 s


def test_the_agent_follows_the_pace_but_hears_back_thrice_within_its_orphan_timeout() -> None:
    """An agent destroys itself after VM_ORPHAN_TIMEOUT without a verified answer (1800 s by
    default): the coordinator's longest pace (at most 600 s) fits three times, and an
    agent given a shorter orphan timeout reports often enough for it anyway."""
    assert heartbeat_interval_s(15, 1800.0) == 15.0
    assert heartbeat_interval_s(600, 1800.0) == 600.0
    assert heartbeat_interval_s(300, 600.0) == 200.0
    # The coordinator's bound on its longest pace keeps to the agents' default.
    longest = next(r for r in coord_settings.SETTINGS if r.name == "max_next_heartbeat_s")
    orphan = next(r for r in agent_config.SETTINGS if r.env == "VM_ORPHAN_TIMEOUT")
    assert longest.at_most is not None
    assert longest.at_most * HEARTBEATS_PER_ORPHAN_TIMEOUT <= float(orphan.default)


# --- jitter (docs/operations.md, "Heartbeat pace") ---------------------------------------------


def test_jitter_adds_up_to_a_quarter_of_the_pace_from_the_injected_source() -> None:
    rng = random.Random(7)
    drawn = [pace.answer_s("proving", FleetLoad(steady=1), LIMITS, rng) for _ in range(2_000)]
    assert set(drawn) == {15, 16, 17, 18}  # 15 s plus 0 to 3 whole seconds, each drawn
    again = random.Random(7)
    assert drawn == [pace.answer_s("proving", FleetLoad(steady=1), LIMITS, again)
                     for _ in range(2_000)]  # the same source, the same answers
    assert pace.answer_s("proving", FleetLoad(steady=1), LIMITS) == 15  # no source: none
    # A pace under 4 s gets none: a whole second would be more than a quarter of it.
    assert {pace.jittered_s(3, random.Random(i)) for i in range(50)} == {3}
    assert {pace.jittered_s(1, random.Random(i)) for i in range(50)} == {1}


def test_jitter_keeps_the_fleet_under_its_budget() -> None:
    # 30,000 steady agents at a 1,000 a second budget: paced 30 s, jittered 30 to 37 s.
    rng = random.Random(11)
    fleet = FleetLoad(steady=30_000)
    answers = [pace.answer_s("proving", fleet, LIMITS, rng) for _ in range(fleet.steady)]
    assert min(answers) == 30 and max(answers) == 37
    assert sum(1 / s for s in answers) <= LIMITS.max_heartbeats_per_second


def test_silence_is_timed_on_the_jittered_pace() -> None:
    tracker = HeartbeatTracker(grace_s=30, base_pace_s=15)
    tracker.touch(1, 0.0, pace.jittered_s(15, FixedDraw(0.99)))  # told 18 s
    assert tracker.pace_s(1) == 18
    assert tracker.expire_stale(3 * 15 + 30 + 1) == []  # not silent on the base pace's TTL
    assert tracker.expire_stale(3 * 18 + 30 + 0.5) == [(1, 18)]


class FixedDraw:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


async def test_agents_starting_together_are_told_spread_paces(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # Twelve agents restarted at the same instant: their next heartbeats are spread, each
    # agent's silence is timed on what it was told, and the column keeps that pace.
    h = await start(aiohttp_client, tmp_path, rng=random.Random(3))
    agents = [await h.issue(f"rig-{i}") for i in range(12)]
    told = []
    for agent in agents:  # the clock does not move: all at once
        status, directive = await agent.hello()
        assert status == 200
        status, directive = await agent.heartbeat("proving")
        assert status == 200
        told.append(directive["next_heartbeat_s"])
    assert all(15 <= s <= 18 for s in told)
    assert len(set(told)) >= 3, told
    for agent, s in zip(agents, told, strict=True):
        inst = instance_of(h, agent)
        assert inst["heartbeat_pace_s"] == s
        assert h.core.tracker.expires_at(inst["id"]) == h.clock() + policy.silence_ttl_s(
            s, h.core.settings.silence_grace_s)
    next_beats = {h.clock() + s for s in told}
    assert len(next_beats) >= 3  # no longer in lockstep
