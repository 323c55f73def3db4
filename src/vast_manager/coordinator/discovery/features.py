"""An offer (vast.ai field names and units) as the hardware facts the rate model reads.

Pure: an ``Offer`` (coordinator.offers, parsed from vast.ai's JSON) in, a frozen
``OfferFeatures`` out, or ``FeatureError`` naming the field that is wrong. The
instance's share of the host is computed here, once:
``cpu_cores`` and ``cpu_ram`` are whole-host figures, ``cpu_cores_effective``
is the instance's vCPUs, and its RAM is ``cpu_ram * cpu_cores_effective /
cpu_cores`` (vast.ai gives each instance a share in proportion to its GPUs;
docs/discovery.md cites the sources). A missing figure is assumed from the GPU's
spec sheet or a stated default, and the assumption is named in ``assumed`` so a
prediction built on it says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vast_manager.common.hardware_facts import (
    GpuSpec,
    canonical_gpu_name,
    cpu_family,
    gpu_key,
    gpu_spec,
    pcie_link_gbps,
)
from vast_manager.coordinator.offers import Offer, OfferError, parse_offer

GIB = 1 << 30

#: Figures assumed when an offer does not report them (each assumption is named
#: in the features' ``assumed``; the model's interval does not pretend to know).
DEFAULT_MEM_BW_GBPS = 600.0
DEFAULT_CPU_GHZ = 2.8
DEFAULT_RAM_SHARE_GB = 256.0
DEFAULT_PCIE_GBPS = 12.0
#: A measured host->GPU copy reaches about this share of the link's rate.
PCIE_EFFICIENCY = 0.8


#: An offer field the model cannot read (``field`` names it): one error whether the
#: field is malformed (``parse_offer``) or out of the model's range (here).
FeatureError = OfferError


@dataclass(frozen=True, slots=True)
class OfferFeatures:
    """What the rate model reads from one offer; rates and shares are the instance's."""

    machine_id: str | None
    gpu_name: str
    gpu_key: str
    num_gpus: int
    mem_bw_gbps: float  # per GPU: the offer's own gpu_mem_bw, else the spec sheet
    spec_mem_bw_gbps: float | None  # the GPU model's spec sheet, None when unknown
    dlperf_per_gpu: float | None
    compute_cap: int | None
    cpu_name: str
    cpu_family: str
    cpu_cores_effective: float  # vCPUs of the instance
    cpu_cores_host: float
    cpu_ghz: float
    ram_share_gib: float  # the instance's share of the host's RAM
    host_share: float  # cpu_cores_effective / cpu_cores: 1.0 when the host is all ours
    pcie_gbps: float  # per GPU, host->GPU: the measured pcie_bw, capped by the link
    pci_gen: int | None
    gpu_lanes: int | None
    disk_bw_mbps: float | None
    inet_down_mbps: float | None
    reliability: float | None
    assumed: tuple[str, ...]

    def describe(self) -> str:
        """One line an operator recognises: '2x RTX 4080 Super, 32 vCPU AMD EPYC 9xx4, ...'."""
        return (
            f"{self.num_gpus}x {self.gpu_name}, {self.cpu_cores_effective:g} vCPU "
            f"{self.cpu_family} at {self.cpu_ghz:.1f} GHz, {self.ram_share_gib:.0f} GiB RAM share, "
            f"PCIe {self.pcie_gbps:.1f} GB/s per GPU"
        )


def _number(value: float | None, field: str, *, allow_zero: bool = False) -> float | None:
    """A parsed field as the model reads it: None when absent; FeatureError when it is
    negative (or zero, unless ``allow_zero``)."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise FeatureError(field, f"{field} must be a positive number, not {value:g}.")
    return float(value)


def offer_features(offer: Offer) -> OfferFeatures:
    """The features of one offer; FeatureError names a field out of the model's range."""
    raw_gpu = offer.gpu_name
    if raw_gpu is None or not raw_gpu.strip():
        raise FeatureError("gpu_name", "gpu_name must name the GPU model, e.g. 'RTX 4090'.")
    gpu_name = canonical_gpu_name(raw_gpu)
    n = offer.num_gpus
    _number(None if n is None else float(n), "num_gpus")
    if n is None or n < 1:
        raise FeatureError("num_gpus", "num_gpus must be a whole number of GPUs, at least 1.")
    spec = gpu_spec(gpu_name)
    assumed: list[str] = []

    mem_bw = _number(offer.gpu_mem_bw, "gpu_mem_bw")
    if mem_bw is None:
        if spec is not None:
            mem_bw = float(spec.mem_bw_gbps)
        else:
            mem_bw = DEFAULT_MEM_BW_GBPS
            assumed.append(f"GPU memory bandwidth unknown: assumed {mem_bw:.0f} GB/s")
    dlperf = _number(offer.dlperf, "dlperf")
    compute_cap = _number(offer.compute_cap, "compute_cap")

    cores_eff, cores_host = _cores(offer, assumed)
    share = cores_eff / cores_host

    ghz = _number(offer.cpu_ghz, "cpu_ghz")
    if ghz is None:
        ghz = DEFAULT_CPU_GHZ
        assumed.append(f"cpu_ghz not reported: assumed {ghz:.1f} GHz")

    cpu_ram_mb = _number(offer.cpu_ram, "cpu_ram")
    if cpu_ram_mb is None:
        ram_share_gib = DEFAULT_RAM_SHARE_GB * 1e9 / GIB
        assumed.append(f"cpu_ram not reported: assumed a {DEFAULT_RAM_SHARE_GB:.0f} GB share")
    else:
        ram_share_gib = cpu_ram_mb * 1e6 * share / GIB

    pcie, gen, lanes = _pcie(offer, spec, assumed)

    reliability = _number(offer.reliability, "reliability", allow_zero=True)
    return OfferFeatures(
        machine_id=offer.machine_id,
        gpu_name=gpu_name,
        gpu_key=gpu_key(gpu_name),
        num_gpus=n,
        mem_bw_gbps=mem_bw,
        spec_mem_bw_gbps=float(spec.mem_bw_gbps) if spec else None,
        dlperf_per_gpu=dlperf / n if dlperf is not None else None,
        compute_cap=int(compute_cap) if compute_cap is not None else None,
        cpu_name=offer.cpu_name or "unknown CPU",
        cpu_family=cpu_family(offer.cpu_name or ""),
        cpu_cores_effective=cores_eff,
        cpu_cores_host=cores_host,
        cpu_ghz=ghz,
        ram_share_gib=ram_share_gib,
        host_share=share,
        pcie_gbps=pcie,
        pci_gen=gen,
        gpu_lanes=lanes,
        disk_bw_mbps=_number(offer.disk_bw, "disk_bw"),
        inet_down_mbps=_number(offer.inet_down, "inet_down"),
        reliability=min(reliability, 1.0) if reliability is not None else None,
        assumed=tuple(assumed),
    )


def _cores(offer: Offer, assumed: list[str]) -> tuple[float, float]:
    """(the instance's vCPUs, the host's), the host's at least the instance's."""
    cores_host = _number(offer.cpu_cores, "cpu_cores")
    cores_eff = _number(offer.cpu_cores_effective, "cpu_cores_effective")
    if cores_eff is None and cores_host is None:
        raise FeatureError("cpu_cores_effective", "cpu_cores_effective (the instance's vCPUs) "
                           "or cpu_cores must be given.")
    if cores_eff is None:
        assert cores_host is not None
        cores_eff = cores_host
        assumed.append("cpu_cores_effective not reported: assumed the whole host's cores")
    if cores_host is None or cores_host < cores_eff:
        cores_host = cores_eff
    return cores_eff, cores_host


def _pcie(offer: Offer, spec: GpuSpec | None, assumed: list[str],
          ) -> tuple[float, int | None, int | None]:
    """(the usable PCIe bandwidth per GPU in GB/s, the link's generation, its lanes): the
    measured bandwidth, capped by the link the card and slot allow, else the link's."""
    gen_f = _number(offer.pci_gen, "pci_gen")
    lanes_f = _number(offer.gpu_lanes, "gpu_lanes")
    gen = round(gen_f) if gen_f is not None else None
    lanes = round(lanes_f) if lanes_f is not None else None
    link: float | None = None
    if gen is not None or lanes is not None:
        card_gen = spec.pcie_gen_max if spec else 5
        card_lanes = spec.pcie_lanes_max if spec else 16
        link = pcie_link_gbps(min(gen or card_gen, card_gen), min(lanes or card_lanes, card_lanes))
    pcie_bw = _number(offer.pcie_bw, "pcie_bw")
    if pcie_bw is not None:
        pcie = min(pcie_bw, link) if link is not None else pcie_bw
    elif link is not None:
        pcie = link * PCIE_EFFICIENCY
        assumed.append(f"pcie_bw not reported: assumed {pcie:.1f} GB/s from the link")
    else:
        pcie = DEFAULT_PCIE_GBPS
        assumed.append(f"PCIe not reported: assumed {pcie:.0f} GB/s")
    return pcie, gen, lanes


def offer_from_host_info(host: Mapping[str, Any], *, machine_id: str) -> Offer:
    """A bring-your-own agent's ``Hello.host`` as an offer (vast.ai's fields).

    The machine is all the agent's, so its cores and RAM are the instance's share;
    PCIe comes from the link NVML reports (no measured bandwidth).
    """
    gpus = host.get("gpus") or []
    if not isinstance(gpus, list) or not gpus:
        raise FeatureError("host.gpus", "the host info lists no GPU.")
    names = {canonical_gpu_name(str(g.get("name") or "")) for g in gpus if isinstance(g, Mapping)}
    if len(names) != 1:
        raise FeatureError("host.gpus", "the host's GPUs must be of one model to be predicted.")
    first = gpus[0]
    cores = host.get("cpu_cores_logical")
    ram = host.get("ram_total_bytes")
    offer: dict[str, object] = {
        "machine_id": machine_id,
        "gpu_name": names.pop(),
        "num_gpus": len(gpus),
        "cpu_name": host.get("cpu_model"),
        "cpu_cores": cores,
        "cpu_cores_effective": cores,
        "cpu_ram": ram / 1e6 if isinstance(ram, int | float) else None,
        "pci_gen": first.get("pcie_gen_max"),
        "gpu_lanes": first.get("pcie_width_current") or first.get("pcie_width_max"),
    }
    mem = first.get("memory_total_bytes")
    if isinstance(mem, int | float):
        offer["gpu_ram"] = mem / 1e6
    return parse_offer(offer)
