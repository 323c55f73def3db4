"""Performance model of one simulated cuzk host: CPU synthesis, PCIe, GPU, RAM.

A PoRep C2 32G proof is 10 partitions. Each partition goes through

1. **synthesis** on the CPU: a serial part (witness generation: the SHA-256
   and Poseidon hashing of the partition's challenges runs on one thread) and
   a parallel part (the PCE's sparse matrix x witness products, up to
   ``SYNTH_PARALLEL_MAX_THREADS`` threads). The daemon runs at most
   ``synthesis.max_concurrent`` syntheses at once, and each one needs
   ``PARTITION_HOST_BYTES`` of RAM from its start until its data is on the GPU,
   so RAM bounds how many partitions are in flight;
2. **upload** over the GPU's PCIe link (``PARTITION_UPLOAD_BYTES``: the a/b/c
   evaluations, the witness, and the SRS bases streamed for the MSMs, since a
   16-32 GB card cannot keep the 45 GiB SRS);
3. **GPU compute** (the GPU model's ``gpu_seconds_per_proof`` / 10), with one
   host thread per GPU driving it.

Each GPU has ``gpu_workers_per_device`` workers (2 by default), so the next
partition uploads while the current one computes. All CPU consumers share the
cores fairly (water-filling), so an oversubscribed CPU slows every synthesis
and, a little, the GPU drivers too.

The engine is a fluid discrete-event simulation: between events every rate is
constant, so it jumps from event to event exactly. `Simulation` is driven
either to completion (`run_batch`, for tests and capacity planning) or in real
time by the simulated daemon (`agent.sim.daemon`). Every number here is
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
  staging; upstream saw ~360 GiB peak RSS for 20 partitions in flight) with
  70 GiB resident (SRS 45 + PCE 25, reference/cuzk.md), a 5 GiB safety margin
  and 3 GiB for the OS gives 2 partitions in flight on a 128 GB host, 8 on
  256 GB, 14 on 384 GB and 20 on 512 GB. By Little's law that reproduces
  upstream's RAM table (128 GiB slow, 256 GiB good, 512 GiB best): an RTX 5090
  on 128 GB ~26 proofs/hour, an RTX 4090 on a 32-thread 256 GB host ~61-65,
  an RTX 5070 Ti on 384 GB ~95.
* ``PARTITION_UPLOAD_BYTES`` = 48 GB: the four G1 SRS queries of a 130 M
  constraint circuit at 96 bytes a point, streamed per partition since a
  16-32 GB card cannot keep the 45 GiB SRS. On Gen4 x16 that is ~2 s, hidden
  behind compute; on a Gen3 x4 riser (3.94 GB/s) it is ~12 s against ~5 s of
  RTX 3090 compute: PCIe-bound.
* GPU seconds per proof (agent/sim/hardware.py): ~3.4 s/partition for an
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

from agent.sim.hardware import Profile

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

# --- PCIe ---
PARTITION_UPLOAD_BYTES = 48e9
PARTITION_DOWNLOAD_BYTES = 1.5e9  # NTT/MSM results and the proof back to the host

# --- RAM ---
PARTITION_HOST_BYTES = 20 * GIB
SRS_BYTES = 45 * GIB
PCE_BYTES = 25 * GIB
PCE_EXTRACT_BYTES = 14 * GIB  # transient, while the first proof records the PCE
OS_BASELINE_BYTES = 3 * GIB
DEFAULT_SAFETY_MARGIN_BYTES = 5 * GIB
SRS_LOAD_BYTES_PER_S = 1.5e9  # read + deserialise the .params file
PCE_LOAD_BYTES_PER_S = 5e9  # reference/cuzk.md: "loads it at about 5 GB/s"

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
    workers_per_device: int = 2
    max_concurrent: int | None = None  # None: as many as RAM allows
    synthesis_threads: int = 0  # 0: all cores
    total_budget_bytes: int | None = None  # None: "auto" (RAM - OS - safety margin)
    safety_margin_bytes: int = DEFAULT_SAFETY_MARGIN_BYTES


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
    """cuzk's memory budget: configured, or RAM minus the OS and the safety margin."""
    if config.total_budget_bytes is not None:
        return config.total_budget_bytes
    return max(0, profile.ram_total_bytes - OS_BASELINE_BYTES - config.safety_margin_bytes)


def partitions_in_flight_limit(profile: Profile, config: SimConfig, *, pce: bool = True) -> int:
    """How many partitions RAM can hold at once once SRS (and PCE) are resident."""
    resident = SRS_BYTES + (PCE_BYTES if pce else PCE_EXTRACT_BYTES)
    free = memory_budget_bytes(profile, config) - resident
    return max(1, int(free // PARTITION_HOST_BYTES))


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
    k = partitions_in_flight_limit(profile, cfg)
    if cfg.max_concurrent:
        k = min(k, cfg.max_concurrent)
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
    serial_left: float
    parallel_left: float
    gpu_total: float
    gpu_left: float
    upload_left: float = PARTITION_UPLOAD_BYTES
    state: PartitionState = "pending"
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
    slow_path: bool
    fail_at: int | None
    fail_in_synthesis: bool = False
    partitions: list[PartitionSim] = field(default_factory=list)
    status: str = "queued"  # queued, running, completed, failed
    started_at: float | None = None
    finished_at: float | None = None
    gpu_compute_s: float = 0.0
    error: str = ""
    on_done: Callable[[ProofSim], None] | None = None

    @property
    def partitions_done(self) -> int:
        return sum(1 for p in self.partitions if p.state == "done")

    @property
    def wall_s(self) -> float:
        end = self.finished_at if self.finished_at is not None else self.submitted_at
        return end - self.submitted_at

    @property
    def queue_ms(self) -> int:
        if self.started_at is None:
            return 0
        return round((self.started_at - self.submitted_at) * 1000)

    @property
    def prove_ms(self) -> int:
        """cuzk's ``gpu_compute_ms``: GPU time of the proof's partitions (0 if it failed)."""
        return round(self.gpu_compute_s * 1000) if self.status == "completed" else 0


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
    worker_busy_s: list[float] = field(default_factory=list)


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


class Simulation:
    """The pipeline of one host, advanced event by event in simulated seconds."""

    def __init__(
        self,
        profile: Profile,
        config: SimConfig | None = None,
        *,
        seed: int | None = None,
        pce_present: bool = True,
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
        self.par_threads = max(
            1,
            min(SYNTH_PARALLEL_MAX_THREADS, self.config.synthesis_threads or self.cpu_cores),
        )
        self.gpus: dict[int, GpuSim] = {
            d: GpuSim(
                ordinal=d,
                workers=[None] * self.config.workers_per_device,
                worker_busy_s=[0.0] * self.config.workers_per_device,
            )
            for d in self.devices
        }
        self.proofs: dict[str, ProofSim] = {}
        self.pending: deque[PartitionSim] = deque()
        self.synth_done: deque[PartitionSim] = deque()
        self.synthesizing: list[PartitionSim] = []
        self.memory_in_flight = 0
        # Caches: the PCE, if present at start, is loaded now (fast path);
        # otherwise every proof of this daemon takes the slow path and the
        # first one records the PCE (a restart loads it, as with real cuzk).
        self.pce_present = pce_present
        self.pce_loaded = False
        self.pce_load_left = float(PCE_BYTES) if pce_present else 0.0
        self.pce_extracting: ProofSim | None = None
        self.pce_extracted = False
        self.on_pce_extracted: Callable[[], None] | None = None
        self.srs_loaded = srs_loaded
        self.srs_load_left = 0.0 if srs_loaded else -1.0  # -1: not requested yet
        self.srs_load_started: float | None = None
        self.srs_load_s: float = 0.0
        self.srs_waiters: list[Callable[[float], None]] = []
        self.srs_last_used = start_time
        self.pce_last_used = start_time
        self.total_completed = 0
        self.total_failed = 0
        self.completed_by_kind: dict[str, int] = {}
        self.failed_by_kind: dict[str, int] = {}
        self._seq = 0
        self._next_gpu = 0
        # cumulative counters
        self._cpu_core_s = 0.0
        self._cpu_demand_s = 0.0
        self._io_wait_s = 0.0
        self._memory_byte_s = 0.0
        self._memory_blocked_s = 0.0
        if not pce_present:
            self.pce_loaded = False
        elif self.pce_load_left <= 0:
            self.pce_loaded = True

    # ----- requests -----

    def submit(
        self, kind: str = "porep", on_done: Callable[[ProofSim], None] | None = None
    ) -> ProofSim:
        """Queue one proof at the current simulated time."""
        self._seq += 1
        job_id = f"sim-{self._seq:06d}"
        slow = not self.pce_present
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
            slow_path=slow,
            fail_at=fail_at,
            fail_in_synthesis=fail_in_synthesis,
            on_done=on_done,
        )
        gpu_part_s = self.profile.gpu.gpu_seconds_per_proof / PARTITIONS_PER_PROOF
        for i in range(PARTITIONS_PER_PROOF):
            jitter = min(1.3, max(0.75, self.rng.gauss(1.0, noise / 3)))
            serial = SYNTH_SERIAL_CORE_S * factor * jitter
            parallel = SYNTH_PARALLEL_CORE_S * factor * jitter
            if slow:
                serial *= SLOW_PATH_SERIAL_FACTOR
                parallel *= SLOW_PATH_PARALLEL_FACTOR
            g = gpu_part_s * factor * min(1.2, max(0.85, self.rng.gauss(1.0, noise / 4)))
            part = PartitionSim(
                proof=proof,
                index=i,
                serial_left=serial,
                parallel_left=parallel,
                gpu_total=g,
                gpu_left=g,
            )
            proof.partitions.append(part)
            self.pending.append(part)
        if slow and self.pce_extracting is None and not self.pce_extracted:
            self.pce_extracting = proof
        self.proofs[job_id] = proof
        self.request_srs()
        self._dispatch()
        return proof

    def request_srs(self, on_loaded: Callable[[float], None] | None = None) -> bool:
        """Start loading the SRS if needed; returns whether it is already loaded."""
        if self.srs_loaded:
            if on_loaded is not None:
                on_loaded(0.0)
            return True
        if on_loaded is not None:
            self.srs_waiters.append(on_loaded)
        if self.srs_load_left < 0:
            self.srs_load_left = float(SRS_BYTES)
            self.srs_load_started = self.t
        return False

    def forget(self, job_id: str) -> None:
        """Drop a finished proof's record (the daemon keeps only recent ones)."""
        proof = self.proofs.get(job_id)
        if proof is not None and proof.status in ("completed", "failed"):
            del self.proofs[job_id]

    # ----- queries -----

    @property
    def queue_depth(self) -> int:
        return sum(1 for p in self.proofs.values() if p.status == "queued")

    @property
    def synthesis_active(self) -> int:
        return len(self.synthesizing)

    @property
    def max_concurrent(self) -> int:
        limit = partitions_in_flight_limit(self.profile, self.config, pce=self.pce_present)
        if self.config.max_concurrent:
            return min(limit, self.config.max_concurrent)
        return limit

    def memory_used_bytes(self) -> int:
        """Host RAM in use: OS, resident caches, partitions in flight (simulated)."""
        used = OS_BASELINE_BYTES + self.memory_in_flight * PARTITION_HOST_BYTES
        if self.srs_loaded or self.srs_load_left > 0:
            loaded = SRS_BYTES - max(0.0, self.srs_load_left)
            used += int(loaded)
        if self.pce_present:
            used += int(PCE_BYTES - self.pce_load_left)
        elif self.pce_extracting is not None and self.pce_extracting.status == "running":
            used += PCE_EXTRACT_BYTES
        return int(used)

    def busy(self) -> bool:
        return bool(self.pending or self.synth_done or self.synthesizing) or any(
            g.uploading or g.computing or g.staged or g.uploads for g in self.gpus.values()
        )

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

    def current_cpu_demand(self) -> tuple[float, float]:
        """(cores in use, runnable threads) right now."""
        demands = self._cpu_demands()
        alloc = self._allocate_cpu(demands)
        return sum(alloc), sum(d for _, d in demands)

    # ----- the engine -----

    def _slowdown(self) -> float:
        """GPU slow-down from heat (``sim.degrade_pct_per_hour``), capped at 2x."""
        pct = self.profile.sim.degrade_pct_per_hour
        if pct <= 0:
            return 1.0
        hours = (self.t - self.start_time) / 3600.0
        return min(2.0, 1.0 + pct / 100.0 * hours)

    def _cpu_demands(self) -> list[tuple[PartitionSim, float]]:
        out: list[tuple[PartitionSim, float]] = []
        for p in self.synthesizing:
            out.append((p, 1.0 if p.serial_left > _EPS else float(self.par_threads)))
        if self.srs_loaded:
            for g in self.gpus.values():
                if g.computing is not None:
                    out.append((g.computing, GPU_HOST_THREADS))
        return out

    def _allocate_cpu(self, demands: list[tuple[PartitionSim, float]]) -> list[float]:
        """Cores per consumer: OS threads share fairly, the synthesis pool goes FIFO.

        Serial witness generation and the GPU host threads are plain OS threads,
        so they share the cores fairly. The parallel phases run on cuzk's
        rayon pool, whose global queue serves older work first: the oldest
        partition's mat-vec gets its threads before a younger one's, which is
        why the first partitions reach the GPU quickly on a busy host.
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
    def _in_pool(p: PartitionSim) -> bool:
        return p.state == "synthesizing" and p.serial_left <= _EPS

    def _rates(self) -> float:
        """Set every active task's rate; return the time to the next event."""
        demands = self._cpu_demands()
        alloc = self._allocate_cpu(demands)
        self._cpu_in_use = sum(alloc)
        self._cpu_runnable = sum(d for _, d in demands)
        slow = self._slowdown()
        dt = math.inf
        for (p, demand), a in zip(demands, alloc, strict=True):
            if p.state == "synthesizing":
                p.cpu_alloc = a
                p.rate = a * self.cpu_speed
                left = p.serial_left if p.serial_left > _EPS else p.parallel_left
                if p.rate > 0:
                    dt = min(dt, left / p.rate)
            else:  # a GPU compute: the GPU slows if its host thread is starved
                p.cpu_alloc = a
                p.rate = min(1.0, a / demand) / slow if demand > 0 else 1.0 / slow
                if p.rate > 0:
                    dt = min(dt, p.gpu_left / p.rate)
        for g in self.gpus.values():
            if g.uploading is not None:
                dt = min(dt, g.uploading.upload_left / self.upload_bps)
        if self.srs_load_left > 0:
            dt = min(dt, self.srs_load_left / SRS_LOAD_BYTES_PER_S)
        if self.pce_load_left > 0:
            dt = min(dt, self.pce_load_left / PCE_LOAD_BYTES_PER_S)
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
        loading = self.srs_load_left > 0 or self.pce_load_left > 0
        if loading:
            self._io_wait_s += dt
        for p in self.synthesizing:
            work = p.rate * dt
            if p.serial_left > _EPS:
                p.serial_left = max(0.0, p.serial_left - work)
            else:
                p.parallel_left = max(0.0, p.parallel_left - work)
        for g in self.gpus.values():
            for w, held in enumerate(g.workers):
                if held is not None:
                    g.worker_busy_s[w] += dt
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
        if self.srs_load_left > 0:
            self.srs_load_left = max(0.0, self.srs_load_left - SRS_LOAD_BYTES_PER_S * dt)
        if self.pce_load_left > 0:
            self.pce_load_left = max(0.0, self.pce_load_left - PCE_LOAD_BYTES_PER_S * dt)
        self.t += dt

    def advance_to(self, target: float) -> None:
        """Run the pipeline until simulated time ``target``."""
        while self.t < target - _EPS:
            dt = self._rates()
            if not math.isfinite(dt):
                self._advance(target - self.t)
                break
            step = min(dt, target - self.t)
            self._advance(step)
            self._process_events()
            self._dispatch()
        self.t = max(self.t, target)

    def run_until_idle(self, limit_s: float = 1e7) -> None:
        """Run until nothing is queued or in flight (tests, batch planning)."""
        end = self.t + limit_s
        while self.busy() and self.t < end:
            dt = self._rates()
            if not math.isfinite(dt):
                break
            self._advance(dt)
            self._process_events()
            self._dispatch()

    def _can_start_synthesis(self) -> bool:
        if self.pce_present and not self.pce_loaded:
            return False
        if self.config.max_concurrent and len(self.synthesizing) >= self.config.max_concurrent:
            return False
        limit = self.max_concurrent
        # One partition always fits, however small the budget (it would swap).
        return self.memory_in_flight < limit

    def _dispatch(self) -> None:
        while self.pending and self._can_start_synthesis():
            p = self.pending.popleft()
            if p.proof.status == "failed":
                continue
            p.state = "synthesizing"
            p.synth_started = self.t
            p.holds_memory = True
            self.memory_in_flight += 1
            self.synthesizing.append(p)
            if p.proof.started_at is None:
                p.proof.started_at = self.t
                p.proof.status = "running"
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

    def _process_events(self) -> None:
        if self.pce_present and not self.pce_loaded and self.pce_load_left <= _EPS:
            self.pce_load_left = 0.0
            self.pce_loaded = True
        if not self.srs_loaded and self.srs_load_left >= 0 and self.srs_load_left <= _EPS:
            self.srs_load_left = 0.0
            self.srs_loaded = True
            started = self.srs_load_started if self.srs_load_started is not None else self.t
            self.srs_load_s = self.t - started
            waiters, self.srs_waiters = self.srs_waiters, []
            for cb in waiters:
                cb(self.srs_load_s)
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
                if self.pce_present:
                    self.pce_last_used = self.t
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
                c.gpu_ended = self.t
                started = c.compute_started if c.compute_started is not None else self.t
                c.proof.gpu_compute_s += self.t - started
                self._partition_finished(c)

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
        if proof is self.pce_extracting and ok and not self.pce_extracted:
            self.pce_extracted = True
            if self.on_pce_extracted is not None:
                self.on_pce_extracted()
        if proof is self.pce_extracting and not ok:
            self.pce_extracting = None  # the next proof records it instead
            nxt = next((q for q in self.proofs.values() if q.status in ("queued", "running")), None)
            self.pce_extracting = nxt
        if proof.on_done is not None:
            proof.on_done(proof)


class BatchDriver:
    """``cuzk-bench batch``: ``count`` proofs, at most ``concurrency`` in flight.

    It submits the next proof at the simulated instant a slot frees, as the
    real bench's semaphore does (the real one adds a connect per request,
    milliseconds that the model ignores).
    """

    def __init__(
        self,
        sim: Simulation,
        count: int,
        concurrency: int,
        on_proof: Callable[[int, ProofSim], None] | None = None,
        on_done: Callable[[BatchDriver], None] | None = None,
        kind: str = "porep",
    ) -> None:
        self.sim = sim
        self.count = max(0, count)
        self.concurrency = max(1, concurrency)
        self.kind = kind
        self.on_proof = on_proof
        self.on_done_cb = on_done
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
        proof = self.sim.submit(self.kind, on_done=self._proof_done)
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
    """The simulation's own ground truth of what limits a run (DESIGN section 6 rules)."""
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
    pce_present: bool = True,
    srs_loaded: bool = True,
) -> BatchResult:
    """Simulate ``cuzk-bench batch -n count -j concurrency`` on a warmed-up daemon."""
    sim = Simulation(profile, config, seed=seed, pce_present=pce_present, srs_loaded=srs_loaded)
    # A warmed-up daemon has loaded its PCE before the benchmark starts.
    sim.advance_to(PCE_BYTES / PCE_LOAD_BYTES_PER_S if pce_present else 0.0)
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
