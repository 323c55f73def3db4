"""Offer ranking: the rate model's predictions with their intervals, $/proof, the flags
(bad host, too small a share, known), and the order. Every rate here is simulated."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from vast_manager.coordinator.discovery.ranking import rank_offers
from vast_manager.coordinator.discovery.structural_model import RateModel, fit_rate_model
from vast_manager.coordinator.offers import Offer, parse_offer

from support.discovery_support import measurements

MODEL: RateModel = fit_rate_model(measurements(120, seed=3))


def offer(offer_id: int, machine_id: int, gpu: str, n: int, dph: float,
          **extra: Any) -> dict[str, Any]:
    base = {
        "id": offer_id, "machine_id": machine_id, "gpu_name": gpu, "num_gpus": n,
        "dph_total": dph, "cpu_name": "AMD EPYC 7543 32-Core Processor", "cpu_cores": 64,
        "cpu_cores_effective": 64.0, "cpu_ram": 515_000, "pci_gen": 4, "gpu_lanes": 16,
        "pcie_bw": 24.0, "inet_down": 900.0,
    }
    return {**base, **extra}


def parsed(offers: list[dict[str, Any]]) -> list[Offer]:
    """The offers as a provider hands them out (vast.ai's JSON parsed)."""
    return [parse_offer(o) for o in offers]


def by_id(ranked: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {o["id"]: o for o in ranked}


def test_every_offer_gets_the_models_median_interval_and_basis() -> None:
    offers = [offer(1, 101, "RTX 4090", 1, 0.40), offer(2, 102, "RTX 3090", 2, 0.45)]
    ranked = by_id(rank_offers(parsed(offers), MODEL, set(), set()))
    for o in offers:
        out = ranked[o["id"]]
        pred = MODEL.predict(parse_offer(o))
        assert out["predicted_rate_per_hour"] == pytest.approx(pred.rate_per_hour, rel=1e-3)
        assert out["predicted_rate_low"] == pytest.approx(pred.rate_low, rel=1e-3)
        assert out["predicted_rate_high"] == pytest.approx(pred.rate_high, rel=1e-3)
        assert out["predicted_rate_low"] < out["predicted_rate_per_hour"] < \
            out["predicted_rate_high"]
        assert out["predicted_usd_per_proof"] == pytest.approx(
            o["dph_total"] / out["predicted_rate_per_hour"], abs=1e-6)
        assert out["prediction_basis"] == pred.basis
        assert out["prediction_bottleneck"] in ("gpu", "cpu", "pcie", "memory")
        # The factors are the model's exact shares: their product is prediction/reference.
        product = math.prod(f["factor"] for f in out["prediction_factors"])
        assert product * pred.reference_rate_per_hour == pytest.approx(pred.rate_per_hour,
                                                                       rel=1e-3)


def test_known_is_a_machine_with_measurements_of_its_own() -> None:
    offers = [offer(1, 101, "RTX 4090", 1, 0.40), offer(2, 102, "RTX 4090", 1, 0.40)]
    ranked = by_id(rank_offers(parsed(offers), MODEL, set(), {"101"}))
    assert ranked[1]["known"] is True and ranked[2]["known"] is False


def test_an_offer_the_model_cannot_read_says_which_field() -> None:
    broken = offer(1, 101, "RTX 4090", 1, 0.40)
    del broken["cpu_cores"], broken["cpu_cores_effective"]
    (o,) = rank_offers(parsed([broken]), MODEL, set(), set())
    assert o["predicted_rate_per_hour"] is None and o["predicted_rate_low"] is None
    assert o["prediction_basis"].startswith("not predicted: cpu_cores_effective")


def test_order_is_predicted_cost_per_proof_then_unpredicted_then_small_then_bad() -> None:
    cheap = offer(1, 101, "RTX 4090", 1, 0.20)
    dear = offer(2, 102, "RTX 4090", 1, 0.80)
    middle = offer(3, 103, "RTX 4090", 1, 0.45)
    unreadable = offer(4, 104, "RTX 4090", 1, 0.10, num_gpus=0)
    small = offer(5, 105, "RTX 4090", 1, 0.05, cpu_cores=256, cpu_cores_effective=32.0)
    bad = offer(6, 106, "RTX 4090", 1, 0.01)
    ranked = rank_offers(parsed([dear, bad, small, unreadable, middle, cheap]), MODEL, {106},
                         set(), min_instance_ram_gb=128)
    assert [o["id"] for o in ranked] == [1, 3, 2, 4, 5, 6]
    assert ranked[-1]["bad_host"] is True and not any(o["bad_host"] for o in ranked[:-1])


def test_bad_host_ids_as_text_or_numbers() -> None:
    offers = [offer(1, 101, "RTX 4090", 1, 0.5), offer(2, 102, "RTX 4090", 1, 0.6)]
    for bad in ({"101"}, {101}):
        ranked = rank_offers(parsed(offers), MODEL, bad, set())  # type: ignore[arg-type]
        assert [(o["id"], o["bad_host"]) for o in ranked] == [(2, False), (1, True)]


def test_does_not_modify_inputs() -> None:
    offers = [offer(1, 1, "RTX 4090", 1, 0.5)]
    before = copy.deepcopy(offers)
    ranked = rank_offers(parsed(offers), MODEL, set(), set())
    assert offers == before
    assert ranked[0] is not offers[0]


# --- the instance's share ----------------------------------------------------------------


def host(cpu_ram_mb: int, cores: int, effective: float | None, **extra: Any) -> dict[str, Any]:
    return {"cpu_ram": cpu_ram_mb, "cpu_cores": cores, "cpu_cores_effective": effective, **extra}


def test_every_offer_carries_its_instances_share_and_a_too_small_one_is_flagged() -> None:
    offers = [
        offer(1, 11, "RTX 4090", 1, 0.35, **host(515000, 256, 32.0)),  # 1 of 8 GPUs
        offer(2, 12, "RTX 4090", 2, 0.80, **host(257000, 64, 64.0)),  # the whole host
        offer(3, 13, "RTX 4090", 1, 0.30, **host(515000, 0, 32.0, gpu_frac=0.125)),
        {k: v for k, v in offer(4, 14, "RTX 4090", 1, 0.20).items()
         if k not in ("cpu_cores", "cpu_cores_effective")},  # says nothing of its share
    ]
    ranked = by_id(rank_offers(parsed(offers), MODEL, set(), set(), min_instance_ram_gb=128))
    small = ranked[1]
    assert (small["instance_ram_gb"], small["instance_cpu_cores"]) == (64.4, 32.0)
    assert small["instance_share"] == "515 GB x 32/256 cores = 64.4 GB"
    assert small["too_small"] is True and small["predicted_rate_per_hour"] is None
    assert small["prediction_basis"].startswith("not predicted: its instance would get about 64")
    whole = ranked[2]
    assert whole["too_small"] is False and whole["too_small_reason"] is None
    assert whole["instance_share"] == "257 GB x 64/64 cores = 257.0 GB"
    assert whole["predicted_rate_per_hour"] is not None
    # No cores listed: gpu_frac gives the fraction.
    assert ranked[3]["instance_share"] == "515 GB x gpu_frac 0.125 = 64.4 GB"
    unknown = ranked[4]
    assert unknown["instance_ram_gb"] is None and unknown["too_small"] is True
    assert "cannot be promised" in unknown["too_small_reason"]
    order = [o["id"] for o in rank_offers(parsed(offers), MODEL, set(), set(),
                                          min_instance_ram_gb=128)]
    assert order[0] == 2 and set(order[1:]) == {1, 3, 4}
    # 0 turns the check off.
    assert not any(o["too_small"] for o in rank_offers(parsed(offers), MODEL, set(), set()))
