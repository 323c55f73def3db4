"""Offer ranking: each prediction basis, $/proof, sorting, bad hosts last."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from vast_manager.coordinator.decisions.ranking import DEFAULT_SCALING_EFFICIENCY, rank_offers


def offer(
    offer_id: int, machine_id: int, gpu: str, n: int, dph: float, **extra: Any
) -> dict[str, Any]:
    return {
        "id": offer_id,
        "machine_id": machine_id,
        "gpu_name": gpu,
        "num_gpus": n,
        "dph_total": dph,
        **extra,
    }


def perf(machine_id: int, gpu: str, n: int, median: float, samples: int = 3) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "gpu_name": gpu,
        "num_gpus": n,
        "best_rate_per_hour": median * 1.3,  # never used for prediction
        "median_rate_per_hour": median,
        "samples": samples,
        "last_rate_per_hour": median * 0.8,
    }


def by_id(ranked: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {o["id"]: o for o in ranked}


def test_same_machine_median() -> None:
    (o,) = rank_offers(
        [offer(1, 12345, "RTX 4090", 1, 0.5)],
        [perf(12345, "RTX 4090", 1, 61.4), perf(999, "RTX 4090", 1, 20.0)],
        set(),
        None,
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(61.4)
    assert o["predicted_usd_per_proof"] == pytest.approx(0.5 / 61.4, abs=1e-6)
    assert o["prediction_basis"] == "machine 12345: median 61.4/h over 3 runs"
    assert o["known"] is True
    assert o["bad_host"] is False


def test_same_model_and_count_elsewhere() -> None:
    (o,) = rank_offers(
        [offer(1, 5, "RTX 4090", 2, 0.9)],
        [
            perf(1, "RTX 4090", 2, 100.0),
            perf(2, "RTX 4090", 2, 120.0),
            perf(3, "RTX 4090", 2, 110.0),
            perf(4, "RTX 4090", 1, 61.4),  # other count: not this basis
        ],
        set(),
        None,
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(110.0)
    assert o["prediction_basis"] == "2x RTX 4090 on 3 other machines: median 110.0/h"
    assert o["known"] is False
    assert o["predicted_usd_per_proof"] == pytest.approx(0.9 / 110.0, abs=1e-6)


def test_single_gpu_rate_times_count_times_measured_efficiency() -> None:
    (o,) = rank_offers(
        [offer(1, 5, "RTX 5060 Ti", 4, 0.6)],
        [perf(1, "RTX 5060 Ti", 1, 15.0), perf(2, "RTX 5060 Ti", 1, 17.0)],
        set(),
        0.6,
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(16.0 * 4 * 0.6)
    basis = o["prediction_basis"]
    assert "median 16.0/h on 2 machines" in basis
    assert "x 4 GPUs x efficiency 0.60 (fleet measured)" in basis
    assert basis.endswith("= 38.4/h")


def test_single_gpu_basis_says_when_efficiency_is_the_default() -> None:
    (o,) = rank_offers(
        [offer(1, 5, "RTX 5060 Ti", 2, 0.4)],
        [perf(1, "RTX 5060 Ti", 1, 15.0)],
        set(),
        None,
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(15.0 * 2 * DEFAULT_SCALING_EFFICIENCY)
    assert "default, none measured yet" in o["prediction_basis"]


def test_single_gpu_basis_prefers_this_machines_own_single_gpu_rate() -> None:
    (o,) = rank_offers(
        [offer(1, 7, "RTX 4090", 2, 0.9)],
        [perf(7, "RTX 4090", 1, 50.0), perf(8, "RTX 4090", 1, 70.0)],
        set(),
        0.9,
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(50.0 * 2 * 0.9)
    assert "this machine's 1x 50.0/h" in o["prediction_basis"]
    assert o["known"] is True


def test_unknown_is_explore() -> None:
    (o,) = rank_offers(
        [offer(1, 5, "RTX 5090", 1, 0.7)],
        [perf(1, "RTX 4090", 1, 61.4)],
        set(),
        0.8,
    )
    assert o["predicted_rate_per_hour"] is None
    assert o["predicted_usd_per_proof"] is None
    assert o["prediction_basis"].startswith("explore")
    assert o["known"] is False


def test_gpu_names_compare_loosely() -> None:
    (o,) = rank_offers(
        [offer(1, 5, "rtx  4090", 1, 0.5)], [perf(1, "RTX 4090", 1, 60.0)], set(), None
    )
    assert o["predicted_rate_per_hour"] == pytest.approx(60.0)


def test_sorting_knowns_by_cost_then_unknowns_then_bad_hosts() -> None:
    offers = [
        offer(1, 101, "RTX 5090", 1, 0.30),  # unknown, cheap
        offer(2, 102, "RTX 4090", 1, 0.60),  # 0.6/60 = 0.0100
        offer(3, 103, "RTX 4090", 1, 0.30),  # 0.3/60 = 0.0050, but a bad host
        offer(4, 104, "RTX 5070 Ti", 1, 0.20),  # 0.2/40 = 0.0050
        offer(5, 105, "H100 SXM", 1, 2.00),  # unknown, dear
        offer(6, 106, "RTX 4090", 1, 0.45),  # 0.45/60 = 0.0075
    ]
    host_perf = [perf(900, "RTX 4090", 1, 60.0), perf(901, "RTX 5070 Ti", 1, 40.0)]
    ranked = rank_offers(offers, host_perf, {103}, None)
    assert [o["id"] for o in ranked] == [4, 6, 2, 1, 5, 3]
    assert by_id(ranked)[3]["bad_host"] is True
    assert all(not o["bad_host"] for o in ranked[:-1])


def test_does_not_modify_inputs() -> None:
    offers = [offer(1, 1, "RTX 4090", 1, 0.5)]
    host_perf = [perf(1, "RTX 4090", 1, 60.0)]
    before = copy.deepcopy((offers, host_perf))
    ranked = rank_offers(offers, host_perf, set(), None)
    assert (offers, host_perf) == before
    assert ranked[0] is not offers[0]
    assert ranked[0]["id"] == 1


def test_rows_without_a_usable_median_are_ignored() -> None:
    bad = perf(1, "RTX 4090", 1, 60.0)
    bad["median_rate_per_hour"] = None
    zero = perf(2, "RTX 4090", 1, 0.0)
    (o,) = rank_offers([offer(1, 1, "RTX 4090", 1, 0.5)], [bad, zero], set(), None)
    assert o["prediction_basis"].startswith("explore")


def test_bad_host_ids_as_text_or_numbers() -> None:
    offers = [offer(1, 101, "RTX 4090", 1, 0.5), offer(2, 102, "RTX 4090", 1, 0.6)]
    for bad in ({"101"}, {101}):
        ranked = rank_offers(offers, [], bad, None)
        assert [(o["id"], o["bad_host"]) for o in ranked] == [(2, False), (1, True)]


# --- the instance's share ----------------------------------------------------------------


def host(cpu_ram_mb: int, cores: int, effective: float | None, **extra: Any) -> dict[str, Any]:
    return {"cpu_ram": cpu_ram_mb, "cpu_cores": cores, "cpu_cores_effective": effective, **extra}


def test_every_offer_carries_its_instances_share_and_a_too_small_one_is_flagged() -> None:
    offers = [
        offer(1, 11, "RTX 4090", 1, 0.35, **host(515000, 256, 32.0)),  # 1 of 8 GPUs
        offer(2, 12, "RTX 4090", 2, 0.80, **host(257000, 64, 64.0)),  # the whole host
        offer(3, 13, "RTX 4090", 1, 0.30, **host(515000, 0, 32.0, gpu_frac=0.125)),
        offer(4, 14, "RTX 4090", 1, 0.20, cpu_ram=515000),  # says nothing of its share
    ]
    ranked = by_id(rank_offers(offers, [], set(), None, min_instance_ram_gb=128))
    small = ranked[1]
    assert (small["instance_ram_gb"], small["instance_cpu_cores"]) == (64.4, 32.0)
    assert small["instance_share"] == "515 GB x 32/256 cores = 64.4 GB"
    assert small["too_small"] is True and small["predicted_rate_per_hour"] is None
    assert small["prediction_basis"].startswith("not predicted: its instance would get about 64")
    whole = ranked[2]
    assert whole["too_small"] is False and whole["too_small_reason"] is None
    assert whole["instance_share"] == "257 GB x 64/64 cores = 257.0 GB"
    # No cores listed: gpu_frac gives the fraction.
    assert ranked[3]["instance_share"] == "515 GB x gpu_frac 0.125 = 64.4 GB"
    unknown = ranked[4]
    assert unknown["instance_ram_gb"] is None and unknown["too_small"] is True
    assert "cannot be promised" in unknown["too_small_reason"]
    # Those that can run first; then the too small ones.
    order = [o["id"] for o in rank_offers(offers, [], set(), None, min_instance_ram_gb=128)]
    assert order[0] == 2 and set(order[1:]) == {1, 3, 4}
    # 0 turns the check off.
    assert not any(o["too_small"] for o in rank_offers(offers, [], set(), None))


def test_predictions_from_other_machines_keep_to_the_offers_ram_class() -> None:
    # Two machines measured the same GPU: one whose instance had 512 GB, one 150 GB.
    rows = [perf(21, "RTX 4090", 1, 90.0), perf(22, "RTX 4090", 1, 30.0)]
    ram = {(21, 1): 512.0, (22, 1): 150.0}
    lean = offer(1, 31, "RTX 4090", 1, 0.3, **host(150000, 32, 32.0))
    rich = offer(2, 32, "RTX 4090", 1, 0.6, **host(515000, 64, 64.0))
    mid = offer(3, 33, "RTX 4090", 1, 0.4, **host(257000, 32, 32.0))
    ranked = by_id(rank_offers([lean, rich, mid], rows, set(), None,
                               min_instance_ram_gb=128, machine_ram_gb=ram))
    assert ranked[1]["predicted_rate_per_hour"] == 30.0
    assert "with under 240 GB of RAM" in ranked[1]["prediction_basis"]
    assert ranked[2]["predicted_rate_per_hour"] == 90.0
    assert "with 360 GB or more of RAM" in ranked[2]["prediction_basis"]
    assert ranked[3]["predicted_rate_per_hour"] is None  # nobody measured 240-360 GB
    assert ranked[3]["prediction_basis"] == (
        "explore: no measurements of 1x RTX 4090 with 240-360 GB of RAM yet")
    # Without recorded RAM the measurements count as before.
    plain = by_id(rank_offers([mid], rows, set(), None, min_instance_ram_gb=128))
    assert plain[3]["predicted_rate_per_hour"] == 60.0
