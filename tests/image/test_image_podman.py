"""The instance image built for real with podman, deployed by the coordinator (slow).

``image/Dockerfile`` is built (target ``image-sim``) on a Debian base that
stands in for the CUDA runtime image (no registry here serves either: the
base is made from Debian's own packages with mmdebstrap and imported), with
the simulator standing in for cuzk and the Python wheels built here and
handed in (``--build-context wheelhouse=``), so the build needs no index.

Then production's path: the coordinator (``start_server`` with the provider
``vast-manager serve --provider vast`` builds, ``VAST_URL`` at the fake
vast.ai of ``fakevast.py``) deploys an offer, and the fake's create runs the
image the coordinator asked for with podman (``PodmanInstances``): the
create's environment plus what vast.ai sets inside a container, the image's
ENTRYPOINT (the ``args`` run type), ``--network host`` so loopback reaches the
coordinator and the fake. The machine is simulated, so the coordinator counts
its time at the simulation's scale, as for any instance of a simulated fleet
it deployed. The container warms up, benchmarks, its result is stored and it
proves; the operator's destroy makes vast.ai stop the container (SIGTERM, as
``podman stop``) and its exit status is the agent's own for SIGTERM (143).
Where podman, runc or mmdebstrap are missing or cannot run here, the test
skips saying why in one line (``.ci/run`` installs them; under CI it fails).
"""

from __future__ import annotations

import asyncio
import json
import resource
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.local.provider import instance_profile
from vast_manager.coordinator.providers.vast.provider import from_settings
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web.server import start_server
from vast_manager.sim.fake_c1 import write_c1

from support.fakevast import FAKE_API_KEY, FakeVast
from support.paths import REPO_ROOT
from support.tools import require_tool, skip_or_fail

pytestmark = pytest.mark.slow

ROOT = REPO_ROOT
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
        exe = require_tool("podman", ".ci/run installs it with apt-get")
        require_tool("runc", ".ci/run installs it with apt-get")
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
    require_tool("mmdebstrap", "no Debian base image can be made without it; .ci/run "
                 "installs it with apt-get")
    tar = work / "base.tar"
    made = run(["mmdebstrap", "--variant=apt", "--include=ca-certificates,python3,python3-venv,"
                "tini", "bookworm", str(tar), MIRROR], timeout=900)
    if made.returncode != 0:
        skip_or_fail(f"no Debian base image: mmdebstrap failed: {first_line(made.stderr)}")
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
        skip_or_fail(f"cannot build the wheels the image needs: {first_line(built.stderr)}")
    return wh


#: Simulated seconds per real second on the container's simulated machine.
TIME_SCALE = 600.0
OFFER_ID = 9003  # 1x RTX 5070 Ti of the local catalog, at $0.19/h


class PodmanInstances:
    """A ``Launcher`` of the fake vast.ai: each instance is a container of the image its
    create asked for, run as vast.ai runs the ``args`` run type (the image's ENTRYPOINT),
    with the create's environment and what vast.ai sets inside a container; the host is
    simulated (the fake NVML fed by the simulated cuzk, at ``TIME_SCALE``) and holds the
    C1 input at the image's path. Destroy stops the container as ``podman stop`` does
    (SIGTERM, SIGKILL after 60 s), keeps its exit status and log, and removes it."""

    def __init__(self, podman: Podman, workdir: Path, c1: Path) -> None:
        self.podman = podman
        self.workdir = workdir
        self.c1 = c1
        self.names: dict[int, str] = {}
        self.starts: dict[int, subprocess.Popen[str]] = {}
        self.said: dict[int, str] = {}
        self.exit_codes: dict[int, str] = {}
        self.logs: dict[int, str] = {}

    def start(self, instance: dict[str, Any], offer: dict[str, Any], env: dict[str, str]) -> None:
        iid = int(instance["id"])
        assert instance["image_runtype"] == "args", "this launcher plays the args run type"
        machine = {  # the simulated host under the container
            "VM_NVML": "sim",
            "VM_SIM_PROFILE": json.dumps(instance_profile(parse_offer(offer))),
            "VM_SIM_TIME_SCALE": str(TIME_SCALE),
            "VM_SAMPLE_INTERVAL": "0.1",
        }
        env_file = self.workdir / f"instance-{iid}.env"
        env_file.touch(mode=0o600)
        env_file.write_text("".join(f"{k}={v}\n" for k, v in {**machine, **env}.items()))
        self.names[iid] = name = f"vast-agent-test-{iid}-{secrets.token_hex(3)}"
        # Not waited for here: the fake answers the create at once, as vast.ai does.
        self.starts[iid] = subprocess.Popen(
            [*self.podman.base, "run", "-d", "--name", name, "--network", "host",
             *self.podman.ulimits, "--env-file", str(env_file),
             "-v", f"{self.c1}:/data/zk/c1.json:ro", str(instance["image_uuid"])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def started(self, iid: int) -> tuple[int, str]:
        """Wait for ``podman run -d``: its status and what it said."""
        proc = self.starts[iid]
        if proc.returncode is None:
            out, err = proc.communicate(timeout=120)
            self.said[iid] = err or out
        return proc.returncode, self.said.get(iid, "")

    async def stop(self, instance_id: int) -> None:
        await asyncio.to_thread(self._stop, instance_id)

    def _stop(self, iid: int) -> None:
        name = self.names.pop(iid, None)
        if name is None:
            return
        self.started(iid)
        self.podman("stop", "-t", "60", name, timeout=120)
        self.exit_codes[iid] = self.podman(
            "inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        logs = self.podman("logs", name)
        self.logs[iid] = logs.stdout + logs.stderr
        self.podman("rm", "-f", name)

    def log_of(self, iid: int) -> str:
        name = self.names.get(iid)
        if name is None:
            return self.logs.get(iid, "")
        logs = self.podman("logs", name)
        return logs.stdout[-3000:] + logs.stderr[-3000:]

    async def close(self) -> None:
        for iid in list(self.names):
            await self.stop(iid)


async def until(cond: Callable[[], Awaitable[Any]], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)


def build_image(podman: Podman, work: Path, tag: str) -> None:
    probe = podman("info", "--format", "{{.Store.GraphDriverName}}", timeout=120)
    if probe.returncode != 0:
        skip_or_fail(f"podman cannot run here: {first_line(probe.stderr)}")
    ensure_base(podman, work)
    smoke = podman("run", "--rm", *podman.ulimits, "--network", "host", BASE, "true")
    if smoke.returncode != 0:
        skip_or_fail(f"podman cannot start a container here: {first_line(smoke.stderr)}")
    built = podman(
        "build", "--format", "docker", "--network", "host", *podman.ulimits,
        "--target", "image-sim", "-f", str(ROOT / "image" / "Dockerfile"),
        "--build-arg", f"CUDA_RUNTIME_IMAGE={BASE}",
        "--build-context", f"wheelhouse={wheelhouse(work)}",
        "-t", tag, str(ROOT), timeout=1200,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]


async def test_the_image_builds_with_podman_and_a_deployed_container_stores_a_result(
    podman: Podman, tmp_path: Path
) -> None:
    tag = f"localhost/vast-agent-sim-test:{secrets.token_hex(4)}"
    await asyncio.to_thread(build_image, podman, tmp_path, tag)
    c1 = write_c1(tmp_path / "c1.json")
    c1.chmod(0o644)  # the agent runs as the image's vast-agent user
    instances = PodmanInstances(podman, tmp_path, c1)
    try:
        async with FakeVast(launcher=instances) as fake:
            (listed,) = [o for o in local_offers() if o["id"] == OFFER_ID]
            fake.add_offer(OFFER_ID, listed["machine_id"],
                           **{k: v for k, v in listed.items() if k not in ("id", "machine_id")})
            settings = Settings.from_env(
                {"VM_ADMIN_TOKEN": TOKEN, "VM_FLEET_SECRET": secrets.token_hex(32)},
                db_path=str(tmp_path / "fleet.db"), config_dir=str(tmp_path / "config"),
                host="127.0.0.1", port=0, next_heartbeat_s=2,
                vast_image=tag, vast_runtype="args",
                vast_env=json.dumps({"VM_BENCH_PROOFS": "3"}),
                # A simulated fleet: the plausibility checks count its time so.
                sim_time_scale=TIME_SCALE,
                idle_destroy_after_s=0.0,  # no work command: kept idle
                preflight_registry=False,  # the image is local to podman, in no registry
            )
            provider = from_settings(
                settings, environ={"VAST_API_KEY": FAKE_API_KEY, "VAST_URL": fake.url},
                home=tmp_path / "home",
            )
            server = await start_server(settings, provider)
            try:
                async with aiohttp.ClientSession(
                    base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}
                ) as api:
                    await deployed_and_stopped(api, fake, instances)
            finally:
                await server.stop()
                await provider.close()
    finally:
        await instances.close()
        await asyncio.to_thread(podman, "rmi", "-f", tag)


async def deployed_and_stopped(
    api: aiohttp.ClientSession, fake: FakeVast, instances: PodmanInstances
) -> None:
    async with api.post("/api/deploy", json={"offer_id": OFFER_ID,
                                             "min_rate_per_hour": 1.0}) as resp:
        deployed = await resp.json()
        assert resp.status == 200, deployed
    iid, vid = deployed["instance_id"], deployed["provider_instance_id"]
    code, said = await asyncio.to_thread(instances.started, vid)
    assert code == 0, said

    async def proving_with_a_result() -> dict[str, Any] | None:
        async with api.get(f"/api/instances/{iid}") as resp:
            one: dict[str, Any] = await resp.json()
        return one if one.get("results") and one.get("state") == "proving" else None

    try:
        inst = await until(proving_with_a_result, "a stored benchmark result, then proving",
                           240)
    except AssertionError:
        log = await asyncio.to_thread(instances.log_of, vid)
        raise AssertionError(f"no result; container log:\n{log}") from None
    (result,) = inst["results"]
    assert result["kind"] == "benchmark" and result["flags"] == [], result
    assert result["proofs_completed"] == 3 and result["rate_per_hour"] > 0
    assert result["verdict"] == "keep"
    print(f"stored benchmark result {result.get('result_id')}: {result['proofs_completed']} proofs "
          f"completed at {result['rate_per_hour']:.1f} proofs/h (simulated), "
          f"verdict {result['verdict']}")
    # The operator ends it: vast.ai stops the container, the agent exits as for SIGTERM.
    async with api.post(f"/api/instances/{iid}/destroy") as resp:
        assert resp.status == 200, await resp.text()
    await fake.settle()
    log = instances.logs[vid]
    assert instances.exit_codes[vid] == str(128 + signal.SIGTERM), log[-3000:]
    assert "PCE extracted and held in memory" in log and "stopping on signal 15" in log
    assert fake.instances == {}
    print(f"container stopped by the operator's destroy: exit status {instances.exit_codes[vid]}")
