"""The numbers behind the belief lines (docs/reliability.md, "No rate on a host's word
alone"): how far above its references an honest first benchmark lands.

Run: ``python bench/belief.py`` (3 seeds, about a minute on two cores), ``--quick`` for one.

On bench/discovery.py's simulated market: the rate model is fitted on the measurements of
random machines (60 in the first seed, 200 in the others); each of 600 other machines
then runs one honest benchmark (the market's 4% benchmark noise and the neighbours of the
moment). Printed:

* **model**: the benchmark over the model's 90th percentile for its offer, predicted as a
  new host's (``belief.MODEL_FACTOR`` holds a claim above it): the largest ratio and the
  share above 1x, 1.25x, 1.5x, 2x;
* **twin**: the benchmark over the median of other machines' benchmarks on the same
  hardware (GPU model and count, CPU, RAM class: ``belief.TWIN_FACTOR``);
* **gpu-bound**: the benchmark over the card's bandwidth-scaled GPU-bound rate (what the
  ceiling is twice of);
* how many of them the coordinator's own rule (``belief.beyond_belief``) holds.

Every number printed is simulated and computed by this run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import discovery as market  # bench/discovery.py: the simulated market

from vast_manager.coordinator.decisions import belief
from vast_manager.coordinator.decisions.share import instance_share, ram_class
from vast_manager.coordinator.discovery.structural_model import Prediction, fit_rate_model
from vast_manager.coordinator.offers import parse_offer

FACTORS = (1.0, 1.25, 1.5, 2.0)


def first_benchmarks(seed: int, trained: int, tested: int
                     ) -> tuple[list[float], list[float], list[float], int, int]:
    """Over ``tested`` honest first benchmarks: benchmark / model 90th percentile,
    benchmark / twins' median (per GPU), benchmark / GPU-bound rate; how many the
    coordinator's own rule (``belief.beyond_belief``, a twin being the other tested
    machines of the same hardware) holds, and how many it judged."""
    rng = random.Random(seed)
    ms = []
    next_id = 50_000
    while len(ms) < trained:
        m = market._observe(market.new_machine(next_id, rng), rng)
        next_id += 1
        for _ in range(rng.choice((1, 1, 2, 3))):
            ms.append(market._measurement(m, rng.choice(m.slices()), rng, 0.0))
    model = fit_rate_model(ms)
    offers, rates = [], []
    for m in market.machines(tested, rng, first_id=next_id):
        k = rng.choice(m.slices())
        offers.append(parse_offer(m.offer(k, m.machine_id * 10 + k, 1.0)))
        rates.append(m.measure(k, rng))
    twins: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, offer in enumerate(offers):
        twins[(offer.gpu_name, offer.num_gpus, offer.cpu_name,
               ram_class(instance_share(offer).ram_gb))].append(i)
    to_model, to_twin, to_gpu = [], [], []
    held = judged = 0
    preds = model.predict_offers(offers, explain=False)
    for group in twins.values():
        for i in group:
            offer, pred, rate = offers[i], preds[i], rates[i]
            gpus = offer.num_gpus or 1
            others = [rates[j] / (offers[j].num_gpus or 1) for j in group if j != i]
            median = statistics.median(others) if others else None
            bound = belief.gpu_bound_rate_per_gpu(offer.gpu_name, offer.gpu_mem_bw)
            to_gpu.append(rate / (bound * gpus))
            if median:
                to_twin.append(rate / gpus / median)
            if not isinstance(pred, Prediction):
                continue
            to_model.append(rate / pred.rate_high)
            refs = belief.References(expected_high=pred.rate_high, novel=pred.novelty,
                                     twin_median_per_gpu=median)
            judged += 1
            held += belief.beyond_belief(rate, gpus, refs) is not None
    return to_model, to_twin, to_gpu, held, judged


def report(name: str, values: Sequence[float]) -> None:
    if not values:
        print(f"  {name:9s} no pairs")
        return
    ordered = sorted(values)
    shares = ", ".join(f"{sum(v > f for v in values) / len(values):.1%} above {f:g}x"
                       for f in FACTORS)
    print(f"  {name:9s} n {len(values):4d}; median {statistics.median(ordered):.2f}, "
          f"99th {ordered[int(0.99 * (len(ordered) - 1))]:.2f}, largest {ordered[-1]:.2f}; "
          f"{shares}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed")
    args = ap.parse_args(argv)
    seeds = [(1, 60)] if args.quick else [(1, 60), (2, 200), (3, 200)]
    model, twin, gpu = [], [], []
    held = judged = 0
    for seed, trained in seeds:
        a, b, c, h, n = first_benchmarks(seed, trained, 600)
        model += a
        twin += b
        gpu += c
        held += h
        judged += n
    print(f"Honest first benchmarks over their references (simulated; seeds "
          f"{[s for s, _ in seeds]}, 600 a seed)")
    report("model", model)
    report("twin", twin)
    report("gpu-bound", gpu)
    print(f"  held by the coordinator's rule (model {belief.MODEL_FACTOR:g}x; twin "
          f"{belief.TWIN_FACTOR:g}x and model {belief.TWIN_MODEL_FACTOR:g}x; unmeasured "
          f"hardware {belief.NOVEL_FACTOR:g}x): {held} of {judged} ({held / max(1, judged):.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
