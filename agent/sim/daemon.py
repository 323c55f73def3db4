"""``vm-sim-cuzk``: a simulated cuzk proving daemon driven by `agent.sim.model`.

Same flags as the real ``cuzk`` (``-c/--config``, ``-l/--listen``,
``--log-level``) and the same ``cuzk.toml`` sections. It serves the real
``GET /status`` JSON on ``[daemon] status_listen`` and, on ``listen`` (where
the real daemon speaks gRPC), the simulator's **private HTTP/JSON transport**
that ``vm-sim-cuzk-bench`` uses:

=====================================  =============================================
``GET  /sim/v1/health``                ``{"ok", "simulated", "time_scale", "sim_time_s"}``
``POST /sim/v1/batch``                 ``{"proof_type", "count", "concurrency"}`` ->
                                       NDJSON stream: one ``{"event": "proof", ...}``
                                       line per proof as it completes, then
                                       ``{"event": "done", "total_s", ...}``
``POST /sim/v1/prove``                 ``{"proof_type"}`` -> one proof's result
``POST /sim/v1/preload``               ``{"circuit_id"}`` -> ``{"already_loaded", "load_time_ms"}``
``GET  /sim/v1/status``                what ``cuzk-bench status`` prints
``GET  /sim/v1/metrics``               Prometheus text (also ``GET /metrics`` on status_listen)
=====================================  =============================================

Time runs at ``VM_SIM_TIME_SCALE`` simulated seconds per real second; every
duration it reports is simulated. While it runs it writes the live hardware
state to ``VM_SIM_STATE_FILE`` (docs/architecture.md), which the fake NVML and
fake host probe read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import math
import os
import signal
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from agent.sim import model
from agent.sim.hardware import ENV_STATE_FILE, Profile, load_profile, time_scale
from agent.sim.model import BatchDriver, Counters, ProofSim, SimConfig, Simulation

log = logging.getLogger("cuzk_daemon")

DEFAULT_CONFIG_PATH = "/data/zk/cuzk.toml"
# The real daemon binds 0.0.0.0; a simulator has no business outside loopback.
DEFAULT_LISTEN = "127.0.0.1:9820"
DEFAULT_STATUS_LISTEN = "127.0.0.1:9821"
DEFAULT_PARAM_CACHE = "/data/zk/params"
PCE_FILE_NAME = "pce-porep-32g.bin"
CIRCUIT_ID = "porep-32g"
SUPPORTED_PROOF_TYPES = {"porep", "porep-c2", "seal-commit"}
TICK_REAL_S = 0.01
STATE_WRITE_REAL_S = 0.1  # the documented contract is "at least every 0.2 s"
THERMAL_TAU_S = 60.0  # simulated seconds for GPU temperature to settle
LOAD1_TAU_S = 60.0  # the kernel's 1-minute load average
AMBIENT_C = 32.0
IDLE_SM_CLOCK_MHZ = 210.0
KEEP_FINISHED_PROOFS = 64


class ConfigError(Exception):
    """cuzk.toml could not be used."""


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_size(value: Any) -> int:
    """``"5GiB"``, ``"200 GB"`` or an integer of bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"not a size: {value!r}")
    if isinstance(value, int | float):
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num) :]
    if unit not in _SIZE_UNITS or not num:
        raise ConfigError(f"not a size: {value!r}")
    try:
        return int(float(num) * _SIZE_UNITS[unit])
    except ValueError as exc:
        raise ConfigError(f"not a size: {value!r}") from exc


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """What the daemon takes from cuzk.toml and its flags."""

    listen: str = DEFAULT_LISTEN
    status_listen: str | None = DEFAULT_STATUS_LISTEN
    param_cache: Path = Path(DEFAULT_PARAM_CACHE)
    sim: SimConfig = field(default_factory=SimConfig)


def load_settings(path: str | None, listen_override: str | None) -> DaemonSettings:
    """Read cuzk.toml (tomllib); a missing default file means defaults, as cuzk does."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if p.exists():
            try:
                data = tomllib.loads(p.read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read {p}: {exc}") from exc
        elif path != DEFAULT_CONFIG_PATH:
            raise ConfigError(f"config file {p} does not exist")
    daemon = data.get("daemon") or {}
    srs = data.get("srs") or {}
    memory = data.get("memory") or {}
    gpus = data.get("gpus") or {}
    synthesis = data.get("synthesis") or {}
    devices_raw = gpus.get("devices", [])
    if not isinstance(devices_raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in devices_raw
    ):
        raise ConfigError("gpus.devices must be a list of GPU ordinals")
    budget_raw = memory.get("total_budget", "auto")
    budget = None if str(budget_raw).lower() == "auto" else parse_size(budget_raw)
    max_conc_raw = synthesis.get("max_concurrent", "auto")
    max_concurrent = None if str(max_conc_raw).lower() == "auto" else int(max_conc_raw)
    sim = SimConfig(
        devices=tuple(devices_raw) or None,
        workers_per_device=max(1, int(gpus.get("gpu_workers_per_device", 2))),
        max_concurrent=max_concurrent if max_concurrent and max_concurrent > 0 else None,
        synthesis_threads=max(0, int(synthesis.get("threads", 0))),
        total_budget_bytes=budget,
        safety_margin_bytes=parse_size(
            memory.get("safety_margin", model.DEFAULT_SAFETY_MARGIN_BYTES)
        ),
    )
    status_listen = daemon.get("status_listen", DEFAULT_STATUS_LISTEN)
    return DaemonSettings(
        listen=listen_override or str(daemon.get("listen", DEFAULT_LISTEN)),
        status_listen=str(status_listen) if status_listen else None,
        param_cache=Path(str(srs.get("param_cache", DEFAULT_PARAM_CACHE))),
        sim=sim,
    )


def split_address(addr: str) -> tuple[str, str]:
    """Split ``host:port``, ``http://host:port`` or ``unix:///path`` into (kind, where)."""
    if addr.startswith("unix://"):
        return "unix", addr[len("unix://") :]
    text = addr.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"bad listen address {addr!r}: expected host:port")
    return "tcp", f"{host.strip('[]') or '127.0.0.1'}:{port}"


class _CuzkFormatter(logging.Formatter):
    """tracing-subscriber's default look: ``2025-01-01T00:00:00.000000Z  INFO target: msg``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        return f"{ts}.{micros:06d}Z {record.levelname:>5} {record.name}: {record.getMessage()}"


_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CuzkFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # RUST_LOG-style "info" or "cuzk=debug,hyper=warn": the first directive sets the level.
    name = level.split(",")[0].split("=")[-1].strip().lower()
    root.setLevel(_LEVELS.get(name, logging.INFO))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def proof_result(index: int, proof: ProofSim) -> dict[str, Any]:
    """One proof as the private transport sends it (simulated seconds)."""
    synth_ms = sum(
        (p.synth_ended - p.synth_started) * 1000
        for p in proof.partitions
        if p.synth_started is not None and p.synth_ended is not None
    )
    return {
        "event": "proof",
        "index": index,
        "job_id": proof.job_id,
        "status": "COMPLETED" if proof.status == "completed" else "FAILED",
        "wall_s": round(proof.wall_s, 6),
        "prove_ms": proof.prove_ms,
        "queue_ms": proof.queue_ms,
        "synth_ms": round(synth_ms),
        "error": proof.error,
        "proof_hex": (_proof_bytes(proof.job_id).hex() if proof.status == "completed" else ""),
    }


def _proof_bytes(job_id: str) -> bytes:
    """Stand-in Groth16 proof bytes (simulated; deterministic per job)."""
    out = b""
    counter = 0
    while len(out) < model.PROOF_BYTES:
        out += hashlib.sha256(f"{job_id}:{counter}".encode()).digest()
        counter += 1
    return out[: model.PROOF_BYTES]


@dataclass(slots=True)
class _GpuTelemetry:
    temp_c: float = AMBIENT_C + 3.0
    last: dict[str, Any] = field(default_factory=dict)


class SimDaemon:
    """The live simulation, mapped onto wall-clock time, plus its HTTP faces."""

    def __init__(
        self,
        settings: DaemonSettings,
        profile: Profile,
        scale: float,
        state_file: Path | None,
    ) -> None:
        self.settings = settings
        self.profile = profile
        self.scale = scale
        self.state_file = state_file
        self.pce_path = settings.param_cache / PCE_FILE_NAME
        pce_present = self.pce_path.is_file()
        seed = profile.sim.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "big")
        self.sim = Simulation(profile, settings.sim, seed=seed, pce_present=pce_present)
        self.sim.on_pce_extracted = self._write_pce
        self.t0 = time.monotonic()
        self.stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runners: list[web.AppRunner] = []
        self._gpu_tel = {i: _GpuTelemetry() for i in range(profile.num_gpus)}
        self._prev_counters: Counters | None = None
        self._load1 = 0.0
        self._cpu_last: dict[str, Any] = {}
        self._finished: list[str] = []
        if pce_present:
            log.info("PCE found at %s; loading it (fast path after load)", self.pce_path)
        else:
            log.info(
                "no PCE at %s: proofs take the slow path; the first one records the PCE",
                self.pce_path,
            )

    # ----- time -----

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) * self.scale

    def _sync(self) -> None:
        self.sim.advance_to(self.sim_now())

    async def _tick_loop(self) -> None:
        while True:
            self._sync()
            await asyncio.sleep(TICK_REAL_S)

    def _write_pce(self) -> None:
        """Write the stand-in PCE file (tiny, never the real 25 GiB)."""
        try:
            self.settings.param_cache.mkdir(parents=True, exist_ok=True)
            body = orjson.dumps(
                {
                    "simulated": True,
                    "circuit_id": CIRCUIT_ID,
                    "represents_bytes": model.PCE_BYTES,
                    "recorded_at_sim_s": round(self.sim.t, 3),
                }
            )
            _write_atomic(self.pce_path, body)
            log.info(
                "PCE extracted and saved to %s (simulated stand-in); restart to load it",
                self.pce_path,
            )
        except OSError as exc:
            log.error("cannot save PCE to %s: %s", self.pce_path, exc)

    def _remember(self, proof: ProofSim) -> None:
        self._finished.append(proof.job_id)
        while len(self._finished) > KEEP_FINISHED_PROOFS:
            self.sim.forget(self._finished.pop(0))
        if proof.status == "completed":
            log.info(
                "proof completed job_id=%s kind=%s wall=%.1fs gpu=%dms queue=%dms (simulated)",
                proof.job_id,
                proof.kind,
                proof.wall_s,
                proof.prove_ms,
                proof.queue_ms,
            )
        else:
            log.warning("proof failed job_id=%s error=%s (simulated)", proof.job_id, proof.error)

    # ----- /status -----

    def status_json(self) -> dict[str, Any]:
        self._sync()
        sim = self.sim
        now = sim.t
        pipelines = []
        for proof in sim.proofs.values():
            if proof.status not in ("queued", "running"):
                continue
            parts = []
            for p in proof.partitions:
                synth_ms = 0
                if p.synth_started is not None:
                    end = p.synth_ended if p.synth_ended is not None else now
                    synth_ms = round((end - p.synth_started) * 1000)
                gpu_ms = 0
                if p.compute_started is not None:
                    end = p.gpu_ended if p.gpu_ended is not None else now
                    gpu_ms = round((end - p.compute_started) * 1000)
                parts.append(
                    {"index": p.index, "state": p.state, "synth_ms": synth_ms, "gpu_ms": gpu_ms}
                )
            pipelines.append(
                {
                    "job_id": proof.job_id,
                    "proof_kind": proof.kind,
                    "started_secs_ago": round(now - proof.submitted_at, 3),
                    "total_partitions": model.PARTITIONS_PER_PROOF,
                    "partitions_done": proof.partitions_done,
                    "partitions": parts,
                }
            )
        workers = []
        wpd = sim.config.workers_per_device
        for d in sorted(sim.gpus):
            g = sim.gpus[d]
            for w, held in enumerate(g.workers):
                workers.append(
                    {
                        "worker_id": d * wpd + w,
                        "gpu_ordinal": d,
                        "state": "proving" if held is not None else "idle",
                        "current_job": held.proof.job_id if held is not None else None,
                        "current_partition": held.index if held is not None else None,
                        "busy_secs": round(g.worker_busy_s[w], 3),
                    }
                )
        srs_alloc = []
        if sim.srs_loaded:
            srs_alloc.append(
                {
                    "circuit_id": CIRCUIT_ID,
                    "bytes": model.SRS_BYTES,
                    "last_used_secs_ago": round(now - sim.srs_last_used, 3),
                    "evictable": False,
                }
            )
        pce_alloc = []
        if sim.pce_loaded:
            pce_alloc.append(
                {
                    "circuit_id": CIRCUIT_ID,
                    "bytes": model.PCE_BYTES,
                    "last_used_secs_ago": round(now - sim.pce_last_used, 3),
                    "evictable": True,
                }
            )
        used = sim.memory_used_bytes() - model.OS_BASELINE_BYTES
        budget = sim.budget_bytes
        return {
            "simulated": True,
            "uptime_secs": int(now),
            "memory": {
                "total_bytes": budget,
                "used_bytes": used,
                "available_bytes": max(0, budget - used),
            },
            "synthesis": {"max_concurrent": sim.max_concurrent, "active": sim.synthesis_active},
            "pipelines": pipelines,
            "gpu_workers": workers,
            "allocations": {"srs": srs_alloc, "pce": pce_alloc},
            "counters": {
                "total_completed": sim.total_completed,
                "total_failed": sim.total_failed,
                "completed_by_kind": dict(sim.completed_by_kind),
                "failed_by_kind": dict(sim.failed_by_kind),
                "queue_depth": sim.queue_depth,
            },
            "buffers": {
                "partitions_in_flight": sim.memory_in_flight,
                "partition_bytes": model.PARTITION_HOST_BYTES,
                "in_flight_bytes": sim.memory_in_flight * model.PARTITION_HOST_BYTES,
                "synth_done_waiting": len(sim.synth_done),
            },
        }

    def metrics_text(self) -> str:
        self._sync()
        sim = self.sim
        lines = [
            "# HELP cuzk_proofs_completed_total Proofs completed (simulated).",
            "# TYPE cuzk_proofs_completed_total counter",
        ]
        for kind, n in sorted(sim.completed_by_kind.items()) or [("porep", 0)]:
            lines.append(f'cuzk_proofs_completed_total{{kind="{kind}"}} {n}')
        lines += [
            "# HELP cuzk_proofs_failed_total Proofs failed (simulated).",
            "# TYPE cuzk_proofs_failed_total counter",
        ]
        for kind, n in sorted(sim.failed_by_kind.items()) or [("porep", 0)]:
            lines.append(f'cuzk_proofs_failed_total{{kind="{kind}"}} {n}')
        lines += [
            "# HELP cuzk_queue_depth Proofs waiting to start (simulated).",
            "# TYPE cuzk_queue_depth gauge",
            f"cuzk_queue_depth {sim.queue_depth}",
            "# HELP cuzk_synthesis_active Partition syntheses running (simulated).",
            "# TYPE cuzk_synthesis_active gauge",
            f"cuzk_synthesis_active {sim.synthesis_active}",
            "# HELP cuzk_gpu_busy_seconds_total GPU compute seconds (simulated).",
            "# TYPE cuzk_gpu_busy_seconds_total counter",
        ]
        for d in sorted(sim.gpus):
            busy = sim.gpus[d].compute_busy_s
            lines.append(f'cuzk_gpu_busy_seconds_total{{gpu="{d}"}} {busy:.3f}')
        lines += [
            "# HELP cuzk_memory_used_bytes Host memory used by cuzk (simulated).",
            "# TYPE cuzk_memory_used_bytes gauge",
            f"cuzk_memory_used_bytes {sim.memory_used_bytes() - model.OS_BASELINE_BYTES}",
        ]
        return "\n".join(lines) + "\n"

    # ----- state file -----

    def state_json(self) -> dict[str, Any]:
        """The live hardware state of docs/architecture.md (simulated values)."""
        self._sync()
        sim = self.sim
        c = sim.counters()
        prev = self._prev_counters
        span = (c.t - prev.t) if prev is not None else 0.0
        profile = self.profile
        order = sorted(sim.gpus)
        if prev is not None and span > 1e-6:
            self._prev_counters = c
            busy = {
                d: (c.gpu_compute_busy_s[i] - prev.gpu_compute_busy_s[i]) / span
                for i, d in enumerate(order)
            }
            link = {
                d: (c.gpu_link_busy_s[i] - prev.gpu_link_busy_s[i]) / span
                for i, d in enumerate(order)
            }
            rx = {
                d: (c.gpu_upload_bytes[i] - prev.gpu_upload_bytes[i]) / span
                for i, d in enumerate(order)
            }
            tx = {
                d: (c.gpu_download_bytes[i] - prev.gpu_download_bytes[i]) / span
                for i, d in enumerate(order)
            }
            cpu_frac = (c.cpu_core_s - prev.cpu_core_s) / span / max(1, sim.cpu_cores)
            runnable = (c.cpu_demand_s - prev.cpu_demand_s) / span
            io_frac = (c.io_wait_s - prev.io_wait_s) / span
            gpus = [
                self._gpu_state(
                    i, busy.get(i, 0.0), link.get(i, 0.0), rx.get(i, 0.0), tx.get(i, 0.0), span
                )
                for i in range(profile.num_gpus)
            ]
            self._load1 += (runnable - self._load1) * (1 - math.exp(-span / LOAD1_TAU_S))
            util = min(100.0, max(0.0, cpu_frac * 100.0))
            self._cpu_last = {
                "util_pct": round(util, 2),
                "per_core_util_pct": self._per_core(util),
                "load1": round(self._load1, 2),
                "iowait_pct": round(0.2 + 8.0 * min(1.0, io_frac), 2),
            }
        else:
            if prev is None:
                self._prev_counters = c
            gpus = [
                self._gpu_tel[i].last or self._gpu_state(i, 0.0, 0.0, 0.0, 0.0, 0.0)
                for i in range(profile.num_gpus)
            ]
            if not self._cpu_last:
                self._cpu_last = {
                    "util_pct": 0.0,
                    "per_core_util_pct": self._per_core(0.0),
                    "load1": 0.0,
                    "iowait_pct": 0.2,
                }
        return {
            "ts": time.time(),
            "simulated": True,
            "gpus": gpus,
            "cpu": self._cpu_last,
            "ram": {"used_bytes": sim.memory_used_bytes(), "total_bytes": profile.ram_total_bytes},
        }

    def _per_core(self, util: float) -> list[float]:
        # The scheduler spreads the work: every core near the mean, a little
        # jitter so the numbers do not look machine-made.
        out = []
        for core in range(self.profile.cpu_cores):
            jitter = ((core * 2654435761) % 1000) / 1000.0 * 4.0 - 2.0
            out.append(round(min(100.0, max(0.0, util + jitter)), 1))
        return out

    def _gpu_state(
        self, index: int, busy: float, link: float, rx_bps: float, tx_bps: float, span: float
    ) -> dict[str, Any]:
        gm = self.profile.gpu
        tel = self._gpu_tel[index]
        slow = self.sim._slowdown() if index in self.sim.gpus else 1.0
        busy = min(1.0, max(0.0, busy))
        active = busy > 0.005 or link > 0.005
        power = gm.idle_w + (gm.tdp_w - gm.idle_w) * min(1.0, 0.9 * busy + 0.1 * link)
        heat = (slow - 1.0) * 40.0  # degrading hosts run hot: that is why they slow down
        target = AMBIENT_C + 48.0 * power / gm.tdp_w + heat
        if span > 0:
            tel.temp_c += (target - tel.temp_c) * (1 - math.exp(-span / THERMAL_TAU_S))
        reasons = 0
        if not active:
            reasons |= 0x1
        if busy > 0.95 and power >= 0.95 * gm.tdp_w:
            reasons |= 0x4
        if slow > 1.05 and busy > 0.05:
            reasons |= 0x20
        if slow > 1.3 and busy > 0.05:
            reasons |= 0x40
        vram = self.profile.gpu_ram_mb * 1_000_000
        in_use = index in self.sim.gpus
        mem = model.GPU_CONTEXT_BYTES if in_use else 0
        if active:
            mem += int(model.GPU_WORKING_FRACTION * (vram - model.GPU_CONTEXT_BYTES))
        state = {
            "index": index,
            "util_pct": round(busy * 100.0, 2),
            "mem_used_bytes": mem,
            "pcie_tx_kbps": round(tx_bps / 1000.0, 1),
            "pcie_rx_kbps": round(rx_bps / 1000.0, 1),
            "power_w": round(power, 1),
            "temp_c": round(tel.temp_c, 1),
            "sm_clock_mhz": round(gm.boost_clock_mhz / slow if active else IDLE_SM_CLOCK_MHZ, 1),
            "throttle_reasons": reasons,
            # NVML's current link generation drops at idle (reference/nvml.md).
            "pcie_gen_current": self.profile.pcie_gen if active else 1,
            "pcie_width_current": self.profile.pcie_width,
        }
        tel.last = state
        return state

    async def _state_loop(self) -> None:
        assert self.state_file is not None
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                _write_atomic(self.state_file, orjson.dumps(self.state_json()))
            except OSError as exc:
                log.warning("cannot write state file %s: %s", self.state_file, exc)
            await asyncio.sleep(STATE_WRITE_REAL_S)

    # ----- private transport handlers -----

    async def h_health(self, request: web.Request) -> web.Response:
        self._sync()
        return web.json_response(
            {"ok": True, "simulated": True, "time_scale": self.scale, "sim_time_s": self.sim.t},
            dumps=lambda o: orjson.dumps(o).decode(),
        )

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            raise _bad_request("invalid_json", "body is not JSON") from exc
        if not isinstance(body, dict):
            raise _bad_request("invalid_json", "body must be a JSON object")
        return body

    def _check_type(self, body: dict[str, Any]) -> str:
        kind = str(body.get("proof_type", "porep")).lower()
        if kind not in SUPPORTED_PROOF_TYPES:
            raise _bad_request(
                "unsupported_proof_type", f"proof type {kind!r} is not simulated (porep only)"
            )
        return "porep"

    def _track(self) -> None:
        """Remember a long-running handler, so shutdown can end it instead of waiting."""
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def h_batch(self, request: web.Request) -> web.StreamResponse:
        self._track()
        body = await self._json_body(request)
        kind = self._check_type(body)
        try:
            count = int(body.get("count", 3))
            concurrency = int(body.get("concurrency", 1))
        except (TypeError, ValueError) as exc:
            raise _bad_request("bad_field", "count and concurrency must be integers") from exc
        if count < 0 or count > 100_000:
            raise _bad_request("bad_field", "count must be between 0 and 100000")
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def on_proof(index: int, proof: ProofSim) -> None:
            self._remember(proof)
            queue.put_nowait(proof_result(index, proof))

        def on_done(driver: BatchDriver) -> None:
            completed = sum(1 for _, p in driver.results if p.status == "completed")
            queue.put_nowait(
                {
                    "event": "done",
                    "total_s": round(driver.total_s, 6),
                    "completed": completed,
                    "failed": len(driver.results) - completed,
                }
            )

        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        self._sync()
        log.info("batch started: %d x %s, concurrency %d", count, kind, concurrency)
        BatchDriver(self.sim, count, concurrency, on_proof=on_proof, on_done=on_done, kind=kind)
        while True:
            item = await queue.get()
            await resp.write(orjson.dumps(item) + b"\n")
            if item["event"] == "done":
                break
        await resp.write_eof()
        return resp

    async def h_prove(self, request: web.Request) -> web.Response:
        self._track()
        body = await self._json_body(request)
        kind = self._check_type(body)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ProofSim] = loop.create_future()
        self._sync()
        srs_before = self.sim.srs_loaded

        def done(proof: ProofSim) -> None:
            self._remember(proof)
            if not fut.done():
                fut.set_result(proof)

        self.sim.submit(kind, on_done=done)
        proof = await fut
        out = proof_result(1, proof)
        out["srs_ms"] = 0 if srs_before else round(self.sim.srs_load_s * 1000)
        out["total_ms"] = round(proof.wall_s * 1000)
        return web.json_response(out, dumps=lambda o: orjson.dumps(o).decode())

    async def h_preload(self, request: web.Request) -> web.Response:
        self._track()
        body = await self._json_body(request)
        circuit = str(body.get("circuit_id", ""))
        if circuit != CIRCUIT_ID:
            raise _bad_request(
                "unknown_circuit", f"circuit {circuit!r} is not simulated ({CIRCUIT_ID} only)"
            )
        self._sync()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()

        def loaded(seconds: float) -> None:
            if not fut.done():
                fut.set_result(seconds)

        already = self.sim.request_srs(loaded)
        seconds = await fut
        if not already:
            log.info("SRS %s loaded in %.1fs (simulated)", circuit, seconds)
        return web.json_response(
            {
                "circuit_id": circuit,
                "already_loaded": already,
                "load_time_ms": round(seconds * 1000),
            }
        )

    async def h_sim_status(self, request: web.Request) -> web.Response:
        st = self.status_json()
        gpus = []
        for d in sorted(self.sim.gpus):
            g = self.sim.gpus[d]
            held = next((w for w in g.workers if w is not None), None)
            vram = self.profile.gpu_ram_mb * 1_000_000
            gpus.append(
                {
                    "ordinal": d,
                    "name": self.profile.gpu_name,
                    "vram_total_bytes": vram,
                    "vram_free_bytes": int(vram * (0.1 if held else 0.97)),
                    "current_job_id": held.proof.job_id if held else "",
                    "current_proof_kind": held.proof.kind if held else "",
                }
            )
        running = sum(1 for p in self.sim.proofs.values() if p.status == "running")
        return web.json_response(
            {
                "uptime_seconds": st["uptime_secs"],
                "total_proofs_completed": self.sim.total_completed,
                "total_proofs_failed": self.sim.total_failed,
                "pinned_memory_bytes": st["memory"]["used_bytes"],
                "pinned_memory_limit_bytes": st["memory"]["total_bytes"],
                "gpus": gpus,
                "loaded_srs": [
                    {
                        "circuit_id": a["circuit_id"],
                        "tier": "host",
                        "size_bytes": a["bytes"],
                        "ref_count": 1,
                    }
                    for a in st["allocations"]["srs"]
                ],
                "queues": [
                    {"proof_kind": "porep", "pending": self.sim.queue_depth, "in_progress": running}
                ],
            }
        )

    async def h_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status_json(), dumps=lambda o: orjson.dumps(o).decode())

    async def h_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    # ----- lifecycle -----

    async def start(self) -> None:
        private = web.Application()
        private.router.add_get("/sim/v1/health", self.h_health)
        private.router.add_post("/sim/v1/batch", self.h_batch)
        private.router.add_post("/sim/v1/prove", self.h_prove)
        private.router.add_post("/sim/v1/preload", self.h_preload)
        private.router.add_get("/sim/v1/status", self.h_sim_status)
        private.router.add_get("/sim/v1/metrics", self.h_metrics)
        await self._serve(private, self.settings.listen, "engine (simulator's private HTTP)")
        if self.settings.status_listen:
            status = web.Application()
            status.router.add_get("/status", self.h_status)
            status.router.add_get("/metrics", self.h_metrics)
            await self._serve(status, self.settings.status_listen, "status HTTP")
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        if self.state_file is not None:
            self._tasks.append(asyncio.create_task(self._state_loop()))

    async def _serve(self, app: web.Application, addr: str, what: str) -> None:
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        kind, where = split_address(addr)
        site: web.BaseSite
        if kind == "unix":
            path = str(where)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            site = web.UnixSite(runner, path)
        else:
            host, _, port = str(where).rpartition(":")
            site = web.TCPSite(runner, host, int(port))
        await site.start()
        log.info("%s listening on %s", what, addr)

    async def stop(self) -> None:
        # Proofs in flight die with the daemon, as with real cuzk; their
        # clients see the connection end.
        for handler in list(self._handlers):
            handler.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self.state_file is not None:
            # Readers fall back to idle values without it (docs/architecture.md),
            # so a stopped daemon never leaves a busy-looking host behind.
            with contextlib.suppress(OSError):
                self.state_file.unlink()


def _bad_request(code: str, message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=orjson.dumps({"error": code, "message": message}).decode(),
        content_type="application/json",
    )


async def run_daemon(settings: DaemonSettings, profile: Profile, scale: float) -> int:
    state_env = os.environ.get(ENV_STATE_FILE)
    daemon = SimDaemon(settings, profile, scale, Path(state_env) if state_env else None)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopping.set)
    try:
        await daemon.start()
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        await daemon.stop()
        return 1
    log.info(
        "cuzk daemon ready (SIMULATED: %dx %s, %d cores, %d MB RAM, PCIe Gen%d x%d, "
        "GPUs in use %s, time scale %gx)",
        profile.num_gpus,
        profile.gpu_name,
        profile.cpu_cores,
        profile.cpu_ram_mb,
        profile.pcie_gen,
        profile.pcie_width,
        daemon.sim.devices,
        scale,
    )
    await daemon.stopping.wait()
    log.info("shutting down")
    await daemon.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vm-sim-cuzk",
        description="Simulated cuzk proving daemon (a stand-in; every number is simulated).",
    )
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG_PATH, help="cuzk.toml path")
    parser.add_argument(
        "-l", "--listen", default=None, help="engine address (host:port or unix://)"
    )
    parser.add_argument("--log-level", default=None, help="error, warn, info, debug (or RUST_LOG)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level or os.environ.get("RUST_LOG") or "info")
    try:
        settings = load_settings(args.config, args.listen)
        split_address(settings.listen)
        if settings.status_listen:
            split_address(settings.status_listen)
        profile = load_profile()
        model.active_devices(profile, settings.sim)
    except (ConfigError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return asyncio.run(run_daemon(settings, profile, time_scale()))


if __name__ == "__main__":
    sys.exit(main())
