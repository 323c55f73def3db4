"""A trial's worth to a fleet of a fixed size: the fall in its $/proof, alone or with a
GPU model's other offers, or the loss it saves where the fleet counts on the host untried."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from vast_manager.common.hardware_facts import GPU_SPECS
from vast_manager.coordinator.discovery.autopilot_rules import fleet_on_offer
from vast_manager.coordinator.discovery.fleet_gain import FleetHost, FleetOnOffer, gain_per_hour
from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.plan import (
    FleetView,
    PlanSettings,
    Predictor,
    evaluate_offer,
    plan_trials,
)
from vast_manager.coordinator.discovery.structural_model import Prediction, fit_rate_model
from vast_manager.coordinator.offers import Offer, parse_offer

from support.discovery_support import measurements, parsed, synthetic_offer, true_rate

#: A fleet of ten at 100/h: nine at $0.10/h ($0.001 a proof), the last at $0.15/h; and
#: the next host on offer, at $0.20/h.
FLEET = (*(FleetHost(f"m{i}", 0.10, 100.0) for i in range(9)),
         FleetHost("m9", 0.15, 100.0), FleetHost("m10", 0.20, 100.0))
ON_OFFER = FleetOnOffer(FLEET, 10)


def _sampled_gain(base: tuple[FleetHost, ...], dph: list[float], mus: list[float],
                  sds: list[float], n: int = 40_000) -> float:
    """The same expectation by sampling the common draw."""
    rng = random.Random(5)
    p0 = sum(h.dph_total for h in base) / sum(h.rate_per_hour for h in base)
    total = 0.0
    for _ in range(n):
        z = rng.gauss(0.0, 1.0)
        hosts = [(h.dph_total, h.rate_per_hour) for h in base] + [
            (c, math.exp(mu + sd * z)) for c, mu, sd in zip(dph, mus, sds, strict=True)]
        best = sorted(hosts, key=lambda h: h[0] / h[1])[:len(base)]
        total += max(0.0, p0 - sum(c for c, _ in best) / sum(r for _, r in best))
    return total / n * sum(h.rate_per_hour for h in base)


@pytest.mark.parametrize("newcomers", [1, 3])
def test_the_quadrature_matches_sampling(newcomers: int) -> None:
    base = ON_OFFER.without(())
    dph = [0.08, 0.12, 0.30][:newcomers]
    mus = [math.log(90.0), math.log(110.0), math.log(250.0)][:newcomers]
    sds = [0.3, 0.2, 0.4][:newcomers]
    got = gain_per_hour(base, 10, dph, [(1.0, mus, sds)])
    assert got > 0
    assert got == pytest.approx(_sampled_gain(base, dph, mus, sds), rel=0.03)


def test_a_big_host_that_beats_the_last_host_but_not_the_fleet_gains_nothing() -> None:
    base = ON_OFFER.without(())
    p0 = sum(h.dph_total for h in base) / sum(h.rate_per_hour for h in base)  # $0.00105
    # $0.0012 a proof: cheaper than the last host's $0.0015, dearer than the fleet's mean,
    # and four times the last host's rate: taking it would raise the fleet's $/proof.
    assert p0 < 0.0012
    big = gain_per_hour(base, 10, [0.48], [(1.0, [math.log(400.0)], [1e-6])])
    assert big == 0.0
    # A small host at the same $/proof lowers it: it replaces a dearer one.
    small = gain_per_hour(base, 10, [0.06], [(1.0, [math.log(50.0)], [1e-6])])
    assert small > 0


def test_without_its_machine_the_fleet_takes_the_next_host() -> None:
    assert [h.machine_id for h in ON_OFFER.without({"m3"})] == [
        "m0", "m1", "m2", "m4", "m5", "m6", "m7", "m8", "m9", "m10"]
    assert len(ON_OFFER.without(())) == 10


def _offers(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [synthetic_offer(rng, 90_000 + i) for i in range(n)]


def _fleet_view(model: Predictor, offers: list[Offer]) -> FleetView:
    """From nothing proving: the best 20 offers by predicted $/proof as the fleet on
    offer (a fleet of 10), its tenth's $/proof the reference."""
    preds = model.predict_offers(offers, explain=False)
    hosts = sorted((o.dph_total / p.rate_per_hour, str(o.machine_id), o.dph_total,
                    p.rate_per_hour) for o, p in zip(offers, preds, strict=True)
                   if o.dph_total and isinstance(p, Prediction))
    on_offer = FleetOnOffer(tuple(FleetHost(m, c, r) for _, m, c, r in hosts[:20]), 10)
    return FleetView(reference_usd_per_proof=hosts[9][0], fleet_on_offer=on_offer)


def test_from_nothing_the_plan_values_trials_against_the_fleet_on_offer() -> None:
    model = fit_rate_model(measurements(120))
    offers = parsed(_offers(60, 8))
    view = _fleet_view(model, offers)
    on_offer = view.fleet_on_offer
    assert on_offer is not None
    settings = PlanSettings(trials=5)
    plan = plan_trials(offers, model, view, settings)
    assert plan.proposals
    raised = 0
    for p in plan.proposals:
        own = evaluate_offer(p.offer, p.prediction, view, settings)
        assert own is not None
        # The saving is the fall in the fleet's $/proof, without the offer's own machine
        # (or the loss it saves, where the fleet counts on the offer untried).
        mine = {str(p.machine_id)}
        assert p.expected_saving_per_hour_usd == pytest.approx(gain_per_hour(
            on_offer.without(mine), 10, [float(p.dph_total)],
            [(w, [mu], [sd]) for w, mu, sd in p.prediction.components()],
            relying=on_offer.relying_on(mine)))
        # No machine on offer is measured: a GPU model's best offer may be worth more
        # than itself (what it shows of the model's other offers), never less.
        assert p.expected_value_usd >= own.expected_value_usd - 1e-9
        raised += p.expected_value_usd > own.expected_value_usd + 1e-6
    assert raised >= 1
    # The same plan against the last host alone values the offers otherwise.
    plain = plan_trials(offers, model,
                        FleetView(reference_usd_per_proof=view.reference_usd_per_proof), settings)
    assert [p.expected_value_usd for p in plain.proposals] != [
        p.expected_value_usd for p in plan.proposals]


def test_the_fleet_on_offer_is_twice_the_fleet_and_only_hosts_the_verdict_keeps() -> None:
    # (machine, dph_total, rate): $/proof 0.001 .. 0.030; machine "a" twice, cheapest kept.
    supply = [("a", 0.2, 100.0), ("a", 0.1, 100.0),
              *((f"m{i}", 0.001 * (i + 2) * 100, 100.0) for i in range(29))]
    on_offer = fleet_on_offer(supply, 5, 0.008)
    assert on_offer is not None and on_offer.size == 5
    # The best 10, less those above $0.008 a proof: "a" at 0.001, m0-m6 at 0.002-0.008.
    assert [h.machine_id for h in on_offer.hosts] == ["a", *(f"m{i}" for i in range(7))]
    assert on_offer.hosts[0].dph_total == pytest.approx(0.1)
    # Fewer hosts under the verdict's $/proof than the fleet: the reference alone.
    assert fleet_on_offer(supply, 5, 0.002) is None


def test_a_doubtful_host_the_fleet_counts_on_is_worth_testing_for_its_loss() -> None:
    # The fleet counts on a 4-GPU host untried (m9, $0.0015 a proof at its prediction, four
    # times a small host's rate). Taking it barely lowers the fleet's mean, so its gain is
    # small; but rented untried and slower than predicted, it would raise the fleet's
    # $/proof, which the trial would have avoided.
    hosts = (*(FleetHost(f"m{i}", 0.10, 100.0) for i in range(9)),
             FleetHost("m9", 0.60, 400.0), FleetHost("m10", 0.16, 100.0))
    on_offer = FleetOnOffer(hosts, 10)
    held = on_offer.relying_on({"m9"})
    assert held is not None and "m9" not in {h.machine_id for h in held} and len(held) == 9
    assert on_offer.relying_on({"m10"}) is None  # the fleet does not count on the 11th
    base = on_offer.without({"m9"})
    for sd, doubtful in ((0.3, True), (1e-6, False)):
        draws = [(1.0, [math.log(400.0)], [sd])]
        gain = gain_per_hour(base, 10, [0.60], draws)
        both = gain_per_hour(base, 10, [0.60], draws, relying=held)
        if doubtful:
            assert both > 3 * gain > 0
        else:  # sure of its rate: nothing to avoid, nothing to gain
            assert both == gain == 0.0


def _with_dlperf(offer: dict[str, Any], log_ratio: float) -> dict[str, Any]:
    """The offer with vast.ai's ``dlperf`` at exp(log_ratio) per GB/s of its GPUs' spec
    memory bandwidth."""
    bw = GPU_SPECS[offer["gpu_name"]].mem_bw_gbps
    return {**offer, "dlperf": round(offer["num_gpus"] * bw * math.exp(log_ratio), 2)}


def test_a_gpu_model_whose_dlperf_runs_ahead_of_the_measured_models_is_worth_more_to_try(
) -> None:
    """The first trial of a GPU model no machine was measured with is also valued under
    the reading that its speed follows its dlperf as the measured models' may: its
    dlperf per GB/s of bandwidth above theirs raises what its trial may show; with no
    measured machine on offer there is nothing to read it against."""
    rng = random.Random(4)
    runs: list[Measurement] = []
    measured: list[dict[str, Any]] = []
    machine = 70_000
    while len(runs) < 40:
        offer = synthetic_offer(rng, machine)
        machine += 1
        if offer["gpu_name"] == "RTX 5090":
            continue
        offer = _with_dlperf(offer, -2.8)
        measured.append(offer)
        runs.append(Measurement(str(offer["machine_id"]), parse_offer(offer),
                                true_rate(offer) * math.exp(rng.gauss(0.0, 0.05)), 0.0, "fleet"))
    model = fit_rate_model(runs)
    market = _offers(200, 9)
    news = [o for o in market if o["gpu_name"] == "RTX 5090"][:6]
    others = [_with_dlperf(o, -2.8) for o in market if o["gpu_name"] != "RTX 5090"][:40]
    assert len(news) >= 3

    def best_5090_value(log_ratio: float, with_measured: bool) -> float:
        offers = parsed([*(measured if with_measured else []), *others,
                         *(_with_dlperf(o, log_ratio) for o in news)])
        plan = plan_trials(offers, model, _fleet_view(model, offers), PlanSettings(trials=100))
        return max(p.expected_value_usd for p in plan.proposals
                   if p.offer.gpu_name == "RTX 5090")

    # Its dlperf per GB/s 0.5 above the measured machines': worth more than at theirs.
    ahead, level = best_5090_value(-2.3, True), best_5090_value(-2.8, True)
    assert ahead > 1.2 * level > 0
    # Nothing measured on offer: no ratio to read it against, the same value either way.
    assert best_5090_value(-2.3, False) == pytest.approx(best_5090_value(-2.8, False))
