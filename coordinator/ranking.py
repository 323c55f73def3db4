"""Offers ranked by predicted cost per proof, each with the reason for its prediction.

Pure: offers (vast.ai shape) and ``host_perf`` rows in, annotated copies out.
The predicted rate comes from, in order: this machine's own measurements
(median), the same GPU model and count on other machines (median of their
medians), the same GPU model's single-GPU rate x count x the fleet's scaling
efficiency, else nothing (``explore``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from coordinator.coerce import as_int, positive

#: Assumed multi-GPU scaling efficiency until the fleet has measured one. The
#: operator saw 4x RTX 5060 Ti make 38.8/h; scaling below 1 is the rule.
DEFAULT_SCALING_EFFICIENCY = 0.75


def _gpu_key(name: Any) -> str:
    return " ".join(str(name or "").split()).casefold()


def _fmt(x: float) -> str:
    return f"{x:.1f}"


class _Perf:
    """host_perf rows indexed for the three prediction bases."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        # (machine_id, gpu, n) -> (median rate, samples)
        self.by_machine: dict[tuple[int, str, int], tuple[float, int]] = {}
        # (gpu, n) -> [(machine_id, median rate)]: one offer's lookup reads its model's
        # machines only, not every host_perf row (5,000 offers x 9,000 rows took 1.4 s).
        self.by_model: dict[tuple[str, int], list[tuple[int, float]]] = {}
        self.machines: set[int] = set()
        for row in rows:
            machine = as_int(row.get("machine_id"))
            n = as_int(row.get("num_gpus"))
            rate = positive(row.get("median_rate_per_hour"))
            if machine is None or n is None or n < 1 or rate is None:
                continue
            samples = as_int(row.get("samples")) or 0
            self.machines.add(machine)
            self.by_machine[(machine, _gpu_key(row.get("gpu_name")), n)] = (rate, samples)
        for (machine, gpu, n), (rate, _) in self.by_machine.items():
            self.by_model.setdefault((gpu, n), []).append((machine, rate))

    def elsewhere(self, gpu: str, n: int, exclude_machine: int | None) -> list[float]:
        return [
            rate for machine, rate in self.by_model.get((gpu, n), ())
            if machine != exclude_machine
        ]


def predict(
    offer: Mapping[str, Any], perf: _Perf, scaling_efficiency: float | None
) -> tuple[float | None, str]:
    """The predicted proofs/hour of one offer and a short human basis for it."""
    machine = as_int(offer.get("machine_id"))
    gpu_name = str(offer.get("gpu_name") or "?")
    gpu = _gpu_key(gpu_name)
    n = as_int(offer.get("num_gpus")) or 1

    own = perf.by_machine.get((machine, gpu, n)) if machine is not None else None
    if own is not None:
        rate, samples = own
        runs = "run" if samples == 1 else "runs"
        return rate, f"machine {machine}: median {_fmt(rate)}/h over {samples} {runs}"

    others = perf.elsewhere(gpu, n, machine)
    if others:
        rate = float(median(others))
        where = "machine" if len(others) == 1 else "machines"
        return rate, (f"{n}x {gpu_name} on {len(others)} other {where}: median {_fmt(rate)}/h")

    if n > 1:
        # Prefer this machine's own single-GPU figure, else the model's elsewhere.
        single_own = perf.by_machine.get((machine, gpu, 1)) if machine is not None else None
        singles = [single_own[0]] if single_own else perf.elsewhere(gpu, 1, None)
        if singles:
            one = float(median(singles))
            if scaling_efficiency is not None and scaling_efficiency > 0:
                eff, eff_note = scaling_efficiency, "fleet measured"
            else:
                eff, eff_note = DEFAULT_SCALING_EFFICIENCY, "default, none measured yet"
            rate = one * n * eff
            src = (
                f"this machine's 1x {_fmt(one)}/h"
                if single_own
                else f"1x {gpu_name} median {_fmt(one)}/h on {len(singles)} "
                f"{'machine' if len(singles) == 1 else 'machines'}"
            )
            return rate, (f"{src} x {n} GPUs x efficiency {eff:.2f} ({eff_note}) = {_fmt(rate)}/h")

    return None, f"explore: no measurements of {n}x {gpu_name} yet"


def rank_offers(
    offers: list[dict[str, Any]],
    host_perf: list[dict[str, Any]],
    bad_host_ids: set[int] | set[str],
    scaling_efficiency: float | None,
) -> list[dict[str, Any]]:
    """Copies of ``offers`` with ``bad_host``, ``known``, ``predicted_rate_per_hour``,
    ``predicted_usd_per_proof`` and ``prediction_basis`` added, best first.

    ``bad_host``: the offer's machine is on ``bad_hosts``. ``known``: this
    machine has measurements of its own. Order: predicted $/proof ascending;
    offers without a prediction after those with one (cheapest first); bad
    hosts last.
    """
    perf = _Perf(host_perf)
    # The store keys machines as text (a bring-your-own agent's is its label);
    # compare as text so int and str ids both work.
    bad = {str(b) for b in bad_host_ids}
    ranked: list[dict[str, Any]] = []
    for offer in offers:
        out = dict(offer)
        machine = as_int(offer.get("machine_id"))
        rate, basis = predict(offer, perf, scaling_efficiency)
        dph = positive(offer.get("dph_total"))
        out["bad_host"] = machine is not None and str(machine) in bad
        out["known"] = machine is not None and machine in perf.machines
        out["predicted_rate_per_hour"] = round(rate, 3) if rate is not None else None
        out["predicted_usd_per_proof"] = (
            round(dph / rate, 6) if rate is not None and dph is not None else None
        )
        out["prediction_basis"] = basis
        ranked.append(out)

    def sort_key(o: dict[str, Any]) -> tuple[bool, bool, float, float]:
        usd = o["predicted_usd_per_proof"]
        dph = positive(o.get("dph_total"))
        return (
            bool(o["bad_host"]),
            usd is None,
            usd if usd is not None else math.inf,
            dph if dph is not None else math.inf,
        )

    ranked.sort(key=sort_key)
    return ranked
