"""Performance model of one simulated cuzk host: CPU synthesis, PCIe, GPU, RAM.

A PoRep C2 32G proof is 10 partitions. Each partition goes through

1. **synthesis** on the CPU: a serial part (witness generation: the SHA-256
   and Poseidon hashing of the partition's challenges runs on one thread) and
   a parallel part (the PCE's sparse matrix x witness products, up to
   ``SYNTH_PARALLEL_MAX_THREADS`` threads). The daemon runs at most
   ``[pipeline] max_parallel_synthesis`` syntheses at once (default 18; the
   real synthesis workers are min(budget / 14 GiB, that), at least 2), and
   each one holds ``PARTITION_HOST_BYTES`` of the memory budget from its
   start until its data is on the GPU, so the budget bounds how many
   partitions are in flight;
2. **upload** over the GPU's PCIe link (``PARTITION_UPLOAD_BYTES``: the a/b/c
   evaluations, the witness, and the SRS bases streamed for the MSMs, since a
   16-32 GB card cannot keep the 45 GiB SRS);
3. **GPU compute** (the GPU model's ``gpu_seconds_per_proof`` / 10), with one
   host thread per GPU driving it.

Each GPU has ``gpu_workers_per_device`` workers (2 by default), so the next
partition uploads while the current one computes. All CPU consumers share the
cores fairly (water-filling), so an oversubscribed CPU slows every synthesis
and, a little, the GPU drivers too.

How the daemon around the pipeline behaves follows cuzk at Curio e0294b0f
(docs/cuzk.md): one dispatcher takes queued proofs in order, reserves the
SRS in the memory budget (blocking while it does not fit), parses the C1,
loads the SRS, then queues the proof's partitions; every partition reserves
its share of the budget before synthesis, in strict (proof, partition)
order; the PCE is never read from disk: each proof dispatched while none
is cached starts a background extraction (14 GiB of the budget, taken by
polling once a second, plus a core of CPU), whose result is written to
``pce-porep-32g.bin`` and cached in memory only. A partition synthesised
with the PCE cached takes the fast path, as upstream intends (at e0294b0f
``pipeline.rs`` does not pass the cache yet; docs/cuzk.md). A proof whose
inputs name another sector or miner fails its self-check after proving.
Where the real daemon would wait for ever (a budget smaller than what a
proof needs), the simulation fails the proof after
``SimConfig.budget_block_timeout_s`` with nothing else in flight, so that
tests end; the real one never does.

The engine is a fluid discrete-event simulation: between events every rate is
constant, so it jumps from event to event exactly. `Simulation` is driven
either to completion (`run_batch`, for tests and capacity planning) or in real
time by the simulated daemon (`vast_manager.sim.daemon`). Every number here is
simulated.

Calibration (simulated; what each constant is fitted to)
--------------------------------------------------------
* ``SYNTH_*``: upstream's cuzk notes say "synth takes ~29 s/partition, GPU
  ~3 s/partition", and that 10 partitions synthesised together saturate every
  core for ~55 s. 21.6 s serial + 118.4 core-s parallel (at most 16 threads)
  gives ~29 s per partition on an idle Zen 3 host and 140 core-s per
  partition, so a 16-thread Zen 3 CPU tops out near 39 proofs/hour: the
  operator's 4x RTX 5060 Ti (GPUs ~80% idle, CPU ~98% busy).
* ``PARTITION_HOST_BYTES`` = 20 GiB (a/b/c evaluations + witness + pinned
  staging; upstream saw ~360 GiB peak RSS for 20 partitions in flight, and
  cuzk's own reservation of 14 GiB leaves the pinned staging out) with
  70 GiB resident (SRS 45 + PCE 25, docs/cuzk.md) in a budget of the
  machine's memory less cuzk's 5 GiB safety margin gives 2 partitions in
  flight on a 128 GB host, 8 on 256 GB, 14 on 384 GB and 20 on 512 GB (18:
  ``max_parallel_synthesis``). By Little's law that reproduces
  upstream's RAM table (128 GiB slow, 256 GiB good, 512 GiB best): an RTX 5090
  on 128 GB ~26 proofs/hour, an RTX 4090 on a 32-thread 256 GB host ~61-65,
  an RTX 5070 Ti on 384 GB ~95.
* ``PARTITION_UPLOAD_BYTES`` = 48 GB: the four G1 SRS queries of a 130 M
  constraint circuit at 96 bytes a point, streamed per partition since a
  16-32 GB card cannot keep the 45 GiB SRS. On Gen4 x16 that is ~2 s, hidden
  behind compute; on a Gen3 x4 riser (3.94 GB/s) it is ~12 s against ~5 s of
  RTX 3090 compute: PCIe-bound.
* GPU seconds per proof (sim/hardware.py): ~3.4 s/partition for an
  RTX 5070 Ti (upstream's figure), others scaled roughly by memory bandwidth,
  and the RTX 4080 Super set so a 2-GPU host with a strong CPU is GPU-bound.

Multi-GPU hosts need enough proofs in flight (``cuzk-bench -j``) to feed
every GPU: a proof's 10 partitions spread over the GPUs, and the next proof
starts only when a request slot frees. ``-j`` of 2 per GPU keeps them fed.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vast_manager.agent.config import SIM_DEFAULTS
from vast_manager.sim.hardware import Profile

PARTITIONS_PER_PROOF = 10
GIB = 1 << 30

# --- CPU synthesis (core-seconds at the speed of one Zen 3 logical core) ---
SYNTH_SERIAL_CORE_S = 21.6
SYNTH_PARALLEL_CORE_S = 118.4
SYNTH_PARALLEL_MAX_THREADS = 16
# Without a PCE the constraint system is built from scratch for every
# partition: much more work, and more of it single-threaded.
SLOW_PATH_SERIAL_FACTOR = 2.5
SLOW_PATH_PARALLEL_FACTOR = 3.0
# One host thread per busy GPU polls CUDA streams and stages buffers.
GPU_HOST_THREADS = 1.0
# PCE extraction: one partition's circuit run through a recording constraint
# system on one thread (simulated cost).
EXTRACTION_CORE_S = 90.0

# --- PCIe ---
PARTITION_UPLOAD_BYTES = 48e9
PARTITION_DOWNLOAD_BYTES = 1.5e9  # NTT/MSM results and the proof back to the host

# --- RAM and the memory budget ---
PARTITION_HOST_BYTES = 20 * GIB  # the model's hold per partition (calibrated)
SRS_BYTES = 45 * GIB
PCE_BYTES = 25 * GIB
# cuzk-core/src/memory.rs: PCE_EXTRACTION_TRANSIENT_BYTES, POREP_PARTITION_FULL_BYTES,
# SNAP_PARTITION_FULL_BYTES (the divisor of /status synthesis.max_concurrent).
PCE_EXTRACTION_TRANSIENT_BYTES = 14 * GIB
POREP_PARTITION_FULL_BYTES = 14 * GIB
SNAP_PARTITION_FULL_BYTES = 9 * GIB
OS_BASELINE_BYTES = 3 * GIB  # the rest of the machine, for the RAM gauge
DEFAULT_SAFETY_MARGIN_BYTES = 5 * GIB  # cuzk-core/src/config.rs
DEFAULT_MAX_PARALLEL_SYNTHESIS = 18  # config.rs: [pipeline] max_parallel_synthesis 0 -> 18
BUDGET_POLL_S = 1.0  # the extraction's try_acquire loop sleeps a second
SRS_LOAD_BYTES_PER_S = 1.5e9  # read + deserialise the .params file
PCE_SAVE_BYTES_PER_S = 2e9  # writing pce-porep-32g.bin before caching it
DEFAULT_BLOCK_TIMEOUT_S = SIM_DEFAULTS.budget_block_timeout_s  # VM_SIM_BUDGET_BLOCK_TIMEOUT

# --- GPU memory (for telemetry) ---
GPU_CONTEXT_BYTES = 600_000_000
GPU_WORKING_FRACTION = 0.85  # cuzk takes most of the card while proving

PROOF_BYTES = 1920  # 10 partitions x 192-byte Groth16 proofs

_EPS = 1e-9

PartitionState = str  # pending, synthesizing, synth_done, gpu, done, failed


@dataclass(frozen=True, slots=True)
class SimConfig:
    """The parts of cuzk.toml the model honours (parsed by the daemon)."""

    devices: tuple[int, ...] | None = None  # None or empty: every GPU
    workers_per_device: int = 2  # [gpus] gpu_workers_per_device
    max_parallel_synthesis: int = DEFAULT_MAX_PARALLEL_SYNTHESIS  # [pipeline]
    synthesis_threads: int = 0  # [synthesis] threads; 0: all cores
    total_budget_bytes: int | None = None  # None: "auto" (MemTotal - safety margin)
    safety_margin_bytes: int = DEFAULT_SAFETY_MARGIN_BYTES
    # Simulation only: how long a proof may wait for budget that nothing in
    # flight will free before it is failed (the real daemon waits for ever).
    budget_block_timeout_s: float = DEFAULT_BLOCK_TIMEOUT_S


def active_devices(profile: Profile, config: SimConfig) -> list[int]:
    """GPU ordinals the daemon proves on (``[gpus] devices``; empty means all)."""
    if not config.devices:
        return list(range(profile.num_gpus))
    seen: list[int] = []
    for d in config.devices:
        if 0 <= d < profile.num_gpus and d not in seen:
            seen.append(d)
    if not seen:
        raise ValueError(f"no such GPU among {list(config.devices)}: host has {profile.num_gpus}")
    return seen


def memory_budget_bytes(profile: Profile, config: SimConfig) -> int:
    """cuzk's budget: configured, or "auto": the MemTotal it sees less the safety margin.

    MemTotal is the host's (``Profile.mem_total_bytes``), whatever the
    container may use: cuzk's "auto" is blind to a container's limit.
    """
    if config.total_budget_bytes is not None:
        return config.total_budget_bytes
    return max(0, profile.mem_total_bytes - config.safety_margin_bytes)


def synthesis_workers(budget_bytes: int, config: SimConfig) -> int:
    """engine.rs: min(budget / POREP_PARTITION_FULL_BYTES, max_parallel), at least 2."""
    cap = config.max_parallel_synthesis if config.max_parallel_synthesis > 0 else 18
    return max(2, min(budget_bytes // POREP_PARTITION_FULL_BYTES, cap))


def partitions_in_flight_limit(profile: Profile, config: SimConfig, *, pce: bool = True) -> int:
    """How many partitions the budget holds at once beside the SRS (and PCE)."""
    budget = memory_budget_bytes(profile, config)
    resident = SRS_BYTES + (PCE_BYTES if pce else PCE_EXTRACTION_TRANSIENT_BYTES)
    by_memory = max(0, (budget - resident) // PARTITION_HOST_BYTES)
    return int(min(by_memory, synthesis_workers(budget, config)))


def partition_synth_seconds(profile: Profile, config: SimConfig) -> float:
    """Wall seconds of one partition's synthesis on an otherwise idle CPU."""
    speed = profile.cpu_speed
    cores = profile.cpu_cores
    par_threads = min(SYNTH_PARALLEL_MAX_THREADS, config.synthesis_threads or cores, cores)
    return SYNTH_SERIAL_CORE_S / speed + SYNTH_PARALLEL_CORE_S / (max(1, par_threads) * speed)


@dataclass(frozen=True, slots=True)
class Capacities:
    """Upper bounds on proofs/hour, one per resource (simulated, steady state)."""

    gpu: float
    cpu: float
    pcie: float
    memory: float

    @property
    def rate_per_hour(self) -> float:
        return min(self.gpu, self.cpu, self.pcie, self.memory)

    @property
    def limit(self) -> str:
        named = {"gpu": self.gpu, "cpu": self.cpu, "pcie": self.pcie, "memory": self.memory}
        return min(named, key=lambda k: named[k])


def capacities(profile: Profile, config: SimConfig | None = None) -> Capacities:
    """Closed-form bounds per resource: a quick prediction, and a check on the simulation."""
    cfg = config or SimConfig()
    n = len(active_devices(profile, cfg))
    gpu_part_s = profile.gpu.gpu_seconds_per_proof / PARTITIONS_PER_PROOF
    upload_s = PARTITION_UPLOAD_BYTES / (profile.upload_gbps * 1e9)
    gpu = n * 3600.0 / (gpu_part_s * PARTITIONS_PER_PROOF)
    pcie = n * 3600.0 / (upload_s * PARTITIONS_PER_PROOF)
    core_s_per_proof = PARTITIONS_PER_PROOF * (
        SYNTH_SERIAL_CORE_S + SYNTH_PARALLEL_CORE_S + GPU_HOST_THREADS * gpu_part_s
    )
    cpu = profile.cpu_cores * profile.cpu_speed * 3600.0 / core_s_per_proof
    # Little's law: k partitions hold memory for synthesis + upload each.
    k = max(1, partitions_in_flight_limit(profile, cfg))
    hold_s = partition_synth_seconds(profile, cfg) + upload_s
    memory = k * 3600.0 / (hold_s * PARTITIONS_PER_PROOF)
    return Capacities(gpu=gpu, cpu=cpu, pcie=pcie, memory=memory)


def water_fill(demands: Sequence[float], capacity: float) -> list[float]:
    """Fair share of ``capacity`` among consumers each wanting at most its demand."""
    alloc = [0.0] * len(demands)
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    left = capacity
    remaining = len(order)
    for i in order:
        share = left / remaining if remaining else 0.0
        give = min(demands[i], share)
        alloc[i] = give
        left -= give
        remaining -= 1
    return alloc


@dataclass(slots=True)
class PartitionSim:
    """One partition of one proof, as it moves through the pipeline."""

    proof: ProofSim
    index: int
    serial_left: float  # fast-path work; the slow path multiplies it at synthesis start
    parallel_left: float
    gpu_total: float
    gpu_left: float
    upload_left: float = PARTITION_UPLOAD_BYTES
    state: PartitionState = "pending"
    slow_path: bool = False
    gpu: int | None = None
    worker: int | None = None
    holds_memory: bool = False
    synth_started: float | None = None
    synth_ended: float | None = None
    gpu_started: float | None = None
    compute_started: float | None = None
    gpu_ended: float | None = None
    # rates set by Simulation._rates for the current interval
    cpu_alloc: float = 0.0
    rate: float = 0.0


@dataclass(slots=True)
class ProofSim:
    """One proof request and its outcome."""

    job_id: str
    kind: str
    submitted_at: float
    fail_at: int | None
    fail_in_synthesis: bool = False
    input_error: str | None = None  # the C1 could not be parsed: fails at dispatch
    identity_ok: bool = True  # sector and miner match the C1: else the self-check fails
    partitions: list[PartitionSim] = field(default_factory=list)
    status: str = "queued"  # queued, running, completed, failed
    registered_at: float | None = None  # dispatched: its pipeline appears in /status
    started_at: float | None = None  # its first partition began synthesis
    finished_at: float | None = None
    gpu_compute_s: float = 0.0
    error: str = ""
    on_done: Callable[[ProofSim], None] | None = None

    @property
    def partitions_done(self) -> int:
        return sum(1 for p in self.partitions if p.state == "done")

    @property
    def slow_path(self) -> bool:
        """Whether any of its partitions was synthesised without the PCE."""
        return any(p.slow_path for p in self.partitions)

    @property
    def wall_s(self) -> float:
        end = self.finished_at if self.finished_at is not None else self.submitted_at
        return end - self.submitted_at

    @property
    def queue_ms(self) -> int:
        """cuzk's ``queue_wait_ms``: submission to registration (0 if it failed)."""
        if self.status != "completed" or self.registered_at is None:
            return 0
        return round((self.registered_at - self.submitted_at) * 1000)

    @property
    def prove_ms(self) -> int:
        """cuzk's ``gpu_compute_ms``: GPU time of the proof's partitions (0 if it failed)."""
        return round(self.gpu_compute_s * 1000) if self.status == "completed" else 0


@dataclass(slots=True)
class ExtractionSim:
    """One background PCE extraction thread (engine.rs starts one per dispatched proof)."""

    started_at: float
    state: str = "budget"  # budget, running, insert, saving, done
    next_poll: float = 0.0
    work_left: float = EXTRACTION_CORE_S
    save_left_s: float = 0.0
    cpu_alloc: float = 0.0


@dataclass(slots=True)
class GpuSim:
    """One GPU the daemon drives: its link, its compute engine and its workers."""

    ordinal: int
    workers: list[PartitionSim | None]
    uploads: deque[PartitionSim] = field(default_factory=deque)
    staged: deque[PartitionSim] = field(default_factory=deque)
    uploading: PartitionSim | None = None
    computing: PartitionSim | None = None
    # cumulative counters
    compute_busy_s: float = 0.0
    link_busy_s: float = 0.0
    upload_bytes: float = 0.0
    download_bytes: float = 0.0
    # when each worker's current busy stretch began (None: idle), as /status reports it
    busy_since: list[float | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative counters at one simulated instant; differences give averages."""

    t: float
    cpu_core_s: float
    cpu_demand_s: float
    io_wait_s: float
    gpu_compute_busy_s: tuple[float, ...]
    gpu_link_busy_s: tuple[float, ...]
    gpu_upload_bytes: tuple[float, ...]
    gpu_download_bytes: tuple[float, ...]
    memory_byte_s: float
    memory_blocked_s: float


LogSink = Callable[[str, str], None]  # (level, message), for the daemon's log


class Simulation:
    """The pipeline of one host, advanced event by event in simulated seconds."""

    def __init__(
        self,
        profile: Profile,
        config: SimConfig | None = None,
        *,
        seed: int | None = None,
        pce_cached: bool = False,
        srs_loaded: bool = False,
        start_time: float = 0.0,
    ) -> None:
        self.profile = profile
        self.config = config or SimConfig()
        self.devices = active_devices(profile, self.config)
        self.rng = random.Random(seed if seed is not None else profile.sim.seed)
        self.t = start_time
        self.start_time = start_time
        self.cpu_cores = profile.cpu_cores
        self.cpu_speed = profile.cpu_speed
        self.upload_bps = profile.upload_gbps * 1e9
        self.budget_bytes = memory_budget_bytes(profile, self.config)
        self.synth_workers = synthesis_workers(self.budget_bytes, self.config)
        self.par_threads = max(
            1,
            min(SYNTH_PARALLEL_MAX_THREADS, self.config.synthesis_threads or self.cpu_cores),
        )
        wpd = self.config.workers_per_device
        self.gpus: dict[int, GpuSim] = {
            d: GpuSim(ordinal=d, workers=[None] * wpd, busy_since=[None] * wpd)
            for d in self.devices
        }
        self.proofs: dict[str, ProofSim] = {}
        self.queue: deque[ProofSim] = deque()  # submitted, not yet dispatched
        self.dispatching: ProofSim | None = None  # waiting for the SRS (budget or load)
        self.pending: deque[PartitionSim] = deque()
        self.synth_done: deque[PartitionSim] = deque()
        self.synthesizing: list[PartitionSim] = []
        self.memory_in_flight = 0
        # The PCE lives in memory only: a new Simulation (a daemon start) has none
        # unless told otherwise (run_batch's warmed-up daemon).
        self.pce_cached = pce_cached
        self.pce_last_used = start_time
        self.extractions: list[ExtractionSim] = []
        self.on_pce_saved: Callable[[], None] | None = None
        self.on_log: LogSink | None = None
        # SRS: none -> budget (waiting for its reservation) -> loading -> loaded
        self.srs_state = "loaded" if srs_loaded else "none"
        self.srs_load_left = 0.0
        self.srs_load_started: float | None = None
        self.srs_load_s = 0.0
        self.srs_waiters: list[Callable[[float | None], None]] = []
        self.srs_last_used = start_time
        self.total_completed = 0
        self.total_failed = 0
        self.completed_by_kind: dict[str, int] = {}
        self.failed_by_kind: dict[str, int] = {}
        self._stuck_since: float | None = None
        self._warned_too_big: set[str] = set()
        self._seq = 0
        self._next_gpu = 0
        self._cpu_in_use = 0.0
        self._cpu_runnable = 0.0
        # cumulative counters
        self._cpu_core_s = 0.0
        self._cpu_demand_s = 0.0
        self._io_wait_s = 0.0
        self._memory_byte_s = 0.0
        self._memory_blocked_s = 0.0

    # ----- the memory budget -----

    @property
    def srs_loaded(self) -> bool:
        return self.srs_state == "loaded"

    def budget_used_bytes(self) -> int:
        """What cuzk's budget has reserved now (``/status`` ``memory.used_bytes``)."""
        used = self.memory_in_flight * PARTITION_HOST_BYTES
        if self.srs_state in ("loading", "loaded"):
            used += SRS_BYTES
        if self.pce_cached:
            used += PCE_BYTES
        for e in self.extractions:
            # engine.rs drops the extraction's reservation only after
            # insert_blocking has reserved, saved and cached the PCE.
            if e.state in ("running", "insert", "saving"):
                used += PCE_EXTRACTION_TRANSIENT_BYTES
            if e.state == "saving":
                used += PCE_BYTES
        return used

    def _fits(self, amount: int) -> bool:
        return self.budget_used_bytes() + amount <= self.budget_bytes

    def _warn_too_big(self, what: str, amount: int) -> None:
        # memory.rs: acquire() logs this once per call and then waits for ever.
        if amount > self.budget_bytes and what not in self._warned_too_big:
            self._warned_too_big.add(what)
            self._log(
                "warn",
                f"acquire request exceeds total budget — will block until possible "
                f"amount_gib={amount // GIB} total_gib={self.budget_bytes // GIB} ({what})",
            )

    def _log(self, level: str, message: str) -> None:
        if self.on_log is not None:
            self.on_log(level, message)

    # ----- requests -----

    def submit(
        self,
        kind: str = "porep-c2",
        on_done: Callable[[ProofSim], None] | None = None,
        *,
        input_error: str | None = None,
        identity_ok: bool = True,
    ) -> ProofSim:
        """Queue one proof at the current simulated time."""
        self._seq += 1
        job_id = f"sim-{self._seq:06d}"
        noise = self.profile.sim.noise_pct / 100.0
        factor = min(1.6, max(0.6, self.rng.gauss(1.0, noise)))
        fail_at = None
        fail_in_synthesis = False
        if self.profile.sim.fail_rate > 0 and self.rng.random() < self.profile.sim.fail_rate:
            fail_at = self.rng.randrange(PARTITIONS_PER_PROOF)
            fail_in_synthesis = self.rng.random() < 0.5
        proof = ProofSim(
            job_id=job_id,
            kind=kind,
            submitted_at=self.t,
            fail_at=fail_at,
            fail_in_synthesis=fail_in_synthesis,
            input_error=input_error,
            identity_ok=identity_ok,
            on_done=on_done,
        )
        gpu_part_s = self.profile.gpu.gpu_seconds_per_proof / PARTITIONS_PER_PROOF
        for i in range(PARTITIONS_PER_PROOF):
            jitter = min(1.3, max(0.75, self.rng.gauss(1.0, noise / 3)))
            g = gpu_part_s * factor * min(1.2, max(0.85, self.rng.gauss(1.0, noise / 4)))
            proof.partitions.append(
                PartitionSim(
                    proof=proof,
                    index=i,
                    serial_left=SYNTH_SERIAL_CORE_S * factor * jitter,
                    parallel_left=SYNTH_PARALLEL_CORE_S * factor * jitter,
                    gpu_total=g,
                    gpu_left=g,
                )
            )
        self.proofs[job_id] = proof
        self.queue.append(proof)
        self._dispatch()
        return proof

    def request_srs(self, on_loaded: Callable[[float | None], None] | None = None) -> bool:
        """Preload the SRS (``cuzk-bench preload``); returns whether it is already loaded.

        ``on_loaded`` gets the load's seconds, or None when the simulation gave
        up on a reservation that could never fit (`SimConfig.budget_block_timeout_s`).
        """
        if self.srs_loaded:
            if on_loaded is not None:
                on_loaded(0.0)
            return True
        if on_loaded is not None:
            self.srs_waiters.append(on_loaded)
        if self.srs_state == "none":
            self.srs_state = "budget"
            self._dispatch()
        return False

    def forget(self, job_id: str) -> None:
        """Drop a finished proof's record (the daemon keeps only recent ones)."""
        proof = self.proofs.get(job_id)
        if proof is not None and proof.status in ("completed", "failed"):
            del self.proofs[job_id]

    # ----- queries -----

    @property
    def queue_depth(self) -> int:
        """Proofs not yet taken by the dispatcher (``counters.queue_depth``)."""
        return len(self.queue)

    @property
    def synthesis_active(self) -> int:
        return len(self.synthesizing)

    @property
    def max_concurrent(self) -> int:
        """``/status`` ``synthesis.max_concurrent``: the budget over the smallest partition."""
        return self.budget_bytes // SNAP_PARTITION_FULL_BYTES

    @property
    def extracting(self) -> int:
        """Background PCE extractions not finished yet."""
        return sum(1 for e in self.extractions if e.state != "done")

    def memory_used_bytes(self) -> int:
        """Host RAM in use: the rest of the machine and what cuzk holds (simulated)."""
        used = OS_BASELINE_BYTES + self.memory_in_flight * PARTITION_HOST_BYTES
        if self.srs_state == "loading":
            used += int(SRS_BYTES - self.srs_load_left)
        elif self.srs_loaded:
            used += SRS_BYTES
        if self.pce_cached:
            used += PCE_BYTES
        for e in self.extractions:
            if e.state == "running":
                used += PCE_EXTRACTION_TRANSIENT_BYTES
            elif e.state in ("insert", "saving"):
                used += PCE_EXTRACTION_TRANSIENT_BYTES + PCE_BYTES  # the recorder and its result
        return int(used)

    def busy(self) -> bool:
        return bool(
            self.queue or self.dispatching or self.pending or self.synth_done or self.synthesizing
        ) or any(g.uploading or g.computing or g.staged or g.uploads for g in self.gpus.values())

    def counters(self) -> Counters:
        order = sorted(self.gpus)
        return Counters(
            t=self.t,
            cpu_core_s=self._cpu_core_s,
            cpu_demand_s=self._cpu_demand_s,
            io_wait_s=self._io_wait_s,
            gpu_compute_busy_s=tuple(self.gpus[d].compute_busy_s for d in order),
            gpu_link_busy_s=tuple(self.gpus[d].link_busy_s for d in order),
            gpu_upload_bytes=tuple(self.gpus[d].upload_bytes for d in order),
            gpu_download_bytes=tuple(self.gpus[d].download_bytes for d in order),
            memory_byte_s=self._memory_byte_s,
            memory_blocked_s=self._memory_blocked_s,
        )

    # ----- the engine -----

    def _slowdown(self) -> float:
        """GPU slow-down from heat (the profile's ``degrade_pct_per_hour``), capped at 2x."""
        pct = self.profile.sim.degrade_pct_per_hour
        if pct <= 0:
            return 1.0
        hours = (self.t - self.start_time) / 3600.0
        return min(2.0, 1.0 + pct / 100.0 * hours)

    def _cpu_demands(self) -> list[tuple[PartitionSim | ExtractionSim, float]]:
        out: list[tuple[PartitionSim | ExtractionSim, float]] = []
        for p in self.synthesizing:
            out.append((p, 1.0 if p.serial_left > _EPS else float(self.par_threads)))
        if self.srs_loaded:
            for g in self.gpus.values():
                if g.computing is not None:
                    out.append((g.computing, GPU_HOST_THREADS))
        for e in self.extractions:
            if e.state == "running":
                out.append((e, 1.0))
        return out

    def _allocate_cpu(
        self, demands: list[tuple[PartitionSim | ExtractionSim, float]]
    ) -> list[float]:
        """Cores per consumer: OS threads share fairly, the synthesis pool goes FIFO.

        Serial witness generation, the GPU host threads and the extraction are
        plain OS threads, so they share the cores fairly. The parallel phases
        run on cuzk's rayon pool, whose global queue serves older work first:
        the oldest partition's mat-vec gets its threads before a younger one's,
        which is why the first partitions reach the GPU quickly on a busy host.
        """
        alloc = [0.0] * len(demands)
        fair = [i for i, (p, _) in enumerate(demands) if not self._in_pool(p)]
        pool = [i for i, (p, _) in enumerate(demands) if self._in_pool(p)]
        shares = water_fill([demands[i][1] for i in fair], float(self.cpu_cores))
        for i, a in zip(fair, shares, strict=True):
            alloc[i] = a
        left = max(0.0, float(self.cpu_cores) - sum(shares))
        for i in pool:  # self.synthesizing is kept in start order
            give = min(demands[i][1], left)
            alloc[i] = give
            left -= give
        return alloc

    @staticmethod
    def _in_pool(p: PartitionSim | ExtractionSim) -> bool:
        return isinstance(p, PartitionSim) and p.state == "synthesizing" and p.serial_left <= _EPS

    def _stuck(self) -> bool:
        """Work waits for budget and nothing in flight will ever free any."""
        waiting = self.srs_state == "budget" or (
            bool(self.pending) and not self._can_start_synthesis()
        )
        if not waiting:
            return False
        in_flight = (
            self.synthesizing or self.synth_done or self.srs_state == "loading"
            or any(g.workers.count(None) < len(g.workers) for g in self.gpus.values())
            or any(e.state in ("running", "saving") for e in self.extractions)
        )
        return not in_flight

    def _rates(self) -> float:
        """Set every active task's rate; return the time to the next event."""
        demands = self._cpu_demands()
        alloc = self._allocate_cpu(demands)
        self._cpu_in_use = sum(alloc)
        self._cpu_runnable = sum(d for _, d in demands)
        slow = self._slowdown()
        dt = math.inf
        for (p, demand), a in zip(demands, alloc, strict=True):
            p.cpu_alloc = a
            if isinstance(p, ExtractionSim):
                if a > 0:
                    dt = min(dt, p.work_left / (a * self.cpu_speed))
            elif p.state == "synthesizing":
                p.rate = a * self.cpu_speed
                left = p.serial_left if p.serial_left > _EPS else p.parallel_left
                if p.rate > 0:
                    dt = min(dt, left / p.rate)
            else:  # a GPU compute: the GPU slows if its host thread is starved
                p.rate = min(1.0, a / demand) / slow if demand > 0 else 1.0 / slow
                if p.rate > 0:
                    dt = min(dt, p.gpu_left / p.rate)
        for g in self.gpus.values():
            if g.uploading is not None:
                dt = min(dt, g.uploading.upload_left / self.upload_bps)
        if self.srs_state == "loading":
            dt = min(dt, self.srs_load_left / SRS_LOAD_BYTES_PER_S)
        for e in self.extractions:
            if e.state in ("budget", "insert"):
                dt = min(dt, max(0.0, e.next_poll - self.t))
            elif e.state == "saving":
                dt = min(dt, e.save_left_s)
        if self._stuck_since is not None:
            deadline = self._stuck_since + self.config.budget_block_timeout_s
            dt = min(dt, max(0.0, deadline - self.t))
        if self.profile.sim.degrade_pct_per_hour > 0:
            dt = min(dt, 30.0)  # re-evaluate the heat slow-down regularly
        return dt

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        self._cpu_core_s += self._cpu_in_use * dt
        self._cpu_demand_s += self._cpu_runnable * dt
        self._memory_byte_s += self.memory_used_bytes() * dt
        if self.pending and not self._can_start_synthesis():
            self._memory_blocked_s += dt
        if self.srs_state == "loading":
            self._io_wait_s += dt
        for p in self.synthesizing:
            work = p.rate * dt
            if p.serial_left > _EPS:
                p.serial_left = max(0.0, p.serial_left - work)
            else:
                p.parallel_left = max(0.0, p.parallel_left - work)
        for e in self.extractions:
            if e.state == "running":
                e.work_left = max(0.0, e.work_left - e.cpu_alloc * self.cpu_speed * dt)
            elif e.state == "saving":
                e.save_left_s = max(0.0, e.save_left_s - dt)
        for g in self.gpus.values():
            if g.uploading is not None:
                moved = min(g.uploading.upload_left, self.upload_bps * dt)
                g.uploading.upload_left -= moved
                g.upload_bytes += moved
                g.link_busy_s += dt
            if g.computing is not None and self.srs_loaded:
                c = g.computing
                done = min(c.gpu_left, c.rate * dt)
                c.gpu_left -= done
                g.compute_busy_s += dt
                g.download_bytes += PARTITION_DOWNLOAD_BYTES * done / max(c.gpu_total, _EPS)
        if self.srs_state == "loading":
            self.srs_load_left = max(0.0, self.srs_load_left - SRS_LOAD_BYTES_PER_S * dt)
        self.t += dt

    def _step(self, limit: float) -> bool:
        """One event step no further than ``limit``; False when nothing is scheduled."""
        dt = self._rates()
        if not math.isfinite(dt):
            return False
        self._advance(min(dt, limit))
        self._process_events()
        self._dispatch()
        return True

    def advance_to(self, target: float) -> None:
        """Run the pipeline until simulated time ``target``."""
        while self.t < target - _EPS:
            if not self._step(target - self.t):
                self._advance(target - self.t)
                break
        self.t = max(self.t, target)

    def run_until_idle(self, limit_s: float = 1e7) -> None:
        """Run until nothing is queued or in flight (tests, batch planning)."""
        end = self.t + limit_s
        while self.busy() and self.t < end and self._step(end - self.t):
            pass

    def settle(self, limit_s: float = 1e7) -> None:
        """`run_until_idle`, then until background extractions are done too (or wait for
        budget that nothing left running will free)."""
        end = self.t + limit_s
        while (self.busy() or self._extraction_can_progress()) and self.t < end:
            if not self._step(end - self.t):
                break

    def _extraction_can_progress(self) -> bool:
        for e in self.extractions:
            if e.state in ("running", "saving"):
                return True
            need = PCE_EXTRACTION_TRANSIENT_BYTES if e.state == "budget" else PCE_BYTES
            if e.state in ("budget", "insert") and self._fits(need):
                return True
        return False

    def _can_start_synthesis(self) -> bool:
        if len(self.synthesizing) >= self.synth_workers:
            return False
        return self._fits(PARTITION_HOST_BYTES)

    def _dispatch(self) -> None:
        self._dispatch_proofs()
        while self.pending and self._can_start_synthesis():
            p = self.pending.popleft()
            if p.proof.status == "failed":
                continue
            p.state = "synthesizing"
            p.synth_started = self.t
            p.holds_memory = True
            if not self.pce_cached:
                p.slow_path = True
                p.serial_left *= SLOW_PATH_SERIAL_FACTOR
                p.parallel_left *= SLOW_PATH_PARALLEL_FACTOR
            else:
                self.pce_last_used = self.t
            self.memory_in_flight += 1
            self.synthesizing.append(p)
            if p.proof.started_at is None:
                p.proof.started_at = self.t
        if self.pending and not self.synthesizing:
            self._warn_too_big("partition", PARTITION_HOST_BYTES)
        self._dispatch_gpus()
        stuck = self._stuck()
        if stuck and self._stuck_since is None:
            self._stuck_since = self.t
        elif not stuck:
            self._stuck_since = None

    def _start_srs_load(self) -> None:
        self.srs_state = "loading"
        self.srs_load_left = float(SRS_BYTES)
        self.srs_load_started = self.t

    def _dispatch_proofs(self) -> None:
        """The synthesis dispatcher: one proof at a time through SRS, C1 parse and queueing."""
        if self.srs_state == "budget" and self.srs_waiters and self._fits(SRS_BYTES):
            self._start_srs_load()  # a preload waited for its reservation
        while True:
            if self.dispatching is None:
                if not self.queue:
                    break
                self.dispatching = self.queue.popleft()
            proof = self.dispatching
            if self.srs_state in ("none", "budget"):
                # engine.rs reserves the SRS in the budget before it parses the C1.
                if not self._fits(SRS_BYTES):
                    self.srs_state = "budget"
                    break
                if proof.input_error is None:
                    self._start_srs_load()
            if proof.input_error is not None:
                # Parsed before the SRS is loaded; the reservation is dropped with it.
                self.dispatching = None
                if self.srs_state == "budget" and not self.srs_waiters:
                    self.srs_state = "none"
                self._finish(proof, ok=False, error=f"C1 parse failed: {proof.input_error}")
                continue
            if not self.srs_loaded:
                break  # loading: the dispatcher waits for it
            self.dispatching = None
            proof.registered_at = self.t
            proof.status = "running"
            self.srs_last_used = self.t
            if not self.pce_cached:
                self.extractions.append(ExtractionSim(started_at=self.t, next_poll=self.t))
                self._log("info", "background PCE extraction starting for PoRep 32G")
            self.pending.extend(proof.partitions)
        if self.srs_state == "budget":
            self._warn_too_big("srs", SRS_BYTES)

    def _dispatch_gpus(self) -> None:
        while self.synth_done:
            free = [
                (sum(1 for w in g.workers if w is not None), (d - self._next_gpu) % 1024, d)
                for d, g in self.gpus.items()
                if any(w is None for w in g.workers)
            ]
            if not free:
                break
            # The least-loaded GPU, ties broken round-robin: cuzk's idle
            # workers all pull from one queue, so work spreads over the GPUs.
            _, _, d = min(free)
            self._next_gpu = d + 1
            g = self.gpus[d]
            p = self.synth_done.popleft()
            if p.proof.status == "failed":
                self._release_memory(p)
                p.state = "failed"
                continue
            w = g.workers.index(None)
            g.workers[w] = p
            g.busy_since[w] = self.t
            p.gpu, p.worker, p.state = d, w, "gpu"
            p.gpu_started = self.t
            g.uploads.append(p)
        for g in self.gpus.values():
            if g.uploading is None and g.uploads:
                g.uploading = g.uploads.popleft()
            if g.computing is None and g.staged and self.srs_loaded:
                g.computing = g.staged.popleft()
                g.computing.compute_started = self.t
                self.srs_last_used = self.t

    def _release_memory(self, p: PartitionSim) -> None:
        if p.holds_memory:
            p.holds_memory = False
            self.memory_in_flight -= 1

    def _process_extractions(self) -> None:
        for e in self.extractions:
            if e.state == "budget" and self.t >= e.next_poll - _EPS:
                if self._fits(PCE_EXTRACTION_TRANSIENT_BYTES):
                    e.state = "running"
                else:
                    e.next_poll = self.t + BUDGET_POLL_S
            elif e.state == "running" and e.work_left <= _EPS:
                # Extraction done, its transient budget freed; insert_blocking next.
                self._log("info", "PCE extraction complete circuit_id=porep-32g (simulated)")
                if self.pce_cached:
                    e.state = "done"
                    self._log("info", "background PCE extraction complete")
                else:
                    e.state, e.next_poll = "insert", self.t
            if e.state == "insert" and self.t >= e.next_poll - _EPS:
                if self.pce_cached:
                    e.state = "done"
                    self._log("info", "background PCE extraction complete")
                elif self._fits(PCE_BYTES):
                    e.state, e.save_left_s = "saving", PCE_BYTES / PCE_SAVE_BYTES_PER_S
                else:
                    e.next_poll = self.t + BUDGET_POLL_S
            elif e.state == "saving" and e.save_left_s <= _EPS:
                e.state = "done"
                if self.on_pce_saved is not None:
                    self.on_pce_saved()
                if not self.pce_cached:
                    self.pce_cached = True
                    self.pce_last_used = self.t
                    self._log("info", "PCE cached circuit_id=porep-32g "
                              f"size_gib={PCE_BYTES // GIB}")
                self._log("info", "background PCE extraction complete")
        self.extractions = [e for e in self.extractions if e.state != "done"]

    def _process_events(self) -> None:
        if self.srs_state == "loading" and self.srs_load_left <= _EPS:
            self.srs_load_left = 0.0
            self.srs_state = "loaded"
            started = self.srs_load_started if self.srs_load_started is not None else self.t
            self.srs_load_s = self.t - started
            waiters, self.srs_waiters = self.srs_waiters, []
            for cb in waiters:
                cb(self.srs_load_s)
        self._process_extractions()
        if (
            self._stuck_since is not None
            and self.t >= self._stuck_since + self.config.budget_block_timeout_s - _EPS
        ):
            self._fail_stuck()
        for p in list(self.synthesizing):
            if p.serial_left <= _EPS and p.parallel_left <= _EPS:
                self.synthesizing.remove(p)
                p.synth_ended = self.t
                proof = p.proof
                if proof.status == "failed" or (
                    proof.fail_in_synthesis and proof.fail_at == p.index
                ):
                    # A synthesis error (simulated) fails the proof at once,
                    # possibly before proofs submitted ahead of it finish.
                    self._release_memory(p)
                    p.state = "failed"
                    if proof.status != "failed":
                        self._finish(proof, ok=False, error="synthesis failed (simulated)")
                    continue
                p.state = "synth_done"
                self.synth_done.append(p)
        for g in self.gpus.values():
            up = g.uploading
            if up is not None and up.upload_left <= 1.0:
                up.upload_left = 0.0
                g.uploading = None
                self._release_memory(up)
                g.staged.append(up)
            c = g.computing
            if c is not None and c.gpu_left <= _EPS:
                g.computing = None
                assert c.worker is not None
                g.workers[c.worker] = None
                g.busy_since[c.worker] = None
                c.gpu_ended = self.t
                started = c.compute_started if c.compute_started is not None else self.t
                c.proof.gpu_compute_s += self.t - started
                self._partition_finished(c)

    def _fail_stuck(self) -> None:
        self._stuck_since = None
        waited = self.config.budget_block_timeout_s
        free_gib = (self.budget_bytes - self.budget_used_bytes()) / GIB
        why = (f"waited {waited:.0f} s for the memory budget ({free_gib:.0f} GiB free of "
               f"{self.budget_bytes / GIB:.0f} GiB); the real daemon would wait for ever")
        if self.srs_state == "budget":
            self.srs_state = "none"
            waiters, self.srs_waiters = self.srs_waiters, []
            for cb in waiters:
                cb(None)
            proof, self.dispatching = self.dispatching, None
        else:
            proof = self.pending[0].proof if self.pending else None
        self._log("error", f"(simulated) {why}")
        if proof is not None:
            self._finish(proof, ok=False, error=f"(simulated) {why}")

    def _partition_finished(self, p: PartitionSim) -> None:
        proof = p.proof
        if proof.status == "failed":
            p.state = "failed"
            return
        if proof.fail_at is not None and p.index == proof.fail_at:
            p.state = "failed"
            self._finish(proof, ok=False, error="GPU prover error (simulated)")
            return
        p.state = "done"
        if proof.partitions_done == PARTITIONS_PER_PROOF:
            if not proof.identity_ok:
                # engine.rs verifies every assembled PoRep proof against the
                # request's sector and miner before returning it.
                self._log("warn", f"PoRep proof self-check FAILED — proof is invalid "
                          f"job_id={proof.job_id}")
                self._finish(proof, ok=False, error="PoRep proof self-check failed")
            else:
                self._finish(proof, ok=True)

    def _finish(self, proof: ProofSim, *, ok: bool, error: str = "") -> None:
        proof.finished_at = self.t
        proof.status = "completed" if ok else "failed"
        proof.error = error
        if ok:
            self.total_completed += 1
            self.completed_by_kind[proof.kind] = self.completed_by_kind.get(proof.kind, 0) + 1
        else:
            self.total_failed += 1
            self.failed_by_kind[proof.kind] = self.failed_by_kind.get(proof.kind, 0) + 1
            for q in proof.partitions:
                if q.state == "pending":
                    q.state = "failed"
            self.pending = deque(q for q in self.pending if q.proof is not proof)
            if proof in self.queue:
                self.queue.remove(proof)
        if proof.on_done is not None:
            proof.on_done(proof)


class BatchDriver:
    """``cuzk-bench batch``: ``count`` proofs, at most ``concurrency`` in flight.

    It submits the next proof at the simulated instant a slot frees, as the
    real bench's semaphore does (the real one adds a connect per request,
    milliseconds that the model ignores). ``results`` is in completion order;
    the real tool prints in submission order (`vast_manager.sim.bench`).
    """

    def __init__(
        self,
        sim: Simulation,
        count: int,
        concurrency: int,
        on_proof: Callable[[int, ProofSim], None] | None = None,
        on_done: Callable[[BatchDriver], None] | None = None,
        kind: str = "porep-c2",
        submit: Callable[[Callable[[ProofSim], None]], ProofSim] | None = None,
    ) -> None:
        self.sim = sim
        self.count = max(0, count)
        self.concurrency = max(1, concurrency)
        self.kind = kind
        self.on_proof = on_proof
        self.on_done_cb = on_done
        self._submit = submit or (lambda done: sim.submit(self.kind, on_done=done))
        self.started_at = sim.t
        self.finished_at: float | None = None
        self.submitted = 0
        self.results: list[tuple[int, ProofSim]] = []  # completion order
        self._index: dict[str, int] = {}
        for _ in range(min(self.concurrency, self.count)):
            self._submit_next()
        if self.count == 0:
            self._complete()

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def _submit_next(self) -> None:
        self.submitted += 1
        proof = self._submit(self._proof_done)
        self._index[proof.job_id] = self.submitted

    def _proof_done(self, proof: ProofSim) -> None:
        idx = self._index[proof.job_id]
        self.results.append((idx, proof))
        if self.on_proof is not None:
            self.on_proof(idx, proof)
        if self.submitted < self.count:
            self._submit_next()
        elif len(self.results) == self.count:
            self._complete()

    def _complete(self) -> None:
        self.finished_at = self.sim.t
        if self.on_done_cb is not None:
            self.on_done_cb(self)

    @property
    def total_s(self) -> float:
        end = self.finished_at if self.finished_at is not None else self.sim.t
        return end - self.started_at


@dataclass(frozen=True, slots=True)
class ProofRecord:
    """One line of ``cuzk-bench batch`` output, in simulated seconds."""

    index: int
    completed: bool
    wall_s: float
    prove_ms: int
    queue_ms: int


@dataclass(frozen=True, slots=True)
class Utilisation:
    """Averages over a run (simulated)."""

    gpu_busy: tuple[float, ...]  # fraction of time each used GPU computes
    link_busy: tuple[float, ...]  # fraction of time each used GPU's link uploads
    pcie_rx_fraction: tuple[float, ...]  # host->GPU bytes/s over link capacity
    cpu_busy: float  # fraction of all cores
    memory_blocked: float  # fraction of time a synthesis waited for RAM

    @property
    def gpu_busy_mean(self) -> float:
        return sum(self.gpu_busy) / len(self.gpu_busy) if self.gpu_busy else 0.0

    @property
    def pcie_rx_fraction_max(self) -> float:
        return max(self.pcie_rx_fraction, default=0.0)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a simulated benchmark run produced."""

    records: tuple[ProofRecord, ...]
    total_s: float
    utilisation: Utilisation

    @property
    def completed(self) -> int:
        return sum(1 for r in self.records if r.completed)

    @property
    def rate_per_hour(self) -> float:
        return self.completed * 3600.0 / self.total_s if self.total_s > 0 else 0.0

    @property
    def bottleneck(self) -> str:
        return classify(self.utilisation)


def utilisation_between(sim: Simulation, a: Counters, b: Counters) -> Utilisation:
    """Averages between two counter snapshots of one simulation."""
    span = max(b.t - a.t, _EPS)
    capacity_bps = sim.profile.pcie_link_gbps * 1e9
    gpu = tuple(
        (y - x) / span for x, y in zip(a.gpu_compute_busy_s, b.gpu_compute_busy_s, strict=True)
    )
    link = tuple((y - x) / span for x, y in zip(a.gpu_link_busy_s, b.gpu_link_busy_s, strict=True))
    rx = tuple(
        (y - x) / span / capacity_bps
        for x, y in zip(a.gpu_upload_bytes, b.gpu_upload_bytes, strict=True)
    )
    cpu = (b.cpu_core_s - a.cpu_core_s) / span / max(1, sim.cpu_cores)
    blocked = (b.memory_blocked_s - a.memory_blocked_s) / span
    return Utilisation(gpu, link, rx, cpu, blocked)


def classify(u: Utilisation) -> str:
    """The simulation's own ground truth of what limits a run (docs/architecture.md's rules)."""
    if u.gpu_busy_mean > 0.9:
        return "gpu"
    if u.pcie_rx_fraction_max > 0.8:
        return "pcie"
    if u.cpu_busy > 0.9 and u.gpu_busy_mean < 0.5:
        return "cpu"
    if u.memory_blocked > 0.5:
        return "memory"
    return "unknown"


def run_batch(
    profile: Profile,
    count: int = 12,
    concurrency: int = 2,
    *,
    config: SimConfig | None = None,
    seed: int | None = None,
    pce_cached: bool = True,
    srs_loaded: bool = True,
) -> BatchResult:
    """Simulate ``cuzk-bench batch -c count -j concurrency`` on a daemon.

    The default is a warmed-up daemon (SRS loaded, PCE cached); with
    ``pce_cached=False`` it is a fresh one: the first proof starts the PCE
    extraction beside the benchmark and the early proofs take the slow path.
    """
    sim = Simulation(profile, config, seed=seed, pce_cached=pce_cached, srs_loaded=srs_loaded)
    before = sim.counters()
    driver = BatchDriver(sim, count, concurrency)
    sim.run_until_idle()
    after = sim.counters()
    records = tuple(
        ProofRecord(
            index=idx,
            completed=p.status == "completed",
            wall_s=p.wall_s,
            prove_ms=p.prove_ms,
            queue_ms=p.queue_ms,
        )
        for idx, p in driver.results
    )
    return BatchResult(records, driver.total_s, utilisation_between(sim, before, after))
