"""vast_manager.agent.host (psutil behind one module, cgroup quota) and the simulated host probe."""

from __future__ import annotations

import json
import os
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from vast_manager.agent.host import HostProbe, read_cgroup_quota_cores, read_cpu_model
from vast_manager.sim.fake_host import FakeHostProbe
from vast_manager.sim.hardware import Profile

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
GB = 1_000_000_000


def times(user: float, idle: float, iowait: float = 0.0, guest: float = 0.0) -> CpuTimes:
    return CpuTimes(user, 0.0, 0.0, idle, iowait, 0.0, 0.0, 0.0, guest, 0.0)


class FakePsutil:
    """The psutil calls HostProbe makes, with scripted answers."""

    def __init__(self) -> None:
        self.cpu_reads: list[list[CpuTimes]] = [
            [times(100, 900), times(100, 900)],  # the priming read
            # core 0: +90 busy +10 idle; core 1: +20 busy +60 idle +20 iowait;
            # guest time is inside user already and must not count twice.
            [times(190, 910, guest=50), times(120, 960, iowait=20)],
        ]
        self.net = SimpleNamespace(bytes_recv=1_000, bytes_sent=2_000)

    def cpu_times(self, percpu: bool = False) -> list[CpuTimes]:
        assert percpu
        return self.cpu_reads.pop(0) if len(self.cpu_reads) > 1 else self.cpu_reads[0]

    def cpu_count(self, logical: bool = True) -> int:
        return 2 if logical else 1

    def virtual_memory(self) -> Any:
        return SimpleNamespace(total=64 * GB, available=48 * GB, used=10 * GB)

    def getloadavg(self) -> tuple[float, float, float]:
        return (1.5, 1.0, 0.5)

    def net_io_counters(self) -> Any:
        return self.net

    def disk_usage(self, path: str) -> Any:
        return SimpleNamespace(total=1000, used=400, free=600, path=path)


def probe(tmp_path: Path, cgroup: Path | None = None) -> tuple[HostProbe, FakePsutil]:
    ps = FakePsutil()
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7543 32-Core Processor\n"
    )
    clock = iter([10.0, 11.0, 12.0, 13.0])
    p = HostProbe(
        str(tmp_path / "params"),
        psutil_module=ps,
        cgroup_root=str(cgroup or tmp_path / "nocgroup"),
        cpuinfo_path=str(cpuinfo),
        clock=lambda: next(clock),
        hostname=lambda: "box-1",
    )
    return p, ps


def test_cpu_from_cpu_times_differences(tmp_path: Path) -> None:
    p, _ = probe(tmp_path)
    s = p.sample()
    assert s.per_core_util_pct == [90.0, 20.0]
    assert s.cpu_util_pct == pytest.approx(100 * 110 / 200)
    assert s.iowait_pct == pytest.approx(100 * 20 / 200)
    assert s.load1 == 1.5
    assert s.ram_used_bytes == 16 * GB and s.ram_total_bytes == 64 * GB  # total - available
    assert (s.net_rx_bytes, s.net_tx_bytes) == (1_000, 2_000)
    # Nothing moved since: 0 busy of 0 elapsed gives no figure rather than a guess.
    s2 = p.sample()
    assert s2.cpu_util_pct is None and s2.per_core_util_pct == [0.0, 0.0]


def test_facts(tmp_path: Path) -> None:
    p, _ = probe(tmp_path)
    f = p.facts()
    assert f.hostname == "box-1"
    assert f.cpu_model == "AMD EPYC 7543 32-Core Processor"
    assert (f.cpu_cores_logical, f.cpu_cores_physical) == (2, 1)
    assert f.ram_total_bytes == 64 * GB


def test_disk_usage_of_a_params_dir_not_yet_created(tmp_path: Path) -> None:
    p, _ = probe(tmp_path)
    du = p.disk_usage()
    assert du is not None and du.path == str(tmp_path) and du.free_bytes == 600


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        (
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
            None,
        ),
        ({}, None),
    ],
)
def test_cgroup_quota(tmp_path: Path, files: dict[str, str], cores: float | None) -> None:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert read_cgroup_quota_cores(str(root)) == cores
    p, _ = probe(tmp_path, root)
    assert p.sample().quota_cores == cores


def test_cpu_model_arm_and_missing(tmp_path: Path) -> None:
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n\nModel\t: Raspberry Pi 5\n")
    assert read_cpu_model(str(arm)) == "Raspberry Pi 5"
    assert read_cpu_model(str(tmp_path / "absent")) is None


def test_real_psutil_smoke(tmp_path: Path) -> None:
    p = HostProbe(str(tmp_path))
    f = p.facts()
    assert f.cpu_cores_logical == psutil.cpu_count()
    assert f.ram_total_bytes == psutil.virtual_memory().total
    s = p.sample()
    assert len(s.per_core_util_pct) == psutil.cpu_count()
    assert all(0.0 <= v <= 100.0 for v in s.per_core_util_pct)
    assert s.ram_used_bytes is not None and 0 < s.ram_used_bytes <= f.ram_total_bytes
    assert p.disk_usage() is not None


# --- the simulated host ---------------------------------------------------------------


def sim_profile() -> Profile:
    return Profile.from_offer(
        {
            "gpu_name": "RTX 5060 Ti",
            "num_gpus": 4,
            "cpu_name": "Intel Xeon E5-2680 v4",
            "cpu_cores_effective": 16,
            "cpu_ram": 128_000,
        }
    )


def test_fake_host_looks_cpu_bound_when_the_simulation_is(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    now = 1_764_460_000.0
    state.write_text(
        json.dumps(
            {
                "ts": now,
                "gpus": [],
                "cpu": {"util_pct": 97.0, "load1": 22.5, "iowait_pct": 0.3},
                "ram": {"used_bytes": 100 * GB, "total_bytes": 128 * GB},
            }
        )
    )
    clock = iter(range(100))
    host = FakeHostProbe(
        str(tmp_path),
        sim_profile(),
        str(state),
        seed=1,
        wall_clock=lambda: now + 0.5,
        clock=lambda: float(next(clock)),
    )
    f = host.facts()
    assert (f.cpu_model, f.cpu_cores_logical, f.ram_total_bytes) == (
        "Intel Xeon E5-2680 v4",
        16,
        128 * GB,
    )
    s = host.sample()
    assert s.cpu_util_pct == 97.0 and s.load1 == 22.5 and s.iowait_pct == 0.3
    assert len(s.per_core_util_pct) == 16
    assert sum(s.per_core_util_pct) / 16 == pytest.approx(97.0, abs=3.0)
    assert s.ram_used_bytes == 100 * GB and s.quota_cores == 16.0
    later = host.sample()
    assert later.net_rx_bytes is not None and s.net_rx_bytes is not None
    assert later.net_rx_bytes > s.net_rx_bytes


def test_fake_host_idle_without_a_daemon(tmp_path: Path) -> None:
    host = FakeHostProbe(str(tmp_path), sim_profile(), str(tmp_path / "none.json"), noise=False)
    s = host.sample()
    assert s.cpu_util_pct is not None and s.cpu_util_pct < 5.0
    assert s.per_core_util_pct == [s.cpu_util_pct] * 16
    assert s.ram_total_bytes == 128 * GB
    du = host.disk_usage()
    assert du is not None and du.total_bytes > 0 and os.path.isdir(du.path)


def test_memory_limit_from_cgroup_v2_v1_and_meminfo(tmp_path: Path) -> None:
    from vast_manager.agent.host import MemoryLimit, read_memory_limit

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       528280124 kB\nMemFree:        1 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("274877906944\n")
    got = read_memory_limit(str(v2), str(meminfo))
    assert got == MemoryLimit(528280124 * 1024, 274877906944)
    assert got.usable_bytes == 274877906944  # the container's limit, not the host's RAM
    (v2 / "memory.max").write_text("max\n")
    assert read_memory_limit(str(v2), str(meminfo)).usable_bytes == 528280124 * 1024
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    assert read_memory_limit(str(v1), str(meminfo)).cgroup_limit_bytes is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("137438953472\n")
    assert read_memory_limit(str(v1), str(meminfo)).usable_bytes == 137438953472
    assert read_memory_limit(str(tmp_path / "none"), str(tmp_path / "none")).usable_bytes is None


def test_the_simulated_container_has_its_offers_memory_as_its_limit() -> None:
    shared = Profile.from_offer({"cpu_ram": 128000, "sim": {"host_ram_mb": 512000}})
    probe = FakeHostProbe(".", shared, "")
    assert probe.memory_limit().mem_total_bytes == 512000 * 10**6
    assert probe.memory_limit().usable_bytes == 128000 * 10**6
    whole = FakeHostProbe(".", Profile.from_offer({"cpu_ram": 257000}), "")
    assert whole.memory_limit().cgroup_limit_bytes is None
