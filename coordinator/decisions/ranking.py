"""Offers ranked by predicted cost per proof, each with the reason for its prediction.

Pure: offers (vast.ai shape) and ``host_perf`` rows in, annotated copies out.
Every offer carries what its instance would get of the host (``coordinator.decisions.share``);
one whose share is below cuzk's minimum is flagged ``too_small`` with the reason,
gets no prediction and is listed after those that can run. The predicted rate
comes from, in order: this machine's own measurements (median), the same GPU
model and count on other machines whose instances had RAM of the same class
(median of their medians), the same GPU model's single-GPU rate (same class) x
count x the fleet's scaling efficiency, else nothing (``explore``). RAM decides
much of cuzk's speed (128 GiB about 152 s a proof, 256 GiB about 53 s), so a
rate measured with another class of RAM is no prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from vast_manager.coordinator.decisions.share import (
    RAM_CLASS_EDGES_GB,
    instance_share,
    ram_class,
    shortfall,
)
from vast_manager.coordinator.providers.coerce import as_int, positive

#: Assumed multi-GPU scaling efficiency until the fleet has measured one. The
#: operator saw 4x RTX 5060 Ti make 38.8/h; scaling below 1 is the rule.
DEFAULT_SCALING_EFFICIENCY = 0.75


def _gpu_key(name: Any) -> str:
    return " ".join(str(name or "").split()).casefold()


def _fmt(x: float) -> str:
    return f"{x:.1f}"


def _class_text(klass: int) -> str:
    low, high = RAM_CLASS_EDGES_GB
    return (f"under {low:.0f} GB", f"{low:.0f}-{high:.0f} GB", f"{high:.0f} GB or more")[klass]


class _Perf:
    """host_perf rows indexed for the three prediction bases."""

    def __init__(
        self,
        rows: Iterable[Mapping[str, Any]],
        machine_ram_gb: Mapping[tuple[int, int], float] | None = None,
    ) -> None:
        # (machine_id, gpu, n) -> (median rate, samples)
        self.by_machine: dict[tuple[int, str, int], tuple[float, int]] = {}
        # (gpu, n) -> [(machine_id, median rate, RAM class or None)]: one offer's lookup
        # reads its model's machines only, not every host_perf row (5,000 offers x
        # 9,000 rows took 1.4 s).
        self.by_model: dict[tuple[str, int], list[tuple[int, float, int | None]]] = {}
        self.machines: set[int] = set()
        ram = machine_ram_gb or {}
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
            klass = ram_class(ram.get((machine, n)))
            self.by_model.setdefault((gpu, n), []).append((machine, rate, klass))

    def elsewhere(
        self, gpu: str, n: int, exclude_machine: int | None, klass: int | None
    ) -> list[float]:
        """Median rates of other machines; with ``klass``, only those whose instances had
        RAM of that class (a machine whose RAM we never recorded is not excluded)."""
        return [
            rate for machine, rate, their in self.by_model.get((gpu, n), ())
            if machine != exclude_machine and (klass is None or their in (None, klass))
        ]


def predict(
    offer: Mapping[str, Any],
    perf: _Perf,
    scaling_efficiency: float | None,
    ram_gb: float | None = None,
) -> tuple[float | None, str]:
    """The predicted proofs/hour of one offer and a short human basis for it.

    ``ram_gb``: the RAM the offer's instance would get (``coordinator.decisions.share``); rates
    from other machines count only when their instances had RAM of the same class.
    """
    machine = as_int(offer.get("machine_id"))
    gpu_name = str(offer.get("gpu_name") or "?")
    gpu = _gpu_key(gpu_name)
    n = as_int(offer.get("num_gpus")) or 1
    klass = ram_class(ram_gb)
    like = "" if klass is None else f" with {_class_text(klass)} of RAM"

    own = perf.by_machine.get((machine, gpu, n)) if machine is not None else None
    if own is not None:
        rate, samples = own
        runs = "run" if samples == 1 else "runs"
        return rate, f"machine {machine}: median {_fmt(rate)}/h over {samples} {runs}"

    others = perf.elsewhere(gpu, n, machine, klass)
    if others:
        rate = float(median(others))
        where = "machine" if len(others) == 1 else "machines"
        return rate, (
            f"{n}x {gpu_name} on {len(others)} other {where}{like}: median {_fmt(rate)}/h"
        )

    if n > 1:
        # Prefer this machine's own single-GPU figure, else the model's elsewhere.
        single_own = perf.by_machine.get((machine, gpu, 1)) if machine is not None else None
        singles = [single_own[0]] if single_own else perf.elsewhere(gpu, 1, None, klass)
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
                f"{'machine' if len(singles) == 1 else 'machines'}{like}"
            )
            return rate, (f"{src} x {n} GPUs x efficiency {eff:.2f} ({eff_note}) = {_fmt(rate)}/h")

    return None, f"explore: no measurements of {n}x {gpu_name}{like} yet"


def rank_offers(
    offers: list[dict[str, Any]],
    host_perf: list[dict[str, Any]],
    bad_host_ids: set[int] | set[str],
    scaling_efficiency: float | None,
    *,
    min_instance_ram_gb: float = 0.0,
    machine_ram_gb: Mapping[tuple[int, int], float] | None = None,
) -> list[dict[str, Any]]:
    """Copies of ``offers`` with the instance's share, ``too_small``, ``bad_host``,
    ``known``, ``predicted_rate_per_hour``, ``predicted_usd_per_proof`` and
    ``prediction_basis`` added, best first.

    Share: ``instance_ram_gb``, ``instance_cpu_cores`` and ``instance_share`` (the
    formula). ``too_small``: the share is below ``min_instance_ram_gb`` or unknown
    (``too_small_reason`` says which; 0 turns the check off). ``bad_host``: the
    offer's machine is on ``bad_hosts``. ``known``: this machine has measurements
    of its own. ``machine_ram_gb``: (machine_id, num_gpus) -> the RAM our instances
    got there, to keep predictions within a RAM class. Order: predicted $/proof
    ascending; offers without a prediction after those with one (cheapest first);
    offers too small for cuzk, then bad hosts, last.
    """
    perf = _Perf(host_perf, machine_ram_gb)
    # The store keys machines as text (a bring-your-own agent's is its label);
    # compare as text so int and str ids both work.
    bad = {str(b) for b in bad_host_ids}
    ranked: list[dict[str, Any]] = []
    for offer in offers:
        out = dict(offer)
        machine = as_int(offer.get("machine_id"))
        share = instance_share(offer)
        problem = shortfall(share, min_instance_ram_gb)
        if problem is None:
            rate, basis = predict(offer, perf, scaling_efficiency, share.ram_gb)
        else:
            rate, basis = None, f"not predicted: {problem}"
        dph = positive(offer.get("dph_total"))
        out["instance_ram_gb"] = share.ram_gb
        out["instance_cpu_cores"] = share.cpu_cores
        out["instance_share"] = share.formula
        out["too_small"] = problem is not None
        out["too_small_reason"] = problem
        out["bad_host"] = machine is not None and str(machine) in bad
        out["known"] = machine is not None and machine in perf.machines
        out["predicted_rate_per_hour"] = round(rate, 3) if rate is not None else None
        out["predicted_usd_per_proof"] = (
            round(dph / rate, 6) if rate is not None and dph is not None else None
        )
        out["prediction_basis"] = basis
        ranked.append(out)

    def sort_key(o: dict[str, Any]) -> tuple[bool, bool, bool, float, float]:
        usd = o["predicted_usd_per_proof"]
        dph = positive(o.get("dph_total"))
        return (
            bool(o["bad_host"]),
            bool(o["too_small"]),
            usd is None,
            usd if usd is not None else math.inf,
            dph if dph is not None else math.inf,
        )

    ranked.sort(key=sort_key)
    return ranked
