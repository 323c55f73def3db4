"""Hardware profiles for the simulation: which machine a simulated agent is on.

A profile is a vast.ai offer (the same field names and units as
docs/vast.md: ``gpu_ram`` and ``cpu_ram`` in MB, ``pcie_bw`` in GB/s)
plus an optional ``sim`` object of simulation-only knobs. The coordinator's
LocalProvider hands the offer it "deploys" to the agent as JSON in
``VM_SIM_PROFILE``; the simulated cuzk, the fake NVML and the fake host
probe all read the same profile, so their numbers agree with each other.

Everything here is simulated. Numbers derived from these tables are labelled
so wherever they are shown.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from vast_manager.agent.config import SIM_DEFAULTS
from vast_manager.common.hardware_facts import GPU_SPECS, GpuSpec, pcie_link_gbps

ENV_PROFILE = "VM_SIM_PROFILE"
ENV_STATE_FILE = "VM_SIM_STATE_FILE"
ENV_TIME_SCALE = "VM_SIM_TIME_SCALE"


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A simulated card: its spec sheet (``common/hardware_facts.py``, the one copy) and
    what the simulation adds to it."""

    name: str
    spec: GpuSpec
    tdp_w: float  # board power (vendor figure)
    idle_w: float
    boost_clock_mhz: int  # vendor figure
    # Seconds of GPU kernel time for one PoRep C2 32G proof (10 partitions)
    # when nothing else limits it. Simulated: scaled from the upstream note
    # "GPU takes ~3 s/partition" on cuzk's reference rig (an RTX 5070 Ti
    # class card) roughly by memory bandwidth (the MSMs and NTTs are
    # bandwidth-bound), then nudged so the operator's observed hosts land
    # near their rates (see sim/physics.py for the calibration).
    gpu_seconds_per_proof: float

    @property
    def memory_mb(self) -> int:
        return self.spec.memory_mb

    @property
    def pcie_gen_max(self) -> int:
        return self.spec.pcie_gen_max

    @property
    def pcie_width_max(self) -> int:
        """Lanes the card itself has (the 5060 Ti is an x8 card)."""
        return self.spec.pcie_lanes_max


def _card(name: str, tdp_w: float, idle_w: float, boost_clock_mhz: int,
          gpu_seconds_per_proof: float) -> GpuModel:
    return GpuModel(name, GPU_SPECS[name], tdp_w, idle_w, boost_clock_mhz,
                    gpu_seconds_per_proof)


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        _card("RTX 5090", 575, 30, 2407, 19.0),
        _card("RTX 4090", 450, 25, 2520, 30.0),
        _card("RTX 5070 Ti", 300, 18, 2452, 34.0),
        _card("RTX 4080 Super", 320, 20, 2550, 52.0),
        _card("RTX 3090", 350, 25, 1695, 48.0),
        _card("RTX 5060 Ti", 180, 12, 2572, 80.0),
        _card("RTX A6000", 300, 22, 1800, 46.0),
    )
}

#: A card the spec sheets do not list (simulated figures).
UNKNOWN_GPU = GpuModel("Unknown GPU", GpuSpec(600, 20.0, 16000, 0, 4), 250, 20, 2000, 60.0)

# Synthesis throughput of one logical core relative to a Zen 3 EPYC core
# (simulated; rounded from public per-thread integer benchmarks, since
# witness generation is SHA-256/Poseidon hashing and sparse mat-vec work).
# vast.ai counts logical cores (hyperthreads) in cpu_cores_effective.
# First match wins.
CPU_SPEED_TABLE: tuple[tuple[str, float], ...] = (
    (r"EPYC 9\d\d\d|EPYC 4\d\d\d|Ryzen \d+ [79]\d\d\d|Threadripper (PRO )?[79]\d\d\d", 1.25),
    (r"EPYC 7\w\w3|Ryzen \d+ 5\d\d\d|Threadripper (PRO )?5\d\d\d", 1.0),
    (r"EPYC 7\w\w2|Ryzen \d+ 3\d\d\d|Threadripper (PRO )?3\d\d\d", 0.85),
    (r"EPYC 7\w\w1", 0.7),
    (r"Core\(TM\) i[579]-1[2-4]\d\d\d|Core i[579]-1[2-4]\d\d\d|Xeon w[579]-", 1.1),
    (r"Xeon.*(Gold|Platinum|Silver) [68543][34]\d\d", 0.95),
    (r"Xeon.*(Gold|Platinum|Silver) [68543][12]\d\d", 0.8),
    (r"Xeon.*E5-\d+ v[34]", 0.6),
    (r"Xeon.*E5-\d+( v2)?\b", 0.5),
)
DEFAULT_CPU_SPEED = 0.9


def cpu_core_speed(cpu_name: str) -> float:
    """Relative synthesis speed of one logical core of ``cpu_name`` (simulated)."""
    for pattern, speed in CPU_SPEED_TABLE:
        if re.search(pattern, cpu_name, re.IGNORECASE):
            return speed
    return DEFAULT_CPU_SPEED


@dataclass(frozen=True, slots=True)
class SimKnobs:
    """Simulation-only behaviour of one host."""

    noise_pct: float = 8.0  # per-proof time noise, standard deviation in %
    degrade_pct_per_hour: float = 0.0  # slows down under heat over time
    fail_rate: float = 0.0  # fraction of proofs that fail
    seed: int | None = None
    cpu_speed: float | None = None  # overrides the CPU table (relative to a Zen 3 core)
    # MemTotal seen inside the container (the whole host's RAM) when the
    # container may use less (``cpu_ram``, its cgroup memory limit).
    host_ram_mb: int | None = None


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

    @property
    def mem_total_bytes(self) -> int:
        """MemTotal of /proc/meminfo in the container: the host's, whatever the limit."""
        host = (self.sim.host_ram_mb or 0) * 1_000_000
        return max(host, self.ram_total_bytes)

    @property
    def memory_limit_bytes(self) -> int | None:
        """The container's cgroup memory limit (``cpu_ram``), or None when MemTotal is all."""
        return self.ram_total_bytes if self.mem_total_bytes > self.ram_total_bytes else None

    @property
    def cpu_speed(self) -> float:
        """Relative synthesis speed of one logical core (simulated)."""
        if self.sim.cpu_speed is not None and self.sim.cpu_speed > 0:
            return self.sim.cpu_speed
        return cpu_core_speed(self.cpu_name)

    @property
    def pcie_link_gbps(self) -> float:
        """Theoretical link capacity per GPU and direction (generation x width), GB/s."""
        return pcie_link_gbps(self.pcie_gen, self.pcie_width)

    @property
    def upload_gbps(self) -> float:
        """What a host->GPU copy achieves: the link, or the host's own pcie_bw if lower."""
        link = self.pcie_link_gbps
        if self.pcie_bw_gbps is not None and 0 < self.pcie_bw_gbps < link:
            return self.pcie_bw_gbps
        return link

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
            # The link trains to what both the slot and the card support.
            pcie_gen=min(
                int(float(offer.get("pci_gen") or model.pcie_gen_max)), model.pcie_gen_max
            ),
            pcie_width=min(int(offer.get("gpu_lanes") or 16), model.pcie_width_max),
            pcie_bw_gbps=float(offer["pcie_bw"]) if offer.get("pcie_bw") else None,
            machine_id=int(offer["machine_id"]) if offer.get("machine_id") else None,
            sim=SimKnobs(
                noise_pct=float(sim.get("noise_pct", 8.0)),
                degrade_pct_per_hour=float(sim.get("degrade_pct_per_hour", 0.0)),
                fail_rate=float(sim.get("fail_rate", 0.0)),
                seed=int(sim["seed"]) if sim.get("seed") is not None else None,
                cpu_speed=float(sim["cpu_speed"]) if sim.get("cpu_speed") else None,
                host_ram_mb=int(sim["host_ram_mb"]) if sim.get("host_ram_mb") else None,
            ),
        )


DEFAULT_PROFILE_OFFER: dict[str, Any] = {
    "gpu_name": "RTX 4090",
    "num_gpus": 1,
    "cpu_name": "AMD EPYC 7502 32-Core Processor",
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
    """Simulated seconds per real second (``VM_SIM_TIME_SCALE``; its default declared in
    ``vast_manager.agent.config``)."""
    env = os.environ if environ is None else environ
    default = SIM_DEFAULTS.time_scale
    try:
        value = float(env.get(ENV_TIME_SCALE, default))
    except ValueError:
        return default
    return value if value > 0 else default
