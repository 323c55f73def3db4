"""A fake ``pynvml`` fed by the simulation (VM_SIM_PROFILE + VM_SIM_STATE_FILE).

`FakeNvml` is a module-like object with the same function, constant and
exception names as the pynvml subset `vast_manager.agent.gpu` uses, so `vast_manager.agent.gpu.Nvml`
takes it in place of the real module. Static facts (name, memory, PCIe slot)
come from the hardware profile; live values come from the state file the
simulated cuzk daemon writes (docs/architecture.md), falling back to idle
values when the file is missing or stale. Reads carry sampling noise (a PCIe
throughput reading, a 20 ms window's, is the noisiest, yet never above what
the link carries) and realistic call latencies (that read blocks for its
window). Tests switch any function to raise NotSupported or
FunctionNotFound, remove it, or hang one GPU. `SimStateReader` is shared with
`vast_manager.sim.fake_host`.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from vast_manager.sim.hardware import (
    ENV_STATE_FILE,
    Profile,
    load_profile,
    pcie_link_gbps,
)

STALE_AFTER_S = 2.0  # docs/architecture.md: older than this means no daemon
REREAD_EVERY_S = 0.1  # the daemon writes every <= 0.2 s; stat more often is waste

# --- constants (values as in nvml.h / pynvml) --------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13

NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2

THROTTLE_IDLE = 0x1

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
}


class NVMLError(Exception):
    """Same shape as pynvml's: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(_ERROR_STRINGS.get(value, f"Unknown Error {value}"))


class NVMLError_NotSupported(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self, value: int = NVML_ERROR_FUNCTION_NOT_FOUND) -> None:
        super().__init__(value)


class NVMLError_NotFound(NVMLError):
    def __init__(self, value: int = NVML_ERROR_NOT_FOUND) -> None:
        super().__init__(value)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self, value: int = NVML_ERROR_LIBRARY_NOT_FOUND) -> None:
        super().__init__(value)


# Seconds each call blocks at latency_scale=1. NVML measures PCIe throughput
# over a 20 ms window, so that read blocks for it; most others are ~1 ms.
LATENCY_S: dict[str, float] = {
    "nvmlInit": 0.05,
    "nvmlDeviceGetPcieThroughput": 0.020,
}
DEFAULT_LATENCY_S = 0.001

# The driver keeps utilisation samples every ~1/6 s in a ring of about 10 s.
_SAMPLE_PERIOD_US = 166_667
_SAMPLE_RING = 60


# --- the simulation state file -----------------------------------------------


@dataclass(slots=True)
class SimState:
    """The state file's content, or idle values; ``live`` says which."""

    live: bool
    gpus: dict[int, dict[str, Any]]
    cpu: dict[str, Any]
    ram: dict[str, Any]


def idle_gpu(profile: Profile, index: int) -> dict[str, Any]:
    """What an idle GPU of this profile reads: the link trained down, idle clocks."""
    return {
        "index": index,
        "util_pct": 0.0,
        "mem_used_bytes": 400 * 1024 * 1024,
        "pcie_tx_kbps": 200.0,
        "pcie_rx_kbps": 300.0,
        "power_w": profile.gpu.idle_w,
        "temp_c": 34.0,
        "sm_clock_mhz": 210.0,
        "throttle_reasons": THROTTLE_IDLE,
        "pcie_gen_current": 1,
        "pcie_width_current": profile.pcie_width,
    }


def idle_cpu(profile: Profile) -> dict[str, Any]:
    return {"util_pct": 1.5, "per_core_util_pct": None, "load1": 0.2, "iowait_pct": 0.1}


def idle_ram(profile: Profile) -> dict[str, Any]:
    return {
        "used_bytes": int(profile.ram_total_bytes * 0.03),
        "total_bytes": profile.ram_total_bytes,
    }


class SimStateReader:
    """Reads VM_SIM_STATE_FILE, re-parsing only when it changed.

    The merged per-GPU dicts are built once per file version, because every
    fake NVML call asks for them (about ten calls per GPU per second).
    """

    def __init__(
        self,
        profile: Profile,
        path: str | None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = profile
        self.path = path
        self._wall = wall_clock
        self._mono = monotonic
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._mtime_ns: int | None = None
        self._idle = SimState(False, {}, idle_cpu(profile), idle_ram(profile))
        self._idle_gpus: dict[int, dict[str, Any]] = {}
        self._live: SimState | None = None
        self._live_ts = float("-inf")

    def _refresh(self) -> None:
        now = self._mono()
        if now - self._checked_at < REREAD_EVERY_S:
            return
        with self._lock:
            if now - self._checked_at < REREAD_EVERY_S:
                return
            self._checked_at = now
            if not self.path:
                return
            try:
                mtime_ns = os.stat(self.path).st_mtime_ns
            except OSError:
                self._live, self._mtime_ns = None, None
                return
            if mtime_ns == self._mtime_ns:
                return
            try:
                with open(self.path, "rb") as f:
                    raw = orjson.loads(f.read())
            except (OSError, orjson.JSONDecodeError):
                return  # the daemon renames atomically; keep the last good version
            self._mtime_ns = mtime_ns
            self._live, self._live_ts = self._parse(raw)

    def _parse(self, raw: Any) -> tuple[SimState | None, float]:
        if not isinstance(raw, dict) or not isinstance(raw.get("ts"), int | float):
            return None, float("-inf")
        gpus: dict[int, dict[str, Any]] = {}
        for entry in raw.get("gpus") or []:
            if isinstance(entry, dict) and isinstance(entry.get("index"), int):
                idle = self._idle_gpu(entry["index"])
                gpus[entry["index"]] = {
                    k: entry[k] if entry.get(k) is not None else v for k, v in idle.items()
                }
        cpu = raw["cpu"] if isinstance(raw.get("cpu"), dict) else self._idle.cpu
        ram = raw["ram"] if isinstance(raw.get("ram"), dict) else self._idle.ram
        return SimState(True, gpus, cpu, ram), float(raw["ts"])

    def _idle_gpu(self, index: int) -> dict[str, Any]:
        idle = self._idle_gpus.get(index)
        if idle is None:
            idle = self._idle_gpus[index] = idle_gpu(self.profile, index)
        return idle

    def state(self) -> SimState:
        """The live state, or idle values when no daemon wrote lately."""
        self._refresh()
        live = self._live
        if live is None or self._wall() - self._live_ts > STALE_AFTER_S:
            return self._idle
        return live

    def gpu(self, index: int) -> dict[str, Any]:
        """Values of one GPU (every key present; idle for a GPU the file omits)."""
        return self.state().gpus.get(index) or self._idle_gpu(index)


# --- pynvml-shaped return values ----------------------------------------------


@dataclass(slots=True)
class FakeHandle:
    index: int


@dataclass(slots=True)
class Utilization:
    gpu: int
    memory: int


@dataclass(slots=True)
class Memory:
    total: int
    free: int
    used: int


@dataclass(slots=True)
class SampleValue:
    uiVal: int


@dataclass(slots=True)
class Sample:
    timeStamp: int
    sampleValue: SampleValue


def _marketing_name(gpu_name: str) -> str:
    # NVML names GeForce cards "NVIDIA GeForce RTX 4090", workstation ones "NVIDIA RTX A6000".
    if gpu_name.startswith("RTX ") and not gpu_name.startswith("RTX A"):
        return f"NVIDIA GeForce {gpu_name}"
    return f"NVIDIA {gpu_name}"


class FakeNvml:
    """Module-like stand-in for ``pynvml`` (see the module docstring)."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound

    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_GPU_UTILIZATION_SAMPLES = NVML_GPU_UTILIZATION_SAMPLES
    NVML_VALUE_TYPE_UNSIGNED_INT = NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_CLOCK_MEM = NVML_CLOCK_MEM

    DRIVER_VERSION = "580.95.05"
    CUDA_DRIVER_VERSION = 13000

    def __init__(
        self,
        profile: Profile | None = None,
        state_file: str | None = None,
        *,
        environ: dict[str, str] | None = None,
        latency_scale: float = 1.0,
        noise: bool = True,
        seed: int | None = None,
        num_gpus: int | None = None,
        init_error: int | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.profile = profile if profile is not None else load_profile(dict(env))
        path = state_file if state_file is not None else env.get(ENV_STATE_FILE)
        self.reader = SimStateReader(self.profile, path, wall_clock, monotonic)
        self.latency_scale = latency_scale
        self.noise = noise
        self._rng = random.Random(seed if seed is not None else self.profile.sim.seed)
        self._num_gpus = self.profile.num_gpus if num_gpus is None else num_gpus
        self._init_error = init_error
        self._wall = wall_clock
        self._handles = [FakeHandle(i) for i in range(self._num_gpus)]
        self._failures: dict[str, Callable[[], NVMLError]] = {}
        self._hung: dict[int, threading.Event] = {}
        self.initialised = False
        self.calls: dict[str, int] = {}
        machine = self.profile.machine_id or 0
        self._uuids = [
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, f'vm-sim/{machine}/{i}')}"
            for i in range(self._num_gpus)
        ]

    # --- switches for tests ------------------------------------------------

    def fail(self, fn_name: str, kind: str) -> None:
        """Make ``fn_name`` raise: ``not_supported``, ``function_not_found``,
        or vanish from the module (``missing``)."""
        if kind == "missing":
            setattr(self, fn_name, None)  # getattr(module, name, None) is None: gone
        elif kind == "not_supported":
            self._failures[fn_name] = NVMLError_NotSupported
        elif kind == "function_not_found":
            self._failures[fn_name] = NVMLError_FunctionNotFound
        else:
            raise ValueError(f"unknown failure kind {kind!r}")

    def hang_device(self, index: int) -> None:
        """Every call on GPU ``index`` blocks until `release_device`."""
        self._hung[index] = threading.Event()

    def release_device(self, index: int) -> None:
        event = self._hung.pop(index, None)
        if event is not None:
            event.set()

    # --- plumbing ------------------------------------------------------------

    def _enter(self, fn_name: str, handle: FakeHandle | None = None) -> None:
        self.calls[fn_name] = self.calls.get(fn_name, 0) + 1
        if fn_name != "nvmlInit" and not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            hung = self._hung.get(handle.index)
            if hung is not None:
                hung.wait()
        delay = LATENCY_S.get(fn_name, DEFAULT_LATENCY_S) * self.latency_scale
        if delay > 0:
            time.sleep(delay)
        error = self._failures.get(fn_name)
        if error is not None:
            raise error()

    def _jitter(self, value: float, rel: float, lo: float = 0.0, hi: float | None = None) -> float:
        if self.noise and value:
            value = value * (1.0 + self._rng.gauss(0.0, rel))
        value = max(lo, value)
        return min(hi, value) if hi is not None else value

    def _window_sample(self, mean: float, rel: float, ceiling: float) -> float:
        """One short window's reading of a throughput whose mean is ``mean``: relative
        noise ``rel``, kept within [0, ``ceiling``] by a cut symmetric about the mean, so
        the readings still average to it (a link at capacity reads its capacity)."""
        if mean >= ceiling:
            return ceiling
        if not self.noise or mean <= 0:
            return max(0.0, mean)
        room = min(mean, ceiling - mean)
        return mean + max(-room, min(room, self._rng.gauss(0.0, rel * mean)))

    def _handle(self, handle: Any) -> FakeHandle:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < self._num_gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle

    # --- system --------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self._init_error is not None:
            raise NVMLError(self._init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.CUDA_DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self._num_gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self._num_gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    # --- identity and memory -------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetName", h)
        return _marketing_name(self.profile.gpu_name)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetUUID", h)
        return self._uuids[h.index]

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Memory:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetMemoryInfo", h)
        total = self.profile.gpu_ram_mb * 1024 * 1024
        used = min(total, int(self.reader.gpu(h.index)["mem_used_bytes"]))
        return Memory(total=total, free=total - used, used=used)

    # --- utilisation ---------------------------------------------------------

    def _util(self, index: int) -> float:
        return self._jitter(float(self.reader.gpu(index)["util_pct"]), 0.03, 0.0, 100.0)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Utilization:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetUtilizationRates", h)
        util = self._util(h.index)
        return Utilization(gpu=round(util), memory=round(util * 0.4))

    def nvmlDeviceGetSamples(
        self, handle: Any, sampling_type: int, last_seen_ts: int
    ) -> tuple[int, list[Sample]]:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetSamples", h)
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError_NotSupported()
        newest = int(self._wall() * 1_000_000) // _SAMPLE_PERIOD_US
        oldest = max(int(last_seen_ts) // _SAMPLE_PERIOD_US + 1, newest - _SAMPLE_RING + 1)
        if oldest > newest:
            raise NVMLError_NotFound()  # what the driver says when nothing is new
        return NVML_VALUE_TYPE_UNSIGNED_INT, [
            Sample(k * _SAMPLE_PERIOD_US, SampleValue(round(self._util(h.index))))
            for k in range(oldest, newest + 1)
        ]

    # --- PCIe ----------------------------------------------------------------

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetPcieThroughput", h)
        live = self.reader.gpu(h.index)
        key = "pcie_tx_kbps" if counter == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbps"
        # KB/s (10^3 bytes) moved in one 20 ms window of bursty DMA: much noisier than
        # the other readings, but never more than the link carries in that window.
        link_kbps = pcie_link_gbps(int(live["pcie_gen_current"]),
                                   int(live["pcie_width_current"])) * 1e6
        return round(self._window_sample(float(live[key]), 0.15, link_kbps))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return int(self.reader.gpu(h.index)["pcie_gen_current"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return int(self.reader.gpu(h.index)["pcie_width_current"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration", h)
        return min(self.profile.pcie_gen, self.profile.gpu.pcie_gen_max)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetMaxPcieLinkWidth", h)
        return self.profile.pcie_width

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetGpuMaxPcieLinkGeneration", h)
        return self.profile.gpu.pcie_gen_max

    # --- power, heat, clocks -------------------------------------------------

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetPowerUsage", h)
        watts = self._jitter(float(self.reader.gpu(h.index)["power_w"]), 0.02)
        return round(watts * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetTemperature", h)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_NotSupported()
        return round(self._jitter(float(self.reader.gpu(h.index)["temp_c"]), 0.005))

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetClockInfo", h)
        sm = float(self.reader.gpu(h.index)["sm_clock_mhz"])
        if clock_type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
            return round(self._jitter(sm, 0.005))
        if clock_type == NVML_CLOCK_MEM:
            return 10501 if sm > 500 else 405
        raise NVMLError_NotSupported()

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(self.reader.gpu(h.index)["throttle_reasons"])

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        h = self._handle(handle)
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return int(self.reader.gpu(h.index)["throttle_reasons"])


# Every pynvml function name FakeNvml implements (tests iterate over these).
FUNCTIONS: tuple[str, ...] = tuple(
    name for name in vars(FakeNvml) if name.startswith("nvml") and callable(vars(FakeNvml)[name])
)
