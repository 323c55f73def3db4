"""The binding resource seen while a rate was measured (``Measurement.bottleneck``) is
evidence of which of the CPU and the link binds, the pair measured rates alone confound
(docs/discovery.md, section 2). Every rate here is simulated."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np

from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.served import fit_served_model
from vast_manager.coordinator.discovery.structural_model import Priors, RateModel, fit_rate_model

from support.discovery_support import market_measurements, market_offer
from support.foreign_market import generate

ROWS = generate(20261205, 1000)
TRAIN = random.Random(1).sample(ROWS[:600], 20)
HELD = ROWS[600:]


def _seen(ms: list[Measurement], labels: list[str | None]) -> list[Measurement]:
    return [dataclasses.replace(m, bottleneck=b) for m, b in zip(ms, labels, strict=True)]


def _cpu_or_link_named_right(model: RateModel, rows: list[dict[str, Any]]) -> float:
    """The share of the hosts the CPU or the link truly binds that the model names right."""
    rows = [r for r in rows if r["true_binding"] in ("cpu", "pcie")]
    preds = model.predict_offers([market_offer(r) for r in rows], explain=False)
    return sum(getattr(p, "bottleneck", None) == r["true_binding"]
               for p, r in zip(preds, rows, strict=True)) / len(rows)


def test_a_binding_seen_as_the_cpu_or_the_link_names_the_two_right_more_often() -> None:
    """From 20 machines of the market made at test time (the planner's early fits), the
    bindings seen move the model's reading towards the truth, on the measured machines
    and on the held-out hosts, where the RAM share is read as cuzk's staircase (below 8
    machines, or on a market that keeps it). With the RAM as a factor, which this market
    chooses from 8 machines, the reading is right without them (docs/discovery.md,
    section 2, "What a measurement saw")."""
    plain = market_measurements(TRAIN)
    seen = _seen(plain, [r["true_binding"] for r in TRAIN])
    staircase = Priors(ram_form="capacity")
    without = fit_rate_model(plain, now=0.0, priors=staircase)
    with_seen = fit_rate_model(seen, now=0.0, priors=staircase)
    assert with_seen.summary()["bindings_seen"] == sum(
        r["true_binding"] in ("cpu", "pcie") for r in TRAIN) > 5
    assert without.summary()["bindings_seen"] == 0
    assert _cpu_or_link_named_right(with_seen, TRAIN) > _cpu_or_link_named_right(without, TRAIN)
    assert _cpu_or_link_named_right(with_seen, HELD) > _cpu_or_link_named_right(without, HELD)


def test_a_binding_seen_as_the_gpu_or_the_ram_changes_nothing() -> None:
    """Only the CPU and the link are read: the GPUs' and the RAM's own terms are not what
    the rates confound, and reading them moved the planner's fleets the wrong way on two
    shipped markets (docs/discovery-passes.md, "The pass on the binding resource seen")."""
    plain = market_measurements(TRAIN)
    other = _seen(plain, [("gpu", "memory")[i % 2] for i in range(len(plain))])
    a, b = fit_rate_model(plain, now=0.0), fit_rate_model(other, now=0.0)
    assert b.summary()["bindings_seen"] == 0
    assert np.array_equal(a.theta, b.theta)


def test_from_thirty_machines_the_served_model_leaves_the_bindings_seen_out() -> None:
    """A cold start's evidence: below 30 machines the structural model answers alone and
    reads them; from 30 the learners correct its reading, and the bindings seen, read
    beside them, cost accuracy on a market made at test time (docs/discovery.md)."""
    rows = random.Random(2).sample(ROWS[:600], 40)
    few = [dataclasses.replace(m, bottleneck=r["true_binding"])
           for m, r in zip(market_measurements(rows[:20]), rows[:20], strict=True)]
    many = few + market_measurements(rows[20:])
    assert fit_served_model(few, now=0.0).summary()["bindings_seen"] > 5
    assert fit_served_model(many, now=0.0).summary()["bindings_seen"] == 0
