"""Delivered beats claimed: the sequential test of ``decisions.delivered`` never calls an
honest host short for its noise, and finds one delivering a share of its rate."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from vast_manager.coordinator.decisions import delivered
from vast_manager.coordinator.decisions.cluster_verdict import Delivered
from vast_manager.coordinator.decisions.delivered import DeliveryTest

ROUND_S = 60.0


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method; the means here are small)."""
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def first_decision(kept: float, true_rate: float, hours: float, seed: int,
                   decided: Callable[[delivered.Verdict], bool]
                   ) -> tuple[float, delivered.Verdict] | None:
    """A reading a minute of a host delivering ``true_rate`` (Poisson) against ``kept``:
    the hours until the first verdict ``decided`` picks, and that verdict."""
    rng = random.Random(seed)
    state = DeliveryTest()
    for i in range(int(hours * 3600 / ROUND_S)):
        obs = Delivered(poisson(rng, true_rate * ROUND_S / 3600), 0, ROUND_S, "cuzk")
        state, verdict = delivered.step(state, obs, kept)
        if decided(verdict):
            return (i + 1) * ROUND_S / 3600, verdict
    return None


def hours_to_short(kept: float, true_rate: float, hours: float, seed: int) -> float | None:
    found = first_decision(kept, true_rate, hours, seed, lambda v: v.short)
    return found[0] if found else None


def test_honest_noise_never_trips_it() -> None:
    """Hosts delivering their rate, or 70% of it, with Poisson noise (more than cuzk's
    own), one reading a minute for 200 simulated days between them: never short."""
    for seed, (kept, share) in enumerate([(12.3, 1.0), (60.0, 1.0), (431.0, 1.0),
                                          (12.3, 0.7), (138.5, 0.7)]):
        assert hours_to_short(kept, kept * share, 24 * 40, seed) is None, (kept, share)


def test_a_host_delivering_one_percent_is_found_in_minutes() -> None:
    found = hours_to_short(431.0, 4.3, 6.0, 1)  # the probe: one proof every 14 minutes
    assert found is not None and found < 0.25
    # Half its claim (a 2x lie on a 5060 Ti): found within two days (13 to 25 h here).
    found = hours_to_short(24.6, 12.3, 96.0, 2)
    assert found is not None and found < 48.0


def test_the_verdict_quotes_its_numbers_and_source() -> None:
    state = DeliveryTest()
    verdict = delivered.Verdict(False, None)
    for _ in range(30):
        state, verdict = delivered.step(state, Delivered(0, 1, 60.0, "cluster", "bad proof"),
                                        431.0)
        if verdict.short:
            break
    assert verdict.short and verdict.reason is not None
    assert "the cluster's record" in verdict.reason and "0% of the 431.0/h" in verdict.reason
    assert "last error: bad proof" in verdict.reason
    assert 0.5 < delivered.crossover_share() < 0.6


def hours_to_agree(kept: float, true_rate: float, hours: float, seed: int
                   ) -> tuple[float, float] | None:
    """When the test first agrees with the kept rate, and the delivered rate it agreed
    on (what the rate model may then learn of a bounded measurement)."""
    found = first_decision(kept, true_rate, hours, seed, lambda v: v.agrees)
    if found is None:
        return None
    assert not found[1].short and found[1].delivered_rate_per_hour is not None
    return found[0], found[1].delivered_rate_per_hour


def test_it_agrees_with_a_host_delivering_its_rate_and_never_with_a_liar() -> None:
    """A host delivering its kept rate is agreed with within hours (a 5060 Ti at 23.9/h:
    ``(l0 - l1) ln`` drift, about 0.26 x the rate an hour to a bound of ln(100)); the
    rate agreed on is near what it delivers. One delivering a fifth of its claim never
    is, however long it is watched (it is found short instead)."""
    found = hours_to_agree(23.9, 23.9, 12.0, 3)
    assert found is not None and found[0] < 3.0
    assert 0.6 * 23.9 < found[1] < 1.6 * 23.9
    assert hours_to_agree(118.0, 12.4, 48.0, 4) is None
