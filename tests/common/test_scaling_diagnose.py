"""vast_manager.common.scaling: efficiency, bottleneck rules, evidence with numbers.

The last tests drive the same verdicts through the fake NVML and the
sampler, from state files shaped like the simulated cuzk daemon's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from vast_manager.agent.gpu import Nvml, open_devices
from vast_manager.agent.sampler import Sampler, Sources
from vast_manager.common.scaling import (
    describe_throttle,
    diagnose,
    efficiency,
    gpu_label,
    link_capacity_gbps,
)
from vast_manager.protocol.messages import (
    CpuTelemetry,
    CuzkTelemetry,
    CuzkWorker,
    Gpu,
    GpuTelemetry,
    NetTelemetry,
    RamTelemetry,
    Result,
    Telemetry,
)
from vast_manager.sim.fake_host import FakeHostProbe
from vast_manager.sim.fake_nvml import FakeNvml
from vast_manager.sim.hardware import Profile

GB = 1_000_000_000


def gpu_t(
    index: int,
    util: float,
    tx_kbps: float = 200_000.0,
    rx_kbps: float = 800_000.0,
    gen: int | None = None,
    width: int | None = None,
    throttle: int = 0,
) -> GpuTelemetry:
    return GpuTelemetry(
        index=index,
        util_pct_mean=util,
        util_pct_max=min(100.0, util + 5),
        mem_used_bytes=12 * GB,
        pcie_tx_kbps_mean=tx_kbps,
        pcie_rx_kbps_mean=rx_kbps,
        power_w_mean=150.0,
        temp_c_max=65.0,
        sm_clock_mhz_mean=2500.0,
        throttle_reasons=throttle,
        pcie_gen_current=gen,
        pcie_width_current=width,
    )


def telemetry(
    gpus: list[GpuTelemetry],
    cpu_util: float,
    cores: int = 16,
    ram_used: int = 100 * GB,
    ram_total: int = 257 * GB,
    cuzk: CuzkTelemetry | None = None,
) -> Telemetry:
    return Telemetry(
        window_s=600.0,
        samples=600,
        gpus=gpus,
        cpu=CpuTelemetry(
            util_pct_mean=cpu_util,
            per_core_util_pct_mean=[cpu_util] * cores,
            load1=cores * cpu_util / 100 * 1.3,
            iowait_pct_mean=0.2,
            quota_cores=float(cores),
        ),
        ram=RamTelemetry(used_bytes=ram_used, total_bytes=ram_total),
        net=NetTelemetry(rx_bytes_per_s=1000.0, tx_bytes_per_s=1000.0),
        cuzk=cuzk,
    )


def inventory(n: int, gen_max: int, width_max: int, gen_now: int = 1) -> list[Gpu]:
    # gen_now=1: read at hello time, when the idle link had trained down.
    return [
        Gpu(i, f"GPU-{i}", "NVIDIA GeForce", 16 * GB, gen_max, width_max, gen_now, width_max)
        for i in range(n)
    ]


# --- the three hosts of acceptance 1 -----------------------------------------------


def test_cpu_bound_4x_5060ti() -> None:
    t = telemetry([gpu_t(i, 45.0, gen=5, width=8) for i in range(4)], cpu_util=97.0)
    d = diagnose(4, 38.8, 24.3, t, inventory(4, 5, 8))
    assert d.bottleneck == "cpu"
    assert d.efficiency == pytest.approx(38.8 / (4 * 24.3), abs=1e-4)
    assert "CPU 97% busy while GPUs 0-3 idle 55% of the time" in d.evidence
    assert any("efficiency 0.40" in e and "38.8/h" in e for e in d.evidence)


def test_pcie_bound_gen3_x4_risers() -> None:
    # 3.7 GB/s RX on a Gen3 x4 link (3.94 GB/s) = 94%.
    gpus = [gpu_t(i, 62.0, rx_kbps=3_500_000.0, gen=3, width=4) for i in range(4)]
    gpus[2] = gpu_t(2, 60.0, rx_kbps=3_700_000.0, gen=3, width=4)
    d = diagnose(4, 120.0, 48.0, telemetry(gpus, cpu_util=55.0), inventory(4, 3, 4))
    assert d.bottleneck == "pcie"
    assert d.evidence[1] == "PCIe RX 3.7 GB/s on GPU 2 = 94% of its Gen3 x4 link (3.9 GB/s)"
    assert d.efficiency == pytest.approx(0.625)


def test_gpu_bound_2x_4080_super() -> None:
    t = telemetry(
        [gpu_t(0, 97.0, gen=4, width=16), gpu_t(1, 96.0, gen=4, width=16)], cpu_util=48.0, cores=32
    )
    d = diagnose(2, 95.0, 49.5, t, inventory(2, 4, 16))
    assert d.bottleneck == "gpu"
    assert d.efficiency is not None and d.efficiency > 0.9
    assert any(e.startswith("GPUs 0-1 busy 96% of the time") for e in d.evidence), d.evidence


# --- memory, unknown and the edges ---------------------------------------------------


def test_memory_from_cuzk_budget() -> None:
    cuzk = CuzkTelemetry(
        samples=600,
        workers=[CuzkWorker(0, 70.0), CuzkWorker(1, 68.0)],
        synthesis_active_mean=2.0,
        synthesis_max=4,
        queue_depth_mean=3.0,
        memory_used_bytes_max=241 * GB,
        memory_total_bytes=245 * GB,
    )
    t = telemetry([gpu_t(0, 70.0), gpu_t(1, 68.0)], cpu_util=60.0, cuzk=cuzk)
    d = diagnose(2, 60.0, 40.0, t, inventory(2, 4, 16))
    assert d.bottleneck == "memory"
    assert "cuzk memory 241.0 GB used of its 245.0 GB budget (98%)" in d.evidence


def test_memory_from_ram() -> None:
    t = telemetry(
        [gpu_t(0, 70.0), gpu_t(1, 68.0)], cpu_util=60.0, ram_used=250 * GB, ram_total=257 * GB
    )
    d = diagnose(2, 60.0, 40.0, t, inventory(2, 4, 16))
    assert d.bottleneck == "memory"
    assert "RAM 250.0 GB used of 257.0 GB (97%)" in d.evidence


def test_unknown_quotes_what_was_seen() -> None:
    t = telemetry([gpu_t(0, 70.0, gen=4, width=16), gpu_t(1, 72.0, gen=4, width=16)], cpu_util=60.0)
    d = diagnose(2, 70.0, 45.0, t, inventory(2, 4, 16))
    assert d.bottleneck == "unknown"
    assert "CPU 60% busy" in d.evidence
    assert any(e.startswith("GPUs 0-1 busy 71% of the time") for e in d.evidence)
    assert any(e.startswith("busiest PCIe RX 0.8 GB/s on GPU 0") for e in d.evidence)


def test_no_telemetry_is_unknown_with_efficiency() -> None:
    d = diagnose(4, 38.8, 25.0, None, [])
    assert d.bottleneck == "unknown"
    assert d.efficiency == pytest.approx(0.388)
    assert any("no telemetry" in e for e in d.evidence)


def test_cuzk_synthesis_saturated_while_workers_idle_is_cpu() -> None:
    cuzk = CuzkTelemetry(
        samples=600,
        workers=[CuzkWorker(i, 45.0) for i in range(4)],
        synthesis_active_mean=7.8,
        synthesis_max=27,  # /status max_concurrent: the budget over 9 GiB, not a cap
        queue_depth_mean=6.0,
        memory_used_bytes_max=100 * GB,
        memory_total_bytes=245 * GB,
        synthesis_slots=8,
    )
    # Host CPU looks only 85% busy (other tenants' idle cores dilute it), but
    # cuzk's own view says synthesis is the limit.
    t = telemetry([gpu_t(i, 45.0) for i in range(4)], cpu_util=85.0, cuzk=cuzk)
    d = diagnose(4, 38.8, 24.0, t, inventory(4, 5, 8))
    assert d.bottleneck == "cpu"
    assert (
        "cuzk synthesis 7.8 of its 8 workers busy while its GPUs had no partition 55% of "
        "the time" in d.evidence
    )
    # Against /status max_concurrent alone there is no cap to be full against.
    cuzk.synthesis_slots = None
    assert not any("cuzk synthesis" in e for e in diagnose(4, 38.8, 24.0, t,
                                                           inventory(4, 5, 8)).evidence)


def test_pcie_uses_slot_max_not_idle_current_link() -> None:
    # No under-load link in telemetry; hello saw Gen1 (idle). 3.0 GB/s on a
    # Gen4 x16 slot is 10%, not 120% of a Gen1 x16 link.
    t = telemetry([gpu_t(0, 70.0, rx_kbps=3_000_000.0)], cpu_util=50.0)
    d = diagnose(1, 50.0, 50.0, t, inventory(1, 4, 16, gen_now=1))
    assert d.bottleneck == "unknown"
    assert any("10% of its Gen4 x16 link (31.5 GB/s)" in e for e in d.evidence)


def test_throttle_reasons_in_words_and_in_evidence() -> None:
    assert describe_throttle(None) == []
    assert describe_throttle(0) == []
    assert describe_throttle(0x1) == ["idle"]
    assert describe_throttle(0x4 | 0x20 | 0x40) == ["SW power cap", "SW thermal", "HW thermal"]
    assert describe_throttle(0x2 | 0x8) == ["app clocks", "HW slowdown"]
    assert describe_throttle(0x10000) == ["other (0x10000)"]
    t = telemetry([gpu_t(0, 97.0, throttle=0x1 | 0x20)], cpu_util=40.0)
    d = diagnose(1, 60.0, 60.0, t, inventory(1, 4, 16))
    assert "GPU 0 clocks held back: SW thermal" in d.evidence


def test_link_capacity_and_helpers() -> None:
    assert link_capacity_gbps(4, 16) == pytest.approx(31.5, abs=0.01)
    assert link_capacity_gbps(4, 4) == pytest.approx(7.88, abs=0.01)
    assert link_capacity_gbps(3, 4) == pytest.approx(3.94)
    assert link_capacity_gbps(None, 16) is None
    assert link_capacity_gbps(9, 16) is None
    assert link_capacity_gbps(4, 0) is None
    assert efficiency(2, 10.0, 0.0) is None
    assert efficiency(0, 10.0, 5.0) is None
    assert gpu_label([3]) == "GPU 3"
    assert gpu_label([0, 1, 2, 3]) == "GPUs 0-3"
    assert gpu_label([0, 2, 5]) == "GPUs 0, 2, 5"


def test_evidence_fits_a_scaling_result() -> None:
    t = telemetry(
        [gpu_t(i, 45.0, rx_kbps=7_000_000.0, gen=3, width=4, throttle=0xFF) for i in range(64)],
        cpu_util=97.0,
    )
    d = diagnose(64, 100.0, 5.0, t, inventory(64, 3, 4))
    Result(
        "r1",
        "scaling",
        "porep-c2-32g",
        0.0,
        1.0,
        list(range(64)),
        1,
        0,
        1.0,
        1.0,
        [1.0],
        t,
        runs=[],
        efficiency=d.efficiency,
        bottleneck=d.bottleneck,  # type: ignore[arg-type]
        evidence=d.evidence,
    )._check("")
    assert len(d.evidence) <= 64 and all(len(e) <= 1024 for e in d.evidence)


# --- through the fake NVML and the sampler ----------------------------------------------


def _state(
    num_gpus: int, util: float, rx_kbps: float, gen: int, width: int, cpu: float, ts: float
) -> dict[str, object]:
    """A state file as the simulated cuzk daemon writes it (docs/architecture.md)."""
    return {
        "ts": ts,
        "gpus": [
            {
                "index": i,
                "util_pct": util,
                "mem_used_bytes": 11 * GB,
                "pcie_tx_kbps": rx_kbps / 4,
                "pcie_rx_kbps": rx_kbps,
                "power_w": 200.0,
                "temp_c": 66.0,
                "sm_clock_mhz": 2500.0,
                "throttle_reasons": 0,
                "pcie_gen_current": gen,
                "pcie_width_current": width,
            }
            for i in range(num_gpus)
        ],
        "cpu": {"util_pct": cpu, "load1": 20.0, "iowait_pct": 0.4},
        "ram": {"used_bytes": 120 * GB, "total_bytes": 257 * GB},
    }


@pytest.mark.parametrize(
    ("offer", "util", "rx_kbps", "cpu", "rates", "verdict", "quoted"),
    [
        (
            {"gpu_name": "RTX 5060 Ti", "num_gpus": 4, "pci_gen": 5, "gpu_lanes": 8},
            45.0,
            900_000.0,
            97.0,
            (38.8, 24.3),
            "cpu",
            "CPU 97% busy while GPUs 0-3 idle 55%",
        ),
        (
            {"gpu_name": "RTX 3090", "num_gpus": 4, "pci_gen": 3, "gpu_lanes": 4},
            60.0,
            3_700_000.0,
            50.0,
            (120.0, 48.0),
            "pcie",
            "= 94% of its Gen3 x4 link (3.9 GB/s)",
        ),
        (
            {"gpu_name": "RTX 4080 Super", "num_gpus": 2, "pci_gen": 4, "gpu_lanes": 16},
            97.0,
            1_500_000.0,
            45.0,
            (95.0, 49.5),
            "gpu",
            "GPUs 0-1 busy 97% of the time",
        ),
    ],
)
def test_profiles_through_fake_nvml(
    tmp_path: Path,
    offer: dict[str, object],
    util: float,
    rx_kbps: float,
    cpu: float,
    rates: tuple[float, float],
    verdict: str,
    quoted: str,
) -> None:
    profile = Profile.from_offer({**offer, "cpu_cores_effective": 16, "cpu_ram": 257_000})
    wall = itertools.count(1_764_460_000.0, 1.0)  # one second per call: always a fresh sample
    now = [1_764_460_000.0]
    state_file = tmp_path / "state.json"
    gen, width = profile.pcie_gen, profile.pcie_width
    state_file.write_text(
        json.dumps(_state(profile.num_gpus, util, rx_kbps, gen, width, cpu, ts=now[0] + 1e6))
    )
    fake = FakeNvml(
        profile, str(state_file), latency_scale=0.0, noise=False, wall_clock=lambda: next(wall)
    )
    nvml = Nvml(fake, register_atexit=False)
    devices = open_devices(nvml)
    host = FakeHostProbe(str(tmp_path), reader=fake.reader, noise=False)
    sources = Sources("sim", host, nvml, devices)
    sampler = Sampler(sources, clock=lambda: now[0])
    wid = sampler.open_window()
    for _ in range(5):
        sampler.sample_once()
        now[0] += 1.0
    t = sampler.close_window(wid)
    assert t is not None and t.samples == 5
    gpus = [d.describe() for d in devices]
    d = diagnose(profile.num_gpus, rates[0], rates[1], t, gpus)
    assert d.bottleneck == verdict, d.evidence
    assert any(quoted in e for e in d.evidence), d.evidence


def test_near_ideal_scaling_with_mostly_busy_gpus_is_gpu_bound() -> None:
    """Efficiency 0.96 with GPUs 87% busy (a short run's fill and drain) is GPU-bound,
    even when cuzk's memory budget is full: memory did not hold the GPUs back."""
    from vast_manager.common.scaling import diagnose
    from vast_manager.protocol import (
        CpuTelemetry,
        CuzkTelemetry,
        GpuTelemetry,
        NetTelemetry,
        RamTelemetry,
        Telemetry,
    )

    gpus = [
        GpuTelemetry(i, 87.0, 100.0, 15 * 10**9, 4e5, 8.9e6, 300.0, 70.0, 2500.0, 0, 4, 16)
        for i in range(2)
    ]
    tele = Telemetry(
        window_s=300.0, samples=300, gpus=gpus,
        cpu=CpuTelemetry(72.0, [72.0] * 64, 40.0, 0.5),
        ram=RamTelemetry(507 * 10**9, 515 * 10**9),
        net=NetTelemetry(1e5, 1e5),
        cuzk=CuzkTelemetry(300, [], 10.0, 16, 0.0, 504 * 10**9, 506 * 10**9),
    )
    d = diagnose(2, 130.5, 67.7, tele, [])
    assert d.bottleneck == "gpu"
    assert d.efficiency == round(130.5 / (2 * 67.7), 4)
    assert any("87%" in e and "0.96" in e for e in d.evidence)
