"""Database size after a simulated day of a fleet, and the bound the retention settings set.

Run: ``python bench/storage.py`` (1,000 agents, 24 h then 25 h; ``--quick`` for a
smoke run; ``--help``).

The simulation drives the store's real write path on a simulated clock: the
real ``hello.hello_job``, ``heartbeat.heartbeat_job`` (with its heartbeat
history downsampling and trimming, ``Tx.heartbeats.append_history``),
``agent_logs.logs_job`` (with its per-instance trimming) and one
``result_op.result_job`` per agent, at the default settings
(``heartbeat_history_interval_s`` 300, ``heartbeat_history_rows`` 288,
``log_lines_per_instance`` 20,000, heartbeats every ``next_heartbeat_s`` 15 s).

Heartbeats between two history rows only overwrite each agent's latest rows
(the instance with its latest heartbeat, the telemetry): they change no row
count and no size. So the fleet run sends each agent one heartbeat per
history interval (the ones
the downsampler keeps), and a check in the same run drives ``--exact-agents``
agents with EVERY heartbeat of the day (5,760 each) and compares the row
counts of both ways. Logs: ``--log-lines-per-hour`` per agent (default 120, a
few lines per proof), shipped once per history interval; the bound assumes the
worst, every instance at ``log_lines_per_instance``.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import gpus_of, heartbeat_body, hello_body, telemetry  # noqa: E402

from vast_manager.coordinator.operations import agent_logs, heartbeat  # noqa: E402
from vast_manager.coordinator.operations import result as result_op  # noqa: E402
from vast_manager.coordinator.operations.hello import hello_job  # noqa: E402
from vast_manager.coordinator.settings import Settings  # noqa: E402
from vast_manager.coordinator.store.writer import Store, Tx  # noqa: E402
from vast_manager.protocol.codec import from_obj  # noqa: E402
from vast_manager.protocol.messages import Heartbeat, Hello, LogBatch, Result  # noqa: E402

DAY_S = 86_400
LOG_TEXT = ("2026-11-29T12:00:00Z INFO cuzk::prover: proof {n} done, porep-c2-32g, "
            "partition 10/10, gpu {g}, 312.4 s")


class Fleet:
    """``agents`` bring-your-own agents on one store, sending on a simulated clock."""

    def __init__(self, db: str, env: dict[str, str], agents: int, t0: float) -> None:
        self.settings = Settings.from_env(env, db_path=db)
        self.store = Store(db, batch_max=self.settings.write_batch_max)
        self.rng = random.Random(3)
        self.ids = [f"ag_{i + 1:020x}" for i in range(agents)]
        self.seq = dict.fromkeys(self.ids, 0)
        self.logged = dict.fromkeys(self.ids, 0)
        self.teles = {g: telemetry(g, self.rng) for g in range(1, 9)}

        def job(tx: Tx) -> None:
            for i, agent_id in enumerate(self.ids):
                tx.agents.add(agent_id, label=f"sim-{i}", kind="byo", min_rate_per_hour=None,
                              issued_at=t0)
                hello = from_obj(Hello, hello_body(agent_id, gpus_of(i)))
                hello_job(agent_id, hello, self.settings, t0)(tx)

        self.store.write_blocking(job)

    def heartbeats(self, now: float) -> None:
        jobs = []
        for i, agent_id in enumerate(self.ids):
            self.seq[agent_id] += 1
            hb = from_obj(Heartbeat, heartbeat_body(
                self.seq[agent_id], now - 3600, self.seq[agent_id],
                self.teles[gpus_of(i)], []))
            jobs.append(heartbeat.heartbeat_job(agent_id, hb, self.settings, now))
        self.store.write_blocking(lambda tx: [j(tx) for j in jobs])

    def logs(self, now: float, lines: int) -> None:
        if lines <= 0:
            return
        jobs = []
        for i, agent_id in enumerate(self.ids):
            start = self.logged[agent_id]
            self.logged[agent_id] += lines
            batch = from_obj(LogBatch, {"lines": [
                {"ts": now, "source": "cuzk", "text": LOG_TEXT.format(n=n, g=i % 8)}
                for n in range(start, start + lines)]})
            jobs.append(agent_logs.logs_job(agent_id, batch, self.settings, now))
        self.store.write_blocking(lambda tx: [j(tx) for j in jobs])

    def results(self, now: float) -> None:
        jobs = []
        for i, agent_id in enumerate(self.ids):
            gpus = gpus_of(i)
            proofs = [round(self.rng.uniform(250, 400), 2) for _ in range(10)]
            result = from_obj(Result, {
                "result_id": f"res_{agent_id[-12:]}", "kind": "benchmark",
                "proof_type": "porep-c2-32g", "started_at": now - 3000, "finished_at": now,
                "gpus_used": list(range(gpus)), "proofs_completed": 10, "proofs_failed": 0,
                "wall_seconds": 3000.0, "rate_per_hour": 12.0, "proof_seconds": proofs,
                "telemetry": self.teles[gpus]})
            jobs.append(result_op.result_job(agent_id, result, self.settings, now))
        self.store.write_blocking(lambda tx: [j(tx) for j in jobs])

    def counts(self) -> dict[str, int]:
        return self.store.count_rows()

    def close(self) -> None:
        self.store.close()


def table_bytes(db: str) -> dict[str, int]:
    """Bytes of each table with its indexes (SQLite's dbstat), after a checkpoint."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        owner = dict(conn.execute("select name, tbl_name from sqlite_master").fetchall())
        sizes: dict[str, int] = {}
        for name, size in conn.execute("select name, sum(pgsize) from dbstat group by name"):
            table = owner.get(name, name)
            sizes[table] = sizes.get(table, 0) + int(size)
        return sizes
    finally:
        conn.close()


def simulate(db: str, env: dict[str, str], agents: int, hours: list[float], *, exact: bool,
             log_lines_per_hour: int) -> list[dict[str, Any]]:
    """Run the fleet; after each of ``hours`` (ascending) record counts and sizes."""
    t0 = 1_800_000_000.0
    fleet = Fleet(db, env, agents, t0)
    s = fleet.settings
    step = float(s.next_heartbeat_s) if exact else s.heartbeat_history_interval_s
    log_every = s.heartbeat_history_interval_s
    lines = round(log_lines_per_hour * log_every / 3600)
    snapshots = []
    t, next_log = t0, t0 + log_every
    results_at: float | None = t0 + 3600
    try:
        for h in hours:
            end = t0 + h * 3600
            while t < end:
                t += step
                fleet.heartbeats(t)
                if t >= next_log:
                    fleet.logs(t, lines)
                    next_log += log_every
                if results_at is not None and t >= results_at:
                    fleet.results(t)
                    results_at = None
            snapshots.append({"hours": h, "counts": fleet.counts(), "tables": table_bytes(db),
                              "file_bytes": file_bytes(db)})
    finally:
        fleet.close()
    reopened = Store(db)  # counted again once closed
    snapshots[-1]["counts"] = reopened.count_rows()
    reopened.close()
    return snapshots


def file_bytes(db: str) -> int:
    return sum(p.stat().st_size for p in Path(db).parent.glob(Path(db).name + "*"))


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (few agents, 2 h)")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--exact-agents", type=int, default=10,
                        help="agents run with every heartbeat of the day, to check the fleet run")
    parser.add_argument("--log-lines-per-hour", type=int, default=120)
    args = parser.parse_args()
    hours = [24.0, 25.0]  # the history is full at 24 h; an hour more shows it stays there
    if args.quick:
        args.agents, args.exact_agents, hours = 5, 2, [2.0, 3.0]
    workdir = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    env = {**os.environ, "VM_FLEET_SECRET": secrets.token_hex(32),
           "VM_ADMIN_TOKEN": "bench-admin-token-0123456789abcdef",
           "VM_CONFIG_DIR": str(workdir / "config")}
    try:
        began = time.perf_counter()
        exact = simulate(str(workdir / "exact.db"), env, args.exact_agents, hours[:1],
                         exact=True, log_lines_per_hour=args.log_lines_per_hour)
        strided = simulate(str(workdir / "strided.db"), env, args.exact_agents, hours[:1],
                           exact=False, log_lines_per_hour=args.log_lines_per_hour)
        same = exact[-1]["counts"] == strided[-1]["counts"]
        print(f"check, {args.exact_agents} agents over {hours[0]:g} h: every heartbeat "
              f"({exact[-1]['counts']['heartbeat_history']} history rows, "
              f"{mb(exact[-1]['file_bytes'])}) vs one per history interval "
              f"({strided[-1]['counts']['heartbeat_history']} rows, "
              f"{mb(strided[-1]['file_bytes'])}): row counts "
              f"{'identical' if same else 'DIFFER'}", flush=True)
        fleet = simulate(str(workdir / "fleet.db"), env, args.agents, hours, exact=False,
                         log_lines_per_hour=args.log_lines_per_hour)
        settings = Settings.from_env(env, db_path=str(workdir / "fleet.db"))
        for snap in fleet:
            c = snap["counts"]
            print(f"after {snap['hours']:g} h of {args.agents} agents: {mb(snap['file_bytes'])} "
                  f"on disk; history {c['heartbeat_history']} rows, logs {c['logs']} lines, "
                  f"results {c['results']}, events {c['events']}", flush=True)
        last = fleet[-1]
        tables, counts = last["tables"], last["counts"]
        print(f"database after {hours[-1]:g} h: {mb(last['file_bytes'])} on disk", flush=True)
        for name in sorted(tables, key=lambda k: -tables[k]):
            if tables[name] >= 8192:
                print(f"  {name:<20} {mb(tables[name]):>12}  ({counts.get(name, '-')} rows)")
        per_hist = tables.get("heartbeat_history", 0) / max(1, counts["heartbeat_history"])
        per_log = tables.get("logs", 0) / max(1, counts["logs"])
        hist_bound = args.agents * settings.heartbeat_history_rows * per_hist
        log_bound = args.agents * settings.log_lines_per_instance * per_log
        fixed = sum(v for k, v in tables.items() if k not in ("heartbeat_history", "logs"))
        print(f"bound from the retention settings, {args.agents} agents: history "
              f"{args.agents} x {settings.heartbeat_history_rows} rows x {per_hist:.0f} B = "
              f"{mb(hist_bound)}; logs {args.agents} x {settings.log_lines_per_instance} lines x "
              f"{per_log:.0f} B = {mb(log_bound)}; latest rows, results and events "
              f"{mb(fixed)} (they grow with instances and decisions, not with time): "
              f"{mb(hist_bound + log_bound + fixed)}", flush=True)
        full = all(n <= settings.heartbeat_history_rows * args.agents
                   for n in (s["counts"]["heartbeat_history"] for s in fleet))
        print(f"history within its bound at every snapshot: {full}; "
              f"took {time.perf_counter() - began:.0f} s", flush=True)
    finally:
        for p in sorted(workdir.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        workdir.rmdir()


if __name__ == "__main__":
    main()
