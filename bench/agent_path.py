"""A heartbeat's CPU on the agents' own path against the application's, in one process.

Run: ``python bench/agent_path.py`` (~1 min; ``--heartbeats`` for more or fewer,
``--quick`` for seconds).

The coordinator runs as ``vast-manager serve`` runs it (``start_server``, its default
settings) on a database of ``--agents`` agents provisioned as ``bench/ingest.py`` does;
signed heartbeats (the same bodies as that bench's) reach it through in-memory transports
(64 connections, one heartbeat in flight on each), so no socket, no load generator and no
other process is measured. Blocks of 2,000 heartbeats alternate between the plain path
``/v1/heartbeat`` (served by ``agent_api.serve_agents_first``, before the application)
and ``/v1/heartbeat?via=app`` (a query keeps a request off that path: the application's
router, middleware and response signal serve it, as every heartbeat was served before).
It prints the event-loop thread's and the whole process's CPU per heartbeat in each, the
least and the median over the blocks: on a shared machine the two ways meet the same load,
block by block, so their difference is what the application's layers cost a heartbeat.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import ingest as load  # noqa: E402  (bench/ingest.py: provisioning, bodies)

BLOCK = 2000
CONNECTIONS = 64
WAYS = ("agents' path", "through the app")


def _request(agent_id: str, key: bytes, body: bytes, ts: str, path: str) -> bytes:
    nonce = secrets.token_hex(16)
    canonical = (f"vm1-req\n{ts}\n{nonce}\nPOST\n{path}\n"
                 f"{hashlib.sha256(body).hexdigest()}").encode()
    headers = {"Host": "127.0.0.1", "Content-Length": str(len(body)), "X-VM-Agent": agent_id,
               "X-VM-Timestamp": ts, "X-VM-Nonce": nonce,
               "X-VM-Signature": "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest(),
               "Content-Type": "application/json"}
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (head + "\r\n").encode() + body


class _Connection(asyncio.Transport):
    """One keep-alive connection in memory: each whole answer sends the next request."""

    def __init__(self, run: _Run) -> None:
        super().__init__()
        self.run = run
        self.protocol: Any = run.factory()
        self.buffer = b""
        self.protocol.connection_made(self)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000),
                "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: Any) -> None:
        self.buffer += bytes(data)
        self._answered()

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(bytes(x) for x in lines))

    def _answered(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode()
        length = next((int(line.split(":")[1]) for line in head.split("\r\n")
                       if line.lower().startswith("content-length:")), 0)
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length:]
        self.run.answered(head.startswith("HTTP/1.1 200"))
        self.send()

    def send(self) -> None:
        request = self.run.next_request()
        if request is not None:
            asyncio.get_running_loop().call_soon(self.protocol.data_received, request)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Run:
    def __init__(self, factory: Any, requests: list[bytes], warm: int) -> None:
        self.factory, self.requests, self.warm = factory, requests, warm
        self.sent = self.done = self.refused = 0
        self.marks: list[tuple[float, float]] = []
        self.finished = asyncio.get_running_loop().create_future()

    def next_request(self) -> bytes | None:
        if self.sent >= len(self.requests):
            return None
        self.sent += 1
        return self.requests[self.sent - 1]

    def answered(self, ok: bool) -> None:
        self.done += 1
        self.refused += not ok
        if self.done >= self.warm and (self.done - self.warm) % BLOCK == 0:
            self.marks.append((time.thread_time(), time.process_time()))
        if self.done == len(self.requests) - CONNECTIONS and not self.finished.done():
            self.finished.set_result(None)


async def _serve(env: dict[str, str], requests: list[bytes], warm: int) -> _Run:
    from vast_manager.coordinator.providers.factory import make_provider
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.web.server import start_server, tune_gc, tune_switch_interval

    settings = Settings.from_env(env)
    provider = make_provider(settings, "local")
    server = await start_server(settings, provider)
    tune_gc()  # as `vast-manager serve` does
    tune_switch_interval()
    try:
        assert server.runner.server is not None
        run = _Run(server.runner.server, requests, warm)
        connections = [_Connection(run) for _ in range(CONNECTIONS)]
        for c in connections:
            c.send()
        await run.finished
        for c in connections:
            c.protocol.connection_lost(None)
        return run
    finally:
        await server.stop()
        await provider.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=2000)
    ap.add_argument("--heartbeats", type=int, default=40_000, help="measured, both ways")
    ap.add_argument("--warm", type=int, default=6000, help="uncounted first heartbeats")
    ap.add_argument("--quick", action="store_true", help="200 agents, 4 blocks: seconds")
    args = ap.parse_args()
    if args.quick:
        args.agents, args.heartbeats, args.warm = 200, 4 * BLOCK, 500
    work = Path(tempfile.mkdtemp(prefix="bench-agent-path-"))
    secret, salt = secrets.token_bytes(32), secrets.token_hex(4)
    env = {**os.environ, "VM_FLEET_SECRET": secret.hex(), "VM_ADMIN_TOKEN": load.ADMIN_TOKEN,
           "VM_DB_PATH": str(work / "coord.db"), "VM_CONFIG_DIR": str(work / "config"),
           "VM_HOST": "127.0.0.1", "VM_PORT": "0"}
    ids = [load.agent_id_for(i, salt) for i in range(args.agents)]
    load.provision(env["VM_DB_PATH"], env, ids, fleet_agents=args.agents)
    rng = random.Random(3)
    teles = {g: load.telemetry(g, rng) for g in range(1, 9)}
    keys = [load.key_for(secret, a) for a in ids]
    seqs = [10] * args.agents
    # Signed for a second after the coordinator starts (it refuses earlier timestamps),
    # within the accepted window for the whole run.
    ts = str(int(time.time()) + 90)
    blocks = -(-args.heartbeats // BLOCK)
    requests = []
    for n in range(args.warm + blocks * BLOCK + CONNECTIONS):
        i = n % args.agents
        seqs[i] += 1
        recent = [round(rng.uniform(250, 400), 2)] if seqs[i] % 5 == 0 else []
        body = orjson.dumps(load.heartbeat_body(seqs[i], time.time() - 3600, 100 + seqs[i],
                                                teles[load.gpus_of(i)], recent))
        through_app = n >= args.warm and ((n - args.warm) // BLOCK) % 2 == 1
        path = "/v1/heartbeat?via=app" if through_app else "/v1/heartbeat"
        requests.append(_request(ids[i], keys[i], body, ts, path))
    run = asyncio.run(_serve(env, requests, args.warm))
    if run.refused:
        raise SystemExit(f"{run.refused} heartbeats were not answered 200")
    marks = run.marks
    per_block = [(1e6 * (b[0] - a[0]) / BLOCK, 1e6 * (b[1] - a[1]) / BLOCK)
                 for a, b in itertools.pairwise(marks)]
    print(f"{args.agents} agents, {len(per_block)} blocks of {BLOCK} heartbeats, the two ways "
          f"in turn; CPU per heartbeat (us), least / median over the blocks:")
    medians = []
    for way, name in enumerate(WAYS):
        loop_us = sorted(b[0] for b in per_block[way::2])
        proc_us = sorted(b[1] for b in per_block[way::2])
        medians.append((loop_us[len(loop_us) // 2], proc_us[len(proc_us) // 2]))
        print(f"  {name:16s} event loop {loop_us[0]:6.1f} / {medians[-1][0]:6.1f}   "
              f"process {proc_us[0]:6.1f} / {medians[-1][1]:6.1f}")
    print(f"  the application's layers, median: {medians[1][0] - medians[0][0]:.1f} us on the "
          f"event loop, {medians[1][1] - medians[0][1]:.1f} us in the process")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
