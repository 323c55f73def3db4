"""The trial planner: expected value against cost, the stop, and what each proposal says."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from vast_manager.coordinator.discovery.plan import (
    FleetView,
    PlanSettings,
    TrialCost,
    expected_saving_per_hour,
    plan_trials,
)
from vast_manager.coordinator.discovery.structural_model import Prediction, fit_rate_model
from vast_manager.coordinator.offers import parse_offer

from support.discovery_support import measurements, parsed, synthetic_offer


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return fit_rate_model(measurements(120))


def _offers(n: int = 80, seed: int = 4) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [synthetic_offer(rng, 80_000 + i) for i in range(n)]


def _roomy() -> dict[str, Any]:
    """A 1-GPU host with 1 TB: cuzk's 18 partitions in flight, whatever the host keeps."""
    return {**_offers(1)[0], "num_gpus": 1, "cpu_cores": 32, "cpu_cores_effective": 32,
            "cpu_ram": 1_024_000}


def _knife_edge() -> dict[str, Any]:
    """A 1-GPU host with 128 GB: cuzk holds one partition in flight there, or two."""
    return {**_roomy(), "cpu_ram": 128_000}


def _draws(p: Prediction, n: int, seed: int = 0) -> list[float]:
    """Rates drawn from the prediction's distribution (its modes, or its one log-normal)."""
    rng = random.Random(seed)
    comps = p.components()
    weights = [w for w, _, _ in comps]
    return [math.exp(rng.gauss(mu, sd))
            for _, mu, sd in rng.choices(comps, weights=weights, k=n)]


@pytest.mark.parametrize("which", ["one mode", "on a step"])
def test_the_closed_form_saving_matches_sampling(model, which) -> None:  # type: ignore[no-untyped-def]
    p = model.predict(parse_offer(_roomy() if which == "one mode" else _knife_edge()))
    assert (len(p.modes) >= 2) == (which == "on a step")
    dph, ref = 0.3, 0.006 if which == "one mode" else 0.012
    draws = [max(0.0, ref * r - dph) for r in _draws(p, 200_000)]
    assert expected_saving_per_hour(p, dph, ref) == pytest.approx(sum(draws) / len(draws),
                                                                   rel=0.03, abs=1e-4)


def test_a_plan_lists_the_best_expected_value_first_and_says_why(model) -> None:  # type: ignore[no-untyped-def]
    plan = plan_trials(parsed(_offers()), model, FleetView(best_usd_per_proof=0.004),
                       PlanSettings(trials=4))
    assert 0 < len(plan.proposals) <= 4
    values = [p.expected_value_usd for p in plan.proposals]
    assert values == sorted(values, reverse=True) and values[-1] > 0
    for p in plan.proposals:
        assert p.break_even_rate_per_hour == pytest.approx(p.dph_total / 0.008)
        assert p.break_even_vs_best == pytest.approx(p.dph_total / 0.004)
        assert p.probability_beats_best is not None and 0 <= p.probability_beats_best <= 1
        assert p.trial_cost_usd == pytest.approx(p.trial_hours * p.dph_total)
        assert f"break-even {p.break_even_rate_per_hour:.0f}/h" in p.hypothesis
        assert (f"predicted {p.prediction.rate_low:.0f}-{p.prediction.rate_high:.0f}/h"
                in p.hypothesis)
        assert p.hypothesis.startswith(f"{p.offer.num_gpus}x {p.offer.gpu_name} on ")
        assert p.prediction.contributions  # the listed ones carry their explanation
    assert len({p.machine_id for p in plan.proposals}) == len(plan.proposals)


def test_it_stops_when_nothing_is_worth_its_cost(model) -> None:  # type: ignore[no-untyped-def]
    # At ten times the price nothing can beat a fleet already at $0.002 a proof.
    pricey = [{**o, "dph_total": o["dph_total"] * 10} for o in _offers()]
    plan = plan_trials(parsed(pricey), model, FleetView(best_usd_per_proof=0.002),
                       PlanSettings())
    assert plan.proposals == ()
    assert plan.considered > 0 and plan.worth_trying == 0
    assert plan.stop_reason.startswith("nothing is worth its cost")


def test_a_trial_that_would_cost_more_than_it_can_save_is_not_proposed(model) -> None:  # type: ignore[no-untyped-def]
    offers = _offers()
    fleet = FleetView(reference_usd_per_proof=0.008)
    cheap = plan_trials(parsed(offers), model, fleet, PlanSettings(trials=50))
    # The same offers over a ten-minute horizon: no saving can repay a trial.
    short = plan_trials(parsed(offers), model, fleet,
                        PlanSettings(trials=50, horizon_hours=0.2))
    assert cheap.proposals and short.proposals == ()


def test_budget_trials_and_blocked_machines_are_respected(model) -> None:  # type: ignore[no-untyped-def]
    offers = _offers()
    fleet = FleetView(reference_usd_per_proof=0.008)
    free = plan_trials(parsed(offers), model, fleet, PlanSettings(trials=10))
    first = free.proposals[0]
    budget = first.trial_cost_usd + 1e-9
    tight = plan_trials(parsed(offers), model, fleet,
                        PlanSettings(trials=10, budget_usd=budget))
    assert sum(p.trial_cost_usd for p in tight.proposals) <= budget
    assert "budget" in tight.stop_reason
    blocked = FleetView(reference_usd_per_proof=0.008,
                        busy_machines=frozenset({str(first.machine_id)}))
    again = plan_trials(parsed(offers), model, blocked, PlanSettings(trials=10))
    assert first.machine_id not in {p.machine_id for p in again.proposals}
    one = plan_trials(parsed(offers), model, fleet, PlanSettings(trials=1))
    assert len(one.proposals) == 1 and "1 trials asked for" in one.stop_reason


def test_a_slow_link_makes_a_longer_trial() -> None:
    cost = TrialCost()
    fast = cost.hours(parse_offer({"inet_down": 2000}), 60.0)
    slow = cost.hours(parse_offer({"inet_down": 100}), 60.0)
    assert slow > fast
    # 45 GiB over 100 Mbit/s is about an hour of fetch on top of the rest.
    assert slow - fast == pytest.approx(45 * (1 << 30) * 8 * (1 / 100e6 - 1 / 2000e6) / 3600)


@pytest.mark.parametrize("which", ["one mode", "on a step"])
def test_predictions_carry_the_probability_of_any_rate(model, which) -> None:  # type: ignore[no-untyped-def]
    p: Prediction = model.predict(
        parse_offer(_roomy() if which == "one mode" else _knife_edge()))
    assert p.probability_above(p.rate_high) == pytest.approx(0.1, abs=1e-6)
    assert p.probability_above(p.rate_low) == pytest.approx(0.9, abs=1e-6)
    # The point is the rate with the least expected absolute percentage error.
    draws = _draws(p, 40_000, seed=3)

    def ape(x: float) -> float:
        return sum(abs(x - t) / t for t in draws) / len(draws)

    assert ape(p.rate_per_hour) <= min(ape(p.rate_per_hour * 1.03), ape(p.rate_per_hour / 1.03))


def test_a_measured_machine_is_listed_apart_never_a_trial(model) -> None:  # type: ignore[no-untyped-def]
    """Every measured machine's offer, priced to be the best trial there is: the plan still
    proposes none of them, and lists each apart with its $/proof from its own runs."""
    ms = measurements(120)
    # A bandwidth price: the setup download makes the full hourly figure exceed dph_total.
    measured_offers = [{**dict(m.offer.raw), "dph_total": 0.01, "inet_down_cost": 0.02}
                       for m in ms[:10]]
    plan = plan_trials(parsed(_offers() + measured_offers), model, FleetView(),
                       PlanSettings(trials=50))
    ids = {str(m.machine_id) for m in ms[:10]}
    assert plan.proposals and not ids & {p.machine_id for p in plan.proposals}
    assert {m.machine_id for m in plan.measured} == ids
    for m in plan.measured:
        assert m.prediction.machine_runs >= 1
        # Priced at the full hourly figure, as proposals are: rent, storage and the setup
        # download spread over the horizon, which is above vast.ai's dph_total.
        assert m.hourly.total > m.dph_total
        assert m.predicted_usd_per_proof == pytest.approx(
            m.hourly.total / m.prediction.rate_per_hour)
        assert m.worth_deploying == (m.predicted_usd_per_proof <= plan.reference_usd_per_proof)
