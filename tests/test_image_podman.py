"""The instance image built for real with podman, run against a coordinator on this host (slow).

``image/Dockerfile`` is built (target ``image-sim``) on a Debian base that
stands in for the CUDA runtime image (no registry here serves either: the
base is made from Debian's own packages with mmdebstrap and imported), with
the simulator standing in for cuzk and the Python wheels built here and
handed in (``--build-context wheelhouse=``), so the build needs no index.
The container then reaches a coordinator on loopback (``--network host``),
warms up, benchmarks and stores a result; ``podman stop`` ends it and its
exit status is the agent's own for SIGTERM (143). Where podman, runc or
mmdebstrap are missing or cannot run here, the test skips saying why in one
line (``.ci/run`` installs them).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vast_manager.agent.sim.c1 import write_c1

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BASE = "localhost/vast-manager-test-base:bookworm"  # kept between runs: it takes a minute
MIRROR = "http://deb.debian.org/debian"
TOKEN = "image-test-admin-token-" + "x" * 16


def run(argv: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          **kw)  # type: ignore[call-overload]


def first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def wait_until(cond: Callable[[], object], what: str, timeout_s: float) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


class Podman:
    def __init__(self) -> None:
        exe = shutil.which("podman")
        if exe is None or shutil.which("runc") is None:
            pytest.skip("podman or runc is not installed (.ci/run installs them with apt-get)")
        self.base = [exe, "--runtime", "runc"]
        self.ulimits = self._ulimits()

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run([*self.base, *args], timeout=timeout)

    def _ulimits(self) -> list[str]:
        # podman raises nofile/nproc for root past what a sandboxed host may grant;
        # ask for what this process already has (nproc: a modest value runc can set).
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
        return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]


@pytest.fixture(scope="module")
def podman() -> Podman:
    return Podman()


def ensure_base(p: Podman, work: Path) -> None:
    if p("image", "exists", BASE).returncode == 0:
        return
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed: no Debian base image can be made here")
    tar = work / "base.tar"
    made = run(["mmdebstrap", "--variant=apt", "--include=ca-certificates,python3,python3-venv,"
                "tini", "bookworm", str(tar), MIRROR], timeout=900)
    if made.returncode != 0:
        pytest.skip(f"no Debian base image: mmdebstrap failed: {first_line(made.stderr)}")
    imported = p("import", str(tar), BASE)
    tar.unlink()
    assert imported.returncode == 0, imported.stderr


def wheelhouse(work: Path) -> Path:
    wh = work / "wheelhouse"
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wh), str(ROOT)])
    if built.returncode == 0:
        built = run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                     "--dest", str(wh), "setuptools>=68", "wheel"])
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheels the image needs: {first_line(built.stderr)}")
    return wh


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(url: str, method: str = "GET", body: dict[str, object] | None = None) -> object:
    req = urllib.request.Request(
        url, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, VM_FLEET_SECRET=secrets.token_hex(32), VM_ADMIN_TOKEN=TOKEN,
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    with open(tmp_path / "coordinator.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vast_manager.coordinator.cli",
             "serve", "--db", str(tmp_path / "f.db"),
             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                api(f"{url}/api/instances")
                return True
            except OSError:
                return False

        wait_until(up, "the coordinator", 30)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_image_builds_with_podman_and_a_container_stores_a_result(
    podman: Podman, coordinator: str, tmp_path: Path
) -> None:
    probe = podman("info", "--format", "{{.Store.GraphDriverName}}", timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run here: {first_line(probe.stderr)}")
    ensure_base(podman, tmp_path)
    smoke = podman("run", "--rm", *podman.ulimits, "--network", "host", BASE, "true")
    if smoke.returncode != 0:
        pytest.skip(f"podman cannot start a container here: {first_line(smoke.stderr)}")
    tag = f"localhost/vast-agent-sim-test:{secrets.token_hex(4)}"
    name = f"vast-agent-test-{secrets.token_hex(4)}"
    built = podman(
        "build", "--format", "docker", "--network", "host", *podman.ulimits,
        "--target", "image-sim", "-f", str(ROOT / "image" / "Dockerfile"),
        "--build-arg", f"CUDA_RUNTIME_IMAGE={BASE}",
        "--build-context", f"wheelhouse={wheelhouse(tmp_path)}",
        "-t", tag, str(ROOT), timeout=1200,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    try:
        issued = api(f"{coordinator}/api/agents", "POST",
                     {"label": "podman", "min_rate_per_hour": 1.0})
        assert isinstance(issued, dict)
        c1 = write_c1(tmp_path / "c1.json")
        c1.chmod(0o644)  # the agent runs as the image's vast-agent user
        started = podman(
            "run", "-d", "--name", name, "--network", "host", *podman.ulimits,
            "-e", f"VM_COORDINATOR_URL={coordinator}", "-e", f"VM_AGENT_ID={issued['agent_id']}",
            "-e", f"VM_AGENT_KEY={issued['agent_key']}", "-e", "VM_NVML=sim",
            "-e", "VM_SIM_TIME_SCALE=600", "-e", "VM_SIM_PROFILE={\"sim\": {\"seed\": 1}}",
            "-e", "VM_BENCH_PROOFS=3", "-e", "VM_SAMPLE_INTERVAL=0.1",
            "-v", f"{c1}:/data/zk/c1.json:ro", tag,
        )
        assert started.returncode == 0, started.stderr

        def stored() -> dict[str, object] | None:
            rows = api(f"{coordinator}/api/instances")
            assert isinstance(rows, list)
            mine = [r for r in rows if r["agent_id"] == issued["agent_id"]]
            if not mine:
                return None
            one = api(f"{coordinator}/api/instances/{mine[0]['id']}")
            assert isinstance(one, dict)
            return one if one.get("results") and one.get("state") == "proving" else None

        try:
            inst = wait_until(stored, "a stored benchmark result", 240)
        except AssertionError:
            logs = podman("logs", name)
            raise AssertionError(f"no result; container log:\n{logs.stdout[-3000:]}"
                                 f"{logs.stderr[-3000:]}") from None
        assert isinstance(inst, dict)
        results = inst["results"]
        assert isinstance(results, list) and results[0]["kind"] == "benchmark"
        assert results[0]["proofs_completed"] == 3 and results[0]["rate_per_hour"] > 0
        stopped = podman("stop", "-t", "60", name, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        code = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        logs = podman("logs", name)
        assert code == str(128 + signal.SIGTERM), logs.stdout[-2000:] + logs.stderr[-2000:]
        text = logs.stdout + logs.stderr
        assert "PCE extracted and held in memory" in text and "stopping on signal 15" in text
    finally:
        podman("rm", "-f", name)
        podman("rmi", "-f", tag)
