"""Real processes: the agent as `vast-agent run` against `vast-manager serve`.

The coordinator is SIGKILLed while an agent benchmarks: the agent keeps
retrying with capped, jittered backoff; the coordinator comes back on the same
database; the agent resumes and its result is stored once. And a C1 input in
the wrong format ends the instance as `failed`, its reason naming the file,
before cuzk or cuzk-bench ever runs (docs/cuzk.md, the C1 input).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from vast_manager.sim.fake_c1 import write_c1

from support.agent_fakes import FAKE_BENCH, FAKE_DAEMON, write_script
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
TOKEN = "e2e-admin-token-" + "x" * 16


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def api(url: str, method: str = "GET", body: dict[str, object] | None = None) -> object:
    req = urllib.request.Request(
        url, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


class Coordinator:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.tmp / "coordinator.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vast_manager.coordinator.cli",
             "serve", "--db", str(self.tmp / "fleet.db"),
             "--port", str(self.port)],
            env=self.env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

        def up() -> bool:
            try:
                api(f"{self.url}/api/instances")
                return True
            except OSError:
                return False

        wait_until(up, "the coordinator to answer", 30)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    e = dict(os.environ)
    e.update({
        "VM_FLEET_SECRET": secrets.token_hex(32), "VM_ADMIN_TOKEN": TOKEN,
        "PYTHONPATH": str(ROOT), "VM_E2E_MARKER": f"e2e-{os.getpid()}-{time.monotonic_ns()}",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        # The fake proves in 0.3 s, faster than any GPU: lift the rate ceiling.
        "VM_MAX_RATE_PER_GPU_PER_HOUR": "1000000",
    })
    yield e
    left = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get("VM_E2E_MARKER") == e["VM_E2E_MARKER"]:
                left.append(p)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert left == [], "processes were left behind"


def test_coordinator_killed_mid_benchmark_result_arrives_once(
    tmp_path: Path, env: dict[str, str]
) -> None:
    coord = Coordinator(tmp_path, env)
    coord.start()
    agent_proc: subprocess.Popen[bytes] | None = None
    try:
        issued = api(f"{coord.url}/api/agents", "POST", {"label": "e2e", "min_rate_per_hour": 1.0})
        assert isinstance(issued, dict)
        write_c1(tmp_path / "c1.json")
        marker = tmp_path / "bench-started"
        agent_env = dict(env)
        agent_env.update({
            "VM_COORDINATOR_URL": coord.url, "VM_AGENT_ID": issued["agent_id"],
            "VM_AGENT_KEY": issued["agent_key"], "VM_STATE_DIR": str(tmp_path / "state"),
            "VM_PARAMS_DIR": str(tmp_path / "params"), "VM_C1_PATH": str(tmp_path / "c1.json"),
            "VM_CUZK_BIN": write_script(tmp_path / "fake-cuzk", FAKE_DAEMON),
            "VM_CUZK_BENCH_BIN": write_script(tmp_path / "fake-cuzk-bench", FAKE_BENCH),
            "VM_BENCH_PROOFS": "4", "VM_NVML": "off", "VM_PROVIDER": "local",
            "VM_CUZK_MEMORY_BUDGET": "64GiB",
            "FAKE_BENCH_MARKER": str(marker), "FAKE_PROOF_DELAY": "1.0",
            # Real seconds above the proof-time floor of a GPU the coordinator cannot name.
            "FAKE_PROOF_SECONDS": "2.5",
        })
        agent_log_path = tmp_path / "agent.log"
        with open(agent_log_path, "wb") as agent_log:
            agent_proc = subprocess.Popen(
                [sys.executable, "-m", "vast_manager.agent.cli",
                 "run"], env=agent_env, cwd=tmp_path,
                stdout=agent_log, stderr=subprocess.STDOUT,
            )
        wait_until(marker.exists, "the benchmark to start")
        coord.kill(signal.SIGKILL)
        spool = tmp_path / "state" / "spool"
        wait_until(lambda: any(spool.glob("*-result-*.json")), "the result to be spooled")

        def retries() -> int:
            return agent_log_path.read_text(errors="replace").count("; retry ")

        wait_until(lambda: retries() >= 3, "the agent to retry")
        assert agent_proc.poll() is None, "the agent gave up"
        coord.start()  # same database, same address

        def stored() -> int:
            with contextlib.closing(sqlite3.connect(tmp_path / "fleet.db")) as db:
                row = db.execute("select count(*) from results where agent_id = ?",
                                 (issued["agent_id"],)).fetchone()
                return int(row[0])

        wait_until(lambda: not any(spool.glob("*-result-*.json")), "the result delivered", 90)
        assert stored() == 1
        text = agent_log_path.read_text(errors="replace")
        assert "phase benchmarking -> proving" in text or "delivered" in text
        agent_proc.send_signal(signal.SIGTERM)
        assert agent_proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert stored() == 1
    finally:
        if agent_proc is not None and agent_proc.poll() is None:
            agent_proc.kill()
            agent_proc.wait()
        coord.kill(signal.SIGTERM)


MARKING = r"""
import os, sys
open(os.environ["VM_E2E_RAN"], "a").write(" ".join(sys.argv) + "\n")
sys.exit(1)
"""


def test_a_c1_in_the_wrong_format_fails_the_instance_before_any_proof(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Through the real coordinator: the instance ends `failed`, its reason names the
    C1 file and what is wrong with it, and neither cuzk nor cuzk-bench ever ran."""
    coord = Coordinator(tmp_path, env)
    coord.start()
    agent_proc: subprocess.Popen[bytes] | None = None
    try:
        issued = api(f"{coord.url}/api/agents", "POST", {"label": "bad-c1"})
        assert isinstance(issued, dict)
        c1 = tmp_path / "c1.json"
        c1.write_text('{"simulated": true}')  # JSON, but not Curio's wrapper
        ran = tmp_path / "ran"
        agent_env = dict(env)
        agent_env.update({
            "VM_COORDINATOR_URL": coord.url, "VM_AGENT_ID": issued["agent_id"],
            "VM_AGENT_KEY": issued["agent_key"], "VM_STATE_DIR": str(tmp_path / "state"),
            "VM_PARAMS_DIR": str(tmp_path / "params"), "VM_C1_PATH": str(c1),
            "VM_CUZK_BIN": write_script(tmp_path / "cuzk", MARKING),
            "VM_CUZK_BENCH_BIN": write_script(tmp_path / "cuzk-bench", MARKING),
            "VM_NVML": "off", "VM_PROVIDER": "local", "VM_E2E_RAN": str(ran),
        })
        with open(tmp_path / "agent.log", "wb") as agent_log:
            agent_proc = subprocess.Popen(
                [sys.executable, "-m", "vast_manager.agent.cli",
                 "run"], env=agent_env, cwd=tmp_path,
                stdout=agent_log, stderr=subprocess.STDOUT,
            )

        def instance() -> dict[str, object]:
            rows = api(f"{coord.url}/api/instances")
            assert isinstance(rows, list)
            mine = [r for r in rows if r["agent_id"] == issued["agent_id"]]
            if not mine:
                return {}
            one = api(f"{coord.url}/api/instances/{mine[0]['id']}")
            assert isinstance(one, dict)
            return one

        wait_until(lambda: instance().get("state") == "failed", "the instance to fail", 60)
        inst = instance()
        reason = str(inst["terminate_reason"])
        assert str(c1) in reason and "is not Curio's C1 wrapper" in reason, reason
        assert "lacks SectorNum, Phase1Out, SectorSize" in reason
        events = inst["events"]
        assert isinstance(events, list)
        failed = [e for e in events if e["kind"] == "failed"]
        assert failed and str(c1) in failed[0]["reason"]
        assert not ran.exists(), ran.read_text()  # no daemon, no bench, no proof
        # The coordinator answers `failed` with terminate: the agent ends, status 1.
        assert agent_proc.wait(timeout=60) == 1
    finally:
        if agent_proc is not None and agent_proc.poll() is None:
            agent_proc.kill()
            agent_proc.wait()
        coord.kill(signal.SIGTERM)
