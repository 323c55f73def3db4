"""Background telemetry sampler: GPUs, host and cuzk /status -> `protocol.Telemetry`.

The host and the GPUs are read by a few daemon threads (up to eight GPUs in
turn per thread) at 1 Hz: NVML calls block, a PCIe read for 20 ms, so they
never run on the event loop. Readings go into the open windows under a lock
held only for the arithmetic, so `roll_window` never waits on hardware. A
supervisor on the loop notices a GPU read that has hung and moves that GPU
to a thread of its own; the others carry on, the hung GPU's fields come out
null until it answers again. Windows keep
running aggregates (sums, maxima, counts, OR of throttle bits), never lists
of samples, so memory is flat however long the agent runs. The cuzk daemon's
``GET /status`` is polled by an asyncio task (plain HTTP, non-blocking).

Aggregation (docs/protocol.md, agent endpoints): means for utilisation, PCIe, power, SM clock, CPU;
maxima for ``util_pct_max`` and ``temp_c_max``; ``mem_used_bytes`` and RAM
``used_bytes`` are the window's MAXIMUM (the peak is what runs a proof out
of memory); throttle bits OR-ed; the PCIe link under load = the highest
generation and width seen in the window (the link trains down at idle);
``load1`` and ``quota_cores`` are the last reading; network rates are the
counter difference over the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vast_manager.agent.gpu import Device, GpuSnapshot, Nvml, inventory, open_devices
from vast_manager.agent.host import HostProbe, HostSample, HostSource
from vast_manager.protocol.messages import (
    CpuTelemetry,
    CuzkTelemetry,
    CuzkWorker,
    GpuTelemetry,
    HostInfo,
    NetTelemetry,
    RamTelemetry,
    Telemetry,
)

log = logging.getLogger(__name__)

MODES = ("auto", "real", "sim", "off")
#: Why the agent alone cannot run ``VM_NVML=sim``: the simulated machine is plugged in
#: by the simulator's own entry point, which runs this agent.
SIM_ONLY = ("VM_NVML=sim runs the agent on the simulated machine: start it as "
            "`vm-sim-agent run` (python -m vast_manager.sim.agent_run run)")
MAX_OPEN_WINDOWS = 16  # a caller that forgets close_window cannot grow memory
MAX_CUZK_WORKERS = 256  # CuzkTelemetry.workers max_len
STOP_JOIN_S = 2.0
# GPUs read in turn by one thread: every thread costs a wake-up per tick,
# which on small VMs costs more CPU than the reads; 8 x ~50 ms of blocking
# reads (two 20 ms PCIe windows each) still fits inside a 1 s tick.
GPUS_PER_THREAD = 8  # a hung NVML call is left behind (daemon thread) after this


class NvmlUnavailable(RuntimeError):
    """``VM_NVML=real`` was asked for but NVML gave no GPU; the message says why."""


# --- sources ------------------------------------------------------------------


@dataclass(slots=True)
class Sources:
    """What the sampler reads: the host probe, and NVML devices (maybe none)."""

    mode: str
    host: HostSource
    nvml: Nvml | None = None
    devices: list[Device] = field(default_factory=list)
    gpu_reason: str | None = None  # why there are no GPUs, when there are none

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.shutdown()


def open_sources(
    mode: str,
    params_dir: str,
    *,
    nvml_module: Any | None = None,
) -> Sources:
    """Open the telemetry sources for ``VM_NVML`` = ``mode``.

    ``auto``: real NVML if it loads, else no GPUs (logged once); ``real``:
    real NVML or `NvmlUnavailable`; ``off``: no GPUs, real host. ``sim`` is the
    simulator's (``vast_manager.sim.agent_run.sim_sources``, plugged in by
    ``vm-sim-agent``): the agent never imports the simulation.
    Blocking (nvmlInit): call it before the loop runs or in a thread.
    ``nvml_module`` replaces ``pynvml`` (tests).
    """
    if mode not in MODES:
        raise ValueError(f"VM_NVML must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "sim":
        raise ValueError(SIM_ONLY)
    host = HostProbe(params_dir)
    if mode == "off":
        reason = "VM_NVML=off"
        log.info("GPU telemetry off: %s; reporting no GPUs", reason)
        return Sources(mode, host, None, [], reason)
    nvml = Nvml(nvml_module)
    devices = open_devices(nvml)
    if not devices and mode == "real":
        raise NvmlUnavailable(f"VM_NVML=real but {nvml.unavailable_reason or 'no GPU found'}")
    return Sources(mode, host, nvml, devices, None if devices else nvml.unavailable_reason)


def describe_host(sources: Sources) -> HostInfo:
    """The hello's ``host``: machine facts, driver and CUDA versions, GPUs."""
    facts = sources.host.facts()
    nvml = sources.nvml if sources.devices else None
    return HostInfo(
        hostname=facts.hostname,
        cpu_model=facts.cpu_model,
        cpu_cores_logical=facts.cpu_cores_logical,
        cpu_cores_physical=facts.cpu_cores_physical,
        ram_total_bytes=facts.ram_total_bytes,
        driver_version=nvml.driver_version() if nvml else None,
        cuda_version=nvml.cuda_version() if nvml else None,
        gpus=inventory(sources.devices)[:64],
    )


# --- running aggregates ---------------------------------------------------------


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


class _GpuAgg:
    """Running aggregate of one GPU in one window: O(1) memory."""

    __slots__ = (
        "clock_n", "clock_sum", "gen", "mem_max", "power_n", "power_sum", "rx_n",
        "rx_sum", "temp_max", "throttle", "tx_n", "tx_sum", "util_max", "util_n",
        "util_sum", "width",
    )

    def __init__(self) -> None:
        self.util_sum = self.tx_sum = self.rx_sum = self.power_sum = self.clock_sum = 0.0
        self.util_n = self.tx_n = self.rx_n = self.power_n = self.clock_n = 0
        self.util_max: float | None = None
        self.temp_max: float | None = None
        self.mem_max: int | None = None
        self.throttle: int | None = None
        self.gen: int | None = None
        self.width: int | None = None

    def add(self, s: GpuSnapshot) -> None:
        if s.util_pct is not None:
            self.util_sum += s.util_pct
            self.util_n += 1
            if self.util_max is None or s.util_pct > self.util_max:
                self.util_max = s.util_pct
        if s.memory_used_bytes is not None and (
            self.mem_max is None or s.memory_used_bytes > self.mem_max
        ):
            self.mem_max = s.memory_used_bytes
        if s.pcie_tx_kbps is not None:
            self.tx_sum += s.pcie_tx_kbps
            self.tx_n += 1
        if s.pcie_rx_kbps is not None:
            self.rx_sum += s.pcie_rx_kbps
            self.rx_n += 1
        if s.power_w is not None:
            self.power_sum += s.power_w
            self.power_n += 1
        if s.temp_c is not None and (self.temp_max is None or s.temp_c > self.temp_max):
            self.temp_max = s.temp_c
        if s.sm_clock_mhz is not None:
            self.clock_sum += s.sm_clock_mhz
            self.clock_n += 1
        if s.throttle_reasons is not None:
            self.throttle = (self.throttle or 0) | s.throttle_reasons
        if s.pcie_gen_current is not None and (self.gen is None or s.pcie_gen_current > self.gen):
            self.gen = s.pcie_gen_current
        if s.pcie_width_current is not None and (
            self.width is None or s.pcie_width_current > self.width
        ):
            self.width = s.pcie_width_current

    def result(self, index: int) -> GpuTelemetry:
        return GpuTelemetry(
            index=index,
            util_pct_mean=_r(self.util_sum / self.util_n, 1) if self.util_n else None,
            util_pct_max=_r(self.util_max, 1),
            mem_used_bytes=self.mem_max,
            pcie_tx_kbps_mean=_r(self.tx_sum / self.tx_n, 0) if self.tx_n else None,
            pcie_rx_kbps_mean=_r(self.rx_sum / self.rx_n, 0) if self.rx_n else None,
            power_w_mean=_r(self.power_sum / self.power_n, 1) if self.power_n else None,
            temp_c_max=_r(self.temp_max, 1),
            sm_clock_mhz_mean=_r(self.clock_sum / self.clock_n, 0) if self.clock_n else None,
            throttle_reasons=self.throttle,
            pcie_gen_current=self.gen,
            pcie_width_current=self.width,
        )


class _CuzkAgg:
    """Running aggregate of the daemon's /status polls in one window.

    What /status fields mean (cuzk-core/src/status.rs, docs/cuzk.md):
    ``gpu_workers[].busy_secs`` is the length of the worker's *current* busy
    stretch (null when idle), not a running total, so a GPU's busy share is
    the share of polls in which one of its workers was ``proving``;
    ``synthesis.max_concurrent`` is the memory budget over the smallest
    partition of any proof kind, not a cap (the cap is the agent's
    ``synthesis_slots``); ``memory`` is the budget's accounting.
    """

    __slots__ = (
        "mem_max", "mem_total", "n", "ordinal_polls", "ordinal_proving", "queue_n",
        "queue_sum", "slots", "synth_max", "synth_n", "synth_sum",
    )

    def __init__(self, synthesis_slots: int | None = None) -> None:
        self.n = 0
        self.synth_sum = self.queue_sum = 0.0
        self.synth_n = self.queue_n = 0
        self.synth_max: int | None = None
        self.slots = synthesis_slots
        self.mem_max: int | None = None
        self.mem_total: int | None = None
        self.ordinal_polls: dict[int, int] = {}
        self.ordinal_proving: dict[int, int] = {}

    def add(self, status: dict[str, Any]) -> None:
        self.n += 1
        synth = status.get("synthesis")
        if isinstance(synth, dict):
            active, max_c = synth.get("active"), synth.get("max_concurrent")
            if isinstance(active, int | float) and not isinstance(active, bool):
                self.synth_sum += float(active)
                self.synth_n += 1
            if isinstance(max_c, int) and not isinstance(max_c, bool):
                self.synth_max = max_c
        counters = status.get("counters")
        queue = counters.get("queue_depth") if isinstance(counters, dict) else None
        if isinstance(queue, int | float) and not isinstance(queue, bool):
            self.queue_sum += float(queue)
            self.queue_n += 1
        mem = status.get("memory")
        if isinstance(mem, dict):
            used, total = mem.get("used_bytes"), mem.get("total_bytes")
            if isinstance(used, int) and (self.mem_max is None or used > self.mem_max):
                self.mem_max = used
            if isinstance(total, int):
                self.mem_total = total
        workers = status.get("gpu_workers")
        if not isinstance(workers, list):
            return
        proving: set[int] = set()
        seen: set[int] = set()
        for w in workers[:MAX_CUZK_WORKERS]:
            if not isinstance(w, dict) or not isinstance(w.get("gpu_ordinal"), int):
                continue
            ordinal = w["gpu_ordinal"]
            seen.add(ordinal)
            if w.get("state") == "proving":
                proving.add(ordinal)
        for ordinal in seen:
            if len(self.ordinal_polls) < MAX_CUZK_WORKERS or ordinal in self.ordinal_polls:
                self.ordinal_polls[ordinal] = self.ordinal_polls.get(ordinal, 0) + 1
                if ordinal in proving:
                    self.ordinal_proving[ordinal] = self.ordinal_proving.get(ordinal, 0) + 1

    def busy_pct(self, ordinal: int) -> float | None:
        polls = self.ordinal_polls.get(ordinal, 0)
        return 100.0 * self.ordinal_proving.get(ordinal, 0) / polls if polls else None

    def result(self) -> CuzkTelemetry:
        ordinals = sorted(self.ordinal_polls)
        return CuzkTelemetry(
            samples=self.n,
            workers=[CuzkWorker(o, _r(self.busy_pct(o), 1)) for o in ordinals][
                :MAX_CUZK_WORKERS
            ],
            synthesis_active_mean=_r(self.synth_sum / self.synth_n) if self.synth_n else None,
            synthesis_max=self.synth_max,
            queue_depth_mean=_r(self.queue_sum / self.queue_n) if self.queue_n else None,
            memory_used_bytes_max=self.mem_max,
            memory_total_bytes=self.mem_total,
            synthesis_slots=self.slots,
        )


class _Window:
    """Everything one window accumulates; replaced whole on roll."""

    __slots__ = (
        "cpu_n", "cpu_sum", "cuzk", "gpus", "host_n", "io_n", "io_sum", "load1",
        "net_first", "net_last", "opened_at", "per_core", "per_core_n", "quota",
        "ram_max", "ram_total",
    )

    def __init__(
        self,
        opened_at: float,
        gpu_indices: list[int],
        net_first: tuple[float, int, int] | None = None,
        cuzk: _CuzkAgg | None = None,
    ) -> None:
        self.opened_at = opened_at
        self.gpus = {i: _GpuAgg() for i in gpu_indices}
        self.host_n = 0
        self.cpu_sum = self.io_sum = 0.0
        self.cpu_n = self.io_n = 0
        self.per_core: list[float] = []
        self.per_core_n = 0
        self.load1: float | None = None
        self.quota: float | None = None
        self.ram_max: int | None = None
        self.ram_total: int | None = None
        self.net_first = net_first
        self.net_last: tuple[float, int, int] | None = None
        self.cuzk = cuzk

    def add_host(self, s: HostSample) -> None:
        self.host_n += 1
        if s.cpu_util_pct is not None:
            self.cpu_sum += s.cpu_util_pct
            self.cpu_n += 1
        if s.per_core_util_pct:
            if len(s.per_core_util_pct) != len(self.per_core):
                # CPUs came or went: the mean restarts at the new shape.
                self.per_core = [0.0] * len(s.per_core_util_pct)
                self.per_core_n = 0
            pc = self.per_core
            for i, v in enumerate(s.per_core_util_pct):
                pc[i] += v
            self.per_core_n += 1
        if s.iowait_pct is not None:
            self.io_sum += s.iowait_pct
            self.io_n += 1
        if s.load1 is not None:
            self.load1 = s.load1
        self.quota = s.quota_cores
        used = s.ram_used_bytes
        if used is not None and (self.ram_max is None or used > self.ram_max):
            self.ram_max = used
        if s.ram_total_bytes is not None:
            self.ram_total = s.ram_total_bytes
        if s.net_rx_bytes is not None and s.net_tx_bytes is not None:
            self.net_last = (s.t, s.net_rx_bytes, s.net_tx_bytes)
            if self.net_first is None:
                self.net_first = self.net_last

    def add_cuzk(self, status: dict[str, Any], synthesis_slots: int | None) -> None:
        if self.cuzk is None:
            self.cuzk = _CuzkAgg(synthesis_slots)
        self.cuzk.add(status)

    def net_rates(self) -> tuple[float | None, float | None]:
        first, last = self.net_first, self.net_last
        if first is None or last is None or last[0] <= first[0]:
            return None, None
        dt = last[0] - first[0]
        # A counter that went backwards (interface reset) gives no rate.
        rx = (last[1] - first[1]) / dt if last[1] >= first[1] else None
        tx = (last[2] - first[2]) / dt if last[2] >= first[2] else None
        return _r(rx, 1), _r(tx, 1)

    def telemetry(self, now: float) -> Telemetry:
        rx, tx = self.net_rates()
        n_pc = self.per_core_n
        gpu_counts = [g.util_n for g in self.gpus.values()]
        return Telemetry(
            window_s=round(max(0.0, now - self.opened_at), 3),
            samples=max([self.host_n, *gpu_counts]),
            gpus=[agg.result(i) for i, agg in sorted(self.gpus.items())],
            cpu=CpuTelemetry(
                util_pct_mean=_r(self.cpu_sum / self.cpu_n, 1) if self.cpu_n else None,
                per_core_util_pct_mean=[round(v / n_pc, 1) for v in self.per_core] if n_pc else [],
                load1=_r(self.load1),
                iowait_pct_mean=_r(self.io_sum / self.io_n) if self.io_n else None,
                quota_cores=_r(self.quota),
            ),
            ram=RamTelemetry(used_bytes=self.ram_max, total_bytes=self.ram_total),
            net=NetTelemetry(rx_bytes_per_s=rx, tx_bytes_per_s=tx),
            cuzk=self.cuzk.result() if self.cuzk is not None and self.cuzk.n else None,
        )


# --- the sampler --------------------------------------------------------------------


class Sampler:
    """Samples `Sources` every ``interval_s`` into any number of open windows.

    ``clock`` times the windows (``window_s``); ``max_samples`` stops each
    sampling thread after that many readings (tests, the overhead benchmark).
    """

    def __init__(
        self,
        sources: Sources,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_samples: int | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.sources = sources
        self.interval_s = interval_s
        self.clock = clock
        self.max_samples = max_samples
        self._gpu_indices = sorted(d.index for d in sources.devices)
        self._lock = threading.Lock()
        self._windows: dict[int, _Window] = {}
        self._next_wid = 1
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers: list[_Worker] = []
        # A read this late is hung: normal ones take ~50 ms (two 20 ms PCIe windows).
        self.hang_timeout_s = max(2.0, 2.0 * interval_s)
        self._cuzk_url: str | None = None
        self._synthesis_slots: int | None = None
        self._cuzk_task: asyncio.Task[None] | None = None
        self._failed_logged: set[str] = set()
        self.host_ticks = 0  # readings taken by the host thread since start
        self.stop_join_s = STOP_JOIN_S

    # --- windows -------------------------------------------------------------

    def open_window(self) -> int:
        """Start aggregating from now; returns the window id."""
        with self._lock:
            wid = self._next_wid
            self._next_wid += 1
            if len(self._windows) >= MAX_OPEN_WINDOWS:
                oldest = min(self._windows)
                del self._windows[oldest]
                log.warning("telemetry window %d dropped: more than %d open", oldest,
                            MAX_OPEN_WINDOWS)
            self._windows[wid] = _Window(self.clock(), self._gpu_indices, cuzk=self._new_cuzk())
            return wid

    def roll_window(self, wid: int) -> Telemetry | None:
        """The window's telemetry since it opened or last rolled; it restarts now.

        None for an unknown window or one with no reading yet.
        """
        with self._lock:
            w = self._windows.get(wid)
            if w is None:
                return None
            now = self.clock()
            # The next window starts where this one ended: no gap in the rates.
            self._windows[wid] = _Window(
                now, self._gpu_indices, w.net_last or w.net_first, self._new_cuzk()
            )
        return self._result(w, now)

    def close_window(self, wid: int) -> Telemetry | None:
        """The window's telemetry; the window is forgotten."""
        with self._lock:
            w = self._windows.pop(wid, None)
            now = self.clock()
        return self._result(w, now) if w is not None else None

    @staticmethod
    def _result(w: _Window, now: float) -> Telemetry | None:
        if (
            w.host_n == 0
            and not any(g.util_n for g in w.gpus.values())
            and (w.cuzk is None or w.cuzk.n == 0)
        ):
            return None
        return w.telemetry(now)

    # --- readings in ---------------------------------------------------------

    def ingest_gpu(self, snap: GpuSnapshot) -> None:
        with self._lock:
            for w in self._windows.values():
                agg = w.gpus.get(snap.index)
                if agg is not None:
                    agg.add(snap)

    def ingest_host(self, sample: HostSample) -> None:
        with self._lock:
            for w in self._windows.values():
                w.add_host(sample)

    def ingest_cuzk(self, status: dict[str, Any]) -> None:
        """One parsed ``GET /status`` body (untrusted shape: bad parts are skipped)."""
        with self._lock:
            for w in self._windows.values():
                w.add_cuzk(status, self._synthesis_slots)

    def sample_once(self) -> None:
        """Read every source once, in the calling thread (tests, benchmarks)."""
        for dev in self.sources.devices:
            self.ingest_gpu(dev.snapshot())
        self.ingest_host(self.sources.host.sample())
        self.host_ticks += 1

    # --- threads ---------------------------------------------------------------

    def _log_failure_once(self, name: str, exc: BaseException) -> None:
        if name not in self._failed_logged:
            self._failed_logged.add(name)
            log.warning("telemetry: reading %s failed: %r (logged once)", name, exc)

    def _spawn(self, host: bool, devices: list[Device], t0: float) -> None:
        worker = _Worker(self, host, devices, t0, self._stop)
        self._workers.append(worker)
        self._threads.append(worker.thread)
        worker.thread.start()

    async def start(self) -> None:
        """Start the sampling threads and the supervisor (hung GPUs, cuzk /status)."""
        if self._threads:
            return
        self._stop = threading.Event()
        t0 = time.monotonic()
        devices = list(self.sources.devices)
        groups = [devices[i:i + GPUS_PER_THREAD] for i in range(0, len(devices), GPUS_PER_THREAD)]
        groups = groups or [[]]
        for i, group in enumerate(groups):
            # Staggered across the interval so the threads do not queue on the GIL.
            self._spawn(i == 0, group, t0 + self.interval_s * i / len(groups))
        self._cuzk_task = asyncio.get_running_loop().create_task(self._supervise())

    async def stop(self) -> None:
        """Stop sampling; threads stuck in a hung NVML call are abandoned."""
        self._stop.set()
        if self._cuzk_task is not None:
            self._cuzk_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cuzk_task
            self._cuzk_task = None
        threads, self._threads, self._workers = self._threads, [], []
        await asyncio.to_thread(_join_all, threads, self.stop_join_s)

    @property
    def running(self) -> bool:
        return any(w.thread.is_alive() and not w.abandoned for w in self._workers)

    def check_hung(self, now: float | None = None) -> None:
        """Move a GPU whose NVML read has hung to a thread of its own.

        The other GPUs (and the host) of its thread carry on in a new
        thread; the stuck one is left to finish or not. Called by the
        supervisor every interval.
        """
        now = time.monotonic() if now is None else now
        for w in list(self._workers):
            since, dev = w.busy_since, w.current
            if since is None or dev is None or now - since < self.hang_timeout_s:
                continue
            if not w.host and len(w.devices) == 1:
                continue  # already alone: nothing else waits on it
            w.abandoned = True
            self._workers.remove(w)
            log.warning(
                "GPU %d: an NVML read has hung for %.1f s; sampling it apart "
                "(its fields are null until it answers)", dev.index, now - since,
            )
            rest = [d for d in w.devices if d is not dev]
            if w.host or rest:
                self._spawn(w.host, rest, now)
            self._spawn(False, [dev], now)

    async def _supervise(self) -> None:
        # One loop for both chores: a wake-up per interval is what they cost.
        await self._poll_cuzk()

    # --- cuzk /status ------------------------------------------------------------

    def _new_cuzk(self) -> _CuzkAgg | None:
        return _CuzkAgg(self._synthesis_slots) if self._cuzk_url else None

    def set_cuzk_status_url(self, url: str | None, synthesis_slots: int | None = None) -> None:
        """Poll ``url`` (the daemon's ``GET /status``) each interval; None stops.

        ``synthesis_slots``: the daemon's synthesis workers, reported beside the
        mean of /status ``synthesis.active`` (docs/cuzk.md).
        """
        self._cuzk_url = url
        self._synthesis_slots = synthesis_slots if url is not None else None
        if url is None:
            return
        with self._lock:
            for w in self._windows.values():
                if w.cuzk is None:
                    w.cuzk = _CuzkAgg(synthesis_slots)
                else:
                    w.cuzk.slots = synthesis_slots

    async def _poll_cuzk(self) -> None:
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s))
        logged: set[str] = set()
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                url = self._cuzk_url
                started = time.monotonic()
                self.check_hung(started)
                if url:
                    try:
                        async with session.get(url) as resp:
                            resp.raise_for_status()
                            body = await resp.json(content_type=None)
                        if isinstance(body, dict):
                            self.ingest_cuzk(body)
                    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                        # Refused while the daemon restarts is routine: one line per kind.
                        key = type(exc).__name__
                        if key not in logged:
                            logged.add(key)
                            log.info("cuzk /status at %s: %r (logged once per kind)", url, exc)
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(0.0, self.interval_s - elapsed))


class _Worker:
    """One sampling thread: the host (maybe) and a few GPUs, read in turn each tick."""

    def __init__(
        self, sampler: Sampler, host: bool, devices: list[Device], t0: float,
        stop: threading.Event,
    ) -> None:
        self.sampler = sampler
        self.host = host
        self.devices = devices
        self.t0 = t0
        self.stop = stop
        self.busy_since: float | None = None  # when the GPU read in progress began
        self.current: Device | None = None
        self.abandoned = False  # set when check_hung replaced this thread
        names = ["host"] if host else []
        names += [f"GPU {d.index}" for d in devices]
        self.thread = threading.Thread(
            target=self.run, name=f"telemetry {', '.join(names)}",
            daemon=True,  # a hung NVML call must not block the agent's exit
        )

    def run(self) -> None:
        s = self.sampler
        interval = s.interval_s
        readings = slot = 0
        self.stop.wait(max(0.0, self.t0 - time.monotonic()))
        while not self.stop.is_set() and not self.abandoned:
            if self.host:
                try:
                    s.ingest_host(s.sources.host.sample())
                    s.host_ticks += 1
                except Exception as exc:  # a sampler thread must outlive one bad reading
                    s._log_failure_once("host", exc)
            for dev in self.devices:
                self.current, self.busy_since = dev, time.monotonic()
                try:
                    snap: GpuSnapshot | None = dev.snapshot()
                except Exception as exc:
                    s._log_failure_once(f"GPU {dev.index}", exc)
                    snap = None
                self.current = self.busy_since = None
                if self.abandoned:
                    return  # replaced while this read hung: the new threads own these GPUs
                if snap is not None:
                    s.ingest_gpu(snap)
            readings += 1
            if s.max_samples is not None and readings >= s.max_samples:
                return
            # The next slot of this thread's grid; slots missed while a call
            # hung are skipped rather than caught up in a burst.
            slot += 1
            now = time.monotonic()
            if self.t0 + slot * interval < now:
                slot = int((now - self.t0) / interval) + 1
            self.stop.wait(self.t0 + slot * interval - now)


def _join_all(threads: list[threading.Thread], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
