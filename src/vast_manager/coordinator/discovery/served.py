"""The served rate model: candidates chosen and blended by grouped cross-validation.

The structural model (``structural_model.py``) encodes cuzk's physics; a market can behave
otherwise. So it is one candidate of three, and the evidence picks:

- ``structural``: the structural model's point;
- ``residual``: the structural point times what a gradient-boosted tree ensemble
  (scikit-learn's ``HistGradientBoostingRegressor``) learns of the log ratio the physics
  leaves over, from the offer's fields and the structural model's capacities and binding
  resource;
- ``plain``: the same learner on the offer's plain fields alone (log rate).

Each is scored by cross-validation grouped by machine (scikit-learn's ``GroupKFold``: one
machine's measurements are never on both sides of a fold), on the median absolute
percentage error of its out-of-fold points. The served point is the blend of their log
points, weights on a grid of the simplex, with the least cross-validated error; the
single candidates are the grid's corners, so on the folds the blend is never worse than
the best of them. The 80% interval is split-conformal on the blend's out-of-fold log
residuals, per binding resource (Mondrian) where one has enough machines, else pooled,
and narrowed by the benchmark's noise: it bounds the true rate, the residuals a
measurement.

A machine the fleet measured keeps the structural model's prediction: that one reads the
machine's own runs, which no learner of the offer's fields sees. docs/discovery.md
("Candidates") gives the figures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.model_selection import GroupKFold
from threadpoolctl import threadpool_limits

from vast_manager.coordinator.discovery.features import FeatureError, offer_features
from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.structural_model import (
    Prediction,
    RateModel,
    Unpredictable,
    fit_rate_model,
)
from vast_manager.coordinator.offers import Offer

Array = NDArray[np.float64]

CANDIDATES = ("structural", "residual", "plain")
#: Fewer machines than this and cross-validation cannot tell the candidates apart: the
#: structural model answers alone, with its own interval.
MIN_CV_MACHINES = 30
FOLDS = 5
#: A binding resource gets its own interval scale once this many machines back it.
MIN_GROUP_ROWS = 40
BLEND_STEP = 0.1
BOTTLENECKS = ("gpu", "cpu", "pcie", "memory")
#: The offer's plain numeric fields, as vast.ai names them.
PLAIN_FIELDS = ("num_gpus", "gpu_ram", "gpu_mem_bw", "total_flops", "dlperf", "compute_cap",
                "cpu_cores", "cpu_cores_effective", "cpu_ram", "cpu_ghz", "pcie_bw",
                "gpu_lanes", "pci_gen", "disk_bw", "inet_down", "dph_total")


def _plain_values(o: Offer) -> tuple[float | None, ...]:
    """``PLAIN_FIELDS`` of one offer, in that order."""
    return (o.num_gpus, o.gpu_ram, o.gpu_mem_bw, o.total_flops, o.dlperf, o.compute_cap,
            o.cpu_cores, o.cpu_cores_effective, o.cpu_ram, o.cpu_ghz, o.pcie_bw,
            o.gpu_lanes, o.pci_gen, o.disk_bw, o.inet_down, o.dph_total)


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


def residual_matrix(offers: Sequence[Offer], preds: Sequence[Prediction],
                    gpu_codes: dict[str, int]) -> Array:
    """The plain fields, the instance's share as the model reads it, and the structural
    prediction: its log point, log capacities and the binding resource (categorical)."""
    plain = plain_matrix(offers, gpu_codes)
    extra = np.full((len(offers), 10), np.nan)
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
    return _learner(len(PLAIN_FIELDS) + 1, [len(PLAIN_FIELDS)])


def _residual_learner() -> Any:
    return _learner(len(PLAIN_FIELDS) + 11, [len(PLAIN_FIELDS), len(PLAIN_FIELDS) + 1 + 5])


def mdape_log(log_pred: Array, log_true: Array) -> float:
    """Median absolute percentage error of exp(log_pred) against exp(log_true)."""
    return float(np.median(np.abs(np.exp(log_pred - log_true) - 1.0)))


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """One candidate's cross-validated error, and the blend's weight on it."""

    name: str
    cv_mdape: float
    weight: float


@dataclass(slots=True)
class ServedModel:
    """The structural model and the learners, the blend CV chose, and the intervals."""

    structural: RateModel
    residual: Any = None  # the residual learner (None: the structural model alone)
    plain: Any = None
    weights: tuple[float, float, float] = (1.0, 0.0, 0.0)
    scores: tuple[CandidateScore, ...] = ()
    served_cv_mdape: float | None = None
    # (10th, 90th percentile) of the blend's out-of-fold log residual, per binding
    # resource and for all ("all").
    conformal: dict[str, tuple[float, float]] = field(default_factory=dict)
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
        if self.residual is not None:
            x = residual_matrix(sub, sp, self.gpu_codes)  # type: ignore[arg-type]
            logs[ok, 1] = s + self.residual.predict(x)
        if self.plain is not None:
            logs[ok, 2] = self.plain.predict(plain_matrix(sub, self.gpu_codes))
        return logs

    def predict_offers(self, offers: Sequence[Offer], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        """Predictions for offers (``RateModel.predict_offers``'s contract): a new host's
        point is the blend, its interval conformal; a measured machine's is the
        structural model's, which reads its runs."""
        own = self.structural.predict_offers(offers, explain=explain)
        if self.residual is None and self.plain is None:
            return [self._label(p, None) for p in own]
        new = [i for i, p in enumerate(own) if isinstance(p, Prediction) and p.machine_runs == 0]
        if not new:
            return [self._label(p, None) for p in own]
        _, logs = self.candidate_points([offers[i] for i in new])
        out = [self._label(p, None) for p in own]
        w = np.asarray(self.weights)
        for row, i in enumerate(new):
            p = own[i]
            assert isinstance(p, Prediction)
            if not np.all(np.isfinite(logs[row])):
                continue
            point = float(logs[row] @ w)
            lo, hi = self.conformal.get(p.bottleneck, self.conformal["all"])
            mean = point + (lo + hi) / 2
            sd = max((hi - lo) / (2 * 1.2815515655446004), 1e-3)
            out[i] = self._label(dataclasses.replace(
                p, rate_per_hour=math.exp(point), rate_low=math.exp(point + lo),
                rate_high=math.exp(point + hi), log_rate_mean=mean, log_rate_sd=sd,
                modes=()), self.answered_by)
        return out

    def _label(self, p: Prediction | Unpredictable, by: str | None
               ) -> Prediction | Unpredictable:
        if isinstance(p, Unpredictable):
            return p
        if by is None:
            head = ("structural model (this machine's runs)" if p.machine_runs
                    else "structural model" + ("" if self.served_cv_mdape is None else
                                               f", CV error {self.served_cv_mdape:.1%}"))
            if self.residual is None and self.plain is None and not p.machine_runs:
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
            "served_by": self.answered_by if self.residual is not None else "structural",
            "served_cv_mdape": self.served_cv_mdape,
            "candidates": [dataclasses.asdict(s) for s in self.scores],
            "conformal_log_interval": {k: [round(v[0], 4), round(v[1], 4)]
                                       for k, v in self.conformal.items()},
            "measurements_used": self.measurements_used,
            "cv_seconds": round(self.cv_seconds, 3),
        }


def _as_new_host(offer: Offer) -> Offer:
    """The offer as an unmeasured machine's: the structural model then predicts from the
    hardware alone, as cross-validation and the learners need."""
    return msgspec.structs.replace(offer, machine_id=None)


def _blend_weights(step: float = BLEND_STEP) -> list[tuple[float, float, float]]:
    n = round(1 / step)
    return [(a / n, b / n, (n - a - b) / n) for a, b in product(range(n + 1), repeat=2)
            if a + b <= n]


def _conformal(resid: Array, groups: Sequence[str], noise_sd: float = 0.0
               ) -> dict[str, tuple[float, float]]:
    """Split-conformal 10th and 90th percentiles of the log residuals (finite-sample
    corrected), for all and per group with enough rows, narrowed for the benchmark's
    noise (``_without_noise``)."""

    def bounds(r: Array) -> tuple[float, float]:
        n = len(r)
        lo_q = max(0.0, math.floor(0.1 * (n + 1)) / n - 1e-9)
        hi_q = min(1.0, math.ceil(0.9 * (n + 1)) / n)
        return _without_noise(r, float(np.quantile(r, lo_q)), float(np.quantile(r, hi_q)),
                              noise_sd)

    out = {"all": bounds(resid)}
    g = np.asarray(groups)
    for name in BOTTLENECKS:
        sel = resid[g == name]
        if len(sel) >= MIN_GROUP_ROWS:
            out[name] = bounds(sel)
    return out


def _without_noise(resid: Array, lo: float, hi: float, noise_sd: float
                   ) -> tuple[float, float]:
    """The bounds narrowed about the residuals' median so that they bound the true rate,
    not one benchmark of it.

    A residual is log(measured) - point: the model's error on the host's true rate plus
    one benchmark's noise, independent of it. The interval is of the true rate
    (``Prediction``), so the noise's variance comes out of the spread: the bounds scale by
    sqrt(1 - noise variance / residual variance), the residual variance read robustly from
    the same 10th-90th percentile spread (a normal's is 2 x 1.2816 sd). The noise is the
    structural model's fitted one; the factor never goes below one half, so a noise
    estimate larger than the residuals cannot collapse the interval.
    """
    if noise_sd <= 0 or hi <= lo:
        return lo, hi
    var = ((hi - lo) / (2 * 1.2815515655446004)) ** 2
    factor = math.sqrt(max(0.25, 1.0 - noise_sd**2 / var))
    mid = float(np.median(resid))
    return mid + (lo - mid) * factor, mid + (hi - mid) * factor


def _no_empty_columns(x: Array) -> Array:
    """A field no training offer reports is a constant for the learner (it cannot bin a
    column of only missing values)."""
    x[:, np.all(np.isnan(x), axis=0)] = 0.0
    return x


def _fit_learners(offers: list[Offer], log_rate: Array,
                  structural: RateModel, gpu_codes: dict[str, int]
                  ) -> tuple[Any, Any, list[Prediction]]:
    preds = structural.predict_offers(offers, explain=False)
    sp = [p for p in preds if isinstance(p, Prediction)]
    assert len(sp) == len(offers)
    residual = _residual_learner().fit(
        _no_empty_columns(residual_matrix(offers, sp, gpu_codes)),
        log_rate - np.log([p.rate_per_hour for p in sp]))
    plain = _plain_learner().fit(_no_empty_columns(plain_matrix(offers, gpu_codes)), log_rate)
    return residual, plain, sp


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
    structural = fit_rate_model(measurements, now=now)
    usable = [m for m in measurements if _readable(m)]
    machines = len({m.machine_id for m in usable})
    served = ServedModel(structural, measurements_used=len(measurements),
                         readable_machines=machines)
    if machines < MIN_CV_MACHINES:
        served.fit_seconds = time.perf_counter() - started
        return served
    offers = [_as_new_host(m.offer) for m in usable]
    log_rate = np.log([m.rate_per_hour for m in usable])
    groups = [m.machine_id for m in usable]
    gpu_codes = {name: i for i, name in enumerate(sorted({str(o.gpu_name)
                                                          for o in offers}))}
    cv_started = time.perf_counter()
    oof = np.full((len(usable), len(CANDIDATES)), np.nan)
    binding: list[str] = ["all"] * len(usable)
    for train, test in GroupKFold(n_splits=min(FOLDS, machines)).split(offers, groups=groups):
        fold_model = fit_rate_model([usable[i] for i in train], now=now)
        tr_offers = [offers[i] for i in train]
        residual, plain, _ = _fit_learners(tr_offers, log_rate[train], fold_model, gpu_codes)
        te_offers = [offers[i] for i in test]
        te_preds = [p for p in fold_model.predict_offers(te_offers, explain=False)
                    if isinstance(p, Prediction)]
        s = np.log([p.rate_per_hour for p in te_preds])
        oof[test, 0] = s
        oof[test, 1] = s + residual.predict(residual_matrix(te_offers, te_preds, gpu_codes))
        oof[test, 2] = plain.predict(plain_matrix(te_offers, gpu_codes))
        for i, p in zip(test, te_preds, strict=True):
            binding[i] = p.bottleneck
    best_w, best_err = (1.0, 0.0, 0.0), math.inf
    for w in _blend_weights():
        err = mdape_log(oof @ np.asarray(w), log_rate)
        if err < best_err - 1e-12:
            best_w, best_err = w, err
    residual, plain, _ = _fit_learners(offers, log_rate, structural, gpu_codes)
    served.residual, served.plain = residual, plain
    served.gpu_codes = gpu_codes
    served.weights = best_w
    served.served_cv_mdape = best_err
    served.scores = tuple(CandidateScore(n, mdape_log(oof[:, j], log_rate), best_w[j])
                          for j, n in enumerate(CANDIDATES))
    served.conformal = _conformal(log_rate - oof @ np.asarray(best_w), binding,
                                   structural.sigma_noise)
    served.cv_seconds = time.perf_counter() - cv_started
    served.fit_seconds = time.perf_counter() - started
    return served


def _readable(m: Measurement) -> bool:
    try:
        offer_features(m.offer)
    except FeatureError:
        return False
    return True
