"""The store rows and provider records the pure core reads, typed for mypy.

Rows stay the dicts the store and the providers hand out (no copy on the heartbeat's
path); these ``TypedDict`` types name the columns the core reads and the type each
holds, so mypy checks a column's name and use in ``decisions/``, ``discovery/`` and the
operations on agent messages (``operations/``: hello, heartbeat, result, beliefs).
Every key is optional (``total=False``): a scan reads only the columns it needs
(``store.writer.HOT_COLUMNS``, ``monitor``'s timed scan). The columns are
docs/architecture.md's (the ``instances`` table); vast.ai's instance fields are
docs/vast.md's ("Instances: statuses, billing, listing").

Pure: types, and the casts that name them at the core's door.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast


class InstanceRow(TypedDict, total=False):
    """An ``instances`` row (or the columns of it a scan read): what the pure core and the
    operations on agent messages read of it."""

    id: int
    agent_id: str | None
    label: str | None
    kind: str
    state: str
    state_since: float | None
    created_at: float | None
    hello_at: float | None
    ended_at: float | None  # spend rows: destroyed (or left its machine) at
    verdict_at: float | None  # spend rows: its first benchmark verdict
    rate_per_hour: float | None
    terminate_reason: str | None
    rebenchmark_pending: int | None
    directed_benchmark_id: str | None
    provider_instance_id: int | None
    offer_json: str | None
    disk_gb: float | None
    bid_per_hour: float | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    rent_paused_s: float | None
    storage_paused_s: float | None
    min_rate_per_hour: float | None
    price_min_rate_per_hour: float | None  # the minimum the machine's own price sets
    host_json: str | None  # the hello's HostInfo
    # The agent's process and its latest heartbeat.
    boot_id: str | None
    last_seq: int | None
    last_seen: float | None
    last_non_benchmark_at: float | None
    benchmarking_seen_at: float | None
    result_window_at: float | None
    heartbeat_pace_s: int | None
    phase: str | None
    phase_started_at: float | None
    proofs_completed_total: int | None
    destroyed_at: float | None
    # The benchmark its heartbeats are judged on (early verdicts, docs/policy.md).
    bench_key: str | None
    bench_seen_at: float | None
    bench_anchor_at: float | None
    bench_last_seq: int | None
    bench_completed_total: int | None
    bench_proof_seconds_json: str | None
    bench_failed: int | None
    bench_done: int | None
    bench_total: int | None
    bench_concurrency: int | None
    bench_status: str | None
    # Directed benchmarks and held claims (docs/reliability.md).
    directed_benchmark_at: float | None
    directed_benchmark_kind: str | None
    unconfirmed_rate_per_hour: float | None
    confirm_tries: int | None
    confirm_watch_at: float | None
    confirm_watch_gap_s: float | None
    # The deployed offer's fields kept in columns of their own
    # (``discovery.measurements.INSTANCE_OFFER_COLUMNS``).
    machine_id: str | None
    gpu_name: str | None
    num_gpus: int | None
    dph_total: float | None
    geolocation: str | None
    cpu_name: str | None
    cpu_cores: float | None
    cpu_cores_effective: float | None
    cpu_ram: float | None
    pcie_bw: float | None


class AgentRow(TypedDict, total=False):
    """An ``agents`` row: an issued agent, what its hello may list, whether it is revoked."""

    agent_id: str
    label: str
    kind: str  # "deployed" or "byo"
    min_rate_per_hour: float | None
    revoked: int
    issued_at: float
    revoked_at: float | None
    revoked_reason: str | None
    max_gpus: int | None
    gpu_model: str | None


class OurRecord(TypedDict, total=False):
    """One of our instances as reconciliation reads it: vast.ai's id as
    ``provider_instance_id`` (the store's column) or ``instance_id``."""

    provider_instance_id: int | None
    instance_id: int | None
    agent_id: str | None
    state: str | None
    created_at: float | None


class ListedInstance(TypedDict, total=False):
    """An instance as vast.ai lists it (``GET /api/v1/instances/``): untrusted JSON, so
    each field is read with a check (a number may come as text, a status as null)."""

    id: object
    label: object
    actual_status: object
    status_msg: object
    start_date: object


def instance_row(row: Mapping[str, Any]) -> InstanceRow:
    """A store row (``store.migrations.Row``) as the core reads it: the same dict, typed;
    no copy (the heartbeat's path reads one per heartbeat)."""
    return cast(InstanceRow, row)


def agent_row(row: Mapping[str, Any]) -> AgentRow:
    """An ``agents`` row as the operations read it: the same dict, typed."""
    return cast(AgentRow, row)


def with_columns(row: InstanceRow, columns: Mapping[str, Any]) -> InstanceRow:
    """``row`` as it reads once ``columns`` are written: a new dict (the row is not
    changed)."""
    merged: dict[str, Any] = {**row, **columns}
    return cast(InstanceRow, merged)


def listed_instances(rows: Sequence[Mapping[str, Any]]) -> Sequence[ListedInstance]:
    """vast.ai's instance list as reconciliation reads it: the same dicts, typed."""
    return cast(Sequence[ListedInstance], rows)


def our_records(rows: Sequence[Mapping[str, Any]]) -> Sequence[OurRecord]:
    """Our instance records as reconciliation reads them: the same dicts, typed."""
    return cast(Sequence[OurRecord], rows)
