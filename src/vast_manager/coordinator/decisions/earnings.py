"""What a proof earns, and what an instance earns against its full bill.

Pure. With a proof price set (``VM_PROOF_PRICE_USD``, or ``VM_PROOF_PRICE_FIL`` at
``VM_FIL_USD``) every view shows revenue, cost and profit per hour, and the minimum rate is
the break-even rate of the full hourly bill: ``full figure / price``, the rate at which the
instance earns what it costs (docs/operations.md, "Earnings"). Without one, nothing changes:
the minimum is ``full figure / VM_MAX_USD_PER_PROOF`` as before, and no revenue is shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.settings import Settings


def proof_price_usd(settings: Settings) -> float | None:
    """Dollars one delivered proof earns, or None when no price is set."""
    if settings.proof_price_usd is not None:
        return float(settings.proof_price_usd)
    if settings.proof_price_fil is not None and settings.fil_usd is not None:
        return float(settings.proof_price_fil) * float(settings.fil_usd)
    return None


def break_even_usd_per_proof(settings: Settings) -> float:
    """The $/proof the minimum rate divides the full hourly figure by: what a proof earns
    when a price is set (the break-even rate), else ``max_usd_per_proof``."""
    price = proof_price_usd(settings)
    return price if price is not None else settings.max_usd_per_proof


@dataclass(frozen=True, slots=True)
class Earnings:
    """One instance's (or the fleet's) money per hour; ``basis`` names the rate earned at."""

    revenue_per_hour: float | None
    cost_per_hour: float | None
    profit_per_hour: float | None
    basis: str | None  # "delivered", "completed" or "benchmark": which rate earned

    def view(self) -> dict[str, Any]:
        return {"revenue_per_hour": _round(self.revenue_per_hour),
                "cost_per_hour": _round(self.cost_per_hour),
                "profit_per_hour": _round(self.profit_per_hour),
                "revenue_basis": self.basis}


#: What every instance shows without a price: nothing is claimed.
NO_EARNINGS = Earnings(None, None, None, None)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def earned_rate(delivered: float | None, completed: float | None,
                benchmark: float | None) -> tuple[float | None, str | None]:
    """The rate an instance earns at: the cluster's delivered rate when there is one, else
    cuzk's completed rate, else the benchmark's (the basis is shown beside the figures)."""
    for rate, basis in ((delivered, "delivered"), (completed, "completed"),
                        (benchmark, "benchmark")):
        if rate is not None and math.isfinite(rate) and rate >= 0:
            return rate, basis
    return None, None


def earnings(price_usd: float | None, rate_per_hour: float | None, basis: str | None,
             cost_per_hour: float | None) -> Earnings:
    """Revenue (rate x price), the full hourly cost, and their difference; an instance that
    proves nothing yet earns 0 while it bills."""
    if price_usd is None:
        return NO_EARNINGS
    revenue = (rate_per_hour or 0.0) * price_usd
    profit = None if cost_per_hour is None else revenue - cost_per_hour
    return Earnings(revenue, cost_per_hour, profit, basis or "none")


def fleet_earnings(price_usd: float | None, parts: list[Earnings]) -> Earnings:
    """The fleet's: the instances' revenue and full cost summed."""
    if price_usd is None:
        return NO_EARNINGS
    revenue = sum(e.revenue_per_hour or 0.0 for e in parts)
    cost = sum(e.cost_per_hour or 0.0 for e in parts)
    return Earnings(revenue, cost, revenue - cost, "instances")
