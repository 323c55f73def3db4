"""A market written from the hardware facts of docs/cuzk.md and docs/vast.md alone.

Not from the project's rate model nor its simulator: a PoRep C2 proof is 10 partitions;
each is synthesised on the CPU (cuzk reserves 14 GiB of its memory budget per partition,
after the 45 GiB SRS and a 14 GiB PCE extraction, and runs at most 18 at once), then
proved on a GPU (about 3 s a partition on an RTX 5070 Ti, the GPU's time scaling with
its memory bandwidth and compute both), the SRS streamed over PCIe for each partition.
The forms differ from the structural model's on purpose:

- the GPU stage and the PCIe transfer **add** (a transfer stalls the GPU for part of its
  time: no overlap), rather than the slower of the two binding;
- synthesis slots come from the real 14 GiB per partition, and a host short of slots
  loses to **swapping** (rate falls with the square of the shortfall), not a staircase;
- the CPU's speed is **not in the offer**: cpu_ghz is the base clock, the effective speed
  per thread is base x a boost of 1.0-1.6 x memory-channel factor, drawn per host;
- multi-GPU instances scale by n^0.85 (the host's memory bandwidth is shared);
- when GPU and CPU stages are close, the pipeline loses up to 18% to queueing;
- host spreads are heavy-tailed: 8% of hosts run their GPUs at 55-80% (thermal or power
  limits), every host has a t-distributed (3 dof) general factor of scale 0.07;
- a benchmark has 5% noise, and 4% of benchmarks catch a neighbour's burst (-25%).

Run from the repository root: ``python bench/markets/pipeline.py`` writes
``bench/markets/pipeline.jsonl.gz``. Every rate is simulated.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from market_file import MIN_RAM_SHARE_GB, ram_share_gb, write_market

HOSTS = 1700
SEED = 7_300_411

# name: (memory bandwidth GB/s, fp32 TFLOPs, memory MB, $/GPU-hour median, weight,
#        max PCIe generation) -- vendor spec sheets; prices vast.ai-like.
GPUS = {
    "RTX 5090": (1792, 104.8, 32607, 0.55, 0.14, 5),
    "RTX 4090": (1008, 82.6, 24564, 0.33, 0.22, 4),
    "RTX 5070 Ti": (896, 43.9, 16303, 0.15, 0.10, 5),
    "RTX 3090": (936, 35.6, 24576, 0.19, 0.16, 4),
    "RTX 5060 Ti": (448, 23.7, 16311, 0.08, 0.08, 5),
    "RTX A6000": (768, 38.7, 49140, 0.40, 0.08, 4),
    "L40S": (864, 91.6, 46068, 0.65, 0.07, 4),
    "H100 PCIE": (2000, 51.2, 81559, 1.60, 0.07, 5),
    "A100 PCIE": (1555, 19.5, 40960, 0.80, 0.08, 4),
}
# name, threads, base GHz, PCIe generation, memory channels
CPUS = (
    ("AMD EPYC 7543 32-Core Processor", 64, 2.8, 4, 8),
    ("AMD EPYC 7763 64-Core Processor", 128, 2.45, 4, 8),
    ("AMD EPYC 9354 32-Core Processor", 64, 3.25, 5, 12),
    ("AMD EPYC 9554 64-Core Processor", 128, 3.1, 5, 12),
    ("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", 64, 2.0, 4, 8),
    ("Intel(R) Xeon(R) Platinum 8480+", 112, 2.0, 5, 8),
    ("AMD Ryzen Threadripper PRO 5975WX 32-Cores", 64, 3.6, 4, 8),
    ("AMD Ryzen 9 7950X 16-Core Processor", 32, 4.5, 5, 2),
    ("Intel(R) Xeon(R) E5-2698 v4 @ 2.20GHz", 40, 2.2, 3, 4),
)
PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938}

PARTITIONS = 10
SRS_GIB, PCE_GIB, MARGIN_GIB, PARTITION_GIB = 45.0, 14.0, 5.0, 14.0
GPU_S_5070TI = 3.0  # seconds a partition on an RTX 5070 Ti (docs/cuzk.md)
SYNTH_CORE_S = 29.0 * 3  # thread-seconds of one partition's synthesis at 3.5 GHz-equivalent
SRS_GB_PER_PARTITION = 4.8  # the 48 GB SRS streamed once per proof's partitions
#: The resources a host's rate may be bound by; ``true_binding`` is the one whose doubling
#: raises the true rate most.
BINDING = ("gpu", "cpu", "pcie", "memory")


def pick(rng: random.Random, items: list[tuple[object, float]]) -> object:
    x = rng.random() * sum(w for _, w in items)
    for item, w in items:
        x -= w
        if x <= 0:
            return item
    return items[-1][0]


def t_factor(rng: random.Random) -> float:
    """A host's general factor: Student t (3 dof) of scale 0.07 in log, clipped at x0.5-x1.6."""
    t = rng.gauss(0, 1) / math.sqrt(rng.gammavariate(1.5, 1 / 1.5))
    return math.exp(max(-0.7, min(0.47, 0.07 * t)))


def host(rng: random.Random, machine_id: int) -> dict[str, object] | None:
    gpu = str(pick(rng, [(g, v[4]) for g, v in GPUS.items()]))
    bw, tflops, mem_mb, usd, _, gen_max = GPUS[gpu]
    host_gpus = cast(int, pick(rng, [(1, 0.25), (2, 0.2), (4, 0.25), (8, 0.3)]))
    cpu_name, threads, ghz, cpu_gen, channels = rng.choice(CPUS)
    sockets = 2 if host_gpus >= 4 and threads >= 64 and rng.random() < 0.4 else 1
    cores = threads * sockets
    ram_gb = rng.choice((128, 256, 256, 384, 512, 512, 768, 1024, 1536, 2048))
    k = rng.choice([x for x in (1, 2, 4, 8) if x <= host_gpus])
    share = k / host_gpus
    offer_ram_mb = round(ram_gb * 1000 * 1.02)
    eff_cores = round(cores * share, 1)
    gen = min(cpu_gen, gen_max)
    lanes = 16 if rng.random() > 0.12 else rng.choice((1, 4, 8))
    link = PER_LANE[gen] * lanes
    pcie_bw = link * rng.uniform(0.6, 0.95)
    # Hidden: the GPU's own speed, the CPU's effective speed, a general factor.
    gpu_hidden = math.exp(rng.gauss(0, 0.06)) * (rng.uniform(0.55, 0.8) if rng.random() < 0.08
                                                else 1.0)
    boost = rng.uniform(1.0, 1.6) * (min(channels, 8) / 8) ** 0.35
    general = t_factor(rng)
    offer = {
        "id": machine_id * 10 + k, "machine_id": machine_id, "host_id": machine_id // 5,
        "num_gpus": k, "gpu_name": gpu, "gpu_ram": mem_mb,
        "gpu_mem_bw": round(bw * gpu_hidden**0.2 * math.exp(rng.gauss(0, 0.04)), 1),
        "total_flops": round(tflops * k, 1),
        "dlperf": round(tflops**0.6 * (bw / 10) ** 0.4 * k * gpu_hidden**0.5
                        * math.exp(rng.gauss(0, 0.06)), 1),
        "compute_cap": 1200 if gen_max == 5 and gpu.startswith("RTX 5") else 890,
        "cpu_name": cpu_name, "cpu_cores": cores, "cpu_cores_effective": eff_cores,
        "cpu_ghz": ghz, "cpu_ram": offer_ram_mb,
        "disk_bw": round(math.exp(rng.gauss(math.log(2000), 0.6))),
        "pci_gen": gen, "gpu_lanes": lanes, "pcie_bw": round(pcie_bw, 1),
        "inet_down": round(math.exp(rng.gauss(math.log(700), 0.8))),
        "inet_up": round(math.exp(rng.gauss(math.log(400), 0.8))),
        "reliability": round(1 - math.exp(rng.gauss(math.log(0.02), 0.6)), 4),
        "geolocation": rng.choice(("Texas, US", "Quebec, CA", "Finland, FI", "Sweden, SE",
                                   "Taiwan, TW", "Virginia, US")),
        "duration": 14 * 86400.0,
    }
    if ram_share_gb(offer) < MIN_RAM_SHARE_GB:
        return None
    ram_gib = ram_share_gb(offer) * 1e9 / 2**30

    def rate(gpu_f: float, cpu_f: float, gen_f: float, double: str = "") -> float:
        # ``double``: that resource doubled (which one binds: the one that raises most).
        gpu_f *= 2.0 if double == "gpu" else 1.0
        cpu_f *= 2.0 if double == "cpu" else 1.0
        t_gpu = GPU_S_5070TI * (0.6 * 896 / bw + 0.4 * 43.9 / tflops) / gpu_f
        t_pcie = SRS_GB_PER_PARTITION / (pcie_bw * (2.0 if double == "pcie" else 1.0))
        gpu_stage = (t_gpu + 0.7 * t_pcie) / (k**0.85)  # seconds per partition, all GPUs
        budget = ram_gib * (2.0 if double == "memory" else 1.0) - MARGIN_GIB - SRS_GIB - PCE_GIB
        slots = max(1.0, min(18.0, budget / PARTITION_GIB))
        need = max(2.0, 2.0 * k)  # slots that keep k GPUs fed
        swap = min(1.0, (budget / PARTITION_GIB) / need) ** 2 if budget > 0 else 0.05
        swap = max(swap, 0.15)
        threads_per_slot = eff_cores / slots
        synth_s = SYNTH_CORE_S / (min(threads_per_slot, 16.0) ** 0.9) / (ghz * cpu_f / 3.5)
        cpu_stage = synth_s / slots  # seconds per partition, all slots
        slow, fast = max(gpu_stage, cpu_stage), min(gpu_stage, cpu_stage)
        queueing = 1.0 - 0.18 * math.exp(-4.0 * (slow / fast - 1.0))
        return 3600.0 / (PARTITIONS * slow) * queueing * swap * gen_f

    true = rate(gpu_hidden, boost, general)
    offer["true_rate_per_hour"] = round(true, 3)
    offer["true_binding"] = max(BINDING, key=lambda r: rate(gpu_hidden, boost, general, r))
    noise = math.exp(rng.gauss(0, 0.05)) * (0.75 if rng.random() < 0.04 else 1.0)
    offer["measured_rate_per_hour"] = round(true * noise, 3)
    # The oracle knows the physics and how the hidden effects are distributed, not this
    # host's: its point is the median of the rate weighted by 1/rate over draws.
    draws = []
    for _ in range(63):
        g = math.exp(rng.gauss(0, 0.06)) * (rng.uniform(0.55, 0.8) if rng.random() < 0.08
                                            else 1.0)
        b = rng.uniform(1.0, 1.6) * (min(channels, 8) / 8) ** 0.35
        e = t_factor(rng)
        draws.append(rate(g, b, e))
    draws.sort()
    weights = [1 / d for d in draws]
    half, acc = sum(weights) / 2, 0.0
    for d, w in zip(draws, weights, strict=True):
        acc += w
        if acc >= half:
            offer["oracle_rate_per_hour"] = round(d, 3)
            break
    # Prices: the GPU's, a host spread, a little of the CPU and RAM share.
    offer["dph_total"] = round(k * usd * math.exp(rng.gauss(0, 0.22))
                               * (1 + 0.05 * (ram_gib > 400)) + 0.01, 4)
    return offer


def main() -> int:
    rng = random.Random(SEED)
    lines: list[dict[str, object]] = []
    machine_id = 300_000
    while len(lines) < HOSTS:
        machine_id += 1
        row = host(rng, machine_id)
        if row is not None:
            lines.append(row)
    n = write_market(Path(__file__).with_name("pipeline.jsonl.gz"), lines)
    print(f"pipeline market: {n} hosts (simulated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
