"""The local offers catalog: the operator's known hosts, in vast.ai's offer shape.

Field names and units are vast.ai's (docs/vast.md: ``gpu_ram`` and ``cpu_ram``
in MB, ``pcie_bw`` in GB/s, ``dph_total`` in $/h). As on vast.ai, ``cpu_ram``
and ``cpu_cores`` are the whole host's and ``cpu_cores_effective`` and
``gpu_frac`` the instance's share: the operator's hosts (``local_offers``) are
rented whole, and two slices of 8-GPU hosts (``slice_offers``) show what a
share means, one of them too small for cuzk. Prices are typical on-demand
prices. Deploying one of these through the LocalProvider runs an agent on the
*simulated* cuzk with the hardware its instance gets, so every rate it
produces is simulated. The ``sim`` object holds simulation-only knobs.
"""

from __future__ import annotations

import copy
from typing import Any


def _offer(
    offer_id: int,
    machine_id: int,
    *,
    gpu_name: str,
    num_gpus: int,
    gpu_ram: int,
    dph_total: float,
    cpu_name: str,
    cpu_cores: int,
    cpu_ram: int,
    pci_gen: int,
    gpu_lanes: int,
    pcie_bw: float,
    geolocation: str,
    inet_down: float,
    note: str,
    sim: dict[str, Any] | None = None,
    host_gpus: int | None = None,
) -> dict[str, Any]:
    # The instance's share of the host, as vast.ai lists it (docs/vast.md).
    frac = num_gpus / (host_gpus or num_gpus)
    return {
        "id": offer_id,
        "ask_contract_id": offer_id,
        "machine_id": machine_id,
        "host_id": machine_id // 10,
        "num_gpus": num_gpus,
        "gpu_name": gpu_name,
        "gpu_ram": gpu_ram,
        "gpu_total_ram": gpu_ram * num_gpus,
        "cpu_name": cpu_name,
        "gpu_frac": frac,
        "cpu_cores": cpu_cores,
        "cpu_cores_effective": cpu_cores * frac,
        "cpu_ram": cpu_ram,
        "disk_space": 500.0,
        "pci_gen": pci_gen,
        "gpu_lanes": gpu_lanes,
        "pcie_bw": pcie_bw,
        "dph_base": round(dph_total * 0.95, 4),
        "dph_total": dph_total,
        "inet_down": inet_down,
        "inet_up": inet_down / 2,
        "cuda_max_good": 13.0,
        "driver_vers": "580.95.05",
        "reliability": 0.995,
        "verification": "verified",
        "verified": True,
        "rentable": True,
        "rented": False,
        "geolocation": geolocation,
        "hostname": f"sim-{machine_id}",
        "note": note,
        "sim": sim or {"noise_pct": 6.0, "seed": machine_id},
    }


LOCAL_OFFERS: tuple[dict[str, Any], ...] = (
    _offer(
        9001, 41001, gpu_name="RTX 4090", num_gpus=1, gpu_ram=24564, dph_total=0.42,
        cpu_name="AMD EPYC 7502 32-Core Processor", cpu_cores=32, cpu_ram=257_000,
        pci_gen=4, gpu_lanes=16, pcie_bw=24.5, geolocation="Oregon, US", inet_down=900,
        note="the operator's 61.4/h RTX 4090",
    ),
    _offer(
        9002, 41002, gpu_name="RTX 3090", num_gpus=1, gpu_ram=24576, dph_total=0.22,
        cpu_name="AMD EPYC 7302 16-Core Processor", cpu_cores=32, cpu_ram=257_000,
        pci_gen=4, gpu_lanes=16, pcie_bw=22.0, geolocation="Ohio, US", inet_down=700,
        note="previous-generation single GPU",
    ),
    _offer(
        9003, 41003, gpu_name="RTX 5070 Ti", num_gpus=1, gpu_ram=16303, dph_total=0.19,
        cpu_name="AMD Ryzen Threadripper PRO 5975WX 32-Cores", cpu_cores=64, cpu_ram=386_000,
        pci_gen=5, gpu_lanes=16, pcie_bw=48.0, geolocation="Quebec, CA", inet_down=1500,
        note="good specs, good value",
    ),
    _offer(
        9004, 41004, gpu_name="RTX 5060 Ti", num_gpus=2, gpu_ram=16311, dph_total=0.24,
        cpu_name="AMD EPYC 7K62 48-Core Processor", cpu_cores=48, cpu_ram=257_000,
        pci_gen=4, gpu_lanes=8, pcie_bw=13.5, geolocation="England, GB", inet_down=800,
        note="2x RTX 5060 Ti, EPYC 7K62, PCIe 13.5 GB/s",
    ),
    _offer(
        9005, 41005, gpu_name="RTX 5060 Ti", num_gpus=1, gpu_ram=16311, dph_total=0.11,
        cpu_name="Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz", cpu_cores=14, cpu_ram=128_000,
        pci_gen=3, gpu_lanes=8, pcie_bw=6.2, geolocation="Texas, US", inet_down=500,
        note="cheap single RTX 5060 Ti: can it reach 12 proofs/hour?",
    ),
    _offer(
        9006, 41006, gpu_name="RTX 5090", num_gpus=1, gpu_ram=32607, dph_total=0.69,
        cpu_name="13th Gen Intel(R) Core(TM) i9-13900K", cpu_cores=32, cpu_ram=128_000,
        pci_gen=5, gpu_lanes=16, pcie_bw=50.0, geolocation="Illinois, US", inet_down=1000,
        note="RTX 5090 retry (one in Italy made 25.9/h)",
    ),
    _offer(
        9007, 41007, gpu_name="RTX 4080 Super", num_gpus=2, gpu_ram=16376, dph_total=0.52,
        cpu_name="AMD EPYC 9354 32-Core Processor", cpu_cores=64, cpu_ram=515_000,
        pci_gen=4, gpu_lanes=16, pcie_bw=24.0, geolocation="Denmark, DK", inet_down=1200,
        note="high-end multi-GPU of the previous generation, for variety",
    ),
    _offer(
        9008, 41008, gpu_name="RTX 5060 Ti", num_gpus=4, gpu_ram=16311, dph_total=0.46,
        cpu_name="AMD Ryzen 7 5800X 8-Core Processor", cpu_cores=16, cpu_ram=257_000,
        pci_gen=5, gpu_lanes=8, pcie_bw=26.0, geolocation="Nevada, US", inet_down=900,
        note="the operator's 38.8/h 4x RTX 5060 Ti",
    ),
    _offer(
        9009, 41009, gpu_name="RTX 3090", num_gpus=4, gpu_ram=24576, dph_total=0.72,
        cpu_name="AMD EPYC 7532 32-Core Processor", cpu_cores=64, cpu_ram=515_000,
        pci_gen=3, gpu_lanes=4, pcie_bw=3.8, geolocation="Poland, PL", inet_down=600,
        note="4x RTX 3090 on PCIe Gen3 x4 risers",
    ),
)


#: Parts of 8-GPU hosts: vast.ai lists each with the host's cpu_ram and cpu_cores.
SLICE_OFFERS: tuple[dict[str, Any], ...] = (
    _offer(
        9010, 41010, gpu_name="RTX 4090", num_gpus=1, host_gpus=8, gpu_ram=24564,
        dph_total=0.36, cpu_name="AMD EPYC 7763 64-Core Processor", cpu_cores=256,
        cpu_ram=515_000, pci_gen=4, gpu_lanes=16, pcie_bw=24.0, geolocation="Texas, US",
        inet_down=2000, note="1 of 8 GPUs of a 512 GB host: its instance gets 64 GB, too "
        "little for cuzk",
    ),
    _offer(
        9011, 41011, gpu_name="RTX 4090", num_gpus=2, host_gpus=8, gpu_ram=24564,
        dph_total=0.74, cpu_name="AMD EPYC 7763 64-Core Processor", cpu_cores=256,
        cpu_ram=1_031_000, pci_gen=4, gpu_lanes=16, pcie_bw=24.0, geolocation="Texas, US",
        inet_down=2000, note="2 of 8 GPUs of a 1 TB host: its instance gets 258 GB",
    ),
)


def local_offers() -> list[dict[str, Any]]:
    """A fresh copy of the operator's hosts, each rented whole (callers may mutate it)."""
    return copy.deepcopy(list(LOCAL_OFFERS))


def slice_offers() -> list[dict[str, Any]]:
    """A fresh copy of the slices of bigger hosts."""
    return copy.deepcopy(list(SLICE_OFFERS))


def catalog_offers() -> list[dict[str, Any]]:
    """Everything the local provider lists: the operator's hosts, then the slices."""
    return local_offers() + slice_offers()
