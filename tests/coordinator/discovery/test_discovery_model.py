"""The rate model: honest intervals, per-machine pinning, explanations that add up."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.structural_model import (
    Prediction,
    Priors,
    Unpredictable,
    _least_scale,
    _mixture_cdf,
    _mixture_quantile,
    fit_rate_model,
)
from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.local.catalog import local_offers

from support.discovery_support import measurements, synthetic_offer, true_rate


def _width(p: Prediction) -> float:
    return p.rate_high / p.rate_low


def _held_out(n: int = 60, seed: int = 99) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [synthetic_offer(rng, 90_000 + i) for i in range(n)]


def test_intervals_are_wide_with_little_data_and_narrow_with_much() -> None:
    offers = _held_out()
    widths = []
    for n in (0, 5, 300):
        model = fit_rate_model(measurements(n))
        parsed = [parse_offer(o) for o in offers]
        preds = [p for p in model.predict_offers(parsed, explain=False)]
        assert all(isinstance(p, Prediction) for p in preds)
        widths.append(statistics.median(_width(p) for p in preds))  # type: ignore[union-attr]
    assert widths[0] > widths[1] > widths[2]
    # With no measurement at all the facts alone leave a factor of about two either way.
    assert widths[0] > 2.5


def test_with_much_data_the_true_rates_fall_in_the_intervals() -> None:
    model = fit_rate_model(measurements(300))
    offers = _held_out(200)
    preds = model.predict_offers([parse_offer(o) for o in offers], explain=False)
    inside = 0
    errors = []
    rng = random.Random(5)
    for offer, p in zip(offers, preds, strict=True):
        assert isinstance(p, Prediction)
        truth = true_rate(offer, math.exp(rng.gauss(0.0, 0.10)))
        inside += p.rate_low <= truth <= p.rate_high
        errors.append(abs(p.rate_per_hour - truth) / truth)
        assert p.rate_low < p.rate_per_hour < p.rate_high
    assert 0.65 <= inside / len(offers) <= 0.95
    assert statistics.median(errors) < 0.2


def test_an_unmeasured_gpu_model_is_less_certain_where_the_gpu_binds() -> None:
    model = fit_rate_model(measurements(200))
    base = dict(local_offers()[0])
    base.pop("sim")
    # Plenty of CPU and RAM for one card: the GPU is what limits it (an RTX 5090 would
    # not: cuzk's 18 syntheses at once bind it first).
    roomy = {**base, "cpu_cores": 128, "cpu_cores_effective": 128, "cpu_ram": 1_024_000}
    known = model.predict(parse_offer(roomy))
    unknown = model.predict(parse_offer({**roomy, "gpu_name": "RTX 5080", "gpu_mem_bw": 960.0}))
    assert known.bottleneck == unknown.bottleneck == "gpu"
    assert _width(unknown) > _width(known)
    assert any("no RTX 5080 measured yet" in n for n in unknown.novelty)
    assert not known.novelty


def test_repeated_measurements_pin_their_machine() -> None:
    background = measurements(150)
    offer = dict(local_offers()[0])
    offer.pop("sim")
    twin = {**offer, "machine_id": 123_457, "id": 2}
    hardware = fit_rate_model(background).predict(parse_offer(offer)).rate_per_hour
    fast = hardware * 1.4  # this machine runs 40% above its hardware's prediction

    def runs(n: int) -> list[Measurement]:
        rng = random.Random(n)
        return [Measurement(str(offer["machine_id"]), parse_offer(offer),
                            fast * math.exp(rng.gauss(0.0, 0.03)), 0.0) for _ in range(n)]

    one = fit_rate_model([*background, *runs(1)])
    four = fit_rate_model([*background, *runs(4)])
    p1, p4 = one.predict(parse_offer(offer)), four.predict(parse_offer(offer))
    assert p4.machine_runs == 4 and p1.machine_runs == 1
    # One run moves it most of the way to what the machine measured; more runs narrow it.
    assert abs(p1.rate_per_hour - fast) < 0.25 * abs(hardware - fast)
    assert abs(p4.rate_per_hour - fast) / fast < 0.05
    assert _width(p4) < _width(p1)
    # Its twin on another machine keeps the hardware's prediction and its doubt.
    p_twin = four.predict(parse_offer(twin))
    assert p_twin.machine_runs == 0
    assert abs(p_twin.rate_per_hour - hardware) / hardware < 0.1
    assert _width(p_twin) > _width(p4)
    assert "this machine x" in p4.basis


def test_an_old_measurement_pins_less_than_a_fresh_one() -> None:
    offer = dict(local_offers()[0])
    offer.pop("sim")
    runs = [Measurement(str(offer["machine_id"]), parse_offer(offer), 90.0, 0.0)
            for _ in range(3)]
    background = measurements(100)
    fresh = fit_rate_model([*background, *runs], now=86_400.0).predict(parse_offer(offer))
    old = fit_rate_model([*background, *runs], now=200 * 86_400.0).predict(parse_offer(offer))
    assert _width(old) > _width(fresh)


def test_the_explanation_adds_up_to_the_prediction() -> None:
    offers = _held_out(10)
    ms = [*measurements(120),
          Measurement(str(offers[0]["machine_id"]), parse_offer(offers[0]), 50.0, 0.0)]
    model = fit_rate_model(ms)
    for p in model.predict_offers([parse_offer(o) for o in offers]):
        assert isinstance(p, Prediction)
        total = math.log(p.reference_rate_per_hour) + sum(c.log_rate for c in p.contributions)
        assert total == pytest.approx(math.log(p.rate_per_hour), abs=1e-9)
        assert p.bottleneck in p.capacities_per_hour
        assert f"{p.rate_low:.0f}-{p.rate_high:.0f}/h" in p.basis
    first = model.predict(parse_offer(offers[0]))
    assert first.contributions[-1].name == "this machine's runs"


def test_a_small_ram_share_is_predicted_slower_and_memory_bound() -> None:
    model = fit_rate_model(measurements(150))
    base = dict(local_offers()[0])
    base.pop("sim")
    whole = {**base, "num_gpus": 8, "cpu_cores": 128, "cpu_cores_effective": 128,
             "cpu_ram": 1_024_000}
    slice_ = {**whole, "num_gpus": 1, "cpu_cores_effective": 16}  # 128 GB, 16 vCPUs
    p_whole, p_slice = model.predict(parse_offer(whole)), model.predict(parse_offer(slice_))
    assert p_slice.rate_per_hour * 4 < p_whole.rate_per_hour
    ram = next(c for c in p_slice.contributions if c.name == "RAM share")
    assert ram.log_rate < 0


def test_from_nothing_several_gpus_are_predicted_below_linear() -> None:
    """The GPU count's power is -0.1 a priori (docs/discovery.md, section 2): from nothing,
    a 4-GPU host is predicted at 4^-0.1 of what GPUs that add up would make, and one GPU
    is not moved."""
    linear = fit_rate_model([], priors=Priors(multi_gpu=0.0))
    model = fit_rate_model([])
    base = dict(local_offers()[0])
    base.pop("sim")
    four = parse_offer({**base, "num_gpus": 4, "cpu_cores": 64, "cpu_cores_effective": 64,
                        "cpu_ram": 512_000})
    one = parse_offer({**base, "num_gpus": 1})
    for offer, ratio in ((four, 4.0**-0.1), (one, 1.0)):
        p, q = model.predict(offer), linear.predict(offer)
        assert isinstance(p, Prediction) and isinstance(q, Prediction)
        assert p.rate_per_hour / q.rate_per_hour == pytest.approx(ratio, rel=1e-6)
        assert p.rate_low / q.rate_low == pytest.approx(ratio, rel=1e-6)


def test_from_nothing_a_narrow_links_interval_reaches_the_ntt_only_volume() -> None:
    """The link's prior centres on 48 GB a partition, a derivation; upstream documents
    only the NTT's 12 GiB (docs/cuzk.md, "What crosses the PCIe link"). From nothing,
    a host on an x1 link gets an 80% interval whose top reaches the rate that link
    would allow if only those 12 GiB crossed it."""
    base = dict(local_offers()[0])
    base.pop("sim")
    offer = parse_offer({**base, "pcie_bw": 1.3, "gpu_lanes": 1})
    p = fit_rate_model([]).predict(offer)
    ntt_only_per_hour = 1.3 * 3600 / (10 * 12 * 2**30 / 1e9)
    assert p.bottleneck == "pcie"
    assert p.rate_high >= min(ntt_only_per_hour, p.capacities_per_hour["gpu"],
                              p.capacities_per_hour["cpu"])


def test_an_offer_it_cannot_read_says_which_field() -> None:
    model = fit_rate_model([])
    out = model.predict_offers([parse_offer({"gpu_name": "RTX 4090", "num_gpus": 0}),
                                parse_offer(local_offers()[0])])
    assert isinstance(out[0], Unpredictable) and out[0].field == "num_gpus"
    assert isinstance(out[1], Prediction)


def test_a_ram_share_on_a_step_has_two_modes_and_its_runs_pick_one() -> None:
    background = measurements(150)
    model = fit_rate_model(background)
    base = dict(local_offers()[0])
    base.pop("sim")
    # One GPU with about 128 GB: cuzk's budget holds one partition in flight there, or
    # two, as the RAM the host keeps for itself decides (docs/discovery.md, the model).
    # The first RAM share, going up, where both counts are likely:
    knife, p = None, None
    for ram_mb in range(100_000, 160_000, 2_000):
        offer = {**base, "machine_id": 123_999, "id": 7, "num_gpus": 1, "cpu_cores": 32,
                 "cpu_cores_effective": 32, "cpu_ram": ram_mb}
        pred = model.predict(parse_offer(offer))
        if sum(w >= 0.25 for w, _, _ in pred.modes) == 2:
            knife, p = offer, pred
            break
    assert knife is not None and p is not None
    assert sum(w for w, _, _ in p.modes) == pytest.approx(1.0)
    (_, m1, _), (_, m2, _) = sorted(p.modes, key=lambda m: -m[0])[:2]
    assert 1.6 < math.exp(abs(m2 - m1)) < 2.5  # one partition or two: about half the rate
    assert p.rate_low < math.exp(min(m1, m2)) and math.exp(max(m1, m2)) < p.rate_high
    assert "partitions in flight 1 (" in p.basis
    # Three runs at the lower mode's rate: the machine holds one partition; its prediction
    # has one mode, near what it measured, and a narrower interval.
    low = math.exp(min(m1, m2))
    runs = [Measurement("123999", parse_offer(knife), low * f, 0.0) for f in (0.97, 1.0, 1.03)]
    pinned = fit_rate_model([*background, *runs]).predict(parse_offer(knife))
    assert not pinned.modes
    assert pinned.rate_per_hour == pytest.approx(low, rel=0.12)
    assert pinned.rate_high / pinned.rate_low < p.rate_high / p.rate_low


def test_mixture_quantile_inverts_the_mixture_cdf() -> None:
    rng = np.random.default_rng(7)
    weights = rng.dirichlet(np.ones(3), size=50)
    means = rng.normal(3.0, 1.0, size=(50, 3))
    sd = rng.uniform(0.05, 0.6, size=50)
    for q in (0.1, 0.5, 0.9):
        y = _mixture_quantile(q, weights, means, sd)
        assert np.allclose(_mixture_cdf(y, weights, means, sd), q, atol=1e-7)


def test_least_scale_puts_the_value_on_the_interval_edge_or_a_bound() -> None:
    weights = np.ones((4, 1))
    means = np.zeros((4, 1))
    sd = np.full(4, 0.1)
    y_sd = np.zeros(4)
    # inside at the least factor; on the edge at a factor in between; outside at the most
    y = np.array([0.0, 0.128155 * 3.0, 0.128155 * 0.01, 1000.0])
    least = _least_scale(y, weights, means, y_sd, sd)
    assert least[0] == pytest.approx(0.05) and least[2] == pytest.approx(0.05)
    assert least[1] == pytest.approx(3.0, rel=1e-4)
    assert _mixture_cdf(y[1:2], weights[1:2], means[1:2], sd[1:2] * least[1]) == pytest.approx(0.9)
    assert least[3] == pytest.approx(20.0)
