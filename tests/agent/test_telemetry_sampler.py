"""agent.sampler: aggregation arithmetic, windows, cuzk /status, a hung GPU, flat memory."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from vast_manager.agent.gpu import GpuSnapshot, Nvml, open_devices
from vast_manager.agent.host import HostSample
from vast_manager.agent.sampler import MAX_OPEN_WINDOWS, Sampler, Sources
from vast_manager.protocol.codec import decode, encode
from vast_manager.protocol.messages import Telemetry
from vast_manager.sim.fake_host import FakeHostProbe
from vast_manager.sim.fake_nvml import FakeNvml
from vast_manager.sim.hardware import Profile

GB = 1_000_000_000
PROFILE = Profile.from_offer({"gpu_name": "RTX 4090", "num_gpus": 2, "cpu_cores_effective": 4})


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_sources(tmp_path: Path, **fake_kw: Any) -> tuple[Sources, FakeNvml]:
    fake = FakeNvml(PROFILE, str(tmp_path / "no-state.json"), latency_scale=0.0, **fake_kw)
    nvml = Nvml(fake, register_atexit=False)
    host = FakeHostProbe(str(tmp_path), reader=fake.reader)
    return Sources("sim", host, nvml, open_devices(nvml)), fake


def snap(
    index: int,
    util: float | None,
    *,
    mem: int | None = 1,
    tx: float | None = 100.0,
    power: float | None = 200.0,
    temp: float | None = 60.0,
    clock: float | None = 2000.0,
    throttle: int | None = 0,
    gen: int | None = 4,
    width: int | None = 16,
) -> GpuSnapshot:
    return GpuSnapshot(index, util, mem, 24 * GB, tx, tx, gen, width, power, temp, clock, throttle)


def host(
    t: float,
    util: float,
    cores: list[float],
    rx: int,
    tx: int,
    *,
    iowait: float | None = 1.0,
    load1: float = 2.0,
    ram: int = 10 * GB,
) -> HostSample:
    return HostSample(t, util, cores, iowait, load1, ram, 64 * GB, rx, tx, 4.0)


def test_gpu_aggregation_arithmetic(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    clock = Clock()
    s = Sampler(sources, clock=clock)
    wid = s.open_window()
    s.ingest_gpu(
        snap(
            0,
            10.0,
            mem=5 * GB,
            tx=1000.0,
            power=100.0,
            temp=50.0,
            clock=1000.0,
            throttle=0x1,
            gen=1,
            width=16,
        )
    )
    s.ingest_gpu(
        snap(
            0,
            50.0,
            mem=9 * GB,
            tx=3000.0,
            power=300.0,
            temp=70.0,
            clock=2000.0,
            throttle=0x4,
            gen=4,
            width=16,
        )
    )
    s.ingest_gpu(
        snap(
            0,
            90.0,
            mem=7 * GB,
            tx=None,
            power=None,
            temp=65.0,
            clock=3000.0,
            throttle=0x20,
            gen=4,
            width=8,
        )
    )
    s.ingest_gpu(
        snap(
            0,
            None,
            mem=None,
            tx=None,
            power=None,
            temp=None,
            clock=None,
            throttle=None,
            gen=None,
            width=None,
        )
    )  # a reading NVML said nothing in
    s.ingest_host(host(1.0, 50.0, [40.0, 60.0], 0, 0))
    clock.t += 10.0
    t = s.close_window(wid)
    assert t is not None
    g0, g1 = t.gpus
    assert (g0.util_pct_mean, g0.util_pct_max) == (50.0, 90.0)
    assert g0.mem_used_bytes == 9 * GB  # the window's maximum
    assert g0.pcie_tx_kbps_mean == 2000.0 and g0.power_w_mean == 200.0
    assert g0.temp_c_max == 70.0 and g0.sm_clock_mhz_mean == 2000.0
    assert g0.throttle_reasons == 0x1 | 0x4 | 0x20
    assert (g0.pcie_gen_current, g0.pcie_width_current) == (4, 16)  # the link under load
    assert t.samples == 3 and t.window_s == 10.0
    # GPU 1 gave nothing in this window (hung, say): all null, still listed.
    assert g1.index == 1 and g1.util_pct_mean is None and g1.throttle_reasons is None
    assert s.close_window(wid) is None  # forgotten


def test_host_aggregation_and_rolling(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    clock = Clock()
    s = Sampler(sources, clock=clock)
    wid = s.open_window()
    s.ingest_host(host(0.0, 90.0, [80.0, 100.0], 1_000, 5_000, iowait=2.0, load1=3.0, ram=20 * GB))
    s.ingest_host(host(1.0, 70.0, [60.0, 80.0], 3_000, 6_000, iowait=None, load1=4.0, ram=30 * GB))
    s.ingest_host(host(2.0, 50.0, [40.0, 60.0], 5_000, 7_000, iowait=4.0, load1=5.0, ram=25 * GB))
    clock.t += 3.0
    t = s.roll_window(wid)
    assert t is not None
    assert t.cpu.util_pct_mean == 70.0
    assert t.cpu.per_core_util_pct_mean == [60.0, 80.0]
    assert t.cpu.iowait_pct_mean == 3.0  # the null reading is left out, not counted as 0
    assert t.cpu.load1 == 5.0 and t.cpu.quota_cores == 4.0
    assert (t.ram.used_bytes, t.ram.total_bytes) == (30 * GB, 64 * GB)
    assert (t.net.rx_bytes_per_s, t.net.tx_bytes_per_s) == (2000.0, 1000.0)
    assert t.samples == 3 and t.window_s == 3.0 and t.cuzk is None
    # The rolled window restarts now and measures its rates from where the last ended.
    assert s.roll_window(wid) is None  # no reading yet
    s.ingest_host(host(4.0, 10.0, [10.0, 10.0], 9_000, 7_000))
    t2 = s.roll_window(wid)
    assert t2 is not None and t2.samples == 1
    assert t2.net.rx_bytes_per_s == 2000.0 and t2.net.tx_bytes_per_s == 0.0
    assert decode(Telemetry, encode(t2)) == t2  # the wire shape holds
    assert s.roll_window(999) is None


def test_windows_are_independent_and_bounded(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    s = Sampler(sources, clock=Clock())
    heartbeat = s.open_window()
    s.ingest_host(host(0.0, 20.0, [20.0], 0, 0))
    bench = s.open_window()
    s.ingest_host(host(1.0, 80.0, [80.0], 0, 0))
    tb = s.close_window(bench)
    th = s.roll_window(heartbeat)
    assert tb is not None and th is not None
    assert (tb.samples, tb.cpu.util_pct_mean) == (1, 80.0)
    assert (th.samples, th.cpu.util_pct_mean) == (2, 50.0)
    ids = [s.open_window() for _ in range(MAX_OPEN_WINDOWS + 3)]
    assert s.roll_window(heartbeat) is None  # the oldest went first
    assert s.close_window(ids[-1]) is None  # open, but nothing read yet


def test_cuzk_status_aggregation(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    s = Sampler(sources, clock=Clock())
    s.set_cuzk_status_url("http://127.0.0.1:9/status", synthesis_slots=6)  # not polled
    wid = s.open_window()

    def status(state0: str, state1: str, active: int, queue: int, used: int) -> dict[str, Any]:
        # busy_secs is the current busy stretch, null when idle (status.rs): it says
        # nothing about the time between polls, so it is not differenced.
        def worker(wid: int, ordinal: int, state: str) -> dict[str, Any]:
            return {"worker_id": wid, "gpu_ordinal": ordinal, "state": state,
                    "busy_secs": 2.5 if state == "proving" else None}

        return {
            "memory": {"total_bytes": 200 * GB, "used_bytes": used, "available_bytes": 0},
            "synthesis": {"max_concurrent": 22, "active": active},
            "gpu_workers": [worker(0, 0, state0), worker(1, 1, state1), worker(2, 1, "idle")],
            "counters": {"queue_depth": queue},
        }

    s.ingest_cuzk(status("proving", "idle", 4, 2, 150 * GB))
    s.ingest_cuzk(status("proving", "proving", 3, 4, 180 * GB))
    s.ingest_cuzk(status("idle", "idle", 5, 3, 100 * GB))
    s.ingest_cuzk(status("proving", "idle", 4, 3, 120 * GB))
    s.ingest_cuzk({"synthesis": "garbage", "gpu_workers": [None, {"gpu_ordinal": "x"}]})
    t = s.roll_window(wid)
    assert t is not None and t.cuzk is not None
    c = t.cuzk
    assert c.samples == 5
    # A GPU is busy in a poll when one of its workers is proving.
    assert {w.gpu_ordinal: w.busy_pct for w in c.workers} == {0: 75.0, 1: 25.0}
    assert (c.synthesis_active_mean, c.synthesis_max, c.synthesis_slots) == (4.0, 22, 6)
    assert c.queue_depth_mean == 3.0
    assert (c.memory_used_bytes_max, c.memory_total_bytes) == (180 * GB, 200 * GB)
    # The next window starts afresh.
    s.ingest_cuzk(status("idle", "proving", 1, 0, 100 * GB))
    t2 = s.roll_window(wid)
    assert t2 is not None and t2.cuzk is not None
    assert {w.gpu_ordinal: w.busy_pct for w in t2.cuzk.workers} == {0: 0.0, 1: 100.0}


async def _wait_for(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_hung_gpu_does_not_stall_the_others_or_the_loop(tmp_path: Path) -> None:
    sources, fake = make_sources(tmp_path)
    fake.hang_device(1)
    s = Sampler(sources, interval_s=0.02)
    s.stop_join_s = 0.2  # how long stop() waits for the stuck thread before leaving it
    s.hang_timeout_s = 0.2  # GPU 1 shares a thread with GPU 0 and the host until then
    wid = s.open_window()
    ticks = 0

    async def heartbeat_like() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    hb = asyncio.create_task(heartbeat_like())
    # GPU 1 stays hung until this fires: a roll that waited for it would return only after.
    unhang = threading.Timer(60.0, fake.release_device, (1,))
    try:
        await s.start()
        await _wait_for(lambda: s.host_ticks >= 5 and ticks >= 5)
        unhang.start()
        t = s.roll_window(wid)
        assert unhang.is_alive()  # it returned while GPU 1 was still hung
        assert t is not None and t.samples >= 5
        g0, g1 = t.gpus
        assert g0.util_pct_mean is not None and g0.power_w_mean is not None
        assert g1.util_pct_mean is None and g1.power_w_mean is None and g1.mem_used_bytes is None
        await s.stop()  # returns although GPU 1's thread is stuck in a call
        fake.release_device(1)
    finally:
        unhang.cancel()
        fake.release_device(1)
        hb.cancel()


async def test_threads_sample_at_the_interval_and_stop(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    s = Sampler(sources, interval_s=0.01, max_samples=5)
    wid = s.open_window()
    await s.start()
    await _wait_for(lambda: not s.running)
    await s.stop()
    t = s.close_window(wid)
    assert t is not None and t.samples == 5
    assert all(g.util_pct_mean is not None for g in t.gpus)


async def test_polls_cuzk_status_over_loopback(tmp_path: Path) -> None:
    hits = 0

    async def status(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.json_response(
            {
                "synthesis": {"max_concurrent": 2, "active": 2},
                "gpu_workers": [
                    {"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "busy_secs": float(hits)}
                ],
                "counters": {"queue_depth": 1},
                "memory": {"total_bytes": 10, "used_bytes": 5},
            }
        )

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sources, _ = make_sources(tmp_path)
    s = Sampler(sources, interval_s=0.02)
    try:
        wid = s.open_window()
        s.set_cuzk_status_url(f"http://127.0.0.1:{port}/status")
        await s.start()
        await _wait_for(lambda: hits >= 4)
        t = s.close_window(wid)
        assert t is not None and t.cuzk is not None
        assert t.cuzk.samples >= 3 and t.cuzk.synthesis_max == 2
        assert t.cuzk.memory_used_bytes_max == 5
    finally:
        await s.stop()
        await runner.cleanup()


async def test_end_to_end_sim_sources_from_a_state_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "ts": time.time() + 3600,
                "gpus": [
                    {"index": i, "util_pct": 45.0, "pcie_rx_kbps": 900_000.0} for i in range(4)
                ],
                "cpu": {"util_pct": 97.0, "load1": 30.0, "iowait_pct": 0.2},
                "ram": {"used_bytes": 90 * GB, "total_bytes": 128 * GB},
            }
        )
    )
    monkeypatch.setenv(
        "VM_SIM_PROFILE",
        json.dumps(
            {
                "gpu_name": "RTX 5060 Ti",
                "num_gpus": 4,
                "cpu_cores_effective": 16,
                "cpu_ram": 128_000,
            }
        ),
    )
    monkeypatch.setenv("VM_SIM_STATE_FILE", str(state))
    from vast_manager.sim.agent_run import sim_sources

    sources = sim_sources(str(tmp_path))
    s = Sampler(sources, interval_s=0.1, max_samples=3)
    wid = s.open_window()
    await s.start()
    await _wait_for(lambda: not s.running)
    await s.stop()
    sources.close()
    t = s.close_window(wid)
    assert t is not None and len(t.gpus) == 4 and t.samples == 3
    assert t.cpu.util_pct_mean == 97.0 and len(t.cpu.per_core_util_pct_mean) == 16
    assert all(g.util_pct_mean is not None and 35.0 < g.util_pct_mean < 55.0 for g in t.gpus)
    # Keys the state file left out read as idle values of the profile.
    assert all(g.power_w_mean is not None and g.power_w_mean < 20.0 for g in t.gpus)


@pytest.mark.slow  # 100,000 samples: minutes on 2 cores
def test_memory_flat_over_100000_samples(tmp_path: Path) -> None:
    sources, _ = make_sources(tmp_path)
    s = Sampler(sources, clock=Clock())
    s.set_cuzk_status_url("http://127.0.0.1:9/status")
    heartbeat = s.open_window()
    bench = s.open_window()
    cores = [50.0] * 32
    status = {
        "synthesis": {"max_concurrent": 4, "active": 3},
        "gpu_workers": [{"worker_id": 0, "gpu_ordinal": 0, "state": "proving", "busy_secs": 1.0}],
        "counters": {"queue_depth": 2},
        "memory": {"total_bytes": 10, "used_bytes": 5},
    }

    def run(n: int, start: int) -> None:
        for i in range(start, start + n):
            s.ingest_gpu(snap(0, float(i % 100), throttle=i & 0x7F))
            s.ingest_gpu(snap(1, 50.0))
            s.ingest_host(host(float(i), 50.0, cores, i * 1000, i * 10))
            if i % 10 == 0:
                status["gpu_workers"][0]["busy_secs"] = float(i % 7)  # type: ignore[index]
                s.ingest_cuzk(status)
            if i % 30 == 29:
                s.roll_window(heartbeat)

    tracemalloc.start()
    try:
        run(10_000, 0)
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        run(90_000, 10_000)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    t = s.close_window(bench)
    assert t is not None and t.samples == 100_000
    assert t.gpus[0].throttle_reasons == 0x7F
    # Running aggregates only: at most a few KiB of noise, not 90,000 samples' worth.
    assert after - before < 16 * 1024, (before, after)


def test_a_sampler_refuses_a_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        Sampler(Sources("off", FakeHostProbe(".", PROFILE, "")), interval_s=0)
