"""Drives the cuzk programs (reference/cuzk.md): the daemon, cuzk-bench and GET /status.

Works unchanged with the real ``cuzk`` / ``cuzk-bench`` and the simulated
``vm-sim-cuzk`` / ``vm-sim-cuzk-bench``: it only uses their documented flags,
``cuzk.toml`` and the ``/status`` JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from agent.benchparse import BenchLineParser, BenchOutputError, BenchRun, ProofLine
from agent.procs import LineSink, ManagedProcess

log = logging.getLogger("agent.cuzk")

PCE_FILE_NAME = "pce-porep-32g.bin"
PRELOAD_CIRCUIT = "porep-32g"


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
    devices: Sequence[int] | None = None,
    total_budget: str = "auto",
    safety_margin: str = "5GiB",
) -> str:
    """The daemon's ``cuzk.toml``. ``devices=None`` means every GPU (``devices = []``)."""
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
        f"safety_margin = {_toml_str(safety_margin)}\n"
        "\n[gpus]\n"
        f"devices = [{device_list}]\n"
    )


def completed_total(status: Mapping[str, Any]) -> int | None:
    """``counters.total_completed`` of a /status answer, or None when absent."""
    counters = status.get("counters")
    if isinstance(counters, dict):
        value = counters.get("total_completed")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def has_pce(status: Mapping[str, Any]) -> bool:
    allocations = status.get("allocations")
    if isinstance(allocations, dict):
        pce = allocations.get("pce")
        return isinstance(pce, list) and len(pce) > 0
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
    def pce_path(self) -> Path:
        return self.params_dir / PCE_FILE_NAME

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._session

    async def start(self, devices: Sequence[int] | None = None) -> None:
        """Write cuzk.toml, start the daemon and wait until GET /status answers."""
        if self.running:
            await self.stop()
        self.devices = list(devices) if devices else None
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
                    devices=self.devices,
                )
            )
            self._proc = ManagedProcess(
                [self.cuzk_bin, "-c", str(self.config_path)],
                source="cuzk",
                sink=self._sink,
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
                await self._proc.stop(self.stop_timeout_s)
                if attempt == 2:
                    raise
                log.warning("cuzk daemon exited during start-up; retrying on other ports")
            except BaseException:
                await self._proc.stop(self.stop_timeout_s)
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

    async def wait_exit(self) -> int:
        if self._proc is None:
            raise DaemonExited("cuzk daemon was never started")
        return await self._proc.wait()

    async def stop(self) -> None:
        if self._proc is not None:
            code = await self._proc.stop(self.stop_timeout_s)
            log.info("cuzk daemon stopped (status %s)", code)
            self._proc = None

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
        """``cuzk-bench --addr ADDR preload -c porep-32g``: load the SRS into the daemon."""
        code = await self._run([self.bench_bin, "--addr", addr, "preload", "-c", circuit])
        if code != 0:
            raise BenchFailed(f"cuzk-bench preload exited with status {code}")

    async def batch(
        self,
        addr: str,
        *,
        c1_path: Path,
        count: int,
        concurrency: int,
        on_proof: Callable[[ProofLine], None] | None = None,
    ) -> BenchRun:
        """``cuzk-bench batch -t porep``; ``on_proof`` sees each proof line as it comes."""
        parser = BenchLineParser()

        def on_line(line: str) -> None:
            proof = parser.feed(line)
            if proof is not None and on_proof is not None:
                on_proof(proof)

        argv = [
            self.bench_bin, "--addr", addr, "batch", "-t", "porep", "--c1", str(c1_path),
            "-n", str(count), "-j", str(concurrency),
        ]
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
