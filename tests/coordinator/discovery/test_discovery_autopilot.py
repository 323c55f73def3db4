"""The autopilot's decision core: never past a cap, every action with its reason."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vast_manager.coordinator.discovery.autopilot_rules import (
    AutopilotCaps,
    FleetInstance,
    Ledger,
    clearing_usd_per_proof,
    decide,
    fleet_margin_usd_per_proof,
    plan_reference_usd_per_proof,
)
from vast_manager.coordinator.discovery.plan import (
    FleetView,
    MeasuredOffer,
    Plan,
    PlanSettings,
    Proposal,
    evaluate_offer,
)
from vast_manager.coordinator.discovery.structural_model import fit_rate_model
from vast_manager.coordinator.offers import parse_offer

from support.discovery_support import synthetic_offer

MODEL = fit_rate_model([])
CAPS = AutopilotCaps(target_rate_per_hour=300.0, max_dph_total=3.0, max_instances=6,
                     max_explore_share=0.15, max_concurrent_trials=2, explore_interval_s=3600)


def _proposals(n: int, seed: int = 1) -> tuple[Proposal, ...]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        offer = parse_offer(synthetic_offer(rng, 60_000 + i))
        p = evaluate_offer(offer, MODEL.predict(offer), FleetView(), PlanSettings())
        assert p is not None
        out.append(p)
    return tuple(out)


def _plan(props: tuple[Proposal, ...]) -> Plan:
    return Plan(props, len(props), len(props), 0.008, "test")


def _measured(p: Proposal, machine: str, rate: float, worth: bool = True) -> MeasuredOffer:
    """A proposal's offer as a machine already measured at ``rate``."""
    pred = dataclasses.replace(p.prediction, rate_per_hour=rate, machine_runs=1)
    return MeasuredOffer(p.offer_id, machine, p.offer, pred, p.dph_total, p.hourly,
                         p.dph_total / rate, worth)


def _host(i: int, dph: float, rate: float | None, expected: float | None = None
          ) -> FleetInstance:
    return FleetInstance(f"in{i}", f"m{i}", dph, rate, expected)


def test_below_target_it_fills_with_the_plan_up_to_the_trials_allowed() -> None:
    props = _proposals(5)
    d = decide([], _plan(props), CAPS, Ledger(), now=0.0)
    deploys = [a for a in d.actions if a.kind == "deploy"]
    assert [a.offer_id for a in deploys] == [p.offer_id for p in props[:2]]
    assert all(not a.exploration and "of the 300.0/h target" in a.reason for a in deploys)
    assert any("trials under way" in n for n in d.notes)


def test_below_target_measured_machines_worth_it_come_before_any_trial() -> None:
    props = _proposals(5)
    known = (_measured(props[3], "mA", 90.0), _measured(props[4], "mB", 80.0, worth=False),
             _measured(props[2], "m1", 90.0))  # m1 is in the fleet already
    plan = dataclasses.replace(_plan(props), measured=known)
    d = decide([_host(1, 0.3, 100.0)], plan, CAPS, Ledger(), now=0.0)
    deploys = [a for a in d.actions if a.kind == "deploy"]
    # The known good machine first, then one trial: two deploys under way at most.
    assert [a.machine_id for a in deploys][:1] == ["mA"]
    assert [a.offer_id for a in deploys] == [props[3].offer_id, props[0].offer_id]
    assert "was measured at about 90.0/h" in deploys[0].reason
    assert not deploys[0].exploration and deploys[0].trial_cost_usd == 0.0


def test_at_target_a_measured_machine_cheaper_than_the_worst_host_replaces_it() -> None:
    props = _proposals(3)
    fleet = [_host(1, 0.5, 200.0), _host(2, 0.5, 150.0)]  # worst $0.00333/proof
    cheap = _measured(props[0], "mA", props[0].dph_total / 0.002)
    cheaper = _measured(props[1], "mB", props[1].dph_total / 0.001)
    dear = _measured(props[2], "mC", props[2].dph_total / 0.004)
    plan = Plan((), 0, 0, 0.008, "test", measured=(cheaper, cheap, dear))
    d = decide(fleet, plan, CAPS, Ledger(total_usd=100.0), now=0.0)
    deploys = [a for a in d.actions if a.kind == "deploy"]
    # One replacement a tick, the cheapest per proof; the dearer-than-worst never.
    assert [a.machine_id for a in deploys] == ["mB"]
    assert "cheaper per proof than the fleet's worst" in deploys[0].reason
    d = decide(fleet, Plan((), 0, 0, 0.008, "test", measured=(dear,)), CAPS,
               Ledger(total_usd=100.0), now=0.0)
    assert not [a for a in d.actions if a.kind == "deploy"]


def test_at_target_it_trims_the_worst_host_per_proof() -> None:
    fleet = [_host(1, 0.5, 200.0), _host(2, 0.5, 150.0), _host(3, 0.9, 100.0)]
    d = decide(fleet, _plan(()), CAPS, Ledger(total_usd=100.0), now=0.0)
    assert [(a.kind, a.instance_id) for a in d.actions] == [("terminate", "in3")]
    assert "fleet's worst" in d.actions[0].reason
    assert any("no trial proposed" in n for n in d.notes)


def test_a_rate_not_yet_delivered_never_lets_a_trim_end_another_host() -> None:
    """A cheap host kept at 320/h on its benchmark's word alone (delivery not yet known)
    fills the fleet but ends no host: the rest are trimmed only on delivered rates. Once
    it delivers that rate, the dearest host goes."""
    honest = _host(1, 1.4, 138.5)
    claimed = dataclasses.replace(_host(2, 0.11, 320.0), rate_delivered=False)
    d = decide([honest, claimed], _plan(()), CAPS, Ledger(total_usd=100.0), now=0.0)
    assert [a for a in d.actions if a.kind == "terminate"] == []
    delivered = dataclasses.replace(claimed, rate_delivered=True)
    d = decide([honest, delivered], _plan(()), CAPS, Ledger(total_usd=100.0), now=0.0)
    assert [(a.kind, a.instance_id) for a in d.actions] == [("terminate", "in1")]


def test_exploration_stays_within_its_share_and_pace() -> None:
    fleet = [_host(1, 0.5, 200.0), _host(2, 0.5, 150.0)]
    props = _proposals(3)
    cost = props[0].trial_cost_usd
    # Trials already 20% of spend: no exploring.
    capped = decide(fleet, _plan(props), CAPS, Ledger(total_usd=100.0, trials_usd=20.0),
                    now=0.0)
    assert capped.actions == () and any("over the 15% cap" in n for n in capped.notes)
    # Under the share: one exploration, marked and explained.
    ok = decide(fleet, _plan(props), CAPS, Ledger(total_usd=1000.0, trials_usd=10.0), now=0.0)
    assert [a.kind for a in ok.actions] == ["deploy"]
    assert ok.actions[0].exploration and "exploring" in ok.actions[0].reason
    assert ok.actions[0].trial_cost_usd == pytest.approx(cost)
    # Too soon after the last one.
    soon = decide(fleet, _plan(props), CAPS,
                  Ledger(total_usd=1000.0, trials_usd=10.0, last_exploration_at=-60.0), now=0.0)
    assert soon.actions == () and any("last exploration" in n for n in soon.notes)


def test_lowered_caps_shed_the_worst_hosts() -> None:
    fleet = [_host(i, 0.8, 100.0 + i) for i in range(6)]  # $4.80/h over a $3.00/h cap
    d = decide(fleet, _plan(()), CAPS, Ledger(), now=0.0)
    assert {a.kind for a in d.actions} == {"terminate"}
    left = 4.8 - sum(a.dph_total for a in d.actions)
    assert left <= 3.0 and "cap" in d.actions[0].reason


def test_bad_caps_are_named() -> None:
    with pytest.raises(ValueError, match="max_explore_share"):
        AutopilotCaps(300, 3, 6, max_explore_share=1.5).validate()
    with pytest.raises(ValueError, match="max_instances"):
        decide([], _plan(()), AutopilotCaps(300, 3, 0), Ledger(), now=0.0)


def test_from_nothing_the_reference_is_the_last_host_of_the_best_fleet_on_offer() -> None:
    offers = [("a", 0.2, 100.0), ("a", 0.9, 400.0), ("b", 0.3, 100.0), ("c", 0.5, 100.0),
              ("d", 0.0, 100.0), ("e", 0.4, 0.0)]  # no price, no rate: never in a fleet
    # Two hosts: a's cheaper slice (0.002) and b (0.003); b is the last of them.
    assert fleet_margin_usd_per_proof(offers, 2, 0.008) == (pytest.approx(0.003), 0)
    # b measured: one of the fleet's hosts is known from its runs.
    assert fleet_margin_usd_per_proof(offers, 2, 0.008, frozenset({"b"}))[1] == 1
    # More hosts than machines on offer: the dearest there is; never above the cap.
    assert fleet_margin_usd_per_proof(offers, 10, 0.008)[0] == pytest.approx(0.005)
    assert fleet_margin_usd_per_proof(offers, 10, 0.004)[0] == 0.004
    assert fleet_margin_usd_per_proof([], 10, 0.008) == (0.008, 0)


def test_the_clearing_cost_counts_a_machine_once_and_prices_the_next_host() -> None:
    offers = [("a", 0.2, 100.0), ("a", 0.9, 400.0), ("b", 0.3, 100.0), ("c", 0.5, 100.0)]
    # a's cheaper slice (0.002) and b (0.003) make 200/h; the next host, c, costs 0.005.
    assert clearing_usd_per_proof([], offers, 200.0, 0.008) == pytest.approx(0.005)
    assert clearing_usd_per_proof([], offers, 1000.0, 0.008) == 0.008
    # At the target, a newcomer must beat the fleet's worst host, even where the next
    # host on the market costs more.
    fleet = [_host(1, 0.4, 200.0), _host(2, 0.4, 100.0)]  # 0.002 and 0.004
    dear = [("c", 0.5, 100.0)]
    assert clearing_usd_per_proof(fleet, dear, 300.0, 0.008) == pytest.approx(0.005)
    assert plan_reference_usd_per_proof(fleet, dear, 300.0, 0.008) == pytest.approx(0.004)
    # Below it, the market's margin.
    assert plan_reference_usd_per_proof(fleet, dear, 500.0, 0.008) == 0.008


@st.composite
def _situations(draw: Any) -> tuple[list[FleetInstance], AutopilotCaps, Ledger]:
    n = draw(st.integers(0, 8))
    fleet = [
        _host(i, draw(st.floats(0.05, 1.5)),
              draw(st.one_of(st.none(), st.floats(5.0, 300.0))), draw(st.floats(5.0, 300.0)))
        for i in range(n)
    ]
    caps = AutopilotCaps(
        target_rate_per_hour=draw(st.floats(50.0, 800.0)),
        max_dph_total=draw(st.floats(0.5, 6.0)),
        max_instances=draw(st.integers(1, 10)),
        max_explore_share=draw(st.floats(0.0, 0.5)),
        max_concurrent_trials=draw(st.integers(1, 4)),
    )
    total = draw(st.floats(0.0, 1000.0))
    ledger = Ledger(total_usd=total, trials_usd=draw(st.floats(0.0, 1.0)) * total)
    return fleet, caps, ledger


PROPS = _proposals(12, seed=7)
MEASURED = tuple(_measured(p, f"known{i}", 40.0 + 20 * i) for i, p in enumerate(_proposals(4, 8)))


@settings(max_examples=200, deadline=None)
@given(_situations())
def test_no_decision_takes_the_fleet_past_a_cap(case: Any) -> None:
    fleet, caps, ledger = case
    plan = dataclasses.replace(_plan(PROPS), measured=MEASURED)
    d = decide(fleet, plan, caps, ledger, now=0.0)
    gone = {a.instance_id for a in d.actions if a.kind == "terminate"}
    deploys = [a for a in d.actions if a.kind == "deploy"]
    after = [i for i in fleet if i.instance_id not in gone]
    dph = sum(i.dph_total for i in after) + sum(a.dph_total for a in deploys)
    count = len(after) + len(deploys)
    trials = sum(1 for i in after if i.on_trial) + len(deploys)
    if deploys:
        assert dph <= caps.max_dph_total + 1e-9
        assert count <= caps.max_instances
        assert trials <= caps.max_concurrent_trials
    # A fleet already over a cap sheds proving hosts until it is within it (hosts on
    # trial wait for their verdict).
    if not all(i.on_trial for i in after):
        assert sum(i.dph_total for i in after) <= caps.max_dph_total + 1e-9
        assert len(after) <= caps.max_instances
    explorations = [a for a in deploys if a.exploration]
    assert len(explorations) <= 1
    for a in explorations:
        share = (ledger.trials_usd + a.trial_cost_usd) / (ledger.total_usd + a.trial_cost_usd)
        assert share <= caps.max_explore_share + 1e-9
    assert all(a.reason for a in d.actions)
    assert len({a.machine_id for a in deploys}) == len(deploys)
