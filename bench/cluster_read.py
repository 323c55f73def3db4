"""One round's read of Curio's HarmonyDB: the coordinator's query on a fleet-sized history.

Run: ``python bench/cluster_read.py [--instances 1000] [--rows 10000000] [--rounds 20]``
(``--quick``: 100 instances, 200,000 rows). Needs Debian's ``postgresql`` package
(``apt-get install -y postgresql``): a throwaway server is started as the tests start it
(``tests/support/postgres.py``), with Curio's tables made by Curio's own migrations.

The history is made by SQL ``generate_series``: ``--rows`` task rows ending over the last
``rows / (instances x 20 an hour)`` hours, so the last hour holds what ``--instances`` nodes
proving 20 proofs an hour write (one task in ten a ``WdPost``, which the read leaves out;
one in fifty failed, with an error text), and one named node per instance. Curio's
secondary indexes are built after the rows (as they would stand on a cluster that grew
into them), then ``VACUUM ANALYZE`` (autovacuum's state on a live cluster).

Printed: the time of one round's read (``CurioDb.read``: the query over a warm connection,
its rows parsed) over ``--rounds`` rounds, median and worst, the matching of its rows to
the instances (``decisions.attribution.attribute``), a baseline from the same run (``SELECT
1`` on a warm connection), and the bar (200 ms for the read).
Every figure is this run's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import asyncpg  # noqa: E402

from vast_manager.coordinator.curio_db import CurioDb  # noqa: E402
from vast_manager.coordinator.decisions.attribution import Claim, attribute, node_name  # noqa: E402

from support.postgres import PostgresServer, find_bin_dir  # noqa: E402

BAR_MS = 200.0
PER_HOUR = 20
NOW = 1_800_000_000.0

# Curio's secondary indexes on the history (tests/fixtures/curio_harmony_e0294b0f.sql).
INDEXES = (
    "CREATE INDEX IF NOT EXISTS harmony_task_history_work_index ON harmony_task_history "
    "(work_end desc, completed_by_host_and_port asc, name asc, result asc)",
    "CREATE INDEX IF NOT EXISTS harmony_task_history_task_id_result_index "
    "ON harmony_task_history (task_id, result)",
    "CREATE INDEX IF NOT EXISTS harmony_task_history_recent_task_result_idx "
    "ON harmony_task_history (work_end DESC, name ASC, task_id ASC, result ASC)",
)
INDEX_NAMES = ("harmony_task_history_work_index", "harmony_task_history_task_id_result_index",
               "harmony_task_history_recent_task_result_idx")


def address(i: int) -> str:
    return f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:12300"


async def fill(conn: asyncpg.Connection, instances: int, rows: int) -> float:
    """Nodes and history; returns the hours the history spans."""
    span_h = rows / (instances * PER_HOUR)
    await conn.execute(
        "INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu, last_contact) "
        "SELECT '10.' || (i / 65536 % 256) || '.' || (i / 256 % 256) || '.' || (i % 256) "
        "|| ':12300', 64, 549755813888, 1, CURRENT_TIMESTAMP "
        "FROM generate_series(0, $1 - 1) i", instances)
    await conn.execute(
        "INSERT INTO harmony_machine_details (tasks, layers, startup_time, miners, machine_id, "
        "machine_name, version) SELECT ',PSProve,', 'base', now(), '', id, 'vm-' || id, 'b' "
        "FROM harmony_machines")
    for name in INDEX_NAMES:
        await conn.execute(f"DROP INDEX IF EXISTS {name}")
    await conn.execute(
        "INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, result, "
        "completed_by_host_and_port, err) "
        "SELECT g, CASE WHEN g / $2 % 10 = 0 THEN 'WdPost' ELSE 'PSProve' END, "
        "ts - interval '5 minutes', ts - interval '2 minutes', ts, g / $2 % 50 <> 0, "
        "'10.' || (g % $2 / 65536 % 256) || '.' || (g % $2 / 256 % 256) || '.' || "
        "(g % $2 % 256) || ':12300', "
        "CASE WHEN g / $2 % 50 = 0 THEN 'error: PSProve: proof failed VerifySeal' ELSE '' END "
        "FROM (SELECT g, to_timestamp($3::float8 - g::float8 * $4::float8 / $1::float8) AS ts "
        "FROM generate_series(1, $1) g) s",
        rows, instances, NOW, span_h * 3600.0)
    for statement in INDEXES:
        await conn.execute(statement)
    await conn.execute("VACUUM ANALYZE harmony_task_history")
    return span_h


async def run(args: argparse.Namespace) -> int:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        print("postgresql is not installed (apt-get install -y postgresql)", file=sys.stderr)
        return 2
    server = PostgresServer(bin_dir)
    try:
        server.start()
        await server.prepare()
        conn = await server.admin()
        started = time.perf_counter()
        span_h = await fill(conn, args.instances, args.rows)
        await conn.close()
        print(f"history: {args.rows:,} rows over {span_h:.0f} h, {args.instances:,} nodes "
              f"(made in {time.perf_counter() - started:.0f} s)")
        db = CurioDb(server.reader_url, "curio", 60.0)
        since = NOW - 3600.0
        read = await db.read(since, ["PSProve", "PoRep", "UpdateProve"], "vm-")  # connects
        claims = [Claim(i, node_name(i)) for i in range(1, args.instances + 1)]
        times_ms, match_ms = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            read = await db.read(since, ["PSProve", "PoRep", "UpdateProve"], "vm-")
            t1 = time.perf_counter()
            found = attribute(claims, read.machines, read.tallies)
            t2 = time.perf_counter()
            times_ms.append((t1 - t0) * 1000)
            match_ms.append((t2 - t1) * 1000)
        await db.close()
        # Baseline, same server and run: one round trip on a warm connection.
        ping = await server.admin()
        ping_ms = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            await ping.fetchval("SELECT 1")
            ping_ms.append((time.perf_counter() - t0) * 1000)
        await ping.close()
        in_window = sum(t.completed + t.failed for t in read.tallies.values())
        matched = sum(1 for v in found.instances.values() if hasattr(v, "tally"))
        print(f"one round: {in_window:,} proving tasks in the window, {len(read.tallies):,} "
              f"addresses, {matched:,} instances matched")
        median, worst = statistics.median(times_ms), max(times_ms)
        print(f"read (query + rows, warm connection), {args.rounds} rounds: median "
              f"{median:.1f} ms, worst {worst:.1f} ms; matching: median "
              f"{statistics.median(match_ms):.1f} ms")
        print(f"baseline: SELECT 1 on a warm connection, median "
              f"{statistics.median(ping_ms):.2f} ms")
        print(f"bar: one round's read under {BAR_MS:.0f} ms: "
              f"{'met' if worst < BAR_MS else 'NOT met'} (worst round)")
        return 0
    finally:
        server.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="100 instances, 200,000 rows")
    args = parser.parse_args()
    if args.quick:
        args.instances, args.rows, args.rounds = 100, 200_000, 5
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
