"""The simulated cuzk host model: calibration targets, bottlenecks, determinism.

Every rate here is simulated. The offers are the ones the local catalog uses
(vast.ai field names); the targets are the operator's observed rates (the
calibration notes of sim/physics.py).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from vast_manager.common.hardware_facts import pcie_link_gbps
from vast_manager.sim.hardware import Profile, cpu_core_speed
from vast_manager.sim.physics import (
    GIB,
    PCE_EXTRACTION_TRANSIENT_BYTES,
    SRS_BYTES,
    SimConfig,
    Simulation,
    capacities,
    partitions_in_flight_limit,
    run_batch,
    water_fill,
)

OFFERS: dict[str, dict[str, Any]] = {
    "rtx4090": {
        "gpu_name": "RTX 4090",
        "num_gpus": 1,
        "cpu_name": "AMD EPYC 7502 32-Core Processor",
        "cpu_cores_effective": 32,
        "cpu_ram": 257000,
        "pci_gen": 4,
        "gpu_lanes": 16,
        "pcie_bw": 24.5,
    },
    "rtx5090_128gb": {
        "gpu_name": "RTX 5090",
        "num_gpus": 1,
        "cpu_name": "13th Gen Intel(R) Core(TM) i9-13900K",
        "cpu_cores_effective": 32,
        "cpu_ram": 128000,
        "pci_gen": 5,
        "gpu_lanes": 16,
        "pcie_bw": 50.0,
    },
    "rtx5070ti": {
        "gpu_name": "RTX 5070 Ti",
        "num_gpus": 1,
        "cpu_name": "AMD Ryzen Threadripper PRO 5975WX 32-Cores",
        "cpu_cores_effective": 64,
        "cpu_ram": 386000,
        "pci_gen": 5,
        "gpu_lanes": 16,
        "pcie_bw": 48.0,
    },
    "4x5060ti": {
        "gpu_name": "RTX 5060 Ti",
        "num_gpus": 4,
        "cpu_name": "AMD Ryzen 7 5800X 8-Core Processor",
        "cpu_cores_effective": 16,
        "cpu_ram": 257000,
        "pci_gen": 5,
        "gpu_lanes": 8,
        "pcie_bw": 26.0,
    },
    "4x3090_risers": {
        "gpu_name": "RTX 3090",
        "num_gpus": 4,
        "cpu_name": "AMD EPYC 7532 32-Core Processor",
        "cpu_cores_effective": 64,
        "cpu_ram": 515000,
        "pci_gen": 3,
        "gpu_lanes": 4,
        "pcie_bw": 3.8,
    },
    "2x4080s": {
        "gpu_name": "RTX 4080 Super",
        "num_gpus": 2,
        "cpu_name": "AMD EPYC 9354 32-Core Processor",
        "cpu_cores_effective": 64,
        "cpu_ram": 515000,
        "pci_gen": 4,
        "gpu_lanes": 16,
        "pcie_bw": 24.0,
    },
}

SEEDS = (1, 2, 3)


def profile(name: str, **sim: Any) -> Profile:
    offer = dict(OFFERS[name])
    if sim:
        offer["sim"] = sim
    return Profile.from_offer(offer)


def mean_rate(p: Profile, concurrency: int, config: SimConfig | None = None) -> float:
    """Mean simulated proofs/hour of the agent's benchmark (12 proofs) over a few seeds."""
    return statistics.mean(
        run_batch(p, 12, concurrency, config=config, seed=s).rate_per_hour for s in SEEDS
    )


# ----- pure pieces -----


def test_pcie_capacity_per_lane_matches_reference() -> None:
    assert pcie_link_gbps(4, 16) == pytest.approx(31.5, abs=0.1)
    assert pcie_link_gbps(4, 4) == pytest.approx(7.9, abs=0.1)
    assert pcie_link_gbps(3, 4) == pytest.approx(3.94, abs=0.01)


def test_profile_link_trains_to_what_the_card_supports() -> None:
    p = Profile.from_offer({"gpu_name": "RTX 5060 Ti", "pci_gen": 5, "gpu_lanes": 16})
    assert p.pcie_width == 8  # an x8 card in an x16 slot
    p = Profile.from_offer({"gpu_name": "RTX 3090", "pci_gen": 5, "gpu_lanes": 16})
    assert p.pcie_gen == 4
    p = Profile.from_offer({"gpu_name": "RTX 3090", "pci_gen": 3, "gpu_lanes": 4, "pcie_bw": 9.0})
    assert p.upload_gbps == pytest.approx(3.94, abs=0.01)  # pcie_bw above the link is ignored


def test_cpu_speed_table() -> None:
    assert cpu_core_speed("AMD EPYC 7543 32-Core Processor") == 1.0
    assert cpu_core_speed("AMD EPYC 9354 32-Core Processor") == 1.25
    assert cpu_core_speed("Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz") == 0.6
    assert cpu_core_speed("Some Future CPU") == 0.9
    assert Profile.from_offer({"cpu_name": "x", "sim": {"cpu_speed": 2.0}}).cpu_speed == 2.0


def test_water_fill_is_fair_and_capped() -> None:
    assert water_fill([1, 16, 16], 9) == [1, 4, 4]
    assert water_fill([1, 1], 8) == [1, 1]
    assert sum(water_fill([16] * 5, 10)) == pytest.approx(10)


def test_ram_bounds_partitions_in_flight() -> None:
    cfg = SimConfig()
    small = partitions_in_flight_limit(Profile.from_offer({"cpu_ram": 128000}), cfg)
    mid = partitions_in_flight_limit(Profile.from_offer({"cpu_ram": 257000}), cfg)
    big = partitions_in_flight_limit(Profile.from_offer({"cpu_ram": 515000}), cfg)
    # 20 by memory on 512 GB, held to [pipeline] max_parallel_synthesis (18).
    assert (small, mid, big) == (2, 8, 18)
    assert partitions_in_flight_limit(
        Profile.from_offer({"cpu_ram": 515000}), SimConfig(max_parallel_synthesis=40)
    ) == 20
    tight = SimConfig(total_budget_bytes=80 * GIB)
    assert partitions_in_flight_limit(Profile.from_offer({}), tight) == 0


# ----- calibration against the operator's observed rates -----


def test_single_4090_on_256gb_host_near_61_per_hour() -> None:
    assert 61.4 * 0.85 <= mean_rate(profile("rtx4090"), 2) <= 61.4 * 1.15


def test_5090_on_128gb_host_is_ram_limited_near_26_per_hour() -> None:
    p = profile("rtx5090_128gb")
    rate = mean_rate(p, 2)
    assert 25.9 * 0.85 <= rate <= 25.9 * 1.15
    r = run_batch(p, 12, 2, seed=1)
    assert r.bottleneck == "memory"
    assert r.utilisation.gpu_busy_mean < 0.3  # the GPU could do far more
    assert capacities(p).limit == "memory"


def test_5070ti_with_good_ram_70_to_100_per_hour() -> None:
    assert 70 <= mean_rate(profile("rtx5070ti"), 2) <= 100


def test_more_ram_is_faster_as_in_upstreams_table() -> None:
    rates = [
        mean_rate(Profile.from_offer(dict(OFFERS["rtx5070ti"], cpu_ram=ram)), 2)
        for ram in (128000, 257000, 515000)
    ]
    assert rates[0] < 0.5 * rates[1] < rates[1] < rates[2]


def test_4x5060ti_is_cpu_bound_near_39_per_hour() -> None:
    p = profile("4x5060ti")
    rate = mean_rate(p, 8)
    assert 38.8 * 0.85 <= rate <= 38.8 * 1.15
    r = run_batch(p, 12, 8, seed=1)
    assert r.bottleneck == "cpu"
    assert r.utilisation.cpu_busy > 0.9
    assert all(g < 0.5 for g in r.utilisation.gpu_busy)  # GPUs idle at least half the time
    one = mean_rate(p, 2, SimConfig(devices=(0,)))
    assert rate / (4 * one) < 0.5  # four GPUs barely beat one


def test_gen3_x4_risers_are_pcie_bound() -> None:
    p = profile("4x3090_risers")
    r = run_batch(p, 12, 8, seed=1)
    assert r.bottleneck == "pcie"
    assert r.utilisation.pcie_rx_fraction_max > 0.8  # transfers near the link's capacity
    assert min(r.utilisation.link_busy) > 0.85
    assert r.utilisation.gpu_busy_mean < 0.6  # GPUs wait for data
    assert capacities(p).limit == "pcie"


def test_2x4080super_scales_and_is_gpu_bound() -> None:
    p = profile("2x4080s")
    rate_all = mean_rate(p, 4)
    rate_one = mean_rate(p, 2, SimConfig(devices=(0,)))
    assert rate_all / (2 * rate_one) > 0.9
    r = run_batch(p, 12, 4, seed=1)
    assert r.bottleneck == "gpu"
    assert all(g > 0.9 for g in r.utilisation.gpu_busy)
    assert r.utilisation.cpu_busy < 0.9


# ----- noise, failures, heat, determinism -----


def test_same_seed_same_run_other_seed_other_run() -> None:
    p = profile("rtx4090")
    a = run_batch(p, 6, 2, seed=42)
    b = run_batch(p, 6, 2, seed=42)
    c = run_batch(p, 6, 2, seed=43)
    assert a == b
    assert a.records != c.records


def test_profile_seed_is_used_when_none_given() -> None:
    p = profile("rtx4090", seed=7)
    assert run_batch(p, 4, 2) == run_batch(p, 4, 2)


def test_noise_spreads_proof_times() -> None:
    quiet = run_batch(profile("rtx5070ti", noise_pct=0.0), 8, 1, seed=1)
    noisy = run_batch(profile("rtx5070ti", noise_pct=15.0), 8, 1, seed=1)
    spread = [
        max(r.prove_ms for r in x.records) - min(r.prove_ms for r in x.records)
        for x in (quiet, noisy)
    ]
    assert spread[0] < spread[1]


def test_failures_are_reported_and_counted() -> None:
    r = run_batch(profile("rtx4090", fail_rate=0.5), 12, 2, seed=3)
    failed = [x for x in r.records if not x.completed]
    assert 0 < len(failed) < 12
    assert all(x.prove_ms == 0 for x in failed)
    assert r.completed == 12 - len(failed)
    assert len({x.index for x in r.records}) == 12


def test_heat_degrades_the_rate() -> None:
    cool = run_batch(profile("rtx5070ti"), 24, 2, seed=1).rate_per_hour
    hot = run_batch(profile("rtx5070ti", degrade_pct_per_hour=200.0), 24, 2, seed=1)
    assert hot.rate_per_hour < cool * 0.9


def test_a_fresh_daemon_without_the_pce_is_slower() -> None:
    # The PCE is in memory only: a fresh daemon's first proofs take the slow
    # path while the extraction it starts competes with them.
    p = profile("rtx4090")
    fast = run_batch(p, 4, 2, seed=1).rate_per_hour
    slow = run_batch(p, 4, 2, seed=1, pce_cached=False).rate_per_hour
    assert slow < fast * 0.8


def test_completion_order_can_differ_from_submission_order() -> None:
    # A proof whose synthesis fails finishes before the one submitted ahead of it.
    r = run_batch(profile("rtx4090", fail_rate=0.5), 12, 3, seed=23)
    order = [x.index for x in r.records]
    assert sorted(order) == list(range(1, 13))
    assert order != sorted(order)


# ----- the daemon's memory budget and the PCE (docs/cuzk.md) -----


def test_first_proof_starts_an_extraction_and_the_pce_stays_in_memory() -> None:
    p = profile("rtx4090")
    sim = Simulation(p, seed=1)
    saved: list[float] = []
    sim.on_pce_saved = lambda: saved.append(sim.t)
    proof = sim.submit()
    sim.advance_to(60.0)  # the SRS loads, the proof is dispatched
    assert proof.registered_at is not None
    assert sim.extracting == 1 and not sim.pce_cached
    assert sim.budget_used_bytes() >= SRS_BYTES + PCE_EXTRACTION_TRANSIENT_BYTES
    sim.settle()
    assert proof.status == "completed" and proof.slow_path
    assert sim.pce_cached and sim.extracting == 0 and len(saved) == 1
    after = sim.submit()
    sim.settle()
    assert not after.slow_path
    # A new daemon has no PCE, whatever was saved to disk.
    assert not Simulation(p, seed=1).pce_cached


def test_every_proof_dispatched_before_the_pce_is_cached_starts_its_own_extraction() -> None:
    sim = Simulation(profile("rtx4090"), seed=1)
    for _ in range(3):
        sim.submit()
    sim.advance_to(60.0)
    assert sim.extracting == 3


def test_a_budget_below_the_srs_blocks_until_the_simulated_timeout() -> None:
    cfg = SimConfig(total_budget_bytes=30 * GIB, budget_block_timeout_s=600.0)
    sim = Simulation(profile("rtx4090"), cfg, seed=1)
    logs: list[tuple[str, str]] = []
    sim.on_log = lambda level, msg: logs.append((level, msg))
    proof = sim.submit()
    sim.advance_to(599.0)
    assert proof.status == "queued" and proof.registered_at is None
    assert any("exceeds total budget" in m for _, m in logs)
    sim.advance_to(601.0)
    assert proof.status == "failed" and "memory budget" in proof.error


def test_a_budget_with_no_room_for_a_partition_blocks_after_the_srs() -> None:
    cfg = SimConfig(total_budget_bytes=SRS_BYTES + 10 * GIB, budget_block_timeout_s=900.0)
    sim = Simulation(profile("rtx4090"), cfg, seed=1)
    proof = sim.submit()
    sim.advance_to(800.0)
    assert sim.srs_loaded and proof.partitions_done == 0 and proof.status == "running"
    sim.settle()
    assert proof.status == "failed"


def test_a_bad_input_fails_at_dispatch_and_a_wrong_identity_after_proving() -> None:
    sim = Simulation(profile("rtx4090"), seed=1, pce_cached=True, srs_loaded=True)
    bad = sim.submit(input_error="failed to parse C1 output wrapper JSON")
    assert bad.status == "failed" and bad.gpu_compute_s == 0.0 and bad.prove_ms == 0
    assert bad.error.startswith("C1 parse failed")
    wrong = sim.submit(identity_ok=False)
    sim.settle()
    assert wrong.status == "failed" and wrong.gpu_compute_s > 0 and wrong.prove_ms == 0
    assert "self-check" in wrong.error
    assert sim.total_failed == 2 and sim.total_completed == 0


def test_status_synthesis_max_concurrent_is_the_budget_over_9_gib() -> None:
    sim = Simulation(profile("rtx4090"), SimConfig(total_budget_bytes=250 * GIB))
    assert sim.max_concurrent == 250 // 9
