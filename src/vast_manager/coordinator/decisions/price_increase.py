"""A host's price increase on a running contract, judged: accept, reject, or wait.

vast.ai lists pending increases with the old and new ``gpu_costpersec`` (rent, $/s),
``disk_ram_costpersec`` (storage, $/s), ``bwu_cost`` and ``bwd_cost`` (bandwidth) and
``platform_fee`` (vast-cli ``vastai/api/price_increase.py``, docs/vast.md "Price
increases"). An instance is still worth its new price when its whole bill at the new
prices (rent, storage and its own bandwidth), divided by what it proves an hour (its
measured rate, else the rate it delivered), stays within ``VM_MAX_USD_PER_PROOF``: the
same break-even every keep decision uses (``decisions.cost``). The operator's other caps
hold too: the new price must not exceed ``VM_MAX_DEPLOY_DPH_TOTAL`` (what a deploy may
rent), nor take the fleet past ``VM_AUTOPILOT_MAX_DPH_TOTAL``. An instance with no rate
yet (a trial) waits a round. Pure: numbers in, a verdict with its numbers out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from vast_manager.coordinator.decisions.cost import HOURS_PER_MONTH, Cost, Prices

Verdict = Literal["accept", "reject", "wait"]


@dataclass(frozen=True, slots=True)
class Increase:
    """One pending row, read (``None`` where vast.ai sent no number)."""

    pending_id: int
    contract_id: int
    new_rent_per_hour: float | None
    new_storage_per_hour: float | None
    new_down_per_gb: float | None
    new_up_per_gb: float | None
    old_rent_per_hour: float | None
    contract_end_date: float | None

    @classmethod
    def of(cls, row: dict[str, Any]) -> Increase | None:
        """The row read, or None when it names no pending id or contract."""
        pid, contract = row.get("pending_price_increase_id"), row.get("contract_id")
        if not isinstance(pid, int) or not isinstance(contract, int) or \
                isinstance(pid, bool) or isinstance(contract, bool):
            return None
        return cls(
            pending_id=pid, contract_id=contract,
            new_rent_per_hour=_per_hour(row.get("new_gpu_costpersec")),
            new_storage_per_hour=_per_hour(row.get("new_disk_ram_costpersec")),
            new_down_per_gb=_number(row.get("new_bwd_cost")),
            new_up_per_gb=_number(row.get("new_bwu_cost")),
            old_rent_per_hour=_per_hour(row.get("old_gpu_costpersec")),
            contract_end_date=_number(row.get("contract_end_date")),
        )


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    reason: str
    new_hourly: Cost
    rate_per_hour: float | None
    usd_per_proof: float | None
    break_even_rate_per_hour: float | None

    def data(self) -> dict[str, Any]:
        """The numbers, for the event's data."""
        return {"verdict": self.verdict, "new_usd_per_hour": self.new_hourly.as_dict(4),
                "rate_per_hour": self.rate_per_hour,
                "usd_per_proof": None if self.usd_per_proof is None
                else round(self.usd_per_proof, 5),
                "break_even_rate_per_hour": None if self.break_even_rate_per_hour is None
                else round(self.break_even_rate_per_hour, 2)}


def new_prices(old: Prices, inc: Increase) -> Prices:
    """The instance's prices once the increase takes effect (what it does not name stays)."""
    storage = inc.new_storage_per_hour
    per_gb_month = old.storage_per_gb_month
    if storage is not None and old.disk_gb > 0:
        per_gb_month = storage * HOURS_PER_MONTH / old.disk_gb  # back to $/GB/month of its disk
    return Prices(
        rent_per_hour=old.rent_per_hour if inc.new_rent_per_hour is None
        else inc.new_rent_per_hour,
        storage_per_gb_month=per_gb_month, disk_gb=old.disk_gb,
        inet_down_per_gb=old.inet_down_per_gb if inc.new_down_per_gb is None
        else inc.new_down_per_gb,
        inet_up_per_gb=old.inet_up_per_gb if inc.new_up_per_gb is None else inc.new_up_per_gb,
    )


def judge(inc: Increase, old: Prices, *, rate_per_hour: float | None, basis: str,
          max_usd_per_proof: float, down_bytes_per_hour: float = 0.0,
          up_bytes_per_hour: float = 0.0, max_deploy_dph_total: float | None = None,
          fleet_dph_total: float | None = None,
          max_fleet_dph_total: float | None = None) -> Judgement:
    """Accept when the whole bill at the new prices stays within the break-even at the
    instance's rate and every cap holds; reject otherwise; wait without a rate."""
    prices = new_prices(old, inc)
    hourly = prices.per_hour(down_bytes_per_hour, up_bytes_per_hour)
    total = hourly.total
    said = (f"rent ${old.rent_per_hour:.4f} -> ${prices.rent_per_hour:.4f}/h; whole bill "
            f"${total:.4f}/h (storage ${hourly.storage:.4f}, bandwidth ${hourly.bandwidth:.4f})")
    if rate_per_hour is None or not math.isfinite(rate_per_hour) or rate_per_hour <= 0:
        return Judgement("wait", f"{said}; no rate measured yet: judged once it has one",
                         hourly, None, None, None)
    per_proof = total / rate_per_hour
    break_even = total / max_usd_per_proof if max_usd_per_proof > 0 else math.inf
    said += (f"; at its {basis} {rate_per_hour:.1f} proofs/h that is ${per_proof:.5f}/proof, "
             f"break-even {break_even:.1f}/h under VM_MAX_USD_PER_PROOF "
             f"${max_usd_per_proof:g}")
    why_not = None
    if per_proof > max_usd_per_proof:
        why_not = "above the break-even: no longer worth its price"
    elif max_deploy_dph_total is not None and prices.hourly_total > max_deploy_dph_total:
        why_not = (f"${prices.hourly_total:.4f}/h is above VM_MAX_DEPLOY_DPH_TOTAL "
                   f"${max_deploy_dph_total:g}")
    elif (max_fleet_dph_total is not None and fleet_dph_total is not None
          and fleet_dph_total - old.hourly_total + prices.hourly_total > max_fleet_dph_total):
        fleet_after = fleet_dph_total - old.hourly_total + prices.hourly_total
        why_not = (f"the fleet would bill ${fleet_after:.4f}/h, above "
                   f"VM_AUTOPILOT_MAX_DPH_TOTAL ${max_fleet_dph_total:g}")
    if why_not is not None:
        return Judgement("reject", f"{said}: {why_not}", hourly, rate_per_hour, per_proof,
                         break_even)
    return Judgement("accept", f"{said}: still worth it", hourly, rate_per_hour, per_proof,
                     break_even)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) and out >= 0 else None


def _per_hour(per_second: Any) -> float | None:
    value = _number(per_second)
    return None if value is None else value * 3600.0

