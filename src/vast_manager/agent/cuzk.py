"""Drives the cuzk programs (docs/cuzk.md): the daemon, cuzk-bench and GET /status.

Works unchanged with the real ``cuzk`` / ``cuzk-bench`` and the simulated
``vm-sim-cuzk`` / ``vm-sim-cuzk-bench``: it only uses their flags as their
clap definitions declare them, ``cuzk.toml`` keys and the ``/status`` JSON,
as read at Curio e0294b0f. The daemon listens where the agent says (its own
default is a Unix socket) and serves ``/status`` only because the agent
sets ``status_listen`` (off by default); it handles SIGINT only, which stops
its engine but not the process, so it is stopped with SIGINT, then SIGTERM
(whose default action ends it), then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from vast_manager.agent.benchparse import BenchLineParser, BenchOutputError, BenchRun, ProofLine
from vast_manager.agent.procs import LineSink, ManagedProcess

log = logging.getLogger(__name__)

PRELOAD_CIRCUIT = "porep-32g"
PCE_CIRCUIT = "porep-32g"  # /status allocations.pce circuit_id (srs_manager.rs Display)
# srs_manager.rs circuit_id_to_param_filename(Porep32G): the SRS whose size cuzk reserves.
POREP_32G_PARAMS = (
    "v28-stacked-proof-of-replication-merkletree-poseidon_hasher-8-8-0-sha256_hasher-"
    "82a357d2f2ca81dc61bb45f4a762807aedee1b0a53fd6c4e77b46a01bfef7820.params"
)
GIB = 1 << 30
# cuzk-core/src/memory.rs and config.rs
POREP_PARTITION_FULL_BYTES = 14 * GIB
SAFETY_MARGIN_BYTES = 5 * GIB
MAX_PARALLEL_SYNTHESIS = 18
EXTRACTION_FAILED_TEXT = "background PCE extraction failed"
SIGINT_GRACE_S = 1.0


class CuzkError(Exception):
    """cuzk or cuzk-bench did not do what was asked."""


class DaemonExited(CuzkError):
    """The daemon exited (or never came up)."""


class BenchFailed(CuzkError):
    """A cuzk-bench run failed: it exited non-zero or its output was cut short."""


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the daemon binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _toml_str(value: str) -> str:
    # JSON string escapes are a subset of TOML basic-string escapes.
    return json.dumps(value, ensure_ascii=False)


def render_config(
    *,
    listen: str,
    status_listen: str,
    param_cache: Path,
    total_budget: str,
    devices: Sequence[int] | None = None,
) -> str:
    """The daemon's ``cuzk.toml``. ``devices=None`` means every GPU (``devices = []``).

    ``total_budget`` is cuzk's size text (``"204800MiB"``), never ``"auto"``,
    which would read the host's MemTotal past the container's limit.
    """
    device_list = ", ".join(str(int(d)) for d in (devices or []))
    return (
        "# Written by vast-agent; rewritten at every daemon start.\n"
        "[daemon]\n"
        f"listen = {_toml_str(listen)}\n"
        f"status_listen = {_toml_str(status_listen)}\n"
        "\n[srs]\n"
        f"param_cache = {_toml_str(str(param_cache))}\n"
        "\n[memory]\n"
        f"total_budget = {_toml_str(total_budget)}\n"
        "\n[gpus]\n"
        f"devices = [{device_list}]\n"
    )


def budget_text(budget_bytes: int) -> str:
    """A byte count as cuzk's parse_size reads it exactly (whole MiB, rounded down)."""
    return f"{budget_bytes // (1 << 20)}MiB"


def parse_budget_text(text: str) -> int:
    """config.rs parse_size for the sizes `vast_manager.agent.config` accepts."""
    for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("GB", 10**9), ("MB", 10**6)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * unit
    return int(text)


def synthesis_workers(budget_bytes: int) -> int:
    """engine.rs: min(budget / 14 GiB, max_parallel_synthesis), at least 2."""
    return max(2, min(budget_bytes // POREP_PARTITION_FULL_BYTES, MAX_PARALLEL_SYNTHESIS))


def srs_reservation_bytes(params_dir: Path) -> int:
    """What cuzk reserves for the PoRep 32G SRS: the size of its .params file (0 if absent)."""
    try:
        return (params_dir / POREP_32G_PARAMS).stat().st_size
    except OSError:
        return 0


def daemon_argv(cuzk_bin: str, config_path: Path) -> list[str]:
    """``cuzk -c cuzk.toml`` (cuzk-daemon's ``-c/--config``)."""
    return [cuzk_bin, "--config", str(config_path)]


def preload_argv(bench_bin: str, addr: str, circuit: str = PRELOAD_CIRCUIT) -> list[str]:
    """``cuzk-bench --addr ADDR preload --circuit-id porep-32g`` (global options first)."""
    return [bench_bin, "--addr", addr, "preload", "--circuit-id", circuit]


def batch_argv(
    bench_bin: str, addr: str, *, c1_path: Path, count: int, concurrency: int,
    sector_num: int, miner_id: int,
) -> list[str]:
    """``cuzk-bench --addr ADDR batch --type porep --c1 FILE --count N --concurrency J ...``."""
    return [
        bench_bin, "--addr", addr, "batch", "--type", "porep", "--c1", str(c1_path),
        "--count", str(count), "--concurrency", str(concurrency),
        "--sector-num", str(sector_num), "--miner-id", str(miner_id),
    ]


def _counter(status: Mapping[str, Any], name: str) -> int | None:
    counters = status.get("counters")
    if isinstance(counters, dict):
        value = counters.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def completed_total(status: Mapping[str, Any]) -> int | None:
    """``counters.total_completed`` of a /status answer, or None when absent."""
    return _counter(status, "total_completed")


def has_pce(status: Mapping[str, Any]) -> bool:
    """Whether the daemon holds the PoRep PCE in memory (``allocations.pce``).

    engine.rs lists only the cache's evictable entries (no proof holding one),
    so read it while no proof runs, as the warm-up does.
    """
    allocations = status.get("allocations")
    if isinstance(allocations, dict):
        pce = allocations.get("pce")
        if isinstance(pce, list):
            return any(isinstance(e, dict) and e.get("circuit_id") == PCE_CIRCUIT for e in pce)
    return False


class CuzkDaemon:
    """The ``cuzk`` daemon as a child process, on free loopback ports."""

    def __init__(
        self,
        cuzk_bin: str,
        *,
        state_dir: Path,
        params_dir: Path,
        sink: LineSink,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.cuzk_bin = cuzk_bin
        self.state_dir = state_dir
        self.params_dir = params_dir
        self.config_path = state_dir / "cuzk.toml"
        self._sink = sink
        self.budget_bytes = 0
        self.extraction_failed = False
        base_env = dict(os.environ if env is None else env)
        # cuzk and the proofs library find the parameters through this.
        base_env["FIL_PROOFS_PARAMETER_CACHE"] = str(params_dir)
        self._env = base_env
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.devices: list[int] | None = None
        self.port = 0
        self.status_port = 0
        self._proc: ManagedProcess | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def addr(self) -> str:
        """The ``--addr`` for cuzk-bench."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.status_port}/status"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def exit_status(self, within_s: float) -> int | None:
        """The daemon's exit status once it has exited, waiting up to ``within_s`` for the
        exit to be seen; None while it runs (or when none was started)."""
        proc = self._proc
        if proc is None:
            return None
        if proc.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), within_s)
        return proc.returncode

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    def _line(self, source: str, text: str) -> None:
        if EXTRACTION_FAILED_TEXT in text:
            self.extraction_failed = True
        self._sink(source, text)

    async def start(self, devices: Sequence[int] | None = None, *, budget_bytes: int) -> None:
        """Write cuzk.toml, start the daemon and wait until GET /status answers."""
        await self.stop()  # a running daemon, or what is left of one that died
        self.devices = list(devices) if devices else None
        self.budget_bytes = budget_bytes
        self.extraction_failed = False
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # A port picked free can be taken before the daemon binds it: one more try.
        for attempt in (1, 2):
            self.port = free_loopback_port()
            self.status_port = free_loopback_port()
            while self.status_port == self.port:
                self.status_port = free_loopback_port()
            self.config_path.write_text(
                render_config(
                    listen=f"127.0.0.1:{self.port}",
                    status_listen=f"127.0.0.1:{self.status_port}",
                    param_cache=self.params_dir,
                    total_budget=budget_text(budget_bytes),
                    devices=self.devices,
                )
            )
            self._proc = ManagedProcess(
                daemon_argv(self.cuzk_bin, self.config_path),
                source="cuzk",
                sink=self._line,
                env=self._env,
            )
            try:
                await self._proc.start()
            except OSError as exc:
                raise DaemonExited(f"cannot start {self.cuzk_bin}: {exc}") from exc
            try:
                await self.wait_ready()
                log.info("cuzk daemon ready (pid %s, gpus %s)", self.pid,
                         "all" if self.devices is None else self.devices)
                return
            except DaemonExited:
                await self.stop()
                if attempt == 2:
                    raise
                log.warning("cuzk daemon exited during start-up; retrying on other ports")
            except BaseException:
                await self.stop()
                raise

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.05
        while True:
            if self._proc is None or not self._proc.running:
                code = self._proc.returncode if self._proc is not None else None
                raise DaemonExited(f"cuzk daemon exited with status {code} before it was ready")
            with contextlib.suppress(CuzkError):
                await self.status()
                return
            if time.monotonic() > deadline:
                raise DaemonExited(
                    f"cuzk daemon did not answer GET /status within {self.start_timeout_s:.0f} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def status(self) -> dict[str, Any]:
        """GET /status of the running daemon."""
        session = await self._http()
        try:
            async with session.get(self.status_url) as resp:
                if resp.status != 200:
                    raise CuzkError(f"GET /status answered {resp.status}")
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError, OSError) as exc:
            raise CuzkError(f"GET /status failed: {type(exc).__name__}") from exc
        if not isinstance(data, dict):
            raise CuzkError("GET /status did not answer a JSON object")
        return data

    async def stop(self) -> None:
        """SIGINT (the one signal cuzk handles: its engine stops), then SIGTERM, then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.running and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGINT)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SIGINT_GRACE_S):
                        await proc.wait()
        finally:
            code = await proc.stop(self.stop_timeout_s)
        log.info("cuzk daemon stopped (status %s)", code)

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None


class CuzkBench:
    """Runs ``cuzk-bench`` against a daemon."""

    def __init__(
        self,
        bench_bin: str,
        *,
        sink: LineSink,
        env: Mapping[str, str] | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.bench_bin = bench_bin
        self._sink = sink
        self._env = dict(env) if env is not None else None
        self.stop_timeout_s = stop_timeout_s

    async def _run(
        self, argv: list[str], on_line: Callable[[str], None] | None = None
    ) -> int:
        proc = ManagedProcess(
            argv, source="cuzk-bench", sink=self._sink, env=self._env, on_stdout_line=on_line
        )
        try:
            await proc.start()
        except OSError as exc:
            raise BenchFailed(f"cannot start {self.bench_bin}: {exc}") from exc
        try:
            return await proc.wait()
        finally:
            # Cancelled (a terminate directive) or failed: no bench left behind.
            await proc.stop(self.stop_timeout_s)

    async def preload(self, addr: str, circuit: str = PRELOAD_CIRCUIT) -> None:
        """``cuzk-bench --addr ADDR preload --circuit-id porep-32g``: load the SRS."""
        code = await self._run(preload_argv(self.bench_bin, addr, circuit))
        if code != 0:
            raise BenchFailed(f"cuzk-bench preload exited with status {code}")

    async def batch(
        self,
        addr: str,
        *,
        c1_path: Path,
        count: int,
        concurrency: int,
        sector_num: int,
        miner_id: int,
        on_proof: Callable[[ProofLine], None] | None = None,
    ) -> BenchRun:
        """``cuzk-bench batch --type porep``; ``on_proof`` sees each proof line as it is
        printed (in submission order: with ``concurrency`` above 1, later than the proof
        finished)."""
        parser = BenchLineParser()

        def on_line(line: str) -> None:
            proof = parser.feed(line)
            if proof is not None and on_proof is not None:
                on_proof(proof)

        argv = batch_argv(
            self.bench_bin, addr, c1_path=c1_path, count=count, concurrency=concurrency,
            sector_num=sector_num, miner_id=miner_id,
        )
        code = await self._run(argv, on_line)
        try:
            run = parser.finish()
        except BenchOutputError as exc:
            raise BenchFailed(f"cuzk-bench batch (status {code}): {exc}") from exc
        if code != 0:
            raise BenchFailed(f"cuzk-bench batch exited with status {code}")
        for warning in run.warnings:
            log.warning("cuzk-bench: %s", warning)
        return run
