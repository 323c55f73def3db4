"""The store rows and provider records the pure core reads, typed for mypy.

Rows stay the dicts the store and the providers hand out (no copy on the heartbeat's
path); these ``TypedDict`` types name the columns the core reads and the type each
holds, so mypy checks a column's name and use in ``decisions/`` and ``discovery/``.
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
    """An ``instances`` row (or the columns of it a scan read)."""

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


def listed_instances(rows: Sequence[Mapping[str, Any]]) -> Sequence[ListedInstance]:
    """vast.ai's instance list as reconciliation reads it: the same dicts, typed."""
    return cast(Sequence[ListedInstance], rows)


def our_records(rows: Sequence[Mapping[str, Any]]) -> Sequence[OurRecord]:
    """Our instance records as reconciliation reads them: the same dicts, typed."""
    return cast(Sequence[OurRecord], rows)
