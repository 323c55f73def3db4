"""Message types of wire contract v1 (DESIGN 3.6), as dataclasses.

Field names, types and nullability follow DESIGN 3.6 exactly. A few optional
fields extend it in the forward-compatible way the contract allows (unknown
fields are ignored by older peers): each is marked "extension" below and has
a default, so it may be absent on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from vast_manager.protocol.errors import ProtocolError

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOLS = (1,)

MAX_LOG_LINES = 1000
MAX_LOG_TEXT_CHARS = 8192

Phase = Literal[
    "booting", "fetching_params", "warming", "benchmarking", "proving", "terminating", "failed"
]
#: The phases an agent reports, in lifecycle order: the one list of them (the
#: coordinator's instance states, ``coordinator/decisions/states.py``, include each).
PHASES: tuple[str, ...] = get_args(Phase)
Action = Literal["continue", "benchmark", "terminate"]
ResultKind = Literal["benchmark", "scaling"]
Bottleneck = Literal["gpu", "cpu", "pcie", "memory", "unknown"]
BOTTLENECKS: tuple[str, ...] = ("gpu", "cpu", "pcie", "memory", "unknown")
ProgressUnit = Literal["bytes", "proofs"]

# The dataclasses have no __slots__: orjson encodes a dataclass from its __dict__ about
# twice as fast (``python bench/decode.py``, last lines), and the coordinator encodes
# every heartbeat's telemetry again for its column.

NONNEG = {"min": 0}


# --- hello -----------------------------------------------------------------


@dataclass
class Gpu:
    index: int = field(metadata=NONNEG)
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    pcie_gen_current: int | None
    pcie_width_current: int | None


@dataclass
class HostInfo:
    hostname: str = field(metadata={"max_len": 255})
    cpu_model: str = field(metadata={"max_len": 255})
    cpu_cores_logical: int = field(metadata=NONNEG)
    cpu_cores_physical: int | None
    ram_total_bytes: int = field(metadata=NONNEG)
    driver_version: str | None
    cuda_version: str | None
    gpus: list[Gpu] = field(metadata={"max_len": 64})


@dataclass
class Hello:
    protocol: int
    agent_version: str = field(metadata={"max_len": 64})
    boot_id: str = field(metadata={"max_len": 64})
    container_id: str | None
    host: HostInfo

    def _check(self, prefix: str) -> None:
        if self.protocol not in SUPPORTED_PROTOCOLS:
            supported = ", ".join(str(p) for p in SUPPORTED_PROTOCOLS)
            raise ProtocolError(
                "unsupported_protocol",
                f"Protocol {self.protocol} is not supported; this coordinator speaks {supported}.",
                prefix + "protocol",
            )


# --- telemetry ---------------------------------------------------------------


@dataclass
class GpuTelemetry:
    index: int = field(metadata=NONNEG)
    util_pct_mean: float | None
    util_pct_max: float | None
    mem_used_bytes: int | None
    pcie_tx_kbps_mean: float | None
    pcie_rx_kbps_mean: float | None
    power_w_mean: float | None
    temp_c_max: float | None
    sm_clock_mhz_mean: float | None
    throttle_reasons: int | None
    # extension: the link under load (the idle link trains down, nvml.md).
    pcie_gen_current: int | None = None
    pcie_width_current: int | None = None


@dataclass
class CpuTelemetry:
    util_pct_mean: float | None
    per_core_util_pct_mean: list[float] = field(metadata={"max_len": 4096})
    load1: float | None
    iowait_pct_mean: float | None
    # extension: cores the container may use (cgroup cpu.max), beside the host's.
    quota_cores: float | None = None


@dataclass
class RamTelemetry:
    used_bytes: int | None
    total_bytes: int | None


@dataclass
class NetTelemetry:
    rx_bytes_per_s: float | None
    tx_bytes_per_s: float | None


@dataclass
class CuzkWorker:
    gpu_ordinal: int
    busy_pct: float | None


@dataclass
class CuzkTelemetry:
    """Extension: what the cuzk daemon's /status said over the window."""

    samples: int = field(metadata=NONNEG)
    workers: list[CuzkWorker] = field(metadata={"max_len": 256})
    synthesis_active_mean: float | None
    synthesis_max: int | None
    queue_depth_mean: float | None
    memory_used_bytes_max: int | None
    memory_total_bytes: int | None
    # extension: the daemon's synthesis workers (min(budget / 14 GiB, [pipeline]
    # max_parallel_synthesis), at least 2; docs/cuzk.md), the cap `synthesis_active_mean`
    # is measured against. /status synthesis.max_concurrent (`synthesis_max`) is not a
    # cap: it is the budget over the smallest partition size of any proof kind.
    synthesis_slots: int | None = field(default=None, metadata={"min": 1})


@dataclass
class Telemetry:
    window_s: float = field(metadata=NONNEG)
    samples: int = field(metadata=NONNEG)
    gpus: list[GpuTelemetry] = field(metadata={"max_len": 64})
    cpu: CpuTelemetry
    ram: RamTelemetry
    net: NetTelemetry
    cuzk: CuzkTelemetry | None = None  # extension


# --- heartbeat ---------------------------------------------------------------


@dataclass
class Progress:
    done: int = field(metadata=NONNEG)
    total: int = field(metadata=NONNEG)
    unit: ProgressUnit
    # extension: proofs the benchmark keeps in flight (`cuzk-bench batch -j`), so the
    # coordinator can judge the rate from proof times while it runs (issue 6).
    concurrency: int | None = field(default=None, metadata={"min": 1})


@dataclass
class Heartbeat:
    seq: int = field(metadata=NONNEG)
    phase: Phase
    phase_started_at: float
    progress: Progress | None
    proofs_completed_total: int = field(metadata=NONNEG)
    proof_seconds_recent: list[float] = field(metadata={"max_len": 10000, "item_min": 0})
    telemetry: Telemetry | None
    # extension: with phase `failed`, why, in one sentence (e.g. the C1 file that cuzk
    # cannot read), so the instance's events say it; null otherwise.
    failure: str | None = field(default=None, metadata={"max_len": 1024})


# --- results -----------------------------------------------------------------


@dataclass
class ScalingRun:
    gpus_used: list[int] = field(metadata={"max_len": 64})
    rate_per_hour: float = field(metadata=NONNEG)
    telemetry: Telemetry | None


@dataclass
class Result:
    result_id: str = field(metadata={"max_len": 128})
    kind: ResultKind
    proof_type: str = field(metadata={"max_len": 64})
    started_at: float
    finished_at: float
    gpus_used: list[int] = field(metadata={"max_len": 64})
    proofs_completed: int = field(metadata=NONNEG)
    proofs_failed: int = field(metadata=NONNEG)
    wall_seconds: float = field(metadata=NONNEG)
    rate_per_hour: float = field(metadata=NONNEG)
    proof_seconds: list[float] = field(metadata={"max_len": 100000, "item_min": 0})
    telemetry: Telemetry | None
    # Present for kind == "scaling" (DESIGN 3.6); absent or null otherwise.
    runs: list[ScalingRun] | None = field(default=None, metadata={"max_len": 16})
    efficiency: float | None = None
    bottleneck: Bottleneck | None = None
    evidence: list[str] | None = field(
        default=None, metadata={"max_len": 64, "item_max_len": 1024}
    )

    def _check(self, prefix: str) -> None:
        if not self.result_id:
            raise ProtocolError(
                "invalid_field", f"Field '{prefix}result_id' must not be empty.",
                prefix + "result_id",
            )
        if self.kind == "scaling":
            for name in ("runs", "efficiency", "bottleneck", "evidence"):
                if getattr(self, name) is None:
                    raise ProtocolError(
                        "invalid_field",
                        f"Field '{prefix}{name}' is required for a scaling result.",
                        prefix + name,
                    )


# --- logs --------------------------------------------------------------------


@dataclass
class LogLine:
    ts: float
    source: str = field(metadata={"max_len": 64})
    text: str = field(metadata={"max_len": MAX_LOG_TEXT_CHARS})


@dataclass
class LogBatch:
    lines: list[LogLine] = field(metadata={"max_len": MAX_LOG_LINES})


# --- answers -----------------------------------------------------------------


@dataclass
class Directive:
    action: Action
    reason: str = field(metadata={"max_len": 4096})
    next_heartbeat_s: int = field(metadata={"min": 1})
    min_rate_per_hour: float | None


@dataclass
class ResultAck:
    ok: bool
    duplicate: bool
    directive: Directive


@dataclass
class ErrorBody:
    error: str
    message: str
    field: str | None = None
