"""JSON views of the store's rows for the operator API (the text views are the CLI's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.decisions import cost, policy, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.offers import parse_offer, stored_offer
from vast_manager.coordinator.operations.production import NOT_PROVING
from vast_manager.coordinator.settings import DEFAULTS
from vast_manager.coordinator.store.migrations import Row, loads

INSTANCE_FIELDS = (
    "id", "agent_id", "label", "kind", "state", "phase", "machine_id", "gpu_name", "num_gpus",
    "dph_total", "rate_per_hour", "min_rate_per_hour", "last_seen", "provider",
    "provider_instance_id", "offer_id", "geolocation", "cpu_name", "cpu_cores", "cpu_ram",
    "pcie_bw", "disk_gb", "proofs_completed_total", "terminate_reason", "created_at",
    "state_since", "destroyed_at", "agent_version", "rebenchmark_pending",
    "provider_status", "provider_status_msg", "billing_per_hour",
)


# What an instance's view is made from (the wide host_json is left out).
_COST_COLUMNS = ("offer_json", "hello_at", "net_rx_bytes", "net_tx_bytes", "rent_paused_s",
                 "storage_paused_s", "bid_per_hour")
VIEW_COLUMNS = (*INSTANCE_FIELDS, "progress_json", *_COST_COLUMNS)


@dataclass(frozen=True, slots=True)
class CostBasis:
    """What the cost figures of a view need beside the row (settings, the clock)."""

    now: float | None = None
    setup_download_gb: float = DEFAULTS.setup_download_gb
    kept_hours: float = DEFAULTS.plan_horizon_hours


def _parts(rent: float, storage: float, bandwidth: float) -> dict[str, float]:
    return {"rent": round(rent, 8), "storage": round(storage, 8),
            "bandwidth": round(bandwidth, 8), "total": round(rent + storage + bandwidth, 8)}


def cost_view(row: Row, basis: CostBasis) -> dict[str, Any] | None:
    """An instance's bill (``cost``, docs/operations.md "What an instance costs"): per hour
    and per proof by part (rent, storage, bandwidth: the setup download, as its agent
    reported it or else the setting, spread over a kept life), and ``billed`` so far.

    The arithmetic of ``cost.kept_per_hour``, ``cost.per_proof`` and ``cost.accrued``
    written out once: a fleet-sized list computes it for every row."""
    offer = stored_offer(row.get("offer_json")) or parse_offer(
        {"dph_total": row.get("dph_total")})
    prices = cost.prices_of(offer, row.get("disk_gb"), row.get("bid_per_hour"))
    if prices is None:
        return None
    rx = float(row.get("net_rx_bytes") or 0)
    tx = float(row.get("net_tx_bytes") or 0)
    setup = cost.setup_download_bytes(rx, basis.setup_download_gb)
    rent_h, storage_h = prices.rent_per_hour, prices.storage_per_hour
    band_h = prices.bandwidth_usd(setup, 0.0) / max(basis.kept_hours, 1.0)
    rate = row.get("rate_per_hour")
    per_proof = (_parts(rent_h / rate, storage_h / rate, band_h / rate)
                 if isinstance(rate, int | float) and rate > 0 else None)
    billed = None
    created = row.get("created_at")
    end = row.get("destroyed_at") or basis.now
    if created is not None and end is not None:
        hello = row.get("hello_at")
        running_s = max(0.0, float(end) - float(hello)) if hello is not None else 0.0
        running_s = max(0.0, running_s - float(row.get("rent_paused_s") or 0))
        storage_s = max(0.0, float(end) - float(created)
                        - float(row.get("storage_paused_s") or 0))
        billed = _parts(rent_h * running_s / 3600.0, storage_h * storage_s / 3600.0,
                        prices.bandwidth_usd(rx, tx))
    return {
        "per_hour": _parts(rent_h, storage_h, band_h),
        "per_proof": per_proof,
        "billed": billed,
        "disk_gb": prices.disk_gb,
        "bid_per_hour": row.get("bid_per_hour"),
        "net_rx_bytes": row.get("net_rx_bytes"),
        "net_tx_bytes": row.get("net_tx_bytes"),
    }


def finish_view(out: dict[str, Any], basis: CostBasis | None = None) -> dict[str, Any]:
    """``out`` holds ``VIEW_COLUMNS``; turn it into the view in place."""
    out["progress"] = loads(out.pop("progress_json"))
    bill = cost_view(out, basis or CostBasis())
    for col in _COST_COLUMNS:
        out.pop(col, None)
    out["cost"] = bill
    # The full figure's $/proof (rent, storage and bandwidth), not dph_total's alone.
    out["usd_per_proof"] = (bill["per_proof"]["total"] if bill and bill["per_proof"]
                            else policy.usd_per_proof(out["dph_total"], out["rate_per_hour"]))
    out["rebenchmark_pending"] = bool(out["rebenchmark_pending"])
    # What the provider bills for it now: by vast.ai's last listed status (nothing once
    # gone; the price until first listed).
    out["billing_now_per_hour"] = (
        0.0 if out["state"] in states.GONE
        else out["billing_per_hour"] if out["billing_per_hour"] is not None
        else out["dph_total"])
    return out


def instance_view(row: Row, basis: CostBasis | None = None) -> dict[str, Any]:
    return finish_view({name: row.get(name) for name in VIEW_COLUMNS}, basis)


def production_view(out: dict[str, Any], produced: Mapping[str, Any] | None = None,
                    started_at: float | None = None) -> dict[str, Any]:
    """Add to an instance's view, in place, what it completed (``ProductionTracker.view``):
    ``completed_rate_per_hour`` beside the benchmark's ``rate_per_hour``, and ``idle``
    with its reason (an idle instance has no cost per proof: it bills and proves
    nothing); and ``heard_since_start``, false while its agent has not spoken since this
    coordinator started (its state is what it said before; docs/operations.md)."""
    out.update(produced if produced is not None else NOT_PROVING)
    if out["idle"]:
        out["usd_per_proof"] = None
    seen = out.get("last_seen")
    out["heard_since_start"] = (None if started_at is None or out["state"] in states.GONE
                                else seen is not None and float(seen) >= started_at)
    return out


def result_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    for col in ("gpus_used", "proof_seconds", "telemetry", "runs", "evidence", "flag_reasons",
                "directive"):
        out[col] = loads(out.pop(f"{col}_json", None))
    out["flags"] = [f for f in (row.get("flags") or "").split(",") if f]
    out["counts_for_host_perf"] = bool(row.get("counts_for_host_perf"))
    return out


def event_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["data"] = loads(out.pop("data_json", None))
    return out


def fault_view(row: Row) -> dict[str, Any]:
    """A fleet fault (``decisions.blame``): open while ``cleared_at`` is null."""
    out = dict(row)
    out["machines"] = loads(out.pop("machines_json", None)) or []
    out["open"] = out.get("cleared_at") is None
    return out


def scaling_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["agent_evidence"] = loads(out.pop("agent_evidence_json", None))
    out["evidence"] = loads(out.pop("evidence_json", None))
    return out


def host_perf_view(row: Row) -> dict[str, Any]:
    out = dict(row)
    out["usd_per_proof"] = policy.usd_per_proof(row.get("dph_total"),
                                                row.get("median_rate_per_hour"))
    return out


def fleet_view(
    by_state: dict[str, tuple[int, float, float]],
    idle: tuple[int, float, float] = (0, 0.0, 0.0),
    completed_per_hour: float | None = None,
) -> dict[str, Any]:
    """The fleet at a glance, from ``Reads.instances_by_state`` (``GET /api/fleet``, the
    dashboard's tiles and the fleet gauges of ``/metrics``): instances per state present,
    how many bill (every state but the gone ones) and prove, the fleet's price per hour
    (of those that bill), its proofs per hour (the proving instances' measured rates,
    idle ones left out: ``idle`` is ``ProductionTracker.idle_totals``), what cuzk
    completed fleet-wide (``completed_proofs_per_hour``, None until measured) and the
    ratio of price to output (None while nothing proves)."""
    billing = [v for state, v in by_state.items() if state not in states.GONE]
    proving = by_state.get(State.PROVING, (0, 0.0, 0.0))
    dollars_per_hour = sum(dph for _, dph, _ in billing)
    # Idle instances bill but produce nothing: out of the fleet's output.
    idle_n, idle_rate, _ = idle
    output = max(0.0, proving[2] - idle_rate)
    return {
        "instances": sum(n for n, _, _ in by_state.values()),
        "by_state": {state: n for state, (n, _, _) in sorted(by_state.items())},
        "billing": sum(n for n, _, _ in billing),
        "proving": proving[0] - idle_n,
        "idle": idle_n,
        "proofs_per_hour": output,
        "completed_proofs_per_hour": completed_per_hour,
        "dollars_per_hour": dollars_per_hour,
        "dollars_per_proof": policy.usd_per_proof(dollars_per_hour, output),
    }
