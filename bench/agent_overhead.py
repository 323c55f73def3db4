"""CPU and memory the agent's telemetry costs: 8 GPUs sampled at 1 Hz for an hour.

Run: ``python bench/agent_overhead.py`` (options: ``--gpus``, ``--ticks``,
``--interval``, ``--heartbeat-every``).

It runs the real sampler (its threads, aggregation into windows, a heartbeat
window rolled and encoded with ``vast_manager.protocol.codec.encode`` every 30 ticks) over
the fake NVML and fake host for an hour's worth of ticks (3600), on an
accelerated grid so the run takes seconds. The fake NVML's call latencies are
switched OFF: they are wall time spent blocked in the driver, not CPU. The
process CPU time (all threads) of the run IS the CPU the agent would spend in
an hour at 1 Hz. A baseline in the same run wakes the same number of threads
on the same grid and does nothing, so the ratio shows what the sampling work
adds to bare thread wake-ups (the sampler reads up to 8 GPUs per thread, so
8 GPUs are 1 thread; the heartbeat loop's own wake-ups are not in the
baseline). Resident memory is read after the hour of
samples. Everything is simulated; the fake NVML's own Python work (noise,
state lookups) is counted as if it were the driver's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vast_manager.agent.gpu import Nvml, open_devices
from vast_manager.agent.sampler import GPUS_PER_THREAD, Sampler, Sources
from vast_manager.protocol.codec import encode
from vast_manager.protocol.messages import Heartbeat
from vast_manager.sim.fake_host import FakeHostProbe
from vast_manager.sim.fake_nvml import FakeNvml
from vast_manager.sim.hardware import Profile

TARGET_CPU_S_PER_HOUR = 3.6  # 0.1% of one core


def write_state(path: Path, num_gpus: int, cores: int) -> None:
    """A busy host as the simulated daemon would describe it (fresh for a day)."""
    path.write_text(json.dumps({
        "ts": time.time() + 86_400,
        "gpus": [{"index": i, "util_pct": 93.0, "mem_used_bytes": 20_000_000_000,
                  "pcie_tx_kbps": 1_200_000.0, "pcie_rx_kbps": 5_400_000.0, "power_w": 410.0,
                  "temp_c": 71.0, "sm_clock_mhz": 2490.0, "throttle_reasons": 0x4,
                  "pcie_gen_current": 4, "pcie_width_current": 16} for i in range(num_gpus)],
        # Per-core figures as the simulated daemon writes them (the fake host
        # would otherwise draw 64 random numbers a tick, a cost of the fake).
        "cpu": {"util_pct": 45.0, "per_core_util_pct": [45.0] * cores, "load1": 14.2,
                "iowait_pct": 0.5},
        "ram": {"used_bytes": 120_000_000_000, "total_bytes": 512_000_000_000},
    }))


def baseline(threads: int, ticks: int, interval_s: float) -> tuple[float, float]:
    """CPU and wall seconds of ``threads`` threads waking ``ticks`` times and doing nothing."""
    stop = threading.Event()
    start = time.monotonic()

    def idle(t0: float) -> None:
        for slot in range(ticks):
            stop.wait(max(0.0, t0 + slot * interval_s - time.monotonic()))

    cpu0, wall0 = time.process_time(), time.perf_counter()
    # Staggered like the sampler's threads.
    workers = [threading.Thread(target=idle, args=(start + interval_s * i / threads,))
               for i in range(threads)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    return time.process_time() - cpu0, time.perf_counter() - wall0


async def run_sampler(sources: Sources, ticks: int, interval_s: float,
                      heartbeat_every: int) -> tuple[float, float, int, int]:
    """CPU and wall seconds of the sampler's steady state, heartbeats encoded, ticks measured.

    Measured from the end of the first tick: starting threads and the HTTP
    session, and the driver's first (whole-ring) utilisation read, are a
    one-off cost, not an hourly one.
    """
    sampler = Sampler(sources, interval_s=interval_s, max_samples=ticks + 1)
    window = sampler.open_window()
    heartbeats = 0
    await sampler.start()
    while sampler.host_ticks < 1:
        await asyncio.sleep(interval_s / 10)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    next_roll = heartbeat_every
    while sampler.running:
        # The agent's heartbeat loop: sleep a period, roll the window, encode.
        await asyncio.sleep(interval_s * heartbeat_every)
        if sampler.host_ticks >= next_roll or not sampler.running:
            next_roll += heartbeat_every
            telemetry = sampler.roll_window(window)
            encode(Heartbeat(heartbeats, "proving", 0.0, None, 0, [], telemetry))
            heartbeats += 1
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    await sampler.stop()
    return cpu, wall, heartbeats, sampler.host_ticks - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--ticks", type=int, default=3600, help="samples per GPU (3600 = 1 h at 1 Hz)")
    ap.add_argument("--interval", type=float, default=0.005,
                    help="seconds between ticks in this run (accelerated; the agent uses 1.0)")
    ap.add_argument("--heartbeat-every", type=int, default=30, help="ticks per heartbeat")
    ap.add_argument("--cores", type=int, default=64, help="simulated CPU cores (per-core list)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        write_state(state, args.gpus, args.cores)
        profile = Profile.from_offer({"gpu_name": "RTX 4090", "num_gpus": args.gpus,
                                      "cpu_cores_effective": args.cores, "cpu_ram": 512_000})
        fake = FakeNvml(profile, str(state), latency_scale=0.0)  # latency is wall, not CPU
        nvml = Nvml(fake, register_atexit=False)
        sources = Sources("sim", FakeHostProbe(tmp, reader=fake.reader), nvml,
                          open_devices(nvml))
        proc = psutil.Process(os.getpid())
        rss_before = proc.memory_info().rss

        threads = max(1, -(-args.gpus // GPUS_PER_THREAD))  # the sampler's own layout
        base_cpu, base_wall = baseline(threads, args.ticks, args.interval)
        cpu, wall, heartbeats, measured = asyncio.run(
            run_sampler(sources, args.ticks, args.interval, args.heartbeat_every))
        rss_after = proc.memory_info().rss
        nvml.shutdown()

    # Ticks are 1 s apart in the agent.
    cpu_h, base_h = cpu * 3600.0 / measured, base_cpu * 3600.0 / args.ticks
    print(f"agent telemetry overhead: {args.gpus} GPUs + host, {args.ticks} ticks "
          f"(= {args.ticks / 3600:.2f} h at 1 Hz), heartbeat every {args.heartbeat_every} ticks "
          f"({heartbeats} encoded); fake NVML latencies off")
    print(f"  sampler   CPU {cpu:.3f} s over {wall:.1f} s wall -> {cpu_h:.2f} CPU-s/hour "
          f"({1e6 * cpu / measured:.0f} us per tick over {measured} ticks)")
    print(f"  baseline  CPU {base_cpu:.3f} s over {base_wall:.1f} s wall -> {base_h:.2f} "
          f"CPU-s/hour ({threads} threads waking on the same grid, doing nothing)")
    ratio = cpu_h / base_h if base_h > 0 else float("inf")
    print(f"  ratio     sampler / baseline = {ratio:.1f}x; sampling work alone "
          f"{cpu_h - base_h:.2f} CPU-s/hour")
    print(f"  memory    RSS {rss_after / 2**20:.1f} MiB after the hour of samples "
          f"({(rss_after - rss_before) / 2**20:+.1f} MiB over the run)")
    verdict = "PASS" if cpu_h < TARGET_CPU_S_PER_HOUR else "OVER"
    print(f"  target    < {TARGET_CPU_S_PER_HOUR} CPU-s/hour: {verdict}")


if __name__ == "__main__":
    main()
