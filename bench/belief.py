"""The numbers behind the belief lines (docs/reliability.md, "No rate on a host's word
alone"): how far above its references an honest benchmark lands, and what bounding what
the model learns costs it.

Run: ``python bench/belief.py`` (3 seeds, under a minute on two cores), ``--quick`` for
one.

On bench/discovery.py's simulated market: the rate model is fitted on the measurements of
random machines (60 in the first seed, 200 in the others); each of 600 other machines
then runs one honest benchmark (the market's 4% benchmark noise and the neighbours of the
moment), and a second one later on the same slice. Printed, each the figure a threshold
of ``coordinator/decisions/belief.py`` is set from:

* **model (confident)** / **model (novel)**: the first benchmark over the model's 90th
  percentile for its offer, predicted as a new host's, where the model measured the GPU
  model and CPU family (``belief.MODEL_FACTOR``) and where it never did
  (``belief.NOVEL_FACTOR``): the largest ratio and the share above 1x, 1.25x, 1.5x, 2x;
* **own**: the second benchmark over the machine's first (``belief.OWN_FACTOR``);
* **twin**: the first benchmark over the median of other machines' first benchmarks on
  the same hardware (GPU model and count, CPU, RAM class: why a twin is no hold line,
  only a bound on what the model learns, ``belief.TWIN_FACTOR``);
* **gpu-bound**: the benchmark over the card's bandwidth-scaled GPU-bound rate
  (``belief.BANDWIDTH_FACTOR``; the ceiling, ``belief.CEILING_FACTOR``, is twice it);
* how many first and second benchmarks the coordinator's own rule
  (``belief.beyond_belief``) holds;
* **learning bounded**: the model's accuracy on the 600 machines' true rates when every
  training measurement above its ``belief.learn_bound`` (the model fitted on the ones
  before it, in batches as the coordinator refits) is learned at that bound, as if no
  delivery ever agreed (the worst case), beside the same model learning every rate whole;
  and how many first benchmarks the rule holds against that model.

Every number printed is simulated and computed by this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import discovery as market  # bench/discovery.py: the simulated market

from vast_manager.coordinator.decisions import belief
from vast_manager.coordinator.decisions.share import instance_share, ram_class
from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.structural_model import (
    Prediction,
    RateModel,
    fit_rate_model,
)
from vast_manager.coordinator.offers import Offer, parse_offer

FACTORS = (1.0, 1.25, 1.5, 2.0)
#: Training measurements the model is refitted after, in the bounded-learning run.
REFIT_EVERY = 20


@dataclass(slots=True)
class Figures:
    confident: list[float] = field(default_factory=list)
    novel: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)
    twin: list[float] = field(default_factory=list)
    gpu: list[float] = field(default_factory=list)
    held_first: int = 0
    judged_first: int = 0
    held_novel: int = 0
    held_bounded: int = 0  # first benchmarks held against the model learned bounded
    held_second: int = 0
    judged_second: int = 0
    whole: list[float] = field(default_factory=list)  # APE, every rate learned whole
    bounded: list[float] = field(default_factory=list)  # APE, rates learned up to the bound
    bounded_share: list[bool] = field(default_factory=list)  # a training rate was bounded

    def add(self, other: Figures) -> None:
        for name in self.__slots__:  # type: ignore[attr-defined]
            mine = getattr(self, name)
            setattr(self, name, mine + getattr(other, name))


def twin_key(offer: Offer) -> tuple[object, ...]:
    return (offer.gpu_name, offer.num_gpus, offer.cpu_name,
            ram_class(instance_share(offer).ram_gb))


def as_new_host(offer: Offer) -> Offer:
    return msgspec.structs.replace(offer, machine_id=None)


def bounded_training(ms: list[Measurement]) -> tuple[list[Measurement], list[bool]]:
    """``ms`` as the coordinator's model reads them before any delivery agrees: each rate
    at most its ``belief.learn_bound`` against the model fitted on those before it
    (refitted every ``REFIT_EVERY``) and the twins among them learned whole."""
    out: list[Measurement] = []
    was_bounded: list[bool] = []
    model: RateModel | None = None
    whole: dict[tuple[object, ...], list[float]] = defaultdict(list)
    for i, m in enumerate(ms):
        if i % REFIT_EVERY == 0 and out:
            model = fit_rate_model(out)
        gpus = m.offer.num_gpus or 1
        high = None
        if model is not None:
            (p,) = model.predict_offers([as_new_host(m.offer)], explain=False)
            high = p.rate_high if isinstance(p, Prediction) else None
        twins = whole[twin_key(m.offer)]
        refs = belief.References(expected_high=high, twin_median_per_gpu=statistics.median(
            twins) if twins else None)
        bound = belief.learn_bound(gpus, refs)
        if bound is not None and m.rate_per_hour > bound:
            out.append(dataclasses.replace(m, rate_per_hour=bound))
            was_bounded.append(True)
        else:
            out.append(m)
            whole[twin_key(m.offer)].append(m.rate_per_hour / gpus)
            was_bounded.append(False)
    return out, was_bounded


def novel_ratios(seed: int, ms: list[Measurement], offers: list[Offer],
                 rates: list[float]) -> tuple[list[float], int]:
    """First benchmarks over the 90th percentile of a model that never measured their
    GPU model or CPU family: fitted without a third of the GPU models and a third of the
    CPU families the training measured (the market's 60 machines already cover them
    all), predicting the offers of those; and how many of them the rule holds."""
    rng = random.Random(seed + 104_729)
    gpus = sorted({m.offer.gpu_name or "" for m in ms})
    cpus = sorted({m.offer.cpu_name or "" for m in ms})
    held_gpus = set(rng.sample(gpus, len(gpus) // 3))
    held_cpus = set(rng.sample(cpus, len(cpus) // 3))
    model = fit_rate_model([m for m in ms if m.offer.gpu_name not in held_gpus
                            and m.offer.cpu_name not in held_cpus])
    sel = [i for i, o in enumerate(offers) if o.gpu_name in held_gpus or o.cpu_name in held_cpus]
    preds = model.predict_offers([as_new_host(offers[i]) for i in sel], explain=False)
    pairs = [(i, p) for i, p in zip(sel, preds, strict=True)
             if isinstance(p, Prediction) and p.novelty]
    held = sum(belief.beyond_belief(rates[i], offers[i].num_gpus or 1, belief.References(
        expected_high=p.rate_high, novel=p.novelty, gpu_bound_per_gpu=belief.gpu_bound_rate_per_gpu(
            offers[i].gpu_name, offers[i].gpu_mem_bw))) is not None for i, p in pairs)
    return [rates[i] / p.rate_high for i, p in pairs], held


def run(seed: int, trained: int, tested: int) -> Figures:
    """The figures of one seed (the module's docstring)."""
    rng = random.Random(seed)
    ms: list[Measurement] = []
    next_id = 50_000
    while len(ms) < trained:
        m = market._observe(market.new_machine(next_id, rng), rng)
        next_id += 1
        for _ in range(rng.choice((1, 1, 2, 3))):
            ms.append(market._measurement(m, rng.choice(m.slices()), rng, 0.0))
    model = fit_rate_model(ms)
    bounded_ms, was_bounded = bounded_training(ms)
    bounded_model = fit_rate_model(bounded_ms)
    offers, rates, seconds, true = [], [], [], []
    for m in market.machines(tested, rng, first_id=next_id):
        k = rng.choice(m.slices())
        offers.append(parse_offer(m.offer(k, m.machine_id * 10 + k, 1.0)))
        rates.append(m.measure(k, rng))
        seconds.append(m.measure(k, rng))
        true.append(m.true_rate(k))
    twins: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for i, offer in enumerate(offers):
        twins[twin_key(offer)].append(i)
    out = Figures(bounded_share=was_bounded)
    out.novel, out.held_novel = novel_ratios(seed, ms, offers, rates)
    preds = model.predict_offers([as_new_host(o) for o in offers], explain=False)
    bounded_preds = bounded_model.predict_offers([as_new_host(o) for o in offers],
                                                 explain=False)
    for group in twins.values():
        for i in group:
            offer, pred, rate = offers[i], preds[i], rates[i]
            gpus = offer.num_gpus or 1
            others = [rates[j] / (offers[j].num_gpus or 1) for j in group if j != i]
            median = statistics.median(others) if others else None
            bound = belief.gpu_bound_rate_per_gpu(offer.gpu_name, offer.gpu_mem_bw)
            out.gpu.append(rate / (bound * gpus))
            out.own.append(seconds[i] / rate)
            if median:
                out.twin.append(rate / gpus / median)
            second_refs = belief.References(own_first_per_gpu=rate / gpus,
                                            gpu_bound_per_gpu=bound)
            if isinstance(pred, Prediction):
                if not pred.novelty:
                    out.confident.append(rate / pred.rate_high)
                refs = belief.References(expected_high=pred.rate_high, novel=pred.novelty,
                                         twin_median_per_gpu=median, gpu_bound_per_gpu=bound)
                out.judged_first += 1
                out.held_first += belief.beyond_belief(rate, gpus, refs) is not None
                second_refs = dataclasses.replace(refs, own_first_per_gpu=rate / gpus)
                out.whole.append(abs(pred.rate_per_hour - true[i]) / true[i])
            b = bounded_preds[i]
            if isinstance(b, Prediction):
                out.bounded.append(abs(b.rate_per_hour - true[i]) / true[i])
                out.held_bounded += belief.beyond_belief(rate, gpus, belief.References(
                    expected_high=b.rate_high, novel=b.novelty,
                    gpu_bound_per_gpu=bound)) is not None
            out.judged_second += 1
            out.held_second += belief.beyond_belief(seconds[i], gpus, second_refs) is not None
    return out


def report(name: str, values: Sequence[float]) -> None:
    if not values:
        print(f"  {name:16s} no pairs")
        return
    ordered = sorted(values)
    shares = ", ".join(f"{sum(v > f for v in values) / len(values):.1%} above {f:g}x"
                       for f in FACTORS)
    print(f"  {name:16s} n {len(values):4d}; median {statistics.median(ordered):.2f}, "
          f"99th {ordered[int(0.99 * (len(ordered) - 1))]:.2f}, largest {ordered[-1]:.2f}; "
          f"{shares}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed")
    args = ap.parse_args(argv)
    seeds = [(1, 60)] if args.quick else [(1, 60), (2, 200), (3, 200)]
    figures = Figures()
    for seed, trained in seeds:
        figures.add(run(seed, trained, 600))
    f = figures
    print(f"Honest benchmarks over their references (simulated; seeds "
          f"{[s for s, _ in seeds]}, 600 machines a seed)")
    report("model (confident)", f.confident)
    report("model (novel)", f.novel)
    report("own (2nd / 1st)", f.own)
    report("twin", f.twin)
    report("gpu-bound", f.gpu)
    print(f"  held by the coordinator's rule (GPU-bound {belief.BANDWIDTH_FACTOR:g}x, model "
          f"{belief.MODEL_FACTOR:g}x its 90th "
          f"percentile, never-measured hardware {belief.NOVEL_FACTOR:g}x, own first "
          f"{belief.OWN_FACTOR:g}x): first benchmarks {f.held_first} of {f.judged_first} "
          f"({f.held_first / max(1, f.judged_first):.2%}); on never-measured hardware "
          f"{f.held_novel} of {len(f.novel)}; second benchmarks "
          f"{f.held_second} of {f.judged_second} "
          f"({f.held_second / max(1, f.judged_second):.2%})")
    print(f"  learning bounded (the 90th percentile, {belief.TWIN_FACTOR:g}x a twin's "
          f"median; no delivery ever agreeing): {sum(f.bounded_share)} of "
          f"{len(f.bounded_share)} training rates bounded; model error (MdAPE) on the true "
          f"rates {statistics.median(f.bounded):.2%} bounded vs {statistics.median(f.whole):.2%} "
          f"learned whole; first benchmarks held against it {f.held_bounded} of "
          f"{len(f.bounded)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
