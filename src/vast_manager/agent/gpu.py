"""NVML access for the agent: one choke point (`Nvml.query`), a small `Device`.

Every NVML call goes through `Nvml.query`, which initialises the library
lazily, shuts it down at exit, turns any ``NVMLError`` into the caller's
default (``None``: straight into JSON null), and logs a function that the
driver lacks or does not support ONCE, then stays quiet about it. The NVML
module is injectable: the real ``pynvml`` (from nvidia-ml-py) or the
simulation's `vast_manager.sim.fake_nvml`. Units are in the method names; each
docstring names the matching ``nvidia-smi --query-gpu=`` field so values can
be cross-checked on a real machine.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vast_manager.protocol.messages import Gpu

log = logging.getLogger(__name__)

# NVML return codes (nvml.h); classification uses the code as well as the
# exception subclass so that any module shaped like pynvml works.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13

# nvmlDeviceGetSamples value types (nvmlValueType_t) -> c_nvmlValue_t member.
_SAMPLE_VALUE_FIELDS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

# On the first utilisation-samples read the driver hands back its whole
# buffer (several seconds); only the most recent second describes "now".
_FIRST_SAMPLES_SPAN_US = 1_000_000


def _load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py; imported lazily so the agent runs without it

    return pynvml


class Nvml:
    """The one NVML choke point (nvitop's ``nvml_query`` habit).

    Thread-safe: sampler threads of several GPUs call `query` at once.
    """

    def __init__(
        self,
        module: Any | None = None,
        loader: Callable[[], Any] = _load_pynvml,
        register_atexit: bool = True,
    ) -> None:
        self._module = module
        self._loader = loader
        self._register_atexit = register_atexit
        self._lock = threading.Lock()
        self._initialised = False
        self._tried = False
        self._missing: set[str] = set()  # functions the library lacks: never called again
        self._logged: set[str] = set()
        self.unavailable_reason: str | None = None

    @property
    def module(self) -> Any | None:
        return self._module

    def available(self) -> bool:
        """Initialise NVML if not yet tried; True when it is usable."""
        if self._initialised:
            return True
        with self._lock:
            if self._tried:
                return self._initialised
            self._tried = True
            if self._module is None:
                try:
                    self._module = self._loader()
                except Exception as exc:  # ImportError, or a broken install
                    self._set_unavailable(f"the NVML Python bindings did not load ({exc})")
                    return False
            try:
                self._module.nvmlInit()
            except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
                self._set_unavailable(f"nvmlInit failed: {exc}")
                return False
            self._initialised = True
            if self._register_atexit:
                atexit.register(self.shutdown)
            return True

    def _set_unavailable(self, reason: str) -> None:
        self.unavailable_reason = reason
        log.warning("GPU telemetry off: %s; reporting no GPUs", reason)

    def shutdown(self) -> None:
        """nvmlShutdown once; later queries initialise again if asked."""
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            self._tried = False
            try:
                if self._module is not None:
                    self._module.nvmlShutdown()
            except Exception as exc:  # shutting down: nothing useful to do but note it
                log.debug("nvmlShutdown failed: %s", exc)

    def _log_once(self, key: str, message: str, *args: Any, level: int = logging.INFO) -> None:
        if key in self._logged:
            return
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.log(level, message, *args)

    def query(self, fn_name: str, *args: Any, default: Any = None) -> Any:
        """Call ``module.<fn_name>(*args)``; any NVML failure gives ``default``.

        NotSupported and FunctionNotFound (or a function the module lacks)
        are logged once per function name, then returned quietly.
        """
        if fn_name in self._missing or not self.available():
            return default
        fn = getattr(self._module, fn_name, None)
        if fn is None:
            self._missing.add(fn_name)
            self._log_once(fn_name, "NVML: %s is not in this NVML module; reporting null", fn_name)
            return default
        try:
            return fn(*args)
        except Exception as exc:
            if not self._is_nvml_error(exc):
                raise
            code = getattr(exc, "value", None)
            if code == NVML_ERROR_FUNCTION_NOT_FOUND:
                self._missing.add(fn_name)
                self._log_once(
                    fn_name, "NVML: %s not found in this driver; reporting null", fn_name
                )
            elif code == NVML_ERROR_NOT_SUPPORTED:
                self._log_once(
                    fn_name, "NVML: %s is not supported here; reporting null", fn_name
                )
            elif code != NVML_ERROR_NOT_FOUND:
                # NOT_FOUND is routine (no new utilisation samples); anything
                # else (GPU lost, unknown) is worth one line per function.
                self._log_once(
                    f"{fn_name}:{code}", "NVML: %s failed: %s", fn_name, exc,
                    level=logging.WARNING,
                )
            return default

    def _is_nvml_error(self, exc: Exception) -> bool:
        error_cls = getattr(self._module, "NVMLError", None)
        return isinstance(error_cls, type) and isinstance(exc, error_cls)

    def is_missing(self, fn_name: str) -> bool:
        """True once ``fn_name`` is known to be absent from this driver."""
        return fn_name in self._missing

    # --- system ------------------------------------------------------------

    def driver_version(self) -> str | None:
        """nvidia-smi ``driver_version``."""
        return _text(self.query("nvmlSystemGetDriverVersion"))

    def cuda_version(self) -> str | None:
        """The CUDA version the driver supports, e.g. ``"12.4"`` (nvidia-smi's header)."""
        raw = self.query("nvmlSystemGetCudaDriverVersion")
        if not isinstance(raw, int) or raw <= 0:
            return None
        return f"{raw // 1000}.{(raw % 1000) // 10}"

    def device_count(self) -> int:
        count = self.query("nvmlDeviceGetCount", default=0)
        return int(count) if isinstance(count, int) else 0


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(slots=True)
class GpuSnapshot:
    """One reading of one GPU; None where NVML did not say."""

    index: int
    util_pct: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    pcie_tx_kbps: float | None
    pcie_rx_kbps: float | None
    pcie_gen_current: int | None
    pcie_width_current: int | None
    power_w: float | None
    temp_c: float | None
    sm_clock_mhz: float | None
    throttle_reasons: int | None


class Device:
    """One GPU, by NVML index. Every read goes through `Nvml.query`."""

    def __init__(self, nvml: Nvml, index: int, handle: Any) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = handle
        self._last_sample_ts = 0  # microseconds, the driver's clock
        m = nvml.module
        self._util_samples = int(getattr(m, "NVML_GPU_UTILIZATION_SAMPLES", 1))
        self._pcie_tx = int(getattr(m, "NVML_PCIE_UTIL_TX_BYTES", 0))
        self._pcie_rx = int(getattr(m, "NVML_PCIE_UTIL_RX_BYTES", 1))
        self._temp_gpu = int(getattr(m, "NVML_TEMPERATURE_GPU", 0))
        self._clock_sm = int(getattr(m, "NVML_CLOCK_SM", 1))

    def _q(self, fn_name: str, *args: Any) -> Any:
        return self.nvml.query(fn_name, self.handle, *args)

    # --- identity ----------------------------------------------------------

    def name(self) -> str | None:
        """nvidia-smi ``name``."""
        return _text(self._q("nvmlDeviceGetName"))

    def uuid(self) -> str | None:
        """nvidia-smi ``uuid``."""
        return _text(self._q("nvmlDeviceGetUUID"))

    # --- memory ------------------------------------------------------------

    def _memory(self) -> tuple[int | None, int | None]:
        info = self._q("nvmlDeviceGetMemoryInfo")
        if info is None:
            return None, None
        return _int(getattr(info, "used", None)), _int(getattr(info, "total", None))

    def memory_used_bytes(self) -> int | None:
        """nvidia-smi ``memory.used`` (which prints MiB; this is bytes)."""
        return self._memory()[0]

    def memory_total_bytes(self) -> int | None:
        """nvidia-smi ``memory.total`` (which prints MiB; this is bytes)."""
        return self._memory()[1]

    # --- utilisation -------------------------------------------------------

    def util_rates(self) -> tuple[float | None, float | None]:
        """nvidia-smi ``utilization.gpu`` and ``utilization.memory`` (polled)."""
        rates = self._q("nvmlDeviceGetUtilizationRates")
        if rates is None:
            return None, None
        gpu = getattr(rates, "gpu", None)
        mem = getattr(rates, "memory", None)
        return (
            float(gpu) if isinstance(gpu, int | float) else None,
            float(mem) if isinstance(mem, int | float) else None,
        )

    def util_pct_from_samples(self) -> float | None:
        """Mean of the driver's own utilisation samples since the last read.

        Less aliasing than polling ``utilization.gpu`` once a second; None
        when unsupported or when the driver has no new sample yet.
        """
        got = self._q("nvmlDeviceGetSamples", self._util_samples, self._last_sample_ts)
        if not got:
            return None
        value_type, samples = got
        field_name = _SAMPLE_VALUE_FIELDS.get(int(value_type), "uiVal")
        newest = max((int(s.timeStamp) for s in samples), default=0)
        if newest <= self._last_sample_ts:
            return None
        floor = self._last_sample_ts
        if floor == 0:
            floor = newest - _FIRST_SAMPLES_SPAN_US
        values = [
            float(getattr(s.sampleValue, field_name))
            for s in samples
            if int(s.timeStamp) > floor
        ]
        self._last_sample_ts = newest
        return sum(values) / len(values) if values else None

    def util_pct(self) -> float | None:
        """nvidia-smi ``utilization.gpu``: driver samples where available, else polled."""
        from_samples = self.util_pct_from_samples()
        if from_samples is not None:
            return from_samples
        return self.util_rates()[0]

    # --- PCIe --------------------------------------------------------------

    def pcie_tx_kbps(self) -> float | None:
        """PCIe TX in KB/s over NVML's 20 ms window (``nvidia-smi dmon -s t`` txpci, MB/s)."""
        value = self._q("nvmlDeviceGetPcieThroughput", self._pcie_tx)
        return float(value) if isinstance(value, int | float) else None

    def pcie_rx_kbps(self) -> float | None:
        """PCIe RX in KB/s over NVML's 20 ms window (``nvidia-smi dmon -s t`` rxpci, MB/s)."""
        value = self._q("nvmlDeviceGetPcieThroughput", self._pcie_rx)
        return float(value) if isinstance(value, int | float) else None

    def pcie_gen_current(self) -> int | None:
        """nvidia-smi ``pcie.link.gen.current`` (drops at idle: read it under load)."""
        return _int(self._q("nvmlDeviceGetCurrPcieLinkGeneration"))

    def pcie_width_current(self) -> int | None:
        """nvidia-smi ``pcie.link.width.current``."""
        return _int(self._q("nvmlDeviceGetCurrPcieLinkWidth"))

    def pcie_gen_max(self) -> int | None:
        """nvidia-smi ``pcie.link.gen.max``: this GPU in this slot."""
        return _int(self._q("nvmlDeviceGetMaxPcieLinkGeneration"))

    def pcie_width_max(self) -> int | None:
        """nvidia-smi ``pcie.link.width.max``."""
        return _int(self._q("nvmlDeviceGetMaxPcieLinkWidth"))

    def pcie_gen_gpu_max(self) -> int | None:
        """nvidia-smi ``pcie.link.gen.gpumax``: what the GPU alone could do."""
        return _int(self._q("nvmlDeviceGetGpuMaxPcieLinkGeneration"))

    # --- power, heat, clocks -----------------------------------------------

    def power_w(self) -> float | None:
        """nvidia-smi ``power.draw`` in watts (NVML reports milliwatts)."""
        mw = self._q("nvmlDeviceGetPowerUsage")
        return mw / 1000.0 if isinstance(mw, int | float) else None

    def temp_c(self) -> float | None:
        """nvidia-smi ``temperature.gpu``."""
        value = self._q("nvmlDeviceGetTemperature", self._temp_gpu)
        return float(value) if isinstance(value, int | float) else None

    def sm_clock_mhz(self) -> float | None:
        """nvidia-smi ``clocks.sm``."""
        value = self._q("nvmlDeviceGetClockInfo", self._clock_sm)
        return float(value) if isinstance(value, int | float) else None

    def throttle_reasons(self) -> int | None:
        """nvidia-smi ``clocks_event_reasons.active`` (older ``clocks_throttle_reasons.active``).

        Bitmask: 0x1 idle, 0x2 app clocks, 0x4 SW power cap, 0x8 HW slowdown,
        0x20 SW thermal, 0x40 HW thermal. Drivers before the rename only have
        the ThrottleReasons name.
        """
        value = self._q("nvmlDeviceGetCurrentClocksEventReasons")
        if value is None and self.nvml.is_missing("nvmlDeviceGetCurrentClocksEventReasons"):
            value = self._q("nvmlDeviceGetCurrentClocksThrottleReasons")
        return _int(value)

    # --- aggregates --------------------------------------------------------

    def describe(self) -> Gpu:
        """The hello's `Gpu` entry."""
        _, total = self._memory()
        return Gpu(
            index=self.index,
            uuid=self.uuid(),
            name=self.name(),
            memory_total_bytes=total,
            pcie_gen_max=self.pcie_gen_max(),
            pcie_width_max=self.pcie_width_max(),
            pcie_gen_current=self.pcie_gen_current(),
            pcie_width_current=self.pcie_width_current(),
        )

    def snapshot(self) -> GpuSnapshot:
        """Every live quantity once. Blocks (a PCIe read takes 20 ms): call it off the loop."""
        used, total = self._memory()
        return GpuSnapshot(
            index=self.index,
            util_pct=self.util_pct(),
            memory_used_bytes=used,
            memory_total_bytes=total,
            pcie_tx_kbps=self.pcie_tx_kbps(),
            pcie_rx_kbps=self.pcie_rx_kbps(),
            pcie_gen_current=self.pcie_gen_current(),
            pcie_width_current=self.pcie_width_current(),
            power_w=self.power_w(),
            temp_c=self.temp_c(),
            sm_clock_mhz=self.sm_clock_mhz(),
            throttle_reasons=self.throttle_reasons(),
        )


def open_devices(nvml: Nvml) -> list[Device]:
    """Every GPU NVML can see; [] (and one log line saying why) when none."""
    if not nvml.available():
        return []  # Nvml already logged the reason once
    count = nvml.device_count()
    devices: list[Device] = []
    for index in range(count):
        handle = nvml.query("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            log.warning("NVML: no handle for GPU %d; leaving it out", index)
            continue
        devices.append(Device(nvml, index, handle))
    if not devices:
        nvml.unavailable_reason = "NVML loaded but reports no GPU"
        log.warning("GPU telemetry off: NVML loaded but reports no GPU; reporting no GPUs")
    return devices


def inventory(devices: list[Device]) -> list[Gpu]:
    """The hello's ``gpus`` list."""
    return [d.describe() for d in devices]
