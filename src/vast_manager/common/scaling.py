"""Scaling efficiency and bottleneck classification (docs/architecture.md), pure functions.

The agent sends `diagnose`'s verdict in a ``scaling`` result; the coordinator
runs the same function on the reported runs and shows its own verdict beside
it, since hosts are untrusted. Evidence strings quote the numbers they rest
on. PCIe capacities per lane are the usable figures of ``common/hardware_facts.py``
(docs/nvml.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vast_manager.common.hardware_facts import PCIE_GBPS_PER_LANE
from vast_manager.protocol.messages import Gpu, GpuTelemetry, Telemetry

CPU_BUSY_PCT = 90.0  # "CPU busy above 90%"
GPU_IDLE_PCT = 40.0  # "GPUs idle about half the time": 40% idle or more counts
GPU_BUSY_PCT = 90.0  # "GPUs above 90% busy"
# A host that scales near-ideally with its GPUs mostly busy is GPU-bound too:
# the fill and drain of a short benchmark keep the mean a little under 90%.
SCALES_WELL_EFFICIENCY = 0.9
GPU_MOSTLY_BUSY_PCT = 80.0
PCIE_NEAR_PCT = 75.0  # a mean this close to capacity means the link is full while it carries data
MEMORY_NEAR_PCT = 95.0  # used / budget (cuzk) or used / total (RAM)
SYNTH_FULL_FRACTION = 0.9  # synthesis slots this full count as saturated

# NVML clocks event (throttle) reasons, nvml.md.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),
    (0x2, "app clocks"),
    (0x4, "SW power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "HW power brake"),
    (0x100, "display clocks"),
)
_NOT_A_LIMIT = 0x1 | 0x2  # idle and application clocks say nothing about a bottleneck

# Kilobytes per second (NVML) per GB/s.
_KBPS_PER_GBPS = 1_000_000.0

ORDER = ("cpu", "pcie", "gpu", "memory")  # first match wins, in this order (docs/architecture.md)


@dataclass(slots=True)
class Diagnosis:
    efficiency: float | None
    bottleneck: str
    evidence: list[str] = field(default_factory=list)


def link_capacity_gbps(gen: int | None, width: int | None) -> float | None:
    """Usable GB/s per direction of a PCIe link (e.g. Gen4 x16 -> 31.5); None if unknown."""
    if gen is None or width is None or width <= 0:
        return None
    per_lane = PCIE_GBPS_PER_LANE.get(gen)
    return per_lane * width if per_lane is not None else None


def describe_throttle(bits: int | None) -> list[str]:
    """Words for an NVML clocks-event bitmask; unknown bits as hex."""
    if not bits:
        return []
    words = [name for bit, name in THROTTLE_REASONS if bits & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    if bits & ~known:
        words.append(f"other (0x{bits & ~known:x})")
    return words


def efficiency(num_gpus: int, rate_all: float, rate_one: float) -> float | None:
    """rate_all / (N x rate_one); None when it cannot be computed."""
    if num_gpus <= 0 or rate_one <= 0 or rate_all < 0:
        return None
    return round(rate_all / (num_gpus * rate_one), 4)


def gpu_label(indices: Iterable[int]) -> str:
    """"GPU 2", "GPUs 0-3", "GPUs 0, 2, 5"."""
    idx = sorted(set(indices))
    if len(idx) == 1:
        return f"GPU {idx[0]}"
    if idx and idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}-{idx[-1]}"
    return "GPUs " + ", ".join(str(i) for i in idx)


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def _link_of(g: GpuTelemetry, by_index: dict[int, Gpu]) -> tuple[int | None, int | None]:
    # The link under load (telemetry) is the real one. Failing that, the
    # slot's maximum: the "current" link read at hello time is usually the
    # idle, trained-down one and would understate the capacity.
    if g.pcie_gen_current is not None and g.pcie_width_current is not None:
        return g.pcie_gen_current, g.pcie_width_current
    inv = by_index.get(g.index)
    if inv is None:
        return None, None
    gen = inv.pcie_gen_max if inv.pcie_gen_max is not None else inv.pcie_gen_current
    width = inv.pcie_width_max if inv.pcie_width_max is not None else inv.pcie_width_current
    return gen, width


@dataclass(slots=True)
class _Link:
    index: int
    direction: str
    gbps: float
    capacity_gbps: float
    gen: int
    width: int

    @property
    def pct(self) -> float:
        return 100.0 * self.gbps / self.capacity_gbps

    def text(self) -> str:
        return (
            f"PCIe {self.direction} {self.gbps:.1f} GB/s on GPU {self.index} = "
            f"{self.pct:.0f}% of its Gen{self.gen} x{self.width} link "
            f"({self.capacity_gbps:.1f} GB/s)"
        )


def _busiest_links(t: Telemetry, gpus: list[Gpu]) -> list[_Link]:
    by_index = {g.index: g for g in gpus}
    links: list[_Link] = []
    for g in t.gpus:
        gen, width = _link_of(g, by_index)
        cap = link_capacity_gbps(gen, width)
        if cap is None or gen is None or width is None:
            continue
        best: _Link | None = None
        for direction, kbps in (("TX", g.pcie_tx_kbps_mean), ("RX", g.pcie_rx_kbps_mean)):
            if kbps is None:
                continue
            link = _Link(g.index, direction, kbps / _KBPS_PER_GBPS, cap, gen, width)
            if best is None or link.pct > best.pct:
                best = link
        if best is not None:
            links.append(best)
    return sorted(links, key=lambda link: -link.pct)


def diagnose(
    num_gpus: int,
    rate_all: float,
    rate_one: float,
    telemetry_all: Telemetry | None,
    gpus: list[Gpu],
) -> Diagnosis:
    """Efficiency and the likely bottleneck of an N-GPU host (docs/architecture.md)."""
    eff = efficiency(num_gpus, rate_all, rate_one)
    evidence: list[str] = []
    if eff is not None:
        evidence.append(
            f"{num_gpus} GPUs prove {rate_all:.1f}/h vs {rate_one:.1f}/h on one: "
            f"efficiency {eff:.2f} of ideal {num_gpus * rate_one:.1f}/h"
        )
    if telemetry_all is None:
        evidence.append("no telemetry from the all-GPU run: cannot name a bottleneck")
        return Diagnosis(eff, "unknown", evidence)

    t = telemetry_all
    findings: dict[str, list[str]] = {k: [] for k in ORDER}
    observed: list[str] = []
    utils = [(g.index, g.util_pct_mean) for g in t.gpus if g.util_pct_mean is not None]
    gpu_util = sum(u for _, u in utils) / len(utils) if utils else None
    util_label = gpu_label(i for i, _ in utils) if utils else ""
    _cpu_rule(t, gpu_util, util_label, findings["cpu"], observed)
    _pcie_rule(t, gpus, findings["pcie"], observed)
    _gpu_rule(t, eff, gpu_util, util_label, findings["gpu"], observed)
    _memory_rule(t, findings["memory"], observed)

    bottleneck = next((k for k in ORDER if findings[k]), "unknown")
    if bottleneck != "unknown":
        evidence.extend(findings[bottleneck])
        evidence.extend(f for k in ORDER if k != bottleneck for f in findings[k])
    else:
        evidence.append("no rule matched (CPU, PCIe, GPU and memory all below their limits)")
    evidence.extend(observed)

    for g in t.gpus:
        limits = describe_throttle((g.throttle_reasons or 0) & ~_NOT_A_LIMIT)
        if limits:
            evidence.append(f"GPU {g.index} clocks held back: {', '.join(limits)}")
    return Diagnosis(eff, bottleneck, evidence[:64])


def _cpu_rule(t: Telemetry, gpu_util: float | None, util_label: str, found: list[str],
              observed: list[str]) -> None:
    """CPU: busy while the GPUs wait for work, or cuzk's synthesis full while they idle."""
    cpu_util = t.cpu.util_pct_mean
    if cpu_util is not None and gpu_util is not None:
        gpu_idle = 100.0 - gpu_util
        if cpu_util > CPU_BUSY_PCT and gpu_idle >= GPU_IDLE_PCT:
            found.append(
                f"CPU {cpu_util:.0f}% busy while {util_label} idle {gpu_idle:.0f}% of the time"
            )
            if t.cpu.load1 is not None:
                cores = len(t.cpu.per_core_util_pct_mean) or None
                on = f" on {cores} cores" if cores else ""
                found.append(f"load average {t.cpu.load1:.1f}{on}")
        else:
            observed.append(f"CPU {cpu_util:.0f}% busy")
    elif cpu_util is not None:
        observed.append(f"CPU {cpu_util:.0f}% busy")
    cz = t.cuzk
    # /status synthesis.max_concurrent (synthesis_max) is the budget over the smallest
    # partition of any proof kind, no cap; the daemon's synthesis workers are
    # (synthesis_slots, docs/cuzk.md). Without them there is no saturation to judge.
    if cz is not None and cz.synthesis_slots and cz.synthesis_active_mean is not None:
        busy = [w.busy_pct for w in cz.workers if w.busy_pct is not None]
        if busy:
            gpu_busy = sum(busy) / len(busy)
            synth_full = cz.synthesis_active_mean >= SYNTH_FULL_FRACTION * cz.synthesis_slots
            if synth_full and 100.0 - gpu_busy >= GPU_IDLE_PCT:
                found.append(
                    f"cuzk synthesis {cz.synthesis_active_mean:.1f} of its "
                    f"{cz.synthesis_slots} workers busy while its GPUs had no partition "
                    f"{100.0 - gpu_busy:.0f}% of the time"
                )


def _pcie_rule(t: Telemetry, gpus: list[Gpu], found: list[str], observed: list[str]) -> None:
    """PCIe: a link carrying close to what it can."""
    links = _busiest_links(t, gpus)
    near = [link for link in links if link.pct >= PCIE_NEAR_PCT]
    found.extend(link.text() for link in near[:8])
    if len(near) > 8:
        found.append(f"and {len(near) - 8} more GPUs near their link capacity")
    if links and not near:
        observed.append("busiest " + links[0].text())


def _gpu_rule(t: Telemetry, eff: float | None, gpu_util: float | None, util_label: str,
              found: list[str], observed: list[str]) -> None:
    """GPU: busy nearly all the time, so the GPUs themselves are the limit."""
    if gpu_util is not None:
        peak = max((g.util_pct_max for g in t.gpus if g.util_pct_max is not None), default=None)
        peak_text = f" (peak {peak:.0f}%)" if peak is not None else ""
        if gpu_util > GPU_BUSY_PCT:
            found.append(f"{util_label} busy {gpu_util:.0f}% of the time{peak_text}")
        elif eff is not None and eff >= SCALES_WELL_EFFICIENCY and gpu_util >= GPU_MOSTLY_BUSY_PCT:
            found.append(
                f"{util_label} busy {gpu_util:.0f}% of the time{peak_text} and scaling at "
                f"efficiency {eff:.2f}: the GPUs themselves set the pace"
            )
        else:
            observed.append(f"{util_label} busy {gpu_util:.0f}% of the time{peak_text}")


def _memory_rule(t: Telemetry, found: list[str], observed: list[str]) -> None:
    """Memory: cuzk's budget or the machine's RAM nearly full."""
    cz = t.cuzk
    if cz is not None and cz.memory_used_bytes_max is not None and cz.memory_total_bytes:
        pct = 100.0 * cz.memory_used_bytes_max / cz.memory_total_bytes
        text = (
            f"cuzk memory {_gb(cz.memory_used_bytes_max)} used of its "
            f"{_gb(cz.memory_total_bytes)} budget ({pct:.0f}%)"
        )
        (found if pct >= MEMORY_NEAR_PCT else observed).append(text)
    if t.ram.used_bytes is not None and t.ram.total_bytes:
        pct = 100.0 * t.ram.used_bytes / t.ram.total_bytes
        text = f"RAM {_gb(t.ram.used_bytes)} used of {_gb(t.ram.total_bytes)} ({pct:.0f}%)"
        (found if pct >= MEMORY_NEAR_PCT else observed).append(text)
