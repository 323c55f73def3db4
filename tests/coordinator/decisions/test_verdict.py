"""Early benchmark verdicts (decisions.early_verdict) on hand-computed cases.

Every expected number is worked out here from the method's formulas with
``math`` and tabulated normal quantiles, never by calling the code under test.
The settings are chosen so the quantiles are textbook values: 10 planned
proofs, verdicts from the 2nd, 99% confidence -> 10 tests share alpha = 0.01,
so each test runs at 0.001 (z = 3.0902) and the stall test, spread over the 10
proofs, at 0.0001 (z = 3.7190).
"""

from __future__ import annotations

import math

import pytest

from vast_manager.coordinator.decisions.early_verdict import (
    EarlyVerdict,
    VerdictSettings,
    assess,
    steady_state_rate_per_hour,
)

SETTINGS = VerdictSettings(confidence=0.99, min_proofs=2, sigma_floor=0.15, planned_proofs=10)
Z_TEST = 3.0902  # upper 0.001 point of the standard normal (tables)
Z_STALL = 3.7190  # upper 0.0001 point
J = 2
MIN_RATE = 72.0  # so a proof at exactly the minimum takes 2 * 3600 / 72 = 100 s
W0 = 100.0


def estimate(proofs: list[float]) -> float:
    return J * 3600.0 * len(proofs) / sum(proofs)


def half_width(n: int, sigma: float = 0.15, z: float = Z_TEST) -> float:
    return z * sigma / math.sqrt(n)


def slot_elapsed(proofs: list[float]) -> float:
    """When the last of these proofs completes if each slot takes the next one as it frees."""
    free = [0.0] * J
    for w in proofs:
        i = free.index(min(free))
        free[i] += w
    return max(free) if proofs else 0.0


def test_settings_spread_alpha_over_the_looks_and_the_stall_test() -> None:
    assert SETTINGS.tests == 10  # looks at 2..10 proofs, plus the stall test
    assert SETTINGS.alpha_per_test == pytest.approx(0.001)


def test_host_exactly_at_the_minimum_is_undecided_at_every_look() -> None:
    for n in range(0, 11):
        proofs = [W0] * n
        # Look as each proof lands, and again just before the next pair is due.
        done_at = math.ceil(n / J) * W0
        for elapsed in (done_at, (n // J + 1) * W0 - 1.0):
            v = assess(proofs, J, elapsed, MIN_RATE, SETTINGS)
            assert v.decision == "undecided", (n, elapsed, v.reason)
            if n:
                assert v.rate_estimate_per_hour == pytest.approx(72.0)
            if n >= SETTINGS.min_proofs:
                # upper = 72 * exp(3.0902 * 0.15 / sqrt(n)), e.g. 91.9/h at 2 proofs.
                assert v.bound_per_hour == pytest.approx(72.0 * math.exp(half_width(n)), rel=1e-4)
                assert v.statistic == pytest.approx(0.0)


def test_clearly_slow_host_is_terminated_at_min_proofs_with_the_numbers() -> None:
    proofs = [250.0, 250.0]  # 28.8/h, 40% of the minimum
    v = assess(proofs, J, 250.0, MIN_RATE, SETTINGS)
    expected_estimate = 2 * 3600 * 2 / 500  # 28.8
    expected_upper = expected_estimate * math.exp(3.0902 * 0.15 / math.sqrt(2))  # 39.97
    assert v.decision == "terminate"
    assert v.proofs == 2
    assert v.rate_estimate_per_hour == pytest.approx(28.8)
    assert v.bound_per_hour == pytest.approx(expected_upper, rel=1e-4)
    assert v.statistic == pytest.approx(math.log(72 / 28.8) / (0.15 / math.sqrt(2)))
    assert v.reason == (
        "after 2 proofs the rate is at most 40.0/h with 99% confidence "
        "(estimate 28.8/h), below the minimum 72.0/h"
    )


def test_one_proof_is_not_enough_for_a_verdict_from_proof_times() -> None:
    # 250 s after the start one slow proof is in; the other has run 125 s, below
    # the stall line 100 * exp(3.719 * 0.15) = 174.7 s.
    v = assess([250.0], J, 250.0, MIN_RATE, SETTINGS)
    assert v.decision == "undecided"
    assert v.bound_per_hour is None
    assert v.rate_estimate_per_hour == pytest.approx(28.8)
    assert "1 of the 2 proofs" in v.reason


def test_clearly_fast_host_is_passed() -> None:
    proofs = [40.0, 40.0]  # 180/h
    v = assess(proofs, J, 40.0, MIN_RATE, SETTINGS)
    expected_lower = 180.0 * math.exp(-3.0902 * 0.15 / math.sqrt(2))  # 129.7
    assert v.decision == "pass"
    assert v.bound_per_hour == pytest.approx(expected_lower, rel=1e-4)
    assert v.reason == (
        f"after 2 proofs the rate is at least {expected_lower:.1f}/h with 99% confidence "
        "(estimate 180.0/h), above the minimum 72.0/h"
    )


def test_spread_above_the_floor_widens_the_bound() -> None:
    proofs = [60.0, 140.0]
    s = abs(math.log(140 / 60)) / math.sqrt(2)  # sample sd of the logs: 0.599
    v = assess(proofs, J, 140.0, MIN_RATE, SETTINGS)
    assert v.decision == "undecided"
    assert v.rate_estimate_per_hour == pytest.approx(72.0)
    assert v.bound_per_hour == pytest.approx(72.0 * math.exp(3.0902 * s / math.sqrt(2)),
                                             rel=1e-4)


def test_stalled_host_with_no_proof_is_terminated() -> None:
    # Line: a proof at the minimum running 100 * exp(3.719 * 0.15) = 174.7 s.
    line = W0 * math.exp(Z_STALL * 0.15)
    assert assess([], J, 170.0, MIN_RATE, SETTINGS).decision == "undecided"
    v = assess([], J, 180.0, MIN_RATE, SETTINGS)
    expected_bound = J * 3600 * math.exp(Z_STALL * 0.15) / 180.0  # 69.9
    assert 170.0 < line < 180.0
    assert v.decision == "terminate"
    assert v.rate_estimate_per_hour is None
    assert v.bound_per_hour == pytest.approx(expected_bound, rel=1e-4)
    assert v.statistic == pytest.approx(math.log(1.8) / 0.15)
    assert v.reason == (
        f"no proof completed in 180 s with 2 running: the rate is at most "
        f"{expected_bound:.1f}/h with 99% confidence, below the minimum 72.0/h"
    )


def test_a_hung_slot_is_caught_even_when_the_finished_proofs_were_fast() -> None:
    proofs = [40.0, 40.0, 40.0]  # the other slot: 400 - 120/2 = 340 s on one proof
    v = assess(proofs, J, 400.0, MIN_RATE, SETTINGS)
    assert v.decision == "terminate"
    assert v.bound_per_hour == pytest.approx(J * 3600 * math.exp(Z_STALL * 0.15) / 340.0,
                                             rel=1e-4)
    assert "after 3 proofs a proof has been running at least 340 s" in v.reason


def test_stall_test_is_off_after_a_failure_or_with_fewer_than_j_proofs_left() -> None:
    assert assess([], J, 1000.0, MIN_RATE, SETTINGS, proofs_failed=1).decision == "undecided"
    # 9 of 10 done: one slot idles legitimately, so its time says nothing.
    nine = [W0] * 9
    assert assess(nine, J, 5000.0, MIN_RATE, SETTINGS).decision == "undecided"


def test_noisy_but_good_host_is_never_terminated() -> None:
    # True rate 10% above the minimum (mean 90.9 s), 15% noise, the slowest proofs first.
    proofs = [110.0, 105.0, 100.0, 96.0, 75.0, 78.0, 84.0, 88.0, 92.0, 81.0]
    assert sum(proofs) / len(proofs) == pytest.approx(90.9)
    for n in range(0, len(proofs) + 1):
        prefix = proofs[:n]
        v = assess(prefix, J, slot_elapsed(prefix), MIN_RATE, SETTINGS)
        assert v.decision != "terminate", (n, v.reason)
        if n >= 2:
            logs = [math.log(w) for w in prefix]
            mean = sum(logs) / n
            s = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
            upper = estimate(prefix) * math.exp(half_width(n, max(0.15, s)))
            assert upper > MIN_RATE
            assert v.bound_per_hour == pytest.approx(upper, rel=1e-4)


def _at(confidence: float) -> EarlyVerdict:
    settings = VerdictSettings(confidence=confidence, min_proofs=2, sigma_floor=0.15,
                               planned_proofs=10)
    return assess([120.0] * 4, J, 240.0, MIN_RATE, settings)  # estimate 60/h


def test_higher_confidence_widens_the_bound_and_never_adds_a_verdict() -> None:
    # upper = 60 * exp(z * 0.15 / 2): z = 2.3263 (alpha 0.01 per test) -> 71.4 < 72;
    # z = 3.0902 -> 75.6; z = 3.7190 -> 79.3.
    low, mid, high = _at(0.9), _at(0.99), _at(0.999)
    assert low.bound_per_hour == pytest.approx(60 * math.exp(2.3263 * 0.075), rel=1e-4)
    assert mid.bound_per_hour == pytest.approx(60 * math.exp(3.0902 * 0.075), rel=1e-4)
    assert high.bound_per_hour == pytest.approx(60 * math.exp(3.7190 * 0.075), rel=1e-4)
    assert [low.decision, mid.decision, high.decision] == ["terminate", "undecided", "undecided"]
    decided = [v.decision != "undecided" for v in (low, mid, high)]
    assert decided == sorted(decided, reverse=True)


def test_more_proofs_at_the_same_rate_tighten_the_bound() -> None:
    bounds = [assess([120.0] * n, J, 60.0 * n, MIN_RATE, SETTINGS).bound_per_hour
              for n in range(2, 11)]
    assert all(b is not None for b in bounds)
    assert bounds == sorted(bounds, reverse=True)  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("proofs", "concurrency", "elapsed", "min_rate"),
    [([100.0], 0, 100.0, 72.0), ([100.0], 2, 100.0, 0.0), ([0.0], 2, 100.0, 72.0),
     ([100.0], 2, -1.0, 72.0), ([float("nan")], 2, 100.0, 72.0)],
)
def test_nonsense_inputs_are_refused(
    proofs: list[float], concurrency: int, elapsed: float, min_rate: float
) -> None:
    with pytest.raises(ValueError):
        assess(proofs, concurrency, elapsed, min_rate, SETTINGS)


@pytest.mark.parametrize(
    "kwargs",
    [{"confidence": 1.0}, {"confidence": 0.4}, {"min_proofs": 0}, {"sigma_floor": 0.0},
     {"min_proofs": 5, "planned_proofs": 4}],
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        VerdictSettings(**kwargs)  # type: ignore[arg-type]


def test_defaults_are_the_ones_the_simulation_picked() -> None:
    d = VerdictSettings()
    assert (d.confidence, d.min_proofs, d.sigma_floor, d.planned_proofs) == (0.95, 2, 0.15, 12)


# --- the finished benchmark's steady-state rate ----------------------------------------------


def test_steady_state_rate_of_a_batch_without_a_tail_equals_the_batch_rate() -> None:
    # 12 proofs of 100 s on 2 slots: 6 rounds, 600 s, 72/h either way.
    assert steady_state_rate_per_hour([100.0] * 12, 2, 600.0) == pytest.approx(72.0)


def test_steady_state_rate_corrects_the_idle_tail() -> None:
    # 12 proofs of 480 s on 8 slots: the second round has 4 proofs and 4 idle slots,
    # so the batch takes 960 s: 12 * 3600 / 960 = 45/h, while the host sustains
    # 8 * 3600 / 480 = 60/h: over the 4 proofs after the first round, 8 * 3600 * 4 / 1920.
    assert steady_state_rate_per_hour([480.0] * 12, 8, 960.0) == pytest.approx(60.0)
    # Unequal proofs on 2 slots: [100, 130, 100, 100, ...] end at 630 s; the slot time
    # 1230 s lies between J * wall - (J - 1) * max(w) = 1260 - 130 = 1130 and 1260.
    # The first round (100, 130) is left out: 2 * 3600 * 10 / 1000 = 72/h.
    proofs = [100.0, 130.0] + [100.0] * 10
    wall = slot_elapsed(proofs)
    assert wall == pytest.approx(630.0)
    assert steady_state_rate_per_hour(proofs, 2, wall) == pytest.approx(72.0)


def test_steady_state_rate_leaves_out_the_pipeline_fill() -> None:
    # What the simulated 4x RTX 5060 Ti reports at -j 8 (sim): the daemon
    # serialises the first round, so its proofs finish at 130, 223, ... 759 s; the
    # later ones wait behind a full pipeline. Over all 12 the rate would read
    # 8 * 3600 * 12 / 6409 = 53.9/h; after the first round 8 * 3600 * 4 / 2859 = 40.3/h,
    # the host's sustained rate (the simulator's 120-proof batch: 39.0/h).
    proofs = [130.0, 223.0, 318.0, 401.0, 479.0, 573.0, 667.0, 759.0, 725.0, 717.0, 710.0,
              707.0]
    wall = 12 * 3600 / 39.0  # 1107.7 s: 8 * 1107.7 - 7 * 759 = 3548.6 <= 6409 <= 8861.5
    assert steady_state_rate_per_hour(proofs, 8, wall) == pytest.approx(8 * 3600 * 4 / 2859)


def test_steady_state_rate_at_the_minimum_is_not_below_it() -> None:
    rate = steady_state_rate_per_hour([W0] * 12, J, 6 * W0)
    assert rate == pytest.approx(MIN_RATE)
    assert not rate < MIN_RATE - 1e-9  # type: ignore[operator]


@pytest.mark.parametrize(
    ("proofs", "concurrency", "wall", "failed", "why"),
    [
        ([100.0] * 3, 4, 100.0, 0, "fewer proofs than slots: the slots were never all busy"),
        ([100.0] * 2, 2, 100.0, 0, "no proof after the first round"),
        ([100.0] * 12, 2, 600.0, 1, "a failed proof's slot time is not in the list"),
        ([100.0] * 12, 2, 400.0, 0, "1200 slot-seconds do not fit in 2 x 400 s"),
        ([100.0] * 12, 4, 600.0, 0, "4 slots busy 600 s need at least 2100 s of proofs"),
        ([100.0] * 12, 2, 0.0, 0, "no wall time"),
        ([0.0] + [100.0] * 11, 2, 550.0, 0, "a proof of no length"),
    ],
)
def test_steady_state_rate_is_refused_when_the_proof_times_do_not_fill_the_slots(
    proofs: list[float], concurrency: int, wall: float, failed: int, why: str
) -> None:
    assert steady_state_rate_per_hour(proofs, concurrency, wall, proofs_failed=failed) is None, why


def test_steady_state_rate_cannot_be_inflated_by_the_order_of_proof_times() -> None:
    """[999, 999, 1, 1] adds up on 2 slots over 1000 s, yet dropping the first round
    would read 7200/h; the idle tail explains at most n / (n - (J - 1)) of the batch rate."""
    batch = 4 * 3600.0 / 1000.0  # 14.4/h
    got = steady_state_rate_per_hour([999.0, 999.0, 1.0, 1.0], 2, 1000.0)
    assert got == pytest.approx(batch * 4 / 3)  # 19.2/h, not 7200/h
