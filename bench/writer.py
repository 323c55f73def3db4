"""The store writer's CPU per steady heartbeat, against the same jobs with nothing written.

Run: ``python bench/writer.py`` (~2 min: 50,000 agents; ``--quick`` for seconds).

What it does, in one command:

1. Builds a database of ``--agents`` agents through the store's write path
   (``bench/ingest.py``'s ``provision``: issue, hello, one heartbeat, one
   history row each), then sends every agent one more heartbeat, so the
   writer's caches are warm as in a fleet that has been running.
2. Runs rounds of ``--per-commit`` steady heartbeats of random agents (the
   real ``operations.heartbeat.heartbeat_job`` through ``Store.write``; one transaction a
   round, as a 20 ms commit window holds at ~3,000 heartbeats/s), with
   realistic telemetry for 1 to 8 GPUs.
3. Alternates two ways, round by round, on the same store: **as written**
   (what the coordinator does) and **rows dropped** (the floor: the same jobs,
   transactions and commits, with the heartbeats' held rows discarded before
   they reach SQLite). It prints the writer thread's CPU (its own CPU clock,
   user and system) per heartbeat for both and the ratio: what the rows
   themselves cost, measured in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import ingest as load  # noqa: E402  (bench/ingest.py: provisioning, bodies)

from vast_manager.coordinator.operations.heartbeat import heartbeat_job  # noqa: E402
from vast_manager.coordinator.settings import Settings  # noqa: E402
from vast_manager.coordinator.store.writer import Store  # noqa: E402
from vast_manager.coordinator.store.writes import held as held_module  # noqa: E402
from vast_manager.protocol.codec import from_obj  # noqa: E402
from vast_manager.protocol.messages import Heartbeat  # noqa: E402


def thread_cpu_s(clock: int) -> float:
    return time.clock_gettime(clock)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--agents", type=int, default=50_000)
    ap.add_argument("--per-commit", type=int, default=60,
                    help="heartbeats a transaction (default 60: 20 ms at ~3,000/s)")
    ap.add_argument("--rounds", type=int, default=1500, help="rounds of each way")
    ap.add_argument("--quick", action="store_true", help="2,000 agents, 40 rounds")
    args = ap.parse_args()
    if args.quick:
        args.agents, args.rounds = 2000, 40

    workdir = Path(tempfile.mkdtemp(prefix="bench-writer-"))
    db = str(workdir / "coord.db")
    env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": "writer-bench-token-0123456789",
           "VM_CONFIG_DIR": str(workdir / "config")}
    ids = [load.agent_id_for(i, "b0") for i in range(args.agents)]
    took = load.provision(db, env, ids)
    print(f"provisioned {args.agents} agents in {took:.1f} s; {args.per_commit} steady "
          f"heartbeats a transaction, {args.rounds} rounds each way, alternating", flush=True)
    settings = Settings.from_env(env, db_path=db)
    rng = random.Random(11)
    bodies = [from_obj(Heartbeat, load.heartbeat_body(
        0, time.time() - 3600, 100, load.telemetry(load.gpus_of(k), rng), []))
        for k in range(2000)]

    drop = [False]
    write_held = held_module.Held.write

    def maybe_write(held: held_module.Held, conn: sqlite3.Connection) -> None:
        if drop[0]:
            held.clear()
        write_held(held, conn)

    held_module.Held.write = maybe_write  # type: ignore[method-assign,assignment]
    spent = {False: 0.0, True: 0.0}
    sent = {False: 0, True: 0}

    async def run() -> None:
        store = Store(db, commit_window_s=0.0)
        assert store._thread.ident is not None
        # The writer thread's own CPU clock (ns resolution; /proc's ticks are 10 ms).
        writer = time.pthread_getcpuclockid(store._thread.ident)
        seq = [1000]

        async def transaction(agents: list[str]) -> None:
            jobs = []
            for agent_id in agents:
                seq[0] += 1
                hb = bodies[seq[0] % len(bodies)]
                hb.seq = seq[0]
                jobs.append(store.write(heartbeat_job(agent_id, hb, settings,
                                                             time.time())))
            await asyncio.gather(*jobs)

        try:
            for start in range(0, len(ids), args.per_commit):  # every agent heard once
                await transaction(ids[start:start + args.per_commit])
            for r in range(2 * args.rounds):
                drop[0] = bool(r % 2)
                agents = [ids[rng.randrange(len(ids))] for _ in range(args.per_commit)]
                before = thread_cpu_s(writer)
                await transaction(agents)
                spent[drop[0]] += thread_cpu_s(writer) - before
                sent[drop[0]] += len(agents)
        finally:
            store.close()

    try:
        asyncio.run(run())
    finally:
        held_module.Held.write = write_held  # type: ignore[method-assign]
        for p in sorted(workdir.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        workdir.rmdir()
    written = 1e6 * spent[False] / sent[False]
    floor = 1e6 * spent[True] / sent[True]
    print(f"  writer CPU, rows as written     {written:6.1f} us/heartbeat")
    print(f"  writer CPU, rows dropped (floor) {floor:5.1f} us/heartbeat")
    print(f"  ratio: {written / floor:.2f}x the floor; the rows cost {written - floor:.1f} us "
          "a heartbeat")


if __name__ == "__main__":
    main()
