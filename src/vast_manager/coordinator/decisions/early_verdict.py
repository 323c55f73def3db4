"""Early benchmark verdicts: stop paying for a clearly failing host after a few proofs.

Pure: no I/O and no clock. The caller passes the benchmark proofs seen so far,
the concurrency, and the elapsed seconds of the batch (from its own injected
clock); ``assess`` answers ``terminate``, ``pass`` or ``undecided``.

Method
------
The benchmark runs ``planned_proofs`` proofs (N, default 12) on J concurrent
slots, so a host's rate is ``J * 3600 / E[w]`` for per-proof wall seconds w.

1. **Rate bound from the proof times.** After n proofs the rate estimate is
   ``r = J * 3600 * n / sum(w)`` (the same arithmetic as the final result's
   rate, without the batch's start and end effects). Proof times are modelled
   as lognormal, so the log of a mean of n of them is close to normal with
   standard deviation ``sigma / sqrt(n)``, sigma being the spread of log w
   (about the coefficient of variation, 5-15% observed). The one-sided bounds
   are ``r * exp(+-z * sigma_hat / sqrt(n))`` with ``sigma_hat =
   max(sigma_floor, s)``, s the sample standard deviation of log w. The
   floor sits at the top of the observed noise, so that two or three proofs
   that happen to agree never produce a narrow interval. ``terminate`` when
   the upper bound is below the minimum rate, ``pass`` when the lower bound
   is above it; nothing is decided before ``min_proofs`` proofs.
2. **Censoring: a host that stalls.** While all J slots are busy (at most
   N - J proofs done, none failed), the slot-seconds spent on proofs still
   running are ``J * elapsed - sum(w)``, so the oldest running proof has been
   running at least ``a = elapsed - sum(w) / J``. At exactly the minimum rate
   a proof's median is ``w0 = J * 3600 / min_rate``; the chance that any of
   the N proofs lasts ``w0 * exp(z' * sigma_hat)`` is at most ``N * (1 -
   Phi(z'))``. ``terminate`` when ``a`` passes that line: a host that has
   completed nothing (or little) in a long time is caught without waiting for
   its proofs. This test needs no ``min_proofs``: it is one event per
   benchmark, however often it is looked at.
3. **Optional stopping.** The proof-time test is looked at after every proof
   from ``min_proofs`` to N, and the stall test once more: a Bonferroni
   correction spreads ``alpha = 1 - confidence`` over those
   ``N - min_proofs + 2`` tests (``z`` and ``z'`` are the normal quantiles of
   ``1 - alpha_test`` and ``1 - alpha_test / N``). A host whose true rate is
   at the minimum, with per-proof noise up to ``sigma_floor``, is then
   terminated early with probability at most ``alpha`` (and passed early
   with at most ``alpha``), however many heartbeats look at it. Bonferroni
   ignores the strong correlation between successive looks, so the real
   error is smaller; ``bench/verdict.py`` measures it and chose the
   defaults.

A host right at its minimum (all proofs at ``w0``) has the estimate exactly
at the minimum, inside both bounds, so it stays ``undecided`` at every look;
the full benchmark and the ordinary rule on its recomputed rate judge it.

Limits, stated so the caller can respect them: the stall test assumes the
agent starts the next proof as soon as a slot frees (as ``cuzk-bench batch``
does) and is skipped once a proof failed (a failed proof's slot time is not in
the list) or when fewer than J proofs remain; ``elapsed_s`` must not run
ahead of the true batch time (the coordinator measures it from the latest start
its own clock and the completed proofs vouch for, so the error is on the host's
side: ``vast_manager.coordinator.operations.verdict_tracking``); the
lognormal bound on the median is slightly on the host's side for a
terminate (the median is below the mean by ``sigma**2 / 2``, at most 1.1%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

from vast_manager.agent.config import BENCH_PROOFS
from vast_manager.coordinator.settings import DEFAULTS

Decision = Literal["terminate", "pass", "undecided"]


@dataclass(frozen=True, slots=True)
class VerdictSettings:
    """The early-verdict knobs; defaults chosen by ``bench/verdict.py --sweep``."""

    confidence: float = DEFAULTS.verdict_confidence
    """Family-wise confidence of an early verdict, over every look of one benchmark."""
    min_proofs: int = DEFAULTS.verdict_min_proofs
    """No verdict from proof times before this many proofs (the stall test is exempt)."""
    sigma_floor: float = DEFAULTS.verdict_sigma_floor
    """Smallest spread of log proof time assumed (15% per proof, the top of the observed)."""
    planned_proofs: int = BENCH_PROOFS
    """Proofs in the benchmark (the agent's ``VM_BENCH_PROOFS``); sets the number of looks."""

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if self.min_proofs < 1:
            raise ValueError(f"min_proofs must be at least 1, got {self.min_proofs}")
        if not self.sigma_floor > 0:
            raise ValueError(f"sigma_floor must be positive, got {self.sigma_floor}")
        if self.planned_proofs < self.min_proofs:
            raise ValueError(
                f"planned_proofs ({self.planned_proofs}) is below min_proofs ({self.min_proofs})"
            )

    @property
    def tests(self) -> int:
        """Tests sharing alpha: one per proof-time look (min_proofs..N) plus the stall test."""
        return self.planned_proofs - self.min_proofs + 2

    @property
    def alpha_per_test(self) -> float:
        return (1.0 - self.confidence) / self.tests


@dataclass(frozen=True, slots=True)
class EarlyVerdict:
    """What the proofs so far say; ``reason`` is one sentence with the numbers."""

    decision: Decision
    rate_estimate_per_hour: float | None
    """``J * 3600 * n / sum(w)``; None before the first proof."""
    bound_per_hour: float | None
    """The bound behind the decision: upper for terminate, lower for pass, None when
    undecided before ``min_proofs``; when undecided later, the upper bound."""
    proofs: int
    statistic: float | None
    """Standard scores: for the proof-time test ``(ln min - ln estimate) / (sigma/sqrt n)``,
    for the stall test ``ln(a / w0) / sigma``; positive means slower than the minimum."""
    reason: str


@lru_cache(maxsize=256)
def _upper_quantile(tail: float) -> float:
    """The standard normal z with ``P(Z > z) = tail`` (cached: settings repeat)."""
    return NormalDist().inv_cdf(1.0 - tail)


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


def assess(
    proof_seconds: list[float],
    concurrency: int,
    elapsed_s: float,
    min_rate_per_hour: float,
    settings: VerdictSettings,
    *,
    proofs_failed: int = 0,
) -> EarlyVerdict:
    """Judge a running benchmark from its completed proofs and elapsed time.

    ``proof_seconds``: wall seconds of every proof completed so far in this
    benchmark run (all heartbeats' ``proof_seconds_recent`` concatenated).
    ``elapsed_s``: seconds since the batch started. ``proofs_failed``: failed
    proofs so far (``progress.done`` minus completed), which disables the
    stall test.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if not min_rate_per_hour > 0:
        raise ValueError(f"min_rate_per_hour must be positive, got {min_rate_per_hour}")
    if not elapsed_s >= 0 or math.isinf(elapsed_s):
        raise ValueError(f"elapsed_s must be a finite number >= 0, got {elapsed_s}")
    if any(not (w > 0 and math.isfinite(w)) for w in proof_seconds):
        raise ValueError("proof_seconds must all be positive finite numbers")

    n = len(proof_seconds)
    conf = _pct(settings.confidence)
    alpha = settings.alpha_per_test
    total_s = math.fsum(proof_seconds)
    logs = [math.log(w) for w in proof_seconds]
    # Sample spread needs two proofs; below the floor the floor rules anyway.
    s = _stdev(logs) if n >= 2 else 0.0
    sigma = max(settings.sigma_floor, s)
    estimate = concurrency * 3600.0 * n / total_s if n else None
    minimum = min_rate_per_hour

    stall = _stall_test(n, total_s, concurrency, elapsed_s, minimum, sigma, settings,
                        alpha, proofs_failed)

    if n < settings.min_proofs:
        if stall is not None:
            return _stall_verdict(stall, estimate, n, minimum, conf)
        est_text = "" if estimate is None else f" (estimate {estimate:.1f}/h)"
        statistic = None if estimate is None else _z(minimum, estimate, sigma, n)
        return EarlyVerdict(
            "undecided", estimate, None, n, statistic,
            f"{n} of the {settings.min_proofs} proofs needed before an early verdict{est_text}",
        )

    assert estimate is not None  # n >= min_proofs >= 1
    half_width = _upper_quantile(alpha) * sigma / math.sqrt(n)
    upper = estimate * math.exp(half_width)
    lower = estimate * math.exp(-half_width)
    statistic = _z(minimum, estimate, sigma, n)
    if upper < minimum:
        return EarlyVerdict(
            "terminate", estimate, upper, n, statistic,
            f"after {n} proofs the rate is at most {upper:.1f}/h with {conf} confidence "
            f"(estimate {estimate:.1f}/h), below the minimum {minimum:.1f}/h",
        )
    if stall is not None:
        return _stall_verdict(stall, estimate, n, minimum, conf)
    if lower > minimum:
        return EarlyVerdict(
            "pass", estimate, lower, n, statistic,
            f"after {n} proofs the rate is at least {lower:.1f}/h with {conf} confidence "
            f"(estimate {estimate:.1f}/h), above the minimum {minimum:.1f}/h",
        )
    return EarlyVerdict(
        "undecided", estimate, upper, n, statistic,
        f"after {n} proofs the rate is between {lower:.1f}/h and {upper:.1f}/h "
        f"with {conf} confidence (estimate {estimate:.1f}/h), around the minimum "
        f"{minimum:.1f}/h",
    )


@dataclass(frozen=True, slots=True)
class _Stall:
    running_s: float  # the oldest running proof has run at least this long
    bound_per_hour: float
    statistic: float
    in_flight: int


def _stall_test(
    n: int, total_s: float, concurrency: int, elapsed_s: float, minimum: float,
    sigma: float, settings: VerdictSettings, alpha: float, proofs_failed: int,
) -> _Stall | None:
    """The censored-time test; a ``_Stall`` only when it says terminate."""
    # Slot-time accounting holds only while every slot runs a proof of this batch.
    if proofs_failed > 0 or n > settings.planned_proofs - concurrency:
        return None
    running_s = elapsed_s - total_s / concurrency
    if running_s <= 0:
        return None
    # Union bound over the N proofs: the event "some proof lasts this long" is
    # one event per benchmark, so watching it at every heartbeat costs nothing more.
    z_stall = _upper_quantile(alpha / settings.planned_proofs)
    # Fastest rate whose proofs would still run this long with that small a chance.
    bound = concurrency * 3600.0 * math.exp(z_stall * sigma) / running_s
    if bound >= minimum:
        return None
    statistic = math.log(running_s * minimum / (concurrency * 3600.0)) / sigma
    return _Stall(running_s, bound, statistic, concurrency)


def _stall_verdict(
    stall: _Stall, estimate: float | None, n: int, minimum: float, conf: str
) -> EarlyVerdict:
    if n == 0:
        what = (f"no proof completed in {stall.running_s:.0f} s with {stall.in_flight} "
                "running")
    else:
        what = (f"after {n} proofs a proof has been running at least "
                f"{stall.running_s:.0f} s")
    return EarlyVerdict(
        "terminate", estimate, stall.bound_per_hour, n, stall.statistic,
        f"{what}: the rate is at most {stall.bound_per_hour:.1f}/h with {conf} confidence, "
        f"below the minimum {minimum:.1f}/h",
    )


def steady_state_rate_per_hour(
    proof_seconds: list[float], concurrency: int, wall_seconds: float, *,
    proofs_failed: int = 0, tolerance: float = 0.05,
) -> float | None:
    """The finished benchmark's steady-state rate, or None when it cannot be trusted.

    ``proof_seconds`` in completion order (as the agent reports them). A batch
    of N proofs on J slots has two transients that ``n * 3600 / wall_seconds``
    mixes into its rate: at its end a slot idles (no proof left to start), so
    the batch rate under-reads; at its start the J proofs enter together and
    the daemon's pipeline serialises them, so the first ones finish sooner than
    a proof does once the pipeline is full. By Little's law the rate while every
    slot is busy is J over the mean proof time; it is taken over the proofs that
    completed after the first J (the first round carries the fill):
    ``J * 3600 * (n - J) / sum(w[J:])``.

    Used only when the proof times fill the J slots as a batch must: the slot
    time ``sum(w)`` is at most ``J * wall_seconds`` and, as a slot idles only
    after the last proof started, at least ``J * wall_seconds - (J - 1) *
    max(w)`` (each with ``tolerance`` of slack). Anything else - no proof after
    the first round, a failed proof (its slot time is not in the list), proof
    times that do not add up - answers None, and the batch rate judges.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    n = len(proof_seconds)
    if proofs_failed > 0 or n <= concurrency or not wall_seconds > 0:
        return None
    if any(not (w > 0 and math.isfinite(w)) for w in proof_seconds):
        return None
    total = math.fsum(proof_seconds)
    capacity = concurrency * wall_seconds
    slack = tolerance * capacity + 1.0
    if total > capacity + slack:
        return None
    if total < capacity - (concurrency - 1) * max(proof_seconds) - slack:
        return None
    later = proof_seconds[concurrency:]
    steady = concurrency * 3600.0 * len(later) / math.fsum(later)
    # A host controls the split of its slot time between the first round and the
    # rest ([999, 999, 1, 1] adds up yet reads 7200/h). Only the idle tail is a
    # real reason to read above the batch rate, and it idles at most J - 1 slots.
    batch = n * 3600.0 / wall_seconds
    return min(steady, batch * n / (n - (concurrency - 1)))


def _z(minimum: float, estimate: float, sigma: float, n: int) -> float:
    return (math.log(minimum) - math.log(estimate)) / (sigma / math.sqrt(n))


def _stdev(values: list[float]) -> float:
    # statistics.stdev on floats is exact but slow (Fractions); the market
    # simulation calls this hundreds of thousands of times.
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
