"""Hardware profiles for the simulation: which machine a simulated agent is on.

A profile is a vast.ai offer (the same field names and units as
reference/vast-api.md: ``gpu_ram`` and ``cpu_ram`` in MB, ``pcie_bw`` in GB/s)
plus an optional ``sim`` object of simulation-only knobs. The coordinator's
LocalProvider hands the offer it "deploys" to the agent as JSON in
``VM_SIM_PROFILE``; the simulated cuzk, the fake NVML and the fake host
probe all read the same profile, so their numbers agree with each other.

Everything here is simulated. Numbers derived from these tables are labelled
so wherever they are shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import orjson

ENV_PROFILE = "VM_SIM_PROFILE"
ENV_STATE_FILE = "VM_SIM_STATE_FILE"
ENV_TIME_SCALE = "VM_SIM_TIME_SCALE"


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Static facts of a GPU model (public spec sheets, rounded)."""

    name: str
    memory_mb: int
    tdp_w: float
    idle_w: float
    boost_clock_mhz: int
    pcie_gen_max: int
    # Seconds of GPU work for one PoRep C2 32G proof when nothing else limits
    # it (CPU synthesis, PCIe, RAM). Calibrated so single-GPU hosts land near
    # the operator's observed rates (reference/cuzk.md): simulated.
    gpu_seconds_per_proof: float


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("RTX 5090", 32607, 575, 30, 2407, 5, 26.0),
        GpuModel("RTX 4090", 24564, 450, 25, 2520, 4, 33.0),
        GpuModel("RTX 5070 Ti", 16303, 300, 18, 2452, 5, 36.0),
        GpuModel("RTX 4080 Super", 16376, 320, 20, 2550, 4, 44.0),
        GpuModel("RTX 3090", 24576, 350, 25, 1695, 4, 62.0),
        GpuModel("RTX 5060 Ti", 16311, 180, 12, 2572, 5, 70.0),
        GpuModel("RTX A6000", 49140, 300, 22, 1800, 4, 55.0),
    )
}

UNKNOWN_GPU = GpuModel("Unknown GPU", 16000, 250, 20, 2000, 4, 60.0)


@dataclass(frozen=True, slots=True)
class SimKnobs:
    """Simulation-only behaviour of one host."""

    noise_pct: float = 8.0  # per-proof time noise, standard deviation in %
    degrade_pct_per_hour: float = 0.0  # slows down under heat over time
    fail_rate: float = 0.0  # fraction of proofs that fail
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class Profile:
    gpu_name: str
    num_gpus: int
    gpu_ram_mb: int
    cpu_name: str
    cpu_cores: int  # logical cores the container may use
    cpu_ram_mb: int
    pcie_gen: int
    pcie_width: int  # lanes per GPU
    pcie_bw_gbps: float | None
    machine_id: int | None = None
    sim: SimKnobs = field(default_factory=SimKnobs)

    @property
    def gpu(self) -> GpuModel:
        return GPU_MODELS.get(self.gpu_name, UNKNOWN_GPU)

    @property
    def ram_total_bytes(self) -> int:
        return self.cpu_ram_mb * 1_000_000

    @classmethod
    def from_offer(cls, offer: dict[str, Any]) -> Profile:
        gpu_name = str(offer.get("gpu_name") or "RTX 4090")
        model = GPU_MODELS.get(gpu_name, UNKNOWN_GPU)
        sim = offer.get("sim") or {}
        return cls(
            gpu_name=gpu_name,
            num_gpus=int(offer.get("num_gpus") or 1),
            gpu_ram_mb=int(offer.get("gpu_ram") or model.memory_mb),
            cpu_name=str(offer.get("cpu_name") or "Simulated CPU"),
            cpu_cores=int(offer.get("cpu_cores_effective") or offer.get("cpu_cores") or 16),
            cpu_ram_mb=int(offer.get("cpu_ram") or 256_000),
            pcie_gen=int(offer.get("pci_gen") or model.pcie_gen_max),
            pcie_width=int(offer.get("gpu_lanes") or 16),
            pcie_bw_gbps=float(offer["pcie_bw"]) if offer.get("pcie_bw") else None,
            machine_id=int(offer["machine_id"]) if offer.get("machine_id") else None,
            sim=SimKnobs(
                noise_pct=float(sim.get("noise_pct", 8.0)),
                degrade_pct_per_hour=float(sim.get("degrade_pct_per_hour", 0.0)),
                fail_rate=float(sim.get("fail_rate", 0.0)),
                seed=sim.get("seed"),
            ),
        )


DEFAULT_PROFILE_OFFER: dict[str, Any] = {
    "gpu_name": "RTX 4090",
    "num_gpus": 1,
    "cpu_name": "AMD EPYC 7543 32-Core Processor",
    "cpu_cores_effective": 32,
    "cpu_ram": 257_000,
    "pci_gen": 4,
    "gpu_lanes": 16,
    "pcie_bw": 24.5,
}


def load_profile(environ: dict[str, str] | None = None) -> Profile:
    """The profile from ``VM_SIM_PROFILE`` (JSON offer), else a single RTX 4090."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_PROFILE)
    if not raw:
        return Profile.from_offer(DEFAULT_PROFILE_OFFER)
    return Profile.from_offer(orjson.loads(raw))


def time_scale(environ: dict[str, str] | None = None) -> float:
    """Simulated seconds per real second (``VM_SIM_TIME_SCALE``, default 1)."""
    env = os.environ if environ is None else environ
    try:
        value = float(env.get(ENV_TIME_SCALE, "1"))
    except ValueError:
        return 1.0
    return value if value > 0 else 1.0
