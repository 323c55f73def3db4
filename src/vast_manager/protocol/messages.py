"""Message types of wire contract v1 (docs/protocol.md), as msgspec Structs.

Field names, types and nullability follow the contract exactly. A few optional
fields extend it in the forward-compatible way the contract allows (unknown
fields are ignored by older peers): each is marked "extension" below and has
a default, so it may be absent on the wire.

Each field's constraints are in its type (``Annotated`` with ``msgspec.Meta``), which
is what ``vast_manager.protocol.schema`` decodes against: every integer within the
signed 64 bits SQLite stores, every float finite, every string and list bounded.
"""

from __future__ import annotations

import sys
from typing import Annotated, Literal, get_args

from msgspec import Meta, Struct

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

# --- the constrained types ---------------------------------------------------------------

# Integers are stored as SQLite INTEGER (signed 64 bits); JSON allows any size.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
FLOAT_MAX = sys.float_info.max  # a float within +-FLOAT_MAX is finite: no inf, no nan
#: Strings from hosts are untrusted; nothing in the contract needs more.
DEFAULT_MAX_STR_LEN = 65536

Int = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
Positive = Annotated[int, Meta(ge=1, le=INT64_MAX)]
Float = Annotated[float, Meta(ge=-FLOAT_MAX, le=FLOAT_MAX)]
NonNegFloat = Annotated[float, Meta(ge=0, le=FLOAT_MAX)]
Text = Annotated[str, Meta(max_length=DEFAULT_MAX_STR_LEN)]
Text64 = Annotated[str, Meta(max_length=64)]
Text128 = Annotated[str, Meta(max_length=128)]
Text255 = Annotated[str, Meta(max_length=255)]
Text1024 = Annotated[str, Meta(max_length=1024)]
Text4096 = Annotated[str, Meta(max_length=4096)]


class Message(Struct, gc=False):
    """A message of the contract. A Struct, not a dataclass: msgspec decodes a heartbeat
    into Structs in about half the time, and frees them for less (docs/performance.md,
    "Messages as Structs"). ``gc=False``: a message is a tree of values, never a cycle,
    so the garbage collector need not track the thousands a second a fleet sends.
    Encoded by ``protocol.codec.encode`` (orjson, each Struct as its fields in order),
    the same bytes the dataclasses were (tests/protocol/test_wire_bytes.py)."""


# --- hello -----------------------------------------------------------------


class Gpu(Message):
    index: Count
    uuid: Text | None
    name: Text | None
    memory_total_bytes: Int | None
    pcie_gen_max: Int | None
    pcie_width_max: Int | None
    pcie_gen_current: Int | None
    pcie_width_current: Int | None


class HostInfo(Message):
    hostname: Text255
    cpu_model: Text255
    cpu_cores_logical: Count
    cpu_cores_physical: Int | None
    ram_total_bytes: Count
    driver_version: Text | None
    cuda_version: Text | None
    gpus: Annotated[list[Gpu], Meta(max_length=64)]


class Hello(Message):
    protocol: Int
    agent_version: Text64
    boot_id: Text64
    container_id: Text | None
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


class GpuTelemetry(Message):
    index: Count
    util_pct_mean: Float | None
    util_pct_max: Float | None
    mem_used_bytes: Int | None
    pcie_tx_kbps_mean: Float | None
    pcie_rx_kbps_mean: Float | None
    power_w_mean: Float | None
    temp_c_max: Float | None
    sm_clock_mhz_mean: Float | None
    throttle_reasons: Int | None
    # extension: the link under load (the idle link trains down, docs/nvml.md).
    pcie_gen_current: Int | None = None
    pcie_width_current: Int | None = None


class CpuTelemetry(Message):
    util_pct_mean: Float | None
    per_core_util_pct_mean: Annotated[list[Float], Meta(max_length=4096)]
    load1: Float | None
    iowait_pct_mean: Float | None
    # extension: cores the container may use (cgroup cpu.max), beside the host's.
    quota_cores: Float | None = None


class RamTelemetry(Message):
    used_bytes: Int | None
    total_bytes: Int | None


class NetTelemetry(Message):
    rx_bytes_per_s: Float | None
    tx_bytes_per_s: Float | None


class CuzkWorker(Message):
    gpu_ordinal: Int
    busy_pct: Float | None


class CuzkTelemetry(Message):
    """Extension: what the cuzk daemon's /status said over the window."""

    samples: Count
    workers: Annotated[list[CuzkWorker], Meta(max_length=256)]
    synthesis_active_mean: Float | None
    synthesis_max: Int | None
    queue_depth_mean: Float | None
    memory_used_bytes_max: Int | None
    memory_total_bytes: Int | None
    # extension: the daemon's synthesis workers (min(budget / 14 GiB, [pipeline]
    # max_parallel_synthesis), at least 2; docs/cuzk.md), the cap `synthesis_active_mean`
    # is measured against. /status synthesis.max_concurrent (`synthesis_max`) is not a
    # cap: it is the budget over the smallest partition size of any proof kind.
    synthesis_slots: Positive | None = None


class Telemetry(Message):
    window_s: NonNegFloat
    samples: Count
    gpus: Annotated[list[GpuTelemetry], Meta(max_length=64)]
    cpu: CpuTelemetry
    ram: RamTelemetry
    net: NetTelemetry
    cuzk: CuzkTelemetry | None = None  # extension


# --- heartbeat ---------------------------------------------------------------


class NetBytesTotal(Message):
    """Extension: bytes the instance's network interfaces received and sent since they came
    up (its container's counters, loopback excluded), which vast.ai bills per byte."""

    rx: Count
    tx: Count


class Progress(Message):
    done: Count
    total: Count
    unit: ProgressUnit
    # extension: proofs the benchmark keeps in flight (`cuzk-bench batch -j`), so the
    # coordinator can judge the rate from proof times while it runs (docs/policy.md).
    concurrency: Positive | None = None


class Heartbeat(Message):
    seq: Count
    phase: Phase
    phase_started_at: Float
    progress: Progress | None
    proofs_completed_total: Count
    proof_seconds_recent: Annotated[list[NonNegFloat], Meta(max_length=10000)]
    telemetry: Telemetry | None
    # extension: with phase `failed`, why, in one sentence (e.g. the C1 file that cuzk
    # cannot read), so the instance's events say it; null otherwise.
    failure: Text1024 | None = None
    # extension: the interfaces' cumulative byte counts (docs/protocol.md), for the bill.
    net_bytes_total: NetBytesTotal | None = None
    # extension: the highest spool sequence number the coordinator acknowledged (results
    # and log batches the agent still keeps, docs/protocol.md, "Replay"); absent: none kept.
    acked_seq: Count | None = None


# --- results -----------------------------------------------------------------


class ScalingRun(Message):
    gpus_used: Annotated[list[Int], Meta(max_length=64)]
    rate_per_hour: NonNegFloat
    telemetry: Telemetry | None


class Result(Message):
    result_id: Text128
    kind: ResultKind
    proof_type: Text64
    started_at: Float
    finished_at: Float
    gpus_used: Annotated[list[Int], Meta(max_length=64)]
    proofs_completed: Count
    proofs_failed: Count
    wall_seconds: NonNegFloat
    rate_per_hour: NonNegFloat
    proof_seconds: Annotated[list[NonNegFloat], Meta(max_length=100000)]
    telemetry: Telemetry | None
    # Present for kind == "scaling" (docs/protocol.md); absent or null otherwise.
    runs: Annotated[list[ScalingRun], Meta(max_length=16)] | None = None
    efficiency: Float | None = None
    bottleneck: Bottleneck | None = None
    evidence: Annotated[list[Text1024], Meta(max_length=64)] | None = None
    # extension: the ``benchmark_id`` of the directive that asked for this benchmark
    # (docs/protocol.md, "Directed benchmarks"); an older agent leaves it out.
    benchmark_id: Text64 | None = None
    # extension: the agent's spool sequence number of this result (docs/protocol.md,
    # "Replay"); an older agent leaves it out.
    spool_seq: Count | None = None
    # extension: the receipt the coordinator answered when it first acknowledged this
    # result, sent with it again after a restore lost it (docs/protocol.md, "Replay").
    receipt: Text128 | None = None
    # extension: the highest spool sequence of a result below this one that the
    # coordinator acknowledged and the agent still keeps: a coordinator that lacks it
    # refuses this one until it was sent again (docs/protocol.md, "Replay").
    prev_acked_seq: Count | None = None

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


class LogLine(Message):
    ts: Float
    source: Text64
    text: Annotated[str, Meta(max_length=MAX_LOG_TEXT_CHARS)]


class LogBatch(Message):
    lines: Annotated[list[LogLine], Meta(max_length=MAX_LOG_LINES)]
    # extension: the agent's spool sequence number of this batch: a batch at or below the
    # highest one stored for the agent is a replay, stored once (docs/protocol.md, "Replay").
    spool_seq: Count | None = None
    # extension: as ``Result.prev_acked_seq``, for log batches (docs/protocol.md, "Replay").
    prev_acked_seq: Count | None = None


# --- answers -----------------------------------------------------------------


class Directive(Message):
    action: Action
    reason: Text4096
    next_heartbeat_s: Positive
    min_rate_per_hour: Float | None
    # extension: a benchmark the coordinator directs (a fresh id, docs/protocol.md,
    # "Directed benchmarks"): the agent's next benchmark result carries it back.
    benchmark_id: Text64 | None = None
    # extension: to an agent whose heartbeat carried ``acked_seq``, the highest spool
    # sequence number of its results and of its log batches this coordinator holds; the
    # agent sends again what it was acknowledged above them (docs/protocol.md, "Replay").
    stored_result_seq: Count | None = None
    stored_logs_seq: Count | None = None


class ResultAck(Message):
    ok: bool
    duplicate: bool
    directive: Directive
    # extension: the coordinator's receipt for the result (an HMAC only it can make), kept
    # by the agent with the result to replay it (docs/protocol.md, "Replay").
    receipt: Text128 | None = None


class ErrorBody(Message):
    error: Text
    message: Text
    field: Text | None = None
