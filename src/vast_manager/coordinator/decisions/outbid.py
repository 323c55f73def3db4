"""An outbid interruptible instance: raise its bid, wait for its host, or let it go.

vast.ai stops an outbid instance (its disk kept and billed) and runs it again when its bid
has priority again; ``PUT /api/v0/instances/bid_price/{id}/`` changes the bid (docs/vast.md,
"Interruptible"). Nobody publishes the winning bid, so a raise is a step (``RAISE_STEP``)
up to a cap the numbers set: the rent at which the instance, at its measured rate, still
proves within ``VM_MAX_USD_PER_PROOF`` (its whole bill's break-even), lowered by
``VM_MAX_BID_PER_HOUR`` and ``VM_MAX_DEPLOY_DPH_TOTAL`` when set. A trial (no rate yet) is
never raised: it waits while waiting costs less than a fresh trial's setup
(``cost.resume_budget_s``), as a kept instance does once its cap is reached; past that it
is destroyed (no strike: being outbid is not its machine's fault). Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from vast_manager.coordinator.decisions.cost import Prices

#: Each raise multiplies the bid by this (a quarter more), capped.
RAISE_STEP = 1.25

Action = Literal["raise", "wait", "destroy"]


@dataclass(frozen=True, slots=True)
class OutbidChoice:
    action: Action
    reason: str
    bid_per_hour: float | None = None  # the new bid of a raise


def bid_cap(prices: Prices, *, rate_per_hour: float, max_usd_per_proof: float,
            max_bid_per_hour: float | None, max_deploy_dph_total: float | None) -> float:
    """The highest rent worth bidding: the break-even rent at ``rate_per_hour`` less the
    storage, within the operator's caps."""
    cap = rate_per_hour * max_usd_per_proof - prices.storage_per_hour
    if max_bid_per_hour is not None:
        cap = min(cap, max_bid_per_hour)
    if max_deploy_dph_total is not None:
        cap = min(cap, max_deploy_dph_total - prices.storage_per_hour)
    return cap


def choose(prices: Prices, *, bid_per_hour: float, rate_per_hour: float | None,
           max_usd_per_proof: float, max_bid_per_hour: float | None,
           max_deploy_dph_total: float | None, waited_s: float,
           wait_budget_s: float) -> OutbidChoice:
    """Raise while a higher bid is still worth it; else wait within the budget; else go."""
    waiting = (f"kept up to {wait_budget_s / 3600:.1f} h, while waiting "
               f"(${prices.storage_per_hour:.4f}/h of storage) costs less than a fresh "
               "trial's setup")
    capped = ""
    if rate_per_hour is not None and math.isfinite(rate_per_hour) and rate_per_hour > 0:
        cap = bid_cap(prices, rate_per_hour=rate_per_hour, max_usd_per_proof=max_usd_per_proof,
                      max_bid_per_hour=max_bid_per_hour,
                      max_deploy_dph_total=max_deploy_dph_total)
        new = min(cap, bid_per_hour * RAISE_STEP)
        if new > bid_per_hour * 1.001:
            per_proof = (new + prices.storage_per_hour) / rate_per_hour
            return OutbidChoice(
                "raise", f"outbid: bid raised ${bid_per_hour:.4f} -> ${new:.4f}/h (cap "
                f"${cap:.4f}/h: at its measured {rate_per_hour:.1f} proofs/h that is "
                f"${per_proof:.5f}/proof within ${max_usd_per_proof:g})", new)
        capped = f"its bid ${bid_per_hour:.4f}/h is at its cap ${cap:.4f}/h; "
    if waited_s < wait_budget_s:
        return OutbidChoice("wait", f"outbid (interruptible, stopped, storage billed): "
                            f"{capped}{waiting}")
    return OutbidChoice("destroy", f"outbid: {capped}waited {waited_s / 3600:.1f} h, as "
                        "long as a fresh trial's setup costs: destroyed")
