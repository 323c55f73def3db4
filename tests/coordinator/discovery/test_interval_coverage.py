"""The served model's 80% intervals hold on markets it was not written from: the three
shipped markets and one generated here by a generator the model's authors did not write
(``support.foreign_market``: other functional forms for the GPU, PCIe, CPU and RAM).
Also the bench's honest baseline on a market that leaves fields out. Every rate here is
simulated."""

from __future__ import annotations

import functools
import random
import sys
from typing import Any

import numpy as np
import pytest

from vast_manager.coordinator.discovery.served import fit_served_model
from vast_manager.coordinator.discovery.structural_model import Prediction

from support.discovery_support import market, market_measurements, market_offer
from support.foreign_market import generate
from support.paths import REPO_ROOT

offer = market_offer
measured = market_measurements


def held_out_coverage(rows: list[dict[str, Any]], seed: int, n: int = 240
                      ) -> tuple[float, dict[str, list[int]]]:
    """As the market bench does (``market_bench.split``: a seeded 60% pool, the rest held
    out): n hosts measured from the pool, the rest predicted; the share of true rates
    inside their 80% intervals, and per true binding resource [covered, hosts]."""
    pool, held = _bench().split(rows, seed)
    train = random.Random(seed).sample(pool, n)
    served = fit_served_model(measured(train), now=0.0)
    preds = served.predict_offers([offer(r) for r in held], explain=False)
    groups: dict[str, list[int]] = {}
    hits = []
    for p, r in zip(preds, held, strict=True):
        assert isinstance(p, Prediction)
        hit = p.rate_low <= r["true_rate_per_hour"] <= p.rate_high
        hits.append(hit)
        g = groups.setdefault(str(r["true_binding"]), [0, 0])
        g[0] += hit
        g[1] += 1
    return float(np.mean(hits)), groups


def _bench() -> Any:
    bench = str(REPO_ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import market_bench

    return market_bench


def test_the_test_market_is_unlike_the_models_physics() -> None:
    """The generator's hosts are bound by every resource, and reruns are identical."""
    rows = generate(3, 300)
    assert rows == generate(3, 300)
    bound = {r["true_binding"] for r in rows}
    assert bound == {"gpu", "cpu", "pcie", "memory"}
    assert all(r["true_rate_per_hour"] > 0 and r["dph_total"] > 0 for r in rows)


def test_the_honest_baseline_survives_fields_no_offer_reports() -> None:
    """The bench's GBM reads the offer's fields and the instance's share; a market whose
    offers all leave gpu_mem_bw, total_flops and dlperf out is still predicted."""
    untuned_gbm = _bench().untuned_gbm
    rows = [{k: v for k, v in r.items() if k not in ("gpu_mem_bw", "total_flops", "dlperf")}
            for r in market("pipeline")[:300]]
    preds = untuned_gbm(rows[:200], rows[200:])
    assert len(preds) == 100 and all(np.isfinite(preds)) and min(preds) > 0
    served = fit_served_model(measured(rows[:60]), now=0.0)
    out = served.predict_offers([offer(r) for r in rows[200:210]], explain=False)
    assert all(isinstance(p, Prediction) and p.rate_low < p.rate_high for p in out)


@functools.cache
def five_seeds(name: str) -> list[tuple[float, dict[str, list[int]]]]:
    """``held_out_coverage`` on seeds 1-5 (as the market bench) of one market."""
    rows = generate(20261205, 1000) if name == "made here" else market(name)
    return [held_out_coverage(rows, seed) for seed in (1, 2, 3, 4, 5)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["simulator", "pipeline", "contended", "made here"])
def test_80pct_intervals_cover_75_to_85pct_on_every_market(name: str) -> None:
    """240 hosts measured, five seeds: the mean coverage of the held-out hosts' true
    rates is 75-85%. One seed's coverage moves by about 3 points (the percentiles of 240
    machines' scores), so the bar is on the mean."""
    coverage = [c for c, _ in five_seeds(name)]
    assert 0.75 <= float(np.mean(coverage)) <= 0.85, (name, coverage)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["simulator", "pipeline", "contended", "made here"])
def test_no_binding_resource_is_covered_below_65pct(name: str) -> None:
    """The hosts each true binding resource binds (seeds pooled, however few) are covered
    65% or more, unless so few that 80% intervals give their shortfall by chance (the
    bench's ``group_fails``): the intervals hold for every kind of host, not only the
    average one."""
    pooled: dict[str, list[int]] = {}
    for _, groups in five_seeds(name):
        for g, (hit, n) in groups.items():
            pooled.setdefault(g, [0, 0])
            pooled[g][0] += hit
            pooled[g][1] += n
    failed = {g: c for g, c in pooled.items() if _bench().group_fails(*c)}
    assert not failed, (name, pooled)


def test_a_small_group_is_judged_unless_chance_explains_its_shortfall() -> None:
    """Pipeline's link-bound hosts were 11 of 22 covered: far below what 80% intervals
    give by chance, so they fail; 3 of 5 is what 80% gives a quarter of the time."""
    bench = _bench()
    assert bench.group_fails(11, 22)
    assert not bench.group_fails(3, 5)
    assert not bench.group_fails(15, 22)
    assert bench.group_fails(60, 100) and not bench.group_fails(70, 100)
    assert bench.at_most_p(5, 5) == pytest.approx(1.0)
    assert bench.at_most_p(3, 5) == pytest.approx(1 - 5 * 0.8**4 * 0.2 - 0.8**5)
