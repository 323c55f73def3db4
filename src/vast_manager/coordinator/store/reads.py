"""The store's queries, shared by the read connection and the writer's transaction."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Collection, Iterable, Sequence
from itertools import groupby
from typing import Any

from vast_manager.coordinator.store.migrations import ACTIVE_SQL, TABLES, Row

log = logging.getLogger(__name__)

# --- reads (shared by the read connection and the writer's transaction) -------


_PERF_COLUMNS = "machine_id, gpu_name, num_gpus, rate_per_hour, source, recorded_at, dph_total"


def fold_host_perf(rows: Iterable[tuple[Any, ...]]) -> list[Row]:
    """host_perf, the one place it is computed: each host configuration's rates from every
    measurement of it (the fleet's counted benchmarks and imported ones), ``rows`` in
    ``_PERF_COLUMNS`` order, grouped by configuration, oldest first. The best (never
    lowered, since measurements are never removed), the median (the mean of the middle two
    of an even count), how many, the latest, the latest known hourly price, when the latest
    was recorded and how many were imported."""
    out: list[Row] = []
    for (machine_id, gpu_name, num_gpus), group in groupby(rows, key=lambda r: r[:3]):
        ms = list(group)
        rates = sorted(m[3] for m in ms)
        mid = len(rates) // 2
        prices = [m[6] for m in ms if m[6] is not None]
        out.append({
            "machine_id": machine_id, "gpu_name": gpu_name, "num_gpus": num_gpus,
            "best_rate_per_hour": rates[-1],
            "median_rate_per_hour": rates[mid] if len(rates) % 2
            else (rates[mid - 1] + rates[mid]) / 2,
            "samples": len(rates), "last_rate_per_hour": ms[-1][3],
            "dph_total": prices[-1] if prices else None, "updated_at": ms[-1][5],
            "imported_samples": sum(m[4] == "imported" for m in ms),
        })
    return out


def rows_of(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    cur = conn.execute(sql, params)
    keys = [d[0] for d in cur.description]
    return [dict(zip(keys, row, strict=True)) for row in cur.fetchall()]


def one_row(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Row | None:
    rows = rows_of(conn, sql, params)
    return rows[0] if rows else None


#: The latest telemetry's columns on an instance's row (migration 15), which reads of whole
#: instance rows leave out: 1-3 kB an instance that a fleet listing does not need. The
#: ``telemetry`` view (``latest_telemetry``, ``live_telemetry``) reads them.
INSTANCE_TELEMETRY_COLUMNS = ("telemetry_at", "telemetry_json")


class Reads:
    """Queries; mixed into both ``Store`` (read connection) and ``Tx`` (the writer's)."""

    _conn: sqlite3.Connection
    _instance_columns_sql: str | None = None

    def _instance_columns(self) -> str:
        """``instances``' columns but the telemetry's, for ``select``: what ``*`` read
        before migration 15 (read once a connection: the schema is migrated before any
        read)."""
        if self._instance_columns_sql is None:
            names = [r[1] for r in self._conn.execute("pragma table_info(instances)")]
            self._instance_columns_sql = ", ".join(
                f"[{n}]" for n in names if n not in INSTANCE_TELEMETRY_COLUMNS)
        return self._instance_columns_sql

    def get_agent(self, agent_id: str) -> Row | None:
        return one_row(self._conn, "select * from agents where agent_id = ?", (agent_id,))

    def agent_states(self) -> list[tuple[str, bool]]:
        """Every agent id with whether it is revoked (the auth cache's start)."""
        return [(a, bool(r)) for a, r in self._conn.execute("select agent_id, revoked from agents")]

    def get_instance(self, instance_id: int) -> Row | None:
        return one_row(self._conn, f"select {self._instance_columns()} from instances "
                       "where id = ?", (instance_id,))

    def instance_by_agent(self, agent_id: str) -> Row | None:
        return one_row(self._conn, f"select {self._instance_columns()} from instances "
                       "where agent_id = ?", (agent_id,))

    def list_instances(self) -> list[Row]:
        """Every instance, every column (but the telemetry's)."""
        return rows_of(self._conn, f"select {self._instance_columns()} from instances order by id")

    def instance_values(
        self,
        columns: Sequence[str],
        *,
        states: Collection[str] | None = None,
        after_id: int | None = None,
        limit: int | None = None,
        gone_since: float | None = None,
    ) -> list[tuple[Any, ...]]:
        """Instances' values of ``columns``, in that order, by id: those in ``states``
        (every state when None) with an id above ``after_id``, at most ``limit`` of them;
        with ``gone_since``, a gone one only if it went at or after that time.
        A fleet-sized list: no dict per row, and without the wide ``host_json``, half the
        time of 10,000 rows. One state's page is a range of the state index."""
        cols = ", ".join(f"[{c}]" for c in columns)
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            where.append(f"state in ({', '.join('?' * len(states))})")
            params += states
        if after_id is not None:
            where.append("id > ?")
            params.append(after_id)
        if gone_since is not None:
            where.append(f"({ACTIVE_SQL} or coalesce(destroyed_at, state_since) >= ?)")
            params.append(gone_since)
        sql = f"select {cols} from instances"
        if where:
            sql += " where " + " and ".join(where)
        sql += " order by id"
        if limit is not None:
            sql += " limit ?"
            params.append(limit)
        return self._conn.execute(sql, params).fetchall()

    def instances_by_state(self) -> dict[str, tuple[int, float, float]]:
        """Per state: how many instances, the sum of what they bill per hour now (vast.ai's
        last listed status, ``billing_per_hour``, else ``dph_total``) and of their
        ``rate_per_hour`` (nulls count as 0)."""
        return {
            str(state): (int(n), float(dph), float(rate))
            for state, n, dph, rate in self._conn.execute(
                "select state, count(*), total(coalesce(billing_per_hour, dph_total)), "
                "total(rate_per_hour) "
                "from instances group by state"
            )
        }

    def instances_of_kind(self, kind: str, columns: Sequence[str] | None = None) -> list[Row]:
        """Every instance of one kind (``deployed`` or ``byo``); ``columns`` as in
        ``active_instances``."""
        cols = (self._instance_columns() if columns is None
                else ", ".join(f"[{c}]" for c in dict.fromkeys(columns)))
        return rows_of(
            self._conn, f"select {cols} from instances where kind = ? order by id", (kind,)
        )

    def instances_on_machine(self, machine_id: str, columns: Sequence[str]) -> list[Row]:
        """Every instance ever on ``machine_id`` (any state), ``columns`` only."""
        cols = ", ".join(f"[{c}]" for c in dict.fromkeys(columns))
        return rows_of(
            self._conn, f"select {cols} from instances where machine_id = ? order by id",
            (machine_id,),
        )

    def live_telemetry(self, states: Collection[str]) -> list[tuple[Any, ...]]:
        """``(id, machine_id, gpu_name, host_json, received_at, telemetry_json)`` of every
        instance in ``states`` that sent telemetry, by id (one query for a whole scrape)."""
        marks = ", ".join("?" * len(states))
        return self._conn.execute(
            "select id, machine_id, gpu_name, host_json, telemetry_at, telemetry_json "
            f"from instances where telemetry_json is not null and state in ({marks}) "
            "order by id",
            list(states),
        ).fetchall()

    def active_instances(self, columns: Sequence[str] | None = None) -> list[Row]:
        """Instances still on a machine; ``columns`` as in ``list_instances``."""
        cols = (self._instance_columns() if columns is None
                else ", ".join(f"[{c}]" for c in dict.fromkeys(columns)))
        return rows_of(
            self._conn, f"select {cols} from instances where {ACTIVE_SQL} order by id"
        )

    def active_instances_on_machine(
        self, machine_id: str, exclude_instance_id: int | None = None
    ) -> list[Row]:
        return rows_of(
            self._conn,
            f"select {self._instance_columns()} from instances where machine_id = ? "
            f"and {ACTIVE_SQL} "
            "and id != ? order by id",
            (machine_id, -1 if exclude_instance_id is None else exclude_instance_id),
        )

    def instances_due_for_destroy(self, now: float) -> list[Row]:
        return rows_of(
            self._conn,
            f"select {self._instance_columns()} from instances where destroy_due_at is not null "
            "and destroy_due_at <= ? "
            f"and {ACTIVE_SQL} order by destroy_due_at",
            (now,),
        )

    def next_destroy_due_at(self) -> float | None:
        row = one_row(
            self._conn,
            "select min(destroy_due_at) as due from instances "
            f"where destroy_due_at is not null and {ACTIVE_SQL}",
        )
        return None if row is None else row["due"]

    def find_result(self, agent_id: str, result_id: str) -> Row | None:
        return one_row(
            self._conn,
            "select * from results where agent_id = ? and result_id = ?",
            (agent_id, result_id),
        )

    def unrequested_results_since(self, agent_id: str, since: float) -> int:
        """Results of ``agent_id`` nobody asked for (undirected, after a terminate)
        received at or after ``since``: its flood allowance spent."""
        row = self._conn.execute(
            "select count(*) from results where agent_id = ? and received_at >= ? and "
            "(flags like '%undirected%' or flags like '%after_terminate%')",
            (agent_id, since)).fetchone()
        return int(row[0])

    def results_page(self, instance_id: int, limit: int, before: int | None = None
                     ) -> tuple[list[Row], int, int | None]:
        """The newest ``limit`` results of an instance with a row id below ``before`` (all:
        None), oldest first; how many it has in all; the ``before`` of the next (older)
        page, None when there is none (a view holds one page)."""
        total = int(self._conn.execute("select count(*) from results where instance_id = ?",
                                       (instance_id,)).fetchone()[0])
        rows = rows_of(self._conn, "select * from results where instance_id = ? and id < ? "
                       "order by id desc limit ?",
                       (instance_id, before if before is not None else 2**63 - 1, limit + 1))
        older = rows[limit - 1]["id"] if len(rows) > limit else None
        return rows[:limit][::-1], total, older

    def results_for_instance(self, instance_id: int) -> list[Row]:
        return rows_of(
            self._conn, "select * from results where instance_id = ? order by id", (instance_id,)
        )

    def events(self, instance_id: int | None = None, limit: int = 1000) -> list[Row]:
        if instance_id is None:
            return rows_of(self._conn, "select * from events order by id desc limit ?", (limit,))[
                ::-1
            ]
        return rows_of(
            self._conn,
            "select * from events where instance_id = ? order by id desc limit ?",
            (instance_id, limit),
        )[::-1]

    def events_of_kind(self, kind: str, limit: int = 100) -> list[Row]:
        """The newest ``limit`` events of one kind, oldest first."""
        return rows_of(self._conn, "select * from events where kind = ? order by id desc "
                       "limit ?", (kind, limit))[::-1]

    def latest_telemetry(self, instance_id: int) -> Row | None:
        return one_row(self._conn, "select * from telemetry where instance_id = ?", (instance_id,))

    def latest_heartbeat(self, agent_id: str) -> Row | None:
        return one_row(self._conn, "select * from heartbeats where agent_id = ?", (agent_id,))

    def heartbeat_history(self, agent_id: str) -> list[Row]:
        return rows_of(
            self._conn,
            "select * from heartbeat_history where agent_id = ? order by id",
            (agent_id,),
        )

    def logs(self, instance_id: int, tail: int, source: str | None = None) -> list[Row]:
        if source is None:
            rows = rows_of(
                self._conn,
                "select ts, source, text from logs where instance_id = ? "
                "order by id desc limit ?",
                (instance_id, tail),
            )
        else:
            rows = rows_of(
                self._conn,
                "select ts, source, text from logs where instance_id = ? and source = ? "
                "order by id desc limit ?",
                (instance_id, source, tail),
            )
        return rows[::-1]

    def host_perf(self) -> list[Row]:
        """Each host configuration's figures (``fold_host_perf``), best median first."""
        rows = self._conn.execute(f"select {_PERF_COLUMNS} from measurements "
                                  "order by machine_id, gpu_name, num_gpus, recorded_at, id")
        return sorted(fold_host_perf(rows),
                      key=lambda r: (-r["median_rate_per_hour"], r["machine_id"]))

    def host_perf_row(self, machine_id: str, gpu_name: str, num_gpus: int) -> Row | None:
        rows = self._conn.execute(
            f"select {_PERF_COLUMNS} from measurements where machine_id = ? and gpu_name = ? "
            "and num_gpus = ? order by recorded_at, id", (machine_id, gpu_name, num_gpus))
        return next(iter(fold_host_perf(rows)), None)

    def measurements(self, source: str | None = None) -> list[Row]:
        """Every measurement (or those of one ``source``), oldest first."""
        where, params = ("where source = ?", (source,)) if source else ("", ())
        return rows_of(self._conn, f"select * from measurements {where} "
                       "order by measured_at, id", params)

    def fleet_measurements_of(self, num_gpus: int) -> list[Row]:
        """The fleet's own measurements on ``num_gpus`` GPUs (rate and offer): where a
        result's twins on the same hardware are looked for (docs/reliability.md)."""
        return rows_of(self._conn, "select machine_id, rate_per_hour, model_cap_per_hour, "
                       "host_reported, offer_json from measurements where source = 'fleet' "
                       "and num_gpus = ? order by id", (num_gpus,))

    def measured_machines(self) -> set[str]:
        """Every machine with a measurement (a host_perf row)."""
        return {str(r[0]) for r in self._conn.execute(
            "select distinct machine_id from measurements")}

    def measurements_version(self) -> tuple[int, int]:
        """(count, highest id) of the measurements: changes whenever one is added."""
        row = self._conn.execute("select count(*), coalesce(max(id), 0) from measurements"
                                 ).fetchone()
        return int(row[0]), int(row[1])

    def autopilot_state(self) -> Row | None:
        return one_row(self._conn, "select * from autopilot where id = 1")

    def spend_rows(self, since: float) -> list[Row]:
        """Deployed instances that billed at any time since ``since``: price, start, end
        (null while on a machine) and when their first benchmark verdict came."""
        return rows_of(
            self._conn,
            "select id, dph_total, created_at, state, hello_at, offer_json, disk_gb, "
            "net_rx_bytes, net_tx_bytes, rent_paused_s, storage_paused_s, bid_per_hour, "
            f"case when {ACTIVE_SQL} then null else coalesce(destroyed_at, state_since) "
            "end as ended_at, (select min(r.received_at) from results r "
            "where r.instance_id = instances.id and r.verdict is not null) as verdict_at "
            "from instances where kind = 'deployed' and dph_total is not null "
            f"and ({ACTIVE_SQL} or coalesce(destroyed_at, state_since) >= ?) order by id",
            (since,),
        )

    def spool_marks(self) -> dict[str, tuple[int, int]]:
        """Each agent's highest stored spool sequence: (results, log batches)."""
        return {r[0]: (int(r[1]), int(r[2])) for r in self._conn.execute(
            "select agent_id, result_seq, logs_seq from spool_marks")}

    def bad_hosts(self, now: float | None = None) -> list[Row]:
        """Blocked machines; with ``now``, only blocks that have not expired."""
        if now is None:
            return rows_of(self._conn, "select * from bad_hosts order by added_at, machine_id")
        return rows_of(self._conn, "select * from bad_hosts where expires_at is null or "
                       "expires_at > ? order by added_at, machine_id", (now,))

    def strikes(self, machine_id: str | None = None) -> list[Row]:
        """Failed trials counted against machines (one, or all), oldest first."""
        where, params = ("where machine_id = ?", (machine_id,)) if machine_id else ("", ())
        return rows_of(self._conn, f"select * from machine_strikes {where} order by at, id",
                       params)

    def fleet_faults(self, open_only: bool = False) -> list[Row]:
        """Faults beyond one machine (``decisions.blame``), newest first; open ones only
        with ``open_only``."""
        where = "where cleared_at is null" if open_only else ""
        return rows_of(self._conn, f"select * from fleet_faults {where} order by id desc")

    def bad_host_count(self) -> int:
        return int(self._conn.execute("select count(*) from bad_hosts").fetchone()[0])

    def bad_host(self, machine_id: str, now: float | None = None) -> Row | None:
        """The machine's block; with ``now``, None once it has expired."""
        row = one_row(self._conn, "select * from bad_hosts where machine_id = ?", (machine_id,))
        if row is not None and now is not None and row.get("expires_at") is not None \
                and float(row["expires_at"]) <= now:
            return None
        return row

    def scaling(self) -> list[Row]:
        return rows_of(self._conn, "select * from scaling order by id")

    def content_digest(self) -> str:
        """SHA-256 over every row of every table (tests use it to prove a rejected
        request changed nothing: row counts alone miss an UPDATE)."""
        digest = hashlib.sha256()
        for table in TABLES:
            for row in self._conn.execute(f"select * from [{table}] order by rowid"):
                digest.update(repr((table, tuple(row))).encode())
        return digest.hexdigest()

    def count_rows(self) -> dict[str, int]:
        """Rows per table (tests use it to prove a rejected request wrote nothing)."""
        return {
            t: int(rows_of(self._conn, f"select count(*) as n from [{t}]")[0]["n"])
            for t in TABLES
        }


