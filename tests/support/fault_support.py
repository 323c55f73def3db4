"""Shared pieces of the fault-tolerance and hostile-input tests.

- ``ThreadedCoordinator``: the real app on a real loopback port, served from a
  background thread, so synchronous clients (hypothesis, schemathesis, raw
  sockets) can hit it; no monitor loop, so only requests write rows.
- ``count_all_rows``: rows of every table of a database file, read through a
  separate connection (what a rejected request must leave unchanged).
- ``signed_headers`` / ``SignedAuth``: request signatures (docs/protocol.md) for any body.
- ``CoordinatorProcess``: ``vast-manager serve`` as a separate process (for
  SIGKILL and RSS), every process it and its agents start carrying a marker
  in the environment so ``kill_marked`` finds them all at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app
from vast_manager.coordinator.web.core import CORE, Core

from support.coord_support import ADMIN_TOKEN, SECRET_HEX, make_settings
from support.fakes_provider import FakeProvider
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
# VM_SIM_*: the local provider passes the simulation's variables on to its agents (and
# no other coordinator variable), so the agents and their simulated cuzk carry it too.
TEST_MARKER_ENV = "VM_SIM_FAULT_TEST_MARKER"


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 60.0,
               poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def count_all_rows(db_path: Path | str) -> dict[str, int]:
    """Rows in every table of the database (all of sqlite_master, not a fixed list)."""
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        names = [r[0] for r in db.execute(
            "select name from sqlite_master where type = 'table' and name not like 'sqlite_%'"
        )]
        return {n: int(db.execute(f"select count(*) from [{n}]").fetchone()[0]) for n in names}


def signed_headers(agent_id: str, key: bytes, method: str, path: str, body: bytes,
                   *, ts: int | None = None, nonce: str | None = None) -> dict[str, str]:
    """The four signing headers, computed here with hmac (not by the code under test)."""
    ts_text = str(int(time.time()) if ts is None else ts)
    nonce = nonce or secrets.token_hex(16)
    canonical = (f"vm1-req\n{ts_text}\n{nonce}\n{method}\n{path}\n"
                 f"{hashlib.sha256(body).hexdigest()}")
    return {
        "X-VM-Agent": agent_id,
        "X-VM-Timestamp": ts_text,
        "X-VM-Nonce": nonce,
        "X-VM-Signature": "v1=" + hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest(),
    }


class SignedAuth:
    """A ``requests`` auth hook that signs the prepared request's exact bytes."""

    def __init__(self, agent_id: str, key: bytes) -> None:
        self.agent_id = agent_id
        self.key = key

    def __call__(self, r: Any) -> Any:
        body = r.body or b""
        if isinstance(body, str):
            body = body.encode()
        r.headers.update(signed_headers(self.agent_id, self.key, r.method, r.path_url, body))
        return r


def http(url: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> tuple[int, bytes,
                                                                               dict[str, str]]:
    """One request with urllib; any status comes back (no exception for 4xx/5xx)."""
    req = urllib.request.Request(url, method=method, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def admin_call(base_url: str, method: str, path: str, payload: Any = None,
               token: str = ADMIN_TOKEN) -> Any:
    body = None if payload is None else json.dumps(payload).encode()
    status, raw, _ = http(base_url + path, method, body,
                          {"Authorization": f"Bearer {token}",
                           "Content-Type": "application/json"})
    if status != 200:
        raise AssertionError(f"{method} {path}: {status} {raw[:300]!r}")
    return json.loads(raw)


class ThreadedCoordinator:
    """The app served on 127.0.0.1:<free port> from a background thread (see module doc)."""

    def __init__(self, tmp_path: Path, *, provider: Any = None, **settings: Any) -> None:
        self.tmp_path = tmp_path
        self.db_path = tmp_path / "coord.db"
        self.provider = provider if provider is not None else FakeProvider()
        self.settings = make_settings(tmp_path, **settings)
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app: web.Application | None = None
        self.store: Store | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def core(self) -> Core:
        assert self.app is not None
        return self.app[CORE]

    def __enter__(self) -> ThreadedCoordinator:
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the coordinator thread did not start")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
        finally:
            # Connections a hostile client left half-open still have handler tasks.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _serve(self) -> None:
        store = self.store = Store(self.db_path)
        self.app = create_app(self.settings, store, self.provider, time.time, run_monitor=False)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._stop = asyncio.Event()
        # Timestamps at or before the start second are refused: let that second pass.
        started = int(time.time())
        while int(time.time()) <= started:
            await asyncio.sleep(0.05)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            store.close()

    def rows(self) -> dict[str, int]:
        # The store's own count: the latest-telemetry gauge is written behind on a
        # timer, so the file alone would show an earlier request's flush as a write.
        assert self.store is not None
        return self.store.count_rows()

    def issue_agent(self, label: str = "fuzz-rig", gpus: int | None = None
                    ) -> tuple[str, bytes]:
        body: dict[str, Any] = {"label": label}
        if gpus is not None:
            body["gpus"] = gpus  # what its hello may list (default 1)
        issued = admin_call(self.url, "POST", "/api/agents", body)
        return issued["agent_id"], bytes.fromhex(issued["agent_key"])

    def post_signed(self, agent_id: str, key: bytes, path: str, body: bytes,
                    **kw: Any) -> tuple[int, bytes, dict[str, str]]:
        headers = signed_headers(agent_id, key, "POST", path, body, **kw)
        headers["Content-Type"] = "application/json"
        return http(self.url + path, "POST", body, headers)


# --- separate processes ---------------------------------------------------------------


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(TEST_MARKER_ENV) == marker:
                found.append(p)
    return found


def kill_marked(marker: str) -> list[int]:
    """SIGKILL every process carrying this test's marker (agents survive a coordinator
    SIGKILL: they run in their own sessions); returns the pids found."""
    procs = marked_processes(marker)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)
    return [p.pid for p in procs]


def process_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment for a coordinator process (and, through it, its local agents)."""
    env = dict(os.environ)
    env.update({
        "VM_FLEET_SECRET": SECRET_HEX,
        "VM_ADMIN_TOKEN": ADMIN_TOKEN,
        "VM_CONFIG_DIR": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
        TEST_MARKER_ENV: f"fault-{os.getpid()}-{time.monotonic_ns()}",
    })
    env.update(extra)
    return env


class CoordinatorProcess:
    """``vast-manager serve`` in its own process on a fixed port and database."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *, provider: str = "local",
                 port: int | None = None) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.provider = provider
        self.port = port or free_port()
        self.db_path = tmp_path / "fleet.db"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        args = [sys.executable, "-m", "vast_manager.coordinator.cli",
                "serve", "--db", str(self.db_path),
                "--port", str(self.port), "--provider", self.provider]
        with open(self.tmp_path / "coordinator.log", "ab") as log:
            self.proc = subprocess.Popen(args, env=self.env, cwd=self.tmp_path, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.starts += 1

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the coordinator exited with {self.proc.returncode}")
            try:
                return http(self.url + "/openapi.json", timeout_s=2)[0] == 200
            except OSError:
                return False

        wait_until(up, "the coordinator to answer", timeout_s)
        # It refuses timestamps at or before the second it started (replay protection
        # across restarts): let that second pass before the first signed request.
        ready = int(time.time())
        wait_until(lambda: int(time.time()) > ready, "the next second", 2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def rss_bytes(self) -> int:
        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)


# --- what agents produced against what the coordinator stored ------------------------------

_AGENT_RE = re.compile(r"agent (ag_[0-9a-f]{20}) starting")
_SPOOLED_RE = re.compile(r"result (\S+) spooled")
_DELIVERED_RE = re.compile(r"result (\S+) delivered")


def audit_results(instances_dir: Path, db_path: Path,
                  gone: Collection[int] = ()) -> dict[str, int]:
    """Every result an agent spooled (produced) is stored exactly once; every result it saw
    acknowledged is stored; no result is left in any spool, except a stored one on an
    instance in ``gone`` (provider ids: destroyed before the acknowledgement reached its
    agent). Returns totals."""
    totals = {"agents": 0, "produced": 0, "acknowledged": 0, "stored": 0,
              "stopped_early": 0, "without_result": 0}
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        for log_path in sorted(instances_dir.glob("instance-*/agent.log")):
            text = log_path.read_text(errors="replace")
            found = _AGENT_RE.search(text)
            if found is None:
                continue  # never started (e.g. destroyed before its first line)
            agent_id = found.group(1)
            produced = set(_SPOOLED_RE.findall(text))
            acknowledged = set(_DELIVERED_RE.findall(text))
            # Rows the coordinator writes itself (an early verdict that stopped a benchmark,
            # flagged early_verdict) are not results the agent produced.
            rows = db.execute(
                "select result_id, count(*) from results where agent_id = ? "
                "and instr(coalesce(flags, ''), 'early_verdict') = 0 group by result_id",
                (agent_id,),
            ).fetchall()
            stored = {rid: n for rid, n in rows}
            assert all(n == 1 for n in stored.values()), (agent_id, stored)
            assert acknowledged <= produced, (agent_id, acknowledged - produced)
            assert set(stored) == produced, (
                f"{agent_id}: produced but not stored {produced - set(stored)}, "
                f"stored but never produced {set(stored) - produced}"
            )
            left = list((log_path.parent / "state" / "spool").glob("*-result-*.json"))
            if _provider_id(log_path.parent) in gone:
                left = [p for p in left if p.stem.split("-result-", 1)[1] not in stored]
            assert left == [], f"{agent_id}: results still spooled: {left}"
            # An agent whose benchmark an early verdict stopped produced no result of its
            # own: the coordinator's early_verdict row is its measurement.
            stopped_early = db.execute(
                "select count(*) from results where agent_id = ? "
                "and instr(coalesce(flags, ''), 'early_verdict') > 0",
                (agent_id,),
            ).fetchone()[0]
            if not produced:
                totals["stopped_early" if stopped_early else "without_result"] += 1
            totals["agents"] += 1
            totals["produced"] += len(produced)
            totals["acknowledged"] += len(acknowledged)
            totals["stored"] += len(stored)
    return totals


SETTLED_FINAL = {"destroyed", "failed", "lost", "terminating", "vanished"}


def gone_instances(instances: list[dict[str, Any]]) -> set[int]:
    """The provider ids of ``instances`` in a final state."""
    return {int(i["provider_instance_id"]) for i in instances
            if i.get("state") in SETTLED_FINAL and i.get("provider_instance_id") is not None}


def spooled_results(instances_dir: Path, instances: list[dict[str, Any]]) -> list[Path]:
    """Results still spooled on instances not gone. An agent resends a result until the
    coordinator's acknowledgement reaches it, so after a lost response the coordinator can
    hold a result (and the fleet look settled) while its agent's spool still has it."""
    gone = gone_instances(instances)
    return [p for p in instances_dir.glob("instance-*/state/spool/*-result-*.json")
            if _provider_id(p.parents[2]) not in gone]


def _provider_id(instance_dir: Path) -> int:
    """The provider id a local instance's folder (``instance-<id>``) is named by."""
    return int(instance_dir.name.removeprefix("instance-"))


def fleet_settled(instances: list[dict[str, Any]], scaling: list[dict[str, Any]]) -> bool:
    """Every instance's fate is decided: gone, or proving after its verdict (and, with
    several GPUs, after its scaling result), with no rebenchmark still pending."""
    scaled = {int(s["instance_id"]) for s in scaling if s.get("instance_id") is not None}
    for inst in instances:
        if inst.get("state") in SETTLED_FINAL:
            continue
        if inst.get("phase") != "proving" or inst.get("rate_per_hour") is None:
            return False
        if inst.get("rebenchmark_pending"):
            return False
        if (inst.get("num_gpus") or 1) > 1 and int(inst["id"]) not in scaled:
            return False
    return bool(instances)
