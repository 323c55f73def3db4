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
   realistic telemetry for each agent's own 1 to 8 GPUs (an agent's telemetry keeps
   its size from one heartbeat to the next, as a real host's does).
3. Alternates two ways, round by round: **as written** (what the coordinator
   does) and **rows dropped** (the floor: the same jobs, transactions and
   commits, with the heartbeats' held rows discarded before they reach SQLite).
   It prints the writer thread's CPU (its own CPU clock, user and system) per
   heartbeat for both and the ratio: what the rows themselves cost, measured in
   the same run on the same machine.

``--side-table`` alternates two stores instead, both as written: the database as the
coordinator keeps it, and a copy whose instances' per-heartbeat columns (the gauges and
the latest telemetry) live in a narrow table of their own keyed by the instance's id,
the held rows' views (``held.install``) made of it: what moving them off the wide
instance row would save the writer (docs/performance.md, "What a heartbeat's rows cost
the writer").

``--update-from`` alternates, on one store, the held rows written through their views (as
the coordinator writes them) and through the ``UPDATE ... FROM (VALUES ...)`` statement
they were written with before: what the views save the writer.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import shutil
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
from vast_manager.coordinator.store.reads import INSTANCE_TELEMETRY_COLUMNS  # noqa: E402
from vast_manager.coordinator.store.writer import Store  # noqa: E402
from vast_manager.coordinator.store.writes import held as held_module  # noqa: E402
from vast_manager.protocol.codec import from_obj  # noqa: E402
from vast_manager.protocol.messages import Heartbeat  # noqa: E402

#: The instance columns a steady heartbeat writes, which ``--side-table`` moves.
SIDE_COLUMNS = held_module.HEARTBEAT_COLUMNS + INSTANCE_TELEMETRY_COLUMNS
#: Telemetry windows drawn per GPU count (an agent's values change, its size barely).
WINDOWS_PER_SIZE = 16


def thread_cpu_s(clock: int) -> float:
    return time.clock_gettime(clock)


@functools.cache
def update_from(columns: tuple[str, ...], count: int) -> str:
    """The statement the held rows were written with before their views (``held.install``):
    ``count`` instances' ``columns`` from a ``VALUES`` list, which SQLite copies into two
    temporary tables before it updates a row."""
    cols = ("id", *columns)
    return (f"with u({', '.join(cols)}) as (values {held_module._values(len(cols), count)}) "
            f"update instances set {', '.join(f'{c} = u.{c}' for c in columns)} "
            "from u where instances.id = u.id")


def side_table_copy(db: str, copy: str) -> None:
    """``db`` copied to ``copy`` with ``SIDE_COLUMNS`` moved to ``instance_live`` (the
    instances' columns left null), both databases vacuumed alike."""
    shutil.copy(db, copy)
    cols = ", ".join(SIDE_COLUMNS)
    conn = sqlite3.connect(copy)
    conn.execute(f"create table instance_live (id integer primary key, {cols})")
    conn.execute(f"insert into instance_live (id, {cols}) select id, {cols} from instances")
    conn.execute(f"update instances set {', '.join(f'{c} = null' for c in SIDE_COLUMNS)}")
    conn.commit()
    for path in (db, copy):
        conn = sqlite3.connect(path)
        conn.execute("vacuum")
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--agents", type=int, default=50_000)
    ap.add_argument("--per-commit", type=int, default=60,
                    help="heartbeats a transaction (default 60: 20 ms at ~3,000/s)")
    ap.add_argument("--rounds", type=int, default=1500, help="rounds of each way")
    ap.add_argument("--side-table", action="store_true",
                    help="the instance row against a narrow table of the heartbeat's columns")
    ap.add_argument("--update-from", action="store_true",
                    help="the held rows through their views against UPDATE ... FROM (VALUES)")
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
    paths = {False: db, True: db}
    if args.side_table:
        paths[True] = str(workdir / "side.db")
        side_table_copy(db, paths[True])
    ways = (("instance row (as now)", "side table") if args.side_table
            else ("views (as now)", "UPDATE ... FROM") if args.update_from
            else ("rows as written", "rows dropped (floor)"))
    through_views = held_module._instances_update
    print(f"provisioned {args.agents} agents in {took:.1f} s; {args.per_commit} steady "
          f"heartbeats a transaction, {args.rounds} rounds each way, alternating", flush=True)
    settings = Settings.from_env(env, db_path=db)
    rng = random.Random(11)
    windows = {g: [from_obj(Heartbeat, load.heartbeat_body(
        0, time.time() - 3600, 100, load.telemetry(g, rng), []))
        for _ in range(WINDOWS_PER_SIZE)] for g in {load.gpus_of(i) for i in range(12)}}
    gpus = {agent_id: load.gpus_of(i) for i, agent_id in enumerate(ids)}

    second = [False]  # the round is the second way's
    write_held = held_module.Held.write

    def maybe_write(held: held_module.Held, conn: sqlite3.Connection) -> None:
        held_module._instances_update = (  # type: ignore[assignment]
            update_from if second[0] and args.update_from else through_views)
        if second[0] and not (args.side_table or args.update_from):
            held.clear()
        write_held(held, conn)

    held_module.Held.write = maybe_write  # type: ignore[method-assign,assignment]
    spent = {False: 0.0, True: 0.0}
    sent = {False: 0, True: 0}

    async def run() -> None:
        stores = {False: Store(paths[False], commit_window_s=0.0)}
        stores[True] = stores[False]
        if args.side_table:
            stores[True] = Store(paths[True], commit_window_s=0.0)
            # The held rows' views (``held.install``) of the narrow table instead.
            await stores[True].write(lambda tx: held_module.install(tx.db.conn, "instance_live"))
        # Each writer thread's own CPU clock (ns resolution; /proc's ticks are 10 ms).
        clocks = {k: time.pthread_getcpuclockid(s._thread.ident or 0) for k, s in stores.items()}
        seq = [1000]

        async def transaction(store: Store, agents: list[str]) -> None:
            jobs = []
            for agent_id in agents:
                seq[0] += 1
                hb = windows[gpus[agent_id]][seq[0] % WINDOWS_PER_SIZE]
                hb.seq = seq[0]
                jobs.append(store.write(heartbeat_job(agent_id, hb, settings, time.time())))
            await asyncio.gather(*jobs)

        try:
            for way in (False, True):  # every agent heard once, in each store
                second[0] = way
                for start in range(0, len(ids), args.per_commit):
                    await transaction(stores[way], ids[start:start + args.per_commit])
            for r in range(2 * args.rounds):
                way = second[0] = bool(r % 2)
                agents = [ids[rng.randrange(len(ids))] for _ in range(args.per_commit)]
                before = thread_cpu_s(clocks[way])
                await transaction(stores[way], agents)
                spent[way] += thread_cpu_s(clocks[way]) - before
                sent[way] += len(agents)
        finally:
            for store in {id(s): s for s in stores.values()}.values():
                store.close()

    try:
        asyncio.run(run())
    finally:
        held_module.Held.write = write_held  # type: ignore[method-assign]
        held_module._instances_update = through_views  # type: ignore[assignment]
        shutil.rmtree(workdir)
    first, other = (1e6 * spent[k] / sent[k] for k in (False, True))
    print(f"  writer CPU, {ways[0]:22s} {first:6.1f} us/heartbeat")
    print(f"  writer CPU, {ways[1]:22s} {other:6.1f} us/heartbeat")
    if args.side_table:
        print(f"  the side table saves {first - other:.1f} us a heartbeat "
              f"({100 * (first - other) / first:.0f}% of the writer's CPU)")
    elif args.update_from:
        print(f"  the views save {other - first:.1f} us a heartbeat "
              f"({100 * (other - first) / other:.0f}% of the writer's CPU with UPDATE ... FROM)")
    else:
        print(f"  ratio: {first / other:.2f}x the floor; the rows cost {first - other:.1f} us "
              "a heartbeat")


if __name__ == "__main__":
    main()
