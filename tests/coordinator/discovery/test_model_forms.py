"""The rate model's learned forms say what a market does, and stay out of the way where
it does not (docs/discovery.md, section 2): how synthesis grows with vCPUs, a narrow link
shared by a host's GPUs, the binding resource named by doubling, and the RAM share as a
limit or as a factor on the whole rate. Every rate here is simulated."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from vast_manager.coordinator.discovery.structural_model import Priors, RateModel, fit_rate_model

from support.discovery_support import market, market_measurements, market_offer
from support.foreign_market import generate


def _fit(rows: list[dict[str, Any]], n: int = 240) -> tuple[RateModel, list[dict[str, Any]]]:
    """The bench's shares on one fixed split: n hosts measured from the file's first 60%,
    the rest held out."""
    cut = int(len(rows) * 0.6)
    train = random.Random(1).sample(rows[:cut], n)
    return fit_rate_model(market_measurements(train), now=0.0), rows[cut:]


def test_a_market_whose_narrow_links_are_shared_and_whose_synthesis_saturates_is_read() -> None:
    """The market made at test time shares a x8-or-narrower link among the host's GPUs
    (each gets the link / GPUs^0.7) and grows synthesis as vCPUs^0.6: the fit finds both."""
    model, _ = _fit(generate(20261205, 1000))
    s = model.summary()
    assert 0.45 <= s["shared_link_exponent"] <= 0.95, s
    assert 0.4 <= s["vcpu_exponent"] <= 0.8, s


@pytest.mark.parametrize("name", ["simulator", "pipeline"])
def test_where_links_are_not_shared_and_synthesis_is_proportional_the_forms_stay_off(
        name: str) -> None:
    """The simulator and the pipeline market share no link and synthesise in proportion
    to vCPUs: the sharing exponent stays near its prior's 0 and the vCPU exponent near 1."""
    model, _ = _fit(market(name))
    s = model.summary()
    assert abs(s["shared_link_exponent"]) < 0.15, s
    assert s["vcpu_exponent"] > 0.85, s


@pytest.mark.parametrize("name", ["made here", "pipeline", "contended", "simulator"])
def test_the_binding_resource_is_named_right_on_most_held_out_hosts(name: str) -> None:
    """The market files label each host with the resource whose doubling raises its true
    rate most (the simulator's, the least capacity); the model names the resource whose
    doubling raises its own prediction most, and gets 75% or more of them right."""
    rows = generate(20261205, 1000) if name == "made here" else market(name)
    model, held = _fit(rows)
    preds = model.predict_offers([market_offer(r) for r in held], explain=False)
    right = sum(getattr(p, "bottleneck", None) == r["true_binding"]
                for p, r in zip(preds, held, strict=True))
    assert right / len(held) >= 0.75, (name, right, len(held))


def test_a_market_whose_ram_share_scales_the_whole_rate_gets_the_factor_form() -> None:
    """The market made at test time scales the whole rate by a saturating curve in the RAM
    share (a host on 122 GiB makes about 0.6x whatever its GPUs): the marginal likelihood
    prefers the RAM share as a factor to a limit of its own, read on the whole share (the
    per-GPU exponent near its prior's 0), and the hosts of several GPUs the RAM share
    binds, which the limit held back, are predicted better than by the capacity form."""
    rows = generate(20261205, 1000)
    model, held = _fit(rows)
    s = model.summary()
    assert s["ram_form"] == "factor", s
    assert abs(s["ram_per_gpu_exponent"]) < 0.2, s
    # A cold start's first trials already tell the forms apart.
    early, _ = _fit(rows, n=Priors().ram_form_min_machines)
    assert early.summary()["ram_form"] == "factor"
    cut = int(len(rows) * 0.6)
    capacity = fit_rate_model(market_measurements(random.Random(1).sample(rows[:cut], 240)),
                              now=0.0, priors=Priors(ram_form="capacity"))
    several = [r for r in held if r["num_gpus"] >= 2 and r["true_binding"] == "memory"]
    assert len(several) >= 20

    def median_log_error(m: RateModel) -> float:
        preds = m.predict_offers([market_offer(r) for r in several], explain=False)
        errs = sorted(abs(math.log(getattr(p, "rate_per_hour", math.nan)
                                   / r["true_rate_per_hour"]))
                      for p, r in zip(preds, several, strict=True))
        return errs[len(errs) // 2]

    factor_error, capacity_error = median_log_error(model), median_log_error(capacity)
    assert factor_error < 0.85 * capacity_error, (factor_error, capacity_error)
    pred = model.predict(market_offer(several[0]))
    assert "memory" not in pred.capacities_per_hour


def test_where_ram_binds_by_partitions_in_flight_the_capacity_form_stays() -> None:
    """The simulator's RAM admits whole partitions (cuzk's staircase, a limit): the fit
    keeps the RAM share as a capacity, from the first machines the choice is made on.
    Below them, only the capacity is fitted."""
    model, _ = _fit(market("simulator"))
    assert model.summary()["ram_form"] == "capacity"
    few, _ = _fit(generate(20261205, 1000), n=Priors().ram_form_min_machines - 1)
    assert few.summary()["ram_form"] == "capacity"
    # From the first machines the choice is made, the staircase's market keeps it.
    early, _ = _fit(market("simulator"), n=Priors().ram_form_min_machines)
    assert early.summary()["ram_form"] == "capacity"
