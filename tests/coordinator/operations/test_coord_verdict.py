"""Early verdicts wired into the coordinator: signed heartbeats through the real app.

The expected numbers are worked out here from the method's formulas (docs/policy.md)
with ``math`` and ``statistics.NormalDist``, never by calling ``decisions.early_verdict``.
With the default settings (confidence 0.95, 12 planned proofs, verdicts from the 2nd
proof) the 12 tests share alpha = 0.05: 0.05 / 12 each; the stall test spreads its
share over the 12 proofs.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest

from vast_manager.coordinator.store.migrations import loads

from support.coord_support import Agent, Harness, start
from support.fakes_provider import FakeClock, FakeProvider, offer

ALPHA_TEST = 0.05 / 12
Z = NormalDist().inv_cdf(1 - ALPHA_TEST)  # 2.638
Z_STALL = NormalDist().inv_cdf(1 - ALPHA_TEST / 12)
SIGMA = 0.15
PHASE_STARTED = 1_800_000_100.0


def bench_hb(
    agent: Agent, *, done: int, total_completed: int, recent: list[float],
    concurrency: int | None = 2, seq: int | None = None, phase_started_at: float = PHASE_STARTED,
) -> dict[str, Any]:
    if seq is None:
        agent.seq += 1
        seq = agent.seq
    progress: dict[str, Any] = {"done": done, "total": 12, "unit": "proofs"}
    if concurrency is not None:
        progress["concurrency"] = concurrency
    return {
        "seq": seq,
        "phase": "benchmarking",
        "phase_started_at": phase_started_at,
        "progress": progress,
        "proofs_completed_total": total_completed,
        "proof_seconds_recent": recent,
        "telemetry": None,
    }


async def send(agent: Agent, msg: dict[str, Any]) -> dict[str, Any]:
    status, directive = await agent.post("/v1/heartbeat", msg)
    assert status == 200, directive
    return directive


async def deployed(h: Harness, *, dph: float = 0.40, gpus: int = 1) -> tuple[Agent, int, int]:
    """A deployed instance (minimum dph / 0.008: 50/h at 0.40 $/h) that said hello."""
    status, data = await h.admin("POST", "/api/deploy", {"offer_id": 9001})
    assert status == 200, data
    agent = h.agent(data["agent_id"])
    assert (await agent.hello(gpus=gpus))[0] == 200
    return agent, int(data["instance_id"]), int(data["provider_instance_id"])


def provider(gpus: int = 1) -> FakeProvider:
    return FakeProvider([offer(9001, 4242, dph_total=0.40, num_gpus=gpus)])


def verdict_events(h: Harness, instance_id: int) -> list[dict[str, Any]]:
    return [e for e in h.store.events(instance_id) if e["kind"] == "verdict"]


def bench_row(h: Harness, instance_id: int) -> dict[str, Any]:
    row = h.store.get_instance(instance_id)
    assert row is not None
    return row


async def test_slow_host_is_terminated_early_with_partial_result_and_bad_host(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    fake = provider()
    h = await start(aiohttp_client, tmp_path, provider=fake)
    agent, iid, pid = await deployed(h)
    # The batch starts: two proofs in flight, none done.
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    h.clock.advance(360)
    # Both proofs took 360 s: 2 * 3600 * 2 / 720 = 20/h against a minimum of 50/h.
    directive = await send(agent, bench_hb(agent, done=2, total_completed=2,
                                           recent=[360.0, 360.0]))
    upper = 20.0 * math.exp(Z * SIGMA / math.sqrt(2))  # 26.5/h
    statistic = math.log(50.0 / 20.0) / (SIGMA / math.sqrt(2))
    assert directive["action"] == "terminate"
    assert directive["reason"] == (
        f"early verdict: after 2 proofs the rate is at most {upper:.1f}/h with 95% confidence "
        "(estimate 20.0/h), below the minimum 50.0/h"
    )
    # The decision and its numbers.
    (event,) = verdict_events(h, iid)
    assert event["reason"] == "terminate: " + directive["reason"]
    numbers = loads(event["data_json"])
    assert numbers["decision"] == "terminate"
    assert numbers["rate_estimate_per_hour"] == pytest.approx(20.0)
    assert numbers["bound_per_hour"] == pytest.approx(upper)
    assert numbers["proofs"] == 2
    assert numbers["statistic"] == pytest.approx(statistic)
    assert numbers["concurrency"] == 2
    assert numbers["elapsed_s"] == pytest.approx(360.0)
    # The machine is blocked, with the numbers as its reason.
    (bad,) = h.store.bad_hosts()
    assert bad["machine_id"] == "4242"
    assert bad["reason"] == directive["reason"]
    # The partial measurement is stored, flagged, and kept out of host_perf.
    (result,) = h.store.results_for_instance(iid)
    assert result["flags"] == "partial,early_verdict"
    assert result["counts_for_host_perf"] == 0
    assert result["proofs_completed"] == 2
    assert loads(result["proof_seconds_json"]) == [360.0, 360.0]
    assert result["recomputed_rate_per_hour"] == pytest.approx(20.0)
    assert result["verdict"] == "terminate"
    assert h.store.host_perf() == []
    _, view = await h.admin("GET", f"/api/instances/{iid}")
    assert view["state"] == "terminating"
    assert view["results"][0]["flags"] == ["partial", "early_verdict"]
    assert view["results"][0]["counts_for_host_perf"] is False
    # Destroyed through the same path as a below-minimum result: after the grace.
    await h.core.monitor.tick()
    assert fake.destroyed == []
    h.clock.advance(11)
    await h.core.monitor.tick()
    assert fake.destroyed == [pid]
    assert bench_row(h, iid)["state"] == "destroyed"


async def test_host_exactly_at_its_minimum_is_never_judged_early(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, iid, _ = await deployed(h)
    w0 = 2 * 3600 / 50.0  # 144 s: exactly the minimum on two slots
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    for pair in range(1, 7):
        # Just before the pair lands only the stall test can speak; it must not.
        h.clock.advance(w0 - 1)
        directive = await send(agent, bench_hb(agent, done=2 * pair - 2,
                                               total_completed=2 * pair - 2, recent=[]))
        assert directive["action"] == "continue", directive
        h.clock.advance(1)
        directive = await send(agent, bench_hb(agent, done=2 * pair, total_completed=2 * pair,
                                               recent=[w0, w0]))
        assert directive["action"] == "continue", directive
    assert verdict_events(h, iid) == []
    assert loads(bench_row(h, iid)["bench_proof_seconds_json"]) == [w0] * 12
    # The finished benchmark gets the ordinary verdict: 50.0/h is not below 50.0/h.
    msg = _result("r1", [w0] * 12, wall=6 * w0, finished_at=h.clock())
    status, data = await agent.post("/v1/result", msg)
    assert status == 200
    assert data["directive"]["action"] == "continue"
    (event,) = verdict_events(h, iid)
    assert event["reason"] == (
        "keep: measured 50.00 proofs/h in steady state (2 in flight; batch rate 50.00), "
        "at or above the minimum 50.00"
    )
    assert h.store.host_perf()[0]["samples"] == 1
    assert bench_row(h, iid)["bench_status"] == "closed"


def _result(result_id: str, proofs: list[float], *, wall: float, finished_at: float,
            gpus: int = 1) -> dict[str, Any]:
    return {
        "result_id": result_id,
        "kind": "benchmark",
        "proof_type": "porep-c2-32g",
        "started_at": finished_at - wall,
        "finished_at": finished_at,
        "gpus_used": list(range(gpus)),
        "proofs_completed": len(proofs),
        "proofs_failed": 0,
        "wall_seconds": wall,
        "rate_per_hour": len(proofs) * 3600.0 / wall,
        "proof_seconds": proofs,
        "telemetry": None,
    }


async def test_early_pass_is_an_event_and_the_steady_state_rate_judges_the_result(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # 4 GPUs, 8 proofs in flight, each 480 s: 8 * 3600 / 480 = 60/h against 50/h.
    h = await start(aiohttp_client, tmp_path, provider=provider(gpus=4))
    agent, iid, _ = await deployed(h, gpus=4)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[], concurrency=8))
    h.clock.advance(480)
    directive = await send(agent, bench_hb(agent, done=8, total_completed=8, recent=[480.0] * 8,
                                           concurrency=8))
    lower = 60.0 * math.exp(-Z * SIGMA / math.sqrt(8))  # 52.2/h > 50/h
    assert directive["action"] == "continue"
    (event,) = verdict_events(h, iid)
    assert event["reason"] == (
        f"early pass: after 8 proofs the rate is at least {lower:.1f}/h with 95% confidence "
        "(estimate 60.0/h), above the minimum 50.0/h"
    )
    assert loads(event["data_json"])["bound_per_hour"] == pytest.approx(lower)
    # The last four proofs run with half the slots idle: the batch rate reads 12 * 3600 /
    # 960 = 45/h, below the minimum; the steady-state rate 8 * 3600 * 12 / 5760 = 60/h.
    h.clock.advance(480)
    await send(agent, bench_hb(agent, done=12, total_completed=12, recent=[480.0] * 4,
                               concurrency=8))
    status, data = await agent.post("/v1/result", _result("r1", [480.0] * 12, wall=960.0,
                                                          finished_at=h.clock(), gpus=4))
    assert status == 200
    assert data["directive"]["action"] == "continue"
    assert verdict_events(h, iid)[-1]["reason"] == (
        "keep: measured 60.00 proofs/h in steady state (8 in flight; batch rate 45.00), "
        "at or above the minimum 50.00"
    )
    assert h.store.bad_hosts() == []


async def test_replayed_and_resent_heartbeats_are_not_double_counted(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    h.clock.advance(150)
    first = bench_hb(agent, done=2, total_completed=2, recent=[140.0, 150.0])
    await send(agent, first)
    # The same heartbeat again (a retry with a fresh nonce): same boot, same seq.
    await send(agent, first)
    assert loads(bench_row(h, iid)["bench_proof_seconds_json"]) == [140.0, 150.0]
    # The answer to the next one was lost, so the agent resends its proofs with the
    # following one: the counter says only the last is new.
    h.clock.advance(150)
    await send(agent, bench_hb(agent, done=3, total_completed=3, recent=[145.0]))
    h.clock.advance(15)
    await send(agent, bench_hb(agent, done=3, total_completed=3, recent=[145.0]))
    h.clock.advance(135)
    await send(agent, bench_hb(agent, done=4, total_completed=4, recent=[145.0, 155.0]))
    row = bench_row(h, iid)
    assert loads(row["bench_proof_seconds_json"]) == [140.0, 150.0, 145.0, 155.0]
    assert row["bench_failed"] == 0
    assert verdict_events(h, iid) == []


async def test_a_coordinator_restart_mid_benchmark_keeps_the_state(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    clock = FakeClock()
    fake = provider()
    h = await start(aiohttp_client, tmp_path, provider=fake, clock=clock)
    agent, iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    seen_at = clock()
    h.clock.advance(360)
    # One slow proof: too few for a verdict, and the other slot is not yet a stall.
    directive = await send(agent, bench_hb(agent, done=1, total_completed=1, recent=[360.0]))
    assert directive["action"] == "continue"
    seq = agent.seq
    await h.client.close()  # the coordinator stops (its store closes) ...

    h2 = await start(aiohttp_client, tmp_path, provider=fake, clock=clock)  # ... and restarts
    agent2 = h2.agent(agent.agent_id)
    agent2.seq = seq
    h2.clock.advance(9)
    directive = await send(agent2, bench_hb(agent2, done=2, total_completed=2, recent=[360.0]))
    assert directive["action"] == "terminate"
    numbers = loads(verdict_events(h2, iid)[0]["data_json"])
    assert numbers["proofs"] == 2  # the proof seen before the restart counts
    assert numbers["elapsed_s"] == pytest.approx(clock() - seen_at)  # timed from the first sight
    assert numbers["rate_estimate_per_hour"] == pytest.approx(20.0)


async def test_a_stalled_benchmark_is_caught_in_simulated_seconds(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # A simulated fleet at 100x. Before any proof completes the time counts from the
    # first sight less two heartbeat intervals (30 s: the agent announces the run a
    # moment before the batch starts): 40 real seconds are 1000 simulated ones.
    h = await start(aiohttp_client, tmp_path, provider=provider(), sim_time_scale=100.0)
    agent, iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    h.clock.advance(31)
    assert (await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[])))[
        "action"] == "continue"
    h.clock.advance(9)
    directive = await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    bound = 2 * 3600 * math.exp(Z_STALL * SIGMA) / 1000.0  # 12.0/h
    assert directive["action"] == "terminate"
    assert directive["reason"] == (
        f"early verdict: no proof completed in 1000 s with 2 running: the rate is at most "
        f"{bound:.1f}/h with 95% confidence, below the minimum 50.0/h"
    )
    (result,) = h.store.results_for_instance(iid)
    assert (result["proofs_completed"], result["rate_per_hour"]) == (0, None)


async def test_no_early_verdict_when_off(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, provider=provider(), verdict_early=False)
    agent, iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    for n in range(1, 7):
        h.clock.advance(360)
        directive = await send(agent, bench_hb(agent, done=2 * n, total_completed=2 * n,
                                               recent=[360.0, 360.0]))
        assert directive["action"] == "continue"
    assert verdict_events(h, iid) == []
    # The full benchmark is judged on its batch rate, as before early verdicts.
    _, data = await agent.post("/v1/result", _result("r1", [360.0] * 12, wall=2160.0,
                                                     finished_at=h.clock()))
    assert data["directive"]["action"] == "terminate"
    assert data["directive"]["reason"] == (
        "measured 20.00 proofs/h, below the minimum 50.00 proofs/h"
    )


@pytest.mark.parametrize("what", ["concurrency", "progress"])
async def test_missing_progress_counts_as_no_progress(
    aiohttp_client: Any, tmp_path: Path, what: str
) -> None:
    """A benchmark that leaves its concurrency (or its whole progress) out of its
    heartbeats is read as making no progress, on as many slots as its 12 planned proofs
    (more than the 8 one GPU may hold; without progress, 8), timed from its first
    benchmarking heartbeat less the warm-up's 1200 s and two paces: the stall test still
    stops a host at 20/h against a minimum of 50/h."""
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, _iid, _ = await deployed(h)

    def hb(n: int) -> dict[str, Any]:
        msg = bench_hb(agent, done=2 * n, total_completed=2 * n,
                       recent=[360.0, 360.0] if n else [], concurrency=None)
        if what == "progress":
            msg["progress"] = None
        return msg

    await send(agent, hb(0))
    # Slots = planned proofs; the Bonferroni share is spread over N - 2 + 2 = N looks.
    slots = 12 if what == "concurrency" else 8
    z_stall = NormalDist().inv_cdf(1 - 0.05 / slots / slots)
    limit = slots * 3600 * math.exp(z_stall * SIGMA) / 50.0  # ~1434 s on 12 slots
    n = 0
    while n < 40:
        n += 1
        h.clock.advance(360)
        directive = await send(agent, hb(n))
        if directive["action"] == "terminate":
            break
        assert n * 360 - 1230 <= limit
    assert n * 360 - 1230 > limit
    assert directive["reason"].startswith("early verdict: no proof completed in ")
    assert f"with {slots} running" in directive["reason"]
    assert directive["reason"].endswith(
        "(its heartbeats report no progress: read as none, after 1200 s for the warm-up)")


async def test_a_run_that_stops_reporting_progress_is_judged_on_what_it_reported(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """Concurrency announced, then progress dropped: nothing more is counted, and the
    stall test runs on the announced 2 slots, without the warm-up's allowance."""
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, _iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[]))
    action = "continue"
    elapsed = 0
    while action == "continue" and elapsed < 3000:
        h.clock.advance(60)
        elapsed += 60
        msg = bench_hb(agent, done=0, total_completed=0, recent=[])
        msg["progress"] = None
        action = (await send(agent, msg))["action"]
    assert action == "terminate"
    assert elapsed < 1200  # 2 slots at 50/h: a proof's median is 144 s


async def test_a_later_run_without_progress_inherits_nothing_of_the_earlier_one(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """A run that reported its 12 proofs, then a new run (a re-benchmark: another
    phase_started_at) that reports no progress: the earlier run's proofs done must not
    read as this run's failed proofs (a failed proof turns the stall test off)."""
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, _iid, _ = await deployed(h)
    for n in range(0, 13, 2):
        await send(agent, bench_hb(agent, done=n, total_completed=n,
                                   recent=[36.0, 36.0] if n else []))
        h.clock.advance(36)
    later = PHASE_STARTED + 5000.0
    action = "continue"
    for _ in range(60):
        msg = bench_hb(agent, done=0, total_completed=12, recent=[],
                       phase_started_at=later)
        msg["progress"] = None
        directive = await send(agent, msg)
        action = directive["action"]
        if action == "terminate":
            break
        h.clock.advance(60)
    assert action == "terminate"
    assert directive["reason"].startswith("early verdict: no proof completed in ")


async def test_missing_concurrency_spares_an_honest_run_at_the_minimum(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """An older agent (no concurrency) whose 12 proofs come at exactly the minimum rate
    (50/h: one every 72 s) finishes before the no-progress reading's stall line."""
    h = await start(aiohttp_client, tmp_path, provider=provider())
    agent, iid, _ = await deployed(h)
    await send(agent, bench_hb(agent, done=0, total_completed=0, recent=[], concurrency=None))
    for n in range(1, 13):
        h.clock.advance(72)
        directive = await send(agent, bench_hb(agent, done=n, total_completed=n,
                                               recent=[144.0], concurrency=None))
        assert directive["action"] == "continue", directive
    assert verdict_events(h, iid) == []


