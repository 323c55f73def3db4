"""Replication's cost and a restore's time (docs/performance.md, "Replication").

Run: ``python bench/replica.py`` (``--quick`` for a seconds-long smoke run).

1. Heartbeat ingest at saturation, replication off, then on (``VM_REPLICA_URL`` a
   folder: the real Litestream beside the database), in one run on one database of
   ``--agents`` agents: the coordinator as ``vast-manager serve`` runs it and the
   closed-loop generators of ``bench/ingest.py``. Printed for both: heartbeats/s, p99,
   and CPU per heartbeat: the coordinator's process, plus Litestream's with replication
   on. The ratio on/off is the figure (goal: at most 1.2x).
2. Restore: a database of ``--results`` result rows (written straight into the
   coordinator's schema, each row shaped as a 12-proof benchmark stores it) replicated
   to a folder, then ``vast-manager restore``'s core (``store.restore.restore``:
   Litestream's restore and ``PRAGMA integrity_check``) timed into a new path.

Everything it starts is stopped; its work folder is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

_spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
assert _spec is not None and _spec.loader is not None
ingest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ingest)


def litestream_cpu_s(server: Any) -> float:
    """CPU seconds of the coordinator's Litestream child (0 without one)."""
    total = 0.0
    for child in psutil.Process(server.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if child.name() == "litestream":
                times = child.cpu_times()
                total += times.user + times.system
    return total


def saturation(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    secret = secrets.token_bytes(32)
    salt = secrets.token_hex(4)
    env = {**os.environ, "VM_FLEET_SECRET": secret.hex(), "VM_ADMIN_TOKEN": ingest.ADMIN_TOKEN,
           "VM_DB_PATH": str(workdir / "coord.db"), "VM_CONFIG_DIR": str(workdir / "config"),
           "VM_HOST": "127.0.0.1", "VM_PORT": "0", "PYTHONPATH": str(ROOT / "src"),
           "BENCH_GC": "serve", "BENCH_SWITCH_MS": ""}
    env.pop("VM_REPLICA_URL", None)
    ids = [ingest.agent_id_for(i, salt) for i in range(args.agents)]
    took = ingest.provision(env["VM_DB_PATH"], env, ids, fleet_agents=args.agents)
    print(f"provisioned {len(ids)} agents in {took:.1f} s", flush=True)
    agents = [[a, ingest.key_for(secret, a).hex(), ingest.gpus_of(i), 1, 0.0]
              for i, a in enumerate(ids)]
    out: dict[str, Any] = {"agents": args.agents, "seconds": args.seconds}
    for name, replica in (("off", None), ("on", str(workdir / "replica"))):
        run_env = dict(env)
        if replica:
            run_env["VM_REPLICA_URL"] = replica
        coord = ingest.ServerProcess("coordinator", workdir, run_env)
        try:
            ls0 = litestream_cpu_s(coord)
            r = ingest.drive(coord.url, workdir, agents, mode="closed", workers=args.workers,
                             duration=args.seconds, concurrency=args.concurrency,
                             connections=args.concurrency, check_signature=True, server=coord)
            ls_s = litestream_cpu_s(coord) - ls0
        finally:
            coord.stop()
        accepted = max(1, r["accepted"])
        r["litestream_cpu_s"] = ls_s
        r["cpu_us_per_hb"] = 1e6 * (r["server_cpu_s"] + ls_s) / accepted
        out[name] = r
        print(f"  replication {name:<3} {r['per_s']:7.0f} hb/s   p99 {r['p99_ms']:6.1f} ms   "
              f"CPU {r['cpu_us_per_hb']:5.0f} us/hb (Litestream {1e6 * ls_s / accepted:.0f}) "
              f"  lost {r['counts'].get('lost', 0)}, refused {r['counts'].get('refused', 0)}",
              flush=True)
        bump = int(r["counts"].get("sent", 0)) + 10  # the next run's seq goes on
        for a in agents:
            a[3] += bump
    out["cpu_ratio"] = out["on"]["cpu_us_per_hb"] / out["off"]["cpu_us_per_hb"]
    out["p99_ratio"] = out["on"]["p99_ms"] / out["off"]["p99_ms"]
    out["throughput_ratio"] = out["on"]["per_s"] / out["off"]["per_s"]
    print(f"  ratio on/off: CPU per heartbeat {out['cpu_ratio']:.2f}x (goal <= 1.2x), "
          f"p99 {out['p99_ratio']:.2f}x, throughput {out['throughput_ratio']:.2f}x", flush=True)
    return out


def _results_db(path: Path, n: int) -> None:
    """``n`` result rows in the coordinator's schema, as a 12-proof benchmark stores one."""
    from vast_manager.coordinator.store.writer import Store

    Store(str(path)).close()
    proof_seconds = json.dumps([round(180.0 + i * 1.7, 3) for i in range(12)])
    directive = json.dumps({"action": "continue", "reason": "", "next_heartbeat_s": 60,
                            "min_rate_per_hour": 20.5, "benchmark_id": None})
    telemetry = json.dumps({"window_s": 1200.0, "samples": 1200, "gpus": [{
        "index": 0, "util_pct_mean": 96.1, "util_pct_max": 100.0, "mem_used_bytes": 2 ** 34,
        "pcie_tx_kbps_mean": 1.2e6, "pcie_rx_kbps_mean": 3.4e6, "power_w_mean": 410.2,
        "temp_c_max": 71.0, "sm_clock_mhz_mean": 2520.0, "throttle_reasons": 0}],
        "cpu": {"util_pct_mean": 41.0, "per_core_util_pct_mean": [40.0] * 32, "load1": 12.1,
                "iowait_pct_mean": 0.4}, "ram": {"used_bytes": 2 ** 36, "total_bytes": 2 ** 38},
        "net": {"rx_bytes_per_s": 1.1e5, "tx_bytes_per_s": 2.2e4}})
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        chunk = 20_000
        for start in range(0, n, chunk):
            rows = [(f"ag_{i % 5000:020x}", f"res_{i:032x}", i % 5000 + 1, "benchmark",
                     "porep-c2-32g", 1.8e9 + i, 1.8e9 + i + 1200.0, "[0]", 12, 0, 1200.0, 36.0,
                     36.0, proof_seconds, telemetry, "[]", 1, "keep", "measured",
                     directive, str(i % 5000), "RTX 4090", 1, 1.8e9 + i + 1201.0)
                    for i in range(start, min(n, start + chunk))]
            db.executemany(
                "insert into results (agent_id, result_id, instance_id, kind, proof_type, "
                "started_at, finished_at, gpus_used_json, proofs_completed, proofs_failed, "
                "wall_seconds, rate_per_hour, recomputed_rate_per_hour, proof_seconds_json, "
                "telemetry_json, flag_reasons_json, counts_for_host_perf, verdict, "
                "verdict_reason, directive_json, machine_id, gpu_name, num_gpus, received_at) "
                "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows)
            db.commit()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def restore_time(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from vast_manager.coordinator.store.replica import Replicator
    from vast_manager.coordinator.store.restore import restore

    db, rep = workdir / "big.db", workdir / "big-replica"
    began = time.perf_counter()
    _results_db(db, args.results)
    size = db.stat().st_size
    print(f"restore: {args.results} results written in {time.perf_counter() - began:.0f} s "
          f"({size / 1e6:.0f} MB)", flush=True)

    async def replicate() -> float:
        replicator = Replicator(str(db), str(rep), time.time)
        t0 = time.perf_counter()
        await replicator.start()  # the first confirmed sync
        await replicator.sync(timeout_s=900)  # the whole database in the replica
        took = time.perf_counter() - t0
        await replicator.stop()
        return took

    first_sync_s = asyncio.run(replicate())
    replica_bytes = sum(p.stat().st_size for p in rep.rglob("*") if p.is_file())
    done = restore(str(rep), str(workdir / "restored.db"))
    print(f"  first replication {first_sync_s:.1f} s (replica {replica_bytes / 1e6:.0f} MB); "
          f"restore with integrity_check {done.seconds:.1f} s ({done.results} results, "
          f"{done.size_bytes / 1e6:.0f} MB)", flush=True)
    return {"results": done.results, "db_bytes": size, "replica_bytes": replica_bytes,
            "first_sync_s": first_sync_s, "restore_s": done.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    parser.add_argument("--agents", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=15.0, help="each saturation window")
    parser.add_argument("--workers", type=int, default=2, help="load-generator processes")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--results", type=int, default=1_000_000)
    parser.add_argument("--skip-restore", action="store_true")
    parser.add_argument("--json-out", help="also write the figures as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.seconds, args.results = 200, 3.0, 20_000
    workdir = Path(tempfile.mkdtemp(prefix="bench-replica-"))
    try:
        out = {"saturation": saturation(args, workdir)}
        if not args.skip_restore:
            out["restore"] = restore_time(args, workdir)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=2))
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
