"""``vm-sim-cuzk``: a simulated cuzk proving daemon driven by `vast_manager.sim.physics`.

It stands in for ``cuzk-daemon`` (installed as ``cuzk``) at Curio ``e0294b0f``
(docs/cuzk.md): the same flags, parsed and refused as clap does
(`vast_manager.sim.cuzk_cli`); the same ``cuzk.toml`` keys, types and defaults (a
missing file means defaults; unknown keys are ignored; a wrong type stops
the daemon with exit status 1); ``listen`` defaults to
``unix:///run/curio/cuzk.sock`` and ``[daemon] status_listen`` to off; it
serves the real ``GET /status`` JSON there (anything else: 404); SIGINT
only stops its engine (the process keeps serving, as the real one does),
SIGTERM ends it at once. The memory budget is ``[memory] total_budget`` or
"auto" (the MemTotal it sees less ``safety_margin``, blind to a container's
limit: a simulated container whose memory runs out is OOM-killed, SIGKILL).

On ``listen`` the real daemon speaks gRPC; the simulator speaks its
**private HTTP/JSON transport** to ``vm-sim-cuzk-bench`` instead:

=====================================  =============================================
``GET  /sim/v1/health``                ``{"ok", "simulated", "time_scale", "sim_time_s"}``
``POST /sim/v1/prove``                 one Prove RPC: ``{"proof_kind", "c1_b64",
                                       "sector_num", "miner_id"}`` -> its result
``POST /sim/v1/preload``               ``{"circuit_id"}`` -> ``{"already_loaded", "load_time_ms"}``
``GET  /sim/v1/status``                what ``cuzk-bench status`` prints (GetStatus)
``GET  /sim/v1/metrics``               Prometheus text (GetMetrics)
=====================================  =============================================

Time runs at ``VM_SIM_TIME_SCALE`` simulated seconds per real second; every
duration it reports is simulated. ``VM_SIM_BUDGET_BLOCK_TIMEOUT`` (simulated
seconds, default 1800) bounds how long a proof waits for budget that nothing
will free; the real daemon waits for ever. While it runs it writes the live
hardware state to ``VM_SIM_STATE_FILE`` (docs/architecture.md), which the
fake NVML and fake host probe read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import ipaddress
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

from vast_manager.sim import clap, physics
from vast_manager.sim.cuzk_cli import CUZK_DAEMON
from vast_manager.sim.fake_c1 import check_request
from vast_manager.sim.hardware import ENV_STATE_FILE, Profile, load_profile, time_scale
from vast_manager.sim.physics import Counters, ProofSim, SimConfig, Simulation

log = logging.getLogger("cuzk_daemon")
engine_log = logging.getLogger("cuzk_core::engine")

DEFAULT_CONFIG_PATH = "/data/zk/cuzk.toml"
DEFAULT_LISTEN = "unix:///run/curio/cuzk.sock"  # cuzk-core/src/config.rs
DEFAULT_PARAM_CACHE = "/data/zk/params"
PCE_FILE_NAME = "pce-porep-32g.bin"  # cuzk-pce/src/disk.rs pce_filename("porep-32g")
CIRCUIT_ID = "porep-32g"
PROOF_KIND = "porep-c2"  # cuzk-core/src/types.rs Display for ProofKind::PoRepSealCommit
ENV_BLOCK_TIMEOUT = "VM_SIM_BUDGET_BLOCK_TIMEOUT"
# status.rs: finished jobs stay in /status for 30 s (of the wall clock: here real
# seconds, so a fast simulated clock does not hide them from a poller).
PIPELINE_KEEP_S = 30.0
TICK_REAL_S = 0.01
STATE_WRITE_REAL_S = 0.1  # the documented contract is "at least every 0.2 s"
THERMAL_TAU_S = 60.0  # simulated seconds for GPU temperature to settle
LOAD1_TAU_S = 60.0  # the kernel's 1-minute load average
AMBIENT_C = 32.0
IDLE_SM_CLOCK_MHZ = 210.0
KEEP_FINISHED_PROOFS = 64
# AwaitProofResponse.Status (cuzk-proto/proto/cuzk/v1/proving.proto)
STATUS_COMPLETED, STATUS_FAILED = 1, 2


class ConfigError(Exception):
    """cuzk.toml could not be used (the real daemon: exit status 1)."""


def parse_size(text: str) -> int:
    """config.rs ``parse_size``: integer GiB/MiB/GB/MB or bytes; what it cannot read is 50 GiB."""
    s = text.strip()
    for suffix, unit, fallback in (("GiB", 1 << 30, 50), ("MiB", 1 << 20, 0),
                                   ("GB", 10**9, 50), ("MB", 10**6, 0)):
        if s.endswith(suffix):
            num = s[: -len(suffix)].strip()
            return (int(num) if num.isdigit() else fallback) * unit
    return int(s) if s.isdigit() else 50 * (1 << 30)


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """What the daemon takes from cuzk.toml and its flags."""

    listen: str = DEFAULT_LISTEN
    status_listen: str = ""
    param_cache: Path = Path(DEFAULT_PARAM_CACHE)
    log_level: str = "info"
    pipeline_enabled: bool = True
    sim: SimConfig = field(default_factory=SimConfig)


# (section, key) -> the TOML type serde expects (config.rs); anything else is ignored.
_STR, _INT, _BOOL, _U32_LIST = "a string", "an integer", "a boolean", "a sequence"
CONFIG_TYPES: dict[tuple[str, str], str] = {
    ("daemon", "listen"): _STR, ("daemon", "status_listen"): _STR,
    ("memory", "total_budget"): _STR, ("memory", "safety_margin"): _STR,
    ("memory", "eviction_min_idle"): _STR, ("memory", "pinned_budget"): _STR,
    ("memory", "working_memory_budget"): _STR,
    ("gpus", "devices"): _U32_LIST, ("gpus", "gpu_threads"): _INT,
    ("gpus", "gpu_workers_per_device"): _INT,
    ("scheduler", "max_batch_size"): _INT, ("scheduler", "max_batch_wait_ms"): _INT,
    ("scheduler", "sort_by_type"): _BOOL,
    ("synthesis", "threads"): _INT, ("synthesis", "partition_workers"): _INT,
    ("pipeline", "enabled"): _BOOL, ("pipeline", "synthesis_lookahead"): _INT,
    ("pipeline", "synthesis_concurrency"): _INT, ("pipeline", "max_parallel_synthesis"): _INT,
    ("pipeline", "slot_size"): _INT, ("pipeline", "max_gpu_queue_depth"): _INT,
    ("srs", "param_cache"): _STR, ("logging", "level"): _STR, ("logging", "format"): _STR,
}


def _toml_kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    return "map" if isinstance(value, dict) else type(value).__name__


def _typed(section: str, key: str, value: Any) -> Any:
    want = CONFIG_TYPES[(section, key)]
    ok = {
        _STR: isinstance(value, str),
        _INT: isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32,
        _BOOL: isinstance(value, bool),
        _U32_LIST: isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32 for v in value
        ),
    }[want]
    if not ok:
        raise ConfigError(f"invalid type: {_toml_kind(value)}, expected {want}\n"
                          f"in `{section}.{key}`")
    return value


def load_settings(path: str, listen_override: str | None, level_override: str | None,
                  profile: Profile) -> DaemonSettings:
    """cuzk.toml as cuzk-daemon reads it (a missing file: defaults)."""
    data: dict[str, Any] = {}
    p = Path(path)
    if p.exists():
        try:
            data = tomllib.loads(p.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(str(exc)) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"TOML parse error: {exc}") from exc
    cfg: dict[tuple[str, str], Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            if section in {s for s, _ in CONFIG_TYPES}:
                raise ConfigError(f"invalid type: {_toml_kind(table)}, expected struct\n"
                                  f"in `{section}`")
            continue
        for key, value in table.items():
            if (section, key) in CONFIG_TYPES:
                cfg[(section, key)] = _typed(section, key, value)

    def get(section: str, key: str, default: Any) -> Any:
        return cfg.get((section, key), default)

    budget = str(get("memory", "total_budget", "auto"))
    margin = parse_size(str(get("memory", "safety_margin", "5GiB")))
    sim = SimConfig(
        devices=tuple(get("gpus", "devices", [])) or None,
        workers_per_device=max(1, int(get("gpus", "gpu_workers_per_device", 2))),
        max_parallel_synthesis=int(get("pipeline", "max_parallel_synthesis", 18)) or 18,
        synthesis_threads=int(get("synthesis", "threads", 0)),
        # config.rs resolve_total_budget: only the exact string "auto" detects.
        total_budget_bytes=None if budget == "auto" else parse_size(budget),
        safety_margin_bytes=margin,
        budget_block_timeout_s=_block_timeout(),
    )
    physics.active_devices(profile, sim)
    return DaemonSettings(
        listen=listen_override if listen_override is not None
        else str(get("daemon", "listen", DEFAULT_LISTEN)),
        status_listen=str(get("daemon", "status_listen", "")),
        param_cache=Path(str(get("srs", "param_cache", DEFAULT_PARAM_CACHE))),
        log_level=level_override if level_override is not None
        else str(get("logging", "level", "info")),
        pipeline_enabled=bool(get("pipeline", "enabled", True)),
        sim=sim,
    )


def _block_timeout() -> float:
    try:
        value = float(os.environ.get(ENV_BLOCK_TIMEOUT, physics.DEFAULT_BLOCK_TIMEOUT_S))
    except ValueError:
        return physics.DEFAULT_BLOCK_TIMEOUT_S
    return value if value > 0 else physics.DEFAULT_BLOCK_TIMEOUT_S


def grpc_listen_address(addr: str) -> tuple[str, str]:
    """``listen`` as cuzk-daemon takes it: ``unix:///path``, or an ``IP:port`` socket address."""
    if addr.startswith("unix://"):
        return "unix", addr[len("unix://") :]
    host, sep, port = addr.rpartition(":")
    try:
        if not sep or not port.isdigit() or int(port) > 65535:
            raise ValueError(addr)
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]")
                                  else host)
        if ip.version == 6 and not host.startswith("["):
            raise ValueError(addr)
    except ValueError:
        raise ConfigError(f"invalid listen address: {addr}") from None
    return "tcp", f"{ip}:{port}"


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


def _proof_bytes(job_id: str) -> bytes:
    """Stand-in Groth16 proof bytes (simulated; deterministic per job)."""
    out = b""
    counter = 0
    while len(out) < physics.PROOF_BYTES:
        out += hashlib.sha256(f"{job_id}:{counter}".encode()).digest()
        counter += 1
    return out[: physics.PROOF_BYTES]


def prove_response(proof: ProofSim) -> dict[str, Any]:
    """One proof's AwaitProofResponse (service.rs status_to_proto), in simulated time."""
    ok = proof.status == "completed"
    synth_ms = sum(
        (p.synth_ended - p.synth_started) * 1000
        for p in proof.partitions
        if p.synth_started is not None and p.synth_ended is not None
    )
    return {
        "job_id": proof.job_id,
        "status": STATUS_COMPLETED if ok else STATUS_FAILED,
        "proof_hex": _proof_bytes(proof.job_id).hex() if ok else "",
        "error_message": "" if ok else proof.error,
        "queue_wait_ms": proof.queue_ms,
        "srs_load_ms": 0,
        "synthesis_ms": round(synth_ms) if ok else 0,
        "gpu_compute_ms": proof.prove_ms,
        "total_ms": round(proof.wall_s * 1000) if ok else 0,
        "submitted_sim_s": proof.submitted_at,
        "finished_sim_s": proof.finished_at,
    }


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
        seed = profile.sim.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "big")
        # The PCE is never read from disk (engine.rs: loaded on demand, no preload;
        # PceCache::load_from_disk has no caller): every daemon starts without it.
        self.sim = Simulation(profile, settings.sim, seed=seed)
        self.sim.on_pce_saved = self._write_pce
        self.sim.on_log = self._engine_log
        self.t0 = time.monotonic()
        self.stopping = asyncio.Event()
        self.engine_stopped = False
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runners: list[web.AppRunner] = []
        self._gpu_tel = {i: _GpuTelemetry() for i in range(profile.num_gpus)}
        self._prev_counters: Counters | None = None
        self._load1 = 0.0
        self._cpu_last: dict[str, Any] = {}
        self._finished: list[str] = []
        self._finished_real: dict[str, float] = {}
        self._oom = False

    # ----- time -----

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) * self.scale

    def _sync(self) -> None:
        if not self.engine_stopped:
            self.sim.advance_to(self.sim_now())
        self._check_memory()

    def _check_memory(self) -> None:
        limit = self.profile.memory_limit_bytes
        used = self.sim.memory_used_bytes()
        if limit is not None and used > limit and not self._oom:
            self._oom = True
            # The kernel's OOM killer: no cleanup, no last words from cuzk.
            sys.stderr.write(
                f"(simulated) Out of memory: the container's limit of {limit / 2**30:.0f} GiB "
                f"is exceeded ({used / 2**30:.0f} GiB in use; cuzk's budget is "
                f"{self.sim.budget_bytes / 2**30:.0f} GiB); killed\n"
            )
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    async def _tick_loop(self) -> None:
        while True:
            self._sync()
            await asyncio.sleep(TICK_REAL_S)

    def _engine_log(self, level: str, message: str) -> None:
        engine_log.log(_LEVELS.get(level, logging.INFO), "%s", message)

    def _write_pce(self) -> None:
        """Write the stand-in PCE file (tiny, never the real 25 GiB); nothing reads it."""
        try:
            self.settings.param_cache.mkdir(parents=True, exist_ok=True)
            body = orjson.dumps(
                {
                    "simulated": True,
                    "circuit_id": CIRCUIT_ID,
                    "represents_bytes": physics.PCE_BYTES,
                    "recorded_at_sim_s": round(self.sim.t, 3),
                }
            )
            _write_atomic(self.pce_path, body)
            engine_log.info("PCE saved to disk circuit_id=%s path=%s", CIRCUIT_ID, self.pce_path)
        except OSError as exc:
            engine_log.warning("failed to save PCE to disk (non-fatal) error=%s", exc)

    def _remember(self, proof: ProofSim) -> None:
        self._finished.append(proof.job_id)
        self._finished_real[proof.job_id] = time.monotonic()
        while len(self._finished) > KEEP_FINISHED_PROOFS:
            old = self._finished.pop(0)
            self.sim.forget(old)
            self._finished_real.pop(old, None)
        if proof.status == "completed":
            engine_log.info(
                "proof completed job_id=%s kind=%s wall=%.1fs gpu=%dms queue=%dms (simulated)",
                proof.job_id, proof.kind, proof.wall_s, proof.prove_ms, proof.queue_ms,
            )
        else:
            engine_log.warning("proof failed job_id=%s error=%s (simulated)", proof.job_id,
                               proof.error)

    # ----- /status (cuzk-core/src/status.rs StatusSnapshot) -----

    def status_json(self) -> dict[str, Any]:
        self._sync()
        sim = self.sim
        now = sim.t
        used = sim.budget_used_bytes()
        budget = sim.budget_bytes
        synthesized = len(sim.synth_done) + sum(
            1 for g in sim.gpus.values() for p in g.workers
            if p is not None and p.compute_started is None
        )
        computing = sum(1 for g in sim.gpus.values() if g.computing is not None)
        return {
            "uptime_secs": now,
            "memory": {
                "total_bytes": budget,
                "used_bytes": used,
                "available_bytes": max(0, budget - used),
            },
            "synthesis": {"max_concurrent": sim.max_concurrent, "active": sim.synthesis_active},
            "pipelines": self._pipelines(now),
            "gpu_workers": self._gpu_workers(now),
            "allocations": self._allocations(now),
            "counters": {
                "total_completed": sim.total_completed,
                "total_failed": sim.total_failed,
                "completed_by_kind": dict(sim.completed_by_kind),
                "failed_by_kind": dict(sim.failed_by_kind),
                "queue_depth": sim.queue_depth,
            },
            "buffers": {
                "synth_in_flight": sim.synthesis_active,
                "provers_in_flight": synthesized,
                "aux_in_flight": synthesized + computing,
                "shells_in_flight": computing,
                "pending_handles": computing,
            },
        }

    def _pipelines(self, now: float) -> list[dict[str, Any]]:
        """Each dispatched proof's pipeline, kept a while after it ends (status.rs)."""

        def ms(start: float | None, end: float | None) -> int | None:
            if start is None:
                return None
            return round(((end if end is not None else now) - start) * 1000)

        pipelines = []
        for proof in self.sim.proofs.values():
            if proof.registered_at is None:
                continue  # not dispatched yet: no pipeline
            ended = self._finished_real.get(proof.job_id)
            if ended is not None and time.monotonic() - ended >= PIPELINE_KEEP_S:
                continue
            parts = [
                {
                    "index": p.index,
                    "state": p.state,
                    "synth_ms": ms(p.synth_started, p.synth_ended),
                    "gpu_ms": ms(p.gpu_started, p.gpu_ended),
                }
                for p in proof.partitions
            ]
            pipelines.append(
                {
                    "job_id": proof.job_id,
                    "proof_kind": proof.kind,
                    "started_secs_ago": now - proof.registered_at,
                    "total_partitions": physics.PARTITIONS_PER_PROOF,
                    "partitions_done": proof.partitions_done,
                    "partitions": parts,
                }
            )
        return pipelines

    def _gpu_workers(self, now: float) -> list[dict[str, Any]]:
        sim = self.sim
        workers = []
        wpd = sim.config.workers_per_device
        for n, d in enumerate(sorted(sim.gpus)):
            g = sim.gpus[d]
            for w, held in enumerate(g.workers):
                since = g.busy_since[w]
                workers.append(
                    {
                        "worker_id": n * wpd + w,
                        "gpu_ordinal": d,
                        "state": "proving" if held is not None else "idle",
                        "current_job": held.proof.job_id if held is not None else None,
                        "current_partition": held.index if held is not None else None,
                        # the current busy stretch, not a total (status.rs busy_since)
                        "busy_secs": now - since if since is not None else None,
                    }
                )
        return workers

    def _allocations(self, now: float) -> dict[str, list[dict[str, Any]]]:
        sim = self.sim
        srs_alloc = []
        if sim.srs_loaded:
            srs_alloc.append(
                {
                    "circuit_id": CIRCUIT_ID,
                    "bytes": physics.SRS_BYTES,
                    "last_used_secs_ago": now - sim.srs_last_used,
                    "evictable": True,
                }
            )
        pce_alloc = []
        if sim.pce_cached:
            # engine.rs lists the cache's evictable entries: no proof holds it now.
            pce_alloc.append(
                {
                    "circuit_id": CIRCUIT_ID,
                    "bytes": physics.PCE_BYTES,
                    "last_used_secs_ago": now - sim.pce_last_used,
                    "evictable": True,
                }
            )
        return {"srs": srs_alloc, "pce": pce_alloc}

    def metrics_text(self) -> str:
        self._sync()
        sim = self.sim
        lines = [
            "# HELP cuzk_proofs_completed_total Proofs completed (simulated).",
            "# TYPE cuzk_proofs_completed_total counter",
        ]
        for kind, n in sorted(sim.completed_by_kind.items()) or [(PROOF_KIND, 0)]:
            lines.append(f'cuzk_proofs_completed_total{{kind="{kind}"}} {n}')
        lines += [
            "# HELP cuzk_proofs_failed_total Proofs failed (simulated).",
            "# TYPE cuzk_proofs_failed_total counter",
        ]
        for kind, n in sorted(sim.failed_by_kind.items()) or [(PROOF_KIND, 0)]:
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
            f"cuzk_memory_used_bytes {sim.memory_used_bytes() - physics.OS_BASELINE_BYTES}",
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
        mem = physics.GPU_CONTEXT_BYTES if in_use else 0
        if active:
            mem += int(physics.GPU_WORKING_FRACTION * (vram - physics.GPU_CONTEXT_BYTES))
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
            # NVML's current link generation drops at idle (docs/nvml.md).
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

    # ----- private transport handlers (where the real daemon speaks gRPC) -----

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
            raise _rpc_error("invalid_argument", "body is not JSON") from exc
        if not isinstance(body, dict):
            raise _rpc_error("invalid_argument", "body must be a JSON object")
        return body

    def _track(self) -> None:
        """Remember a long-running handler, so shutdown can end it instead of waiting."""
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def h_prove(self, request: web.Request) -> web.Response:
        """The Prove RPC: submit one proof and answer when it is done."""
        self._track()
        body = await self._json_body(request)
        kind = str(body.get("proof_kind", ""))
        if kind != PROOF_KIND:
            raise _rpc_error("invalid_argument", f"proof kind {kind!r} is not simulated "
                             f"({PROOF_KIND} only)")
        try:
            c1 = base64.b64decode(str(body.get("c1_b64", "")), validate=True)
            sector_num, miner_id = int(body.get("sector_num", 1)), int(body.get("miner_id", 1000))
        except (binascii.Error, ValueError) as exc:
            raise _rpc_error("invalid_argument", "bad c1_b64, sector_num or miner_id") from exc
        input_error, identity_ok = check_request(c1, sector_num, miner_id)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ProofSim] = loop.create_future()
        self._sync()

        def done(proof: ProofSim) -> None:
            self._remember(proof)
            if not fut.done():
                fut.set_result(proof)

        # After SIGINT the engine takes no more work: the request waits for ever.
        self.sim.submit(kind, on_done=done, input_error=input_error, identity_ok=identity_ok)
        proof = await fut
        return web.json_response(prove_response(proof), dumps=lambda o: orjson.dumps(o).decode())

    async def h_preload(self, request: web.Request) -> web.Response:
        self._track()
        body = await self._json_body(request)
        circuit = str(body.get("circuit_id", ""))
        if circuit != CIRCUIT_ID:
            # engine.rs preload_srs: an anyhow error the service returns as Internal.
            known = {"porep-64g", "wpost-32g", "winning-32g", "snap-32g", "snap-64g"}
            message = (f"unknown circuit ID: {circuit}" if circuit not in known
                       else f"circuit {circuit} is not simulated ({CIRCUIT_ID} only)")
            raise _rpc_error("internal", message)
        self._sync()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float | None] = loop.create_future()

        def loaded(seconds: float | None) -> None:
            if not fut.done():
                fut.set_result(seconds)

        already = self.sim.request_srs(loaded)
        seconds = await fut
        if seconds is None:
            raise _rpc_error("internal", "(simulated) the memory budget can never hold the SRS")
        if not already:
            engine_log.info("SRS %s loaded in %.1fs (simulated)", circuit, seconds)
        return web.json_response(
            {"already_loaded": already, "load_time_ms": round(seconds * 1000)}
        )

    async def h_sim_status(self, request: web.Request) -> web.Response:
        """GetStatus (service.rs get_status), as ``cuzk-bench status`` shows it."""
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
                "uptime_seconds": int(st["uptime_secs"]),
                "total_proofs_completed": self.sim.total_completed,
                "total_proofs_failed": self.sim.total_failed,
                "pinned_memory_bytes": st["memory"]["used_bytes"],
                "pinned_memory_limit_bytes": st["memory"]["total_bytes"],
                "gpus": gpus,
                "loaded_srs": [
                    {"circuit_id": a["circuit_id"], "tier": 1, "size_bytes": a["bytes"],
                     "ref_count": 1}
                    for a in st["allocations"]["srs"]
                ],
                "queues": [
                    {"proof_kind": 1, "pending": self.sim.queue_depth, "in_progress": running}
                ],
            }
        )

    async def h_status(self, request: web.Request) -> web.Response:
        # cuzk-daemon/src/main.rs: any request line starting "GET /status" gets the JSON.
        return web.Response(
            text=orjson.dumps(self.status_json()).decode(), content_type="application/json",
            headers={"Access-Control-Allow-Origin": "*", "Connection": "close"},
        )

    async def h_not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="404 Not Found\n", headers={"Connection": "close"})

    async def h_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    # ----- lifecycle -----

    def stop_engine(self) -> None:
        """SIGINT: engine.rs shutdown(): its workers stop taking work; the process stays."""
        if not self.engine_stopped:
            log.info("received SIGINT, shutting down")
            engine_log.info("shutting down cuzk engine")
            self._sync()
            self.engine_stopped = True

    async def start(self) -> None:
        status_listen = self.settings.status_listen
        if status_listen:
            status = web.Application()
            status.router.add_route("GET", r"/status{tail:.*}", self.h_status)
            status.router.add_route("*", r"/{tail:.*}", self.h_not_found)
            try:
                host, _, port = status_listen.rpartition(":")
                await self._serve_tcp(status, host.strip("[]"), int(port))
                log.info("status HTTP server listening addr=%s", status_listen)
            except (OSError, ValueError) as exc:
                # main.rs: a failed bind of the status server is only logged.
                log.error("failed to bind status HTTP server addr=%s error=%s", status_listen, exc)
        private = web.Application()
        private.router.add_get("/sim/v1/health", self.h_health)
        private.router.add_post("/sim/v1/prove", self.h_prove)
        private.router.add_post("/sim/v1/preload", self.h_preload)
        private.router.add_get("/sim/v1/status", self.h_sim_status)
        private.router.add_get("/sim/v1/metrics", self.h_metrics)
        kind, where = grpc_listen_address(self.settings.listen)
        if kind == "unix":
            log.info("listening on unix socket path=%s", where)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where)
            Path(where).parent.mkdir(parents=True, exist_ok=True)
            runner = await self._runner(private)
            await web.UnixSite(runner, where).start()
            log.info("cuzk-daemon ready, serving on unix://%s", where)
        else:
            host, _, port = where.rpartition(":")
            log.info("listening on TCP addr=%s", where)
            await self._serve_tcp(private, host, int(port))
            log.info("cuzk-daemon ready, serving on %s", where)
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        if self.state_file is not None:
            self._tasks.append(asyncio.create_task(self._state_loop()))

    async def _runner(self, app: web.Application) -> web.AppRunner:
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _serve_tcp(self, app: web.Application, host: str, port: int) -> None:
        await web.TCPSite(await self._runner(app), host, port).start()

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
        self.remove_state_file()

    def remove_state_file(self) -> None:
        if self.state_file is not None:
            # Readers fall back to idle values without it (docs/architecture.md),
            # so a stopped daemon never leaves a busy-looking host behind.
            with contextlib.suppress(OSError):
                self.state_file.unlink()


def _rpc_error(code: str, message: str) -> web.HTTPException:
    cls = web.HTTPBadRequest if code == "invalid_argument" else web.HTTPInternalServerError
    return cls(
        text=orjson.dumps({"error": code, "message": message}).decode(),
        content_type="application/json",
    )


async def run_daemon(settings: DaemonSettings, profile: Profile, scale: float) -> int:
    state_env = os.environ.get(ENV_STATE_FILE)
    daemon = SimDaemon(settings, profile, scale, Path(state_env) if state_env else None)
    loop = asyncio.get_running_loop()
    # Only SIGINT is handled (main.rs: tokio::signal::ctrl_c), and it stops the
    # engine, not the process. SIGTERM keeps its default action: the process
    # ends at once; the simulator only removes its state file on the way out.
    loop.add_signal_handler(signal.SIGINT, daemon.stop_engine)

    def on_sigterm(signum: int, frame: Any) -> None:
        daemon.remove_state_file()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    log.info("cuzk-daemon starting")
    log.info("configuration loaded listen=%s", settings.listen)
    engine_log.info("memory budget initialized total_budget_gib=%d",
                    daemon.sim.budget_bytes // (1 << 30))
    if not settings.pipeline_enabled:
        engine_log.warning("(simulated) [pipeline] enabled = false is not simulated; "
                           "the pipelined engine runs")
    engine_log.info(
        "initializing GPU workers num_gpus=%d gpu_workers_per_device=%d gpus=%s "
        "(SIMULATED: %dx %s, %d cores, %d MB RAM, PCIe Gen%d x%d, time scale %gx)",
        len(daemon.sim.devices), settings.sim.workers_per_device, daemon.sim.devices,
        profile.num_gpus, profile.gpu_name, profile.cpu_cores, profile.cpu_ram_mb,
        profile.pcie_gen, profile.pcie_width, scale,
    )
    try:
        await daemon.start()
    except (OSError, ConfigError) as exc:
        await daemon.stop()
        sys.stderr.write(f"Error: gRPC server error\n\nCaused by:\n    {exc}\n")
        return 1
    await daemon.stopping.wait()
    await daemon.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    matches = clap.parse_or_exit(CUZK_DAEMON, [sys.argv[0], *(sys.argv[1:] if argv is None
                                                              else argv)])
    v = matches.values
    profile = load_profile()
    try:
        settings = load_settings(str(v["config"]), v["listen"], v["log_level"], profile)
    except ConfigError as exc:
        detail = str(exc).replace("\n", "\n    ")
        sys.stderr.write(f'Error: failed to load config from "{v["config"]}"\n\n'
                         f"Caused by:\n    {detail}\n")
        return 1
    except ValueError as exc:
        sys.stderr.write(f"Error: (simulated) {exc}\n")
        return 1
    _setup_logging(os.environ.get("RUST_LOG") or settings.log_level)
    return asyncio.run(run_daemon(settings, profile, time_scale()))


if __name__ == "__main__":
    sys.exit(main())
