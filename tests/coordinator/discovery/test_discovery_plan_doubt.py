"""The plan tests what its model rules out: a share of trials goes to unmeasured cells
where the model and the reading without its binding resource disagree, and a cell whose
measured machine surprised the model is believed otherwise (docs/discovery.md, "Testing
what the model rules out")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import pytest

from vast_manager.coordinator.discovery.plan import (
    DOUBT_NOTE,
    Doubt,
    FleetView,
    PlanSettings,
    doubt_cell,
    due_slots,
    plan_trials,
    read_evidence,
    unbound_rate,
    with_doubt,
)
from vast_manager.coordinator.discovery.structural_model import Prediction, Unpredictable
from vast_manager.coordinator.offers import Offer, parse_offer

Z90 = 1.2815515655446004


def _prediction(rate: float, sd: float, bottleneck: str, gpu: float, runs: int = 0
                ) -> Prediction:
    return Prediction(
        rate_per_hour=rate, rate_low=rate * math.exp(-Z90 * sd),
        rate_high=rate * math.exp(Z90 * sd), log_rate_mean=math.log(rate), log_rate_sd=sd,
        bottleneck=bottleneck, capacities_per_hour={"gpu": gpu, bottleneck: rate},
        reference_rate_per_hour=100.0, contributions=(), machine_runs=runs, novelty=(),
        assumed=(), basis="")


def _offer(offer_id: int, gpu: str, dph: float, ram_mb: int = 256_000) -> Offer:
    return parse_offer({"id": offer_id, "machine_id": offer_id, "gpu_name": gpu, "num_gpus": 1,
            "cpu_cores": 32, "cpu_cores_effective": 32, "cpu_ram": ram_mb,
            "cpu_name": "AMD EPYC 7742 64-Core Processor", "dph_total": dph,
            "inet_down": 1000.0})


class FakeModel:
    """Answers from a table by offer id: a new host's reading, or (with ``machine_id``
    and a measured entry) the machine's own."""

    def __init__(self, new: Mapping[int, Prediction], own: Mapping[int, Prediction]):
        self.new, self.own = new, own

    def predict_offers(self, offers: Sequence[Offer], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        out: list[Prediction | Unpredictable] = []
        for o in offers:
            key = int(o.id)
            out.append(self.own[key] if o.machine_id is not None and key in self.own
                       else self.new[key])
        return out


def _market() -> tuple[list[Offer], FakeModel]:
    """Twenty good 4090 offers the model is sure of, and one cheap RTX 3060 Ti offer the
    model rules out (memory-bound at 10/h; its GPU alone allows 60/h)."""
    offers = [_offer(1000 + i, "RTX 4090", 0.40 + 0.001 * i) for i in range(20)]
    new = {int(o.id): _prediction(200.0, 0.1, "gpu", 200.0) for o in offers}
    cheap = _offer(1, "RTX 3060 Ti", 0.05, ram_mb=128_000)
    new[1] = _prediction(10.0, 0.15, "memory", 60.0)
    return [*offers, cheap], FakeModel(new, {})


def test_every_fourth_trial_is_a_test_however_the_trials_are_asked_for() -> None:
    assert due_slots(0, 8, 0.25) == [False, False, False, True] * 2
    one_at_a_time = [due_slots(n, 1, 0.25)[0] for n in range(12)]
    assert one_at_a_time == due_slots(0, 12, 0.25)
    assert not any(due_slots(0, 12, 0.0))


def test_the_doubt_puts_a_mode_at_the_gpu_only_reading() -> None:
    p = _prediction(10.0, 0.15, "memory", 60.0)
    d = with_doubt(p, Doubt(weight=0.25, log_sd=0.2))
    assert DOUBT_NOTE in d.novelty and (d.rate_low, d.rate_high) == (p.rate_low, p.rate_high)
    # The model alone gives 40/h no chance; the mixture about its weight.
    assert p.probability_above(40.0) < 1e-6
    assert d.probability_above(40.0) == pytest.approx(0.25 * 0.979, abs=0.01)
    assert with_doubt(d, Doubt()) is d  # doubted once, not twice


def test_a_due_slot_tests_the_offer_the_model_rules_out() -> None:
    offers, model = _market()
    ref = FleetView(reference_usd_per_proof=0.0025)  # the 3060 Ti breaks even at 20/h
    plain = plan_trials(offers, model, ref, PlanSettings(trials=8, doubt=Doubt(share=0)))
    assert 1 not in {p.offer_id for p in plain.proposals}
    tested = plan_trials(offers, model, ref, PlanSettings(trials=8, doubt=Doubt()))
    ids = [p.offer_id for p in tested.proposals]
    assert ids.index(1) == 3  # the fourth trial, the first due slot
    # The rest keep the expected value's order.
    assert [i for i in ids if i != 1] == [p.offer_id for p in plain.proposals][:7]
    test = tested.proposals[3]
    assert "tests the model's belief that memory binds here" in test.hypothesis
    assert test.expected_value_usd > 0  # worth its cost under the mixture


def test_the_test_relaxes_only_the_resource_the_model_says_binds() -> None:
    """The 3060 Ti's GPU allows 60/h, but if its RAM share does not bind, its vCPUs hold
    it at 12/h: still under its 20/h break-even, so there is nothing to test."""
    offers, model = _market()
    ruled_out = model.new[1]
    assert unbound_rate(ruled_out) == 60.0
    held = dataclasses.replace(ruled_out, capacities_per_hour={
        "gpu": 60.0, "memory": 10.0, "cpu": 12.0, "pcie": 90.0})
    assert unbound_rate(held) == 12.0
    model.new[1] = held
    plan = plan_trials(offers, model, FleetView(reference_usd_per_proof=0.0025),
                       PlanSettings(trials=8, doubt=Doubt()))
    assert 1 not in {p.offer_id for p in plan.proposals}
    # Where the GPU binds, the reading is the least capacity of all: the model's own.
    assert unbound_rate(dataclasses.replace(held, bottleneck="gpu")) == 10.0


def test_a_measured_neighbour_settles_the_cell() -> None:
    offers, model = _market()
    neighbour = _offer(2, "RTX 3060 Ti", 0.05, ram_mb=128_000)
    model.new[2] = _prediction(10.0, 0.15, "memory", 60.0)
    model.own[2] = _prediction(11.0, 0.05, "memory", 60.0, runs=1)  # as the model said
    assert doubt_cell(neighbour, model.new[2]) == doubt_cell(offers[-1], model.new[1])
    plan = plan_trials([*offers, neighbour], model, FleetView(reference_usd_per_proof=0.0025),
                       PlanSettings(trials=8, doubt=Doubt()))
    assert 1 not in {p.offer_id for p in plan.proposals}


def test_a_surprising_neighbour_moves_the_cells_belief() -> None:
    offers, model = _market()
    neighbour = _offer(2, "RTX 3060 Ti", 0.05, ram_mb=128_000)
    model.new[2] = _prediction(10.0, 0.15, "memory", 60.0)
    model.own[2] = _prediction(55.0, 0.05, "memory", 60.0, runs=1)  # far above 8-12/h
    cands = [*offers, neighbour]
    preds, cells, measured = read_evidence(cands, model.predict_offers(cands), cands,
                                           frozenset(), model, Doubt())
    assert measured == 1
    (ev,) = cells.values()
    assert (ev.machines, ev.surprised) == (1, 1)
    assert ev.shift == pytest.approx(math.log(5.5))
    moved = preds[cands.index(offers[-1])]
    assert isinstance(moved, Prediction)
    # Weight (0.25 + 1) / 2 on the shifted reading: above 40/h now more likely than not.
    assert moved.probability_above(40.0) == pytest.approx(0.625, abs=0.02)
    # A busy machine of the fleet counts as well: blocked, it is still read.
    _, cells_b, measured_b = read_evidence(offers, model.predict_offers(offers),
                                           cands, frozenset({"2"}), model, Doubt())
    assert measured_b == 1 and next(iter(cells_b.values())).surprised == 1


def test_the_coordinators_plan_has_the_tests_off_unless_asked() -> None:
    offers, model = _market()
    plan = plan_trials(offers, model, FleetView(reference_usd_per_proof=0.0025),
                       PlanSettings(trials=8))
    assert 1 not in {p.offer_id for p in plan.proposals}


def test_the_operator_setting_turns_the_tests_on_or_off() -> None:
    from vast_manager.coordinator.discovery.plan import belief_tests
    from vast_manager.coordinator.settings import DEFAULTS

    assert DEFAULTS.plan_belief_test_share == 0.0
    off = belief_tests(0.0)
    assert off.share == 0.0 and off.weight == 0.0
    assert PlanSettings().doubt == off
    on = belief_tests(0.25)
    assert on.share == 0.25 and on.weight > 0
