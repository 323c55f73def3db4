"""End to end: the simulated cuzk daemon (agent.sim.daemon) drives the fake NVML
and fake host through its state file; the sampler's telemetry of a benchmark
batch (the simulated cuzk-bench, after a warm-up proof and its PCE), taken
after the pipeline filled by the daemon's own counters, gets the expected
verdict."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.agent.sampler import Sampler
from vast_manager.common.scaling import diagnose
from vast_manager.sim.agent_run import sim_sources
from vast_manager.sim.fake_c1 import write_c1

pytestmark = pytest.mark.slow

OFFERS: dict[str, dict[str, Any]] = {
    # The operator's 4x RTX 5060 Ti on a 16-thread Broadwell Xeon.
    "cpu": {"gpu_name": "RTX 5060 Ti", "num_gpus": 4, "cpu_name": "Intel Xeon E5-2680 v4",
            "cpu_cores_effective": 16, "cpu_ram": 257_000, "pci_gen": 4, "gpu_lanes": 8},
    # Gen3 x4 risers, with CPU to spare so the link is what is left.
    "pcie": {"gpu_name": "RTX 3090", "num_gpus": 4, "cpu_name": "AMD EPYC 9654 96-Core Processor",
             "cpu_cores_effective": 192, "cpu_ram": 512_000, "pci_gen": 3, "gpu_lanes": 4},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_healthy(session: aiohttp.ClientSession, url: str, proc: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError("simulated daemon not healthy in 30 s")


@pytest.mark.parametrize(("kind", "scale"), [("cpu", 300), ("pcie", 300)])
async def test_sim_daemon_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, scale: int
) -> None:
    offer = {**OFFERS[kind], "sim": {"seed": 1, "noise_pct": 0}}
    engine, status = _free_port(), _free_port()
    config = tmp_path / "cuzk.toml"
    config.write_text(f'[daemon]\nlisten = "127.0.0.1:{engine}"\n'
                      f'status_listen = "127.0.0.1:{status}"\n'
                      f'[srs]\nparam_cache = "{tmp_path}/params"\n')
    monkeypatch.setenv("VM_SIM_PROFILE", json.dumps(offer))
    monkeypatch.setenv("VM_SIM_STATE_FILE", str(tmp_path / "state.json"))
    monkeypatch.setenv("VM_SIM_TIME_SCALE", str(scale))
    proc = subprocess.Popen([sys.executable, "-m", "vast_manager.sim.daemon",
                             "-c", str(config)],
                            env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    sources = sim_sources(str(tmp_path))
    sampler = Sampler(sources, interval_s=0.05)
    c1 = write_c1(tmp_path / "c1.json")
    status_url = f"http://127.0.0.1:{status}/status"

    def bench(count: int, concurrency: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "vast_manager.sim.bench", "--addr", f"http://127.0.0.1:{engine}",
             "batch", "-t", "porep", "--c1", str(c1), "-c", str(count), "-j", str(concurrency)],
            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    async def get(session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.get(status_url) as resp:
            body: dict[str, Any] = await resp.json(content_type=None)
            return body

    try:
        async with aiohttp.ClientSession() as session:
            await _wait_healthy(session, f"http://127.0.0.1:{engine}/sim/v1/health", proc)
            warm = bench(1, 1)
            while warm.poll() is None or not (await get(session))["allocations"]["pce"]:
                await asyncio.sleep(0.02)
            sampler.set_cuzk_status_url(status_url)
            await sampler.start()
            n = offer["num_gpus"]
            window = None
            run = bench(8 * n, n)
            while run.poll() is None:
                finished = (await get(session))["counters"]["total_completed"] - 1
                if window is None and finished >= 2 * n:  # the pipeline is full
                    window = sampler.open_window()
                await asyncio.sleep(0.02)
            assert run.returncode == 0
            assert window is not None
            telemetry = sampler.close_window(window)
    finally:
        await sampler.stop()
        sources.close()
        proc.terminate()
        proc.wait(timeout=30)
    assert telemetry is not None and telemetry.samples >= 5
    assert telemetry.cuzk is not None and telemetry.cuzk.samples >= 5
    gpus = [d.describe() for d in sources.devices]
    verdict = diagnose(len(gpus), 1.0, 1.0, telemetry, gpus)
    assert verdict.bottleneck == kind, verdict.evidence
