"""Delivered beats claimed: is a kept instance delivering what it was kept on?

A benchmark says what a host *can* do, on its own report; the proofs it completes while
proving say what it *does*. Each monitor round brings an observation of what one
instance delivered since the last (``decisions.cluster_verdict.Delivered``, the one
observation type: proofs completed and failed, the window, the source, the last error;
here cuzk's completed-proof counter from its heartbeats, ``source = "cuzk"``; the
cluster's record, ``source = "cluster"``, is judged by ``cluster_verdict`` where a source
is configured). ``step`` folds it into a sequential test (Wald's SPRT on a Poisson count,
the early verdict's kind of test: docs/policy.md) of two hypotheses about the delivered
rate:

* H0: at least ``HONEST_SHARE`` (70%) of the rate it was kept on: an honest host, a
  little below its benchmark for the time the work command takes between proofs;
* H1: at most ``SHORT_SHARE`` (40%) of it: the benchmark was not what it delivers.

The test drifts towards H1 for a host delivering less than
``(l0 - l1) / ln(l0 / l1)`` = 54% of its rate (``crossover_share``): below about half
its rate a host is found short sooner or later; above 70% almost never.

The log-likelihood ratio of ``k`` proofs in ``t`` hours is
``k ln(l1/l0) - (l1 - l0) t``; it crosses ``ln((1 - BETA) / ALPHA)`` (short) or
``ln(BETA / (1 - ALPHA))`` (agrees: the test starts afresh, so it watches for ever). The
SPRT keeps its false-alarm rate at ``ALPHA`` however often it is looked at, so honest
noise (fewer proofs in one hour than the next) never trips it; a host delivering 1% of
its rate is found within minutes, one delivering 40% within hours. Proofs delivered
more regularly than a Poisson count (cuzk's are) only make it safer.

Pure: no clock, no I/O; the caller passes the observation and the kept rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vast_manager.coordinator.decisions.cluster_verdict import CLUSTER, Delivered

#: The share of its kept rate an honest host delivers at least (H0).
HONEST_SHARE = 0.7
#: The share below which a host is short (H1): it delivers at most half its rate.
SHORT_SHARE = 0.4
#: False alarms: the chance that one run of the test (from a fresh start to a decision)
#: calls short a host delivering 70% of its rate; the test starts afresh each time it
#: agrees, so over weeks of watching the chance adds up run by run.
ALPHA = 1e-6
#: Misses: the chance that a host delivering half its rate is called honest (each time
#: the test starts afresh; it keeps watching).
BETA = 0.01
@dataclass(frozen=True, slots=True)
class DeliveryTest:
    """The sequential test's running state for one instance (O(1), kept by the caller):
    the log-likelihood ratio since the test last started afresh, and the proofs and
    seconds it covers."""

    llr: float = 0.0
    completed: int = 0
    window_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """``short``: delivering below ``SHORT_SHARE`` of the kept rate (the test crossed its
    upper bound); ``ok``: the test is not decided against it. The numbers it was
    decided on are in ``reason``. ``agrees``: the test crossed its lower bound now (the
    host delivers what it was kept on, at ``delivered_rate_per_hour`` over the run that
    decided it), and starts afresh."""

    short: bool
    delivered_rate_per_hour: float | None
    reason: str | None = None
    agrees: bool = False


def crossover_share() -> float:
    """The delivered share below which the test drifts towards "short"."""
    return (HONEST_SHARE - SHORT_SHARE) / math.log(HONEST_SHARE / SHORT_SHARE)


def upper_bound() -> float:
    return math.log((1.0 - BETA) / ALPHA)


def lower_bound() -> float:
    return math.log(BETA / (1.0 - ALPHA))


def step(state: DeliveryTest, obs: Delivered, kept_rate_per_hour: float
         ) -> tuple[DeliveryTest, Verdict]:
    """Fold ``obs`` into ``state``; the new state and the verdict. A kept rate that is
    not positive judges nothing."""
    if not kept_rate_per_hour > 0 or obs.window_s < 0:
        return state, Verdict(False, None)
    l0 = HONEST_SHARE * kept_rate_per_hour
    l1 = SHORT_SHARE * kept_rate_per_hour
    hours = obs.window_s / 3600.0
    llr = state.llr + obs.completed * math.log(l1 / l0) - (l1 - l0) * hours
    completed = state.completed + obs.completed
    window_s = state.window_s + obs.window_s
    rate = completed * 3600.0 / window_s if window_s > 0 else None
    if llr <= lower_bound():
        return DeliveryTest(), Verdict(False, rate, agrees=True)  # start afresh
    state = DeliveryTest(llr, completed, window_s)
    if llr < upper_bound() or rate is None:
        return state, Verdict(False, rate)
    source = "the cluster's record" if obs.source == CLUSTER else "cuzk's counter"
    reason = (f"delivered {completed} proofs in {window_s / 3600.0:.2f} h ({rate:.1f}/h, "
              f"{source}): {rate / kept_rate_per_hour:.0%} of the {kept_rate_per_hour:.1f}/h "
              f"it was kept on, below the {crossover_share():.0%} the sequential test allows "
              f"(false alarms {ALPHA:g})")
    if obs.failed:
        reason += f"; {obs.failed} failed"
    if obs.last_error:
        reason += f"; last error: {obs.last_error}"
    return state, Verdict(True, rate, reason)
