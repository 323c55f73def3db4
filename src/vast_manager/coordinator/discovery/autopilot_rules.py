"""The autopilot's decision core: given the fleet, its caps, a plan and the clock, what to do.

Pure: the caller reads the fleet and the spend from the store, builds the plan
(``plan.plan_trials``, with ``reference`` from ``clearing_usd_per_proof`` here), calls
``decide`` and carries the actions out, logging each with its reason. Nothing
here deploys, destroys or reads a clock.

The rules, in order (docs/discovery.md):

1. **Caps first.** Above ``max_dph_total`` or ``max_instances`` (caps lowered
   while running, instances deployed by hand), the worst $/proof hosts go, then the
   dearest trials, until the fleet is within them.
2. **Trim.** While the fleet still meets its target rate without its worst $/proof
   host, that host goes: a better one has replaced it. "Meets" counts only rates known
   from delivery (``FleetInstance.rate_delivered``), so no rate on a host's word alone
   ends another host (docs/reliability.md, "Judged by what it delivers").
3. **Fill.** Below the target (counting the predicted rates of trials under way),
   deploy first the machines already measured and worth deploying on their
   measurement (the plan lists them apart, cheapest per proof first), then the plan's
   best proposals, within the caps and the deploys allowed under way at once.
4. **Explore.** At the target, deploy the plan's best proposal if its expected value
   is positive, trials so far are under ``max_explore_share`` of all spend, and the
   last exploration is ``explore_interval_s`` old. A trial that proves better than
   the fleet's worst host then replaces it through rule 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vast_manager.coordinator.decisions import cost
from vast_manager.coordinator.decisions.cost import Cost, Prices
from vast_manager.coordinator.discovery.fleet_gain import FleetHost, FleetOnOffer
from vast_manager.coordinator.discovery.plan import Plan, Proposal
from vast_manager.coordinator.offers import stored_offer
from vast_manager.coordinator.rows import InstanceRow


@dataclass(frozen=True, slots=True)
class AutopilotCaps:
    """Hard limits the autopilot never crosses (``validate`` names a bad one)."""

    target_rate_per_hour: float
    max_dph_total: float
    max_instances: int
    max_explore_share: float = 0.15
    max_concurrent_trials: int = 2
    explore_interval_s: float = 3600.0

    def validate(self) -> None:
        checks = (
            ("target_rate_per_hour", self.target_rate_per_hour > 0, "must be above 0"),
            ("max_dph_total", self.max_dph_total > 0, "must be above 0"),
            ("max_instances", self.max_instances >= 1, "must be at least 1"),
            ("max_explore_share", 0 <= self.max_explore_share <= 1, "must be between 0 and 1"),
            ("max_concurrent_trials", self.max_concurrent_trials >= 1, "must be at least 1"),
            ("explore_interval_s", self.explore_interval_s >= 0, "must not be negative"),
        )
        for name, ok, why in checks:
            if not ok or not math.isfinite(float(getattr(self, name))):
                raise ValueError(f"autopilot {name} {why}, not {getattr(self, name)!r}.")


@dataclass(frozen=True, slots=True)
class FleetInstance:
    """One of our instances as the autopilot sees it."""

    instance_id: str
    machine_id: str
    dph_total: float
    rate_per_hour: float | None  # measured; None while it is still before its verdict
    expected_rate_per_hour: float | None = None  # the plan's predicted rate, while on trial
    # Billing still, proving no more (terminating, silent, failed): it counts against the
    # caps until it is gone, and is neither a trial nor a host to terminate.
    leaving: bool = False
    # The rate is what it delivered over half an hour, or production is not watched.
    # False: its benchmark's word only (a confirmation the host may have forged), which
    # fills the fleet but never lets a trim end another host.
    rate_delivered: bool = True

    @property
    def on_trial(self) -> bool:
        return self.rate_per_hour is None and not self.leaving

    @property
    def usd_per_proof(self) -> float:
        return self.dph_total / self.rate_per_hour if self.rate_per_hour else math.inf


@dataclass(frozen=True, slots=True)
class Ledger:
    """What the fleet has spent so far (from the store), for the exploration cap, by what
    vast.ai bills for (``cost.Cost``'s parts)."""

    total_usd: float = 0.0
    trials_usd: float = 0.0  # spent before benchmark verdicts
    last_exploration_at: float | None = None
    rent_usd: float = 0.0
    storage_usd: float = 0.0
    bandwidth_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class Rental:
    """One instance's bill, for the ledger: price, start, end (None: still billing), when
    its benchmark verdict came (None: not yet, or never), and optionally its prices
    (``cost.Prices``), when it began running (its hello) and the bytes its agent moved.
    Without prices it is rent at ``dph_total`` from start to end."""

    dph_total: float
    started_at: float
    ended_at: float | None
    verdict_at: float | None
    prices: Prices | None = None
    running_from: float | None = None
    down_bytes: float = 0.0
    up_bytes: float = 0.0
    rent_paused_s: float = 0.0  # seconds vast.ai showed it not running after its hello
    storage_paused_s: float = 0.0  # seconds it showed it offline

    def bill(self, start: float, end: float) -> Cost:
        """What it billed between ``start`` and ``end`` (within its life): rent while
        running, storage while it existed, its bytes spread evenly over its life."""
        if end <= start:
            return Cost()
        if self.prices is None:
            return Cost(rent=self.dph_total * (end - start) / 3600.0)
        run_from = max(start, self.running_from) if self.running_from is not None else end
        life_end = end if self.ended_at is None else self.ended_at
        life = max(life_end - self.started_at, 1e-9)
        share = min(1.0, (end - start) / life)
        return cost.accrued(
            self.prices, running_s=max(0.0, end - run_from - self.rent_paused_s * share),
            existing_s=end - start, offline_s=self.storage_paused_s * share,
            down_bytes=self.down_bytes * share, up_bytes=self.up_bytes * share)


def ledger_of(rentals: Sequence[Rental], *, now: float, since: float,
              last_exploration_at: float | None) -> Ledger:
    """Spend since ``since`` (rent, storage, bandwidth from deploy to destroy), and of it
    the trials' (from deploy to the benchmark verdict, or the end when none came)."""
    spent = trials = Cost()
    for r in rentals:
        start = max(r.started_at, since)
        end = now if r.ended_at is None else min(r.ended_at, now)
        if end <= start:
            continue
        spent = spent + r.bill(start, end)
        trial_end = end if r.verdict_at is None else min(max(r.verdict_at, start), end)
        trials = trials + r.bill(start, trial_end)
    return Ledger(total_usd=spent.total, trials_usd=trials.total,
                  last_exploration_at=last_exploration_at, rent_usd=spent.rent,
                  storage_usd=spent.storage, bandwidth_usd=spent.bandwidth)


def rental_of(r: InstanceRow) -> Rental:
    """A spend row as the ledger's ``Rental``: its prices from the offer as deployed at
    its own disk, rent from its hello (running), its bytes as its agent reported them."""
    offer = stored_offer(r.get("offer_json"))
    prices = (cost.prices_of(offer, r.get("disk_gb"), r.get("bid_per_hour"))
              if offer is not None else None)
    hello = r.get("hello_at")
    # spend_rows reads only rows with a price and a creation time.
    return Rental(float(r["dph_total"] or 0.0), float(r["created_at"] or 0.0),
                  None if r["ended_at"] is None else float(r["ended_at"]),
                  None if r["verdict_at"] is None else float(r["verdict_at"]),
                  prices=prices, running_from=None if hello is None else float(hello),
                  down_bytes=float(r.get("net_rx_bytes") or 0),
                  up_bytes=float(r.get("net_tx_bytes") or 0),
                  rent_paused_s=float(r.get("rent_paused_s") or 0),
                  storage_paused_s=float(r.get("storage_paused_s") or 0))


@dataclass(frozen=True, slots=True)
class Action:
    kind: Literal["deploy", "terminate"]
    reason: str
    offer_id: int | None = None
    machine_id: str | None = None
    instance_id: str | None = None
    exploration: bool = False
    dph_total: float = 0.0
    expected_rate_per_hour: float | None = None
    trial_cost_usd: float = 0.0
    trial_share: float | None = None  # an exploration's: trials' share of spend with it


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    notes: tuple[str, ...]  # what the autopilot held back from, and why


def clearing_usd_per_proof(
    instances: Sequence[FleetInstance],
    offers: Sequence[tuple[str | None, float, float]],
    target_rate_per_hour: float,
    max_usd_per_proof: float,
) -> float:
    """What a proof costs at the margin when the target rate is bought cheapest first:
    the $/proof of the first host the target does not need (the next one it would have
    to buy), so every host the target needs has a positive saving against it.

    ``offers`` are (machine_id, dph_total, predicted rate) of deployable offers; a
    machine counts once, at its cheapest slice per proof (one instance a machine). The
    fleet's proving hosts count at their measured rates. A newcomer is worth keeping
    when it beats this; it is at most ``max_usd_per_proof``.
    """
    supply = [(i.usd_per_proof, float(i.rate_per_hour)) for i in instances
              if i.rate_per_hour and not i.leaving]
    supply += [(usd, rate) for usd, rate, _ in _cheapest_per_machine(offers)]
    supply.sort()
    total = 0.0
    for usd, rate in supply:
        if total >= target_rate_per_hour:
            return min(usd, max_usd_per_proof)
        total += rate
    return max_usd_per_proof


def fleet_margin_usd_per_proof(
    offers: Sequence[tuple[str | None, float, float]],
    hosts: int,
    max_usd_per_proof: float,
    measured: frozenset[str] = frozenset(),
) -> tuple[float, int]:
    """The reference from nothing proving: the best fleet of ``hosts`` machines the
    offers make by their predicted $/proof (a machine once, at its cheapest slice per
    proof), and the $/proof of its last host, the dearest the fleet still takes; with
    how many of those hosts are ``measured`` machines (their rates from their own runs).

    This is what the operator would otherwise get: rent that fleet. A newcomer is worth
    keeping only if it beats the host it would push out of it. Fewer machines than
    ``hosts`` on offer: the dearest there is. At most ``max_usd_per_proof``.
    """
    fleet = best_on_offer(offers, max(1, hosts))
    if not fleet:
        return max_usd_per_proof, 0
    return (min(fleet[-1][0], max_usd_per_proof),
            sum(machine in measured for _, _, machine in fleet))


def best_on_offer(offers: Sequence[tuple[str | None, float, float]], hosts: int
                  ) -> list[tuple[float, float, str | None]]:
    """(usd per proof, rate, machine) of the ``hosts`` best machines on offer by their
    predicted $/proof, best first (a machine once, at its cheapest slice per proof)."""
    return sorted(_cheapest_per_machine(offers), key=lambda t: t[:2])[:max(0, hosts)]


def fleet_on_offer(offers: Sequence[tuple[str | None, float, float]], hosts: int,
                   max_usd_per_proof: float) -> FleetOnOffer | None:
    """The fleet from nothing proving as the plan values trials against it
    (``plan.FleetView.fleet_on_offer``): the best ``2 x hosts`` machines on offer, so the
    fleet without a newcomer's (or a GPU model's) machines is still whole, and only those
    the verdict keeps (at most ``max_usd_per_proof``). None with fewer than ``hosts`` of
    them: the plan then judges against the reference alone."""
    best = [t for t in best_on_offer(offers, 2 * hosts) if t[0] <= max_usd_per_proof]
    if len(best) < hosts:
        return None
    return FleetOnOffer(tuple(FleetHost(m, q * r, r) for q, r, m in best), hosts)


def _cheapest_per_machine(offers: Sequence[tuple[str | None, float, float]]
                          ) -> list[tuple[float, float, str | None]]:
    """(usd per proof, rate, machine) of each machine's cheapest slice per proof (one
    instance a machine); an offer with no machine counts alone, one without a price or a
    rate not at all."""
    best: dict[str, tuple[float, float, str | None]] = {}
    for n, (machine, dph, rate) in enumerate(offers):
        if rate <= 0 or dph <= 0:
            continue
        key = machine if machine is not None else f"offer {n}"
        if key not in best or dph / rate < best[key][0]:
            best[key] = (dph / rate, rate, machine)
    return list(best.values())


def plan_reference_usd_per_proof(
    instances: Sequence[FleetInstance],
    offers: Sequence[tuple[str | None, float, float]],
    target_rate_per_hour: float,
    max_usd_per_proof: float,
) -> float:
    """The $/proof the plan should value trials against (``FleetView.reference_usd_per_proof``).

    Below the target, the market's margin (``clearing_usd_per_proof``). At the target a
    newcomer only pays if it beats the host it would replace, so the fleet's worst
    measured $/proof caps it: exploring against the market's margin alone would keep
    trying hosts that are worse than every host the fleet has.
    """
    clearing = clearing_usd_per_proof(instances, offers, target_rate_per_hour,
                                      max_usd_per_proof)
    proving = [i for i in instances if i.rate_per_hour and not i.leaving]
    if not proving or sum(i.rate_per_hour or 0.0 for i in proving) < target_rate_per_hour:
        return clearing
    return min(clearing, max(i.usd_per_proof for i in proving))


def _deploy(p: Proposal, reason: str, *, exploration: bool,
            trial_share: float | None = None) -> Action:
    return Action(
        kind="deploy", reason=reason, offer_id=p.offer_id, machine_id=p.machine_id,
        exploration=exploration, dph_total=p.dph_total,
        expected_rate_per_hour=p.prediction.rate_per_hour, trial_cost_usd=p.trial_cost_usd,
        trial_share=trial_share,
    )


def _terminate(i: FleetInstance, reason: str) -> Action:
    return Action(kind="terminate", reason=reason, instance_id=i.instance_id,
                  machine_id=i.machine_id, dph_total=i.dph_total)


def decide(
    instances: Sequence[FleetInstance],
    plan: Plan,
    caps: AutopilotCaps,
    ledger: Ledger,
    *,
    now: float,
) -> Decision:
    """The actions for this tick, each with its reason (see the module's rules)."""
    caps.validate()
    live = list(instances)
    actions = _over_caps(live, caps) + _trim(live, caps.target_rate_per_hour)
    grown, notes = _fill_and_explore(live, plan, caps, ledger, now)
    if not plan.proposals:
        notes.append(f"no trial proposed: {plan.stop_reason}")
    return Decision(tuple(actions + grown), tuple(notes))


def _dph(live: list[FleetInstance]) -> float:
    return sum(i.dph_total for i in live)


def _rate(live: list[FleetInstance]) -> float:
    return sum(i.rate_per_hour or 0.0 for i in live if not i.leaving)


def _worst_first(live: list[FleetInstance]) -> list[FleetInstance]:
    return sorted((i for i in live if i.rate_per_hour is not None and not i.leaving),
                  key=lambda i: -i.usd_per_proof)


def _over_caps(live: list[FleetInstance], caps: AutopilotCaps) -> list[Action]:
    """1. Caps: the worst proving hosts first, then trials, dearest first (a cap lowered,
    or instances deployed by hand, can leave the fleet over one). Removes them from
    ``live``."""
    actions = []
    trials_dearest = sorted((i for i in live if i.on_trial), key=lambda i: -i.dph_total)
    for host in [*_worst_first(live), *trials_dearest]:
        over_dph = _dph(live) > caps.max_dph_total + 1e-9
        over_count = len(live) > caps.max_instances
        if not (over_dph or over_count):
            break
        why = (f"the fleet costs ${_dph(live):.2f}/h, over the ${caps.max_dph_total:.2f}/h cap"
               if over_dph else f"{len(live)} instances, over the cap of {caps.max_instances}")
        which = ("it is the dearest trial under way" if host.on_trial
                 else f"its ${host.usd_per_proof:.4f}/proof is the fleet's worst")
        actions.append(_terminate(host, f"{why}; {which}"))
        live.remove(host)
    return actions


def _delivered_rate(live: list[FleetInstance]) -> float:
    return sum(i.rate_per_hour or 0.0 for i in live if not i.leaving and i.rate_delivered)


def _trim(live: list[FleetInstance], target: float) -> list[Action]:
    """2. Trim: the worst hosts the fleet can do without and still make its target on
    what the rest are known to deliver (a rate on a host's word alone counts nothing)."""
    actions = []
    for host in _worst_first(live):
        assert host.rate_per_hour is not None
        delivered = _delivered_rate(live)
        without = delivered - (host.rate_per_hour if host.rate_delivered else 0.0)
        if without < target:
            break
        actions.append(_terminate(
            host,
            f"the fleet makes {delivered:.1f}/h and {without:.1f}/h without it (target "
            f"{target:.1f}/h); its ${host.usd_per_proof:.4f}/proof is the fleet's worst",
        ))
        live.remove(host)
    return actions


def _fill_and_explore(live: list[FleetInstance], plan: Plan, caps: AutopilotCaps,
                      ledger: Ledger, now: float) -> tuple[list[Action], list[str]]:
    """3. Fill, then 4. explore, from the plan in order (deploys join ``live``)."""
    actions: list[Action] = []
    notes: list[str] = []
    target = caps.target_rate_per_hour
    pending = sum(i.expected_rate_per_hour or 0.0 for i in live if i.on_trial)
    trials = sum(1 for i in live if i.on_trial)
    taken = {i.machine_id for i in live}
    for m in _measured_to_return(live, plan, caps, taken, pending, trials, notes):
        actions.append(m)
        pending += m.expected_rate_per_hour or 0.0
        trials += 1
    explored = False
    for p in plan.proposals:
        if p.machine_id is not None and p.machine_id in taken:
            continue
        short = target - _rate(live) - pending
        if trials >= caps.max_concurrent_trials:
            notes.append(f"{trials} trials under way, the most allowed at once")
            break
        if len(live) + 1 > caps.max_instances:
            notes.append(f"{len(live)} instances: one more would pass the cap of "
                         f"{caps.max_instances}")
            break
        if _dph(live) + p.dph_total > caps.max_dph_total + 1e-9:
            notes.append(f"offer {p.offer_id} at ${p.dph_total:.2f}/h would take the fleet past "
                         f"the ${caps.max_dph_total:.2f}/h cap")
            continue
        share: float | None = None
        if short > 0:
            reason = (f"fleet at {_rate(live):.1f}/h of the {target:.1f}/h target "
                      f"({pending:.1f}/h on trial); expected value "
                      f"${p.expected_value_usd:.2f} for a ${p.trial_cost_usd:.2f} trial: "
                      f"{p.hypothesis}")
            exploration = False
        else:
            if explored:
                break
            share, refusal = _exploration_share(p, caps, ledger, now)
            if refusal is not None:
                notes.append(refusal)
                break
            reason = (f"fleet at its {target:.1f}/h target; exploring (trials {share:.0%} of "
                      f"spend, cap {caps.max_explore_share:.0%}): expected value "
                      f"${p.expected_value_usd:.2f} for a ${p.trial_cost_usd:.2f} trial: "
                      f"{p.hypothesis}")
            exploration = explored = True
        actions.append(_deploy(p, reason, exploration=exploration, trial_share=share))
        live.append(FleetInstance(f"pending:{p.offer_id}", p.machine_id or f"offer:{p.offer_id}",
                                  p.dph_total, None, p.prediction.rate_per_hour))
        taken.add(p.machine_id or "")
        pending += p.prediction.rate_per_hour
        trials += 1
    return actions, notes


def _measured_to_return(live: list[FleetInstance], plan: Plan, caps: AutopilotCaps,
                        taken: set[str], pending: float, trials: int,
                        notes: list[str]) -> list[Action]:
    """3a. Fill from machines already measured and worth deploying on their measurement,
    cheapest per proof first, before any trial: a known rate is no gamble (the plan
    lists them apart, never as trials). Deploys join ``live`` and ``taken``."""
    actions: list[Action] = []
    target = caps.target_rate_per_hour
    replaced = False
    for m in plan.measured:
        short = target - _rate(live) - pending
        if trials >= caps.max_concurrent_trials:
            break
        if not m.worth_deploying or m.machine_id in taken:
            continue
        if (len(live) + 1 > caps.max_instances
                or _dph(live) + m.dph_total > caps.max_dph_total + 1e-9):
            continue
        rate = m.prediction.rate_per_hour
        if short > 0:
            why = (f"fleet at {_rate(live):.1f}/h of the {target:.1f}/h target "
                   f"({pending:.1f}/h on trial)")
        else:
            # At the target: one known machine a tick replaces the fleet's worst host
            # (rule 2 trims it once this one proves), if it is cheaper per proof. The
            # newcomer is priced at its full hourly figure (its setup download included),
            # the incumbent at its rent alone: its download is already paid.
            worst = next(iter(_worst_first(live)), None)
            if replaced or worst is None or not m.predicted_usd_per_proof < worst.usd_per_proof:
                continue
            why = f"cheaper per proof than the fleet's worst (${worst.usd_per_proof:.4f})"
            replaced = True
        actions.append(Action(
            kind="deploy", offer_id=m.offer_id, machine_id=m.machine_id, dph_total=m.dph_total,
            expected_rate_per_hour=rate, reason=(
                f"{why}; machine {m.machine_id} was measured at about {rate:.1f}/h: "
                f"${m.predicted_usd_per_proof:.4f}/proof, worth keeping")))
        live.append(FleetInstance(f"pending:{m.offer_id}", m.machine_id, m.dph_total, None,
                                  rate))
        taken.add(m.machine_id)
        pending += rate
        trials += 1
    if actions:
        notes.append(f"{len(actions)} measured machine(s) deployed again on their measurement")
    return actions


def _exploration_share(p: Proposal, caps: AutopilotCaps, ledger: Ledger,
                       now: float) -> tuple[float, str | None]:
    """Trials' share of spend with this one explored, and why it may not be (None: it may)."""
    share = (ledger.trials_usd + p.trial_cost_usd) / (ledger.total_usd + p.trial_cost_usd)
    if share > caps.max_explore_share:
        return share, (f"exploring offer {p.offer_id} would bring trials to {share:.0%} "
                       f"of spend, over the {caps.max_explore_share:.0%} cap")
    since = None if ledger.last_exploration_at is None else now - ledger.last_exploration_at
    if since is not None and since < caps.explore_interval_s:
        return share, (f"last exploration {since:.0f} s ago; the next after "
                       f"{caps.explore_interval_s:.0f} s")
    return share, None
