"""JSON views of the store's rows for the operator API (the text views are the CLI's)."""

from __future__ import annotations

from typing import Any

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.store.schema import Row, loads

INSTANCE_FIELDS = (
    "id", "agent_id", "label", "kind", "state", "phase", "machine_id", "gpu_name", "num_gpus",
    "dph_total", "rate_per_hour", "min_rate_per_hour", "last_seen", "provider",
    "provider_instance_id", "offer_id", "geolocation", "cpu_name", "cpu_cores", "cpu_ram",
    "pcie_bw", "disk_gb", "proofs_completed_total", "terminate_reason", "created_at",
    "state_since", "destroyed_at", "agent_version", "rebenchmark_pending",
)


# What an instance's view is made from (the wide host_json is left out).
VIEW_COLUMNS = (*INSTANCE_FIELDS, "progress_json")


def finish_view(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` holds ``VIEW_COLUMNS``; turn it into the view in place."""
    out["progress"] = loads(out.pop("progress_json"))
    out["usd_per_proof"] = policy.usd_per_proof(out["dph_total"], out["rate_per_hour"])
    out["rebenchmark_pending"] = bool(out["rebenchmark_pending"])
    return out


def instance_view(row: Row) -> dict[str, Any]:
    return finish_view({name: row.get(name) for name in VIEW_COLUMNS})


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
