"""A host lying its way into host_perf: every forged result is stored, flagged with its
reason, and changes neither ``host_perf`` nor the offers' ranking.

Each attack is played against the real app (``create_app`` under aiohttp's test client,
an injected clock) by an agent that signs its requests with its own key, as a hostile
host holding its container's key can. Before and after each attack the test reads
``GET /api/host-perf`` and ``GET /api/offers``; they must not move. The operator must
see the flag and its reason in the instance view, the events and the CLI's view.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.cli.text_views import render_instance

from support.coord_support import Agent, Harness, heartbeat_msg, result_msg, start
from support.fakes_provider import FakeProvider, offer

# A fleet of offers: two measured honestly before each attack (4243: 1x 4090 at 60/h,
# 4245: 1x 3090 at 40/h), the attacker's (4242 or 4244), and the unmeasured ones the
# rate model predicts from what was measured.
OFFERS = [
    offer(9001, 4242, dph_total=0.40),
    offer(9002, 4243, dph_total=0.40),
    offer(9003, 4244, num_gpus=2, dph_total=0.80),
    offer(9004, 4250, num_gpus=4, dph_total=1.60),
    offer(9005, 4245, gpu_name="RTX 3090", dph_total=0.20),
    offer(9006, 4251, gpu_name="RTX 3090", dph_total=0.30),
]


async def deploy(h: Harness, offer_id: int, *, gpus: int = 1, min_rate: float = 10.0) -> Agent:
    status, data = await h.admin("POST", "/api/deploy",
                                 {"offer_id": offer_id, "min_rate_per_hour": min_rate})
    assert status == 200, data
    agent = h.agent(data["agent_id"])
    status, data = await agent.hello(gpus=gpus)
    assert status == 200, data
    return agent


async def benchmark(h: Harness, agent: Agent, seconds: float) -> None:
    """The coordinator sees the agent benchmarking for ``seconds``."""
    status, _ = await agent.heartbeat("benchmarking")
    assert status == 200
    h.clock.advance(seconds)


async def post_result(h: Harness, agent: Agent, result_id: str, **kw: Any) -> dict[str, Any]:
    kw.setdefault("finished_at", h.clock())
    status, data = await agent.post("/v1/result", result_msg(result_id, **kw))
    assert status == 200, data
    return data


async def honest_fleet(aiohttp_client: Any, tmp_path: Path) -> Harness:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(OFFERS))
    for offer_id, proofs in ((9002, 60), (9005, 40)):
        agent = await deploy(h, offer_id)
        await benchmark(h, agent, 3700)
        data = await post_result(h, agent, f"honest-{offer_id}", proofs=proofs,
                                 wall_seconds=3600.0)
        assert data["directive"]["action"] == "continue"
        await agent.heartbeat("proving")
    return h


class Standing:
    """What an attack must not move: host_perf, every offer's prediction and basis, and
    the order of the offers. The attacker's own offer may only fall (to the bottom, once
    its machine is on bad_hosts for lying), never rise."""

    def __init__(self, perf: list[dict[str, Any]], offers: list[dict[str, Any]]) -> None:
        self.perf = perf
        self.predictions = {o["id"]: (o["predicted_rate_per_hour"], o["prediction_basis"],
                                      o["predicted_rate_low"], o["predicted_rate_high"])
                            for o in offers}
        self.order = [o["id"] for o in offers]

    def assert_unmoved_by(self, after: Standing, attacker_offer: int) -> None:
        assert after.perf == self.perf
        assert after.predictions == self.predictions
        others = [i for i in self.order if i != attacker_offer]
        assert [i for i in after.order if i != attacker_offer] == others
        assert after.order.index(attacker_offer) >= self.order.index(attacker_offer)


async def standing(h: Harness) -> Standing:
    # The rate model as it would be once refitted on whatever the attack left behind.
    await h.core.models.refresh()
    _, perf = await h.admin("GET", "/api/host-perf")
    _, offers = await h.admin("GET", "/api/offers")
    return Standing(perf, offers)


async def assert_flagged(h: Harness, agent: Agent, result_id: str, flag: str,
                         words: str) -> None:
    """Stored as evidence, flagged with a reason quoting ``words``, shown to the operator."""
    stored = h.store.find_result(agent.agent_id, result_id)
    assert stored is not None, "a forged result is still stored, as evidence"
    assert flag in stored["flags"].split(","), stored["flags"]
    assert stored["counts_for_host_perf"] == 0
    reasons = orjson.loads(stored["flag_reasons_json"])
    assert any(r.startswith(f"{flag}:") and words in r for r in reasons), reasons
    _, detail = await h.admin("GET", f"/api/instances/{stored['instance_id']}")
    (view,) = [r for r in detail["results"] if r["result_id"] == result_id]
    assert flag in view["flags"] and any(words in r for r in view["flag_reasons"])
    assert any(e["kind"] == "flagged" and words in e["reason"] for e in detail["events"])
    assert words in render_instance(detail)  # what `vast-manager instance ID` prints


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path) -> Harness:
    return await honest_fleet(aiohttp_client, tmp_path)


async def test_the_honest_fleet_is_measured_and_ranked(h: Harness) -> None:
    now = await standing(h)
    assert sorted((p["machine_id"], p["median_rate_per_hour"]) for p in now.perf) == [
        ("4243", 60.0), ("4245", 40.0)]
    assert {m["machine_id"] for m in h.store.measurements()} == {"4243", "4245"}
    # The measured machines' offers are pinned by their own runs; every offer has an
    # interval, widest where nothing like it was measured.
    _, basis, low, high = now.predictions[9002]
    assert low < 60.0 < high and "this machine x" in basis
    assert now.predictions[9005][2] < 40.0 < now.predictions[9005][3]
    four = now.predictions[9004]
    assert four[2] < four[0] < four[3]


@pytest.mark.parametrize("proofs", [500, 400])
async def test_one_gpu_named_64_times(h: Harness, proofs: int) -> None:
    """The probe's forgery (500 proofs in 85 s), and one within what 64 real GPUs could
    make (400 in 85 s: 16,941/h, under 64 x 270/h, the RTX 4090 ceiling), so that only
    counting the GPUs the host reported, never the list's length, keeps it out."""
    agent = await deploy(h, 9001)
    before = await standing(h)
    await benchmark(h, agent, 85)
    await post_result(h, agent, "forged", proofs=proofs, wall_seconds=85.0,
                      gpus_used=[0] * 64, proof_seconds=[10.0] * proofs)
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, "forged", "implausible", "names a GPU more than once")
    await assert_flagged(h, agent, "forged", "implausible", "beyond the ceiling of 270/h")


async def test_gpus_the_host_never_reported(h: Harness) -> None:
    agent = await deploy(h, 9001)
    before = await standing(h)
    await benchmark(h, agent, 1300)
    # 48 proofs in 1200 s (144/h) on "four" GPUs of a host whose hello listed one.
    await post_result(h, agent, "forged", proofs=48, wall_seconds=1200.0,
                      gpus_used=[0, 1, 2, 3])
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, "forged", "implausible", "the host never reported")


async def test_eleven_results_from_one_stretch_of_benchmarking(h: Harness) -> None:
    agent = await deploy(h, 9001)
    await benchmark(h, agent, 1300)
    await post_result(h, agent, "first", proofs=20, wall_seconds=1200.0)  # 60/h: counts
    before = await standing(h)
    (mine,) = [p for p in before.perf if p["machine_id"] == "4242"]
    assert mine["samples"] == 1
    for i in range(10):
        h.clock.advance(0.2)
        await post_result(h, agent, f"again-{i}", proofs=30, wall_seconds=1200.0)  # "90/h"
    before.assert_unmoved_by(await standing(h), 9001)
    for i in range(10):
        await assert_flagged(h, agent, f"again-{i}", "implausible", "since its previous result")


async def test_a_result_without_an_observed_benchmarking_phase(h: Harness) -> None:
    agent = await deploy(h, 9001)
    before = await standing(h)
    for _ in range(3):
        await agent.heartbeat("proving")
        h.clock.advance(15)
    # Claims 85 s: within what the coordinator's slack allowed before, never seen.
    await post_result(h, agent, "unseen", proofs=2, wall_seconds=85.0,
                      proof_seconds=[80.0, 80.0])
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, "unseen", "implausible", "never saw this instance benchmarking")


async def test_a_result_after_silence_without_an_observed_benchmarking_phase(
    h: Harness
) -> None:
    """Seen proving, then silent for longer than the result claims: the claim fits in the
    time since the coordinator last heard, but none of it was seen as benchmarking."""
    agent = await deploy(h, 9001)
    await agent.heartbeat("proving")
    before = await standing(h)
    h.clock.advance(1300)
    await post_result(h, agent, "unseen", proofs=20, wall_seconds=1200.0)  # 60/h
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, "unseen", "implausible", "never saw this instance benchmarking")


async def test_nothing_counts_after_a_terminate_verdict(h: Harness) -> None:
    agent = await deploy(h, 9001, min_rate=50.0)
    await benchmark(h, agent, 1300)
    data = await post_result(h, agent, "slow", proofs=12, wall_seconds=1200.0)  # 36/h < 50
    assert data["directive"]["action"] == "terminate"
    before = await standing(h)
    # A fresh stretch of benchmarking, then a fast result: the terminate stands.
    await benchmark(h, agent, 1300)
    data = await post_result(h, agent, "late", proofs=40, wall_seconds=1200.0)  # "120/h"
    assert data["directive"]["action"] == "terminate"
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, "late", "after_terminate", "after the terminate verdict")
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["rate_per_hour"] == pytest.approx(36.0)
    # Heartbeats after it move nothing either.
    await agent.heartbeat("proving")
    before.assert_unmoved_by(await standing(h), 9001)


async def test_nothing_counts_after_the_operator_destroyed_it(h: Harness) -> None:
    agent = await deploy(h, 9001)
    await benchmark(h, agent, 1300)
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    status, _ = await h.admin("POST", f"/api/instances/{inst['id']}/destroy")
    assert status == 200
    before = await standing(h)
    # The destroyed instance's agent is refused outright (revoked); a terminating one
    # (destroy not yet done) is judged as evidence only (the test above).
    status, _ = await agent.post("/v1/result", result_msg("gone", proofs=20,
                                                          finished_at=h.clock()))
    assert status == 401
    before.assert_unmoved_by(await standing(h), 9001)


@pytest.mark.parametrize(
    ("case", "times", "words"),
    [
        ("finished_before_started", {"started_at": 0.0, "finished_at": -600.0},
         "is not after started_at"),
        ("wall_not_matching_timestamps", {"started_at": -600.0, "finished_at": 0.0},
         "does not match finished_at - started_at"),
        ("finished_in_the_future", {"started_at": 600.0, "finished_at": 1800.0},
         "in the future"),
        ("started_before_the_window", {"started_at": -9000.0, "finished_at": -7800.0},
         "before the benchmarking the coordinator saw began"),
    ],
)
async def test_timestamps_that_do_not_agree(h: Harness, case: str, times: dict[str, float],
                                            words: str) -> None:
    agent = await deploy(h, 9001)
    before = await standing(h)
    await benchmark(h, agent, 1300)
    now = h.clock()
    msg = result_msg(case, proofs=20, wall_seconds=1200.0)  # 60/h, a believable rate
    msg.update({name: now + offset for name, offset in times.items()})
    status, _ = await agent.post("/v1/result", msg)
    assert status == 200
    before.assert_unmoved_by(await standing(h), 9001)
    await assert_flagged(h, agent, case, "implausible", words)


async def scaling_after_a_benchmark(h: Harness, run_rates: tuple[float, float],
                                    proofs: int, wall_seconds: float) -> tuple[Agent, Standing]:
    """A 2-GPU host's all-GPU benchmark (40 proofs in 1200 s: 120/h, counted), then its
    scaling result: the one-GPU run (``proofs`` in ``wall_seconds``) and runs claiming
    ``run_rates`` (both GPUs, one). Returns the agent and the standing in between."""
    agent = await deploy(h, 9003, gpus=2)
    await benchmark(h, agent, 1300)
    await post_result(h, agent, "all", proofs=40, wall_seconds=1200.0, gpus_used=[0, 1])
    before = await standing(h)
    h.clock.advance(wall_seconds + 100)
    runs = [{"gpus_used": [0, 1], "rate_per_hour": run_rates[0], "telemetry": None},
            {"gpus_used": [0], "rate_per_hour": run_rates[1], "telemetry": None}]
    await post_result(h, agent, "scaling", kind="scaling", proofs=proofs,
                      wall_seconds=wall_seconds, gpus_used=[0], runs=runs,
                      efficiency=run_rates[0] / (2 * run_rates[1]), bottleneck="gpu",
                      evidence=["gpus busy"])
    return agent, before


async def test_a_scaling_run_that_claims_other_rates_than_measured(h: Harness) -> None:
    # The one-GPU run made 20/h, the two-GPU one 120/h; the runs claim 300/h and 30/h
    # (an efficiency of 5, which would multiply every multi-GPU prediction).
    agent, before = await scaling_after_a_benchmark(h, (300.0, 30.0), 20, 3600.0)
    before.assert_unmoved_by(await standing(h), 9003)
    await assert_flagged(h, agent, "scaling", "implausible", "the coordinator measured")


async def test_an_honest_benchmark_moves_the_prediction(h: Harness) -> None:
    """The control: the same flow told truthfully does reach the ranking (its all-GPU
    benchmark is a measurement; the scaling run after it is not one)."""
    agent, before = await scaling_after_a_benchmark(h, (120.0, 72.0), 24, 1200.0)
    stored = h.store.find_result(agent.agent_id, "scaling")
    assert stored is not None and stored["flags"] == ""
    machines = [m["machine_id"] for m in h.store.measurements()]
    assert sorted(machines) == ["4243", "4244", "4245"]
    after = await standing(h)
    assert after.predictions == before.predictions  # the scaling run moved nothing
    _, basis, low, high = after.predictions[9003]
    assert low < 120.0 < high and "this machine x" in basis


async def test_a_bring_your_own_agent_is_watched_in_real_seconds(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """Beside a simulated fleet at 200x, a bring-your-own agent is a real machine: ten
    seconds seen are ten seconds, not 2000."""
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(OFFERS),
                    sim_time_scale=200.0)
    agent = await h.issue("garage-rig", min_rate=1.0)
    assert (await agent.hello())[0] == 200
    before = await standing(h)
    await benchmark(h, agent, 10)
    # Its timestamps agree with the stretched reading (6 real seconds, 1200 "simulated"),
    # so only watching it in real seconds tells the claim from the truth.
    await post_result(h, agent, "stretched", proofs=12, wall_seconds=1200.0,
                      started_at=h.clock() - 6.0)
    before.assert_unmoved_by(await standing(h), 9001)
    assert h.store.host_perf_row("garage-rig", "RTX 4090", 1) is None
    await assert_flagged(h, agent, "stretched", "implausible", "saw at most 10.0 s")
    await assert_flagged(h, agent, "stretched", "implausible",
                         "does not match finished_at - started_at (6.0 s)")


async def test_an_honest_result_still_counts(h: Harness) -> None:
    agent = await deploy(h, 9001)
    await benchmark(h, agent, 1300)
    await post_result(h, agent, "honest", proofs=20, wall_seconds=1200.0)
    stored = h.store.find_result(agent.agent_id, "honest")
    assert stored is not None and stored["flags"] == "" and stored["counts_for_host_perf"] == 1
    assert h.store.host_perf_row("4242", "RTX 4090", 1) is not None


def test_heartbeat_helper_is_the_wire_shape() -> None:
    # The attacks above speak the real contract: a heartbeat this file sends decodes.
    from vast_manager.protocol.codec import decode
    from vast_manager.protocol.messages import Heartbeat

    assert decode(Heartbeat, orjson.dumps(heartbeat_msg(1, "benchmarking"))).phase == (
        "benchmarking")


async def test_a_restart_mid_benchmark_is_not_held_against_the_host(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """The coordinator was down when the benchmark began, so it saw no benchmarking
    heartbeat: that is its blindness, not the host's lie. The window still bounds it."""
    h = await honest_fleet(aiohttp_client, tmp_path)
    agent = await deploy(h, 9001)
    await agent.heartbeat("warming")
    await h.client.close()  # the coordinator stops; the agent benchmarks meanwhile
    h.clock.advance(1300)
    h2 = await start(aiohttp_client, tmp_path, provider=h.provider, clock=h.clock)
    agent2 = h2.agent(agent.agent_id)
    await post_result(h2, agent2, "through-a-restart", proofs=20, wall_seconds=1200.0)
    stored = h2.store.find_result(agent.agent_id, "through-a-restart")
    assert stored is not None and stored["flags"] == "", stored["flag_reasons_json"]
    # ... but more than the window allows is still caught.
    h2.clock.advance(100)
    await post_result(h2, agent2, "too-long", proofs=20, wall_seconds=1200.0)
    stored = h2.store.find_result(agent.agent_id, "too-long")
    assert stored is not None and "implausible" in stored["flags"]
