"""What a trial is worth to the fleet (``fleet_gain.gain_per_hour``): the vectorised
expectation against the loop it replaced, on the same inputs in the same run.

Run: ``python bench/fleet_gain.py [--calls 3000] [--seed 1] [--quick]`` (about 20 s).

The plan values every offer on the market this way on each ``plan``, one call an offer.
Each call here draws what a plan sees: a fleet of 10
to 20 hosts on offer, one newcomer (sometimes two, a machine's slices), and a prediction
of 1 to 13 modes (a RAM share on a step of cuzk's partitions in flight has several).
The reference is the per-mode, per-node loop the project shipped before
(``reference_gain_per_hour`` below, as shipped but for two names set before the
branch that uses them, which mypy asks of a module of its own); the run checks that
both give the same figure (to 1e-9, relative) before it times them. Prints the calls a
second of each, the best of 3 rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vast_manager.coordinator.discovery.fleet_gain import (
    NODES,
    WEIGHTS,
    Draw,
    FleetHost,
    gain_per_hour,
)

Call = tuple[tuple[FleetHost, ...], int, list[float], list[Draw], tuple[FleetHost, ...] | None]


def reference_gain_per_hour(base: Sequence[FleetHost], size: int, dph_total: Sequence[float],
                            draws: Sequence[Draw], *,
                            relying: Sequence[FleetHost] | None = None) -> float:
    """The loop ``gain_per_hour`` replaced (``git show 34a6c89:src/vast_manager/
    coordinator/discovery/fleet_gain.py``): one draw and one quadrature node at a time."""
    if not base:
        return 0.0
    cost = np.array([h.dph_total for h in base])
    rate = np.array([h.rate_per_hour for h in base])
    p0 = float(cost.sum() / rate.sum())
    new_cost = np.asarray(dph_total, dtype=float)
    all_cost = np.concatenate([cost, new_cost])
    held_cost = held_rate = 0.0
    if relying is not None:
        held_cost = sum(h.dph_total for h in relying) + float(new_cost.sum())
        held_rate = sum(h.rate_per_hour for h in relying)
    gain = 0.0
    loss = 0.0
    for weight, mus, sds in draws:
        mu = np.asarray(mus, dtype=float)
        sd = np.asarray(sds, dtype=float)
        for z, w in zip(NODES, WEIGHTS, strict=True):
            drawn = np.exp(mu + sd * z)
            all_rate = np.concatenate([rate, drawn])
            best = np.argsort(all_cost / all_rate, kind="stable")[:size]
            p1 = float(all_cost[best].sum() / all_rate[best].sum())
            gain += weight * float(w) * max(0.0, p0 - p1)
            if relying is not None:
                pu = held_cost / (held_rate + float(drawn.sum()))
                loss += weight * float(w) * max(0.0, pu - p1)
    return max(gain, loss) * float(rate.sum())


def calls(n: int, seed: int) -> list[Call]:
    rng = random.Random(seed)
    out: list[Call] = []
    for _ in range(n):
        hosts = tuple(FleetHost(str(i), rng.uniform(0.1, 0.6), rng.uniform(30.0, 150.0))
                      for i in range(rng.randint(10, 20)))
        k = 1 if rng.random() < 0.9 else 2
        modes = rng.choice((1, 1, 2, 3, 13))
        ws = [rng.random() for _ in range(modes)]
        draws: list[Draw] = [(w / sum(ws), [rng.uniform(3.5, 5.0) for _ in range(k)],
                              [rng.uniform(0.05, 0.8) for _ in range(k)]) for w in ws]
        relying = hosts[:9] if rng.random() < 0.2 else None
        out.append((hosts, 10, [rng.uniform(0.1, 0.6) for _ in range(k)], draws, relying))
    return out


def per_second(fn: object, work: list[Call]) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for base, size, dph, draws, relying in work:
            fn(base, size, dph, draws, relying=relying)  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return len(work) / best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="200 calls, a smoke run")
    args = ap.parse_args()
    work = calls(200 if args.quick else args.calls, args.seed)
    for base, size, dph, draws, relying in work:
        a = reference_gain_per_hour(base, size, dph, draws, relying=relying)
        b = gain_per_hour(base, size, dph, draws, relying=relying)
        if abs(a - b) > 1e-9 * max(abs(a), 1e-12):
            print(f"the two differ: {a!r} against {b!r}")
            return 1
    print(f"{len(work)} calls; both give the same figure on every one (to 1e-9)")
    ref = per_second(reference_gain_per_hour, work)
    new = per_second(gain_per_hour, work)
    print(f"the loop (before): {ref:,.0f} calls/s")
    print(f"vectorised (now):  {new:,.0f} calls/s  ({new / ref:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
