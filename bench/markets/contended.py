"""A market of shared, contended hosts, written unlike the simulator on purpose.

Its rates are neither the project's simulated cuzk nor its rate model's forms:

- the CPU and the GPU work **in sequence** for each proof (harmonic: 1/rate = 1/gpu +
  1/cpu), so no single capacity binds and both always matter;
- the CPU's throughput grows with its vCPUs as cores^0.7 (memory bandwidth, not cores,
  saturates) times a per-CPU-family factor and a per-host factor (sd 0.2 in log) the offer
  does not show (turbo, memory channels, background load);
- RAM helps **smoothly and then not at all**: the rate rises linearly from 60% at 128 GB
  of share to 100% at 300 GB, flat above (no staircase of partitions);
- the GPU's speed follows ``dlperf`` (vast.ai's measured score) to the power 0.8 with an
  architecture premium (Blackwell +25%, Ampere -10%), not its memory bandwidth;
- PCIe only matters below 8 GB/s per GPU (a knee), and then as the square root;
- neighbours: a slice of a shared host loses 0-35% (uniform) for good, and the more
  the larger the host's other share;
- 2, 4, 8 GPUs scale as n^0.9 and 8-GPU slices lose another 10% (NUMA);
- a benchmark has 3% noise.

Run from the repository root: ``python bench/markets/contended.py`` writes
``bench/markets/contended.jsonl.gz``. Every rate is simulated.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from market_file import MIN_RAM_SHARE_GB, ram_share_gb, write_market

HOSTS = 1700
SEED = 55_021

# name: (spec memory bandwidth GB/s, fp32 TFLOPs, memory MB, $/GPU-hour, weight, arch)
GPUS = {
    "RTX 5090": (1792, 104.8, 32607, 0.60, 0.12, "blackwell"),
    "RTX 5080": (960, 56.3, 16303, 0.28, 0.06, "blackwell"),
    "RTX 4090": (1008, 82.6, 24564, 0.35, 0.25, "ada"),
    "RTX 4080": (717, 48.7, 16376, 0.20, 0.08, "ada"),
    "RTX 3090": (936, 35.6, 24576, 0.18, 0.20, "ampere"),
    "RTX 3080": (760, 29.8, 10240, 0.12, 0.06, "ampere"),
    "RTX A6000": (768, 38.7, 49140, 0.45, 0.08, "ampere"),
    "RTX 6000Ada": (960, 91.1, 49140, 0.75, 0.05, "ada"),
    "H100 SXM": (3350, 66.9, 81559, 2.00, 0.05, "hopper"),
    "A100 SXM4": (2039, 19.5, 81920, 1.00, 0.05, "ampere"),
}
ARCH = {"blackwell": 1.25, "ada": 1.0, "ampere": 0.9, "hopper": 1.05}
# name, threads, base GHz, family factor (hidden from the offer), PCIe generation
CPUS = (
    ("AMD EPYC 7282 16-Core Processor", 32, 2.8, 0.85, 4),
    ("AMD EPYC 7B12 64-Core Processor", 128, 2.25, 0.9, 4),
    ("AMD EPYC 9654 96-Core Processor", 192, 2.4, 1.3, 5),
    ("AMD EPYC 7443P 24-Core Processor", 48, 2.85, 1.0, 4),
    ("Intel(R) Xeon(R) Silver 4214R CPU @ 2.40GHz", 24, 2.4, 0.7, 3),
    ("Intel(R) Xeon(R) Gold 6448Y", 64, 2.1, 1.1, 5),
    ("AMD Ryzen Threadripper 3970X 32-Core Processor", 64, 3.7, 1.05, 4),
    ("Intel(R) Core(TM) i9-14900K", 32, 3.2, 1.2, 5),
)
PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938}
#: The resources a host's rate may be bound by; ``true_binding`` is the one whose doubling
#: raises the true rate most.
BINDING = ("gpu", "cpu", "pcie", "memory")


def main() -> int:
    rng = random.Random(SEED)
    lines: list[dict[str, object]] = []
    machine_id = 700_000
    while len(lines) < HOSTS:
        machine_id += 1
        names = list(GPUS)
        gpu = rng.choices(names, weights=[GPUS[g][4] for g in names])[0]
        bw, tflops, mem_mb, usd, _, arch = GPUS[gpu]
        host_gpus = rng.choice((1, 2, 2, 4, 4, 6, 8, 8, 10))
        cpu_name, threads, ghz, family, cpu_gen = rng.choice(CPUS)
        cores = threads * (2 if host_gpus >= 6 and rng.random() < 0.6 else 1)
        ram_gb = rng.choice((192, 256, 384, 512, 768, 1024, 1536, 2048))
        k = rng.choice([x for x in (1, 2, 4, 8) if x <= host_gpus] + [host_gpus])
        share = k / host_gpus
        gen = min(cpu_gen, 5 if arch in ("blackwell", "hopper") else 4)
        lanes = rng.choice((16, 16, 16, 8, 4))
        pcie = PER_LANE[gen] * lanes * rng.uniform(0.55, 0.95)
        gpu_own = math.exp(rng.gauss(0, 0.07))
        dlperf = (tflops**0.55 * (bw / 10) ** 0.45) * gpu_own * math.exp(rng.gauss(0, 0.03))
        offer = {
            "id": machine_id * 10 + k, "machine_id": machine_id, "host_id": machine_id // 3,
            "num_gpus": k, "gpu_name": gpu, "gpu_ram": mem_mb,
            "gpu_mem_bw": round(bw * math.exp(rng.gauss(0, 0.05)), 1),
            "total_flops": round(tflops * k, 1), "dlperf": round(dlperf * k, 1),
            "compute_cap": {"blackwell": 1200, "ada": 890, "ampere": 860, "hopper": 900}[arch],
            "cpu_name": cpu_name, "cpu_cores": cores,
            "cpu_cores_effective": round(cores * share, 1), "cpu_ghz": ghz,
            "cpu_ram": round(ram_gb * 1000), "disk_bw": round(rng.uniform(500, 6000)),
            "pci_gen": gen, "gpu_lanes": lanes, "pcie_bw": round(pcie, 1),
            "inet_down": round(rng.uniform(100, 5000)), "inet_up": round(rng.uniform(50, 2000)),
            "reliability": round(rng.uniform(0.9, 0.999), 4),
            "geolocation": rng.choice(("Nevada, US", "Norway, NO", "Spain, ES", "Ohio, US")),
            "duration": 60 * 86400.0,
        }
        if ram_share_gb(offer) < MIN_RAM_SHARE_GB:
            continue
        ram = ram_share_gb(offer)
        neighbours_scale = 0.35 * (1 - share)

        def rate(cpu_host: float, neighbours: float, gpu_f: float, offer=offer, ram=ram,
                 k=k, family=family, ghz=ghz, pcie=pcie, bw=bw, tflops=tflops,
                 arch=arch, double: str = "") -> float:
            # ``double``: that resource doubled (which one binds: the one that raises most).
            two = {r: 2.0 if double == r else 1.0 for r in BINDING}
            gpu_f, cpu_host, pcie, ram = (gpu_f * two["gpu"], cpu_host * two["cpu"],
                                          pcie * two["pcie"], ram * two["memory"])
            class_dl = tflops**0.55 * (bw / 10) ** 0.45
            gpu_rate = 4.0 * (class_dl * gpu_f) ** 0.8 * ARCH[arch] * k**0.9
            if k >= 8:
                gpu_rate *= 0.9
            per_gpu_pcie = pcie
            if per_gpu_pcie < 8.0:
                gpu_rate *= math.sqrt(per_gpu_pcie / 8.0)
            vcpus = float(offer["cpu_cores_effective"])  # type: ignore[arg-type]
            cpu_rate = 22.0 * vcpus**0.7 * family * (ghz / 3.0) ** 0.5 * cpu_host
            ram_f = 0.6 + 0.4 * min(1.0, max(0.0, (ram - 128.0) / (300.0 - 128.0)))
            return 1.0 / (1.0 / gpu_rate + 1.0 / cpu_rate) * ram_f * (1 - neighbours)

        cpu_host = math.exp(rng.gauss(0, 0.2))
        neighbours = rng.uniform(0, neighbours_scale)
        true = rate(cpu_host, neighbours, gpu_own)
        offer["true_rate_per_hour"] = round(true, 3)
        raised = {r: rate(cpu_host, neighbours, gpu_own, double=r) for r in BINDING}
        offer["true_binding"] = max(BINDING, key=raised.__getitem__)
        offer["measured_rate_per_hour"] = round(true * math.exp(rng.gauss(0, 0.03)), 3)
        draws = sorted(rate(math.exp(rng.gauss(0, 0.2)), rng.uniform(0, neighbours_scale),
                            math.exp(rng.gauss(0, 0.07))) for _ in range(63))
        weights = [1 / d for d in draws]
        half, acc = sum(weights) / 2, 0.0
        for d, w in zip(draws, weights, strict=True):
            acc += w
            if acc >= half:
                offer["oracle_rate_per_hour"] = round(d, 3)
                break
        offer["dph_total"] = round(k * usd * math.exp(rng.gauss(0, 0.25)) + 0.015, 4)
        lines.append(offer)
    n = write_market(Path(__file__).with_name("contended.jsonl.gz"), lines)
    print(f"contended market: {n} hosts (simulated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
