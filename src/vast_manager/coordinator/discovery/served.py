"""The served rate model: candidates chosen and blended by grouped cross-validation.

The structural model (``structural_model.py``) encodes cuzk's physics; a market can behave
otherwise. So it is one candidate of four, and the evidence picks:

- ``structural``: the structural model's point;
- ``residual``: the structural point times what a forest of extremely randomised trees
  (scikit-learn's ``ExtraTreesRegressor``, ``_residual_learner``) learns of the log ratio
  the physics leaves over, from the offer's fields and the structural model's capacities
  and binding resource;
- ``plain``: a gradient-boosted tree ensemble (``HistGradientBoostingRegressor``) on the
  offer's plain fields and the instance's share (its RAM, vCPUs, share of the host, GPUs,
  PCIe per GPU) alone (log rate);
- ``linear``: the structural point times what a ridge regression (``RidgeCV``,
  ``_linear_learner``) learns of the same log ratio from the same columns as
  ``residual``: a smooth slope a column where the forest cuts boxes.

Each is scored by cross-validation grouped by machine (scikit-learn's ``GroupKFold``: one
machine's measurements are never on both sides of a fold), on the median absolute
percentage error of its out-of-fold points. The served point is the blend of their log
points, weights on a grid of the simplex, with the least cross-validated absolute log
error over the three quarters of machines it errs least on (``choose_blend``); the
single candidates are the grid's corners, so on the folds the blend is never worse than
the best of them by that error. The 80% interval is split-conformal on the blend's
out-of-fold log residuals, one a machine, normalised by a cross-fitted learner of how
large the residual is where the host is (``_machine_scores``), per binding resource and
GPU count (Mondrian) where a group has enough machines, else pooled, and narrowed by
the benchmark's noise: it bounds the true rate, the residuals a measurement.

A machine the fleet measured keeps the structural model's prediction: that one reads the
machine's own runs, which no learner of the offer's fields sees. docs/discovery.md
("Candidates") gives the figures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import ExtraTreesRegressor, HistGradientBoostingRegressor
from sklearn.impute import SimpleImputer
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GroupKFold, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler, TargetEncoder
from threadpoolctl import threadpool_limits

from vast_manager.coordinator.discovery.features import FeatureError, offer_features
from vast_manager.coordinator.discovery.measurements import RESOURCES, Measurement
from vast_manager.coordinator.discovery.structural_model import (
    Prediction,
    RateModel,
    Unpredictable,
    fit_rate_model,
    with_basis,
)
from vast_manager.coordinator.offers import Offer

Array = NDArray[np.float64]

CANDIDATES = ("structural", "residual", "plain", "linear")
#: Fewer machines than this and cross-validation cannot tell the candidates apart: the
#: structural model answers alone, with its own interval.
MIN_CV_MACHINES = 30
FOLDS = 5
#: With few machines a fold's models, fitted on (k-1)/k of them, err visibly more than the
#: model fitted on all, and the intervals calibrated on their residuals run wide: below
#: this many machines cross-validation uses ``FEW_MACHINES_FOLDS`` folds (nine tenths of
#: the machines in each fold's fit). Above it the difference is small and the time is not.
FEW_MACHINES = 500
FEW_MACHINES_FOLDS = 10
#: A binding resource gets its own interval scale once this many machines back it.
MIN_GROUP_ROWS = 40
BLEND_STEP = 0.1
#: The binding resources, coded for the learners by their place here.
BOTTLENECKS = RESOURCES
#: The offer's plain numeric fields, as vast.ai names them.
PLAIN_FIELDS = ("num_gpus", "gpu_ram", "gpu_mem_bw", "total_flops", "dlperf", "compute_cap",
                "cpu_cores", "cpu_cores_effective", "cpu_ram", "cpu_ghz", "pcie_bw",
                "gpu_lanes", "pci_gen", "disk_bw", "inet_down", "dph_total")


#: ``PLAIN_FIELDS`` of one offer, in that order (the list is the one declaration: a new
#: field for the learners is one more name there).
_plain_values: Callable[[Offer], tuple[float | None, ...]] = attrgetter(*PLAIN_FIELDS)


def plain_matrix(offers: Sequence[Offer], gpu_codes: dict[str, int]) -> Array:
    """The offers' plain fields (NaN when absent) and the GPU model's code (last column,
    categorical; an unknown model is NaN)."""
    out = np.full((len(offers), len(PLAIN_FIELDS) + 1), np.nan)
    for i, offer in enumerate(offers):
        for j, value in enumerate(_plain_values(offer)):
            if value is not None:
                out[i, j] = float(value)
        code = gpu_codes.get(str(offer.gpu_name))
        if code is not None:
            out[i, -1] = code
    return out


#: The instance's share as the model reads it (``features.offer_features``), beside
#: the plain fields: vast.ai's ``cpu_ram`` and ``cpu_cores`` are the whole host's.
SHARE_COLUMNS = ("ram_share_gib", "cpu_cores_effective", "host_share", "num_gpus",
                 "pcie_gbps_per_gpu")


def share_matrix(offers: Sequence[Offer]) -> Array:
    """``SHARE_COLUMNS`` of each offer (NaN where its features cannot be read)."""
    out = np.full((len(offers), len(SHARE_COLUMNS)), np.nan)
    for i, offer in enumerate(offers):
        try:
            f = offer_features(offer)
        except FeatureError:
            continue
        out[i] = (f.ram_share_gib, f.cpu_cores_effective, f.host_share, f.num_gpus,
                  f.pcie_gbps)
    return out


def plain_share_matrix(offers: Sequence[Offer], gpu_codes: dict[str, int]) -> Array:
    """The plain fields and the GPU model's code (``plain_matrix``), then the instance's
    share (``share_matrix``): what the ``plain`` candidate reads."""
    return np.hstack([plain_matrix(offers, gpu_codes), share_matrix(offers)])


#: ``residual_matrix``'s columns after ``plain_matrix``'s: the structural prediction's log
#: point, its log capacity of each resource in ``BOTTLENECKS``, the binding resource's
#: code, and the instance's log RAM share, log vCPUs, log PCIe and share of the host.
RESIDUAL_EXTRA = 1 + len(BOTTLENECKS) + 1 + 4
RESIDUAL_COLUMNS = len(PLAIN_FIELDS) + 1 + RESIDUAL_EXTRA
#: ``residual_matrix``'s categorical columns: the GPU model's code, the binding resource.
RESIDUAL_CATEGORICAL = (len(PLAIN_FIELDS), len(PLAIN_FIELDS) + 2 + len(BOTTLENECKS))


def residual_matrix(offers: Sequence[Offer], preds: Sequence[Prediction],
                    gpu_codes: dict[str, int]) -> Array:
    """The plain fields, the instance's share as the model reads it, and the structural
    prediction: its log point, log capacities and the binding resource (categorical)."""
    plain = plain_matrix(offers, gpu_codes)
    extra = np.full((len(offers), RESIDUAL_EXTRA), np.nan)
    for i, (offer, p) in enumerate(zip(offers, preds, strict=True)):
        f = offer_features(offer)
        caps = p.capacities_per_hour
        extra[i] = (
            math.log(p.rate_per_hour),
            *(math.log(max(caps.get(k, math.nan), 1e-9)) for k in BOTTLENECKS),
            float(BOTTLENECKS.index(p.bottleneck)) if p.bottleneck in BOTTLENECKS else np.nan,
            math.log(f.ram_share_gib), math.log(f.cpu_cores_effective),
            math.log(f.pcie_gbps), f.host_share,
        )
    return np.hstack([plain, extra])


def _learner(columns: int, categorical: Sequence[int]) -> Any:
    mask = np.zeros(columns, dtype=bool)
    for c in categorical:
        mask[c] = True
    # Shallow trees, a slow rate and a floor on leaf size: residuals are small and noisy,
    # and a few hundred machines must not be memorised.
    return HistGradientBoostingRegressor(
        max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=10,
        l2_regularization=1.0, categorical_features=mask, random_state=0)


def _plain_learner() -> Any:
    return _learner(len(PLAIN_FIELDS) + 1 + len(SHARE_COLUMNS), [len(PLAIN_FIELDS)])


#: The residual forest's leaves hold at least this many rows, or this share of them:
#: the residual is a smooth correction, and more rows should firm up its leaves' means,
#: not grow each tree (200 trees of a leaf per 5 of 10,000 rows pickle to 47 MB and
#: double the fit; a leaf per 2% keeps a tree near 50 leaves at any size).
MIN_LEAF_ROWS = 5
MIN_LEAF_SHARE = 0.02


def _residual_learner(rows: int) -> Any:
    """Extremely randomised trees on the residual of ``rows`` rows: the log ratio the
    physics leaves over is small beside the benchmark's noise, and boosting fits each
    stage to what the last left, noise included, where averaging many trees each split
    at random thresholds only smooths it. Missing fields go to the trees as NaN, which
    scikit-learn's extra trees take natively. The categorical columns are target-encoded,
    each category read as the residual's mean over it, cross-fitted (``TargetEncoder``),
    so that a split orders the categories by what they do as the boosted learner's
    native categories did; an unseen category reads the overall mean."""
    categorical = list(RESIDUAL_CATEGORICAL)
    rest = [c for c in range(RESIDUAL_COLUMNS) if c not in RESIDUAL_CATEGORICAL]
    encode = ColumnTransformer([
        ("categories", TargetEncoder(target_type="continuous",
                                     cv=KFold(5, shuffle=True, random_state=0)), categorical),
        ("fields", "passthrough", rest),
    ])
    # Half the columns a split; one thread, as the fit runs (``fit_served_model``).
    leaf = max(MIN_LEAF_ROWS, math.ceil(MIN_LEAF_SHARE * rows))
    forest = ExtraTreesRegressor(n_estimators=200, min_samples_leaf=leaf, max_features=0.5,
                                 random_state=0, n_jobs=1)
    return make_pipeline(encode, forest)


#: The linear residual's ridge penalties, chosen by its own leave-one-out error.
LINEAR_ALPHAS = tuple(float(a) for a in np.logspace(-1, 3, 13))


def _linear_learner() -> Any:
    """A ridge regression of the same residual on the same columns: the categories one-hot
    (an unseen one reads none), the numbers standardised, a missing field its column's
    median. Where the forest splits the residual into boxes, this reads it as one smooth
    slope a column (the residual of a misread form grows with the log GPU count, the log
    link, the log capacities), which a few hundred machines pin down with less noise
    than a leaf of a few; the blend weighs the two by their out-of-fold errors."""
    categorical = list(RESIDUAL_CATEGORICAL)
    rest = [c for c in range(RESIDUAL_COLUMNS) if c not in RESIDUAL_CATEGORICAL]
    columns = ColumnTransformer([
        ("categories", make_pipeline(SimpleImputer(strategy="most_frequent"),
                                     OneHotEncoder(handle_unknown="ignore")), categorical),
        ("fields", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), rest),
    ])
    return make_pipeline(columns, RidgeCV(alphas=LINEAR_ALPHAS))


def mdape_log(log_pred: Array, log_true: Array) -> float:
    """Median absolute percentage error of exp(log_pred) against exp(log_true)."""
    return float(np.median(np.abs(np.exp(log_pred - log_true) - 1.0)))


#: The share of machines whose errors choose the blend's weights: those it errs least on
#: (``trimmed_abs_log``).
BLEND_KEEP = 0.75


def trimmed_abs_log(log_pred: Array, log_true: Array, keep: float = BLEND_KEEP) -> float:
    """The mean absolute log error over the ``keep`` share of rows it is smallest on."""
    errors = np.sort(np.abs(log_pred - log_true))
    return float(np.mean(errors[:max(1, int(keep * len(errors)))]))


def choose_blend(oof: Array, log_true: Array) -> tuple[float, ...]:
    """The blend's weights: the point of the simplex's grid (``_blend_weights``) whose
    out-of-fold log points (``oof``, a column a candidate) have the least trimmed mean
    absolute log error (``trimmed_abs_log``); the first such point on a tie.

    Not the median absolute error the bench judges by: the median of a few hundred
    machines' errors rests on the few near the middle, so which grid point wins moves
    with the draw of the folds. Nor the mean of every machine's error: the quarter a
    blend errs most on (hosts no candidate reads, a benchmark that caught a neighbour)
    would choose the weights, and on the simulated market the served error gave up its
    middle to chase them. The mean of the three quarters it errs least on reads the
    middle with every machine there (docs/discovery-passes.md, "The blend chosen by a
    trimmed mean")."""
    best_w, best_err = _blend_weights(oof.shape[1])[0], math.inf
    for w in _blend_weights(oof.shape[1]):
        err = trimmed_abs_log(oof @ np.asarray(w), log_true)
        if err < best_err - 1e-12:
            best_w, best_err = w, err
    return best_w


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """One candidate's cross-validated errors, and the blend's weight on it."""

    name: str
    cv_mdape: float
    weight: float
    cv_trimmed_abs_log: float  # what the blend is chosen by (``choose_blend``)


@dataclass(slots=True)
class ServedModel:
    """The structural model and the learners, the blend CV chose, and the intervals."""

    structural: RateModel
    learners: Learners | None = None  # None: the structural model alone
    weights: tuple[float, ...] = (1.0,) + (0.0,) * (len(CANDIDATES) - 1)
    scores: tuple[CandidateScore, ...] = ()
    served_cv_mdape: float | None = None
    served_cv_trimmed_abs_log: float | None = None
    # (10th, 90th percentile) of the machines' normalised scores (``_machine_scores``),
    # per group (``group_keys``) and for all ("all").
    conformal: dict[str, tuple[float, float]] = field(default_factory=dict)
    conformal_mid: dict[str, float] = field(default_factory=dict)  # the scores' medians
    # The same percentiles of a binding resource with too few machines for its own
    # (``_conformal``): they only ever widen the interval its offers get.
    conformal_few: dict[str, tuple[float, float]] = field(default_factory=dict)
    difficulty: Any = None  # the learner of a new host's residual size (its scale)
    difficulty_empty: Any = None  # the columns no measured offer reported
    scale_median: float = 1.0
    noise_sd: float = 0.0  # one benchmark's (``benchmark_noise_sd``)
    gpu_codes: dict[str, int] = field(default_factory=dict)
    measurements_used: int = 0
    readable_machines: int = 0
    fit_seconds: float = 0.0
    cv_seconds: float = 0.0

    @property
    def n_machines(self) -> int:
        return self.structural.n_machines

    @property
    def machines(self) -> Mapping[str, Any]:
        """The structural model's measured machines (their effects)."""
        return self.structural.machines

    @property
    def n_measurements(self) -> int:
        return self.structural.n_measurements

    @property
    def answered_by(self) -> str:
        """Which model answers for a new host: a candidate's name, or 'blend'."""
        used = [n for n, w in zip(CANDIDATES, self.weights, strict=True) if w > 0]
        return used[0] if len(used) == 1 else "blend"

    def predict(self, offer: Offer) -> Prediction:
        (out,) = self.predict_offers([offer])
        if isinstance(out, Unpredictable):
            raise FeatureError(out.field, out.reason)
        return out

    def candidate_points(self, offers: Sequence[Offer]
                         ) -> tuple[list[Prediction | Unpredictable], Array]:
        """The structural predictions as new hosts, and each candidate's log point
        (rows: offers, columns: CANDIDATES; NaN where the structural model cannot read
        the offer)."""
        anonymous = [_as_new_host(o) for o in offers]
        preds = self.structural.predict_offers(anonymous, explain=False)
        logs = np.full((len(offers), len(CANDIDATES)), np.nan)
        ok = [i for i, p in enumerate(preds) if isinstance(p, Prediction)]
        if not ok:
            return preds, logs
        with threadpool_limits(1):
            return preds, self._candidate_logs(anonymous, preds, ok, logs)

    def _candidate_logs(self, anonymous: list[Offer],
                        preds: list[Prediction | Unpredictable], ok: list[int], logs: Array
                        ) -> Array:
        sub = [anonymous[i] for i in ok]
        sp = [preds[i] for i in ok]
        s = np.log([p.rate_per_hour for p in sp if isinstance(p, Prediction)])
        logs[ok, 0] = s
        if self.learners is not None:
            logs[ok, 1:] = self.learners.logs(sub, sp, self.gpu_codes)  # type: ignore[arg-type]
        return logs

    def predict_offers(self, offers: Sequence[Offer], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        """Predictions for offers (``RateModel.predict_offers``'s contract): a new host's
        point is the blend, its interval conformal; a measured machine's is the
        structural model's, which reads its runs."""
        own = self.structural.predict_offers(offers, explain=explain)
        if self.learners is None:
            return [self._label(p, None) for p in own]
        new = [i for i, p in enumerate(own) if isinstance(p, Prediction) and p.machine_runs == 0]
        if not new:
            return [self._label(p, None) for p in own]
        _, logs = self.candidate_points([offers[i] for i in new])
        scales = self.scales([offers[i] for i in new],
                             [p.bottleneck if isinstance(p := own[i], Prediction) else ""
                              for i in new])
        out = [self._label(p, None) for p in own]
        w = np.asarray(self.weights)
        for row, i in enumerate(new):
            p = own[i]
            assert isinstance(p, Prediction)
            if not np.all(np.isfinite(logs[row])):
                continue
            point = float(logs[row] @ w)
            lo, hi = self.interval(offers[i], p.bottleneck, float(scales[row]))
            mean = point + (lo + hi) / 2
            sd = max((hi - lo) / (2 * 1.2815515655446004), 1e-3)
            blended = dataclasses.replace(
                p, rate_per_hour=math.exp(point), rate_low=math.exp(point + lo),
                rate_high=math.exp(point + hi), log_rate_mean=mean, log_rate_sd=sd,
                modes=())
            if explain:  # the basis quotes the interval served, not the structural one
                blended = with_basis(blended, offer_features(offers[i]))
            out[i] = self._label(blended, self.answered_by)
        return out

    def scales(self, offers: Sequence[Offer], bottlenecks: Sequence[str]) -> Array:
        """Each new host's difficulty: how much wider than the median host's its interval
        is (``_machine_scores``)."""
        if self.difficulty is None or not offers:
            return np.full(len(offers), self.scale_median)
        x = _difficulty_matrix([_as_new_host(o) for o in offers], bottlenecks, self.gpu_codes)
        x[:, self.difficulty_empty] = 0.0
        lo, hi = (self.scale_median * f for f in DIFFICULTY_RANGE)
        out: Array = np.clip(np.exp(self.difficulty.predict(x)), lo, hi)
        return out

    def interval(self, offer: Offer, bottleneck: str, scale: float) -> tuple[float, float]:
        """The 80% interval of a new host's true log rate about the blend's point: its
        group's score percentiles times its scale, narrowed for the benchmark's noise
        (``_without_noise``): the residuals were against one benchmark each. A binding
        resource with too few machines for its own percentiles widens them where its
        machines' scores reach further (``_conformal``)."""
        key = conformal_key(self.conformal, bottleneck, offer_features(offer).num_gpus)
        lo, hi = self.conformal[key]
        mid = self.conformal_mid.get(key, (lo + hi) / 2)
        if bottleneck in self.conformal_few:
            few_lo, few_hi = self.conformal_few[bottleneck]
            lo, hi = min(lo, few_lo), max(hi, few_hi)
        return _without_noise(mid * scale, lo * scale, hi * scale, self.noise_sd)

    def _label(self, p: Prediction | Unpredictable, by: str | None
               ) -> Prediction | Unpredictable:
        if isinstance(p, Unpredictable):
            return p
        if by is None:
            head = ("structural model (this machine's runs)" if p.machine_runs
                    else "structural model" + ("" if self.served_cv_mdape is None else
                                               f", CV error {self.served_cv_mdape:.1%}"))
            if self.learners is None and not p.machine_runs:
                head = (f"structural model alone (cross-validation needs "
                        f"{MIN_CV_MACHINES} measured machines, {self.readable_machines} so far)")
        else:
            share = ", ".join(f"{s.name} {s.weight:.0%}" for s in self.scores if s.weight > 0)
            head = (f"{by} ({share}), CV error {self.served_cv_mdape:.1%}, "
                    f"conformal 80% interval")
        return dataclasses.replace(p, basis=f"[{head}] {p.basis}")

    def summary(self) -> dict[str, Any]:
        """The structural model's summary and the candidates' cross-validated errors."""
        return {
            **self.structural.summary(),
            "served_by": self.answered_by if self.learners is not None else "structural",
            "served_cv_mdape": self.served_cv_mdape,
            "served_cv_trimmed_abs_log": self.served_cv_trimmed_abs_log,
            "candidates": [dataclasses.asdict(s) for s in self.scores],
            # The median host's (a host's scale times its group's score percentiles).
            "conformal_log_interval": {k: [round(v[0] * self.scale_median, 4),
                                           round(v[1] * self.scale_median, 4)]
                                       for k, v in self.conformal.items()},
            "measurements_used": self.measurements_used,
            "cv_seconds": round(self.cv_seconds, 3),
        }


def _as_new_host(offer: Offer) -> Offer:
    """The offer as an unmeasured machine's: the structural model then predicts from the
    hardware alone, as cross-validation and the learners need."""
    return msgspec.structs.replace(offer, machine_id=None)


def _blend_weights(candidates: int, step: float = BLEND_STEP) -> list[tuple[float, ...]]:
    """The simplex's grid, the first candidate's corner first."""
    n = round(1 / step)
    return [(*(k / n for k in head), (n - sum(head)) / n)
            for head in product(range(n, -1, -1), repeat=candidates - 1) if sum(head) <= n]


def gpu_count_group(num_gpus: int) -> str:
    """The GPU-count group an interval is calibrated in: one, two, or more GPUs (several
    GPUs share one host's link, CPU and RAM, where a model errs otherwise)."""
    return "1" if num_gpus <= 1 else "2" if num_gpus == 2 else "3+"


def group_keys(bottleneck: str, num_gpus: int) -> tuple[str, ...]:
    """The groups an offer's interval may come from, the narrowest first: its binding
    resource and GPU count together, the binding resource, the GPU count, all."""
    k = gpu_count_group(num_gpus)
    return (f"{bottleneck}/{k}", bottleneck, f"gpus {k}", "all")


def _conformal(scores: Array, groups: Sequence[tuple[str, int]]
               ) -> tuple[dict[str, tuple[float, float]], dict[str, float],
                          dict[str, tuple[float, float]]]:
    """Split-conformal 10th and 90th percentiles (at the plotting positions k / (n + 1))
    and the median of the machines' scores (``_machine_scores``), for all and per group
    (``group_keys``) that has ``MIN_GROUP_ROWS`` machines; and the same percentiles of
    each binding resource with fewer machines (two at least).

    A binding resource that few machines back gets the interval of a wider group (its
    GPU count's, or all), which its own hosts may not resemble: on a market whose links
    bind 1-3% of hosts, the served points were 0.41 below those hosts' true log rates
    (median) and that interval covered half of them. Its own few scores cannot set its
    percentiles, but they can show the wider group's are too narrow for it: below nine
    machines the plotting positions are its extreme scores, and a new machine falls
    within the range of n exchangeable ones with probability (n - 1) / (n + 1). So its
    offers get the wider of the two (``ServedModel.interval``). Only the binding resource
    (the level the intervals are judged at), not its GPU-count subgroups: those split few
    machines finer, and widening by them too added 2-5 points to every market's
    coverage."""

    def bounds(r: Array) -> tuple[float, float]:
        # The order statistics at plotting positions k / (n + 1) (Weibull's): a new
        # machine's score falls below the k-th of n exchangeable ones with probability
        # k / (n + 1), so these bound it with probability 0.1 and 0.9 on average. The
        # usual finite-sample correction (ceil(0.9 (n + 1)) / n) guarantees at least 80%
        # and gives more on average (up to 2.5 points more in a group of 40 machines):
        # the acceptance is a calibrated 80%, not at least 80%.
        lo, hi = np.quantile(r, (0.1, 0.9), method="weibull")
        return float(lo), float(hi)

    out = {"all": bounds(scores)}
    mids = {"all": float(np.median(scores))}
    members: dict[str, list[int]] = {}
    for j, g in enumerate(groups):
        for key in group_keys(*g)[:-1]:
            members.setdefault(key, []).append(j)
    few = {}
    for key, ix in members.items():
        if len(ix) >= MIN_GROUP_ROWS:
            out[key] = bounds(scores[ix])
            mids[key] = float(np.median(scores[ix]))
        elif key in BOTTLENECKS and len(ix) >= 2:
            few[key] = bounds(scores[ix])
    return out, mids, few


def conformal_key(conformal: Mapping[str, tuple[float, float]], bottleneck: str,
                  num_gpus: int) -> str:
    """The narrowest calibrated group of an offer (``group_keys``)."""
    for key in group_keys(bottleneck, num_gpus):
        if key in conformal:
            return key
    return "all"


#: How far a host's difficulty may move its interval's width from the median host's.
DIFFICULTY_RANGE = (0.5, 3.0)


def _difficulty_matrix(offers: Sequence[Offer], bottlenecks: Sequence[str],
                       gpu_codes: dict[str, int]) -> Array:
    """What the difficulty learner reads: the plain fields and the share, and the binding
    resource the structural model names (categorical, last column)."""
    code = np.array([[float(BOTTLENECKS.index(b)) if b in BOTTLENECKS else np.nan]
                     for b in bottlenecks])
    return np.hstack([plain_share_matrix(offers, gpu_codes), code])


def _difficulty_learner() -> Any:
    cols = len(PLAIN_FIELDS) + 1 + len(SHARE_COLUMNS) + 1
    mask = np.zeros(cols, dtype=bool)
    mask[len(PLAIN_FIELDS)] = mask[-1] = True
    # Smaller and slower than the rate learners: it reads the size of a few hundred
    # residuals, noisier still than the residuals themselves.
    return HistGradientBoostingRegressor(
        max_iter=100, learning_rate=0.05, max_leaf_nodes=7, min_samples_leaf=20,
        l2_regularization=1.0, categorical_features=mask, random_state=0)


def _machine_scores(resid: Array, x: Array, machines: Sequence[str]
                    ) -> tuple[Array, list[int], Any, float]:
    """Normalised conformal scores, one a machine (Papadopoulos et al., "Normalized
    nonconformity measures for regression conformal prediction", 2008; Lei et al.,
    "Distribution-free predictive inference for regression", JASA 2018, section 5.2).

    A machine's rows are averaged into one residual: its rows are not independent, and a
    new host is a new machine. A learner of the residual's size (``_difficulty_learner``,
    on the log of its distance from the median) says where the blend errs more; its
    *cross-fitted* reading of each machine (fitted on the other folds, as the residuals
    were) divides that machine's residual. Where it reads nothing, the scale is the same
    for every host and this is the plain split-conformal interval.

    Returns the scores, each machine's first row, the learner fitted on every machine,
    and the median scale (the learner's readings are bounded about it,
    ``DIFFICULTY_RANGE``).
    """
    rows_of: dict[str, list[int]] = {}
    for i, m in enumerate(machines):
        rows_of.setdefault(m, []).append(i)
    r = np.array([float(np.mean(resid[ix])) for ix in rows_of.values()])
    first = [ix[0] for ix in rows_of.values()]
    xm = _no_empty_columns(x[first].copy())
    target = np.log(np.abs(r - np.median(r)) + 0.01)
    log_scale = np.full(len(r), float(np.mean(target)))
    folds = min(FOLDS, len(r) // MIN_GROUP_ROWS)
    if folds >= 2:
        ids = np.arange(len(r))
        for train, test in GroupKFold(n_splits=folds).split(xm, groups=ids):
            log_scale[test] = _difficulty_learner().fit(xm[train], target[train]).predict(xm[test])
    learner = _difficulty_learner().fit(xm, target)
    median = float(np.exp(np.median(log_scale)))
    scale = np.clip(np.exp(log_scale), median * DIFFICULTY_RANGE[0], median * DIFFICULTY_RANGE[1])
    return r / scale, first, learner, median


def _without_noise(mid: float, lo: float, hi: float, noise_sd: float
                   ) -> tuple[float, float]:
    """The bounds narrowed about the residuals' median so that they bound the true rate,
    not one benchmark of it.

    A residual is log(measured) - point: the model's error on the host's true rate plus
    one benchmark's noise, independent of it. The interval is of the true rate
    (``Prediction``), so the noise's variance comes out of the spread: the bounds scale by
    sqrt(1 - noise variance / residual variance), the residual variance read robustly from
    the same 10th-90th percentile spread (a normal's is 2 x 1.2816 sd). The noise is one
    benchmark's (``benchmark_noise_sd``); the factor never goes below one half, so a noise
    estimate larger than the residuals cannot collapse the interval.
    """
    if noise_sd <= 0 or hi <= lo:
        return lo, hi
    var = ((hi - lo) / (2 * 1.2815515655446004)) ** 2
    factor = math.sqrt(max(0.25, 1.0 - noise_sd**2 / var))
    return mid + (lo - mid) * factor, mid + (hi - mid) * factor


#: How many repeat runs the benchmark-noise prior weighs as (``benchmark_noise_sd``).
NOISE_PRIOR_RUNS = 30.0


def benchmark_noise_sd(measurements: Sequence[Measurement], prior_sd: float) -> float:
    """One benchmark's noise (sd of its log rate): the pooled variance between runs of
    one slice (machine and GPU count) of one machine, shrunk towards the prior's
    (``Priors.noise_sd``) as a conjugate prior of ``NOISE_PRIOR_RUNS`` runs would (the
    posterior mean of a normal's variance under a scaled inverse chi-squared prior).

    Only repeats show the noise apart from the host: with one run a machine, the
    structural fit splits the machines' spread between their own effects and their
    benchmarks' noise by the shape it assumes for the effects (Student-t), and on markets
    written from other beliefs that split put 0.022-0.033 on the noise where their
    benchmarks erred by 0.029-0.055 (docs/discovery.md, section 9, "The interval"): the
    intervals kept noise they were meant to take out. So with no repeats the prior
    speaks, and the fleet's repeats take over as they come. Runs of any age count alike:
    a machine that changed between its runs counts the change as noise, and its
    intervals run narrow."""
    runs = [np.log([m.rate_per_hour for m in ms]) for ms in slice_runs(measurements).values()]
    spread = sum(float(np.sum((v - np.mean(v)) ** 2)) for v in runs)
    repeats = sum(len(v) - 1 for v in runs)
    return math.sqrt((spread + NOISE_PRIOR_RUNS * prior_sd**2) / (repeats + NOISE_PRIOR_RUNS))


def _no_empty_columns(x: Array) -> Array:
    """A field no training offer reports is a constant for the learner (it cannot bin a
    column of only missing values)."""
    x[:, np.all(np.isnan(x), axis=0)] = 0.0
    return x


@dataclass(frozen=True, slots=True)
class Learners:
    """The fitted learners behind ``CANDIDATES``' columns after the structural one."""

    residual: Any  # the structural residual's forest
    plain: Any  # the log rate from the offer's fields alone
    linear: Any  # the structural residual's ridge regression

    def logs(self, offers: list[Offer], preds: list[Prediction], gpu_codes: dict[str, int]
             ) -> Array:
        """Each learner's log point (``CANDIDATES``' columns after the structural one)."""
        s = np.log([p.rate_per_hour for p in preds])
        x = residual_matrix(offers, preds, gpu_codes)
        return np.column_stack([s + self.residual.predict(x),
                                self.plain.predict(plain_share_matrix(offers, gpu_codes)),
                                s + self.linear.predict(x)])


def _fit_learners(offers: list[Offer], log_rate: Array,
                  structural: RateModel, gpu_codes: dict[str, int]) -> Learners:
    preds = structural.predict_offers(offers, explain=False)
    sp = [p for p in preds if isinstance(p, Prediction)]
    assert len(sp) == len(offers)
    x = _no_empty_columns(residual_matrix(offers, sp, gpu_codes))
    resid = log_rate - np.log([p.rate_per_hour for p in sp])
    return Learners(
        residual=_residual_learner(len(offers)).fit(x, resid),
        plain=_plain_learner().fit(_no_empty_columns(plain_share_matrix(offers, gpu_codes)),
                                   log_rate),
        linear=_linear_learner().fit(x, resid))


def fit_served_model(measurements: Sequence[Measurement], *, now: float | None = None
                     ) -> ServedModel:
    """Fit the structural model on every measurement; with enough machines, score the
    candidates by grouped cross-validation, choose the blend and calibrate the interval."""
    # One thread: on a shared host the learner's OpenMP threads only contend (a 240-row
    # fit took 4 s with them, 0.3 s without). The limit reaches only libraries loaded
    # before it, hence scikit-learn's imports at the top of this module.
    with threadpool_limits(1):
        return _fit_served(measurements, now)


def _fit_served(measurements: Sequence[Measurement], now: float | None) -> ServedModel:
    started = time.perf_counter()
    usable = [m for m in measurements if _readable(m)]
    machines = len({m.machine_id for m in usable})
    if machines >= MIN_CV_MACHINES:
        # The bindings seen are a cold start's evidence (docs/discovery.md, section 2,
        # "What a measurement saw"): from here the learners correct the structural
        # model's reading, and read beside them the bindings cost accuracy.
        measurements = [dataclasses.replace(m, bottleneck=None) for m in measurements]
        usable = [dataclasses.replace(m, bottleneck=None) for m in usable]
    structural = fit_rate_model(measurements, now=now)
    served = ServedModel(structural, measurements_used=len(measurements),
                         readable_machines=machines)
    if machines < MIN_CV_MACHINES:
        served.fit_seconds = time.perf_counter() - started
        return served
    offers, log_rate, groups = machine_slices(usable)
    gpu_codes = {name: i for i, name in enumerate(sorted({str(o.gpu_name)
                                                          for o in offers}))}
    cv_started = time.perf_counter()
    oof = np.full((len(offers), len(CANDIDATES)), np.nan)
    binding: list[tuple[str, int]] = [("all", 1)] * len(offers)
    folds = FEW_MACHINES_FOLDS if machines <= FEW_MACHINES else FOLDS
    for train, test in GroupKFold(n_splits=min(folds, machines)).split(offers, groups=groups):
        # The folds keep the RAM form the whole fleet's evidence chose (one fit each);
        # the structural model reads every run of the training machines.
        training = {groups[i] for i in train}
        fold_model = fit_rate_model([m for m in usable if m.machine_id in training], now=now,
                                    priors=structural.priors)
        learners = _fit_learners([offers[i] for i in train], log_rate[train], fold_model,
                                 gpu_codes)
        te_offers = [offers[i] for i in test]
        te_preds = [p for p in fold_model.predict_offers(te_offers, explain=False)
                    if isinstance(p, Prediction)]
        oof[test, 0] = np.log([p.rate_per_hour for p in te_preds])
        oof[test, 1:] = learners.logs(te_offers, te_preds, gpu_codes)
        for i, p in zip(test, te_preds, strict=True):
            binding[i] = (p.bottleneck, offer_features(offers[i]).num_gpus)
    best_w = choose_blend(oof, log_rate)
    served.learners = _fit_learners(offers, log_rate, structural, gpu_codes)
    served.gpu_codes = gpu_codes
    served.weights = best_w
    blend_oof = oof @ np.asarray(best_w)
    served.served_cv_mdape = mdape_log(blend_oof, log_rate)
    served.served_cv_trimmed_abs_log = trimmed_abs_log(blend_oof, log_rate)
    served.scores = tuple(CandidateScore(n, mdape_log(oof[:, j], log_rate), best_w[j],
                                         trimmed_abs_log(oof[:, j], log_rate))
                          for j, n in enumerate(CANDIDATES))
    x = _difficulty_matrix(offers, [b for b, _ in binding], gpu_codes)
    scores, first, served.difficulty, served.scale_median = _machine_scores(
        log_rate - blend_oof, x, groups)
    served.difficulty_empty = np.all(np.isnan(x[first]), axis=0)
    served.conformal, served.conformal_mid, served.conformal_few = _conformal(
        scores, [binding[i] for i in first])
    served.noise_sd = benchmark_noise_sd(usable, structural.priors.noise_sd)
    served.cv_seconds = time.perf_counter() - cv_started
    served.fit_seconds = time.perf_counter() - started
    return served


def slice_runs(measurements: Sequence[Measurement]
               ) -> dict[tuple[str, int], list[Measurement]]:
    """Each machine's runs on each of its slices (machine, GPU count), first seen first."""
    runs: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        runs.setdefault((m.machine_id, offer_features(m.offer).num_gpus), []).append(m)
    return runs


def machine_slices(usable: Sequence[Measurement]) -> tuple[list[Offer], Array, list[str]]:
    """One row a machine and GPU count (a slice): the offer of its latest run as a new
    host's, the mean log rate of its runs, and the machine. The learners and the
    cross-validation read these, not the runs: a new host is a new machine, and a
    machine benchmarked ten times is one machine, not ten (by runs it would weigh ten
    times in the blend's choice, could fill a leaf of the residual forest alone, and its
    other runs would encode its GPU model with its own residual in the target
    encoder's cross-fitting). The structural model reads every run: it separates a
    machine's own effect from its benchmarks' noise."""
    runs = slice_runs(usable)
    offers = [_as_new_host(max(ms, key=attrgetter("measured_at")).offer)
              for ms in runs.values()]
    log_rate = np.array([float(np.mean(np.log([m.rate_per_hour for m in ms])))
                         for ms in runs.values()])
    return offers, log_rate, [machine for machine, _ in runs]


def _readable(m: Measurement) -> bool:
    try:
        offer_features(m.offer)
    except FeatureError:
        return False
    return True
