"""The hardware facts both sides read, once: GPU spec sheets, GPU name rules, CPU families
and PCIe link figures. Pure: no I/O, no clock.

Below ``coordinator/decisions/`` (the belief ceilings), ``coordinator/discovery/`` (the
rate model's features), ``common/scaling.py`` (the scaling diagnosis) and ``sim/`` (the
simulated cards), so each of them reads the same row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

#: Usable bandwidth per PCIe lane and direction, GB/s (10^9 bytes), by generation: the
#: PCI-SIG signalling rates after 8b/10b (Gen1-2), 128b/130b (Gen3-5) or FLIT (Gen6)
#: encoding (docs/nvml.md, "What a PCIe link carries").
PCIE_GBPS_PER_LANE: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_link_gbps(generation: int, lanes: int) -> float:
    """A PCIe link's capacity per direction, GB/s: generation's per-lane rate x lanes (an
    unknown generation is read as Gen4, the commonest)."""
    per_lane = PCIE_GBPS_PER_LANE.get(generation, PCIE_GBPS_PER_LANE[4])
    return per_lane * max(1, lanes)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """A GPU model's spec sheet (vendor figures, rounded): per card."""

    mem_bw_gbps: float
    fp32_tflops: float
    memory_mb: int  # as vast.ai's ``gpu_ram`` and NVML's total memory report it, MB
    compute_cap: int  # x 100, as vast.ai's ``compute_cap``
    pcie_gen_max: int
    pcie_lanes_max: int = 16  # lanes the card itself has (the x8 cards say so)


#: Spec sheets of the GPUs vast.ai rents most for proving, keyed by vast.ai's
#: ``gpu_name`` spelling (vendor figures, rounded; memory in MB as vast.ai's offers and
#: NVML report it; docs/discovery.md, "What the model reads"). Offers carry
#: ``gpu_mem_bw`` and ``total_flops`` of their own (measured per host); this table fills
#: them in for a bring-your-own agent's host info, gives the class figure a host's own
#: is compared with, the belief ceilings (docs/reliability.md) and the simulated cards'
#: memory and links.
GPU_SPECS: dict[str, GpuSpec] = {
    "RTX 5090": GpuSpec(1792, 104.8, 32607, 1200, 5),
    "RTX 5080": GpuSpec(960, 56.3, 16303, 1200, 5),
    "RTX 5070 Ti": GpuSpec(896, 43.9, 16303, 1200, 5),
    "RTX 5070": GpuSpec(672, 30.9, 12227, 1200, 5),
    "RTX 5060 Ti": GpuSpec(448, 23.7, 16311, 1200, 5, 8),
    "RTX 4090": GpuSpec(1008, 82.6, 24564, 890, 4),
    "RTX 4080 Super": GpuSpec(736, 52.2, 16376, 890, 4),
    "RTX 4080": GpuSpec(717, 48.7, 16376, 890, 4),
    "RTX 4070 Ti Super": GpuSpec(672, 44.1, 16376, 890, 4),
    "RTX 4070 Ti": GpuSpec(504, 40.1, 12282, 890, 4),
    "RTX 4060 Ti": GpuSpec(288, 22.1, 16380, 890, 4, 8),
    "RTX 3090 Ti": GpuSpec(1008, 40.0, 24564, 860, 4),
    "RTX 3090": GpuSpec(936, 35.6, 24576, 860, 4),
    "RTX 3080": GpuSpec(760, 29.8, 10240, 860, 4),
    "RTX A6000": GpuSpec(768, 38.7, 49140, 860, 4),
    "RTX 6000Ada": GpuSpec(960, 91.1, 49140, 890, 4),
    "L40S": GpuSpec(864, 91.6, 46068, 890, 4),
    "A100 PCIE": GpuSpec(1555, 19.5, 40960, 800, 4),
    "A100 SXM4": GpuSpec(2039, 19.5, 81920, 800, 4),
    "H100 PCIE": GpuSpec(2000, 51.2, 81559, 900, 5),
    "H100 SXM": GpuSpec(3350, 66.9, 81559, 900, 5),
    # Models vast.ai also rents (docs/reliability.md, "Ceilings for every GPU", cites
    # each row's spec sheet): without a row a claim on one was bounded by the global
    # ceiling alone.
    "RTX A5000": GpuSpec(768, 27.8, 24564, 860, 4),
    "RTX A4000": GpuSpec(448, 19.2, 16376, 860, 4),
    "A40": GpuSpec(696, 37.4, 46068, 860, 4),
    "L4": GpuSpec(300, 30.3, 23034, 890, 4),
    "Tesla V100": GpuSpec(900, 14.0, 16384, 700, 3),
    "RTX 3080 Ti": GpuSpec(912, 34.1, 12288, 860, 4),
    "RTX 4070": GpuSpec(504, 29.1, 12282, 890, 4),
}


def gpu_key(name: str | None) -> str:
    """A GPU name compared without case or repeated spaces."""
    return " ".join(str(name or "").split()).casefold()


_SPECS_BY_KEY = {gpu_key(k): (k, v) for k, v in GPU_SPECS.items()}


def gpu_spec(name: str) -> GpuSpec | None:
    """The spec sheet of a GPU model named as vast.ai spells it (any case), or None."""
    found = _SPECS_BY_KEY.get(gpu_key(name))
    return found[1] if found else None


@lru_cache(maxsize=1024)
def canonical_gpu_name(name: str) -> str:
    """vast.ai's spelling of a GPU name, also from NVML's ("NVIDIA GeForce RTX 4090")."""
    text = " ".join(str(name).split())
    for prefix in ("NVIDIA ", "GeForce "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    found = _SPECS_BY_KEY.get(gpu_key(text))
    return found[0] if found else text


#: A CPU name's product family, first match wins: vendors' naming encodes the generation
#: (AMD's EPYC 7xx2 is Zen 2, 7xx3 Zen 3; Intel's Xeon Gold 62xx is the second Scalable
#: generation), docs/discovery.md, "What the model reads".
CPU_FAMILY_RULES: tuple[tuple[str, str], ...] = (
    (r"EPYC\s+(\d)\w\w(\d)", "AMD EPYC {0}xx{1}"),
    (r"Threadripper\s+(?:PRO\s+)?(\d)\d\d\d", "AMD Threadripper {0}000"),
    (r"Ryzen\s+\d+\s+(?:PRO\s+)?(\d)\d\d\d", "AMD Ryzen {0}000"),
    (r"Xeon.*\bE5-\d+\s*(v\d)", "Intel Xeon E5 {0}"),
    (r"Xeon.*\bE5-\d+", "Intel Xeon E5 v1"),
    (r"Xeon.*\b(?:Gold|Platinum|Silver|Bronze)\s+\d(\d)\d\d", "Intel Xeon Scalable gen {0}"),
    (r"Xeon.*\bw\d-(\d)\d\d\d", "Intel Xeon W-{0}000"),
    (r"Core.*\bUltra\s+\d\s+(\d)\d\d", "Intel Core Ultra {0}00"),
    (r"Core.*\bi\d-(1\d)\d\d\d", "Intel Core gen {0}"),
    (r"Core.*\bi\d-(\d)\d\d\d", "Intel Core gen {0}"),
)
_GENERIC_CPU_WORDS = frozenset({"amd", "intel", "r", "tm", "cpu", "processor", "core"})


@lru_cache(maxsize=4096)
def cpu_family(cpu_name: str) -> str:
    """The CPU's product family from its name (``CPU_FAMILY_RULES``), so hosts whose CPU
    model differs but whose cores are alike share what the model learns about them.

    Knows no speeds: which family is faster is learned from measurements.
    """
    name = " ".join(str(cpu_name or "").split())
    for pattern, fmt in CPU_FAMILY_RULES:
        m = re.search(pattern, name, re.IGNORECASE)
        if m:
            return fmt.format(*m.groups())
    words = re.findall(r"[A-Za-z0-9]+", name)
    kept = [w for w in words if w.casefold() not in _GENERIC_CPU_WORDS][:2]
    return " ".join(kept) if kept else "unknown CPU"
