"""The monitor: silence -> lost, phase timeouts -> destroy, pending destroys, reconciliation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vast_manager.coordinator.decisions.pace import HeartbeatTracker
from vast_manager.coordinator.providers.base import ProviderError

from support.coord_support import Harness, start
from support.fakes_provider import FakeProvider, offer


def test_tracker_touch_and_expire() -> None:
    t = HeartbeatTracker(grace_s=30, base_pace_s=15)  # TTL 3 x 15 + 30 = 75 s
    t.touch(1, 100.0)
    t.touch(2, 150.0)
    assert t.expire_stale(175.0) == []
    assert t.expire_stale(176.0) == [(1, 15)]
    assert t.expire_stale(176.0) == []  # expiry forgets it
    t.touch(2, 300.0)
    assert t.last_seen(2) == 300.0 and len(t) == 1


def test_tracker_times_each_instance_on_its_own_pace() -> None:
    t = HeartbeatTracker(grace_s=30, base_pace_s=15)
    t.touch(1, 0.0, 15, "proving")
    t.touch(2, 0.0, 100, "proving")  # TTL 3 x 100 + 30 = 330 s
    assert t.expire_stale(76.0) == [(1, 15)]
    assert t.expire_stale(330.0) == []
    t.touch(2, 10.0)  # heard again, no new pace: it keeps the one it was given
    assert t.pace_s(2) == 100
    assert t.expire_stale(340.0) == []
    assert t.expire_stale(340.5) == [(2, 100)]


def test_tracker_counts_the_fleet_by_pace() -> None:
    t = HeartbeatTracker(grace_s=30, base_pace_s=15)
    t.touch(1, 0.0, 15, "benchmarking")
    t.touch(2, 0.0, 15, "warming")
    t.touch(3, 0.0, 15, "proving")
    t.touch(4, 0.0, 15)  # no phase yet (a hello): paced steady
    assert (t.load().quick, t.load().steady) == (2, 2)
    t.touch(1, 5.0, 15, "proving")
    t.touch(2, 5.0, 15)  # no phase: its class stays
    assert (t.load().quick, t.load().steady) == (1, 3)
    t.forget(2)
    assert (t.load().quick, t.load().steady) == (0, 3)


async def deployed(h: Harness, offer_id: int = 1) -> dict[str, Any]:
    status, data = await h.admin("POST", "/api/deploy", {"offer_id": offer_id})
    assert status == 200, data
    return data


async def test_silence_makes_lost_and_a_heartbeat_recovers(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider([offer(1, 11)]))
    d = await deployed(h)
    agent = h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("proving")
    h.clock.advance(75)
    await h.core.monitor.tick()
    assert h.store.get_instance(d["instance_id"])["state"] == "proving"  # type: ignore[index]
    h.clock.advance(1)
    await h.core.monitor.tick()
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "lost"
    assert any(e["kind"] == "lost" for e in h.store.events(d["instance_id"]))
    await agent.heartbeat("proving")
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "proving"
    assert any(e["kind"] == "recovered" for e in h.store.events(d["instance_id"]))


async def test_phase_timeout_terminates_then_destroys(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider, next_heartbeat_s=600)
    d = await deployed(h)
    agent = h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("warming")
    h.clock.advance(1201)
    await h.core.monitor.tick()
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "terminating"
    assert "warm-up" in inst["terminate_reason"]
    _status, directive = await agent.heartbeat("warming")
    assert directive["action"] == "terminate"
    h.clock.advance(11)
    await h.core.monitor.tick()
    assert provider.destroyed == [d["provider_instance_id"]]
    assert any(e["kind"] == "timeout" for e in h.store.events(d["instance_id"]))


async def test_no_hello_is_destroyed_without_grace(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    d = await deployed(h)
    h.clock.advance(901)
    await h.core.monitor.tick()
    assert provider.destroyed == [d["provider_instance_id"]]
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "destroyed"
    assert "no hello" in inst["terminate_reason"]


async def test_failed_destroy_is_retried(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    d = await deployed(h)
    provider.destroy_error = ProviderError("rate limited")
    h.clock.advance(901)
    await h.core.monitor.tick()
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "terminating"
    assert any(e["kind"] == "destroy_failed" for e in h.store.events(d["instance_id"]))
    provider.destroy_error = None
    h.clock.advance(61)
    await h.core.monitor.tick()
    assert provider.destroyed == [d["provider_instance_id"]]


async def test_agent_reporting_failed_is_destroyed(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    d = await deployed(h)
    agent = h.agent(d["agent_id"])
    await agent.hello()
    _, directive = await agent.heartbeat("failed")
    assert directive["action"] == "terminate"
    h.clock.advance(11)
    await h.core.monitor.tick()
    assert provider.destroyed == [d["provider_instance_id"]]


async def test_reconcile_destroys_leaked_instances_of_our_fleet_only(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    fleet = h.core.settings.fleet_id
    provider.instances[900] = {
        "id": 900,
        "label": f"vm:{fleet}:ag_ffffffffffffffffffff",
        "machine_id": 5,
        "actual_status": "running",
        "start_date": 0.0,
    }
    provider.instances[901] = {
        "id": 901,
        "label": "vm:otherfleet:ag_ffffffffffffffffffff",
        "machine_id": 6,
        "actual_status": "running",
        "start_date": 0.0,
    }
    provider.instances[902] = {
        "id": 902,
        "label": "someone's box",
        "machine_id": 7,
        "actual_status": "exited",
        "start_date": 0.0,
    }
    await h.core.monitor.tick()
    assert provider.destroyed == [900]


def test_only_the_states_that_can_time_out_are_read() -> None:
    """The monitor's timeout scan reads the states with a limit and those on the way to
    the first benchmark: never the proving fleet, which has neither."""
    from vast_manager.coordinator.decisions import policy, states

    assert {str(s) for s in policy.TIMED_STATES} == {
        "deploying", "booting", "fetching_params", "warming", "benchmarking", "lost"}
    assert states.FIRST_BENCHMARK <= policy.TIMED_STATES
    assert "proving" not in policy.TIMED_STATES
