"""Shared pieces of the coordinator tests: settings, a signed agent, sample messages."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import threading
from pathlib import Path
from typing import Any

import orjson
import sqlite_utils
from aiohttp.test_utils import TestClient

from vast_manager.coordinator.decisions import pace
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store import migrations
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app
from vast_manager.coordinator.web.core import CORE, Core
from vast_manager.coordinator.web.server import start_server

from support.fakes_provider import FakeClock, FakeProvider

SECRET_HEX = "11" * 32
OLD_SECRET_HEX = "22" * 32
ADMIN_TOKEN = "admin-token-for-tests-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    env = {"VM_FLEET_SECRET": SECRET_HEX, "VM_ADMIN_TOKEN": ADMIN_TOKEN}
    values: dict[str, Any] = {
        "db_path": str(tmp_path / "coord.db"),
        "config_dir": str(tmp_path / "config"),
        "terminate_grace_s": 10.0,
        # The fake agents here report no cuzk counter (proofs_completed_total stays 0), so
        # idle detection is off unless a test turns it on (test_idle.py does).
        "idle_after_s": 0.0,
    }
    values.update(overrides)
    return Settings.from_env(env, **values)


def agent_key(agent_id: str, secret_hex: str = SECRET_HEX) -> bytes:
    """docs/protocol.md's agent key, computed here with hmac (not by the code under test)."""
    return hmac.new(
        bytes.fromhex(secret_hex), b"vast-manager agent key v1:" + agent_id.encode(), hashlib.sha256
    ).digest()


def sign(key: bytes, ts: str, nonce: str, method: str, path: str, body: bytes) -> str:
    canonical = f"vm1-req\n{ts}\n{nonce}\n{method}\n{path}\n{hashlib.sha256(body).hexdigest()}"
    return "v1=" + hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def response_signature(key: bytes, nonce: str, status: int, body: bytes) -> str:
    canonical = f"vm1-resp\n{nonce}\n{status}\n{hashlib.sha256(body).hexdigest()}"
    return "v1=" + hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


class Agent:
    """Signs requests as one agent, the way the real agent must."""

    def __init__(
        self, client: TestClient, agent_id: str, clock: FakeClock, key: bytes | None = None
    ) -> None:
        self.client = client
        self.agent_id = agent_id
        self.key = key if key is not None else agent_key(agent_id)
        self.clock = clock
        self.seq = 0

    def headers(
        self, path: str, body: bytes, *, ts: int | None = None, nonce: str | None = None
    ) -> dict[str, str]:
        ts_text = str(int(self.clock()) if ts is None else ts)
        nonce = nonce or secrets.token_hex(16)
        return {
            "X-VM-Agent": self.agent_id,
            "X-VM-Timestamp": ts_text,
            "X-VM-Nonce": nonce,
            "X-VM-Signature": sign(self.key, ts_text, nonce, "POST", path, body),
            "Content-Type": "application/json",
        }

    async def post_raw(self, path: str, body: bytes, **kw: Any) -> tuple[int, Any, Any]:
        headers = self.headers(path, body, **kw)
        resp = await self.client.post(path, data=body, headers=headers)
        raw = await resp.read()
        return resp.status, orjson.loads(raw), (resp, raw, headers["X-VM-Nonce"])

    async def post(self, path: str, payload: Any, **kw: Any) -> tuple[int, Any]:
        status, data, _ = await self.post_raw(path, orjson.dumps(payload), **kw)
        return status, data

    async def hello(self, boot_id: str = "boot-1", gpus: int = 1) -> tuple[int, Any]:
        return await self.post("/v1/hello", hello_msg(boot_id, gpus))

    async def heartbeat(self, phase: str, **kw: Any) -> tuple[int, Any]:
        self.seq += 1
        return await self.post("/v1/heartbeat", heartbeat_msg(self.seq, phase, **kw))


def hello_msg(boot_id: str = "boot-1", gpus: int = 1) -> dict[str, Any]:
    return {
        "protocol": 1,
        "agent_version": "0.1.0",
        "boot_id": boot_id,
        "container_id": None,
        "host": {
            "hostname": "host-a",
            "cpu_model": "AMD EPYC 7K62",
            "cpu_cores_logical": 96,
            "cpu_cores_physical": 48,
            "ram_total_bytes": 257_000_000_000,
            "driver_version": "570.1",
            "cuda_version": "12.8",
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "RTX 4090",
                    "memory_total_bytes": 24_000_000_000,
                    "pcie_gen_max": 4,
                    "pcie_width_max": 16,
                    "pcie_gen_current": 4,
                    "pcie_width_current": 16,
                }
                for i in range(gpus)
            ],
        },
    }


def telemetry_msg(util: float = 95.0) -> dict[str, Any]:
    return {
        "window_s": 15.0,
        "samples": 15,
        "gpus": [
            {
                "index": 0,
                "util_pct_mean": util,
                "util_pct_max": 100.0,
                "mem_used_bytes": 1000,
                "pcie_tx_kbps_mean": 1.0,
                "pcie_rx_kbps_mean": 2.0,
                "power_w_mean": 400.0,
                "temp_c_max": 70.0,
                "sm_clock_mhz_mean": 2500.0,
                "throttle_reasons": 0,
            }
        ],
        "cpu": {
            "util_pct_mean": 40.0,
            "per_core_util_pct_mean": [40.0],
            "load1": 10.0,
            "iowait_pct_mean": 0.1,
        },
        "ram": {"used_bytes": 1, "total_bytes": 2},
        "net": {"rx_bytes_per_s": 1.0, "tx_bytes_per_s": 1.0},
    }


def heartbeat_msg(seq: int, phase: str, *, telemetry: bool = False) -> dict[str, Any]:
    return {
        "seq": seq,
        "phase": phase,
        "phase_started_at": 1_800_000_000.0,
        "progress": None,
        "proofs_completed_total": 0,
        "proof_seconds_recent": [],
        "telemetry": telemetry_msg() if telemetry else None,
    }


def result_msg(
    result_id: str,
    *,
    proofs: int = 12,
    wall_seconds: float = 1200.0,
    rate: float | None = None,
    kind: str = "benchmark",
    proof_seconds: list[float] | None = None,
    gpus_used: list[int] | None = None,
    finished_at: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A benchmark result; ``finished_at`` (e.g. the test's clock now) sets both ends of
    the run, which otherwise starts at the fake clock's start."""
    rate_per_hour = proofs * 3600.0 / wall_seconds if rate is None else rate
    started_at = 1_800_000_000.0 if finished_at is None else finished_at - wall_seconds
    msg = {
        "result_id": result_id,
        "kind": kind,
        "proof_type": "porep-c2-32g",
        "started_at": started_at,
        "finished_at": started_at + wall_seconds,
        "gpus_used": gpus_used if gpus_used is not None else [0],
        "proofs_completed": proofs,
        "proofs_failed": 0,
        "wall_seconds": wall_seconds,
        "rate_per_hour": rate_per_hour,
        "proof_seconds": proof_seconds
        if proof_seconds is not None
        else [wall_seconds / proofs * 2] * proofs,
        "telemetry": None,
    }
    msg.update(extra)
    return msg


class Harness:
    """An app under aiohttp's test client, with a fake clock and a fake provider."""

    def __init__(self, client: TestClient, clock: FakeClock, provider: FakeProvider) -> None:
        self.client = client
        self.clock = clock
        self.provider = provider

    @property
    def core(self) -> Core:
        app = self.client.app
        assert app is not None
        return app[CORE]

    @property
    def store(self) -> Store:
        return self.core.store

    def agent(self, agent_id: str, key: bytes | None = None) -> Agent:
        return Agent(self.client, agent_id, self.clock, key)

    async def admin(
        self, method: str, path: str, payload: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"headers": ADMIN if headers is None else headers}
        if payload is not None:
            kwargs["data"] = orjson.dumps(payload)
        resp = await self.client.request(method, path, **kwargs)
        return resp.status, orjson.loads(await resp.read())

    async def rebenchmark(self, agent: Agent) -> None:
        """The operator asks the agent's instance for a new benchmark (a directed one)."""
        inst = self.store.instance_by_agent(agent.agent_id)
        assert inst is not None
        status, data = await self.admin("POST", f"/api/instances/{inst['id']}/rebenchmark")
        assert status == 200, data

    async def issue(self, label: str = "my-rig", min_rate: float | None = None,
                    gpus: int | None = None) -> Agent:
        body: dict[str, Any] = {"label": label}
        if min_rate is not None:
            body["min_rate_per_hour"] = min_rate
        if gpus is not None:
            body["gpus"] = gpus
        status, data = await self.admin("POST", "/api/agents", body)
        assert status == 200, data
        return self.agent(data["agent_id"])


async def start(
    aiohttp_client: Any,
    tmp_path: Path,
    *,
    provider: FakeProvider | None = None,
    clock: FakeClock | None = None,
    rng: pace.RandomSource | None = None,
    **settings: Any,
) -> Harness:
    """``rng``: the heartbeat jitter's draws (default: always the least, so every pace
    is the one ``decisions.pace`` computes; jitter's own tests pass a seeded one)."""
    clock = clock or FakeClock()
    provider = provider or FakeProvider()
    store = Store(tmp_path / "coord.db")
    app = create_app(make_settings(tmp_path, **settings), store, provider, clock,
                     run_monitor=False, rng=rng or LEAST_DRAW)
    app.on_cleanup.append(lambda _app: _close(store))
    client = await aiohttp_client(app)
    # Timestamps at or before the start second are refused (restart replay protection).
    clock.advance(1)
    return Harness(client, clock, provider)


class LeastDraw:
    """A jitter source that always draws 0: no jitter."""

    def random(self) -> float:
        return 0.0


LEAST_DRAW = LeastDraw()


async def _close(store: Store) -> None:
    store.close()


class ServerThread:
    """A real coordinator (``start_server``) on its own event loop in a thread, so a
    synchronous client (the CLI, a subprocess) can call it."""

    def __init__(self, tmp_path: Path, provider: FakeProvider | None = None,
                 **overrides: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.provider = provider or FakeProvider()
        self.settings = make_settings(tmp_path, port=0, **overrides)
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.server: Any = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(start_server(self.settings, self.provider))
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> ServerThread:
        self.thread.start()
        assert self.ready.wait(30), "coordinator did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def database_before_migration(path: Path, number: int) -> sqlite_utils.Database:
    """A database at ``path`` as a coordinator from before migration ``number`` left it:
    every earlier migration applied, none from ``number`` on."""
    db = sqlite_utils.Database(path)
    old = migrations.MIGRATIONS
    migrations.MIGRATIONS = tuple(m for m in old if m[0] < number)
    try:
        migrations.migrate(db)
    finally:
        migrations.MIGRATIONS = old
    return db
