"""A market generated at test time, from forms the rate model's authors did not write.

Neither ``sim/physics.py`` (the simulated cuzk the structural model mirrors) nor the
shipped markets' generators (``bench/markets/``): every form here is a different
family of function, on purpose, so that a test on it checks what holds on a market the
model was not written from:

- **GPU speed** is the geometric mean of memory bandwidth and compute (not bandwidth,
  not a table), and several GPUs scale **sub-linearly, Amdahl-like**: k / (1 + 0.1 (k-1));
- **PCIe** feeds the GPUs by an **exponential saturation**, compute x (1 - e^(-supply /
  compute)), and the GPUs of one host **share** a narrow link (a x8 or narrower host's
  link divided among its GPUs, which the offer's pcie_bw does not show);
- **CPU synthesis** rises as vCPUs^0.6 x GHz^1.2, times a vendor factor and a hidden
  per-host factor (lognormal, 0.15): no families, no cores cap;
- **RAM** helps by a **saturating exponential** of the share above 60 GiB: no staircase,
  no step, no swap square;
- the stages meet by a **p-norm** (p = 3): neither a hard min nor a harmonic sum;
- host effects are normal on the GPU (0.05) and the whole rate (0.05); a benchmark has
  4% noise and 3% of them catch a neighbour (-20%).

Every host line carries ``true_binding``: the resource whose doubling would raise the
host's true rate most (``gpu``, ``cpu``, ``pcie`` or ``memory``). Every rate is simulated.

``python tests/support/foreign_market.py OUT.jsonl.gz [--seed N] [--hosts N]`` writes a
market file the bench reads (``bench/discovery.py --market OUT.jsonl.gz``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

# name: (memory bandwidth GB/s, fp32 TFLOPs, memory MB, $/GPU-hour median, weight) --
# vendor spec sheets rounded; prices vast.ai-like.
GPUS: dict[str, tuple[float, float, int, float, float]] = {
    "RTX 4090": (1008, 82.6, 24564, 0.35, 0.25),
    "RTX 3090": (936, 35.6, 24576, 0.20, 0.18),
    "RTX 5090": (1792, 104.8, 32607, 0.60, 0.12),
    "RTX 4080": (717, 48.7, 16376, 0.22, 0.10),
    "RTX A6000": (768, 38.7, 49140, 0.45, 0.08),
    "L40S": (864, 91.6, 46068, 0.70, 0.07),
    "A100 SXM4": (2039, 19.5, 81920, 0.95, 0.08),
    "H100 PCIE": (2000, 51.2, 81559, 1.70, 0.06),
    "RTX 5070 Ti": (896, 43.9, 16303, 0.17, 0.06),
}
# name, threads, base GHz, PCIe generation
CPUS = (
    ("AMD EPYC 7302 16-Core Processor", 32, 3.0, 4),
    ("AMD EPYC 7713 64-Core Processor", 128, 2.0, 4),
    ("AMD EPYC 9454 48-Core Processor", 96, 2.75, 5),
    ("Intel(R) Xeon(R) Silver 4314 CPU @ 2.40GHz", 32, 2.4, 4),
    ("Intel(R) Xeon(R) Gold 6448Y", 64, 2.1, 5),
    ("Intel(R) Xeon(R) E5-2680 v4 @ 2.40GHz", 28, 2.4, 3),
    ("AMD Ryzen Threadripper PRO 7985WX 64-Cores", 128, 3.2, 5),
    ("AMD Ryzen 9 5950X 16-Core Processor", 32, 3.4, 4),
)
PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938}
MIN_RAM_SHARE_GB = 128.0  # the coordinator's VM_MIN_INSTANCE_RAM_GB default
P_NORM = 3.0


def _gpu_rate(bw: float, tflops: float, k: int, gpu_f: float) -> float:
    per_gpu = math.sqrt(bw * tflops) * gpu_f / 3.5
    return per_gpu * k / (1.0 + 0.1 * (k - 1))


def _fed(compute: float, supply: float) -> float:
    """What GPUs that could prove ``compute`` per hour prove when their link can feed
    ``supply``: an exponential saturation (stalls grow as the supply falls short)."""
    return compute * (1.0 - math.exp(-supply / compute))


def _cpu_rate(vcpus: float, ghz: float, vendor: float, cpu_f: float) -> float:
    return 4.0 * vcpus**0.6 * ghz**1.2 * vendor * cpu_f


def _ram_factor(ram_gib: float) -> float:
    return max(0.15, 1.0 - math.exp(-(ram_gib - 60.0) / 70.0))


def rate(h: dict[str, Any], gpu_f: float, cpu_f: float, general: float,
         double: str | None = None) -> float:
    """The host's steady-state rate; with ``double``, that resource doubled."""
    two = {name: 2.0 if double == name else 1.0 for name in ("gpu", "cpu", "pcie", "memory")}
    gpu = _fed(_gpu_rate(h["bw"], h["tflops"], h["k"], gpu_f * two["gpu"]),
               8.0 * h["per_gpu_gbps"] * h["k"] * two["pcie"])
    cpu = _cpu_rate(h["vcpus"], h["ghz"], h["vendor"], cpu_f * two["cpu"])
    both = (gpu ** -P_NORM + cpu ** -P_NORM) ** (-1.0 / P_NORM)
    return both * _ram_factor(h["ram_gib"] * two["memory"]) * general


def binding(h: dict[str, Any], gpu_f: float, cpu_f: float, general: float) -> str:
    """The resource whose doubling raises the rate most."""
    return max(("gpu", "cpu", "pcie", "memory"),
               key=lambda r: rate(h, gpu_f, cpu_f, general, double=r))


def _ape_point(draws: list[float]) -> float:
    """The point with the least expected absolute percentage error: the median of the
    draws weighted by 1/rate."""
    draws = sorted(draws)
    weights = [1.0 / d for d in draws]
    half, acc = sum(weights) / 2.0, 0.0
    for d, w in zip(draws, weights, strict=True):
        acc += w
        if acc >= half:
            return d
    return draws[-1]


def host(rng: random.Random, machine_id: int) -> dict[str, Any] | None:
    names = list(GPUS)
    gpu = rng.choices(names, weights=[GPUS[g][4] for g in names])[0]
    bw, tflops, mem_mb, usd, _ = GPUS[gpu]
    host_gpus = rng.choice((1, 2, 2, 3, 4, 4, 6, 8))
    cpu_name, threads, ghz, gen = rng.choice(CPUS)
    cores = threads * (2 if host_gpus >= 4 and rng.random() < 0.5 else 1)
    ram_gb = rng.choice((128, 192, 256, 256, 384, 512, 768, 1024))
    k = rng.choice(sorted({1, host_gpus} | {x for x in (2, 4) if x <= host_gpus}))
    share = k / host_gpus
    lanes = rng.choice((16, 16, 16, 8, 8, 4))
    link = PER_LANE[gen] * lanes * rng.uniform(0.7, 0.95)
    # A narrow link is shared by the host's GPUs (a switch behind x8 or less).
    per_gpu = link / (host_gpus if lanes <= 8 else 1) * (host_gpus if lanes <= 8 else 1) ** 0.3
    offer: dict[str, Any] = {
        "id": machine_id * 10 + k, "machine_id": machine_id, "host_id": machine_id // 4,
        "num_gpus": k, "gpu_name": gpu, "gpu_ram": mem_mb,
        "gpu_mem_bw": round(bw * math.exp(rng.gauss(0, 0.03)), 1),
        "total_flops": round(tflops * k, 1),
        "dlperf": round(math.sqrt(bw * tflops) / 8.0 * k * math.exp(rng.gauss(0, 0.05)), 1),
        "compute_cap": 890, "cpu_name": cpu_name, "cpu_cores": cores,
        "cpu_cores_effective": round(cores * share, 1), "cpu_ghz": ghz,
        "cpu_ram": round(ram_gb * 1024), "disk_bw": round(rng.uniform(800, 5000)),
        "pci_gen": gen, "gpu_lanes": lanes, "pcie_bw": round(link, 1),
        "inet_down": round(rng.uniform(200, 3000)), "inet_up": round(rng.uniform(100, 1500)),
        "reliability": round(rng.uniform(0.95, 0.999), 4),
        "geolocation": rng.choice(("Oregon, US", "Poland, PL", "Japan, JP")),
        "duration": 30 * 86400.0,
    }
    ram_share_gb = offer["cpu_ram"] / 1000.0 * min(1.0, offer["cpu_cores_effective"] / cores)
    if ram_share_gb < MIN_RAM_SHARE_GB:
        return None
    h = {"bw": bw, "tflops": tflops, "k": k, "per_gpu_gbps": per_gpu,
         "vcpus": offer["cpu_cores_effective"], "ghz": ghz,
         "vendor": 1.1 if cpu_name.startswith("AMD") else 0.9,
         "ram_gib": ram_share_gb * 1e9 / 2**30}

    def hidden() -> tuple[float, float, float]:
        return (math.exp(rng.gauss(0, 0.05)), math.exp(rng.gauss(0, 0.15)),
                math.exp(rng.gauss(0, 0.05)))

    own = hidden()
    true = rate(h, *own)
    offer["true_rate_per_hour"] = round(true, 3)
    offer["true_binding"] = binding(h, *own)
    noise = math.exp(rng.gauss(0, 0.04)) * (0.8 if rng.random() < 0.03 else 1.0)
    offer["measured_rate_per_hour"] = round(true * noise, 3)
    offer["oracle_rate_per_hour"] = round(_ape_point([rate(h, *hidden()) for _ in range(31)]), 3)
    offer["dph_total"] = round(k * usd * math.exp(rng.gauss(0, 0.25)) + 0.01, 4)
    return offer


def generate(seed: int, hosts: int = 1000) -> list[dict[str, Any]]:
    """``hosts`` host lines (each an offer the coordinator would deploy), seeded."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    machine_id = 900_000
    while len(out) < hosts:
        machine_id += 1
        row = host(rng, machine_id)
        if row is not None:
            out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--hosts", type=int, default=1000)
    args = ap.parse_args()
    rows = generate(args.seed, args.hosts)
    with open(args.out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:
        for row in rows:
            out.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
    print(f"foreign market: {len(rows)} hosts (simulated), seed {args.seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
