"""Heartbeat ingest of a real coordinator process over loopback, against a bare aiohttp ceiling.

Run: ``python bench/ingest.py`` (``--quick`` for a seconds-long smoke run;
``--help`` for the knobs).

What it does, in one command:

1. Builds a fresh database and provisions a fleet: most agents are inserted
   through the store's own write path (``Tx.agents.add``, then the real
   ``operations.hello.hello_job`` and ``operations.heartbeat.heartbeat_job``, answered the pace a
   coordinator sets for the fleet), and ``--http-agents`` of them are issued
   through ``POST /api/agents`` and say hello over HTTP. Each agent has 1 to
   8 GPUs; one history row per agent is placed at a random point of the
   history interval, so heartbeats land in the downsampled history at their
   natural rate.
2. Starts the coordinator as its own process (``--role coordinator``: a small
   launcher around ``coordinator.web.server.start_server``, the code
   ``vast-manager serve`` runs, with its default settings unless ``--budget``
   or ``--base-pace`` say) on 127.0.0.1, and a bare aiohttp app (``--role
   bare``) that reads the body and answers a fixed ``200``.
3. Saturation (closed loop): ``--workers`` load-generator processes, each
   with ``--concurrency`` requests in flight, send signed heartbeats with
   realistic telemetry as fast as the server answers, first to the bare app,
   then to the coordinator. Printed for both: accepted heartbeats/s, p50/p99
   latency, and the server's CPU seconds per request (utime + stime of its
   process from ``/proc/<pid>/stat``, all threads, read before and after the
   load window), and the coordinator/bare ratio.
4. Fleets at the coordinator's pace (open loop), one rung per fleet size
   (``--fleets``; ``--ladder``: 25,000 to 200,000 agents): the coordinator is
   restarted on a database of exactly that many agents, one heartbeat asks
   it the pace, and every agent sends its first heartbeat at its own slot
   within that pace (as in a fleet that has been running), then each next one
   when the ``next_heartbeat_s`` of its latest signed answer says, as the agent
   does. After ``--warmup-s`` (uncounted), the window lasts one pace
   (``--window-s``), so every agent of the fleet is heard in it. A heartbeat
   is lost when the request fails, refused when the answer is not ``200``;
   an instance is lost when the coordinator marked it so. Latency counts
   from the heartbeat's scheduled time (a generator that falls behind shows
   up as latency). The bar: nothing lost or refused, p99 < 100 ms, at least
   98% of the scheduled heartbeats sent within the window. The bare app,
   restarted to answer the same pace, runs the same fleet for at most
   ``--bare-seconds``: the CPU per heartbeat at the same rate. The run names
   the largest fleet that met the bar on this machine, with the pace the
   coordinator set and the coordinator's and the generators' share of the
   machine's CPU.

Every process it starts is stopped (SIGTERM, then SIGKILL after 10 s) in a
``finally``; every loop is bounded by the run's duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import heapq
import hmac
import json
import os
import random
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"
HEARTBEAT_PATH = "/v1/heartbeat"
LADDER = (25_000, 50_000, 100_000, 150_000, 200_000)  # agents, one rung each
BAR_P99_MS = 100.0
BAR_SENT_FRACTION = 0.98
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
#: ``--pin``: the CPUs each kind of process may run on (``BENCH_CPUS`` in its environment).
PINNED: dict[str, str] = {}


def pinned_env(env: dict[str, str], kind: str) -> dict[str, str]:
    """``env`` for a process of ``kind`` (``server`` or ``generator``): with ``--pin``, the
    CPUs it is held to, which the process applies to itself before anything else."""
    return {**env, "BENCH_CPUS": PINNED[kind]} if kind in PINNED else env


# --- messages ----------------------------------------------------------------------


def hello_body(agent_id: str, gpus: int) -> dict[str, Any]:
    return {
        "protocol": 1,
        "agent_version": "0.1.0",
        "boot_id": f"boot-{agent_id[-8:]}",
        "container_id": None,
        "host": {
            "hostname": f"host-{agent_id[-6:]}",
            "cpu_model": "AMD EPYC 7K62 48-Core Processor",
            "cpu_cores_logical": cores_for(gpus),
            "cpu_cores_physical": cores_for(gpus) // 2,
            "ram_total_bytes": 64_000_000_000 * gpus,
            "driver_version": "570.133.07",
            "cuda_version": "12.8",
            "gpus": [
                {"index": i, "uuid": f"GPU-{agent_id[-8:]}-{i}", "name": "NVIDIA GeForce RTX 4090",
                 "memory_total_bytes": 25_757_220_864, "pcie_gen_max": 4, "pcie_width_max": 16,
                 "pcie_gen_current": 4, "pcie_width_current": 16}
                for i in range(gpus)
            ],
        },
    }


def cores_for(gpus: int) -> int:
    return min(128, 16 * gpus)


def telemetry(gpus: int, rng: random.Random) -> dict[str, Any]:
    """A 15 s telemetry window of a busy host with ``gpus`` GPUs, as the agent sends it."""
    cores = cores_for(gpus)
    return {
        "window_s": 15.0,
        "samples": 15,
        "gpus": [
            {"index": i, "util_pct_mean": round(rng.uniform(85, 99), 2), "util_pct_max": 100.0,
             "mem_used_bytes": rng.randrange(18_000_000_000, 24_000_000_000),
             "pcie_tx_kbps_mean": round(rng.uniform(8e5, 1.5e6), 1),
             "pcie_rx_kbps_mean": round(rng.uniform(4e6, 6e6), 1),
             "power_w_mean": round(rng.uniform(380, 440), 1),
             "temp_c_max": float(rng.randint(60, 80)),
             "sm_clock_mhz_mean": round(rng.uniform(2400, 2600), 1), "throttle_reasons": 4,
             "pcie_gen_current": 4, "pcie_width_current": 16}
            for i in range(gpus)
        ],
        "cpu": {"util_pct_mean": round(rng.uniform(30, 60), 2),
                "per_core_util_pct_mean": [round(rng.uniform(10, 90), 1) for _ in range(cores)],
                "load1": round(rng.uniform(5, 30), 2), "iowait_pct_mean": 0.4},
        "ram": {"used_bytes": 40_000_000_000 * gpus, "total_bytes": 64_000_000_000 * gpus},
        "net": {"rx_bytes_per_s": 1_200_000.0, "tx_bytes_per_s": 300_000.0},
    }


def heartbeat_body(seq: int, started_at: float, total: int, tele: dict[str, Any],
                   recent: list[float]) -> dict[str, Any]:
    return {
        "seq": seq,
        "phase": "proving",
        "phase_started_at": started_at,
        "progress": None,
        "proofs_completed_total": total,
        "proof_seconds_recent": recent,
        "telemetry": tele,
    }


def gpus_of(index: int) -> int:
    """1 to 8 GPUs, weighted like a rented fleet (mostly 1, 2, 4 and 8)."""
    return (1, 1, 2, 2, 4, 4, 8, 3, 1, 2, 6, 8)[index % 12]


def agent_id_for(index: int, salt: str) -> str:
    return "ag_" + hashlib.sha256(f"{salt}:{index}".encode()).hexdigest()[:20]


def key_for(secret: bytes, agent_id: str) -> bytes:
    return hmac.new(secret, b"vast-manager agent key v1:" + agent_id.encode(),
                    hashlib.sha256).digest()


def sign_headers(agent_id: str, key: bytes, body: bytes, nonce: str) -> dict[str, str]:
    ts = str(int(time.time()))
    canonical = (f"vm1-req\n{ts}\n{nonce}\nPOST\n{HEARTBEAT_PATH}\n"
                 f"{hashlib.sha256(body).hexdigest()}").encode()
    return {
        "X-VM-Agent": agent_id,
        "X-VM-Timestamp": ts,
        "X-VM-Nonce": nonce,
        "X-VM-Signature": "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest(),
        "Content-Type": "application/json",
    }


# --- provisioning --------------------------------------------------------------------


def provision(db_path: str, env: dict[str, str], ids: list[str], first_seq: int = 1, *,
              first_index: int = 0, fleet_agents: int = 0) -> float:
    """Insert agents through the store's write path: issue, hello, one heartbeat (answered
    the pace of a fleet of ``fleet_agents``, stored as the pace their silence is timed on),
    and one history row placed at a random point of the history interval. ``first_index``:
    the index of ``ids[0]`` in the whole fleet. Returns seconds taken."""
    from vast_manager.coordinator.decisions.pace import FleetLoad
    from vast_manager.coordinator.operations.heartbeat import heartbeat_job
    from vast_manager.coordinator.operations.hello import hello_job
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.store.writer import Store, Tx
    from vast_manager.protocol.codec import from_obj
    from vast_manager.protocol.messages import Heartbeat, Hello

    settings = Settings.from_env(env, db_path=db_path)
    fleet = FleetLoad(steady=fleet_agents)
    rng = random.Random(7 + first_index)
    began = time.perf_counter()
    store = Store(db_path, batch_max=settings.write_batch_max)
    try:
        chunk = 2000
        for start in range(0, len(ids), chunk):
            part = list(enumerate(ids[start:start + chunk], start=first_index + start))
            now = time.time()

            def job(tx: Tx, part: list[tuple[int, str]] = part, now: float = now) -> None:
                for index, agent_id in part:
                    gpus = gpus_of(index)
                    tx.agents.add(agent_id, label=f"bench-{index}", kind="byo",
                                  min_rate_per_hour=None, issued_at=now)
                    hello = from_obj(Hello, hello_body(agent_id, gpus))
                    hello_job(agent_id, hello, settings, now, fleet)(tx)
                    hb = from_obj(Heartbeat, heartbeat_body(
                        first_seq, now - 3600, 100, telemetry(gpus, rng), []))
                    heartbeat_job(agent_id, hb, settings, now, fleet)(tx)
                    # The next history row of this agent is due somewhere in the coming
                    # interval, as in a fleet that has been running for a while: the
                    # heartbeat's row, moved back to a random point of the last interval.
                    at = now - rng.uniform(0, settings.heartbeat_history_interval_s)
                    tx.db.execute("update heartbeat_history set received_at = ?, seq = 0, "
                                  "telemetry_json = null where agent_id = ?", (at, agent_id))

            store.write_blocking(job)
    finally:
        store.close()
    return time.perf_counter() - began


# --- server processes ----------------------------------------------------------------


def role_coordinator(ready_file: str) -> None:
    """The coordinator as ``vast-manager serve`` runs it (start_server), on port 0."""
    from vast_manager.coordinator.providers.factory import make_provider
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.web.server import start_server, tune_gc, tune_switch_interval

    settings = Settings.from_env(os.environ)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}  # seconds, per generation
    began = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - began[0])

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        provider = make_provider(settings, "local")
        server = await start_server(settings, provider)
        mode = os.environ.get("BENCH_GC", "serve")
        if mode == "serve":
            tune_gc()  # as `vast-manager serve` does
        elif mode == "off":
            gc.disable()
        switch_ms = os.environ.get("BENCH_SWITCH_MS", "")
        if switch_ms:
            tune_switch_interval(float(switch_ms) / 1000)
        else:
            tune_switch_interval()  # as `vast-manager serve` does
        gc.callbacks.append(on_gc)
        import vast_manager

        # Which tree this coordinator runs (``--old`` runs another commit's src/).
        Path(ready_file + ".module").write_text(str(Path(vast_manager.__file__).resolve()))
        Path(ready_file).write_text(server.url)
        try:
            await stop.wait()
        finally:
            gc.callbacks.remove(on_gc)
            Path(ready_file + ".gc.json").write_bytes(orjson.dumps(
                {str(g): {"collections": len(v), "total_ms": 1e3 * sum(v),
                          "longest_ms": 1e3 * max(v, default=0.0)} for g, v in pauses.items()}))
            await server.stop()
            with contextlib.suppress(Exception):
                await provider.close()

    profile_to = os.environ.get("BENCH_PROFILE")
    if profile_to:
        import cProfile

        cProfile.runctx("asyncio.run(main())", globals(), locals(), profile_to)
    else:
        asyncio.run(main())


def role_bare(ready_file: str) -> None:
    """The ceiling: aiohttp reading the body and answering a fixed 200 JSON directive."""
    from aiohttp import web

    # The pace the coordinator set for the same fleet: the generators follow it here too.
    answer = orjson.dumps({"action": "continue", "reason": "",
                           "next_heartbeat_s": int(os.environ.get("BENCH_PACE_S", "15")),
                           "min_rate_per_hour": None})

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        app = web.Application()
        app.router.add_post(HEARTBEAT_PATH, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        Path(ready_file).write_text(f"http://127.0.0.1:{port}")
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


class ServerProcess:
    def __init__(self, role: str, workdir: Path, env: dict[str, str]) -> None:
        self.ready = workdir / f"{role}.url"
        self.ready.unlink(missing_ok=True)
        self.log = open(workdir / f"{role}.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--role", role,
             "--ready-file", str(self.ready)],
            env=pinned_env(env, "server"), stdout=self.log, stderr=subprocess.STDOUT,
        )
        # A coordinator starting on a large fleet derives every agent's key first.
        deadline = time.monotonic() + 300
        while not self.ready.exists() or not self.ready.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{role} did not start; see {workdir / (role + '.log')}")
            time.sleep(0.05)
        self.url = self.ready.read_text()
        # The coordinator refuses timestamps at or before the second it started (replay
        # protection across restarts): the first request goes out in a later second.
        time.sleep(int(time.time()) + 1.05 - time.time())

    def cpu_split(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the process, all threads."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK

    def cpus(self) -> list[int]:
        """The CPUs any thread of the process may run on (``--pin`` holds them all)."""
        allowed: set[int] = set()
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                allowed |= os.sched_getaffinity(int(task.name))
        return sorted(allowed)

    def main_thread_cpu_s(self) -> float:
        """CPU seconds of the event loop's thread alone (the rest: the store writer)."""
        pid = self.proc.pid
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# --- load generator --------------------------------------------------------------------


class _HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: one request at a time, its answer parsed by hand.

    The generators share the two cores with the server, so they are kept lean: this
    costs a fraction of aiohttp's client per request, which leaves the coordinator the
    CPU a real fleet (50,000 separate machines) would never take from it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, str | None, bytes]] | None = None
        self.broken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(self.buf[:end]).split(b"\r\n")
        length, signature = 0, None
        for raw in lines[1:]:
            name, _, value = raw.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"x-vm-signature":
                signature = value.strip().decode()
        total = end + 4 + length
        if len(self.buf) < total:
            return
        body = bytes(self.buf[end + 4:total])
        del self.buf[:total]
        waiter.set_result((int(lines[0].split(b" ", 2)[1]), signature, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("connection closed"))


class _HttpPool:
    """At most ``limit`` connections to one server; a request waits for a free one."""

    def __init__(self, url: str, limit: int, timeout_s: float) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.limit, self.timeout_s = limit, timeout_s
        self.idle: list[_HttpConnection] = []
        self.opened = 0
        self.freed = asyncio.Condition()

    async def _take(self) -> _HttpConnection:
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.broken:
                    return conn
                self.opened -= 1
            if self.opened < self.limit:
                self.opened += 1
                try:
                    _, conn = await asyncio.get_running_loop().create_connection(
                        _HttpConnection, self.host, self.port)
                except BaseException:
                    self.opened -= 1
                    raise
                return conn
            async with self.freed:
                await self.freed.wait()

    async def _give(self, conn: _HttpConnection | None) -> None:
        if conn is not None:
            self.idle.append(conn)
        else:
            self.opened -= 1
        async with self.freed:
            self.freed.notify()

    async def post(self, path: str, headers: dict[str, str],
                   body: bytes) -> tuple[int, str | None, bytes]:
        """(status, X-VM-Signature, body); raises on a failed or timed-out exchange (the
        timeout counts from the call, waiting for a free connection included)."""
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{head}"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        async with asyncio.timeout_at(deadline):
            conn = await self._take()
        conn.waiter = asyncio.get_running_loop().create_future()
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            async with asyncio.timeout_at(deadline):
                answer = await conn.waiter
        except BaseException:
            if conn.transport is not None:
                conn.transport.abort()
            await self._give(None)
            raise
        conn.waiter = None
        await self._give(conn)
        return answer

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()


async def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    agents = [(a, bytes.fromhex(k), g, s, off) for a, k, g, s, off in spec["agents"]]
    rng = random.Random(spec["seed"])
    teles = {g: telemetry(g, rng) for g in range(1, 9)}
    seqs = {a: s for a, _, _, s, _ in agents}
    totals = dict.fromkeys(seqs, 100)
    start_at, duration = spec["start_at"], spec["duration"]
    latencies: list[float] = []  # from the scheduled (paced) or send (closed) time, seconds
    send_latencies: list[float] = []
    counts = {"sent": 0, "accepted": 0, "refused": 0, "lost": 0, "unsigned": 0}
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    paces: dict[int, int] = {}  # next_heartbeat_s answered in the window -> answers
    heard: set[int] = set()  # agents answered 200 in the window

    warmup_s = spec.get("warmup_s", 0.0)

    async def one(pool: _HttpPool, index: int, scheduled: float,
                  counted: bool = True) -> int | None:
        """Send one heartbeat of agent ``index``; the pace its answer sets (None: no
        usable answer)."""
        agent_id, key, gpus = agents[index][0], agents[index][1], agents[index][2]
        seqs[agent_id] += 1
        recent = [round(rng.uniform(250, 400), 2)] if seqs[agent_id] % 5 == 0 else []
        totals[agent_id] += len(recent)
        body = orjson.dumps(heartbeat_body(seqs[agent_id], start_at - 3600, totals[agent_id],
                                           teles[gpus], recent))
        nonce = secrets.token_hex(16)
        headers = sign_headers(agent_id, key, body, nonce)
        sent = time.perf_counter()
        if counted:
            counts["sent"] += 1
        try:
            status, signature, raw = await pool.post(HEARTBEAT_PATH, headers, body)
        except Exception as err:  # a lost heartbeat: counted, never raised
            if counted:
                counts["lost"] += 1
                name = type(err).__name__
                errors[name] = errors.get(name, 0) + 1
            return None
        done = time.perf_counter()
        if status != 200:
            if counted:
                counts["refused"] += 1
                statuses[str(status)] = statuses.get(str(status), 0) + 1
            return None
        signed = True
        if spec["check_signature"]:
            canonical = (f"vm1-resp\n{nonce}\n200\n{hashlib.sha256(raw).hexdigest()}").encode()
            expected = "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
            signed = signature == expected
        if counted:
            counts["accepted"] += 1
            counts["unsigned"] += not signed
            send_latencies.append(done - sent)
            latencies.append(done - scheduled)
            heard.add(index)
        if not signed:
            return None  # as the agent: no directive acted on without its signature
        pace_s = int(orjson.loads(raw)["next_heartbeat_s"])
        if counted:
            paces[pace_s] = paces.get(pace_s, 0) + 1
        return pace_s

    session = _HttpPool(spec["url"], spec["connections"], spec["timeout_s"])
    try:
        # Warm the connections before the clock starts.
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        if warmup_s:
            # CPU from the end of the warm-up: the scheduler task counts it from there.
            async def mark() -> None:
                nonlocal ru0
                await asyncio.sleep(warmup_s)
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
            marker = asyncio.create_task(mark())
        if spec["mode"] == "closed":
            cursor = {"i": 0}

            async def loop() -> None:
                while time.perf_counter() - t0 < duration:
                    index = cursor["i"] % len(agents)
                    cursor["i"] += 1
                    await one(session, index, time.perf_counter())

            await asyncio.gather(*(loop() for _ in range(spec["concurrency"])))
        else:
            # Paced: each agent's first heartbeat at its own slot, every next one when its
            # latest answer's next_heartbeat_s says (after a failed one: its last pace).
            end = warmup_s + duration
            due: list[tuple[float, int]] = [(agent[4], i) for i, agent in enumerate(agents)]
            heapq.heapify(due)
            last_pace = [float(spec["first_pace_s"])] * len(agents)
            woken = asyncio.Event()
            tasks: set[asyncio.Task[None]] = set()

            async def beat(index: int, at: float) -> None:
                pace_s = await one(session, index, t0 + at, at >= warmup_s)
                if pace_s is not None:
                    last_pace[index] = pace_s
                # The agent waits its pace from the answer (or the failure).
                nxt = time.perf_counter() - t0 + last_pace[index]
                if nxt < end:
                    heapq.heappush(due, (nxt, index))
                    woken.set()

            while True:
                if due:
                    at, index = due[0]
                    now = time.perf_counter() - t0
                    if at >= end:
                        heapq.heappop(due)  # a first slot beyond a short window
                    elif at > now:
                        woken.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(woken.wait(), at - now)
                    else:
                        heapq.heappop(due)
                        task = asyncio.create_task(beat(index, at))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    continue
                if not tasks:
                    break
                # Only answers still to come, each of which may schedule one more.
                done, _ = await asyncio.wait(set(tasks), timeout=spec["timeout_s"] + 5,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
            counts["offered"] = counts["sent"]
        if warmup_s:
            await marker
        wall = time.perf_counter() - t0 - warmup_s
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        session.close()
    return {
        "counts": counts, "statuses": statuses, "errors": errors, "wall_s": wall,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
        "lat": latencies, "send_lat": send_latencies, "sent_in_window": wall <= duration + 1.0,
        "paces": {str(k): v for k, v in paces.items()}, "heard": len(heard),
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def role_worker(spec_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    out = asyncio.run(_worker(spec))
    Path(spec["out"]).write_bytes(orjson.dumps(out))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def drive(url: str, workdir: Path, agents: list[list[Any]], *, mode: str, workers: int,
          duration: float, concurrency: int = 0, connections: int = 64,
          check_signature: bool = True, server: ServerProcess | None = None,
          warmup_s: float = 0.0, first_pace_s: float = 15.0) -> dict[str, Any]:
    """Run ``workers`` generator processes against ``url``; aggregate what they saw.

    ``mode``: ``closed`` (``concurrency`` requests in flight per process, each agent in
    turn) or ``paced`` (each agent at its slot, ``agents[i][4]`` seconds from the start,
    then at the pace of its answers; ``first_pace_s`` until it has one)."""
    start_at = time.time() + 1.5 + 0.1 * workers
    slices = [agents[i::workers] for i in range(workers)]
    procs = []
    outs = []
    for w, part in enumerate(slices):
        spec_file = workdir / f"worker{w}.json"
        out = workdir / f"worker{w}.out"
        out.unlink(missing_ok=True)
        outs.append(out)
        spec_file.write_text(json.dumps({
            "url": url, "agents": part, "mode": mode, "start_at": start_at,
            "duration": duration, "concurrency": concurrency, "connections": connections,
            "first_pace_s": first_pace_s, "timeout_s": 30.0, "seed": w, "out": str(out),
            "check_signature": check_signature, "warmup_s": warmup_s,
        }))
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                       "--role", "worker", "--spec", str(spec_file)],
                                      env=pinned_env(dict(os.environ), "generator")))
    try:
        while time.time() < start_at + warmup_s:
            time.sleep(0.01)
        u0, s0 = server.cpu_split() if server else (0.0, 0.0)
        m0 = server.main_thread_cpu_s() if server else 0.0
        t0 = time.perf_counter()
        for p in procs:
            p.wait(timeout=duration + 120)
        wall = time.perf_counter() - t0
        u1, s1 = server.cpu_split() if server else (0.0, 0.0)
        m1 = server.main_thread_cpu_s() if server else 0.0
        server_cpus = server.cpus() if server else []
        cpu0, cpu1 = u0 + s0, u1 + s1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [orjson.loads(o.read_bytes()) for o in outs]
    counts: dict[str, int] = {}
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    lat: list[float] = []
    send_lat: list[float] = []
    paces: dict[int, int] = {}
    for r in results:
        for k, v in r["paces"].items():
            paces[int(k)] = paces.get(int(k), 0) + v
        for k, v in r["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
        lat += r["lat"]
        send_lat += r["send_lat"]
    accepted = counts.get("accepted", 0)
    return {
        "accepted": accepted, "counts": counts, "statuses": statuses, "errors": errors,
        "per_s": accepted / duration,
        "p50_ms": 1000 * percentile(lat, 0.50), "p99_ms": 1000 * percentile(lat, 0.99),
        "send_p99_ms": 1000 * percentile(send_lat, 0.99),
        "server_cpu_s": cpu1 - cpu0,
        "server_sys_share": (s1 - s0) / (cpu1 - cpu0) if cpu1 > cpu0 else 0.0,
        "server_loop_share": (m1 - m0) / (cpu1 - cpu0) if cpu1 > cpu0 else 0.0,
        "server_cpu_us_per_req": 1e6 * (cpu1 - cpu0) / accepted if accepted else float("nan"),
        "generator_cpu_s": sum(r["cpu_s"] for r in results),
        "wall_s": wall, "duration_s": duration,
        # JSON keys are text: "15" -> answers with next_heartbeat_s 15.
        "paces": {str(k): paces[k] for k in sorted(paces)},
        "heard": sum(r["heard"] for r in results),
        # Where the processes ran: every CPU unless --pin held them.
        "server_cpus": server_cpus,
        "generator_cpus": sorted({c for r in results for c in r["cpus"]}),
    }


# --- the run ---------------------------------------------------------------------------


def line(name: str, r: dict[str, Any]) -> str:
    c = r["counts"]
    return (f"  {name:<12} {r['per_s']:8.0f} hb/s accepted   p50 {r['p50_ms']:6.1f} ms   "
            f"p99 {r['p99_ms']:6.1f} ms   server CPU {r['server_cpu_us_per_req']:4.0f} us/hb "
            f"({100 * r['server_sys_share']:.0f}% system, "
            f"{100 * r['server_loop_share']:.0f}% loop thread"
            + ")   "
            f"(accepted {c.get('accepted', 0)}, refused {c.get('refused', 0)}, "
            f"lost {c.get('lost', 0)}, bad signature {c.get('unsigned', 0)})")


def ask_pace(url: str, agent: list[Any]) -> int:
    """One heartbeat of ``agent`` (its seq moved on): the pace the coordinator's signed
    answer sets, as the agent reads it."""
    import urllib.request

    agent_id, key = agent[0], bytes.fromhex(agent[1])
    agent[3] += 1
    body = orjson.dumps(heartbeat_body(agent[3], time.time() - 3600, 100,
                                       telemetry(agent[2], random.Random(0)), []))
    nonce = secrets.token_hex(16)
    req = urllib.request.Request(url + HEARTBEAT_PATH, data=body, method="POST",
                                 headers=sign_headers(agent_id, key, body, nonce))
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw, signature = resp.read(), resp.headers.get("X-VM-Signature")
    canonical = f"vm1-resp\n{nonce}\n200\n{hashlib.sha256(raw).hexdigest()}".encode()
    if signature != "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest():
        raise RuntimeError("the coordinator's answer is not signed with the agent's key")
    return int(orjson.loads(raw)["next_heartbeat_s"])


def instances_lost(db_path: str) -> int:
    """Instances the coordinator marked lost (silent past their TTL), read beside it."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("select count(*) from instances where state = 'lost'")
                   .fetchone()[0])
    finally:
        conn.close()


def paced_rung(coord: ServerProcess, workdir: Path, env: dict[str, str],
               agents: list[list[Any]], args: argparse.Namespace) -> dict[str, Any]:
    """A fleet of ``agents`` at the pace the coordinator sets, then the bare app at the same
    pace. The coordinator is stopped on return (its database then read at rest)."""
    n = len(agents)
    try:
        pace_s = ask_pace(coord.url, agents[0])
        for i, a in enumerate(agents):
            a[4] = pace_s * i / n  # each agent's own slot within the pace
        window = args.window_s if args.window_s is not None else pace_s + 2.0
        r = drive(coord.url, workdir, agents, mode="paced", workers=args.workers,
                  duration=window, connections=args.connections, check_signature=True,
                  server=coord, warmup_s=args.warmup_s, first_pace_s=pace_s)
    finally:
        coord.stop()
    # Every agent sent at most one heartbeat a second (the least pace is 1 s).
    for a in agents:
        a[3] += int(args.warmup_s + window) + 10
    r["instances_lost"] = instances_lost(env["VM_DB_PATH"])
    # The ceiling at the same pace: per-request cost depends on the load (how many
    # requests share a loop turn, a wake-up, a commit), so compare like with like.
    bare = ServerProcess("bare", workdir, {**env, "BENCH_PACE_S": str(pace_s)})
    try:
        base = drive(bare.url, workdir, agents, mode="paced", workers=args.workers,
                     duration=min(window, args.bare_seconds), connections=args.connections,
                     check_signature=False, server=bare, warmup_s=args.warmup_s,
                     first_pace_s=pace_s)
    finally:
        bare.stop()
    r["bare_cpu_us_per_req"] = base["server_cpu_us_per_req"]
    r["bare_p99_ms"] = base["p99_ms"]
    r["cpu_ratio"] = r["server_cpu_us_per_req"] / base["server_cpu_us_per_req"]
    c = r["counts"]
    offered_n = c.get("offered", 0)
    r["fleet"] = n
    r["pace_s"] = pace_s
    r["offered_per_s"] = offered_n / window
    r["met"] = (c.get("lost", 0) == 0 and c.get("refused", 0) == 0
                and c.get("unsigned", 0) == 0 and r["instances_lost"] == 0
                and r["p99_ms"] < BAR_P99_MS and offered_n > 0
                and c.get("accepted", 0) >= BAR_SENT_FRACTION * offered_n)
    machine = CORES * r["wall_s"]
    r["coord_share"] = r["server_cpu_s"] / machine
    r["gen_share"] = r["generator_cpu_s"] / machine
    answered = ", ".join(f"{p} s x {k}" for p, k in r["paces"].items())
    print(f"  fleet {n:>7} at the coordinator's pace {pace_s} s "
          f"({r['offered_per_s']:5.0f} hb/s over {window:g} s): "
          f"accepted {c.get('accepted', 0)}/{offered_n}, refused {c.get('refused', 0)}, "
          f"lost {c.get('lost', 0)}, bad signature {c.get('unsigned', 0)}, "
          f"instances lost {r['instances_lost']}, agents heard {r['heard']} of {n}, "
          f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms (send->answer p99 "
          f"{r['send_p99_ms']:.1f} ms), coordinator CPU {r['server_cpu_us_per_req']:.0f} us/hb "
          f"({100 * r['server_sys_share']:.0f}% system), "
          f"coordinator {100 * r['coord_share']:.0f}% / generators "
          f"{100 * r['gen_share']:.0f}% of {CORES} cores: {'MET' if r['met'] else 'missed'}",
          flush=True)
    print(f"    paces answered in the window: {answered}", flush=True)
    print(f"    bare aiohttp at the same pace: {r['bare_cpu_us_per_req']:.0f} us/hb, p99 "
          f"{r['bare_p99_ms']:.1f} ms; coordinator/bare CPU ratio {r['cpu_ratio']:.2f}x",
          flush=True)
    return r


def main_run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    secret = secrets.token_bytes(32)
    salt = secrets.token_hex(4)
    env = {**os.environ, "VM_FLEET_SECRET": secret.hex(), "VM_ADMIN_TOKEN": ADMIN_TOKEN,
           "VM_DB_PATH": str(workdir / "coord.db"), "VM_CONFIG_DIR": str(workdir / "config"),
           "VM_HOST": "127.0.0.1", "VM_PORT": "0", "PYTHONPATH": str(ROOT / "src"),
           "BENCH_GC": args.gc,
           "BENCH_SWITCH_MS": "" if args.switch_interval_ms is None
           else str(args.switch_interval_ms)}
    if args.budget is not None:
        env["VM_MAX_HEARTBEATS_PER_SECOND"] = str(args.budget)
    if args.base_pace is not None:
        env["VM_NEXT_HEARTBEAT_S"] = str(args.base_pace)
    fleets = sorted(set(args.fleets))
    http_n = args.http_agents
    if fleets[0] <= http_n:
        raise SystemExit(f"every fleet needs more than the {http_n} agents issued over HTTP")
    total = max(fleets[-1], args.agents + http_n)
    ids = [agent_id_for(i, salt) for i in range(total)]
    provisioned: list[list[Any]] = []
    http_agents: list[list[Any]] = []

    def grow(agents: int) -> None:
        """Provision up to ``agents`` in all, the ``http_n`` issued over HTTP included."""
        have, want = len(provisioned), agents - http_n
        if want <= have:
            return
        part = ids[have:want]
        took = provision(env["VM_DB_PATH"], env, part, first_index=have, fleet_agents=agents)
        provisioned.extend([a, key_for(secret, a).hex(), gpus_of(have + i), 1, 0.0]
                           for i, a in enumerate(part))
        print(f"provisioned {len(part)} agents through the store's write path in {took:.1f} s "
              f"({want} in all, and {http_n} over HTTP)", flush=True)

    servers: list[ServerProcess] = []
    out: dict[str, Any] = {"workers": args.workers, "concurrency": args.concurrency}
    try:
        grow(max(fleets[0], args.agents + http_n))
        bare = ServerProcess("bare", workdir, env)
        servers.append(bare)
        coord = ServerProcess("coordinator", workdir, env)
        servers.append(coord)
        http_agents.extend(issue_over_http(coord.url, http_n))
        out["http_agents"] = len(http_agents)
        print(f"issued {len(http_agents)} agents through POST /api/agents, hello over HTTP",
              flush=True)
        sat = provisioned[:args.agents]
        print(f"saturation, closed loop: {args.workers} generator process(es) x "
              f"{args.concurrency} in flight, {args.seconds:g} s each, {len(sat)} agents",
              flush=True)
        base = drive(bare.url, workdir, sat, mode="closed", workers=args.workers,
                     duration=args.seconds, concurrency=args.concurrency,
                     connections=args.concurrency, check_signature=False, server=bare)
        print(line("bare aiohttp", base), flush=True)
        # The bare app signs nothing; the coordinator's answers are all checked.
        real = drive(coord.url, workdir, sat, mode="closed", workers=args.workers,
                     duration=args.seconds, concurrency=args.concurrency,
                     connections=args.concurrency, check_signature=True, server=coord)
        print(line("coordinator", real),
              flush=True)
        ratio = real["server_cpu_us_per_req"] / base["server_cpu_us_per_req"]
        print(f"  ratio: coordinator CPU per heartbeat = {ratio:.2f}x the bare request "
              f"(target <= 1.5x); throughput {real['per_s'] / base['per_s']:.2f}x", flush=True)
        out.update(bare=base, coordinator=real, cpu_ratio=ratio)
        # Later rungs reuse the agents: their seq goes on from where saturation left it.
        bump = int(real["counts"].get("sent", 0)) + 10
        for a in provisioned:
            a[3] += bump
        for s in servers:
            s.stop()
        servers.clear()
        print(f"fleets at the coordinator's pace, open loop: each rung restarts the "
              f"coordinator on a database of that many agents; warm-up {args.warmup_s:g} s, "
              f"then one pace; {args.workers} generator process(es)", flush=True)
        rungs = []
        for n in fleets:
            grow(n)
            coord = ServerProcess("coordinator", workdir, env)
            rungs.append(paced_rung(coord, workdir, env,
                                    http_agents + provisioned[:n - http_n], args))
        met = [r for r in rungs if r["met"]]
        best = max(met, key=lambda r: r["fleet"]) if met else None
        if best:
            print(f"largest fleet that met the bar here: {best['fleet']} agents, nothing lost, "
                  f"p99 {best['p99_ms']:.0f} ms, at the pace the coordinator set: "
                  f"{best['pace_s']} s ({best['offered_per_s']:.0f} hb/s); coordinator "
                  f"{100 * best['coord_share']:.0f}% of the {CORES} cores, generators "
                  f"{100 * best['gen_share']:.0f}%; CPU {best['server_cpu_us_per_req']:.0f} "
                  f"us/hb, {best['cpu_ratio']:.2f}x bare aiohttp at the same pace", flush=True)
        else:
            print("no rung met the bar here", flush=True)
        out["largest_fleet_met"] = best["fleet"] if best else 0
        out["pace_at_largest_fleet_met"] = best["pace_s"] if best else None
        out["agents"] = len(http_agents) + len(provisioned)
        out["rungs"] = rungs
        lost = sum(r["counts"].get("lost", 0) for r in [base, real, *rungs])
        out["lost"] = lost
        out["refused"] = sum(r["counts"].get("refused", 0) for r in [real, *rungs])
        out["bad_signatures"] = sum(r["counts"].get("unsigned", 0) for r in [real, *rungs])
        out["instances_lost"] = sum(r["instances_lost"] for r in rungs)
        print(f"lost heartbeats in the whole run: {lost}; refused {out['refused']}; "
              f"answers with a bad signature {out['bad_signatures']}; instances marked lost "
              f"{out['instances_lost']}", flush=True)
    finally:
        for s in reversed(servers):
            s.stop()
    gc_file = workdir / "coordinator.url.gc.json"
    if gc_file.exists():
        out["gc"] = orjson.loads(gc_file.read_bytes())
        print(f"coordinator garbage collection in the last rung (--gc {args.gc}): " + "; ".join(
            f"generation {g}: {v['collections']} collections, {v['total_ms']:.0f} ms, "
            f"longest {v['longest_ms']:.1f} ms" for g, v in out["gc"].items()), flush=True)
    out["db_bytes"] = sum(p.stat().st_size for p in workdir.glob("coord.db*"))
    if not args.keep:
        for p in sorted(workdir.rglob("*"), reverse=True):
            if p.is_dir():
                p.rmdir()
            else:
                p.unlink()
        workdir.rmdir()
    else:
        print(f"kept {workdir}")
    return out


# --- another commit beside this tree (--old) ---------------------------------------------


def _tree_of(rev: str, dest: Path) -> Path:
    """``rev``'s ``src/`` (git archive, nothing else of it), under ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def _copy_db(source: str, dest: Path) -> None:
    """A consistent copy of the provisioned database (SQLite's online backup)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(source)) as src, \
            contextlib.closing(sqlite3.connect(dest)) as out:
        src.backup(out)


def _before_telemetry_on_instances(db_path: str, old_src: Path) -> None:
    """The provisioned database as a tree from before migration 15 keeps it: the latest
    telemetry in its own table, not on the instance's row, and no record of migration 15
    (the older coordinator would otherwise write to the ``telemetry`` view and fail). The
    instance rows shrink back (VACUUM), so the older tree pages through what it would."""
    import sqlite3

    if "_m15_" in old_src.joinpath("vast_manager", "coordinator", "store",
                                   "migrations.py").read_text():
        return
    with contextlib.closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        conn.execute("begin")
        conn.execute("drop view telemetry")
        conn.execute("create table telemetry (instance_id integer primary key, "
                     "received_at float, telemetry_json text)")
        conn.execute("insert into telemetry select id, telemetry_at, telemetry_json "
                     "from instances where telemetry_json is not null")
        conn.execute("update instances set telemetry_at = null, telemetry_json = null")
        conn.execute("delete from migrations where id = 15")
        conn.execute("commit")
    _vacuum(db_path)


def _vacuum(db_path: str) -> None:
    import sqlite3

    with contextlib.closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        conn.execute("vacuum")


def compare_run(args: argparse.Namespace) -> dict[str, Any]:
    """Saturation of this tree's coordinator and ``args.old``'s, alternated over
    ``args.rounds`` rounds, each round beside a bare aiohttp run: the same agents, each
    coordinator on its own copy of one provisioned database, the same generators."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-old-"))
    trees = {"old": _tree_of(args.old, workdir / "old"), "new": ROOT / "src"}
    secret = secrets.token_bytes(32)
    salt = secrets.token_hex(4)
    provisioned_db = str(workdir / "provisioned.db")
    env = {**os.environ, "VM_FLEET_SECRET": secret.hex(), "VM_ADMIN_TOKEN": ADMIN_TOKEN,
           "VM_DB_PATH": provisioned_db, "VM_CONFIG_DIR": str(workdir / "config"),
           "VM_HOST": "127.0.0.1", "VM_PORT": "0", "PYTHONPATH": str(ROOT / "src"),
           "BENCH_GC": args.gc, "BENCH_SWITCH_MS": "" if args.switch_interval_ms is None
           else str(args.switch_interval_ms)}
    ids = [agent_id_for(i, salt) for i in range(args.agents)]
    took = provision(provisioned_db, env, ids, fleet_agents=args.agents)
    # Each tree starts from the same rows, in the schema it keeps them in.
    provisioned = {"new": provisioned_db, "old": str(workdir / "provisioned-old.db")}
    _copy_db(provisioned_db, Path(provisioned["old"]))
    _before_telemetry_on_instances(provisioned["old"], trees["old"])
    _vacuum(provisioned_db)
    agents: list[list[Any]] = [[a, key_for(secret, a).hex(), gpus_of(i), 1, 0.0]
                               for i, a in enumerate(ids)]
    print(f"provisioned {len(ids)} agents in {took:.1f} s; {args.rounds} round(s): bare "
          f"aiohttp, then this tree and {args.old} in turn, {args.seconds:g} s each, "
          f"{args.workers} generator process(es) x {args.concurrency} in flight"
          + (f"; servers on CPU {PINNED['server']}, generators on {PINNED['generator']}"
             if PINNED else ""), flush=True)
    rounds: list[dict[str, Any]] = []
    try:
        for n in range(args.rounds):
            figures: dict[str, Any] = {}
            order = ("old", "new") if n % 2 == 0 else ("new", "old")
            for name in ("bare", *order):
                tree_env = dict(env)
                role = "bare"
                if name != "bare":
                    role = "coordinator"
                    db = workdir / f"{name}-{n}.db"
                    _copy_db(provisioned[name], db)
                    tree_env.update(VM_DB_PATH=str(db), PYTHONPATH=str(trees[name]))
                server = ServerProcess(role, workdir, tree_env)
                try:
                    if role == "coordinator":
                        ran = Path(str(server.ready) + ".module").read_text()
                        if not ran.startswith(str(trees[name].resolve())):
                            raise SystemExit(f"the {name} coordinator imported {ran}")
                    r = drive(server.url, workdir, agents, mode="closed",
                              workers=args.workers, duration=args.seconds,
                              concurrency=args.concurrency, connections=args.concurrency,
                              check_signature=name != "bare", server=server)
                finally:
                    server.stop()
                for a in agents:  # the next server's agents go on from a later seq
                    a[3] += int(r["counts"].get("sent", 0)) + 10
                figures[name] = r
                label = {"bare": "bare aiohttp", "new": "this tree", "old": args.old}[name]
                print(line(label[:12], r), flush=True)
            bare_us = figures["bare"]["server_cpu_us_per_req"]
            ratios = {k: figures[k]["server_cpu_us_per_req"] / bare_us for k in ("old", "new")}
            print(f"  round {n + 1}: CPU per heartbeat, x bare aiohttp: this tree "
                  f"{ratios['new']:.2f}x, {args.old} {ratios['old']:.2f}x", flush=True)
            rounds.append({**figures, "ratios": ratios})
    finally:
        if not args.keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    # On a shared machine other work only ever adds to a process's CPU per request: each
    # server's least figure over the rounds is the closest to its own cost.
    least = {k: min(r[k]["server_cpu_us_per_req"] for r in rounds) for k in ("bare", "old", "new")}
    print(f"least CPU per heartbeat over {len(rounds)} round(s): bare aiohttp "
          f"{least['bare']:.0f} us; this tree {least['new']:.0f} us "
          f"({least['new'] / least['bare']:.2f}x bare); {args.old} {least['old']:.0f} us "
          f"({least['old'] / least['bare']:.2f}x bare)", flush=True)
    return {"old": args.old, "rounds": rounds, "least_us": least,
            "least_ratio": {k: least[k] / least["bare"] for k in ("old", "new")}}


def issue_over_http(url: str, n: int) -> list[list[Any]]:
    """Issue ``n`` agents through POST /api/agents; each says hello and heartbeats once."""
    import urllib.request

    out: list[list[Any]] = []
    for i in range(n):
        # Each declares its GPUs (a hello may list no more than were issued).
        req = urllib.request.Request(
            url + "/api/agents", data=orjson.dumps({"label": f"bench-http-{i}",
                                                    "gpus": gpus_of(i)}), method="POST",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            issued = orjson.loads(resp.read())
        agent_id, key = issued["agent_id"], bytes.fromhex(issued["agent_key"])
        gpus = gpus_of(i)
        for path, payload in (
            ("/v1/hello", hello_body(agent_id, gpus)),
            (HEARTBEAT_PATH, heartbeat_body(1, time.time() - 3600, 100,
                                            telemetry(gpus, random.Random(i)), [])),
        ):
            body = orjson.dumps(payload)
            headers = sign_headers(agent_id, key, body, secrets.token_hex(16))
            headers["X-VM-Signature"] = sign_path(key, headers, path, body)
            req = urllib.request.Request(url + path, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"{path} answered {resp.status}")
        out.append([agent_id, key.hex(), gpus, 1, 0.0])
    return out


def sign_path(key: bytes, headers: dict[str, str], path: str, body: bytes) -> str:
    canonical = (f"vm1-req\n{headers['X-VM-Timestamp']}\n{headers['X-VM-Nonce']}\nPOST\n{path}\n"
                 f"{hashlib.sha256(body).hexdigest()}").encode()
    return "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("run", "coordinator", "bare", "worker"),
                        default="run", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke run (few agents, short windows)")
    parser.add_argument("--agents", type=int, default=2000,
                        help="agents in the saturation run (default 2000)")
    parser.add_argument("--http-agents", type=int, default=20,
                        help="agents issued through POST /api/agents with hello over HTTP")
    parser.add_argument("--workers", type=int, default=2, help="load-generator processes")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="requests in flight per generator process (saturation)")
    parser.add_argument("--connections", type=int, default=256,
                        help="connections per generator process (offered load)")
    parser.add_argument("--seconds", type=float, default=10.0, help="saturation window")
    parser.add_argument("--fleets", type=int, nargs="*", default=None,
                        help="agents of each rung, at the coordinator's pace (default 50000)")
    parser.add_argument("--ladder", action="store_true",
                        help="rungs of " + ", ".join(f"{n:,}" for n in LADDER) + " agents")
    parser.add_argument("--window-s", type=float, default=None,
                        help="counted window of each rung (default: the pace the coordinator "
                             "set, plus 2 s: every agent heard)")
    parser.add_argument("--bare-seconds", type=float, default=30.0,
                        help="longest counted window of the bare app at the same pace")
    parser.add_argument("--warmup-s", type=float, default=15.0,
                        help="uncounted warm-up before each rung's window (default 15)")
    parser.add_argument("--budget", type=float, default=None,
                        help="the coordinator's VM_MAX_HEARTBEATS_PER_SECOND (default: its "
                             "default)")
    parser.add_argument("--base-pace", type=int, default=None,
                        help="the coordinator's VM_NEXT_HEARTBEAT_S (default: its default)")
    parser.add_argument("--gc", choices=("serve", "default", "off"), default="serve",
                        help="the coordinator's garbage collector: as `vast-manager serve` "
                             "tunes it (default), CPython's defaults, or off")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the coordinator's GIL switch interval in ms (default: as "
                             "`vast-manager serve` sets it, 1; CPython's own is 5)")
    parser.add_argument("--old", metavar="REV",
                        help="saturation only: this tree's coordinator beside REV's (its src/ "
                             "from git), alternated, each round beside bare aiohttp")
    parser.add_argument("--rounds", type=int, default=2, help="rounds with --old (default 2)")
    parser.add_argument("--pin", action="store_true",
                        help="hold every server (bare and coordinators alike) to the first CPU "
                             "this run may use and the load generators to the others "
                             "(needs 2 or more)")
    parser.add_argument("--json-out", help="also write the figures as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    cpus = os.environ.get("BENCH_CPUS")
    if cpus and args.role != "run":  # before any thread starts: the threads inherit it
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    if args.role == "coordinator":
        role_coordinator(args.ready_file)
        return
    if args.role == "bare":
        role_bare(args.ready_file)
        return
    if args.role == "worker":
        role_worker(args.spec)
        return
    if args.quick:
        args.agents, args.http_agents, args.workers = 20, 2, 1
        args.concurrency, args.seconds, args.window_s, args.bare_seconds = 4, 2.0, 3.0, 3.0
        args.warmup_s = 1.0
        # 30 agents at a 1 s base pace under 10 heartbeats a second: the pace stretches to 3 s.
        args.base_pace = 1 if args.base_pace is None else args.base_pace
        args.budget = 10.0 if args.budget is None else args.budget
        args.fleets = args.fleets or [30]
    if args.pin:
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            raise SystemExit("--pin needs 2 or more CPUs")
        PINNED.update(server=str(allowed[0]), generator=",".join(map(str, allowed[1:])))
    if args.ladder:
        args.fleets = list(LADDER)
    if args.fleets is None:
        args.fleets = [50_000]
    out = compare_run(args) if args.old else main_run(args)
    if args.json_out:
        Path(args.json_out).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
