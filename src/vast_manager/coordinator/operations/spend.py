"""What the fleet has spent so far, by part (rent, storage, bandwidth), over the windows an
operator asks about: today (since midnight UTC), the last seven days, and all time
(docs/operations.md, "Spend"). The same bills as the autopilot's ledger and
``vm_spend_dollars`` (``autopilot_rules.ledger_of`` over ``Reads.spend_rows``)."""

from __future__ import annotations

from typing import Any

from vast_manager.coordinator.discovery.autopilot_rules import ledger_of, rental_of
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.store.reads import Reads

DAY_S = 86400.0
WEEK_S = 7 * DAY_S


def windows(now: float) -> dict[str, float]:
    """Each window's start: ``today`` from midnight UTC, ``week`` the last seven days,
    ``all_time`` from the first deploy."""
    return {"today": now - now % DAY_S, "week": now - WEEK_S, "all_time": 0.0}


def spend_view(reads: Reads, now: float) -> dict[str, dict[str, float]]:
    """Spent per window, by part and in total, in dollars (one read of the spend rows)."""
    rentals = [rental_of(instance_row(r)) for r in reads.spend_rows(0.0)]
    out: dict[str, dict[str, float]] = {}
    for name, since in windows(now).items():
        ledger = ledger_of(rentals, now=now, since=since, last_exploration_at=None)
        out[name] = {"rent": round(ledger.rent_usd, 4), "storage": round(ledger.storage_usd, 4),
                     "bandwidth": round(ledger.bandwidth_usd, 4),
                     "total": round(ledger.total_usd, 4)}
    return out


def spend_line(spend: dict[str, Any]) -> str:
    """One line for ``status``: the totals of each window."""
    parts = [f"{label} ${float((spend.get(key) or {}).get('total') or 0.0):.2f}"
             for key, label in (("today", "today"), ("week", "this week"),
                                ("all_time", "all time"))]
    return "Spent: " + ", ".join(parts) + " (vast-manager cost-report: by part and instance)"
