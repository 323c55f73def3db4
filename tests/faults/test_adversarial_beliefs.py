"""Hostile hosts, second round: no rate believed on a host's word alone.

Each attack of the second probe is replayed against the real app (``create_app`` under
aiohttp's test client, an injected clock) by an agent holding its own, legitimately
issued key, and shown held: not counted, refused or bounded. Before and after, the test
reads ``GET /api/host-perf`` and ``GET /api/offers`` (``Standing``); a held result moves
neither. docs/reliability.md lists each attack with its rule and numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.decisions import belief
from vast_manager.coordinator.discovery.measurements import (
    MAX_GPUS,
    Measurement,
    weigh_sources,
)
from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.local.provider import agent_environment

from support.belief_support import (
    bench_hb,
    deploy,
    reasons,
    run_watched,
    send_result,
    standing,
    stored,
)
from support.coord_support import ADMIN, Harness, database_before_migration, start
from support.fakes_provider import FakeProvider, offer

OFFERS = [
    offer(9001, 4242, dph_total=0.40),  # the attacker's 1x RTX 4090
    offer(9002, 4243, dph_total=0.40),  # its twin, measured honestly at 60/h
    offer(9003, 4244, num_gpus=2, dph_total=0.80),
    offer(9004, 4250, num_gpus=4, dph_total=1.60),
    offer(9005, 4245, gpu_name="RTX 3090", dph_total=0.20),  # honest at 40/h
    offer(9006, 4251, gpu_name="RTX 3090", dph_total=0.30),  # the attacker's 3090
    offer(9007, 4252, gpu_name="RTX 5060 Ti", dph_total=0.11),  # min 13.75/h
]


async def honest_fleet(aiohttp_client: Any, tmp_path: Path) -> Harness:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(OFFERS))
    for offer_id, rate in ((9002, 60.0), (9005, 40.0)):
        agent = await deploy(h, offer_id, min_rate=10.0)
        wall = await run_watched(h, agent, 24, 2 * 3600 / rate)
        data = await send_result(h, agent, f"honest-{offer_id}", rate=rate, wall=wall,
                                 benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
        assert data["directive"]["action"] == "continue", data
        await agent.heartbeat("proving")
    return h


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path) -> Harness:
    return await honest_fleet(aiohttp_client, tmp_path)


# --- acceptance: honest counted at once, 4x its twin held until confirmed ---------------


async def test_an_honest_benchmark_at_the_predicted_rate_is_counted_at_once(
    h: Harness,
) -> None:
    agent = await deploy(h, 9001, min_rate=10.0)
    wall = await run_watched(h, agent, 24, 120.0)  # 60/h, its twin's rate
    data = await send_result(h, agent, "honest", rate=60.0, wall=wall,
                             benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    assert data["directive"]["action"] == "continue"
    assert data["directive"]["benchmark_id"] is None  # answered: nothing more asked
    row = stored(h, agent, "honest")
    assert row["counts_for_host_perf"] == 1 and row["verdict"] == "keep", row
    assert row["flags"] == ""
    _, perf = await h.admin("GET", "/api/host-perf")
    assert any(p["machine_id"] == "4242" for p in perf)


async def test_four_times_its_twin_is_held_until_a_directed_rebenchmark_agrees(
    h: Harness,
) -> None:
    before = await standing(h)
    agent = await deploy(h, 9001, min_rate=10.0)
    first_id = agent.benchmark_id  # type: ignore[attr-defined]
    wall = await run_watched(h, agent, 24, 30.0)  # 240/h: 4x its twin, under 270/h
    data = await send_result(h, agent, "claim", rate=240.0, wall=wall, benchmark_id=first_id)
    row = stored(h, agent, "claim")
    assert row["flags"] == "unconfirmed", row
    assert row["counts_for_host_perf"] == 0 and row["verdict"] is None
    assert any("what its GPU's memory bandwidth allows (135.0/h per GPU)" in r
               or "90th percentile" in r for r in reasons(row)), reasons(row)
    # Held: no keep verdict, no rate on the instance, nothing moved.
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["rate_per_hour"] is None
    after = await standing(h)
    assert after.perf == before.perf and after.predictions == before.predictions
    # The coordinator asks for a re-benchmark now, with a fresh id the result must carry.
    directive = data["directive"]
    assert directive["action"] == "benchmark"
    confirm_id = directive["benchmark_id"]
    assert confirm_id.startswith("bm_") and confirm_id != first_id
    assert h.store.events_of_kind("held")
    # The same claim again under the old id, or none: not a confirmation.
    await agent.heartbeat("proving")
    wall = await run_watched(h, agent, 24, 30.0)
    await send_result(h, agent, "replayed-id", rate=240.0, wall=wall, benchmark_id=first_id)
    assert stored(h, agent, "replayed-id")["counts_for_host_perf"] == 0
    assert (await standing(h)).predictions == before.predictions
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["state"] != "terminating"  # one try of two spent
    confirm_id = inst["directed_benchmark_id"]
    # The directed re-benchmark, watched for its whole length, agrees: now it counts.
    await agent.heartbeat("proving")
    wall = await run_watched(h, agent, 24, 31.0)
    data = await send_result(h, agent, "confirm", rate=232.0, wall=wall,
                             benchmark_id=confirm_id)
    row = stored(h, agent, "confirm")
    assert row["counts_for_host_perf"] == 1 and row["verdict"] == "keep", row
    assert h.store.events_of_kind("confirmed")
    after = await standing(h)
    assert any(p["machine_id"] == "4242" for p in after.perf)
    assert after.predictions != before.predictions


async def test_a_confirmation_not_watched_whole_does_not_confirm(h: Harness) -> None:
    agent = await deploy(h, 9001, min_rate=10.0)
    wall = await run_watched(h, agent, 24, 30.0)
    data = await send_result(h, agent, "claim", rate=240.0, wall=wall,
                             benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    confirm_id = data["directive"]["benchmark_id"]
    # One heartbeat, then silence for the whole run: the claim is not confirmed.
    await agent.post("/v1/heartbeat", bench_hb(agent, done=0, total=24, recent=[],
                                                completed=0))
    h.clock.advance(400)
    await send_result(h, agent, "unwatched", rate=240.0, wall=360.0, benchmark_id=confirm_id)
    row = stored(h, agent, "unwatched")
    assert row["counts_for_host_perf"] == 0 and "unconfirmed" in row["flags"]
    assert any("heard nothing from it for 400 s" in r for r in reasons(row)), reasons(row)


# --- attack 1: a consistent lie under the old global ceiling -----------------------------


async def test_a_5060_ti_claiming_290_an_hour_is_refused_by_its_models_ceiling(
    h: Harness,
) -> None:
    before = await standing(h)
    agent = await deploy(h, 9007, min_rate=13.75)
    await agent.heartbeat("benchmarking")
    h.clock.advance(8500)
    data = await send_result(h, agent, "forged", rate=682 * 3600 / 8472, wall=8472.0,
                             benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    row = stored(h, agent, "forged")
    assert "implausible" in row["flags"] and row["counts_for_host_perf"] == 0
    assert any("beyond the ceiling of 120/h (120/h a GPU of RTX 5060 Ti)" in r
               for r in reasons(row)), reasons(row)
    assert data["directive"]["action"] == "terminate"
    after = await standing(h)
    assert after.perf == before.perf


async def test_leaving_progress_out_while_benchmarking_is_judged_as_no_progress(
    h: Harness,
) -> None:
    agent = await deploy(h, 9007, min_rate=13.75)
    action = "continue"
    for _ in range(200):
        status, directive = await agent.heartbeat("benchmarking")  # progress: null
        assert status == 200
        action = directive["action"]
        if action == "terminate":
            break
        h.clock.advance(60)
    assert action == "terminate"
    assert directive["reason"].startswith("early verdict: no proof completed in")


# --- attack 2: one result moving every prediction, samples without asking ------------------


async def test_a_3090_claiming_six_times_its_twin_moves_no_prediction(h: Harness) -> None:
    before = await standing(h)
    agent = await deploy(h, 9006, min_rate=10.0)
    wall = await run_watched(h, agent, 24, 2 * 3600 / 238.7)
    await send_result(h, agent, "claim", rate=238.7, wall=wall,
                      benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    row = stored(h, agent, "claim")
    assert row["flags"] == "unconfirmed" and row["counts_for_host_perf"] == 0, row
    after = await standing(h)
    assert after.perf == before.perf and after.predictions == before.predictions


async def test_results_nobody_asked_for_are_stored_not_counted(h: Harness) -> None:
    """Staying in benchmarking and sending a result every stretch: the first answers the
    benchmark the coordinator asked for, the other six are stored, flagged, not counted."""
    agent = await deploy(h, 9006, min_rate=10.0)
    for i in range(7):
        wall = await run_watched(h, agent, 4, 180.0)
        await send_result(h, agent, f"r{i}", rate=40.0, wall=wall,
                          benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    rows = [stored(h, agent, f"r{i}") for i in range(7)]
    assert [r["counts_for_host_perf"] for r in rows] == [1, 0, 0, 0, 0, 0, 0]
    assert all(r["flags"] == "undirected" for r in rows[1:])
    assert all(r["verdict"] is None for r in rows[1:])
    (perf,) = [p for p in h.store.host_perf() if p["machine_id"] == "4251"]
    assert perf["samples"] == 1


async def test_an_older_agent_without_ids_still_counts_what_was_asked(h: Harness) -> None:
    """An agent that sends no benchmark_id (older than directed benchmarks): its first
    benchmark and each the operator asks for count, once each."""
    agent = await deploy(h, 9006, min_rate=10.0)
    wall = await run_watched(h, agent, 4, 180.0)
    await send_result(h, agent, "old-1", rate=40.0, wall=wall)
    wall = await run_watched(h, agent, 4, 180.0)
    await send_result(h, agent, "old-2", rate=40.0, wall=wall)
    await agent.heartbeat("proving")  # back to proving, as the agent goes after a benchmark
    await h.rebenchmark(agent)
    assert (await agent.heartbeat("proving"))[1]["action"] == "benchmark"
    wall = await run_watched(h, agent, 4, 180.0)
    await send_result(h, agent, "old-3", rate=40.0, wall=wall)
    counted = [stored(h, agent, f"old-{i}")["counts_for_host_perf"] for i in (1, 2, 3)]
    assert counted == [1, 0, 1]


# --- attack 3: a bring-your-own hello setting its own GPU count ------------------------------


async def test_a_hello_listing_more_gpus_than_declared_is_refused(h: Harness) -> None:
    agent = await h.issue("rig")  # --gpus defaults to 1
    status, data = await agent.hello(gpus=64)
    assert status == 400 and data["field"] == "host.gpus", data
    assert data["message"] == ("This agent was issued for 1 GPU(s); its hello lists 64. "
                               "Issue a new agent with 'vast-manager agents issue --gpus 64'.")
    four = await h.issue("rig-4", gpus=4)
    assert (await four.hello(gpus=4))[0] == 200
    assert (await four.hello(boot_id="boot-2", gpus=5))[0] == 400
    status, data = await h.admin("POST", "/api/agents", {"label": "rig-3090", "gpus": 1,
                                                         "gpu_model": "RTX 3090"})
    assert status == 200, data
    liar = h.agent(data["agent_id"])
    status, data = await liar.hello(gpus=1)  # lists an RTX 4090
    assert status == 400 and "issued for RTX 3090 GPUs" in data["message"], data
    status, data = await h.admin("POST", "/api/agents", {"label": "x", "gpus": 65})
    assert status == 400 and data["field"] == "gpus"


async def test_an_agent_issued_before_declarations_may_list_at_most_16(h: Harness) -> None:
    agent = await h.issue("legacy")
    await h.store.write(lambda tx: tx._exec(
        "update agents set max_gpus = null where agent_id = ?", (agent.agent_id,)))
    status, data = await agent.hello(gpus=64)
    assert status == 400 and "before GPUs were declared (at most 16)" in data["message"]
    assert (await agent.hello(gpus=16))[0] == 200


# --- attack 4: zero-length proof times -----------------------------------------------------


@pytest.mark.parametrize("seconds", [0.0, 1.0])
async def test_proof_times_below_the_floor_are_implausible(h: Harness, seconds: float) -> None:
    before = await standing(h)
    agent = await deploy(h, 9001, min_rate=10.0)
    wall = await run_watched(h, agent, 12, 600.0)
    await send_result(h, agent, "fast", rate=45.0, wall=wall, proof_seconds=[seconds] * 45,
                      benchmark_id=agent.benchmark_id)  # type: ignore[attr-defined]
    row = stored(h, agent, "fast")
    assert "implausible" in row["flags"] and row["counts_for_host_perf"] == 0
    floor = belief.min_proof_seconds("RTX 4090")
    assert any(f"below the {floor:.1f} s a proof needs" in r for r in reasons(row))
    assert (await standing(h)).perf == before.perf


def test_the_floors_and_ceilings_follow_memory_bandwidth() -> None:
    assert belief.ceiling_per_gpu("RTX 5070 Ti", 300.0) == pytest.approx(240.0)
    assert belief.ceiling_per_gpu("RTX 5060 Ti", 300.0) == pytest.approx(120.0)
    assert belief.ceiling_per_gpu("NVIDIA GeForce RTX 4090", 300.0) == pytest.approx(270.0)
    assert belief.ceiling_per_gpu("H100 SXM", 300.0) == 300.0  # the global cap still holds
    assert belief.min_proof_seconds("RTX 5070 Ti") == pytest.approx(7.5)
    assert belief.ceiling_per_gpu("H100 SXM", None) > 300.0  # unset: the card's own
    # A model the table lacks: the offer's gpu_mem_bw through the same formula (at most
    # the fastest known card's), else the slowest known card, never a global 300/h; only
    # the operator's own VM_MAX_RATE_PER_GPU_PER_HOUR, set, stands in for what no table
    # or offer bounds.
    assert belief.ceiling_per_gpu("Unknown 9000", None, 448.0) == pytest.approx(120.0)
    assert belief.ceiling_per_gpu("Unknown 9000", 300.0, 448.0) == pytest.approx(120.0)
    assert belief.ceiling_per_gpu("Unknown 9000", 300.0, 1e9) == 300.0
    assert belief.ceiling_per_gpu("Unknown 9000", None) == pytest.approx(
        2 * 120 * belief.MIN_KNOWN_MEM_BW_GBPS / 896)
    assert belief.ceiling_per_gpu("Unknown 9000", None) < 100.0
    assert belief.ceiling_per_gpu(None, None) < 100.0  # a host that names no GPU
    assert belief.ceiling_per_gpu("Unknown 9000", 1000.0) == 1000.0  # the operator's word
    assert belief.min_proof_seconds("Unknown 9000") == pytest.approx(2.0, rel=0.01)  # H100 SXM


# --- attack 6: imports ---------------------------------------------------------------------


def line(machine: str, rate: float, *, at: float, **offer_fields: Any) -> bytes:
    fields = {**offer(1, 1), "machine_id": machine, **offer_fields}
    return orjson.dumps({"machine_id": machine, "offer": fields, "rate_per_hour": rate,
                         "measured_at": at})


async def import_raw(h: Harness, body: bytes, *, dry_run: bool = False) -> tuple[int, Any]:
    path = "/api/hosts/import" + ("?dry_run=1" if dry_run else "")
    resp = await h.client.post(path, data=body, headers={
        **ADMIN, "Content-Type": "application/x-ndjson"})
    return resp.status, await resp.json()


@pytest.mark.parametrize(("body", "field", "words"), [
    (lambda now: line("m1", 50.0, at=now, num_gpus=1_000_000_000), "offer.num_gpus",
     "more than the 16 GPUs"),
    (lambda now: line("m1", 50.0, at=0.0), "measured_at", "more than 730 days ago"),
    (lambda now: line("m1", 50.0, at=now, note_x="x" * (15 * 1024 * 1024)), None,
     "longer than 65536 bytes"),
    (lambda now: line("m1", 50.0, at=now, note_x="x" * 2000), "offer.note_x",
     "longer than 1024 characters"),
    (lambda now: line("m1", 50.0, at=now, deep=[[[[[1]]]]]), "offer.deep.0.0",
     "nesting deeper than 4 levels"),
    (lambda now: b'{"machine_id": "m", "offer": ' + b"[" * 300 + b"]" * 300 + b"}", "offer.0.0.0",
     "nesting deeper"),
    (lambda now: b"[" * 1100 + b"]" * 1100, None, "not valid JSON"),
    (lambda now: line("m1", 280.0, at=now), "rate_per_hour", "(270/h, the fleet's own"),
])
async def test_import_bounds_answer_a_clean_400_and_write_nothing(
    h: Harness, body: Any, field: str | None, words: str,
) -> None:
    before = h.store.count_rows()["measurements"]
    status, data = await import_raw(h, body(h.clock()))
    assert status == 400, data
    assert data["error"] == "invalid_measurement" and data["line"] == 1
    assert data.get("field") == field, data
    assert words in data["message"], data["message"]
    assert h.store.count_rows()["measurements"] == before


async def test_a_dry_run_shows_the_ranking_move_and_writes_nothing(h: Harness) -> None:
    before = h.store.count_rows()["measurements"]
    body = b"\n".join(line(str(4250 + i), 230.0 * 4, at=h.clock() - 60, num_gpus=4)
                      for i in range(1))
    status, data = await import_raw(h, body, dry_run=True)
    assert status == 200, data
    assert data["dry_run"] is True and data["measurements"] == 1
    assert h.store.count_rows()["measurements"] == before
    moved = {m["offer_id"]: m for m in data["moves"]}
    assert 9004 in moved and moved[9004]["rate_after"] > moved[9004]["rate_before"]


def test_imported_rates_disagreeing_with_the_fleets_own_weigh_nothing() -> None:
    own = Measurement("m1", parse_offer(offer(1, 1)), 40.0, 1.0, "fleet")
    agreeing = Measurement("m1", parse_offer(offer(1, 1)), 50.0, 2.0, "imported")
    pinned = Measurement("m1", parse_offer(offer(1, 1)), 292.7, 3.0, "imported")
    elsewhere = Measurement("m2", parse_offer(offer(2, 2)), 292.7, 3.0, "imported")
    assert weigh_sources([own, agreeing, pinned, elsewhere]) == [own, agreeing, elsewhere]
    assert MAX_GPUS == 16


# --- attack 8: local agents inherit the coordinator's environment ---------------------------


def test_local_agents_get_only_what_an_agent_needs() -> None:
    env = agent_environment({
        "PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8", "VM_BENCH_PROOFS": "4",
        "VM_ADMIN_TOKEN": "t" * 32, "VM_FLEET_SECRET": "s" * 64, "VAST_API_KEY": "k" * 64,
        "AWS_SECRET_ACCESS_KEY": "a", "VM_SIM_TIME_SCALE": "60",
    })
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C.UTF-8",
                   "VM_BENCH_PROOFS": "4", "VM_SIM_TIME_SCALE": "60"}


async def test_a_spawned_local_agent_holds_none_of_the_coordinators_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The local provider's real spawn: the environment the agent process starts with."""
    import subprocess
    import sys

    from vast_manager.coordinator.providers.local import provider as local

    for name, value in (("VM_ADMIN_TOKEN", "t" * 32), ("VM_FLEET_SECRET", "s" * 64),
                        ("VAST_API_KEY", "k" * 64), ("VM_BENCH_PROOFS", "4")):
        monkeypatch.setenv(name, value)
    seen: list[dict[str, str]] = []
    real_popen = subprocess.Popen

    def popen(args: Any, *rest: Any, **kw: Any) -> Any:
        if "vast_manager.sim.agent_run" not in list(args):
            return real_popen(args, *rest, **kw)  # the simulator's helpers run as they are
        seen.append(dict(kw["env"]))  # the agent itself is not needed: a sleeper stands in
        return real_popen([sys.executable, "-c", "import time; time.sleep(30)"], **kw)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    provider = local.LocalProvider(tmp_path / "instances")
    try:
        offer_row = parse_offer(provider.offers[min(provider.offers)])
        await provider.create_instance(offer_row, label="vm:x:ag_1", disk_gb=10, env={
            "VM_AGENT_ID": "ag_" + "1" * 20, "VM_AGENT_KEY": "a" * 64})
    finally:
        await provider.close()
    (env,) = seen
    assert not {"VM_ADMIN_TOKEN", "VM_FLEET_SECRET", "VAST_API_KEY"} & set(env)
    assert env["VM_BENCH_PROOFS"] == "4" and env["VM_AGENT_ID"] == "ag_" + "1" * 20
    assert "PATH" in env
    assert env["PYTHONUNBUFFERED"] == "1"  # the simulated tools stream their lines


def test_beyond_belief_reasons_quote_their_numbers() -> None:
    refs = belief.References
    assert belief.beyond_belief(100.0, 1, refs(expected_high=40.0)) == (
        "100.0 proofs/h is above 1.75x the rate model's 90th percentile for this "
        "hardware (40.0/h): 70.0/h")
    assert belief.beyond_belief(69.0, 1, refs(expected_high=40.0)) is None
    # A twin is no hold line: it only bounds what the model learns.
    assert belief.beyond_belief(69.0, 1, refs(expected_high=40.0,
                                              twin_median_per_gpu=20.0)) is None
    assert belief.beyond_belief(61.0, 1, refs(twin_median_per_gpu=40.0)) is None
    assert belief.learn_bound(1, refs(expected_high=40.0, twin_median_per_gpu=20.0)) == 20.0
    assert belief.learn_bound(2, refs(expected_high=60.0, twin_median_per_gpu=40.0)) == 60.0
    assert belief.learn_bound(1, refs()) is None
    assert belief.beyond_belief(61.0, 1, refs(own_first_per_gpu=40.0)) is not None
    assert belief.beyond_belief(59.0, 1, refs(own_first_per_gpu=40.0)) is None
    # Before any model: its card's bandwidth (a 4090's 135/h a GPU: held above 168.75/h).
    assert belief.beyond_belief(340.0, 2, refs(gpu_bound_per_gpu=135.0)) == (
        "340.0 proofs/h is above 1.25x what its GPU's memory bandwidth allows (135.0/h per "
        "GPU): 337.5/h")
    # No confident basis: above twice the interval itself.
    assert belief.beyond_belief(81.0, 1, refs(expected_high=40.0,
                                              novel=("no L4 measured yet",))) is not None
    assert belief.beyond_belief(79.0, 1, refs(expected_high=40.0,
                                              novel=("no L4 measured yet",))) is None
    assert belief.agrees(100.0, 100.0) and belief.agrees(81.0, 100.0)
    assert not belief.agrees(121.0, 100.0) and not belief.agrees(79.0, 100.0)
    assert belief.counted_rate(110.0, 100.0) == 100.0
    assert math.isclose(belief.REFERENCE_RATE_PER_GPU, 120.0)


def test_migration_9_asks_for_the_benchmark_an_instance_still_owes(tmp_path: Path) -> None:
    """An instance upgraded while waiting for its first rate gets its benchmark directed
    (else its first result would count for nothing); one with a rate gets none."""
    from vast_manager.coordinator.store.writer import Store

    path = tmp_path / "old.sqlite"
    db = database_before_migration(path, 9)
    for instance_id, rate in ((1, None), (2, 40.0)):
        db.table("instances").insert({"id": instance_id, "agent_id": f"ag_{instance_id:020d}",
                                "kind": "deployed", "state": "benchmarking",
                                "rate_per_hour": rate, "created_at": 1.0, "updated_at": 1.0})
    db.conn.close()
    store = Store(path)
    try:
        owed, measured = store.get_instance(1), store.get_instance(2)
        assert owed is not None and measured is not None
        assert str(owed["directed_benchmark_id"]).startswith("bm_")
        assert len(owed["directed_benchmark_id"]) == 35
        assert owed["directed_benchmark_kind"] == "first"
        assert measured["directed_benchmark_id"] is None
    finally:
        store.close()
