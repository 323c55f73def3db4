"""Discovery on a simulated vast.ai market: the rate model's accuracy, and which policy
finds cheap proofs.

Run: ``python bench/discovery.py`` (5 seeds, 4 simulated weeks; a few minutes on two
cores), ``--quick`` for a smoke run, ``--seeds N --weeks W`` to change the run,
``--json-out FILE`` for the figures as JSON.

**The market (simulated).** Hundreds of machines, each with a GPU model and count,
a CPU, RAM, PCIe link and network drawn from what vast.ai lists, offering slices of
1, 2, 4 or all of their GPUs; an instance gets the slice's share of the host's
vCPUs and RAM. Machines are rented by others and come back, retire and are
replaced; prices drift day by day and jump when a machine is relisted. A host's
**true rate** (proofs/hour, steady state) is the project's simulated-cuzk hardware
model (``sim/physics.py``: ``capacities``, the closed-form bound its event
simulation runs into; the bench prints how close the two are) for the instance's
share, times hidden per-host effects the offer does not show: GPU clocks and power
limits, CPU speed (memory channels, turbo, background load), RAM the host keeps
for itself, a general factor, and, on a shared host, neighbours' load. A benchmark
measures the true rate with the neighbours of the moment and 4% noise. Offers
report vast.ai's fields: ``gpu_mem_bw`` and ``dlperf`` are measured per host, so
they carry a little of the hidden GPU effect; nothing reports the CPU's.

**A1: the model on held-out hosts.** Measurements of a random set of machines
train the model (``vast_manager.coordinator.discovery``); it predicts the true rates of other
machines' offers. Beside it: today's ranking (``coordinator.discovery.ranking``, the same GPU
model's median) and the noise floor: the error of an oracle that knows the
hardware model exactly but not the per-host effects (it predicts, from draws of
the effects for each host's hardware, the point with the least mean absolute
percentage error; the median of the draws is printed beside it).

**A2: policies on the live market**, each with the same target fleet rate, the same
minimum-rate verdict (``dph_total / 0.008``), caps and offers: the oracle (knows
every true rate), the operator's manual variety, cheapest-first, today's ranking
and the planner (``vast_manager.coordinator.discovery.plan`` driven by
``vast_manager.coordinator.discovery.autopilot_rules``). Every deploy is a trial: parameter fetch,
warm-up and a 12-proof benchmark, paid at the offer's price.

Every number printed is simulated and computed by this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vast_manager.common.hardware_facts import GPU_SPECS
from vast_manager.coordinator.decisions.early_verdict import steady_state_rate_per_hour
from vast_manager.coordinator.decisions.share import instance_share, ram_class
from vast_manager.coordinator.discovery.autopilot_rules import (
    AutopilotCaps,
    FleetInstance,
    Ledger,
    decide,
    plan_reference_usd_per_proof,
)
from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.discovery.plan import (
    FleetView,
    Plan,
    PlanSettings,
    belief_tests,
    evaluate_offer,
    plan_trials,
    reference_usd_per_proof,
)
from vast_manager.coordinator.discovery.structural_model import (
    Z80,
    Prediction,
    RateModel,
    Unpredictable,
    fit_rate_model,
)
from vast_manager.coordinator.offers import parse_offer
from vast_manager.sim.hardware import Profile, cpu_core_speed
from vast_manager.sim.physics import capacities, run_batch

MAX_USD_PER_PROOF = 0.008
FLOOR_DRAWS = 63
HOUR_S = 3600.0
DAY_H = 24

# --- the market's hardware -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuMarket:
    """A GPU model as vast.ai rents it: share of machines, $/GPU-hour, GPUs per machine."""

    name: str
    weight: float
    usd_per_gpu_hour: float  # median on-demand price of one GPU
    host_gpus: tuple[tuple[int, float], ...]  # (GPUs in the machine, share of machines)


# Typical on-demand prices per GPU on vast.ai; multi-GPU machines are the rule for
# the data-centre cards, single and dual for the newest consumer ones.
GPUS: tuple[GpuMarket, ...] = (
    GpuMarket("RTX 5090", 0.14, 0.62, ((1, 0.45), (2, 0.25), (4, 0.15), (8, 0.15))),
    GpuMarket("RTX 4090", 0.24, 0.36, ((1, 0.30), (2, 0.20), (4, 0.20), (8, 0.30))),
    GpuMarket("RTX 5070 Ti", 0.12, 0.17, ((1, 0.50), (2, 0.30), (4, 0.20))),
    GpuMarket("RTX 4080 Super", 0.10, 0.20, ((1, 0.40), (2, 0.30), (4, 0.20), (8, 0.10))),
    GpuMarket("RTX 3090", 0.20, 0.20, ((1, 0.25), (2, 0.25), (4, 0.25), (8, 0.25))),
    GpuMarket("RTX 5060 Ti", 0.12, 0.09, ((1, 0.35), (2, 0.30), (4, 0.20), (8, 0.15))),
    GpuMarket("RTX A6000", 0.08, 0.42, ((1, 0.20), (2, 0.30), (4, 0.25), (8, 0.25))),
)


@dataclass(frozen=True, slots=True)
class Cpu:
    name: str
    threads: int  # logical cores of one socket
    ghz: float
    platform: str  # desktop, workstation, server
    pcie_gen: int


CPUS: tuple[Cpu, ...] = (
    Cpu("AMD Ryzen 9 5950X 16-Core Processor", 32, 3.4, "desktop", 4),
    Cpu("AMD Ryzen 9 7950X 16-Core Processor", 32, 4.5, "desktop", 5),
    Cpu("AMD Ryzen 7 5800X 8-Core Processor", 16, 3.8, "desktop", 4),
    Cpu("13th Gen Intel(R) Core(TM) i9-13900K", 32, 3.0, "desktop", 5),
    Cpu("12th Gen Intel(R) Core(TM) i7-12700K", 20, 3.6, "desktop", 5),
    Cpu("AMD Ryzen Threadripper PRO 5975WX 32-Cores", 64, 3.6, "workstation", 4),
    Cpu("AMD Ryzen Threadripper PRO 3975WX 32-Cores", 64, 3.5, "workstation", 4),
    Cpu("Intel(R) Xeon(R) w7-3465X", 56, 2.5, "workstation", 5),
    Cpu("AMD EPYC 7302 16-Core Processor", 32, 3.0, "server", 4),
    Cpu("AMD EPYC 7502 32-Core Processor", 64, 2.5, "server", 4),
    Cpu("AMD EPYC 7K62 48-Core Processor", 96, 2.6, "server", 4),
    Cpu("AMD EPYC 7543 32-Core Processor", 64, 2.8, "server", 4),
    Cpu("AMD EPYC 7713 64-Core Processor", 128, 2.0, "server", 4),
    Cpu("AMD EPYC 7763 64-Core Processor", 128, 2.45, "server", 4),
    Cpu("AMD EPYC 9354 32-Core Processor", 64, 3.25, "server", 5),
    Cpu("AMD EPYC 9554 64-Core Processor", 128, 3.1, "server", 5),
    Cpu("Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", 40, 2.5, "server", 3),
    Cpu("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 64, 2.9, "server", 4),
    Cpu("Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz", 28, 2.6, "server", 3),
)

# Host RAM (GB) by platform and GPU count: desktops top out at 128-192 GB, servers
# carry 32-256 GB per GPU.
RAM_GB: dict[str, tuple[int, ...]] = {
    "desktop": (64, 128, 128, 192),
    "workstation": (256, 256, 512),
    "server": (256, 512, 512, 1024, 2048),
}
LOCATIONS = ("Quebec, CA", "Texas, US", "Oregon, US", "England, GB", "Denmark, DK",
             "Poland, PL", "Illinois, US", "Nevada, US", "Japan, JP", "Germany, DE")


@dataclass(frozen=True, slots=True)
class Hidden:
    """A host's effects that no offer field shows."""

    gpu_mult: float  # clocks, power limit, cooling
    cpu_mult: float  # memory channels, turbo, background load
    ram_kept: float  # share of the instance's RAM the host keeps for itself
    general: float  # drivers, everything else

    @classmethod
    def draw(cls, rng: random.Random) -> Hidden:
        return cls(
            gpu_mult=math.exp(rng.gauss(0.0, 0.08)) * (0.75 if rng.random() < 0.06 else 1.0),
            cpu_mult=math.exp(rng.gauss(0.0, 0.10)),
            ram_kept=rng.uniform(0.0, 0.08),
            general=math.exp(rng.gauss(0.0, 0.04)),
        )


@dataclass(slots=True)
class Machine:
    """One simulated vast.ai machine and its hidden truth."""

    machine_id: int
    gpu: GpuMarket
    host_gpus: int
    cpu: Cpu
    sockets: int
    ram_gb: float
    pci_gen: int
    lanes: tuple[int, ...]  # per slice size: lanes each GPU of the slice gets
    pcie_eff: float  # measured pcie_bw / link
    inet_down: float
    disk_bw: float
    reliability: float
    geolocation: str
    base_usd_per_gpu: float
    hidden: Hidden
    mem_bw_obs: float = 1.0  # measured gpu_mem_bw / spec
    dlperf_obs: float = 1.0  # measured dlperf / class figure
    log_price: float = 0.0  # today's deviation from the base price
    rates: dict[int, float] = field(default_factory=dict)  # true rate per slice, once known
    available: bool = True
    ours: bool = False

    @property
    def cores(self) -> int:
        return self.cpu.threads * self.sockets

    def slices(self) -> tuple[int, ...]:
        return slice_sizes(self.host_gpus)

    def offer(self, k: int, offer_id: int, price_factor: float) -> dict[str, Any]:
        """The offer for a k-GPU slice, in vast.ai's shape (whole-host cpu_cores, cpu_ram)."""
        spec = GPU_SPECS[self.gpu.name]
        lanes = self.lanes[self.slices().index(k)]
        gen = min(self.pci_gen, spec.pcie_gen_max)
        link = _link(gen, min(lanes, spec.pcie_lanes_max))
        dph = self.price(k, price_factor)
        share = k / self.host_gpus
        return {
            "id": offer_id,
            "machine_id": self.machine_id,
            "host_id": self.machine_id // 7,
            "num_gpus": k,
            "gpu_name": self.gpu.name,
            "gpu_ram": spec.memory_mb,
            "gpu_total_ram": spec.memory_mb * k,
            "gpu_mem_bw": round(spec.mem_bw_gbps * self.mem_bw_obs, 1),
            "total_flops": round(spec.fp32_tflops * k, 1),
            "dlperf": round(_class_dlperf(self.gpu.name) * k * self.dlperf_obs, 1),
            "compute_cap": spec.compute_cap,
            "gpu_arch": "nvidia",
            "cpu_name": self.cpu.name,
            "cpu_cores": self.cores,
            "cpu_cores_effective": round(self.cores * share, 1),
            "cpu_ghz": self.cpu.ghz,
            "cpu_ram": round(self.ram_gb * 1000 * 1.004),
            "disk_space": 1000.0,
            "disk_bw": round(self.disk_bw),
            "pci_gen": gen,
            "gpu_lanes": lanes,
            "pcie_bw": round(link * self.pcie_eff, 1),
            "inet_down": round(self.inet_down),
            "inet_up": round(self.inet_down / 2),
            "dph_total": round(dph, 4),
            "reliability": self.reliability,
            "cuda_max_good": 13.0,
            "verification": "verified",
            "rentable": True,
            "rented": False,
            "geolocation": self.geolocation,
            "duration": 30 * 86400.0,
        }

    def price(self, k: int, factor: float) -> float:
        """Today's dph_total of a k-GPU slice (storage included)."""
        return k * self.base_usd_per_gpu * math.exp(self.log_price) * factor + 0.012

    def true_rate(self, k: int, hidden: Hidden | None = None) -> float:
        """Steady-state proofs/hour of a k-GPU slice with this host's hidden effects, or
        with ``hidden`` instead (simulated)."""
        if hidden is None and k in self.rates:
            return self.rates[k]
        h = hidden or self.hidden
        caps = capacities(self.profile(k, h))
        rate = min(caps.gpu * h.gpu_mult, caps.cpu, caps.pcie, caps.memory)
        a = self.neighbour_load(k)
        neighbours = (1.0 - math.exp(-a)) / a if a > 0 else 1.0  # mean of exp(-a U)
        if hidden is None:
            self.rates[k] = rate * h.general * neighbours
        return rate * h.general * neighbours

    def binding(self, k: int) -> str:
        """The resource that binds a k-GPU slice's true rate: the least of the capacities
        (the one whose doubling would raise the rate most)."""
        h = self.hidden
        caps = capacities(self.profile(k, h))
        limits = {"gpu": caps.gpu * h.gpu_mult, "cpu": caps.cpu, "pcie": caps.pcie,
                  "memory": caps.memory}
        return min(limits, key=lambda r: limits[r])

    def profile(self, k: int, h: Hidden) -> Profile:
        """The simulated cuzk's hardware profile of a k-GPU slice (the instance's share)."""
        spec = GPU_SPECS[self.gpu.name]
        lanes = self.lanes[self.slices().index(k)]
        gen = min(self.pci_gen, spec.pcie_gen_max)
        share = k / self.host_gpus
        return Profile.from_offer({
            "gpu_name": self.gpu.name, "num_gpus": k, "cpu_name": self.cpu.name,
            "cpu_cores_effective": max(1, round(self.cores * share)),
            "cpu_ram": self.ram_gb * 1000 * share * (1.0 - h.ram_kept),
            "pci_gen": gen, "gpu_lanes": lanes,
            "pcie_bw": _link(gen, min(lanes, spec.pcie_lanes_max)) * self.pcie_eff,
            "sim": {"noise_pct": 0.0, "cpu_speed": cpu_core_speed(self.cpu.name) * h.cpu_mult},
        })

    def neighbour_load(self, k: int) -> float:
        """The slowdown a full neighbour load costs a k-GPU slice (0 when the host is ours)."""
        return 0.15 * (1.0 - k / self.host_gpus)

    def measure(self, k: int, rng: random.Random) -> float:
        """One benchmark: the true rate under this hour's neighbours, with 4% noise."""
        a = self.neighbour_load(k)
        neighbours = math.exp(-a * rng.random())
        mean = (1.0 - math.exp(-a)) / a if a > 0 else 1.0
        return self.true_rate(k) * neighbours / mean * math.exp(rng.gauss(0.0, 0.04))


def slice_sizes(host_gpus: int) -> tuple[int, ...]:
    """The GPU counts a machine lists offers for: 1, 2, 4 below its size, and all of it."""
    return (*(k for k in (1, 2, 4) if k < host_gpus), host_gpus)


def _link(gen: int, lanes: int) -> float:
    per_lane = {3: 0.985, 4: 1.969, 5: 3.938}[gen]
    return per_lane * lanes


def _class_dlperf(name: str) -> float:
    spec = GPU_SPECS[name]
    return round(spec.fp32_tflops**0.6 * (spec.mem_bw_gbps / 10) ** 0.4, 1)


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, float]]) -> Any:
    total = sum(w for _, w in weighted)
    x = rng.random() * total
    for item, w in weighted:
        x -= w
        if x <= 0:
            return item
    return weighted[-1][0]


def new_machine(machine_id: int, rng: random.Random) -> Machine:
    """A machine drawn from the market's hardware mix."""
    gpu = _pick(rng, [(g, g.weight) for g in GPUS])
    host_gpus = _pick(rng, list(gpu.host_gpus))
    platform = "desktop" if host_gpus <= 2 and rng.random() < 0.55 else (
        "workstation" if host_gpus <= 4 and rng.random() < 0.4 else "server")
    cpu = rng.choice([c for c in CPUS if c.platform == platform])
    sockets = 2 if platform == "server" and host_gpus >= 4 and rng.random() < 0.5 else 1
    ram = float(rng.choice(RAM_GB[platform]))
    if platform == "server":
        ram = max(ram, 64.0 * host_gpus) if rng.random() < 0.5 else ram
    # Lanes per GPU for each slice size: desktops split x16 into x8 for two cards;
    # some multi-GPU rigs sit on x4 or x1 risers.
    if platform == "desktop":
        per_gpu = 16 if host_gpus == 1 else 8
    elif host_gpus >= 4 and rng.random() < 0.15:
        per_gpu = rng.choice((1, 4, 4))
    else:
        per_gpu = 16
    lanes = tuple(16 if (platform == "desktop" and k == 1) else per_gpu
                  for k in slice_sizes(host_gpus))
    degraded = rng.random() < 0.05
    price = gpu.usd_per_gpu_hour * math.exp(rng.gauss(0.0, 0.18))
    if platform == "server":
        price *= 1.05
    return Machine(
        machine_id=machine_id,
        gpu=gpu,
        host_gpus=host_gpus,
        cpu=cpu,
        sockets=sockets,
        ram_gb=ram,
        pci_gen=cpu.pcie_gen,
        lanes=lanes,
        pcie_eff=rng.uniform(0.70, 0.92) * (0.4 if degraded else 1.0),
        inet_down=math.exp(rng.gauss(math.log(800), 0.7)),
        disk_bw=math.exp(rng.gauss(math.log(2500), 0.5)),
        reliability=round(min(0.9995, 1 - math.exp(rng.gauss(math.log(0.015), 0.7))), 4),
        geolocation=rng.choice(LOCATIONS),
        base_usd_per_gpu=price,
        hidden=Hidden.draw(rng),
    )


def _observe(m: Machine, rng: random.Random) -> Machine:
    # vast.ai measures gpu_mem_bw and dlperf on the host: they see a little of the
    # GPU's hidden effect (clocks, power limit), through their own noise.
    m.mem_bw_obs = m.hidden.gpu_mult**0.3 * math.exp(rng.gauss(0.0, 0.03))
    m.dlperf_obs = m.hidden.gpu_mult**0.6 * math.exp(rng.gauss(0.0, 0.05))
    return m


def machines(n: int, rng: random.Random, first_id: int = 50_000) -> list[Machine]:
    return [_observe(new_machine(first_id + i, rng), rng) for i in range(n)]


# --- A1: the model on held-out hosts --------------------------------------------------------


def mdape(pred: Sequence[float], true: Sequence[float]) -> float:
    return statistics.median(abs(p - t) / t for p, t in zip(pred, true, strict=True))


def ape_point(rates: Sequence[float]) -> float:
    """The point with the least mean absolute percentage error over ``rates``: their
    median weighted by 1/rate (the point the rate model gives, for the error A1 measures
    it by; the plain median is not the best guess under a percentage error)."""
    ordered = sorted(rates)
    weights = [1.0 / r for r in ordered]
    half, acc = sum(weights) / 2, 0.0
    for r, w in zip(ordered, weights, strict=True):
        acc += w
        if acc >= half:
            return r
    return ordered[-1]


def _measurement(m: Machine, k: int, rng: random.Random, t: float) -> Measurement:
    """One benchmark of machine m's k-GPU slice, kept with the offer as deployed."""
    offer = m.offer(k, m.machine_id * 10 + k, 1.0)
    return Measurement(str(m.machine_id), parse_offer(offer), m.measure(k, rng), t, "fleet")


#: The least RAM share the coordinator deploys and predicts (``VM_MIN_INSTANCE_RAM_GB``'s
#: default): the offers table marks a smaller one too small, with no prediction.
MIN_INSTANCE_RAM_GB = 128.0
SUBSETS = ("deployable", "all")


@dataclass(slots=True)
class AccuracyRow:
    subset: str  # deployable: offers the coordinator predicts; all: every held-out offer
    measurements: int
    train_machines: int
    offers: int
    floor: float  # MdAPE of the hardware oracle that does not know the host
    floor_median: float  # the same oracle guessing the median of the hidden effects' rates
    model: float
    gpu_median: float  # the GPU-model median, on the offers it predicts
    gpu_median_covered: float  # share of held-out offers the GPU-model median predicts
    model_same_subset: float  # the model's MdAPE on those same offers
    coverage: float  # share of true rates inside the model's 80% interval
    width: float  # median high/low ratio of the intervals
    fit_s: float
    baseline_s: float  # the GPU-model median on the same offers, same run


def accuracy(seed: int, n_measurements: int, test_machines: int = 400
             ) -> dict[str, AccuracyRow]:
    """Train on ``n_measurements`` of random machines (one to three runs each, on one or
    two of their slices); predict other machines' true rates. One row for the held-out
    offers the coordinator would predict (their instance's RAM share at least
    ``MIN_INSTANCE_RAM_GB``), one for all of them."""
    rng = random.Random(seed)
    ms: list[Measurement] = []
    train_machines = 0
    next_id = 50_000
    while len(ms) < n_measurements:
        m = _observe(new_machine(next_id, rng), rng)
        next_id += 1
        train_machines += 1
        for _ in range(min(rng.choice((1, 1, 2, 3)), n_measurements - len(ms))):
            ms.append(_measurement(m, rng.choice(m.slices()), rng, 0.0))
    test = machines(test_machines, rng, first_id=next_id)
    t0 = time.perf_counter()
    model = fit_rate_model(ms)
    fit_s = time.perf_counter() - t0
    offers, true, floor_pred, floor_median = [], [], [], []
    floor_rng = random.Random(seed + 7919)
    for m in test:
        k = rng.choice(m.slices())
        offers.append(m.offer(k, m.machine_id * 10 + k, 1.0))
        true.append(m.true_rate(k))
        # The floor's oracle knows the hardware model exactly and how hidden effects are
        # distributed, not this host's: its best guess under the error measured is the
        # point with the least mean absolute percentage error over them.
        draws = [m.true_rate(k, Hidden.draw(floor_rng)) for _ in range(FLOOR_DRAWS)]
        floor_pred.append(ape_point(draws))
        floor_median.append(statistics.median(draws))
    preds = [p for p in model.predict_offers([parse_offer(o) for o in offers], explain=False)
             if isinstance(p, Prediction)]
    assert len(preds) == len(offers)
    # The GPU-model median (same machine's, else the same GPU model and count's
    # elsewhere), on the same measurements.
    t0 = time.perf_counter()
    rule = Medians(ms, ram_classes=False)
    baseline = [rule.predict(o) for o in offers]
    baseline_s = time.perf_counter() - t0
    out = {}
    for subset in SUBSETS:
        keep = [subset == "all"
                or (instance_share(parse_offer(o)).ram_gb or 0.0) >= MIN_INSTANCE_RAM_GB
                for o in offers]
        sel = [i for i, k in enumerate(keep) if k]
        tr = [true[i] for i in sel]
        ps = [preds[i] for i in sel]
        covered = [(b, preds[i].rate_per_hour, true[i]) for i in sel
                   if (b := baseline[i]) is not None]
        out[subset] = AccuracyRow(
            subset=subset,
            measurements=len(ms),
            train_machines=train_machines,
            offers=len(sel),
            floor=mdape([floor_pred[i] for i in sel], tr),
            floor_median=mdape([floor_median[i] for i in sel], tr),
            model=mdape([float(p.rate_per_hour or 0.0) for p in ps], tr),
            gpu_median=mdape([c[0] for c in covered], [c[2] for c in covered]) if covered
            else math.nan,
            gpu_median_covered=len(covered) / len(sel),
            model_same_subset=mdape([c[1] for c in covered], [c[2] for c in covered])
            if covered else math.nan,
            coverage=sum(p.rate_low <= t <= p.rate_high for p, t in zip(ps, tr, strict=True))
            / len(tr),
            width=statistics.median(p.rate_high / p.rate_low for p in ps),
            fit_s=fit_s,
            baseline_s=baseline_s,
        )
    return out


class Medians:
    """The rule ``coordinator.discovery.ranking`` predicted with before the rate model, the
    baseline: this machine's median (host_perf), else the median of the same GPU model and
    count on other machines (with ``ram_classes``, only those whose instances had RAM of
    the same class: under 240, 240-360, 360 GB or more, as the coordinator did), else the
    same model's single-GPU median x count x 0.75, else nothing."""

    SCALING = 0.75

    def __init__(self, ms: Sequence[Measurement], *, ram_classes: bool = True) -> None:
        self.ram_classes = ram_classes
        runs: dict[tuple[str, str, int], list[float]] = {}
        ram: dict[tuple[str, int], float | None] = {}
        for m in ms:
            key = (m.machine_id, str(m.offer.gpu_name), int(m.offer.num_gpus or 0))
            runs.setdefault(key, []).append(m.rate_per_hour)
            ram[(m.machine_id, key[2])] = instance_share(m.offer).ram_gb
        self.own = {k: statistics.median(r) for k, r in runs.items()}
        self.by_model: dict[tuple[str, int], list[tuple[str, float, int | None]]] = {}
        for (mid, gpu, n), rate in self.own.items():
            self.by_model.setdefault((gpu, n), []).append((mid, rate, ram_class(ram[(mid, n)])))

    def _elsewhere(self, gpu: str, n: int, machine: str, klass: int | None) -> list[float]:
        return [r for mid, r, their in self.by_model.get((gpu, n), ())
                if mid != machine and (klass is None or their in (None, klass))]

    def predict(self, offer: dict[str, Any]) -> float | None:
        machine, gpu, n = str(offer["machine_id"]), str(offer["gpu_name"]), int(offer["num_gpus"])
        if (machine, gpu, n) in self.own:
            return self.own[(machine, gpu, n)]
        klass = (ram_class(instance_share(parse_offer(offer)).ram_gb) if self.ram_classes
                 else None)
        others = self._elsewhere(gpu, n, machine, klass)
        if others:
            return statistics.median(others)
        if n > 1:
            single = self.own.get((machine, gpu, 1))
            singles = [single] if single else self._elsewhere(gpu, 1, "", klass)
            if singles:
                return statistics.median(singles) * n * self.SCALING
        return None



# --- A2: policies on the live market ---------------------------------------------------------

TARGET_RATE_PER_HOUR = 400.0
CAPS = AutopilotCaps(target_rate_per_hour=TARGET_RATE_PER_HOUR, max_dph_total=4.0,
                     max_instances=12, max_explore_share=0.15, max_concurrent_trials=2)
SETTINGS = PlanSettings(max_usd_per_proof=MAX_USD_PER_PROOF, trials=6)
# Hourly chances a machine changes state: rented by someone else, back on the market,
# offline (every tenant loses it), retired for good.
P_RENTED = 1 / 36
P_RELISTED = 1 / 48
P_OFFLINE = 1 / (21 * 24)
P_BACK_ONLINE = 1 / 12
P_RETIRE = 1 / (60 * 24)


def default_filter(offer: dict[str, Any]) -> bool:
    """The original manager's search (``dph<=0.9 cpu_ram>=240 cpu_cores>25 ...``), as
    vast.ai applies it: cpu_ram and cpu_cores are whole-host figures. (The project's own
    default, ``filters.DEFAULT_FILTER``, asks for what the instance gets instead; the
    market keeps the wider search, so every policy meets the small slices too.)"""
    return (offer["dph_total"] <= 0.9 and offer["cpu_ram"] >= 240_000
            and offer["cpu_cores"] > 25 and offer["inet_down"] > 100
            and offer["gpu_ram"] > 12_500 and offer["disk_space"] >= 250)


class Market:
    """The machines over time: who is listed, at what price. Its own random stream, so
    every policy of a seed sees the same market whatever it rents."""

    def __init__(self, seed: int, n_machines: int) -> None:
        self.rng = random.Random(seed * 1_000_003 + 17)
        self.machines: dict[int, Machine] = {m.machine_id: m for m in machines(n_machines,
                                                                               self.rng)}
        self.state = {mid: ("available" if self.rng.random() < 0.45 else "rented")
                      for mid in self.machines}
        self.gpu_log_price = {g.name: 0.0 for g in GPUS}
        self.next_id = max(self.machines) + 1
        self.listing: dict[tuple[int, int], dict[str, Any]] = {}  # offers without the price

    def step(self, hour: int) -> None:
        rng = self.rng
        for mid in list(self.machines):
            m = self.machines[mid]
            state = self.state[mid]
            if rng.random() < P_RETIRE:
                del self.machines[mid], self.state[mid]
                new = _observe(new_machine(self.next_id, rng), rng)
                self.next_id += 1
                self.machines[new.machine_id] = new
                self.state[new.machine_id] = "available"
                continue
            if state != "offline" and rng.random() < P_OFFLINE:
                self.state[mid] = "offline"
            elif state == "offline" and rng.random() < P_BACK_ONLINE:
                self.state[mid] = "available"
                m.log_price += rng.gauss(0.0, 0.05)
            elif state == "available" and rng.random() < P_RENTED:
                self.state[mid] = "rented"
            elif state == "rented" and rng.random() < P_RELISTED:
                self.state[mid] = "available"
                m.log_price += rng.gauss(0.0, 0.05)  # a relisted machine is repriced
        if hour % DAY_H == 0:
            for m in self.machines.values():
                m.log_price = 0.8 * m.log_price + rng.gauss(0.0, 0.03)
            for g in self.gpu_log_price:
                self.gpu_log_price[g] += rng.gauss(0.0, 0.02)

    def offers(self, taken: set[int], bad: set[int]) -> list[dict[str, Any]]:
        out = []
        for mid, m in self.machines.items():
            if self.state[mid] != "available" or mid in taken or mid in bad:
                continue
            factor = math.exp(self.gpu_log_price[m.gpu.name])
            for i, k in enumerate(m.slices()):
                key = (mid, k)
                if key not in self.listing:
                    self.listing[key] = m.offer(k, mid * 10 + i, 1.0)
                offer = dict(self.listing[key])
                offer["dph_total"] = round(m.price(k, factor), 4)
                if default_filter(offer):
                    out.append(offer)
        return out

    def lost(self, mid: int) -> bool:
        return mid not in self.machines or self.state[mid] == "offline"


@dataclass(slots=True)
class Rental:
    instance_id: str
    machine: Machine
    offer: dict[str, Any]
    dph: float
    start_h: float
    trial_end_h: float
    true_rate: float
    end_h: float | None = None
    measured: float | None = None  # set at the verdict
    expected: float | None = None

    @property
    def k(self) -> int:
        return int(self.offer["num_gpus"])

    def proving_at(self, h: float) -> bool:
        return self.measured is not None and self.trial_end_h <= h and (
            self.end_h is None or h < self.end_h)

    def spend_until(self, h: float) -> tuple[float, float, float]:
        """(trial $, proving $, proofs) from the start until hour h (simulated)."""
        end = h if self.end_h is None else min(h, self.end_h)
        trial_end = min(self.trial_end_h, end)
        trial = self.dph * max(0.0, trial_end - self.start_h)
        proving_h = max(0.0, end - self.trial_end_h) if self.measured is not None else 0.0
        return trial, self.dph * proving_h, self.true_rate * proving_h


@dataclass(slots=True)
class RunStats:
    policy: str
    hours: list[int] = field(default_factory=list)
    usd_per_proof: list[float] = field(default_factory=list)  # the proving fleet, this hour
    fleet_rate: list[float] = field(default_factory=list)
    trials_so_far: list[int] = field(default_factory=list)
    cum_usd: list[float] = field(default_factory=list)  # spend until the end of this hour
    cum_proofs: list[float] = field(default_factory=list)
    total_usd: float = 0.0
    trial_usd: float = 0.0
    proofs: float = 0.0
    trials: int = 0
    kept: int = 0
    failed_verdict: int = 0
    lost: int = 0
    trimmed: int = 0

    @property
    def cumulative_usd_per_proof(self) -> float:
        return self.total_usd / self.proofs if self.proofs else math.inf


class Policy:
    """Chooses the plan the shared decision core acts on (``autopilot.decide``)."""

    name = "?"
    explore = True

    def observe(self, m: Measurement, h: int) -> None:
        pass

    def plan(self, offers: list[dict[str, Any]], fleet: list[FleetInstance], h: int,
             sim: FleetSim) -> Plan:
        raise NotImplementedError

    def fleet_rate_of(self, r: Rental) -> float | None:
        return r.measured


def _prediction(rate: float, log_sd: float) -> Prediction:
    """A bare prediction (no explanation) for the baselines' and the oracle's plans."""
    mu = math.log(rate)
    return Prediction(
        rate_per_hour=rate, rate_low=math.exp(mu - Z80 * log_sd),
        rate_high=math.exp(mu + Z80 * log_sd), log_rate_mean=mu, log_rate_sd=log_sd,
        bottleneck="gpu", capacities_per_hour={}, reference_rate_per_hour=rate,
        contributions=(), machine_runs=0, novelty=(), assumed=(), basis="",
    )


class _Cached:
    """The model's predictions kept per machine and slice until the next fit (they do
    not depend on the price, which moves)."""

    def __init__(self, model: RateModel) -> None:
        self.model = model
        self.memo: dict[tuple[str | None, int | None], Prediction | Unpredictable] = {}

    def predict_offers(self, offers: Sequence[Any], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        if explain:
            return self.model.predict_offers(offers, explain=True)
        missing = [o for o in offers if (o.machine_id, o.num_gpus) not in self.memo]
        for o, p in zip(missing, self.model.predict_offers(missing, explain=False), strict=True):
            self.memo[(o.machine_id, o.num_gpus)] = p
        return [self.memo[(o.machine_id, o.num_gpus)] for o in offers]


class _Fixed:
    """A Predictor over given predictions (offer id -> Prediction)."""

    def __init__(self, by_id: dict[int, Prediction]) -> None:
        self.by_id = by_id

    def predict_offers(self, offers: Sequence[Any], *, explain: bool = True
                       ) -> list[Prediction | Unpredictable]:
        return [self.by_id[o.id] for o in offers]


def _ordered_plan(offers: list[dict[str, Any]], rates: list[float], fleet: FleetView) -> Plan:
    """A plan that lists offers in the given order (the baselines' own choice)."""
    props = tuple(
        p for o, r in zip(offers[:SETTINGS.trials], rates, strict=False)
        if (p := evaluate_offer(parse_offer(o), _prediction(r, 0.3), fleet, SETTINGS))
        is not None
    )
    return Plan(props, len(offers), len(props),
                reference_usd_per_proof(fleet, SETTINGS), "baseline order")


class Oracle(Policy):
    """Knows every host's true rate; plans exactly like the planner, without doubt."""

    name = "oracle"

    def plan(self, offers, fleet, h, sim):  # type: ignore[no-untyped-def]
        true = {o["id"]: sim.market.machines[o["machine_id"]].true_rate(o["num_gpus"])
                for o in offers}
        ref = plan_reference_usd_per_proof(fleet, [(str(o["machine_id"]), o["dph_total"],
                                              true[o["id"]]) for o in offers],
                                     CAPS.target_rate_per_hour, MAX_USD_PER_PROOF)
        view = FleetView(reference_usd_per_proof=ref)
        return plan_trials([parse_offer(o) for o in offers],
                           _Fixed({i: _prediction(r, 1e-4) for i, r in true.items()}),
                           view, SETTINGS)

    def fleet_rate_of(self, r: Rental) -> float | None:
        return r.true_rate if r.measured is not None else None


class Planner(Policy):
    """The rate model and the plan (coordinator.discovery), refitted after every result."""

    name = "planner"
    #: The plan's settings (``--belief-test-share`` sets its belief tests, as the
    #: operator's VM_PLAN_BELIEF_TEST_SHARE does; the oracle plans without them).
    settings = SETTINGS

    def __init__(self) -> None:
        self.measurements: list[Measurement] = []
        self.model: RateModel = fit_rate_model([])
        self.cache = _Cached(self.model)

    def observe(self, m: Measurement, h: int) -> None:
        self.measurements.append(m)
        self.model = fit_rate_model(self.measurements, now=h * HOUR_S)
        self.cache = _Cached(self.model)

    def plan(self, offers, fleet, h, sim):  # type: ignore[no-untyped-def]
        parsed = [parse_offer(o) for o in offers]
        preds = self.cache.predict_offers(parsed, explain=False)
        supply = [(str(o["machine_id"]), o["dph_total"], p.rate_per_hour)
                  for o, p in zip(offers, preds, strict=True) if isinstance(p, Prediction)]
        ref = plan_reference_usd_per_proof(fleet, supply, CAPS.target_rate_per_hour,
                                     MAX_USD_PER_PROOF)
        return plan_trials(parsed, self.cache, FleetView(reference_usd_per_proof=ref),
                           self.settings)


class MediansPolicy(Policy):
    """Ranking as it was before the rate model (``Medians``): best predicted $/proof first,
    unknown offers after, cheapest first; at the target it tries a ranked offer only when
    it is predicted 20% cheaper per proof than the fleet's worst."""

    name = "medians"

    def __init__(self) -> None:
        self.measurements: list[Measurement] = []
        self.rule = Medians([])

    def observe(self, m: Measurement, h: int) -> None:
        self.measurements.append(m)
        self.rule = Medians(self.measurements)

    def plan(self, offers, fleet, h, sim):  # type: ignore[no-untyped-def]
        predicted = [(o, self.rule.predict(o)) for o in offers]
        predicted.sort(key=lambda x: (x[1] is None, x[0]["dph_total"] / x[1] if x[1]
                                      else x[0]["dph_total"]))
        proving = [i for i in fleet if not i.on_trial]
        at_target = sum(i.rate_per_hour or 0 for i in proving) >= CAPS.target_rate_per_hour
        worst = max((i.usd_per_proof for i in proving), default=math.inf)
        chosen, rates = [], []
        for o, rate in predicted:
            usd = o["dph_total"] / rate if rate else None
            if usd is not None and usd > MAX_USD_PER_PROOF:
                continue
            if at_target and (usd is None or usd > 0.8 * worst):
                continue
            chosen.append(o)
            rates.append(rate or 40.0 * o["num_gpus"])
        return _ordered_plan(chosen, rates, FleetView())


class Cheapest(Policy):
    """A generic cloud launcher: the cheapest offer that passes the search filter."""

    name = "cheapest"
    explore = False

    def plan(self, offers, fleet, h, sim):  # type: ignore[no-untyped-def]
        chosen = sorted(offers, key=lambda o: o["dph_total"])
        return _ordered_plan(chosen, [40.0 * o["num_gpus"] for o in chosen], FleetView())


class Variety(Policy):
    """The operator's manual variety: the GPU configuration tried least so far, its
    cheapest offer; every configuration once before any twice."""

    name = "variety"
    explore = False

    def __init__(self) -> None:
        self.tried: dict[tuple[str, int], int] = {}

    def observe(self, m: Measurement, h: int) -> None:
        key = (str(m.offer.gpu_name), int(m.offer.num_gpus or 0))
        self.tried[key] = self.tried.get(key, 0) + 1

    def plan(self, offers, fleet, h, sim):  # type: ignore[no-untyped-def]
        chosen = sorted(offers, key=lambda o: (self.tried.get((o["gpu_name"], o["num_gpus"]), 0),
                                               o["dph_total"]))
        return _ordered_plan(chosen, [40.0 * o["num_gpus"] for o in chosen], FleetView())


class FleetSim:
    """One policy's fleet on one seed's market, hour by hour."""

    def __init__(self, seed: int, n_machines: int, policy: Policy) -> None:
        self.market = Market(seed, n_machines)
        self.policy = policy
        self.rng = random.Random(seed * 7 + 3)  # benchmark noise
        self.rentals: list[Rental] = []
        self.bad: set[int] = set()
        self.stats = RunStats(policy.name)
        self.last_exploration_h: float | None = None
        self.n = 0

    def live(self) -> list[Rental]:
        return [r for r in self.rentals if r.end_h is None]

    def run(self, hours: int) -> RunStats:
        for h in range(hours):
            self.market.step(h)
            self._losses_and_verdicts(h)
            self._decide(h, CAPS)
            self._record(h)
        self._close(hours)
        return self.stats

    def _losses_and_verdicts(self, h: int) -> None:
        for r in self.live():
            if self.market.lost(r.machine.machine_id):
                r.end_h = float(h)
                self.stats.lost += 1
                continue
            if r.measured is None and r.trial_end_h <= h:
                measured = r.machine.measure(r.k, self.rng)
                self.policy.observe(Measurement(str(r.machine.machine_id), parse_offer(r.offer),
                                                measured,
                                                r.trial_end_h * HOUR_S), h)
                if measured < r.dph / MAX_USD_PER_PROOF:
                    r.end_h = r.trial_end_h  # the verdict: terminate, and bad_hosts
                    self.bad.add(r.machine.machine_id)
                    self.stats.failed_verdict += 1
                else:
                    r.measured = measured
                    self.stats.kept += 1

    def _decide(self, h: int, caps: AutopilotCaps) -> None:
        live = self.live()
        fleet = [FleetInstance(r.instance_id, str(r.machine.machine_id), r.dph,
                               self.policy.fleet_rate_of(r), r.expected) for r in live]
        trials = sum(1 for r in live if r.measured is None)
        if trials < caps.max_concurrent_trials:
            taken = {r.machine.machine_id for r in live}
            offers = self.market.offers(taken, self.bad)
            plan = self.policy.plan(offers, fleet, h, self)
        else:
            offers, plan = [], Plan((), 0, 0, MAX_USD_PER_PROOF, "trials under way")
        spent = self._spend(float(h))
        ledger = Ledger(total_usd=spent[0] + spent[1], trials_usd=spent[0],
                        last_exploration_at=None if self.last_exploration_h is None
                        else self.last_exploration_h * HOUR_S)
        run_caps = caps if self.policy.explore else AutopilotCaps(
            caps.target_rate_per_hour, caps.max_dph_total, caps.max_instances, 0.0,
            caps.max_concurrent_trials, caps.explore_interval_s)
        decision = decide(fleet, plan, run_caps, ledger, now=h * HOUR_S)
        by_id = {o["id"]: o for o in offers}
        for a in decision.actions:
            if a.kind == "terminate":
                r = next(x for x in live if x.instance_id == a.instance_id)
                r.end_h = float(h)
                self.stats.trimmed += 1
                continue
            offer = by_id[a.offer_id]
            m = self.market.machines[offer["machine_id"]]
            true = m.true_rate(offer["num_gpus"])
            self.n += 1
            self.rentals.append(Rental(
                instance_id=f"i{self.n}", machine=m, offer=offer, dph=offer["dph_total"],
                start_h=float(h),
                trial_end_h=h + SETTINGS.trial_cost.hours(parse_offer(offer), true),
                true_rate=true, expected=a.expected_rate_per_hour,
            ))
            self.stats.trials += 1
            if a.exploration:
                self.last_exploration_h = float(h)

    def _spend(self, h: float) -> tuple[float, float, float]:
        trial = proving = proofs = 0.0
        for r in self.rentals:
            t, p, n = r.spend_until(h)
            trial, proving, proofs = trial + t, proving + p, proofs + n
        return trial, proving, proofs

    def _record(self, h: int) -> None:
        proving = [r for r in self.rentals if r.proving_at(h + 0.5)]
        rate = sum(r.true_rate for r in proving)
        dph = sum(r.dph for r in proving)
        self.stats.hours.append(h)
        self.stats.fleet_rate.append(rate)
        self.stats.usd_per_proof.append(dph / rate if rate else math.inf)
        self.stats.trials_so_far.append(self.stats.trials)
        trial, proving_usd, proofs = self._spend(h + 1.0)
        self.stats.cum_usd.append(trial + proving_usd)
        self.stats.cum_proofs.append(proofs)

    def _close(self, hours: int) -> None:
        trial, proving, proofs = self._spend(float(hours))
        self.stats.trial_usd = trial
        self.stats.total_usd = trial + proving
        self.stats.proofs = proofs


POLICIES = (Oracle, Planner, MediansPolicy, Cheapest, Variety)


def run_policies(seed: int, n_machines: int, hours: int) -> dict[str, RunStats]:
    return {cls.name: FleetSim(seed, n_machines, cls()).run(hours) for cls in POLICIES}


def trials_to_within(stats: RunStats, oracle: RunStats, margin: float = 0.10,
                     hold_h: int = 24) -> tuple[int | None, int | None]:
    """(trials made, hour) when the fleet's $/proof first came within ``margin`` of the
    oracle's, at the target rate, and stayed there ``hold_h`` hours; None if never."""
    n = len(stats.hours)
    ok = [
        stats.fleet_rate[i] >= 0.95 * TARGET_RATE_PER_HOUR
        and stats.usd_per_proof[i] <= (1 + margin) * oracle.usd_per_proof[i]
        for i in range(n)
    ]
    for i in range(n - hold_h):
        if all(ok[i:i + hold_h]):
            return stats.trials_so_far[i], stats.hours[i]
    return None, None


def hardware_check(n: int, seed: int = 99) -> list[tuple[float, bool]]:
    """(the event simulation's steady-state rate over the closed form's, deployable) for
    market hosts (the market's true rates use the closed form; the demo's agents run the
    events). Deployable: a RAM share the coordinator deploys on."""
    rng = random.Random(seed)
    ratios = []
    for m in machines(n, rng):
        k = rng.choice(m.slices())
        share = instance_share(parse_offer(m.offer(k, 0, 1.0)))
        deployable = (share.ram_gb or 0.0) >= MIN_INSTANCE_RAM_GB
        profile = m.profile(k, Hidden(1.0, 1.0, 0.0, 1.0))
        closed = capacities(profile).rate_per_hour
        j = 2 * k
        batch = run_batch(profile, count=max(24, 6 * j), concurrency=j)
        walls = [r.wall_s for r in batch.records]
        steady = steady_state_rate_per_hour(walls, j, batch.total_s) or batch.rate_per_hour
        ratios.append((steady / closed, deployable))
    return ratios


def _spread(values: Sequence[float], fmt: str = "{:.4f}") -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return fmt.format(vals[0])
    return (f"{fmt.format(statistics.mean(vals))} +- {fmt.format(statistics.stdev(vals))} "
            f"[{fmt.format(min(vals))}..{fmt.format(max(vals))}]")


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _weekly(st: RunStats, weeks: int) -> list[float]:
    """Each week's spend (trials included) over its proofs."""
    out = []
    for w in range(weeks):
        a, b = w * 168 - 1, min((w + 1) * 168, len(st.hours)) - 1
        usd = st.cum_usd[b] - (st.cum_usd[a] if a >= 0 else 0.0)
        proofs = st.cum_proofs[b] - (st.cum_proofs[a] if a >= 0 else 0.0)
        out.append(usd / proofs if proofs else math.inf)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, small, 1 week")
    ap.add_argument("--seeds", type=int, default=None, help="seeds (default 5; quick 1)")
    ap.add_argument("--seed-list", default=None,
                    help="with --market(s): these accuracy seeds, e.g. 31,32,33 (seeds a "
                         "pass has not read; replaces --seeds)")
    ap.add_argument("--weeks", type=int, default=None, help="simulated weeks (default 4)")
    ap.add_argument("--machines", type=int, default=None, help="market machines (default 400)")
    ap.add_argument("--json-out", type=Path, default=None, help="write the figures as JSON")
    ap.add_argument("--market", type=Path, action="append", default=None,
                    help="a market file (JSON Lines, docs/discovery.md 'Markets'); repeatable")
    ap.add_argument("--sizes", default=None, metavar="N,N",
                    help="with --market(s): how many hosts are measured, each size "
                         "(default 40,240,1000; quick 40,240)")
    ap.add_argument("--plan-only", action="store_true",
                    help="with --market(s): the planning figures alone (a few minutes)")
    ap.add_argument("--accuracy-only", action="store_true",
                    help="with --market(s): the accuracy, interval and attribution figures "
                         "alone, no planning (about a minute a market at --sizes 240)")
    ap.add_argument("--plan-runs", default=None, metavar="N,N",
                    help="with --market(s): which planning runs (default 0,1,2,3,4: run 0 "
                         "the whole file, others 80%% of it)")
    ap.add_argument("--plan-trace", action="store_true",
                    help="with --market(s): print each planning trial, predicted against "
                         "the market's truth")
    ap.add_argument("--belief-test-share", type=float, default=None,
                    help="the planner's VM_PLAN_BELIEF_TEST_SHARE (default: 0, the "
                         "coordinator's, on the live market; 0.25 on market files)")
    ap.add_argument("--binding-seen-wrong", type=float, default=None, metavar="SHARE",
                    help="with --market(s): the share of hosts the planning runs import "
                         "with a wrong binding resource seen (default 0)")
    ap.add_argument("--kept-reruns", type=int, default=None, metavar="N",
                    help="with --market(s): the cheapest 30%% of each accuracy seed's "
                         "measured machines per proof benchmarked N more times, as a live "
                         "fleet benchmarks the machines it keeps (default 0)")
    ap.add_argument("--plan-oracle-error", type=float, default=None, metavar="F",
                    help="with --market(s): the planning runs predict untried hosts from "
                         "the market's physics oracle, its log error F times the market's "
                         "host-effect sd (1: the oracle's own), not with the model: the "
                         "bars' reach for a model that accurate")
    ap.add_argument("--plan-oracle-min-gpus", type=int, default=None, metavar="N",
                    help="with --plan-oracle-error: only offers of N GPUs or more from the "
                         "oracle, the others from the model")
    ap.add_argument("--markets", action="store_true",
                    help="every market in bench/markets/ (the one command for the figures)")
    ap.add_argument("--prior", action="append", default=[], metavar="NAME=VALUE",
                    help="with --market(s): a structural-model prior replaced for the run "
                         "(a field of structural_model.Priors); repeatable")
    args = ap.parse_args(argv)
    if args.market or args.markets:
        return markets_main(args)
    Planner.settings = dataclasses.replace(
        SETTINGS, doubt=belief_tests(args.belief_test_share or 0.0))
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 5))))
    weeks = args.weeks or (1 if args.quick else 4)
    n_machines = args.machines or (160 if args.quick else 400)
    sizes = (5, 500) if args.quick else (5, 50, 500, 5000)
    accept_sizes = [n for n in sizes if n >= 500]
    out: dict[str, Any] = {"simulated": True, "seeds": seeds, "weeks": weeks,
                           "machines": n_machines}
    started = time.perf_counter()
    print("Discovery on a simulated vast.ai market: every figure below is simulated and "
          "computed by this run")
    print(f"seeds {seeds}, {n_machines} machines, {weeks} weeks\n")

    checked = hardware_check(4 if args.quick else 12)
    ratios = [r for r, ok in checked if ok]
    small = [r for r, ok in checked if not ok]
    print("Hardware model: the event simulation's steady-state rate / the closed form the "
          f"market uses, {len(ratios)} deployable hosts: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}..{max(ratios):.3f}"
          + (f"; {len(small)} with a RAM share under {MIN_INSTANCE_RAM_GB:.0f} GB: "
             f"{', '.join(f'{r:.2f}' for r in small)} (cuzk's budget cannot hold the SRS, the "
             "PCE and a partition: it waits, the closed form does not)" if small else "")
          + "\n")
    out["hardware_check"] = checked

    print("A1. The rate model on held-out hosts (400 other machines a seed; MdAPE = median "
          "absolute percentage error of the true rate)")
    print("  floor = an oracle that knows the hardware model and how hidden effects are "
          "distributed, not the host's own:\n  its guess is the point with the least mean "
          "absolute percentage error over draws of them ('/med': the model's MdAPE over the "
          "same oracle's guessing their median)")
    print(f"  deployable = the offers the coordinator predicts (RAM share >= "
          f"{MIN_INSTANCE_RAM_GB:.0f} GB, VM_MIN_INSTANCE_RAM_GB); all = every held-out offer")
    print(f"  {'measurements':>12} {'offers':>10} {'floor':>7} {'model':>7} {'/floor':>7} "
          f"{'/med':>5} {'GPU-median':>10} {'covers':>6} {'x worse':>7} {'in 80%':>7} {'width':>6} "
          f"{'fit s':>7}")
    a1: dict[int, list[dict[str, AccuracyRow]]] = {}
    mean = statistics.mean
    for n in sizes:
        a1[n] = [accuracy(seed, n) for seed in seeds]
        for subset in SUBSETS:
            rows = [r[subset] for r in a1[n]]
            print(f"  {n:>12} {subset:>10} {mean([r.floor for r in rows]):>7.1%}"
                  f" {mean([r.model for r in rows]):>7.1%}"
                  f" {mean([r.model / r.floor for r in rows]):>7.2f}"
                  f" {mean([r.model / r.floor_median for r in rows]):>5.2f}"
                  f" {mean([r.gpu_median for r in rows]):>10.1%}"
                  f" {mean([r.gpu_median_covered for r in rows]):>6.0%}"
                  f" {mean([r.gpu_median / r.model_same_subset for r in rows]):>7.1f}"
                  f" {mean([r.coverage for r in rows]):>7.0%}"
                  f" {mean([r.width for r in rows]):>6.2f} {mean([r.fit_s for r in rows]):>7.3f}")
    print("  (GPU-median = the same machine's median, else the same GPU model and count's: the "
          "rule ranking used before the model;\n   'covers' = offers it predicts at all; "
          "'x worse' = its MdAPE over the model's on those offers; width = median high/low "
          "of the 80% interval)")
    big = [r["all"] for r in a1[sizes[-1]]]
    print(f"  fit at {sizes[-1]} measurements: {_spread([r.fit_s for r in big], '{:.2f}')} s; "
          f"the GPU-median rule on 400 offers from the same: "
          f"{_spread([r.baseline_s * 1000 for r in big], '{:.1f}')} ms")
    a1_checks: dict[str, list[bool]] = {}
    for n in accept_sizes:
        for subset in SUBSETS:
            rows = [r[subset] for r in a1[n]]
            ratios = [r.model / r.floor for r in rows]
            gpu_gains = [r.gpu_median / r.model_same_subset for r in rows]
            cov = [r.coverage for r in rows]
            checks = [max(ratios) <= 1.25, min(gpu_gains) >= 2.0,
                      all(0.75 <= c <= 0.85 for c in cov)]
            a1_checks[f"{n} {subset}"] = checks
            offers = sum(r.offers for r in rows)
            pooled = sum(r.coverage * r.offers for r in rows) / offers
            sampling = math.sqrt(0.8 * 0.2 / (offers / len(rows)))
            out.setdefault("a1_pooled_coverage", {})[f"{n} {subset}"] = pooled
            print(f"  A1 at {n} measurements, {subset}, every seed: model/floor <= 1.25 "
                  f"({', '.join(f'{x:.2f}' for x in ratios)}) {_verdict(checks[0])}; >= 2x "
                  f"better than the GPU median (worst {min(gpu_gains):.1f}x) "
                  f"{_verdict(checks[1])}; "
                  f"80% intervals cover 75-85% ({', '.join(f'{c:.1%}' for c in cov)}) "
                  f"{_verdict(checks[2])}; all seeds' {offers} offers together {pooled:.1%} "
                  f"{_verdict(0.75 <= pooled <= 0.85)} (one seed's figure has a sampling sd "
                  f"of {sampling:.1%} at 80%)")
    out["a1"] = {str(n): [{subset: asdict(r[subset]) for subset in SUBSETS} for r in rows]
                 for n, rows in a1.items()}
    out["a1_checks"] = a1_checks

    print(f"\nA2. Policies on the live market: target {TARGET_RATE_PER_HOUR:.0f} proofs/h, caps "
          f"${CAPS.max_dph_total:.2f}/h and {CAPS.max_instances} instances, "
          f"{CAPS.max_concurrent_trials} trials at once; every deploy is a trial")
    runs = {seed: run_policies(seed, n_machines, weeks * 168) for seed in seeds}
    names = [cls.name for cls in POLICIES]
    print(f"  {'policy':9} {'$/proof over the weeks':>38} {'regret':>8} {'trials':>7} "
          f"{'trial $':>8} {'trial share':>11} {'trials to 10%':>13}")
    summary: dict[str, dict[str, Any]] = {}
    for name in names:
        sts = [runs[seed][name] for seed in seeds]
        oracle = [runs[seed]["oracle"] for seed in seeds]
        cum = [st.cumulative_usd_per_proof for st in sts]
        regret = [st.cumulative_usd_per_proof / o.cumulative_usd_per_proof - 1
                  for st, o in zip(sts, oracle, strict=True)]
        reach = [trials_to_within(st, o)[0] for st, o in zip(sts, oracle, strict=True)]
        share = [st.trial_usd / st.total_usd for st in sts]
        summary[name] = {
            "usd_per_proof": cum, "regret": regret, "trials": [st.trials for st in sts],
            "trial_usd": [st.trial_usd for st in sts], "trial_share": share,
            "trials_to_within_10pct": reach,
            "weekly_usd_per_proof": [_weekly(st, weeks) for st in sts],
            "kept": [st.kept for st in sts], "failed": [st.failed_verdict for st in sts],
            "lost": [st.lost for st in sts], "replaced": [st.trimmed for st in sts],
        }
        reach_text = ",".join("-" if r is None else str(r) for r in reach)
        print(f"  {name:9} {_spread(cum, '{:.5f}'):>38} {statistics.mean(regret):>8.1%} "
              f"{statistics.mean([st.trials for st in sts]):>7.0f} "
              f"{statistics.mean([st.trial_usd for st in sts]):>8.2f} "
              f"{statistics.mean(share):>11.1%} {reach_text:>13}")
    print("  ($/proof = all spend, trials included, over all proofs; mean +- sd [min..max] over "
          "seeds; regret = over the oracle's;\n   trials to 10% = trials made before the fleet's "
          "$/proof came within 10% of the oracle's, at target, for 24 h, per seed)")
    print("  weekly $/proof (mean over seeds):")
    for name in names:
        weekly = summary[name]["weekly_usd_per_proof"]
        cols = [statistics.mean(w[i] for w in weekly) for i in range(weeks)]
        print(f"    {name:9} " + " ".join(f"wk{i + 1} {c:.5f}" for i, c in enumerate(cols)))
    planner = summary["planner"]
    gains = {b: [1 - p / c for p, c in zip(planner["usd_per_proof"], summary[b]["usd_per_proof"],
                                            strict=True)] for b in ("cheapest", "variety")}
    reach = planner["trials_to_within_10pct"]
    first = [trials_to_within(runs[seed]["planner"], runs[seed]["oracle"], hold_h=1)[0]
             for seed in seeds]
    checks = [
        all(r is not None and r <= 20 for r in reach),
        max(planner["trial_share"]) <= 0.15,
        min(gains["cheapest"]) >= 0.25 and min(gains["variety"]) >= 0.25,
    ]
    print(f"  A2, every seed: planner within 10% of the oracle after <= 20 trials "
          f"({reach_text_of(reach)}) {_verdict(checks[0])}; trials <= 15% of spend "
          f"(max {max(planner['trial_share']):.1%}) {_verdict(checks[1])}; "
          f"beats cheapest-first by {_spread(gains['cheapest'], '{:.1%}')} and variety by "
          f"{_spread(gains['variety'], '{:.1%}')} (>= 25%) {_verdict(checks[2])}")
    print(f"  (the planner's fleet first came within 10% of the oracle's, at target, after "
          f"{reach_text_of(first)} trials; held for 24 h after {reach_text_of(reach)}; "
          f"trials per week {', '.join(f'{t / weeks:.0f}' for t in planner['trials'])}; hosts "
          f"terminated for better ones {', '.join(str(r) for r in planner['replaced'])} "
          "in all)")
    out["planner_first_within_10pct"] = first
    edge = [1 - o / c for o, c in zip(summary["oracle"]["usd_per_proof"],
                                      summary["cheapest"]["usd_per_proof"], strict=True)]
    print(f"  (the most any policy could: the oracle beats cheapest-first by "
          f"{', '.join(f'{e:.1%}' for e in edge)} per seed; the planner by "
          f"{', '.join(f'{g:.1%}' for g in gains['cheapest'])}; over variety by "
          f"{', '.join(f'{g:.1%}' for g in gains['variety'])})")
    out["a2"] = summary
    elapsed = time.perf_counter() - started
    print(f"\nran in {elapsed:.0f} s")
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY))
    return 0


def markets_main(args: argparse.Namespace) -> int:
    """The rate model and the planner on market files (bench/market_bench.py)."""
    import market_bench
    from market_bench import PLAN_SEEDS, MarketError, market_files, run_markets

    paths = list(args.market or []) + (market_files() if args.markets else [])
    try:
        use_priors(args.prior)
        if args.belief_test_share is not None:
            if not 0.0 <= args.belief_test_share <= 1.0:
                raise ValueError("--belief-test-share must be between 0 and 1")
            market_bench.PLAN_DOUBT = belief_tests(args.belief_test_share)
        if args.binding_seen_wrong is not None:
            if not 0.0 <= args.binding_seen_wrong <= 1.0:
                raise ValueError("--binding-seen-wrong must be between 0 and 1")
            market_bench.SEEN_WRONG_SHARE = args.binding_seen_wrong
        if args.kept_reruns is not None:
            if not 0 <= args.kept_reruns <= 100:
                raise ValueError("--kept-reruns takes a number of runs from 0 to 100")
            market_bench.KEPT_RERUNS = args.kept_reruns
        if args.plan_oracle_error is not None:
            if not 1.0 <= args.plan_oracle_error < math.inf:
                raise ValueError("--plan-oracle-error must be a number of at least 1")
            market_bench.PLAN_ORACLE_ERROR = args.plan_oracle_error
        if args.plan_oracle_min_gpus is not None:
            if args.plan_oracle_error is None or args.plan_oracle_min_gpus < 1:
                raise ValueError("--plan-oracle-min-gpus takes a GPU count of at least 1 "
                                 "and needs --plan-oracle-error")
            market_bench.PLAN_ORACLE_MIN_GPUS = args.plan_oracle_min_gpus
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 5))))
    sizes: tuple[int, ...] = (40, 240) if args.quick else (40, 240, 1000)
    plan_runs: tuple[int, ...] = (0,) if args.quick else PLAN_SEEDS
    try:
        if args.seed_list:
            seeds = list(ints_of(args.seed_list, "--seed-list takes seeds, e.g. 31,32,33"))
        if args.sizes:
            sizes = ints_of(args.sizes, "--sizes takes measured counts, e.g. 40,240")
        if args.plan_runs:
            plan_runs = ints_of(args.plan_runs, "--plan-runs takes run numbers, e.g. 0,3")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plan_only and args.accuracy_only:
        print("error: --plan-only and --accuracy-only exclude each other", file=sys.stderr)
        return 2
    if args.plan_only:
        sizes = ()
    if args.accuracy_only:
        plan_runs = ()
    started = time.perf_counter()
    print("Discovery on market files: every rate is simulated (the files' generators say how)")
    print(f"accuracy seeds {seeds} (which measured hosts); median abs % error on held-out hosts")
    try:
        # A smoke run plans on the whole file alone.
        out = run_markets(paths, seeds, sizes, plan_runs, trace=args.plan_trace)
    except (MarketError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\nran in {time.perf_counter() - started:.0f} s")
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_NON_STR_KEYS
                                               | orjson.OPT_SERIALIZE_NUMPY, default=float))
    return 0


def ints_of(text: str, error: str) -> tuple[int, ...]:
    """Whole numbers separated by commas; ValueError(``error``) otherwise."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(error) from None


def use_priors(pairs: Sequence[str]) -> None:
    """Fit every served model of this run under ``Priors`` with ``NAME=VALUE`` replaced
    (a sensitivity run: docs/discovery-passes.md records what such runs showed)."""
    if not pairs:
        return
    from functools import partial

    from vast_manager.coordinator.discovery import served, structural_model

    base = structural_model.Priors()
    changes: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not hasattr(base, name):
            raise ValueError(f"--prior {pair!r}: expected NAME=VALUE with NAME a field of "
                             f"Priors (e.g. host_sd=0.08)")
        kind = type(getattr(base, name))
        try:
            changes[name] = kind(text)
        except ValueError:
            raise ValueError(f"--prior {pair!r}: {name} takes a {kind.__name__}") from None
    print(f"priors replaced for this run: {changes}")
    served.fit_rate_model = partial(  # type: ignore[attr-defined]
        structural_model.fit_rate_model,
        priors=dataclasses.replace(base, **changes))


def reach_text_of(reach: Sequence[int | None]) -> str:
    return ", ".join("never" if r is None else str(r) for r in reach)


if __name__ == "__main__":
    raise SystemExit(main())
