"""Heartbeat latency with the cluster source reading, healthy and slow, against none.

Run: ``python bench/cluster_heartbeats.py [--agents 40] [--seconds 10] [--repeats 3]``
(``--quick``: 10 agents, one run of 4 s each). Needs Debian's ``postgresql`` package (a
throwaway server, as the tests start it, with Curio's tables by Curio's own migrations).

One coordinator at a time (``create_app`` with its loops running on the real clock: the
monitor every 0.5 s, and with a source its read in its own task at the same interval),
``--agents`` bring-your-own agents proving, and ``--senders`` concurrent senders posting
their signed heartbeats back to back for ``--seconds``. Three variants, run in turn
``--repeats`` times:

- **none**: no ``VM_CURIO_DB_URL`` (the baseline);
- **reading**: the source set, every agent a Curio node with an hour of task rows, read
  every round (and the round's matching on its worker thread);
- **slow**: the same, while another session holds ``harmony_task_history`` locked, so every
  read waits for ``VM_CURIO_READ_TIMEOUT_S`` (1 s) and fails into the alert.

Printed per variant, medians over its runs: heartbeats answered, p50 and p99 latency, and p99
against the baseline's (the bar: within 10%). The PostgreSQL server runs on the same machine
here (in production the cluster's database is elsewhere): its CPU for each read is in the
figures. Every figure is this run's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from vast_manager.coordinator.decisions.attribution import node_name  # noqa: E402
from vast_manager.coordinator.store.writer import Store  # noqa: E402
from vast_manager.coordinator.web.app import create_app  # noqa: E402

from support.coord_support import Agent, Harness, make_settings  # noqa: E402
from support.fakes_provider import FakeProvider  # noqa: E402
from support.postgres import (  # noqa: E402
    PostgresServer,
    find_bin_dir,
    record_tasks,
    register_node,
)

NAMES = ("none", "reading", "slow")


async def _agents(h: Harness, n: int) -> list[Agent]:
    agents = []
    for i in range(n):
        agent = await h.issue(f"rig-{i}")
        status, _ = await agent.hello()
        assert status == 200
        status, _ = await agent.heartbeat("proving")
        assert status == 200
        agents.append(agent)
    return agents


async def _load(agents: list[Agent], senders: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def sender(k: int) -> None:
        i = k
        while time.monotonic() < end:
            agent = agents[i % len(agents)]
            i += senders
            t0 = time.perf_counter()
            status, _ = await agent.heartbeat("proving")
            latencies.append((time.perf_counter() - t0) * 1000)
            assert status == 200, status

    await asyncio.gather(*(sender(k) for k in range(senders)))
    return latencies


async def one_run(name: str, pg: PostgresServer | None, args: argparse.Namespace,
                  workdir: Path) -> list[float]:
    settings: dict[str, Any] = {"monitor_interval_s": 0.5}
    if pg is not None:
        settings.update(curio_db_url=pg.reader_url, curio_read_timeout_s=1.0)
    store = Store(workdir / f"{name}.db")
    app = create_app(make_settings(workdir / name, **settings), store, FakeProvider(),
                     time.time, run_monitor=True)
    client = TestClient(TestServer(app))
    await client.start_server()
    blocker = None
    try:
        await asyncio.sleep(1.1)  # signed timestamps must be past the start second
        h = Harness(client, time.time, FakeProvider())  # type: ignore[arg-type]
        agents = await _agents(h, args.agents)
        if pg is not None:
            conn = await pg.admin()
            now = time.time()
            for ident in range(1, args.agents + 1):
                address = f"203.0.113.{ident % 250}:{40000 + ident}"
                await register_node(conn, node_name(ident), address)
                await record_tasks(conn, address, [now - 120 * k for k in range(30)])
            await conn.close()
        if name == "slow" and pg is not None:
            blocker = await pg.admin()
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("LOCK TABLE harmony_task_history IN ACCESS EXCLUSIVE MODE")
        latencies = await _load(agents, args.senders, args.seconds)
        cluster = h.core.monitor.cluster
        if pg is not None:
            assert (cluster.alert is None) == (name == "reading"), cluster.alert
        return latencies
    finally:
        if blocker is not None:
            await blocker.close()
        await client.close()
        store.close()


async def run(args: argparse.Namespace) -> int:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        print("postgresql is not installed (apt-get install -y postgresql)", file=sys.stderr)
        return 2
    server = PostgresServer(bin_dir)
    try:
        server.start()
        await server.prepare()
        runs: dict[str, list[tuple[int, float, float]]] = {n: [] for n in NAMES}
        with tempfile.TemporaryDirectory(prefix="vm-bench-") as tmp:
            # Interleaved, so a machine shared with other work loads each variant alike.
            for repeat in range(args.repeats):
                for name in NAMES:
                    lat = sorted(await one_run(name, None if name == "none" else server,
                                               args, Path(tmp) / str(repeat)))
                    runs[name].append((len(lat), statistics.median(lat),
                                       lat[int(0.99 * (len(lat) - 1))]))
                    # Each source run starts from Curio's empty tables.
                    conn = await server.admin()
                    await conn.execute("TRUNCATE harmony_task_history, harmony_machines "
                                       "CASCADE")
                    await conn.close()
        base_p99 = statistics.median(p99 for _, _, p99 in runs["none"])
        print(f"{args.repeats} interleaved run(s) of each, {args.seconds:g} s, "
              f"{args.agents} agents, {args.senders} senders; medians over the runs:")
        for name in NAMES:
            n = statistics.median(c for c, _, _ in runs[name])
            p50 = statistics.median(m for _, m, _ in runs[name])
            p99 = statistics.median(q for _, _, q in runs[name])
            print(f"{name:8s} {n:8.0f} heartbeats  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
                  f"p99/baseline {p99 / base_p99:5.2f}")
        return 0
    finally:
        server.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=40)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 agents, 4 s a run")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.seconds, args.repeats = 10, 4.0, 1
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
