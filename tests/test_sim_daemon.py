"""The simulated cuzk daemon and bench as real processes on loopback.

Each test starts ``python -m agent.sim.daemon`` on free ports with a large
time scale (simulated seconds per real second), waits for readiness with a
deadline, and reaps every process it started.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SCALE = "3000"  # a ~60 s simulated proof takes ~20 ms
DEADLINE_S = 20.0

HEADER = ["=== Batch Benchmark ===", "proof type:  porep"]
PROOF_LINE = re.compile(
    r"^  \[(\d+)/(\d+)\] (COMPLETED|FAILED) \u2014 (\d+\.\d)s "
    r"\(prove=(\d+) ms, queue=(\d+) ms\)$"
)
TOTAL_LINE = re.compile(r"^total time:    (\d+\.\d)s$")
STATS_LINE = re.compile(
    r"^(?:(wall) time:     |(prove) time:    )avg=(\d+\.\d)s min=(\d+\.\d)s max=(\d+\.\d)s$"
)
THROUGHPUT_LINE = re.compile(r"^throughput:    (\d+\.\d{3}) proofs/min \((\d+\.\d)s/proof\)$")

OFFER_4090 = {
    "gpu_name": "RTX 4090",
    "num_gpus": 1,
    "cpu_name": "AMD EPYC 7502 32-Core Processor",
    "cpu_cores_effective": 32,
    "cpu_ram": 257000,
    "pci_gen": 4,
    "gpu_lanes": 16,
    "pcie_bw": 24.5,
    "sim": {"seed": 1},
}
OFFER_2X = {
    "gpu_name": "RTX 4080 Super",
    "num_gpus": 2,
    "cpu_name": "AMD EPYC 9354 32-Core Processor",
    "cpu_cores_effective": 64,
    "cpu_ram": 515000,
    "pci_gen": 4,
    "gpu_lanes": 16,
    "pcie_bw": 24.0,
    "sim": {"seed": 1},
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy, or fail after the deadline."""
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    addr: str
    status_url: str
    state_file: Path
    param_cache: Path
    c1: Path
    env: dict[str, str]

    def status(self) -> dict[str, Any]:
        return get_json(self.status_url)  # type: ignore[no-any-return]

    def bench(self, *args: str, addr: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "agent.sim.bench", "--addr", addr or self.addr, *args]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(
        offer: dict[str, Any] = OFFER_4090,
        devices: list[int] | None = None,
        name: str = "d",
        with_pce: bool = False,
    ) -> Daemon:
        port, status_port = free_port(), free_port()
        base = tmp_path / name
        base.mkdir(exist_ok=True)
        params = tmp_path / "params"  # shared, so a PCE written by one daemon is seen later
        if with_pce:
            params.mkdir(exist_ok=True)
            (params / "pce-porep-32g.bin").write_text('{"simulated": true}')
        toml = base / "cuzk.toml"
        lines = [
            "[daemon]",
            f'listen = "127.0.0.1:{port}"',
            f'status_listen = "127.0.0.1:{status_port}"',
            "[srs]",
            f'param_cache = "{params}"',
            "[memory]",
            'total_budget = "auto"',
            'safety_margin = "5GiB"',
            "[gpus]",
            f"devices = {json.dumps(devices or [])}",
            "[synthesis]",
            "threads = 0",
        ]
        toml.write_text("\n".join(lines) + "\n")
        c1 = base / "c1.json"
        c1.write_text('{"simulated": true}')
        env = dict(os.environ)
        env.update(
            VM_SIM_PROFILE=json.dumps(offer),
            VM_SIM_TIME_SCALE=SCALE,
            VM_SIM_STATE_FILE=str(base / "state.json"),
        )
        log_path = base / "daemon.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent.sim.daemon", "-c", str(toml), "--log-level", "info"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        d = Daemon(
            proc,
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{status_port}/status",
            base / "state.json",
            params,
            c1,
            env,
        )
        started.append(d)
        wait_for(lambda: get_json(d.addr + "/sim/v1/health")["ok"], "the engine address")
        wait_for(d.status, "GET /status")
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
        d.proc.wait(timeout=DEADLINE_S)


def parse_batch(out: str, count: int) -> dict[str, Any]:
    lines = out.splitlines()
    assert lines[:2] == HEADER
    assert lines[2] == f"count:       {count}"
    assert lines[3].startswith("concurrency: ")
    assert lines[4] == ""
    proofs = [PROOF_LINE.match(line) for line in lines[5 : 5 + count]]
    assert all(proofs), lines[5 : 5 + count]
    rest = lines[5 + count :]
    assert rest[0] == "" and rest[1] == "=== Batch Summary ==="
    total = TOTAL_LINE.match(rest[2])
    assert total
    completed = int(rest[3].removeprefix("completed:     "))
    failed = int(rest[4].removeprefix("failed:        "))
    return {
        "proofs": [m.groups() for m in proofs if m],
        "total_s": float(total.group(1)),
        "completed": completed,
        "failed": failed,
        "tail": rest[5:],
    }


def test_status_has_the_real_shape(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    st = d.status()
    assert isinstance(st["uptime_secs"], int)
    assert set(st["memory"]) == {"total_bytes", "used_bytes", "available_bytes"}
    assert set(st["synthesis"]) == {"max_concurrent", "active"}
    assert st["pipelines"] == []
    assert {w["gpu_ordinal"] for w in st["gpu_workers"]} == {0}
    for w in st["gpu_workers"]:
        assert set(w) == {
            "worker_id",
            "gpu_ordinal",
            "state",
            "current_job",
            "current_partition",
            "busy_secs",
        }
        assert w["state"] in ("idle", "proving")
    assert set(st["allocations"]) == {"srs", "pce"}
    assert set(st["counters"]) == {
        "total_completed",
        "total_failed",
        "completed_by_kind",
        "failed_by_kind",
        "queue_depth",
    }
    assert isinstance(st["buffers"], dict)
    assert st["simulated"] is True


def test_status_shows_pipelines_and_partitions_while_proving(
    start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    offer = dict(OFFER_4090)
    d = start_daemon(offer)
    d.stop()
    # Slow the clock so a proof is still in flight when we look.
    env = dict(d.env, VM_SIM_TIME_SCALE="20")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim.daemon", "-c", str(d.state_file.parent / "cuzk.toml")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: get_json(d.addr + "/sim/v1/health")["ok"], "restart")
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.sim.bench",
                "--addr",
                d.addr,
                "batch",
                "-t",
                "porep",
                "--c1",
                str(d.c1),
                "-n",
                "2",
                "-j",
                "2",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            st = wait_for(
                lambda: (
                    (s := d.status())["pipelines"]
                    and any(p["state"] == "synthesizing" for p in s["pipelines"][0]["partitions"])
                    and s
                ),
                "a pipeline with a partition synthesizing",
            )
            pipe = st["pipelines"][0]
            assert set(pipe) == {
                "job_id",
                "proof_kind",
                "started_secs_ago",
                "total_partitions",
                "partitions_done",
                "partitions",
            }
            assert pipe["total_partitions"] == 10
            for part in pipe["partitions"]:
                assert set(part) == {"index", "state", "synth_ms", "gpu_ms"}
                assert part["state"] in (
                    "pending",
                    "synthesizing",
                    "synth_done",
                    "gpu",
                    "done",
                    "failed",
                )
            assert st["synthesis"]["active"] > 0
        finally:
            bench.kill()
            bench.wait()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0


def test_batch_output_format_line_by_line(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon(with_pce=True)
    assert d.bench("preload", "-c", "porep-32g").returncode == 0
    res = d.bench("batch", "-t", "porep", "--c1", str(d.c1), "-n", "6", "-j", "2")
    assert res.returncode == 0, res.stderr
    b = parse_batch(res.stdout, 6)
    assert sorted(int(p[0]) for p in b["proofs"]) == list(range(1, 7))
    assert all(p[1] == "6" and p[2] == "COMPLETED" for p in b["proofs"])
    assert b["completed"] == 6 and b["failed"] == 0
    wall = STATS_LINE.match(b["tail"][0])
    prove = STATS_LINE.match(b["tail"][1])
    thr = THROUGHPUT_LINE.match(b["tail"][2])
    assert wall and wall.group(1) == "wall" and prove and prove.group(2) == "prove" and thr
    assert len(b["tail"]) == 3
    # Simulated seconds, as a real host would print: proofs take tens of seconds.
    walls = [float(p[3]) for p in b["proofs"]]
    assert min(walls) > 20
    assert float(thr.group(1)) == pytest.approx(6 / b["total_s"] * 60, rel=0.01)
    assert float(thr.group(2)) == pytest.approx(b["total_s"] / 6, abs=0.1)
    rate_per_hour = float(thr.group(1)) * 60
    assert 40 < rate_per_hour < 90  # the simulated single RTX 4090
    assert d.status()["counters"]["total_completed"] == 6


def test_failed_proofs_and_nothing_completed(start_daemon: Callable[..., Daemon]) -> None:
    offer = dict(OFFER_4090, sim={"seed": 1, "fail_rate": 1.0})
    d = start_daemon(offer)
    res = d.bench("batch", "-t", "porep", "--c1", str(d.c1), "-n", "3", "-j", "2")
    assert res.returncode == 0, res.stderr
    b = parse_batch(res.stdout, 3)
    assert all(p[2] == "FAILED" and p[4] == "0" for p in b["proofs"])
    assert b["completed"] == 0 and b["failed"] == 3
    assert b["tail"] == []  # no wall/prove/throughput lines when nothing completed
    counters = d.status()["counters"]
    assert counters["total_failed"] == 3
    assert counters["failed_by_kind"] == {"porep": 3}


def test_one_gpu_run_through_gpus_devices(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon(OFFER_2X, devices=[1])
    assert {w["gpu_ordinal"] for w in d.status()["gpu_workers"]} == {1}
    res = d.bench("batch", "-t", "porep", "--c1", str(d.c1), "-n", "4", "-j", "2")
    assert res.returncode == 0, res.stderr
    busy = {w["gpu_ordinal"]: w["busy_secs"] for w in d.status()["gpu_workers"]}
    assert busy[1] > 0
    state = json.loads(d.state_file.read_text())
    assert [g["index"] for g in state["gpus"]] == [0, 1]
    assert state["gpus"][0]["util_pct"] == 0.0  # the GPU left out never works


def test_pce_slow_path_then_fast_path_after_restart(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon(name="first")
    pce = d.param_cache / "pce-porep-32g.bin"
    assert not pce.exists()
    assert d.status()["allocations"]["pce"] == []
    slow = parse_batch(
        d.bench("batch", "-t", "porep", "--c1", str(d.c1), "-n", "2", "-j", "1").stdout, 2
    )
    assert pce.is_file()
    assert pce.stat().st_size < 4096  # a stand-in, never gigabytes
    assert d.stop() == 0
    d2 = start_daemon(name="second")
    wait_for(lambda: d2.status()["allocations"]["pce"], "the PCE to load")
    fast = parse_batch(
        d2.bench("batch", "-t", "porep", "--c1", str(d2.c1), "-n", "2", "-j", "1").stdout, 2
    )
    slow_wall = max(float(p[3]) for p in slow["proofs"])
    fast_wall = max(float(p[3]) for p in fast["proofs"])
    assert fast_wall < 0.7 * slow_wall


def test_state_file_format(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon(OFFER_2X)
    first = wait_for(lambda: json.loads(d.state_file.read_text()), "the state file")
    later = wait_for(
        lambda: (s := json.loads(d.state_file.read_text()))["ts"] > first["ts"] and s,
        "a fresh state file",
        deadline_s=2.0,
    )
    assert set(later) >= {"ts", "gpus", "cpu", "ram"}
    gpu_keys = {
        "index",
        "util_pct",
        "mem_used_bytes",
        "pcie_tx_kbps",
        "pcie_rx_kbps",
        "power_w",
        "temp_c",
        "sm_clock_mhz",
        "throttle_reasons",
        "pcie_gen_current",
        "pcie_width_current",
    }
    assert len(later["gpus"]) == 2
    for g in later["gpus"]:
        assert set(g) == gpu_keys
        assert isinstance(g["throttle_reasons"], int)
    assert set(later["cpu"]) == {"util_pct", "per_core_util_pct", "load1", "iowait_pct"}
    assert len(later["cpu"]["per_core_util_pct"]) == 64
    assert set(later["ram"]) == {"used_bytes", "total_bytes"}
    assert later["ram"]["total_bytes"] == 515000 * 1_000_000
    # Busy while proving: GPUs work and the host->GPU link carries data.
    d2 = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.sim.bench",
            "--addr",
            d.addr,
            "batch",
            "-t",
            "porep",
            "--c1",
            str(d.c1),
            "-n",
            "200",
            "-j",
            "4",
        ],
        env=dict(d.env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        busy = wait_for(
            lambda: (s := json.loads(d.state_file.read_text()))["gpus"][0]["util_pct"] > 50 and s,
            "a busy GPU in the state file",
        )
        g = busy["gpus"][0]
        assert g["pcie_rx_kbps"] > 1_000_000
        assert g["power_w"] > 100
        assert g["pcie_gen_current"] == 4
        assert busy["cpu"]["util_pct"] > 10
        assert busy["ram"]["used_bytes"] > 100 * 2**30
    finally:
        d2.kill()
        d2.wait()


def test_clean_shutdown_leaves_nothing(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    wait_for(d.state_file.exists, "the state file")
    assert d.stop() == 0
    assert not d.state_file.exists()
    with pytest.raises(urllib.error.URLError):
        d.status()
    log = (d.state_file.parent / "daemon.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\S+Z\s+INFO cuzk_daemon: ", log, re.M)
    assert "shutting down" in log


def test_bench_errors(start_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    d = start_daemon()
    missing = d.bench("batch", "-t", "porep", "--c1", str(tmp_path / "nope.json"), "-n", "1")
    assert missing.returncode != 0 and "Error:" in missing.stderr
    dead = d.bench(
        "batch", "-t", "porep", "--c1", str(d.c1), "-n", "1", addr=f"http://127.0.0.1:{free_port()}"
    )
    assert dead.returncode != 0
    assert "failed to connect to daemon" in dead.stderr
    assert dead.stdout == ""
    other = d.bench("single", "-t", "wpost", "--c1", str(d.c1))
    assert other.returncode != 0 and "not simulated" in other.stderr


def test_other_subcommands(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    pre = d.bench("preload", "-c", "porep-32g")
    assert re.fullmatch(r"porep-32g loaded in \d+ ms\n", pre.stdout)
    assert d.bench("preload", "-c", "porep-32g").stdout == "porep-32g already loaded\n"
    single = d.bench("single", "-t", "porep", "--c1", str(d.c1))
    assert single.returncode == 0
    assert "status:    COMPLETED" in single.stdout
    assert re.search(r"proof:     1920 bytes", single.stdout)
    status = d.bench("status")
    assert status.stdout.startswith("=== cuzk daemon status ===\n")
    assert "proofs completed: 1" in status.stdout
    assert "[0] RTX 4090 \u2014 " in status.stdout
    metrics = d.bench("metrics")
    assert 'cuzk_proofs_completed_total{kind="porep"} 1' in metrics.stdout
