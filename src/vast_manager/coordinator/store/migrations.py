"""The coordinator's tables in SQLite: their names, the JSON columns' encoding and the numbered
migrations that build them (each applied once, recorded in ``migrations``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import sqlite_utils

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.discovery.measurements import INSTANCE_OFFER_COLUMNS, instance_offer
from vast_manager.coordinator.rows import instance_row
from vast_manager.protocol.codec import encode

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = dict[str, Any]

#: The tables (docs/architecture.md's ``heartbeats``, the latest heartbeat per agent, is a view of
#: ``instances`` since migration 3, and ``telemetry``, the latest telemetry per instance, since
#: migration 15; ``host_perf`` is computed from ``measurements`` since migration 11).
TABLES = (
    "instances",
    "agents",
    "results",
    "bad_hosts",
    "heartbeat_history",
    "logs",
    "events",
    "scaling",
    "measurements",
    "autopilot",
    "machine_strikes",
    "fleet_faults",
)

#: Instances still on their machine (``states.BILLING``), as SQL. Written as "not gone"
#: so a state added later counts as on its machine unless it is declared gone. Live code
#: only: a migration that needs such a list keeps the literal text it was released with,
#: since a past migration must build the same schema for ever.
ACTIVE_SQL = states.sql_in("state", states.GONE, negate=True)


def dumps(value: Any) -> str | None:
    """JSON text for a TEXT column (None stays NULL)."""
    if value is None:
        return None
    return encode(value).decode()


def loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


# --- migrations ----------------------------------------------------------------


def _m1_initial(db: sqlite_utils.Database) -> None:
    _m1_agents(db)
    _m1_instances(db)
    _m1_results_and_host_perf(db)
    _m1_hosts_and_heartbeats(db)
    _m1_logs_events_scaling(db)


def _m1_agents(db: sqlite_utils.Database) -> None:
    """The issued agents."""
    db.table("agents").create(
        {
            "agent_id": str,
            "label": str,
            "kind": str,  # "deployed" or "byo"
            "min_rate_per_hour": float,
            "revoked": int,
            "revoked_at": float,
            "revoked_reason": str,
            "issued_at": float,
        },
        pk="agent_id",
        not_null={"label", "kind", "revoked", "issued_at"},
        defaults={"revoked": 0},
    )


def _m1_instances(db: sqlite_utils.Database) -> None:
    """One row per instance we deployed or agent we issued."""
    db.table("instances").create(
        {
            "id": int,
            "agent_id": str,
            "label": str,
            "kind": str,
            "provider": str,
            "provider_instance_id": int,
            "offer_id": int,
            "state": str,
            "state_since": float,
            "phase": str,
            "phase_started_at": float,
            "progress_json": str,
            "proofs_completed_total": int,
            "machine_id": str,
            "gpu_name": str,
            "num_gpus": int,
            "dph_total": float,
            "geolocation": str,
            "cpu_name": str,
            "cpu_cores": float,
            "cpu_ram": float,
            "pcie_bw": float,
            "disk_gb": int,
            "min_rate_per_hour": float,
            "rate_per_hour": float,
            "boot_id": str,
            "last_seq": int,
            "agent_version": str,
            "container_id": str,
            "host_json": str,
            "hello_at": float,
            "last_seen": float,
            "last_non_benchmark_at": float,
            "rebenchmark_pending": int,
            "terminate_reason": str,
            "destroy_due_at": float,
            "destroyed_at": float,
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
        not_null={"state", "created_at", "kind"},
        defaults={"rebenchmark_pending": 0, "proofs_completed_total": 0},
    )
    db.table("instances").create_index(["agent_id"], unique=True)
    db.table("instances").create_index(["machine_id", "state"])
    db.table("instances").create_index(["provider_instance_id"])


def _m1_results_and_host_perf(db: sqlite_utils.Database) -> None:
    """Every result, and the host figures folded from them (then)."""
    db.table("results").create(
        {
            "id": int,
            "agent_id": str,
            "result_id": str,
            "instance_id": int,
            "kind": str,
            "proof_type": str,
            "started_at": float,
            "finished_at": float,
            "gpus_used_json": str,
            "proofs_completed": int,
            "proofs_failed": int,
            "wall_seconds": float,
            "rate_per_hour": float,
            "recomputed_rate_per_hour": float,
            "proof_seconds_json": str,
            "telemetry_json": str,
            "runs_json": str,
            "efficiency": float,
            "bottleneck": str,
            "evidence_json": str,
            "flags": str,  # comma-separated: implausible, contended, partial
            "flag_reasons_json": str,
            "counts_for_host_perf": int,
            "verdict": str,
            "verdict_reason": str,
            "directive_json": str,
            "machine_id": str,
            "gpu_name": str,
            "num_gpus": int,
            "received_at": float,
        },
        pk="id",
        not_null={"agent_id", "result_id", "kind", "received_at", "directive_json"},
    )
    # Unique per agent: one agent must not be able to shadow another's result_id.
    db.table("results").create_index(["agent_id", "result_id"], unique=True)
    db.table("results").create_index(["instance_id"])
    db.table("results").create_index(["machine_id", "gpu_name", "num_gpus"])
    db.table("host_perf").create(
        {
            "machine_id": str,
            "gpu_name": str,
            "num_gpus": int,
            "best_rate_per_hour": float,
            "median_rate_per_hour": float,
            "samples": int,
            "last_rate_per_hour": float,
            "dph_total": float,
            "updated_at": float,
        },
        pk=("machine_id", "gpu_name", "num_gpus"),
    )


def _m1_hosts_and_heartbeats(db: sqlite_utils.Database) -> None:
    """Bad hosts, heartbeats and their history."""
    db.table("bad_hosts").create(
        {"machine_id": str, "reason": str, "added_at": float, "source": str, "instance_id": int},
        pk="machine_id",
        not_null={"reason", "added_at", "source"},
    )
    db.table("heartbeats").create(
        {
            "agent_id": str,
            "instance_id": int,
            "received_at": float,
            "seq": int,
            "phase": str,
            "phase_started_at": float,
            "progress_json": str,
            "proofs_completed_total": int,
            "proof_seconds_recent_json": str,
        },
        pk="agent_id",
    )
    db.table("heartbeat_history").create(
        {
            "id": int,
            "agent_id": str,
            "instance_id": int,
            "received_at": float,
            "seq": int,
            "phase": str,
            "proofs_completed_total": int,
            "telemetry_json": str,
        },
        pk="id",
    )
    db.table("heartbeat_history").create_index(["agent_id", "id"])


def _m1_logs_events_scaling(db: sqlite_utils.Database) -> None:
    """Telemetry, logs, events and the scaling diagnoses."""
    db.table("telemetry").create(
        {"instance_id": int, "received_at": float, "telemetry_json": str}, pk="instance_id"
    )
    db.table("logs").create(
        {
            "id": int,
            "instance_id": int,
            "agent_id": str,
            "ts": float,
            "source": str,
            "text": str,
            "received_at": float,
        },
        pk="id",
    )
    db.table("logs").create_index(["instance_id", "id"])
    db.table("events").create(
        {
            "id": int,
            "ts": float,
            "kind": str,
            "reason": str,
            "instance_id": int,
            "agent_id": str,
            "machine_id": str,
            "data_json": str,
        },
        pk="id",
        not_null={"ts", "kind", "reason"},
    )
    db.table("events").create_index(["instance_id", "id"])
    db.table("scaling").create(
        {
            "id": int,
            "result_row_id": int,
            "instance_id": int,
            "machine_id": str,
            "gpu_name": str,
            "num_gpus": int,
            "rate_all_per_hour": float,
            "rate_one_per_hour": float,
            "agent_efficiency": float,
            "agent_bottleneck": str,
            "agent_evidence_json": str,
            "efficiency": float,
            "bottleneck": str,
            "evidence_json": str,
            "created_at": float,
        },
        pk="id",
    )
    db.table("scaling").create_index(["instance_id"])

def _m2_benchmark_verdict_state(db: sqlite_utils.Database) -> None:
    """Per-instance state of the running benchmark, for early verdicts (docs/policy.md).

    Kept on the instance row so that a coordinator restart mid-benchmark
    remembers the proofs it has seen and when it first saw the benchmark.
    """
    instances = db.table("instances")
    for name, kind in (
        ("bench_key", str),  # "boot_id|phase_started_at" of the benchmark tracked
        ("bench_seen_at", float),  # when the coordinator first saw this run (its clock)
        # The latest the batch can have started by its completed proofs: the least of
        # (time a proof was seen - its seconds), null before the first completion.
        ("bench_anchor_at", float),
        ("bench_last_seq", int),  # the last heartbeat seq counted (within bench_key's boot)
        ("bench_completed_total", int),  # the agent's proofs_completed_total at that heartbeat
        ("bench_proof_seconds_json", str),  # every completed proof's seconds in this run
        ("bench_failed", int),  # failed proofs in this run
        ("bench_done", int),  # the run's progress.done at the last counted heartbeat
        ("bench_total", int),  # the run's planned proofs (progress.total)
        ("bench_concurrency", int),  # proofs in flight (progress.concurrency)
        ("bench_status", str),  # open, passed, terminated, closed
    ):
        instances.add_column(name, kind)


def _m3_latest_heartbeat_on_instances(db: sqlite_utils.Database) -> None:
    """The latest heartbeat per agent moves onto its instance's row; ``heartbeats`` stays,
    as a view of it (docs/architecture.md's name, the same columns).

    Every column of the old table but two was already on the instance (the gauges a
    heartbeat sets), and nothing read it: writing it cost each heartbeat a second page
    and a text-key index (``python bench/writer.py``).
    """
    instances = db.table("instances")
    instances.add_column("heartbeat_at", float)  # when the latest heartbeat was received
    instances.add_column("proof_seconds_recent_json", str)  # its proof_seconds_recent
    db.execute(
        "update instances set "
        "heartbeat_at = (select received_at from heartbeats h where h.instance_id = instances.id), "
        "proof_seconds_recent_json = (select proof_seconds_recent_json from heartbeats h "
        "where h.instance_id = instances.id) "
        "where id in (select instance_id from heartbeats)"
    )
    db.execute("drop table heartbeats")
    db.execute(
        "create view heartbeats as select agent_id, id as instance_id, "
        "heartbeat_at as received_at, last_seq as seq, phase, phase_started_at, progress_json, "
        "proofs_completed_total, proof_seconds_recent_json from instances "
        "where heartbeat_at is not null"
    )


def _m4_instance_share(db: sqlite_utils.Database) -> None:
    """What a deployed instance gets of its host (docs/vast.md): the offer's
    ``cpu_cores_effective`` beside the host's ``cpu_cores``, and the RAM share
    (``vast_manager.coordinator.decisions.share``), so predictions can keep RAM classes apart."""
    instances = db.table("instances")
    instances.add_column("cpu_cores_effective", float)
    instances.add_column("instance_ram_gb", float)


def _m5_observed_benchmark_window(db: sqlite_utils.Database) -> None:
    """What the coordinator saw of an instance's benchmarking, to judge results against
    (docs/reliability.md): a result may claim only the time since the later of these and
    ``last_non_benchmark_at``, and only if a benchmarking heartbeat was seen."""
    instances = db.table("instances")
    instances.add_column("benchmarking_seen_at", float)  # the latest benchmarking heartbeat
    instances.add_column("result_window_at", float)  # arrival of the latest result: the
    # stretch of benchmarking before it is used up


def _m6_fleet_read_indexes(db: sqlite_utils.Database) -> None:
    """Indexes for the fleet-sized reads (docs/performance.md): the operator's state
    filter and the state counts of ``/metrics`` (``state``, which SQLite extends with the
    id, so one state's instances come in id order); the monitor's scans of the instances
    still on a machine, of the destroys falling due and of one kind of instance.

    The two partial indexes carry ``ACTIVE_SQL``'s condition as it reads at this
    migration's release (a past migration builds the same schema for ever): SQLite uses
    a partial index only for a query whose WHERE holds that same term, so a change to
    that set of states needs a migration that rebuilds them
    (tests/coordinator/store/test_store_indexes.py reads the plans, and fails first).
    """
    instances = db.table("instances")
    instances.create_index(["state"], index_name="idx_instances_state")
    instances.create_index(["kind"], index_name="idx_instances_kind")
    active = "state not in ('destroyed', 'vanished')"
    db.execute(f"create index idx_instances_active on instances (id) where {active}")
    db.execute("create index idx_instances_destroy_due on instances (destroy_due_at) "
               f"where destroy_due_at is not null and {active}")


def _m7_measurements(db: sqlite_utils.Database) -> None:
    """What the rate model learns from (docs/discovery.md): every measured rate with the
    hardware it ran on, the fleet's own (one per counted benchmark result) and imported
    ones (``hosts import``); the whole offer an instance was deployed from; and the
    autopilot's switch, which survives a restart.

    Counted results of earlier versions become fleet measurements, their offer rebuilt
    from what their instance kept of it.
    """
    db.table("instances").add_column("offer_json", str)  # the offer as deployed
    db.table("host_perf").add_column("imported_samples", int)
    db.table("measurements").create(
        {
            "id": int,
            "machine_id": str,
            "gpu_name": str,
            "num_gpus": int,
            "rate_per_hour": float,
            "measured_at": float,
            "source": str,  # fleet or imported
            "offer_json": str,
            "result_row_id": int,  # the fleet's result it came from
            "instance_id": int,
            "recorded_at": float,
        },
        pk="id",
        not_null={"machine_id", "gpu_name", "num_gpus", "rate_per_hour", "measured_at",
                  "source", "offer_json", "recorded_at"},
    )
    # One measurement is one machine's rate at one time: importing a file twice, or an
    # export of this fleet back into it, adds nothing.
    db.table("measurements").create_index(["machine_id", "measured_at", "rate_per_hour"],
                                          unique=True)
    db.table("measurements").create_index(["machine_id", "gpu_name", "num_gpus"])
    db.table("autopilot").create(
        {
            "id": int,  # always 1
            "state": str,  # running or stopped
            "changed_at": float,
            "changed_by": str,
            "reason": str,
            "last_exploration_at": float,
        },
        pk="id",
        not_null={"state", "changed_at"},
    )
    cols = ", ".join(f"i.[{c}]" for c in INSTANCE_OFFER_COLUMNS)
    rows = db.execute(
        f"select r.id, r.instance_id, r.machine_id, r.gpu_name, r.num_gpus, "
        f"r.recomputed_rate_per_hour, r.received_at, i.host_json, i.kind, {cols} "
        "from results r left join instances i on i.id = r.instance_id "
        "where r.kind = 'benchmark' and r.counts_for_host_perf = 1 "
        "and r.recomputed_rate_per_hour is not null order by r.id"
    ).fetchall()
    now = time.time()
    for row in rows:
        rid, iid, machine, gpu, n, rate, at, host_json, kind = row[:9]
        kept = dict(zip(INSTANCE_OFFER_COLUMNS, row[9:], strict=True))
        offer = instance_offer(
            None, loads(host_json) if kind == "byo" else None,
            instance_row({**kept, "machine_id": machine, "gpu_name": gpu, "num_gpus": n}),
        )
        db.execute(
            "insert or ignore into measurements (machine_id, gpu_name, num_gpus, "
            "rate_per_hour, measured_at, source, offer_json, result_row_id, instance_id, "
            "recorded_at) values (?, ?, ?, ?, ?, 'fleet', ?, ?, ?, ?)",
            (machine, gpu, n, rate, at, dumps(offer), rid, iid, now),
        )


def _m8_heartbeat_pace(db: sqlite_utils.Database) -> None:
    """The heartbeat pace last given to each instance's agent (``next_heartbeat_s`` of its
    latest directive; docs/operations.md, "Heartbeat pace"), so its silence is timed on
    its own pace, after a restart too. Null on older rows: the base pace."""
    db.table("instances").add_column("heartbeat_pace_s", int)


def _m9_whole_bill(db: sqlite_utils.Database) -> None:
    """The whole bill and strikes (docs/operations.md): the bytes each instance's agent
    reports its NIC moved (cumulative, the largest seen), each machine's failed trials
    with their reasons, and an expiry on a block (null: until removed by hand)."""
    instances = db.table("instances")
    instances.add_column("net_rx_bytes", int)
    instances.add_column("net_tx_bytes", int)
    # Seconds vast.ai showed it not running (no rent) and offline (no storage either), as
    # the monitor saw it round by round.
    instances.add_column("rent_paused_s", float)
    instances.add_column("storage_paused_s", float)
    instances.add_column("bid_per_hour", float)  # an interruptible instance's bid (rent)
    db.table("bad_hosts").add_column("expires_at", float)
    db.table("machine_strikes").create(
        {"id": int, "machine_id": str, "instance_id": int, "reason": str, "at": float},
        pk="id",
        not_null={"machine_id", "reason", "at"},
    )
    db.table("machine_strikes").create_index(["machine_id", "instance_id"], unique=True)


def _m10_directed_benchmarks(db: sqlite_utils.Database) -> None:
    """Directed benchmarks and held results (docs/reliability.md, "No rate on a host's
    word alone"): the benchmark an instance was asked for (its id, when and why), the
    claim awaiting a re-benchmark, how closely the re-benchmark was watched; the GPUs a
    bring-your-own agent was issued for; the benchmark id a result carried."""
    for name, kind in (
        ("directed_benchmark_id", str),  # the open directed benchmark's id (null: none)
        ("directed_benchmark_at", float),  # when it was opened (a confirmation: delivered)
        ("directed_benchmark_kind", str),  # first, operator or confirm
        ("unconfirmed_rate_per_hour", float),  # the held claim a re-benchmark must match
        ("confirm_tries", int),  # re-benchmarks asked for the held claim
        ("confirm_watch_at", float),  # the last benchmarking heartbeat since then
        ("confirm_watch_gap_s", float),  # the longest silence since then
    ):
        db.table("instances").add_column(name, kind)
    db.table("agents").add_column("max_gpus", int)  # what its hello may list (null: legacy)
    db.table("agents").add_column("gpu_model", str)  # vast.ai's spelling (null: any)
    db.table("results").add_column("benchmark_id", str)
    # An instance still waiting for its first rate was told to benchmark before
    # directed benchmarks existed: its benchmark is the one asked for.
    db.execute("update instances set directed_benchmark_id = 'bm_' || lower(hex(randomblob(16))), "
               "directed_benchmark_kind = 'first', directed_benchmark_at = ? "
               "where rate_per_hour is null and destroyed_at is null", (time.time(),))


def _m11_host_perf_from_measurements(db: sqlite_utils.Database) -> None:
    """host_perf is computed from ``measurements`` (``reads.host_perf``): a rate is written
    once, as a measurement, and every figure of a host configuration comes from them in
    one place. The table's rows were folded from the same measurements (each counted
    result has its fleet measurement since migration 7), so the answers stay; the offer's
    hourly price becomes a column of its own, so the fold reads no JSON."""
    db.table("measurements").add_column("dph_total", float)
    db.execute(
        "update measurements set dph_total = json_extract(offer_json, '$.dph_total') "
        "where json_type(offer_json, '$.dph_total') in ('integer', 'real')")
    db.execute("drop table host_perf")


def _m12_spool_marks(db: sqlite_utils.Database) -> None:
    """The highest spool sequence number of each kind stored for each agent: how far a
    restored database reaches, so agents replay what came after (docs/protocol.md,
    "Replay"), and a replayed log batch is stored once."""
    db.execute("create table spool_marks (agent_id text primary key, "
               "result_seq integer not null default 0, logs_seq integer not null default 0)")


def _m13_blame(db: sqlite_utils.Database) -> None:
    """Whose fault each failed trial was (docs/policy.md, "Blame"): its party and the
    failure's signature on ``machine_strikes`` (older rows: the host's, as they were
    counted); faults beyond one machine that pause deploys (``fleet_faults``); the
    minimum an instance's own price sets, beside an operator-given one; vast.ai's own
    view of each instance."""
    strikes = db.table("machine_strikes")
    strikes.add_column("fault", str)
    strikes.add_column("signature", str)
    db.execute("update machine_strikes set fault = 'host' where fault is null")
    db.table("fleet_faults").create(
        {"id": int, "signature": str, "fault": str, "cause": str, "fix": str,
         "opened_at": float, "last_at": float, "failures": int, "machines_json": str,
         "cleared_at": float, "cleared_note": str},
        pk="id",
        not_null={"signature", "fault", "cause", "opened_at"},
    )
    instances = db.table("instances")
    instances.add_column("price_min_rate_per_hour", float)
    # vast.ai's own view, as the monitor last listed it: its actual_status, its status_msg
    # and what that status bills per hour (rent and storage; null: not listed yet).
    instances.add_column("provider_status", str)
    instances.add_column("provider_status_msg", str)
    instances.add_column("billing_per_hour", float)


def _m14_bounded_influence(db: sqlite_utils.Database) -> None:
    """A counted claim reaches the rate model (and other machines' twin references) at
    most at what was believed of its hardware before it, until its delivery agrees
    (docs/reliability.md, "Judged by what it delivers"); null: read as measured. A
    bring-your-own agent's measurement is ``host_reported`` (its hardware is its hello's
    word): kept out of the model and of other machines' twins."""
    db.table("measurements").add_column("model_cap_per_hour", float)
    db.table("measurements").add_column("host_reported", int)


def _m15_latest_telemetry_on_instances(db: sqlite_utils.Database) -> None:
    """The latest telemetry per instance moves onto its row, as the latest heartbeat did in
    migration 3; ``telemetry`` stays, as a view of it (the same columns).

    Every heartbeat rewrites both, and each was a page of its own: one page a heartbeat
    instead of two (``python bench/writer.py``, docs/performance.md). Reads of whole
    instance rows leave the two columns out (``store.reads.INSTANCE_TELEMETRY_COLUMNS``):
    a fleet listing does not carry every instance's telemetry.
    """
    instances = db.table("instances")
    instances.add_column("telemetry_at", float)  # when the latest telemetry was received
    instances.add_column("telemetry_json", str)
    db.execute(
        "update instances set "
        "telemetry_at = (select received_at from telemetry t where t.instance_id = instances.id), "
        "telemetry_json = (select telemetry_json from telemetry t "
        "where t.instance_id = instances.id) "
        "where id in (select instance_id from telemetry)"
    )
    db.execute("drop table telemetry")
    db.execute(
        "create view telemetry as select id as instance_id, telemetry_at as received_at, "
        "telemetry_json from instances where telemetry_json is not null"
    )


def _m16_binding_seen(db: sqlite_utils.Database) -> None:
    """The resource seen binding while a rate was measured (``hosts import``'s optional
    ``bottleneck``; docs/discovery.md, section 2): evidence the rate model reads where it
    says the CPU or the link. Null: not seen."""
    db.table("measurements").add_column("bottleneck", str)


MIGRATIONS: tuple[tuple[int, str, Callable[[sqlite_utils.Database], None]], ...] = (
    (1, "initial tables", _m1_initial),
    (2, "benchmark state for early verdicts", _m2_benchmark_verdict_state),
    (3, "the latest heartbeat on its instance's row", _m3_latest_heartbeat_on_instances),
    (4, "the instance's share of its host", _m4_instance_share),
    (5, "the observed benchmarking window of each instance", _m5_observed_benchmark_window),
    (6, "indexes for the fleet-sized reads and the monitor's scans", _m6_fleet_read_indexes),
    (7, "measurements with their hardware, offers as deployed, the autopilot's switch",
     _m7_measurements),
    (8, "the heartbeat pace last given to each instance", _m8_heartbeat_pace),
    (9, "bytes moved, machine strikes, block expiries", _m9_whole_bill),
    (10, "directed benchmarks, held results, declared GPUs", _m10_directed_benchmarks),
    (11, "host_perf computed from measurements", _m11_host_perf_from_measurements),
    (12, "the highest spool sequence stored for each agent", _m12_spool_marks),
    (13, "blame: each failure's party, faults that pause deploys; vast.ai's view",
     _m13_blame),
    (14, "the most the rate model reads of a claim beyond belief; host-reported hardware",
     _m14_bounded_influence),
    (15, "the latest telemetry on its instance's row", _m15_latest_telemetry_on_instances),
    (16, "the resource seen binding while a rate was measured", _m16_binding_seen),
)


def migrate(db: sqlite_utils.Database) -> list[int]:
    """Apply every migration not yet recorded in ``migrations``; return those applied.

    Each migration runs in its own transaction with its record, so a crash
    mid-way leaves either both or neither.
    """
    if "migrations" not in db.table_names():
        db.table("migrations").create({"id": int, "name": str, "applied_at": float}, pk="id")
    done = {row["id"] for row in db.query("select id from migrations")}
    applied = []
    for number, name, fn in MIGRATIONS:
        if number in done:
            continue
        with db.atomic():
            fn(db)
            db.execute(
                "insert into migrations (id, name, applied_at) values (?, ?, ?)",
                (number, name, time.time()),
            )
        applied.append(number)
    return applied


