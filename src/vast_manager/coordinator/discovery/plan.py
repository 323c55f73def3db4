"""Which offers to benchmark next, and why: each trial's expected value against its cost.

Every deployment is an experiment that costs its rent until the benchmark's
verdict. For an offer at ``dph_total`` with a predicted true rate ``r``
(log-normal, from the rate model) the plan asks what keeping it would be worth
against the fleet's reference cost per proof ``lambda`` (what the proofs it makes
would cost elsewhere: the fleet's marginal host, or the best it has, or at most
the policy's ``max_usd_per_proof``):

    saving per hour = E[ max(0, lambda * r - dph_total) ]      (kept only if it beats lambda)
    expected value  = saving per hour * hours it would run - the trial's cost

The expectation has a closed form for a log-normal rate (the expected improvement
of Bayesian optimisation, here in dollars). The plan lists the offers with the
highest expected value, at most ``trials`` of them and within ``budget_usd``, and
stops when nothing is worth its cost. Each proposal says its predicted interval,
its break-even rates, the chance it beats the fleet's best $/proof, and the
hypothesis it tests in one sentence. docs/discovery.md has the derivation.

Pure: offers, a fitted model and the fleet's figures in; a ``Plan`` out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from vast_manager.agent.config import BENCH_PROOFS
from vast_manager.coordinator.decisions import cost
from vast_manager.coordinator.discovery.features import (
    GIB,
    FeatureError,
    OfferFeatures,
    offer_features,
)
from vast_manager.coordinator.discovery.fleet_gain import FleetOnOffer, gain_per_hour
from vast_manager.coordinator.discovery.structural_model import Prediction, Unpredictable, normal_sf
from vast_manager.coordinator.offers import Offer, positive
from vast_manager.coordinator.settings import DEFAULTS


class Predictor(Protocol):
    """What the plan needs of a model (``RateModel`` is one)."""

    def predict_offers(
        self, offers: Sequence[Offer], *, explain: bool = True
    ) -> list[Prediction | Unpredictable]: ...


@dataclass(frozen=True, slots=True)
class TrialCost:
    """How long a trial rents its host before the verdict: boot, parameter fetch,
    warm-up and the benchmark (docs/policy.md; the original manager's 12 proofs after a
    5-7 minute warm-up)."""

    params_gib: float = 45.0  # the PoRep 32G parameters a fresh host downloads
    boot_s: float = 300.0
    warmup_s: float = 420.0
    bench_proofs: int = BENCH_PROOFS
    bench_timeout_s: float = DEFAULTS.benchmark_timeout_s
    default_inet_down_mbps: float = 500.0
    #: GB the fresh host downloads (parameters and image), billed at the offer's
    #: ``inet_down_cost`` (None: the parameters alone).
    download_gb: float | None = None

    @property
    def download_bytes(self) -> float:
        if self.download_gb is not None:
            return self.download_gb * cost.BYTES_PER_GB
        return self.params_gib * GIB

    def hours(self, offer: Offer, rate_per_hour: float) -> float:
        """Hours of rent from deploy to verdict, for a host proving at ``rate_per_hour``."""
        mbps = positive(offer.inet_down) or self.default_inet_down_mbps
        fetch_s = self.params_gib * GIB * 8 / (mbps * 1e6)
        bench_s = min(self.bench_proofs * 3600.0 / max(rate_per_hour, 1e-3), self.bench_timeout_s)
        return (self.boot_s + fetch_s + self.warmup_s + bench_s) / 3600.0


@dataclass(frozen=True, slots=True)
class Doubt:
    """A share of the trials tests the model's beliefs where nothing near was measured
    (docs/discovery.md, "Testing what the model rules out").

    The model's interval is conditional on its structure: which resource binds and how.
    On a market it was not written from that structure is itself uncertain, most where
    nothing like the offer was measured, and an interval that rules an offer out is then
    never tested by trials chosen on expected value. So ``share`` of the trials (every
    ``1/share``-th, counted by the machines measured so far) go to the unmeasured cell
    (GPU model and count, binding resource, RAM-share octave) whose keep-or-not verdict
    the model and the unbound reading (the rate the offer's other capacities allow when
    the resource the model says binds does not, spread by ``log_sd``: ``unbound_rate``)
    disagree on most. For such a trial the plan believes the mixture: the model with
    ``1 - weight``, the unbound reading with ``weight``; the trial is listed only if it
    is worth its cost under that belief."""

    share: float = 0.25
    weight: float = 0.25
    log_sd: float = 0.2
    #: The least disagreement (difference of the two readings' chances of being worth
    #: keeping) a test needs: below it the beliefs agree and the slot goes to value.
    min_disagreement: float = 0.2


def belief_tests(share: float) -> Doubt:
    """The operator's ``plan_belief_test_share``: 0 turns the tests off (and the mixture
    belief with them); above 0, that share of trials with the method's other defaults."""
    return Doubt(share=share) if share > 0 else Doubt(share=0.0, weight=0.0)


@dataclass(frozen=True, slots=True)
class PlanSettings:
    max_usd_per_proof: float = DEFAULTS.max_usd_per_proof
    trials: int = 5
    budget_usd: float | None = None
    horizon_hours: float = DEFAULTS.plan_horizon_hours  # how long a kept host is expected to run
    min_expected_value_usd: float = 0.0
    trial_cost: TrialCost = field(default_factory=TrialCost)
    #: Off unless asked for: on the simulated live market (docs/discovery.md, section 3)
    #: the autopilot with the belief tests on kept a worse fleet (a quarter of its trials
    #: for weeks, testing a model that was right); the market bench asks for them.
    doubt: Doubt = field(
        default_factory=lambda: belief_tests(DEFAULTS.plan_belief_test_share))


@dataclass(frozen=True, slots=True)
class FleetView:
    """The fleet's figures the plan compares against (all optional)."""

    best_usd_per_proof: float | None = None  # the fleet's best measured $/proof
    reference_usd_per_proof: float | None = None  # what a kept newcomer must beat
    #: Where ``reference_usd_per_proof`` came from, in words for the operator.
    reference_source: str | None = None
    busy_machines: frozenset[str] = frozenset()  # ours already: deploy refuses them
    bad_machines: frozenset[str] = frozenset()
    #: The fleet of a fixed size the reference is the last host of (from nothing
    #: proving): with it a trial is worth the fall in that fleet's $/proof
    #: (``fleet_gain``), not its saving against the reference alone.
    fleet_on_offer: FleetOnOffer | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """One offer worth benchmarking, with the numbers behind it."""

    offer_id: int | None
    machine_id: str | None
    offer: Offer
    prediction: Prediction
    dph_total: float  # vast.ai's figure: rent and storage, no bandwidth
    break_even_rate_per_hour: float  # hourly figure / max_usd_per_proof: the verdict's minimum
    break_even_vs_reference: float  # hourly figure / reference $/proof: worth keeping above it
    break_even_vs_best: float | None  # hourly figure / the fleet's best $/proof
    probability_passes: float  # P(rate >= the verdict's minimum)
    probability_beats_best: float | None  # P($/proof below the fleet's best)
    probability_worth_keeping: float  # P(rate > break_even_vs_reference)
    trial_hours: float
    trial_cost_usd: float
    expected_saving_per_hour_usd: float
    expected_value_usd: float  # over the horizon, net of the trial's cost
    hypothesis: str
    #: The full hourly figure once kept (rent, storage, setup download over the horizon).
    hourly: cost.Cost = field(default_factory=cost.Cost)
    #: The trial's cost by part (``trial_cost_usd`` is its total).
    trial: cost.Cost = field(default_factory=cost.Cost)

    @property
    def predicted_usd_per_proof(self) -> float:
        return (self.hourly.total or self.dph_total) / self.prediction.rate_per_hour


@dataclass(frozen=True, slots=True)
class MeasuredOffer:
    """An offer on a machine already measured: not a trial, a deploy-or-not decision on
    its measurement (the prediction reads the machine's own runs)."""

    offer_id: int | None
    machine_id: str
    offer: Offer
    prediction: Prediction
    dph_total: float  # vast.ai's figure: rent and storage, no bandwidth
    #: The full hourly figure once kept (rent, storage, setup download over the horizon),
    #: the same a proposal is priced at, so the two lists compare.
    hourly: cost.Cost
    predicted_usd_per_proof: float  # hourly.total / the predicted rate
    worth_deploying: bool  # its $/proof beats the reference a newcomer must beat


@dataclass(frozen=True, slots=True)
class Plan:
    proposals: tuple[Proposal, ...]
    considered: int  # offers the model could predict and the fleet could deploy
    worth_trying: int  # of those, how many had an expected value above the minimum
    reference_usd_per_proof: float
    stop_reason: str  # why the list ends where it does
    # Offers on machines already measured, cheapest per proof first: never proposed as
    # trials (a trial would only repeat what the measurement says).
    measured: tuple[MeasuredOffer, ...] = ()
    #: Which reference the plan judged against, in words (``reference_source``).
    reference_source: str = ""


def reference_usd_per_proof(fleet: FleetView, settings: PlanSettings) -> float:
    """The $/proof a newcomer must beat: as given, else the fleet's best, else the cap."""
    return reference_and_source(fleet, settings)[0]


def reference_and_source(fleet: FleetView, settings: PlanSettings) -> tuple[float, str]:
    """``reference_usd_per_proof`` and where it came from, in words."""
    cap = settings.max_usd_per_proof
    given = fleet.reference_usd_per_proof
    if given is not None and given > 0:
        return min(given, cap), (fleet.reference_source or "as given")
    best = fleet.best_usd_per_proof
    if best is not None and best > 0:
        return min(best, cap), "the fleet's best measured $/proof"
    return cap, "the verdict's break-even $/proof: nothing to compare with"


def expected_saving_per_hour(prediction: Prediction, dph_total: float, ref: float) -> float:
    """E[max(0, ref * r - dph_total)] for a log-normal r (or a mixture of log-normals,
    one per mode: the expectation is their weighted sum): the closed-form expected
    improvement, in dollars per hour."""
    log_b = math.log(dph_total / ref)
    total = 0.0
    for weight, mu, sd in prediction.components():
        s = max(sd, 1e-9)
        total += weight * (ref * math.exp(mu + s * s / 2) * normal_sf((log_b - mu - s * s) / s)
                           - dph_total * normal_sf((log_b - mu) / s))
    return total


# --- doubt where nothing was measured ------------------------------------------------

#: The novelty a doubted prediction carries (``with_doubt``): the hypothesis reads it.
DOUBT_NOTE = "no measured machine shares its GPU model and count, binding resource and RAM share"

Cell = tuple[str, int, str, int]


def doubt_cell(offer: Offer, prediction: Prediction) -> Cell | None:
    """Where the offer sits in the model's beliefs: GPU model and count, the resource the
    model says binds, and the RAM share's octave (64-127 GiB, 128-255, ...); None when
    the offer's fields cannot be read."""
    try:
        f = offer_features(offer)
    except FeatureError:
        return None
    octave = math.floor(math.log2(max(f.ram_share_gib, 1.0)))
    return (f.gpu_key, f.num_gpus, prediction.bottleneck, octave)


def with_doubt(prediction: Prediction, doubt: Doubt) -> Prediction:
    """The plan's belief for an offer in an unmeasured cell: the model's modes scaled by
    ``1 - weight``, and a mode of ``weight`` at the unbound reading (``unbound_rate``:
    the rate the offer's other capacities allow if the one the model says binds does
    not) with the GPU class's spread. The interval shown stays the model's; the expected
    value and the probabilities read the mixture. Unchanged when the weight is zero or
    the model gives no GPU capacity."""
    unbound = unbound_rate(prediction)
    if (doubt.weight <= 0 or unbound is None or not unbound > 0
            or DOUBT_NOTE in prediction.novelty):
        return prediction
    keep = 1.0 - doubt.weight
    modes = tuple((w * keep, mu, sd) for w, mu, sd in prediction.components())
    return dataclasses.replace(
        prediction, modes=(*modes, (doubt.weight, math.log(unbound), doubt.log_sd)),
        novelty=(*prediction.novelty, DOUBT_NOTE))


def unbound_rate(prediction: Prediction) -> float | None:
    """The alternative reading's rate: the least of the model's capacities but the one it
    says binds (the GPUs' always count). Only that belief is in doubt: a host
    whose CPU the model says binds is still held by its link and RAM share, and one whose
    RAM share binds by its vCPUs. None without a GPU capacity."""
    caps = prediction.capacities_per_hour
    if caps.get("gpu") is None:
        return None
    return min(v for k, v in caps.items() if k == "gpu" or k != prediction.bottleneck)


@dataclass(slots=True)
class CellEvidence:
    """What the measured machines say of their cells: how many, how many the model's
    interval for a new host missed (a surprise), and those surprises' mean log shift
    (the machine's own reading over the new-host one)."""

    machines: int = 0
    surprised: int = 0
    shift: float = 0.0


def _as_new_host(offer: Offer) -> Offer:
    """The offer as if no machine of it had been measured: no machine id to read runs by."""
    raw = {k: v for k, v in offer.raw.items() if k != "machine_id"}
    return msgspec.structs.replace(offer, machine_id=None, raw=raw)


def cell_evidence(offers: Sequence[Offer],
                  predictions: Sequence[Prediction | Unpredictable],
                  model: Predictor) -> tuple[dict[Cell, CellEvidence], int]:
    """Each measured cell's evidence, and how many measured machines the offers show.
    A machine's own prediction (its runs read) is compared with the model's prediction
    for the same offer as a new host."""
    own = [(o, p) for o, p in zip(offers, predictions, strict=True)
           if isinstance(p, Prediction) and p.machine_runs > 0]
    if not own:
        return {}, 0
    # Asked with explanations: a predictor that memoises its plain answers by machine or
    # by offer object (the autopilot's, the bench's) then asks its model afresh rather
    # than answer for an offer with no machine from its memo. Measured offers are few.
    anonymous = model.predict_offers(
        [_as_new_host(o) for o, _ in own], explain=True)
    cells: dict[Cell, CellEvidence] = {}
    for (offer, mine), anon in zip(own, anonymous, strict=True):
        if not isinstance(anon, Prediction):
            continue
        cell = doubt_cell(offer, anon)
        if cell is None:
            continue
        ev = cells.setdefault(cell, CellEvidence())
        ev.machines += 1
        if not anon.rate_low <= mine.rate_per_hour <= anon.rate_high:
            shift = math.log(mine.rate_per_hour / anon.rate_per_hour)
            ev.shift = (ev.shift * ev.surprised + shift) / (ev.surprised + 1)
            ev.surprised += 1
    return cells, len(own)


def with_cell_shift(prediction: Prediction, ev: CellEvidence, doubt: Doubt) -> Prediction:
    """The plan's belief for a new host in a cell whose measured machines surprised the
    model: the model's modes with ``1 - w``, the same shifted by the surprises' mean log
    shift with ``w``, ``w`` the chance of a surprise there (``weight`` as one prior
    observation, then the cell's surprises over its machines)."""
    if ev.surprised == 0:
        return prediction
    w = (doubt.weight + ev.surprised) / (1 + ev.machines)
    comps = prediction.components()
    return dataclasses.replace(prediction, modes=(
        *((wt * (1 - w), mu, sd) for wt, mu, sd in comps),
        *((wt * w, mu + ev.shift, sd) for wt, mu, sd in comps)))


def read_evidence(candidates: Sequence[Offer],
                  predictions: Sequence[Prediction | Unpredictable],
                  offers: Sequence[Offer], blocked: frozenset[str],
                  model: Predictor, doubt: Doubt,
                  ) -> tuple[list[Prediction | Unpredictable], dict[Cell, CellEvidence], int]:
    """The candidates' predictions with their cells' surprises read in
    (``with_cell_shift``), the cells' evidence, and the machines measured. The
    measured machines are the candidates' and the blocked offers' (the fleet's own are
    busy, and measured); one no longer on offer does not count."""
    if doubt.weight <= 0:
        return list(predictions), {}, 0
    held_back = [o for o in offers if str(o.machine_id) in blocked]
    cells, n = cell_evidence(candidates, predictions, model)
    if held_back:
        more, m = cell_evidence(held_back, model.predict_offers(held_back, explain=False),
                                model)
        n += m
        for cell, ev in more.items():
            mine = cells.setdefault(cell, CellEvidence())
            total = mine.surprised + ev.surprised
            if total:
                mine.shift = (mine.shift * mine.surprised + ev.shift * ev.surprised) / total
            mine.machines += ev.machines
            mine.surprised = total
    out: list[Prediction | Unpredictable] = []
    for offer, pred in zip(candidates, predictions, strict=True):
        if isinstance(pred, Prediction) and pred.machine_runs == 0:
            at = doubt_cell(offer, pred)
            if at is not None and at in cells:
                pred = with_cell_shift(pred, cells[at], doubt)
        out.append(pred)
    return out, cells, n


def disagreement(prediction: Prediction, doubted: Prediction, break_even: float) -> float:
    """How far the unbound reading and the model disagree on whether the offer is worth
    keeping: the difference of their chances of proving above ``break_even``."""
    _, mu, sd = doubted.components()[-1]
    p_unbound = normal_sf((math.log(break_even) - mu) / max(sd, 1e-9)) if break_even > 0 else 1.0
    return abs(p_unbound - prediction.probability_above(break_even))


def due_slots(measured: int, trials: int, share: float) -> list[bool]:
    """Which of the next ``trials`` slots test a belief: trial number ``measured + i + 1``
    is a test when it crosses a multiple of ``1 / share`` (a quarter: the 4th, 8th, ...),
    so the share holds however the trials are asked for, one at a time or many."""
    if share <= 0:
        return [False] * trials
    return [math.floor((measured + i + 1) * share) > math.floor((measured + i) * share)
            for i in range(trials)]


def _belief_tests(ranked: Sequence[_Value], seen: set[Cell], ref: float,
                  settings: PlanSettings, fleet: FleetOnOffer | None) -> list[_Value]:
    """The unmeasured cells' tests, most disagreement per trial dollar first, one offer a
    cell (its best by the same measure), each valued under the mixture and kept only
    when worth its cost there."""
    doubt = settings.doubt
    best: dict[Cell, tuple[float, _Value]] = {}
    for v in ranked:
        cell = doubt_cell(v.offer, v.prediction)
        if cell is None or cell in seen:
            continue
        doubted = with_doubt(v.prediction, doubt)
        if doubted is v.prediction:
            continue
        d = disagreement(v.prediction, doubted, v.dph_total / ref)
        if d < doubt.min_disagreement:
            continue
        tv = _value(v.offer, doubted, ref, settings, fleet)
        if tv.expected_value_usd <= settings.min_expected_value_usd:
            continue
        # A test buys information, not proofs: its worth is the disagreement it can
        # settle, its price the trial's cost.
        key = d / max(tv.trial_cost_usd, 1e-6)
        held = best.get(cell)
        if held is None or key > held[0]:
            best[cell] = (key, tv)
    return [t[1] for t in sorted(best.values(), key=lambda t: -t[0])]


def schedule_tests(worth: Sequence[_Value], tests: Sequence[_Value], due: Sequence[bool]
                   ) -> list[_Value]:
    """The order trials are listed in: the due slots take the tests (most disputed
    first), the others the expected value's order; no offer twice. Past the slots
    counted, the rest of ``worth`` follows (a budget may skip some)."""
    out: list[_Value] = []
    queue, rest = list(tests), list(worth)
    for is_test in due:
        source = queue if is_test and queue else rest
        if not source:
            break
        pick = source.pop(0)
        out.append(pick)
        queue = [v for v in queue if v.offer is not pick.offer]
        rest = [v for v in rest if v.offer is not pick.offer]
    return out + rest


def _keep_doubt(explained: Prediction | Unpredictable, ranked: Prediction,
                doubt: Doubt) -> Prediction:
    """The explained prediction of a picked offer, doubted as its ranking was."""
    if not isinstance(explained, Prediction):
        return ranked
    return with_doubt(explained, doubt) if DOUBT_NOTE in ranked.novelty else explained


def evaluate_offer(
    offer: Offer,
    prediction: Prediction,
    fleet: FleetView,
    settings: PlanSettings,
    *,
    features: OfferFeatures | None = None,
) -> Proposal | None:
    """The proposal for one offer, or None when it has no price."""
    listed = positive(offer.dph_total)
    if listed is None:
        return None
    hourly = _hourly(offer, settings)
    dph = hourly.total
    ref = reference_usd_per_proof(fleet, settings)
    best = fleet.best_usd_per_proof if fleet.best_usd_per_proof else None
    minimum = dph / settings.max_usd_per_proof
    be_ref = dph / ref
    be_best = dph / best if best else None
    value = _value(offer, prediction, ref, settings, fleet.fleet_on_offer)
    hours = settings.trial_cost.hours(offer, prediction.rate_per_hour)
    feats = features or offer_features(offer)
    return Proposal(
        offer_id=offer.id,
        machine_id=feats.machine_id,
        offer=offer,
        prediction=prediction,
        dph_total=listed,
        break_even_rate_per_hour=minimum,
        break_even_vs_reference=be_ref,
        break_even_vs_best=be_best,
        probability_passes=prediction.probability_above(minimum),
        probability_beats_best=prediction.probability_above(be_best) if be_best else None,
        probability_worth_keeping=prediction.probability_above(be_ref),
        trial_hours=hours,
        trial_cost_usd=value.trial_cost_usd,
        expected_saving_per_hour_usd=value.saving_per_hour_usd,
        expected_value_usd=value.expected_value_usd,
        hypothesis=hypothesis(feats, prediction, minimum),
        hourly=hourly,
        trial=trial_cost(offer, hours, settings),
    )


def hypothesis(f: OfferFeatures, p: Prediction, break_even: float) -> str:
    """What a trial of this offer would show, in one sentence."""
    head = (f"{f.num_gpus}x {f.gpu_name} on {f.cpu_cores_effective:g} vCPU {f.cpu_family} "
            f"({f.ram_share_gib:.0f} GiB RAM share)")
    gpus = "one GPU" if f.num_gpus == 1 else f"{f.num_gpus} GPUs"
    if p.machine_runs:
        question = f"re-measures machine {f.machine_id} ({p.machine_runs} run(s) so far)"
    elif any(n.startswith(f"no {f.gpu_name} ") for n in p.novelty):
        question = (f"tests whether the {f.gpu_name} proves as fast as its "
                    f"{f.mem_bw_gbps:.0f} GB/s memory bandwidth suggests")
    elif DOUBT_NOTE in p.novelty and p.bottleneck != "gpu":
        question = (f"tests the model's belief that {p.bottleneck} binds here (nothing like "
                    f"it measured; without it {unbound_rate(p) or 0.0:.0f}/h)")
    elif [n for n in p.novelty if n != DOUBT_NOTE]:
        question = f"tests how fast {f.cpu_family} cores synthesise"
    elif p.bottleneck == "cpu":
        question = f"tests whether {f.cpu_cores_effective:g} vCPUs keep {gpus} fed"
    elif p.bottleneck == "memory":
        question = (f"tests whether a {f.ram_share_gib:.0f} GiB RAM share holds enough "
                    f"partitions in flight for {gpus}")
    elif p.bottleneck == "pcie":
        question = f"tests whether {f.pcie_gbps:.1f} GB/s of PCIe per GPU keeps up"
    elif f.num_gpus > 1:
        question = f"tests whether {f.num_gpus} GPUs scale on one host"
    else:
        question = "tests whether this host reaches its GPU class's rate at this price"
    return (f"{head}: {question}; break-even {break_even:.0f}/h, "
            f"predicted {p.rate_low:.0f}-{p.rate_high:.0f}/h")


@dataclass(frozen=True, slots=True)
class _Value:
    offer: Offer
    prediction: Prediction
    dph_total: float
    trial_cost_usd: float
    expected_value_usd: float
    saving_per_hour_usd: float


def _hourly(offer: Offer, settings: PlanSettings) -> cost.Cost:
    """The offer's full hourly figure once kept: rent, storage, and the setup download
    spread over the horizon (``cost.kept_per_hour``; docs/operations.md)."""
    prices = cost.prices_of(offer)
    assert prices is not None  # callers checked dph_total
    return cost.kept_per_hour(prices, setup_down_bytes=settings.trial_cost.download_bytes,
                              kept_hours=settings.horizon_hours)


def trial_cost(offer: Offer, hours: float, settings: PlanSettings) -> cost.Cost:
    """What a trial of ``hours`` bills by part: rent and storage for its hours and the whole
    setup download (the trial pays it whether or not the host is kept)."""
    prices = cost.prices_of(offer)
    assert prices is not None
    return prices.per_hour().scaled(hours) + cost.Cost(
        bandwidth=prices.bandwidth_usd(settings.trial_cost.download_bytes, 0.0))


def _run_hours(offer: Offer, trial_hours: float, settings: PlanSettings) -> float:
    """The hours a kept host would run after its trial: the horizon, or the offer's
    duration if shorter."""
    run_h = settings.horizon_hours
    duration_s = positive(offer.duration)
    if duration_s is not None:
        run_h = min(run_h, duration_s / 3600.0)
    return max(0.0, run_h - trial_hours)


def _value(offer: Offer, pred: Prediction, ref: float, settings: PlanSettings,
           fleet: FleetOnOffer | None = None) -> _Value:
    """A trial's cost and expected value (``evaluate_offer``'s arithmetic, nothing else):
    the saving against ``ref``, or with ``fleet`` the fall in that fleet's $/proof."""
    dph = _hourly(offer, settings).total
    hours = settings.trial_cost.hours(offer, pred.rate_per_hour)
    run_h = _run_hours(offer, hours, settings)
    spent = trial_cost(offer, hours, settings).total
    if fleet is None:
        saving = expected_saving_per_hour(pred, dph, ref)
    else:
        mine = () if offer.machine_id is None else (str(offer.machine_id),)
        held = fleet.relying_on(mine)
        # Priced as the fleet's hosts are, at the listed hourly figure; a host the fleet
        # counts on untried is worth testing for the loss it would bring, too.
        saving = gain_per_hour(fleet.without(mine), fleet.size, [float(offer.dph_total or dph)],
                               [(w, [mu], [sd]) for w, mu, sd in pred.components()],
                               relying=held)
    return _Value(offer, pred, dph, spent, saving * run_h - spent, saving)


def _predict(model: Predictor, candidates: Sequence[Offer],
             offers: Sequence[Offer], blocked: frozenset[str], doubt: Doubt
             ) -> tuple[list[Prediction | Unpredictable], dict[Cell, CellEvidence], int]:
    """The candidates' predictions (no explanations: those cost a few dozen model
    evaluations an offer, and only the listed need them), with their cells' evidence
    read in (``read_evidence``)."""
    predictions = model.predict_offers(candidates, explain=False)
    return read_evidence(candidates, predictions, offers, blocked, model, doubt)


def _with_belief_tests(ranked: list[_Value], cells: dict[Cell, CellEvidence],
                       measured: int, ref: float, settings: PlanSettings,
                       fleet: FleetOnOffer | None) -> list[_Value]:
    """The offers worth trying, expected value first, with the due belief tests in their
    slots (``Doubt``)."""
    worth = [v for v in ranked if v.expected_value_usd > settings.min_expected_value_usd]
    doubt = settings.doubt
    if doubt.share <= 0 or doubt.weight <= 0:
        return worth
    due = due_slots(measured, settings.trials, doubt.share)
    if not any(due):
        return worth
    return schedule_tests(worth, _belief_tests(ranked, set(cells), ref, settings, fleet), due)


def _within_budget(worth: list[_Value], settings: PlanSettings) -> tuple[list[_Value], int]:
    """The first ``settings.trials`` of ``worth`` whose trials fit the budget, and how many
    worth trying did not fit it."""
    picked: list[_Value] = []
    spent = 0.0
    over_budget = 0
    for v in worth:
        if len(picked) >= settings.trials:
            break
        if settings.budget_usd is not None and spent + v.trial_cost_usd > settings.budget_usd:
            over_budget += 1
            continue
        picked.append(v)
        spent += v.trial_cost_usd
    return picked, over_budget


def plan_trials(
    offers: Sequence[Offer],
    model: Predictor,
    fleet: FleetView,
    settings: PlanSettings,
) -> Plan:
    """The offers to benchmark next, best expected value first, and why the list ends."""
    ref, source = reference_and_source(fleet, settings)
    blocked = fleet.busy_machines | fleet.bad_machines
    candidates: list[Offer] = []
    for offer in offers:
        machine = offer.machine_id
        if machine is not None and machine in blocked:
            continue
        if positive(offer.dph_total) is None:
            continue
        candidates.append(offer)
    # Explanations cost a few dozen model evaluations an offer: only for those listed.
    predictions, cells, done = _predict(model, candidates, offers, blocked, settings.doubt)
    best_per_machine: dict[str, _Value] = {}
    loose: list[_Value] = []
    measured: dict[str, MeasuredOffer] = {}
    for offer, pred in zip(candidates, predictions, strict=True):
        if isinstance(pred, Unpredictable):
            continue
        machine = offer.machine_id
        if pred.machine_runs > 0 and machine is not None and machine != "":
            hourly = _hourly(offer, settings)
            usd = hourly.total / pred.rate_per_hour
            held_m = measured.get(str(machine))
            if held_m is None or usd < held_m.predicted_usd_per_proof:
                measured[str(machine)] = MeasuredOffer(
                    offer.id, str(machine), offer, pred,
                    float(offer.dph_total or 0.0), hourly, usd, usd <= ref)
            continue
        value = _value(offer, pred, ref, settings, fleet.fleet_on_offer)
        if machine is None or machine == "":
            loose.append(value)
            continue
        # One trial per machine: deploy refuses a second instance on it anyway.
        held = best_per_machine.get(str(machine))
        if held is None or value.expected_value_usd > held.expected_value_usd:
            best_per_machine[str(machine)] = value
    considered = len(best_per_machine) + len(loose)
    values = [*best_per_machine.values(), *loose]
    if fleet.fleet_on_offer is not None:
        values = _with_gpu_model_value(values, _measured_gpu_models(measured.values()),
                                       fleet.fleet_on_offer, settings,
                                       _median_dlperf_ratio(m.offer for m in measured.values()))
    ranked = sorted(values, key=lambda v: (-v.expected_value_usd, v.dph_total))
    worth = _with_belief_tests(ranked, cells, done, ref, settings, fleet.fleet_on_offer)
    picked, over_budget = _within_budget(worth, settings)
    explained = model.predict_offers([v.offer for v in picked], explain=True)
    # The value shown is the one the offer was ranked by (a GPU model's trial includes
    # what it shows of the model's other offers).
    chosen = [
        dataclasses.replace(p, expected_value_usd=v.expected_value_usd)
        for v, e in zip(picked, explained, strict=True)
        if (p := evaluate_offer(v.offer, _keep_doubt(e, v.prediction, settings.doubt),
                                fleet, settings)) is not None
    ]
    if not ranked:
        reason = "no offer could be predicted and deployed"
    elif not worth:
        top = ranked[0]
        reason = (f"nothing is worth its cost: the best expected value is "
                  f"${top.expected_value_usd:.2f} (offer {top.offer.id}) against "
                  f"${ref:.4f}/proof")
    elif len(chosen) >= settings.trials and len(worth) > len(chosen):
        reason = f"{settings.trials} trials asked for; {len(worth) - len(chosen)} more worth trying"
    elif over_budget:
        reason = (f"budget ${settings.budget_usd:.2f} reached; {over_budget} more worth trying "
                  f"would not fit")
    else:
        reason = f"every offer worth its cost is listed ({len(chosen)})"
    return Plan(tuple(chosen), considered, len(worth), ref, reason,
                tuple(sorted(measured.values(), key=lambda m: m.predicted_usd_per_proof)),
                source)


# --- what a GPU model's first trial shows of its other offers --------------------------


def _gpu_key(offer: Offer) -> str | None:
    try:
        return offer_features(offer).gpu_key
    except FeatureError:
        return None


def _measured_gpu_models(measured: Iterable[MeasuredOffer]) -> set[str]:
    """The GPU models a machine on offer was measured with."""
    return {key for m in measured if (key := _gpu_key(m.offer)) is not None}


#: The z of the 90th percentile: an 80% interval is 2 x 1.2816 sd of log rate wide.
_Z90 = 1.2815515655446004


def _dlperf_ratio(offer: Offer) -> float | None:
    """log(the offer's dlperf per GPU / its GPU model's memory bandwidth), if it has both."""
    try:
        f = offer_features(offer)
    except FeatureError:
        return None
    bw = f.spec_mem_bw_gbps or f.mem_bw_gbps
    if not f.dlperf_per_gpu or not bw:
        return None
    return math.log(f.dlperf_per_gpu / bw)


def _median_dlperf_ratio(offers: Iterable[Offer]) -> float | None:
    """The offers' median ``_dlperf_ratio`` (the upper of the middle two); None with none."""
    ratios = sorted(r for o in offers if (r := _dlperf_ratio(o)) is not None)
    return ratios[len(ratios) // 2] if ratios else None


#: The weight the plan gives an unmeasured GPU model's speed following its dlperf as the
#: measured models' may, rather than its memory bandwidth as the model reads it
#: (docs/discovery.md, section 3).
_DLPERF_READING_WEIGHT = 0.25


def _with_gpu_model_value(values: list[_Value], measured_gpus: set[str],
                          fleet: FleetOnOffer, settings: PlanSettings,
                          measured_ratio: float | None = None) -> list[_Value]:
    """The first trial of a GPU model no measured machine has is worth what it shows of
    the model's speed: its offers' rates move together with that speed, so the trial of
    its best offer (by predicted $/proof) is valued by the fall in the fleet's $/proof if
    the model's best ``fleet.size`` offers take their places at one common draw of their
    log rates (each its point and its 80% interval's spread), when that exceeds the
    offer's own value. The fleet then takes what the trial reveals: the next fit
    predicts the model's other offers from it.

    The model reads an unmeasured GPU model's speed from its memory bandwidth. With
    ``measured_ratio`` (the measured machines' ``_median_dlperf_ratio``) the draw is a
    mixture: the model's, and with ``_DLPERF_READING_WEIGHT`` the same moved by the GPU
    model's median ``_dlperf_ratio`` less ``measured_ratio``, its speed following
    dlperf instead."""
    groups: dict[str, list[_Value]] = {}
    for v in values:
        key = _gpu_key(v.offer)
        if key is not None and key not in measured_gpus:
            groups.setdefault(key, []).append(v)
    raised: dict[int, _Value] = {}
    for group in groups.values():
        best = sorted(group, key=lambda v: (v.dph_total / v.prediction.rate_per_hour,
                                            v.dph_total))[:fleet.size]
        machines = {str(v.offer.machine_id) for v in best if v.offer.machine_id is not None}
        mus = [math.log(v.prediction.rate_per_hour) for v in best]
        sds = [max(math.log(v.prediction.rate_high / v.prediction.rate_low) / (2 * _Z90), 1e-3)
               for v in best]
        draws = [(1.0, mus, sds)]
        ratio = (None if measured_ratio is None
                 else _median_dlperf_ratio(v.offer for v in group))
        if measured_ratio is not None and ratio is not None:
            w = _DLPERF_READING_WEIGHT
            draws = [(1.0 - w, mus, sds),
                     (w, [mu + ratio - measured_ratio for mu in mus], sds)]
        saving = gain_per_hour(fleet.without(machines), fleet.size,
                               [float(v.offer.dph_total or v.dph_total) for v in best],
                               draws)
        first = best[0]
        hours = settings.trial_cost.hours(first.offer, first.prediction.rate_per_hour)
        value = saving * _run_hours(first.offer, hours, settings) - first.trial_cost_usd
        if value > first.expected_value_usd:
            raised[id(first)] = dataclasses.replace(first, expected_value_usd=value)
    return [raised.get(id(v), v) for v in values]
