"""Offers ranked by predicted cost per proof, each with its 80% interval and the reason.

Pure: offers (``coordinator.offers.Offer``) and a fitted rate model (``coordinator.discovery``) in,
annotated copies out. The model predicts every offer from its hardware and what the
fleet has measured (a machine measured before is pinned to its own runs); each offer
gets the median, the 80% interval of its true rate and the main factors that moved it
(docs/discovery.md). Every offer also carries what its instance would get of the host
(``coordinator.decisions.share``): one whose share is below cuzk's minimum is flagged
``too_small`` with the reason, gets no prediction and is listed after those that can
run; offers on ``bad_hosts`` come last.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from vast_manager.coordinator.decisions import cost
from vast_manager.coordinator.decisions.share import instance_share, shortfall
from vast_manager.coordinator.discovery.structural_model import Prediction, Unpredictable
from vast_manager.coordinator.offers import Offer
from vast_manager.coordinator.settings import DEFAULTS


class Predictor(Protocol):
    """What ranking needs of a model (``discovery.RateModel`` is one)."""

    def predict_offers(
        self, offers: Sequence[Offer], *, explain: bool = True
    ) -> list[Prediction | Unpredictable]: ...


def prediction_fields(pred: Prediction | Unpredictable | None, dph: float | None,
                      problem: str | None = None) -> dict[str, Any]:
    """The prediction columns of one offer (the offers table's and the plan's)."""
    if not isinstance(pred, Prediction):
        basis = (f"not predicted: {problem}" if problem is not None
                 else f"not predicted: {pred.reason}" if pred is not None else "not predicted")
        return {"predicted_rate_per_hour": None, "predicted_rate_low": None,
                "predicted_rate_high": None, "predicted_usd_per_proof": None,
                "prediction_basis": basis, "prediction_bottleneck": None,
                "prediction_factors": []}
    return {
        "predicted_rate_per_hour": round(pred.rate_per_hour, 3),
        "predicted_rate_low": round(pred.rate_low, 3),
        "predicted_rate_high": round(pred.rate_high, 3),
        "predicted_usd_per_proof": round(dph / pred.rate_per_hour, 6) if dph is not None
        else None,
        "prediction_basis": pred.basis,
        "prediction_bottleneck": pred.bottleneck,
        # Each factor multiplies the reference host's rate (the basis names it): their
        # product is the prediction.
        "prediction_factors": [
            {"name": c.name, "detail": c.detail, "factor": round(c.factor, 4)}
            for c in pred.contributions
        ],
    }


def rank_offers(
    offers: Sequence[Offer],
    model: Predictor,
    bad_host_ids: Collection[str],
    known_machines: Collection[str],
    *,
    min_instance_ram_gb: float = 0.0,
    setup_download_gb: float = 0.0,
    kept_hours: float = DEFAULTS.plan_horizon_hours,
) -> list[dict[str, Any]]:
    """The offers' JSON (``Offer.raw``) with the instance's share, ``too_small``, ``bad_host``,
    ``known``, the prediction (``predicted_rate_per_hour``, ``predicted_rate_low`` and
    ``predicted_rate_high``: the 80% interval; ``predicted_usd_per_proof`` at the
    median; ``prediction_basis``, ``prediction_bottleneck``, ``prediction_factors``),
    best first.

    Share: ``instance_ram_gb``, ``instance_cpu_cores`` and ``instance_share`` (the
    formula). ``too_small``: the share is below ``min_instance_ram_gb`` or unknown
    (``too_small_reason`` says which; 0 turns the check off). ``bad_host``: the offer's
    machine is on ``bad_hosts``. ``known``: this machine has measurements of its own
    (``known_machines``). Machine ids compare as text. Order: predicted $/proof
    ascending; offers without a prediction after those with one (cheapest first);
    offers too small for cuzk, then bad hosts, last.

    Prices are the full figure (``cost.offer_figure``: rent, storage, and the
    ``setup_download_gb`` download at the offer's ``inet_down_cost`` spread over
    ``kept_hours``): ``usd_per_hour`` and, at the predicted rate, ``usd_per_proof``,
    each as its parts; ``full_dph`` is their total per hour.
    """
    bad = {str(b) for b in bad_host_ids}
    known = {str(k) for k in known_machines}
    problems: list[str | None] = []
    for offer in offers:
        problems.append(shortfall(instance_share(offer), min_instance_ram_gb))
    runnable = [o for o, p in zip(offers, problems, strict=True) if p is None]
    predicted = iter(model.predict_offers(runnable, explain=True))
    ranked: list[dict[str, Any]] = []
    for offer, problem in zip(offers, problems, strict=True):
        out: dict[str, Any] = dict(offer.raw)
        share = instance_share(offer)
        machine = offer.machine_id
        pred = next(predicted) if problem is None else None
        figure = cost.offer_figure(offer, setup_down_bytes=setup_download_gb * cost.BYTES_PER_GB,
                                   kept_hours=kept_hours)
        dph = figure.total if figure is not None else None
        out["full_dph"] = round(dph, 6) if dph is not None else None
        out["usd_per_hour"] = figure.as_dict() if figure is not None else None
        rate = pred.rate_per_hour if isinstance(pred, Prediction) else None
        proof = cost.per_proof(figure, rate) if figure is not None else None
        out["usd_per_proof"] = proof.as_dict(8) if proof is not None else None
        out["instance_ram_gb"] = share.ram_gb
        out["instance_cpu_cores"] = share.cpu_cores
        out["instance_share"] = share.formula
        out["too_small"] = problem is not None
        out["too_small_reason"] = problem
        out["bad_host"] = machine is not None and machine in bad
        out["known"] = machine is not None and machine in known
        out.update(prediction_fields(pred, dph, problem))
        ranked.append(out)

    def sort_key(o: dict[str, Any]) -> tuple[bool, bool, bool, float, float]:
        usd = o["predicted_usd_per_proof"]
        dph = o["full_dph"]
        return (
            bool(o["bad_host"]),
            bool(o["too_small"]),
            usd is None,
            usd if usd is not None else math.inf,
            dph if dph is not None and dph > 0 else math.inf,
        )

    ranked.sort(key=sort_key)
    return ranked
