"""Host telemetry (CPU, load, RAM, network, disk, cgroup quota) behind one module.

psutil is only touched here, so tests inject a fake and the simulation swaps
in `vast_manager.sim.fake_host.FakeHostProbe`, which has the same interface
(`HostSource`). Inside a container psutil sees the host's cores; the cgroup
CPU quota says how many this container may use, and both are reported.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil


@dataclass(slots=True)
class HostFacts:
    """What does not change while the agent runs (the hello's host part)."""

    hostname: str
    cpu_model: str
    cpu_cores_logical: int
    cpu_cores_physical: int | None
    ram_total_bytes: int


@dataclass(slots=True)
class HostSample:
    """One reading. Network figures are cumulative counters: rates come from
    the difference over a window, not from one sample."""

    t: float  # monotonic seconds, for rates
    cpu_util_pct: float | None
    per_core_util_pct: list[float] = field(default_factory=list)
    iowait_pct: float | None = None
    load1: float | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None
    quota_cores: float | None = None


@dataclass(slots=True)
class DiskUsage:
    path: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


class HostSource(Protocol):
    """What the sampler needs from a host probe, real or simulated."""

    def facts(self) -> HostFacts: ...

    def sample(self) -> HostSample: ...

    def disk_usage(self) -> DiskUsage | None: ...

    def memory_limit(self) -> MemoryLimit: ...


def read_cgroup_quota_cores(root: str = "/sys/fs/cgroup") -> float | None:
    """Cores this container may use by its CFS quota; None when unlimited or unknown.

    cgroup v2: ``cpu.max`` = ``"<quota> <period>"`` or ``"max <period>"``.
    cgroup v1: ``cpu/cpu.cfs_quota_us`` (-1 = unlimited) over ``cpu.cfs_period_us``.
    """
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            parts = f.read().split()
        if len(parts) >= 2 and parts[0] != "max":
            quota, period = float(parts[0]), float(parts[1])
            return quota / period if period > 0 and quota > 0 else None
        if parts:
            return None
    except (OSError, ValueError):
        pass
    for v1 in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            with open(os.path.join(root, v1, "cpu.cfs_quota_us")) as f:
                quota = float(f.read().strip())
            with open(os.path.join(root, v1, "cpu.cfs_period_us")) as f:
                period = float(f.read().strip())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """The memory this container may use: MemTotal, and the cgroup's limit if it has one."""

    mem_total_bytes: int | None  # /proc/meminfo MemTotal (the host's, in a container)
    cgroup_limit_bytes: int | None  # memory.max / memory.limit_in_bytes; None: unlimited

    @property
    def usable_bytes(self) -> int | None:
        known = [v for v in (self.mem_total_bytes, self.cgroup_limit_bytes) if v is not None]
        return min(known) if known else None


# cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages): anything
# at or above 2^60 bytes is no limit in practice.
_V1_UNLIMITED = 1 << 60


def read_memory_limit(
    root: str = "/sys/fs/cgroup", meminfo_path: str = "/proc/meminfo"
) -> MemoryLimit:
    """MemTotal and the container's cgroup memory limit.

    cgroup v2: ``memory.max`` (``max`` = unlimited); cgroup v1:
    ``memory/memory.limit_in_bytes``. cuzk's ``total_budget = "auto"`` reads
    only MemTotal (docs/cuzk.md), so the agent passes the smaller of the two.
    """
    total: int | None = None
    try:
        with open(meminfo_path) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    parts = line.split()
                    total = int(parts[1]) * 1024 if parts[-1] == "kB" else int(parts[1])
                    break
    except (OSError, ValueError, IndexError):
        total = None
    limit: int | None = None
    for path in (os.path.join(root, "memory.max"),
                 os.path.join(root, "memory", "memory.limit_in_bytes")):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw != "max":
            try:
                value = int(raw)
            except ValueError:
                continue
            limit = value if 0 < value < _V1_UNLIMITED else None
        break
    return MemoryLimit(total, limit)


def read_cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str | None:
    """The first ``model name`` (x86) or ``Model``/``Hardware`` (ARM) line."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def _busy_and_total(t: Any) -> tuple[float, float, float]:
    """(busy, total, iowait) jiffies of one psutil cpu_times entry, psutil's way.

    Guest time is already inside user/nice on Linux, so it is not counted
    twice; idle and iowait are not busy.
    """
    total = sum(t)
    total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    iowait = getattr(t, "iowait", 0.0)
    busy = total - t.idle - iowait
    return busy, total, iowait


def existing_dir(path: str) -> str:
    # The parameter folder may not exist yet (before the fetch): measure the
    # file system it will be created on.
    p = os.path.abspath(path)
    while not os.path.isdir(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


class HostProbe:
    """The real host, through psutil (injectable: pass any module of that shape).

    CPU figures are computed from ``cpu_times(percpu=True)`` differences, as
    ``psutil.cpu_percent(percpu=True)`` does, but from one /proc/stat read
    per sample (which also gives iowait) and without psutil's module-wide
    "since last call" state, which any other caller would disturb. The first
    read primes; each sample measures since the previous one.
    """

    def __init__(
        self,
        params_dir: str,
        psutil_module: Any | None = None,
        cgroup_root: str = "/sys/fs/cgroup",
        cpuinfo_path: str = "/proc/cpuinfo",
        clock: Callable[[], float] = time.monotonic,
        hostname: Callable[[], str] = socket.gethostname,
    ) -> None:
        if psutil_module is None:
            import psutil

            psutil_module = psutil
        self.psutil: Any = psutil_module
        self.params_dir = params_dir
        self.cgroup_root = cgroup_root
        self.cpuinfo_path = cpuinfo_path
        self.clock = clock
        self._hostname = hostname
        self._quota_cores = read_cgroup_quota_cores(cgroup_root)
        self._prev_times: list[Any] | None = self._cpu_times()  # prime

    def _cpu_times(self) -> list[Any] | None:
        try:
            return list(self.psutil.cpu_times(percpu=True))
        except Exception:  # psutil raises plain OSError subclasses on odd kernels
            return None

    def facts(self) -> HostFacts:
        ps = self.psutil
        logical = ps.cpu_count() or os.cpu_count() or 1
        try:
            physical = ps.cpu_count(logical=False)
        except Exception:
            physical = None
        return HostFacts(
            hostname=self._hostname()[:255],
            cpu_model=(read_cpu_model(self.cpuinfo_path) or "unknown")[:255],
            cpu_cores_logical=int(logical),
            cpu_cores_physical=int(physical) if physical else None,
            ram_total_bytes=int(ps.virtual_memory().total),
        )

    def quota_cores(self) -> float | None:
        return self._quota_cores

    def memory_limit(self) -> MemoryLimit:
        return read_memory_limit(self.cgroup_root)

    def _cpu(self) -> tuple[float | None, list[float], float | None]:
        now = self._cpu_times()
        prev, self._prev_times = self._prev_times, now
        if not now or not prev or len(now) != len(prev):
            return None, [], None  # hot-plugged CPUs: measure from the next sample
        per_core: list[float] = []
        busy_all = total_all = iowait_all = 0.0
        for a, b in zip(prev, now, strict=True):
            busy_a, total_a, io_a = _busy_and_total(a)
            busy_b, total_b, io_b = _busy_and_total(b)
            d_total = total_b - total_a
            d_busy = max(0.0, busy_b - busy_a)
            per_core.append(round(min(100.0, 100.0 * d_busy / d_total), 1) if d_total > 0 else 0.0)
            busy_all += d_busy
            total_all += max(0.0, d_total)
            iowait_all += max(0.0, io_b - io_a)
        if total_all <= 0:
            return None, per_core, None
        return 100.0 * busy_all / total_all, per_core, 100.0 * iowait_all / total_all

    def sample(self) -> HostSample:
        ps = self.psutil
        util, per_core, iowait = self._cpu()
        try:
            load1: float | None = float(ps.getloadavg()[0])
        except (OSError, AttributeError):
            load1 = None
        vm = ps.virtual_memory()
        try:
            net = ps.net_io_counters()
        except Exception:  # no /proc/net/dev in some sandboxes
            net = None
        return HostSample(
            t=self.clock(),
            cpu_util_pct=util,
            per_core_util_pct=per_core,
            iowait_pct=iowait,
            load1=load1,
            # "used" = total - available: what is really taken (psutil's own
            # ``used`` leaves out reclaimable caches differently per kernel).
            ram_used_bytes=int(vm.total - vm.available),
            ram_total_bytes=int(vm.total),
            net_rx_bytes=int(net.bytes_recv) if net is not None else None,
            net_tx_bytes=int(net.bytes_sent) if net is not None else None,
            quota_cores=self._quota_cores,
        )

    def disk_usage(self) -> DiskUsage | None:
        """Usage of the file system holding the parameter folder."""
        path = existing_dir(self.params_dir)
        try:
            du = self.psutil.disk_usage(path)
        except OSError:
            return None
        return DiskUsage(path, int(du.total), int(du.used), int(du.free))


def net_bytes_total() -> tuple[int, int] | None:
    """(received, sent) bytes of every network interface but loopback since it came up:
    inside a container, the container's own counters, which is what vast.ai bills per
    byte (docs/protocol.md, heartbeat ``net_bytes_total``). None when unreadable."""
    try:
        counters = psutil.net_io_counters(pernic=True)
    except (OSError, RuntimeError):
        return None
    rx = tx = 0
    for name, c in counters.items():
        if name == "lo" or name.startswith("lo:"):
            continue
        rx += int(c.bytes_recv)
        tx += int(c.bytes_sent)
    return rx, tx
