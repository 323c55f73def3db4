"""Early verdicts against the fixed 12-proof rule, on a simulated vast.ai market.

Run: ``python bench/verdict.py [--hosts 2000] [--seed 1] [--sweep]``.

Each simulated host has a GPU class, a price (dph_total), a true sustained rate
between 25 and 110 proofs/hour, a per-proof noise of 5-15%, and, for some, a
slowdown under heat that builds up during the benchmark. Its minimum rate is
``dph_total / 0.008``. The benchmark itself is simulated proof by proof on J
concurrent slots, J = 2 per GPU as the agent runs it (``agent/lifecycle.py``:
``cuzk-bench batch -j 2 x GPUs``; a freed slot starts the next proof at once),
after a 5-7 minute warm-up that every policy pays.

Four policies see the same hosts and the same proof times:

- **A** (the original manager, and the coordinator with early verdicts off):
  after all 12 proofs, the batch rate ``12 * 3600 / elapsed``.
- **A'**: the same 12 proofs, judged on the steady-state rate ``J * 3600 * n /
  sum(w)`` (``coordinator.decisions.early_verdict.steady_state_rate_per_hour``).
- **B'**: ``coordinator.decisions.early_verdict.assess`` at every heartbeat (15 s) with the
  proofs so far and the elapsed time as the coordinator sees it (from its first
  benchmarking heartbeat, so up to 15 s short); ``terminate`` stops the host.
  ``pass`` is only recorded (the agent finishes its benchmark, as in the
  coordinator); the finished benchmark is judged like A.
- **B** (the coordinator's default): B' with the finished benchmark judged like A'.

"Good" means the true sustained rate (after any heat slowdown) is at least the
minimum. Every figure printed is computed by this run; nothing is typed in.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vast_manager.coordinator.decisions.early_verdict import (
    VerdictSettings,
    assess,
    steady_state_rate_per_hour,
)

MAX_USD_PER_PROOF = 0.008
BENCH_PROOFS = 12
HEARTBEAT_S = 15.0
RATE_RANGE_PER_HOUR = (25.0, 110.0)
MAX_DPH = 0.9  # the original manager's default offer filter (docs/policy.md)


@dataclass(frozen=True, slots=True)
class GpuClass:
    """A GPU model as rented on vast.ai: price per GPU and what one GPU of it proves."""

    name: str
    weight: float
    gpu_counts: tuple[tuple[int, float], ...]  # (number of GPUs, share of hosts)
    usd_per_gpu_hour: tuple[float, float]  # uniform range
    one_gpu_rate_per_hour: float  # a healthy one-GPU host with 512 GiB RAM
    extra_gpu_efficiency: tuple[float, float]  # each extra GPU adds this share of one


# Prices typical of vast.ai. Rates anchored on the operator's notes: a 5070 Ti
# rig 90-110/h with 512 GiB RAM, a 4090 61.4/h, 4x 5060 Ti 38.8/h (poor scaling),
# a 5090 host at 25.9/h (a hidden bottleneck).
MARKET: tuple[GpuClass, ...] = (
    GpuClass("RTX 5090", 0.18, ((1, 0.75), (2, 0.25)), (0.60, 0.80), 120.0, (0.3, 0.8)),
    GpuClass("RTX 4090", 0.25, ((1, 0.75), (2, 0.20), (4, 0.05)), (0.35, 0.50), 80.0,
             (0.3, 0.8)),
    GpuClass("RTX 5070 Ti", 0.20, ((1, 0.80), (2, 0.20)), (0.15, 0.25), 100.0, (0.3, 0.8)),
    GpuClass("RTX 5060 Ti", 0.17, ((1, 0.50), (2, 0.30), (4, 0.20)), (0.08, 0.12), 40.0,
             (0.0, 0.5)),
    GpuClass("RTX 3090", 0.20, ((1, 0.60), (2, 0.30), (4, 0.10)), (0.18, 0.25), 50.0,
             (0.4, 0.8)),
)
# Share of the 512 GiB rate at each RAM size (docs/policy.md, Simulation: 38 s per proof at
# 512 GiB, 43 s at 384, 53 s at 256; the offer filter keeps cpu_ram >= 240 GB).
RAM_FACTORS: tuple[tuple[float, float], ...] = ((38 / 53, 0.4), (38 / 43, 0.3), (1.0, 0.3))
HOST_SPREAD_LOG_SD = 0.12  # CPU model and clocks, PCIe, background load
SICK_SHARE = 0.12  # hosts with a hidden bottleneck (x1 riser, shared CPU, throttling)
SICK_FACTOR = (0.25, 0.65)
HEAT_SHARE = 0.2  # hosts that slow down as they heat up


@dataclass(frozen=True, slots=True)
class Host:
    gpu: str
    num_gpus: int
    dph_total: float
    true_rate_per_hour: float  # sustained, after any heat slowdown
    noise_sigma: float  # sd of log proof time
    heat_slowdown: float  # proof time grows by this share when hot (0: none)
    heat_ramp_s: float  # seconds of benchmark until fully hot
    warmup_s: float
    first_heartbeat_lag_s: float  # the coordinator first sees "benchmarking" this late

    @property
    def min_rate_per_hour(self) -> float:
        return self.dph_total / MAX_USD_PER_PROOF

    @property
    def good(self) -> bool:
        return self.true_rate_per_hour >= self.min_rate_per_hour


def _pick(rng: random.Random, options: Sequence[tuple[int, float]]) -> int:
    return rng.choices([o for o, _ in options], weights=[w for _, w in options])[0]


def make_host(rng: random.Random, at_minimum: bool = False) -> Host:
    """One offer from the market; ``at_minimum`` pins the true rate to the minimum."""
    while True:  # the original manager's default offer filter: dph <= 0.9
        cls = rng.choices(MARKET, weights=[c.weight for c in MARKET])[0]
        gpus = _pick(rng, cls.gpu_counts)
        dph = gpus * rng.uniform(*cls.usd_per_gpu_hour)
        if dph <= MAX_DPH:
            break
    lo, hi = RATE_RANGE_PER_HOUR
    while True:  # truncated to the observed spread by rejection
        rate = (
            cls.one_gpu_rate_per_hour
            * rng.choices([f for f, _ in RAM_FACTORS], weights=[w for _, w in RAM_FACTORS])[0]
            * math.exp(rng.gauss(0.0, HOST_SPREAD_LOG_SD))
            * (1.0 + sum(rng.uniform(*cls.extra_gpu_efficiency) for _ in range(gpus - 1)))
        )
        if rng.random() < SICK_SHARE:
            rate *= rng.uniform(*SICK_FACTOR)
        if lo <= rate <= hi:
            break
    degrades = rng.random() < HEAT_SHARE
    host = Host(
        gpu=cls.name, num_gpus=gpus, dph_total=dph, true_rate_per_hour=rate,
        noise_sigma=rng.uniform(0.05, 0.15),
        heat_slowdown=rng.uniform(0.10, 0.40) if degrades else 0.0,
        heat_ramp_s=rng.uniform(300.0, 1200.0),
        warmup_s=rng.uniform(300.0, 420.0),
        first_heartbeat_lag_s=rng.uniform(0.0, HEARTBEAT_S),
    )
    if at_minimum:
        host = replace(host, true_rate_per_hour=host.min_rate_per_hour)
    return host


def run_batch(host: Host, concurrency: int, rng: random.Random) -> list[tuple[float, float]]:
    """(completion time, wall seconds) of each proof, in completion order."""
    cool_rate = host.true_rate_per_hour * (1.0 + host.heat_slowdown)
    mean_cool_s = concurrency * 3600.0 / cool_rate
    sigma = host.noise_sigma
    slots = [0.0] * concurrency  # free times: all start together
    done: list[tuple[float, float]] = []
    for _ in range(BENCH_PROOFS):
        start = heapq.heappop(slots)
        heat = 1.0 + host.heat_slowdown * min(1.0, start / host.heat_ramp_s)
        # Mean-preserving lognormal noise, so the true rate is J*3600/E[w].
        wall = mean_cool_s * heat * math.exp(rng.gauss(-sigma * sigma / 2.0, sigma))
        heapq.heappush(slots, start + wall)
        done.append((start + wall, wall))
    done.sort()
    return done


@dataclass(frozen=True, slots=True)
class Outcome:
    terminated: bool
    seconds_to_verdict: float  # from deploy: warm-up + benchmark until the verdict
    early: bool  # terminated by an early verdict


def batch_rate(batch: list[tuple[float, float]]) -> float:
    """The coordinator's recomputed rate of a finished batch: ``n * 3600 / elapsed``."""
    return len(batch) * 3600.0 / batch[-1][0]


def steady_rate(batch: list[tuple[float, float]], concurrency: int) -> float:
    """The steady-state rate, exactly as the coordinator computes it (batch rate if refused)."""
    rate = steady_state_rate_per_hour([w for _, w in batch], concurrency, batch[-1][0])
    return batch_rate(batch) if rate is None else rate


def final_rule(host: Host, batch: list[tuple[float, float]], rate: float) -> Outcome:
    return Outcome(rate < host.min_rate_per_hour, host.warmup_s + batch[-1][0], False)


@dataclass(frozen=True, slots=True)
class Early:
    """What the early verdict did during one benchmark."""

    terminate_at_s: float | None  # benchmark seconds at the terminate, if any
    pass_at_s: float | None  # benchmark seconds at an early pass, if any


def early_look(
    host: Host, batch: list[tuple[float, float]], concurrency: int, settings: VerdictSettings
) -> Early:
    """``assess`` at every heartbeat until it terminates or passes, or the batch ends."""
    end = batch[-1][0]
    seen_from = host.first_heartbeat_lag_s
    beat = seen_from
    proofs: list[float] = []
    i = 0
    while beat < end:
        new = False
        while i < len(batch) and batch[i][0] <= beat:
            proofs.append(batch[i][1])
            i += 1
            new = True
        # Between proofs only the stall test can change, and only while at least J
        # proofs are still to come; skipping the other heartbeats saves time, not verdicts.
        if new or i <= BENCH_PROOFS - concurrency:
            v = assess(proofs, concurrency, beat - seen_from, host.min_rate_per_hour, settings)
            if v.decision == "terminate":
                return Early(beat, None)
            if v.decision == "pass":
                return Early(None, beat)  # the coordinator stops looking after a pass
        beat += HEARTBEAT_S
    return Early(None, None)


def early_rule(
    host: Host, batch: list[tuple[float, float]], early: Early, final_rate: float
) -> Outcome:
    if early.terminate_at_s is not None:
        return Outcome(True, host.warmup_s + early.terminate_at_s, True)
    return final_rule(host, batch, final_rate)


@dataclass(frozen=True, slots=True)
class Figures:
    terminated: int
    rent_terminated_usd: float
    rent_bad_usd: float
    rent_clearly_bad_usd: float  # true rate below 0.8 of the minimum
    rent_near_bad_usd: float  # true rate 0.8-1.0 of the minimum
    good_terminated: int
    good_terminated_early: int
    bad_kept: int
    median_min: float
    p90_min: float
    early_terminate: int
    early_pass: int


def _rent(host: Host, outcome: Outcome) -> float:
    return host.dph_total * outcome.seconds_to_verdict / 3600.0


def figures(hosts: Sequence[Host], outcomes: Sequence[Outcome], passes: int = 0) -> Figures:
    pairs = list(zip(hosts, outcomes, strict=True))
    rent = [_rent(h, o) for h, o in pairs]
    ratio = [h.true_rate_per_hour / h.min_rate_per_hour for h in hosts]
    minutes = sorted(o.seconds_to_verdict / 60.0 for o in outcomes)
    return Figures(
        terminated=sum(o.terminated for o in outcomes),
        rent_terminated_usd=math.fsum(r for r, o in zip(rent, outcomes, strict=True)
                                      if o.terminated),
        rent_bad_usd=math.fsum(r for r, q in zip(rent, ratio, strict=True) if q < 1.0),
        rent_clearly_bad_usd=math.fsum(r for r, q in zip(rent, ratio, strict=True) if q < 0.8),
        rent_near_bad_usd=math.fsum(r for r, q in zip(rent, ratio, strict=True)
                                    if 0.8 <= q < 1.0),
        good_terminated=sum(h.good and o.terminated for h, o in pairs),
        good_terminated_early=sum(h.good and o.terminated and o.early for h, o in pairs),
        bad_kept=sum(not h.good and not o.terminated for h, o in pairs),
        median_min=statistics.median(minutes),
        p90_min=statistics.quantiles(minutes, n=10)[-1],
        early_terminate=sum(o.early and o.terminated for o in outcomes),
        early_pass=passes,
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """Hosts whose true rate is exactly their minimum: early verdicts there are errors."""

    steady: int
    steady_early_terminate: int
    steady_early_pass: int
    heating: int
    heating_early_pass: int
    heating_kept_by_fixed: int


A_PRIME = "A'"
B_PRIME = "B'"
POLICIES = ("A", A_PRIME, B_PRIME, "B")
POLICY_TITLES = {
    "A": "A: 12, batch",
    "A'": "A': 12, steady",
    "B'": "B': early, batch",
    "B": "B: early, steady",
}


@dataclass(frozen=True, slots=True)
class Comparison:
    hosts: list[Host]
    outcomes: dict[str, list[Outcome]]
    figures: dict[str, Figures]
    calibration: Calibration

    @property
    def good(self) -> int:
        return sum(h.good for h in self.hosts)

    @property
    def bad(self) -> int:
        return len(self.hosts) - self.good

    def saved_pct(self, policy: str = "B", base: str = "A") -> float:
        """Rent on the hosts each policy terminates: the acceptance figure (B against A)."""
        return _saved(self.figures[base].rent_terminated_usd,
                      self.figures[policy].rent_terminated_usd)

    def saved_on_both_pct(self, policy: str = "B", base: str = "A") -> float:
        """Rent on the hosts both policies terminate: the saving from speed alone."""
        before = after = 0.0
        for h, a, b in zip(self.hosts, self.outcomes[base], self.outcomes[policy], strict=True):
            if a.terminated and b.terminated:
                before += _rent(h, a)
                after += _rent(h, b)
        return _saved(before, after)

    def saved_on_bad_pct(self, policy: str = "B", base: str = "A") -> float:
        return _saved(self.figures[base].rent_bad_usd, self.figures[policy].rent_bad_usd)

    def good_terminated_pct(self, policy: str = "B") -> float:
        return 100.0 * self.figures[policy].good_terminated / self.good if self.good else 0.0

    def bad_kept_pct(self, policy: str = "B") -> float:
        return 100.0 * self.figures[policy].bad_kept / self.bad if self.bad else 0.0


def _saved(before: float, after: float) -> float:
    return 100.0 * (1.0 - after / before) if before else 0.0


def compare(
    n_hosts: int, seed: int, settings: VerdictSettings, concurrency_per_gpu: int = 2
) -> Comparison:
    """Every policy on the same hosts and the same proof times (common random numbers)."""
    rng = random.Random(seed)
    hosts = [make_host(rng) for _ in range(n_hosts)]
    outcomes: dict[str, list[Outcome]] = {p: [] for p in POLICIES}
    passes = 0
    for host in hosts:
        j = concurrency_per_gpu * host.num_gpus
        batch = run_batch(host, j, rng)
        early = early_look(host, batch, j, settings)
        passes += early.pass_at_s is not None
        by_batch, by_steady = batch_rate(batch), steady_rate(batch, j)
        outcomes["A"].append(final_rule(host, batch, by_batch))
        outcomes[A_PRIME].append(final_rule(host, batch, by_steady))
        outcomes[B_PRIME].append(early_rule(host, batch, early, by_batch))
        outcomes["B"].append(early_rule(host, batch, early, by_steady))
    figs = {p: figures(hosts, o, passes if p in ("B", B_PRIME) else 0)
            for p, o in outcomes.items()}
    return Comparison(hosts, outcomes, figs,
                      calibrate(n_hosts, seed + 1, settings, concurrency_per_gpu))


def calibrate(
    n_hosts: int, seed: int, settings: VerdictSettings, concurrency_per_gpu: int = 2
) -> Calibration:
    rng = random.Random(seed)
    counts = [0] * 6
    for _ in range(n_hosts):
        host = make_host(rng, at_minimum=True)
        j = concurrency_per_gpu * host.num_gpus
        batch = run_batch(host, j, rng)
        early = early_look(host, batch, j, settings)
        if host.heat_slowdown == 0.0:
            counts[0] += 1
            counts[1] += early.terminate_at_s is not None
            counts[2] += early.pass_at_s is not None
        else:
            counts[3] += 1
            counts[4] += early.pass_at_s is not None
            counts[5] += batch_rate(batch) >= host.min_rate_per_hour
    return Calibration(*counts)


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "-"


def print_comparison(c: Comparison, settings: VerdictSettings, per_gpu: int) -> None:
    n = len(c.hosts)
    f = c.figures
    print(f"hosts: {n}  good (true rate >= minimum): {c.good}  bad: {c.bad}  "
          f"degrading under heat: {sum(h.heat_slowdown > 0 for h in c.hosts)}  "
          f"benchmark concurrency: {per_gpu} per GPU")
    print(f"early-verdict settings: confidence={settings.confidence} "
          f"min_proofs={settings.min_proofs} sigma_floor={settings.sigma_floor} "
          f"planned_proofs={settings.planned_proofs}")
    print("A: 12 proofs, batch rate 12*3600/elapsed (today's rule)   "
          "A': 12 proofs, steady-state rate J*3600*n/sum(w)")
    print("B': early verdict, then A's final rule   "
          "B: early verdict, then the final rule of A' (the coordinator's default)")
    print()

    def row(label: str, cell: Callable[[str], str]) -> tuple[str, list[str]]:
        return label, [cell(p) for p in POLICIES]

    rows = [
        row("hosts terminated", lambda p: f"{f[p].terminated}"),
        row("rent on terminated hosts (deploy to verdict)",
            lambda p: f"${f[p].rent_terminated_usd:,.2f}"),
        row("rent on truly bad hosts (deploy to verdict)", lambda p: f"${f[p].rent_bad_usd:,.2f}"),
        row("  of which true rate < 0.8 x minimum",
            lambda p: f"${f[p].rent_clearly_bad_usd:,.2f}"),
        row("  of which true rate 0.8-1.0 x minimum",
            lambda p: f"${f[p].rent_near_bad_usd:,.2f}"),
        row("good hosts wrongly terminated",
            lambda p: f"{f[p].good_terminated} ({_pct(f[p].good_terminated, c.good)})"),
        row("  of which by an early verdict",
            lambda p: f"{f[p].good_terminated_early}" if p.startswith("B") else "-"),
        row("bad hosts wrongly kept",
            lambda p: f"{f[p].bad_kept} ({_pct(f[p].bad_kept, c.bad)})"),
        row("time to verdict from deploy, median (min)", lambda p: f"{f[p].median_min:.1f}"),
        row("time to verdict from deploy, p90 (min)", lambda p: f"{f[p].p90_min:.1f}"),
        row("early terminate / early pass",
            lambda p: f"{f[p].early_terminate} / {f[p].early_pass}" if p.startswith("B")
            else "-"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'':{width}}" + "".join(f"  {POLICY_TITLES[p]:>17}" for p in POLICIES))
    for label, cells in rows:
        print(f"{label:{width}}" + "".join(f"  {x:>17}" for x in cells))
    print()
    print(f"rent saved on the hosts each policy terminates, B against A: {c.saved_pct():.1f}% "
          f"(B' against A: {c.saved_pct(B_PRIME):.1f}%; B against A', the early verdict alone: "
          f"{c.saved_pct('B', A_PRIME):.1f}%)")
    print(f"rent saved on the hosts both terminate, B against A: {c.saved_on_both_pct():.1f}%; "
          f"on the truly bad hosts: {c.saved_on_bad_pct():.1f}% (below 0.8 x minimum "
          f"{_saved(f['A'].rent_clearly_bad_usd, f['B'].rent_clearly_bad_usd):.1f}%, "
          f"0.8-1.0 x minimum {_saved(f['A'].rent_near_bad_usd, f['B'].rent_near_bad_usd):.1f}%)")
    k = c.calibration
    print(f"hosts exactly at their minimum: steady {k.steady}: early terminate "
          f"{_pct(k.steady_early_terminate, k.steady)}, early pass "
          f"{_pct(k.steady_early_pass, k.steady)} (each at most "
          f"{100 * (1 - settings.confidence):g}% by construction); "
          f"heating up {k.heating}: early pass "
          f"{_pct(k.heating_early_pass, k.heating)}, kept by A's rule "
          f"{_pct(k.heating_kept_by_fixed, k.heating)}")
    ok_saved = c.saved_pct() >= 40.0
    ok_good = c.good_terminated_pct("B") <= 1.0
    print(f"acceptance (B against A): >= 40% less rent on failing hosts: "
          f"{'yes' if ok_saved else 'NO'} ({c.saved_pct():.1f}%); <= 1% of good hosts "
          f"terminated: {'yes' if ok_good else 'NO'} ({c.good_terminated_pct('B'):.2f}%)")


SWEEP_CONFIDENCE = (0.9, 0.95, 0.98, 0.99, 0.995, 0.999)
SWEEP_MIN_PROOFS = (1, 2, 3, 4, 5, 6)
PICK_TOLERANCE_PCT = 1.0
MAX_AT_MINIMUM_EARLY_TERMINATE = 0.005
MAX_EXTRA_BAD_KEPT_PCT = 1.0


def sweep(n_hosts: int, seed: int, base: VerdictSettings, per_gpu: int) -> VerdictSettings | None:
    """Every (confidence, min_proofs) on the same market; the pick is the rule in the docs."""
    print(f"{'confidence':>10} {'min_proofs':>10} {'saved %':>8} {'saved both %':>12} "
          f"{'good term %':>11} {'early good term':>15} {'bad kept %':>10} {'median min':>10} "
          f"{'p90 min':>8} {'at-min early term %':>19}")
    results: list[tuple[VerdictSettings, Comparison]] = []
    for conf in SWEEP_CONFIDENCE:
        for k in SWEEP_MIN_PROOFS:
            s = replace(base, confidence=conf, min_proofs=k)
            c = compare(n_hosts, seed, s, per_gpu)
            results.append((s, c))
            cal = c.calibration
            print(f"{conf:>10} {k:>10} {c.saved_pct():>8.1f} {c.saved_on_both_pct():>12.1f} "
                  f"{c.good_terminated_pct():>11.2f} "
                  f"{c.figures['B'].good_terminated_early:>15} "
                  f"{c.bad_kept_pct():>10.2f} {c.figures['B'].median_min:>10.1f} "
                  f"{c.figures['B'].p90_min:>8.1f} "
                  f"{100.0 * cal.steady_early_terminate / cal.steady:>19.2f}")
    # The rule: an early verdict may not terminate a single good host of this
    # market, nor keep more than 1 point more bad hosts than the same final rule
    # without it (A'), and hosts exactly at their minimum may be terminated early
    # at most 0.5% of the time (half the 1% budget for good hosts, the rest left
    # to the final rule). Among those, the highest confidence (then the most
    # proofs) within 1 point of the best saving: caution that costs under a
    # point of rent is worth having.
    first = results[0][1]
    print()
    print(f"on this market: A terminates {first.good_terminated_pct('A'):.2f}% of good hosts "
          f"and keeps {first.bad_kept_pct('A'):.2f}% of bad ones; A' "
          f"{first.good_terminated_pct(A_PRIME):.2f}% and {first.bad_kept_pct(A_PRIME):.2f}%")
    eligible = [
        (s, c) for s, c in results
        if c.figures["B"].good_terminated_early == 0
        and c.bad_kept_pct("B") <= c.bad_kept_pct(A_PRIME) + MAX_EXTRA_BAD_KEPT_PCT
        and c.calibration.steady_early_terminate
        <= MAX_AT_MINIMUM_EARLY_TERMINATE * c.calibration.steady
    ]
    if not eligible:
        print("no setting meets the rule")
        return None
    best = max(c.saved_pct() for _, c in eligible)
    s, c = max(
        ((s, c) for s, c in eligible if c.saved_pct() >= best - PICK_TOLERANCE_PCT),
        key=lambda sc: (sc[0].confidence, sc[0].min_proofs),
    )
    print(f"best saving {best:.1f}%; pick: confidence={s.confidence} "
          f"min_proofs={s.min_proofs} (saved {c.saved_pct():.1f}%, good terminated "
          f"{c.good_terminated_pct():.2f}%, none of them early)")
    return s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2000, help="simulated hosts (>= 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sweep", action="store_true",
                        help="also sweep confidence x min_proofs and pick the defaults")
    parser.add_argument("--concurrency-per-gpu", type=int, default=2,
                        help="J = this x GPUs (default 2, as the agent runs the benchmark)")
    args = parser.parse_args(argv)
    if args.hosts < 1000:
        parser.error("--hosts must be at least 1000")
    if args.concurrency_per_gpu < 1:
        parser.error("--concurrency-per-gpu must be at least 1")
    settings = VerdictSettings()
    c = compare(args.hosts, args.seed, settings, args.concurrency_per_gpu)
    print_comparison(c, settings, args.concurrency_per_gpu)
    if args.sweep:
        print()
        sweep(args.hosts, args.seed, settings, args.concurrency_per_gpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
