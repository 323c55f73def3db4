"""The whole agent lifecycle against the real coordinator.

Each test runs the coordinator as ``vast-manager serve`` does (``start_server``:
the real ``create_app``, its request verifier, its verdicts, its monitor) and
deploys one instance through the operator API onto a provider whose machines
are this test's (``Machines``): the agent runs in this process with the
environment the deploy handed the provider, and destroying the instance stops
its agent, as vast.ai's destroy stops a container. Every directive the agent
obeys comes from the coordinator's own decisions or from an operator action
(destroy, rebenchmark). The agent reaches the coordinator through a recording
loopback proxy (``faultproxy.py``), which also plays the outages: what the
agent sent is read from that wire, what came of it from the operator API.

The cuzk daemon and cuzk-bench are small fake executables written here (the
real programs' flags, cuzk.toml, GET /status and batch output format), so
these tests run real child processes and check every one is reaped. The fake
daemon's proofs claim 60 s and take milliseconds: a simulated machine, so the
coordinator applies a simulated time scale to it, as to any deployed instance
of a simulated fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest

import vast_manager.agent.cuzk as agent_cuzk
from vast_manager.agent.config import AgentConfig, load_config
from vast_manager.agent.host import MemoryLimit
from vast_manager.agent.lifecycle import (
    EXIT_FAILED,
    EXIT_ORPHANED,
    EXIT_TERMINATED,
    Agent,
    default_sampler_factory,
)
from vast_manager.coordinator.providers.base import CreatedInstance, Offer, ProviderError
from vast_manager.coordinator.web.server import RunningServer, start_server
from vast_manager.protocol import (
    CpuTelemetry,
    Gpu,
    GpuTelemetry,
    Heartbeat,
    Hello,
    HostInfo,
    NetTelemetry,
    RamTelemetry,
    Result,
    Telemetry,
    decode,
)
from vast_manager.sim.agent_run import sim_memory_probe, sim_sampler_factory
from vast_manager.sim.fake_c1 import write_c1

from support import cuzk_surface
from support.agent_fakes import FAKE_BENCH, FAKE_DAEMON, FAKE_WORK, write_script
from support.coord_support import ADMIN, make_settings
from support.fakes_provider import FakeProvider, offer
from support.faultproxy import FaultProxy, FaultRates
from support.paths import REPO_ROOT

AGENT_ID = "ag_" + "a" * 20
KEY = bytes(range(100, 132))
#: Simulated seconds per real second the coordinator counts for the fake daemon's
#: machine: its 60 s proofs then fit the benchmarking the coordinator saw, with the
#: plausibility checks' slack, even right after a previous result; and a first proof
#: that a loaded machine delays by a few real seconds does not look like a stall.
SCALE = 20.0
EXIT_SIGTERM = 128 + signal.SIGTERM
OFFER_ID = 1
MACHINE_ID = 11


class Machines(FakeProvider):
    """The provider under the real coordinator: each instance is a machine whose agent
    this test runs; destroying the instance stops that agent (SIGTERM), as vast.ai's
    destroy stops the container."""

    def __init__(self, num_gpus: int) -> None:
        super().__init__([offer(OFFER_ID, MACHINE_ID, num_gpus=num_gpus)])
        self.agents: dict[int, Agent] = {}

    async def create_instance(
        self, offer: Offer, *, label: str, env: dict[str, str], disk_gb: int
    ) -> CreatedInstance:
        created = await super().create_instance(offer, label=label, env=env, disk_gb=disk_gb)
        # Rented now (the reconciliation's grace counts from here), not in 1970.
        self.instances[created.instance_id]["start_date"] = time.time()
        return created

    async def destroy_instance(self, instance_id: int) -> None:
        await super().destroy_instance(instance_id)
        agent = self.agents.pop(instance_id, None)
        if agent is not None:
            agent.request_stop(signal.SIGTERM)


class Fleet:
    """A real coordinator, the proxy its agents reach it through, the operator's API, and
    the one instance a test deploys."""

    def __init__(self, server: RunningServer, machines: Machines, proxy: FaultProxy,
                 session: aiohttp.ClientSession) -> None:
        self.server = server
        self.machines = machines
        self.proxy = proxy
        self.session = session
        self.instance_id = 0
        self.provider_instance_id = 0
        self.env: dict[str, str] = {}

    async def close(self) -> None:
        await self.session.close()
        await self.server.stop()
        await self.proxy.close()

    # --- the operator ---------------------------------------------------------------

    async def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.server.url + path, json=body,
                                        headers=ADMIN) as resp:
            return resp.status, await resp.json(content_type=None)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = await self.admin(method, path, body)
        assert status == 200, (method, path, status, data)
        return data

    async def deploy(self, *, min_rate: float | None = None) -> dict[str, str]:
        """Deploy the offer; the environment the coordinator gave the machine."""
        body: dict[str, Any] = {"offer_id": OFFER_ID}
        if min_rate is not None:
            body["min_rate_per_hour"] = min_rate
        deployed = await self.ok("POST", "/api/deploy", body)
        self.instance_id = int(deployed["instance_id"])
        self.provider_instance_id = int(deployed["provider_instance_id"])
        (created,) = self.machines.created
        self.env = dict(created["env"])
        return self.env

    async def instance(self) -> dict[str, Any]:
        data: dict[str, Any] = await self.ok("GET", f"/api/instances/{self.instance_id}")
        return data

    async def results(self, kind: str | None = None) -> list[dict[str, Any]]:
        rows = (await self.instance())["results"]
        return [r for r in rows if kind is None or r["kind"] == kind]

    async def log_text(self) -> str:
        lines = await self.ok("GET", f"/api/instances/{self.instance_id}/logs?tail=10000")
        return "\n".join(f"[{x['source']}] {x['text']}" for x in lines)

    async def destroy(self) -> tuple[int, Any]:
        return await self.admin("POST", f"/api/instances/{self.instance_id}/destroy")

    # --- the wire -------------------------------------------------------------------

    def sent(self, path: str) -> list[bytes]:
        """Bodies the coordinator received whole on ``path`` and answered 200."""
        return [x.body for x in self.proxy.exchanges if x.path == path and x.status == 200]

    def hellos(self) -> list[Hello]:
        return [decode(Hello, b) for b in self.sent("/v1/hello")]

    def heartbeats(self) -> list[Heartbeat]:
        return [decode(Heartbeat, b) for b in self.sent("/v1/heartbeat")]

    def result_posts(self) -> list[str]:
        """The result_id of every result that reached the coordinator, whatever it said."""
        return [decode(Result, x.body).result_id for x in self.proxy.exchanges
                if x.path == "/v1/result"]

    def phases(self) -> list[str]:
        out: list[str] = []
        for hb in self.heartbeats():
            if not out or out[-1] != hb.phase:
                out.append(hb.phase)
        return out

    def saw_phase(self, phase: str) -> bool:
        return any(hb.phase == phase for hb in self.heartbeats())

    def outage(self, down: bool) -> None:
        """The coordinator unreachable (every connection dropped), or reachable again."""
        self.proxy.rates = FaultRates(drop=1.0) if down else FaultRates()


FleetFactory = Callable[..., Awaitable[Fleet]]


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[FleetFactory]:
    """``await fleet(num_gpus=1, scale=SCALE)``: a running coordinator, stopped after."""
    started: list[Fleet] = []

    async def start(*, num_gpus: int = 1, scale: float = SCALE) -> Fleet:
        proxy = await FaultProxy(record=True).start()
        machines = Machines(num_gpus)
        settings = make_settings(
            tmp_path / "coordinator", host="127.0.0.1", port=0, public_url=proxy.url,
            next_heartbeat_s=1, sim_time_scale=scale,
            # The agent obeys a terminate verdict at once; the monitor's destroy after the
            # grace would only race it.
            terminate_grace_s=600.0,
        )
        server = await start_server(settings, machines)
        proxy.set_upstream(int(server.url.rsplit(":", 1)[1]))
        f = Fleet(server, machines, proxy, aiohttp.ClientSession())
        started.append(f)
        return f

    try:
        yield start
    finally:
        for f in started:
            await f.close()


def telemetry(n_gpus: int) -> Telemetry:
    return Telemetry(
        window_s=5.0,
        samples=5,
        gpus=[
            GpuTelemetry(i, 45.0, 80.0, 10**9, 1000.0, 1000.0, 200.0, 60.0, 2000.0, 0)
            for i in range(n_gpus)
        ],
        cpu=CpuTelemetry(97.0, [97.0] * 8, 8.0, 0.1),
        ram=RamTelemetry(10**10, 10**11),
        net=NetTelemetry(0.0, 0.0),
    )
class FakeSampler:
    def __init__(self, n_gpus: int) -> None:
        self.n_gpus = n_gpus
        self.running = False
        self.urls: list[str | None] = []
        self._next = 0
        self.open: set[int] = set()

    async def start(self) -> None:
        self.running = True

    async def stop(self) -> None:
        self.running = False

    def set_cuzk_status_url(self, url: str | None, synthesis_slots: int | None = None) -> None:
        self.urls.append(url)

    def open_window(self) -> int:
        self._next += 1
        self.open.add(self._next)
        return self._next

    def roll_window(self, wid: int) -> Telemetry | None:
        return telemetry(self.n_gpus)

    def close_window(self, wid: int) -> Telemetry | None:
        self.open.discard(wid)
        return telemetry(self.n_gpus)


def host_info(n_gpus: int) -> HostInfo:
    return HostInfo(
        hostname="test-host",
        cpu_model="Test CPU",
        cpu_cores_logical=8,
        cpu_cores_physical=4,
        ram_total_bytes=10**11,
        driver_version="570.00",
        cuda_version="13.0",
        gpus=[Gpu(i, f"GPU-{i}", "RTX 4090", 24 * 10**9, 4, 16, 4, 16) for i in range(n_gpus)],
    )



class Harness:
    """The deployed instance's machine: the agent, with the environment the coordinator
    handed the provider plus what the machine itself provides (its folders, the fake
    cuzk programs, the C1 input)."""

    def __init__(self, tmp_path: Path, fleet: Fleet, n_gpus: int = 1, **env: str) -> None:
        self.tmp = tmp_path
        self.fleet = fleet
        self.sampler = FakeSampler(n_gpus)
        self.n_gpus = n_gpus
        self.destroyed: list[str] = []
        # A 256 GB container on a 512 GB host: the budget must come from the limit.
        self.memory = MemoryLimit(512 * 10**9, 256 * 10**9)
        write_c1(tmp_path / "c1.json")
        base = {
            "VM_STATE_DIR": str(tmp_path / "state"),
            "VM_PARAMS_DIR": str(tmp_path / "params"),
            "VM_CUZK_BIN": write_script(tmp_path / "fake-cuzk", FAKE_DAEMON),
            "VM_CUZK_BENCH_BIN": write_script(tmp_path / "fake-cuzk-bench", FAKE_BENCH),
            "VM_C1_PATH": str(tmp_path / "c1.json"),
            "VM_BENCH_PROOFS": "3",
            "VM_BENCH_CONCURRENCY": "2",
            "VM_ORPHAN_TIMEOUT": "120",
            "VM_PROVIDER": "local",
            "VM_PCE_WAIT": "20",
        }
        base.update(fleet.env)
        base.update(env)
        self.config: AgentConfig = load_config(base)

    @classmethod
    async def deploy(cls, tmp_path: Path, fleet: Fleet, n_gpus: int = 1,
                     min_rate: float | None = None, **env: str) -> Harness:
        await fleet.deploy(min_rate=min_rate)
        return cls(tmp_path, fleet, n_gpus, **env)

    async def destroyer(self, config: AgentConfig) -> None:
        self.destroyed.append(config.provider)

    def make_agent(self, **kw: Any) -> Agent:
        kw.setdefault("sampler_factory", lambda cfg: (host_info(self.n_gpus), self.sampler))
        kw.setdefault("memory_probe", lambda cfg: self.memory)
        agent = Agent(self.config, destroyer=self.destroyer, **kw)
        self.fleet.machines.agents[self.fleet.provider_instance_id] = agent
        return agent


async def until(cond: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``cond`` (plain or async) until it is true, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def state_is(f: Fleet, *states: str) -> bool:
    return (await f.instance())["state"] in states


def logged(f: Fleet, needle: str) -> Callable[[], Awaitable[bool]]:
    """A condition: a line with ``needle`` has reached the coordinator's logs."""

    async def cond() -> bool:
        return needle in await f.log_text()

    return cond


async def destroyed_by_the_operator(f: Fleet, task: asyncio.Task[int]) -> int:
    """The operator destroys the instance; the provider stops its machine's agent."""
    status, data = await f.destroy()
    assert status == 200, data
    code = await asyncio.wait_for(task, 60)
    assert (await f.instance())["state"] == "destroyed"
    assert f.machines.destroyed == [f.provider_instance_id]
    return code


def assert_no_children() -> None:
    children = psutil.Process().children(recursive=True)
    # multiprocessing's resource tracker lives as long as the test process once any
    # test in it started a spawn pool (the coordinator's model refits): not the agent's.
    live = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE
            and "multiprocessing.resource_tracker" not in " ".join(c.cmdline())]
    assert live == [], f"child processes left: {[c.cmdline() for c in live]}"


async def test_benchmark_result_then_proving_then_terminate(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    work = write_script(tmp_path / "fake-work", FAKE_WORK)
    h = await Harness.deploy(tmp_path, f, VM_WORK_CMD=f"{work} {tmp_path / 'work-marker'}")
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: f.sent("/v1/result"), "the benchmark result")
        (result,) = await f.results()
        assert result["kind"] == "benchmark" and result["proof_type"] == "porep-c2-32g"
        assert result["proofs_completed"] == 3 and result["proofs_failed"] == 0
        assert result["proof_seconds"] == [60.0, 60.0, 60.0]
        assert result["wall_seconds"] == pytest.approx(90.0)
        assert result["rate_per_hour"] == pytest.approx(120.0)
        assert result["gpus_used"] == [0]
        assert result["telemetry"] is not None
        # The coordinator believed it and kept the host (120/h against 50/h).
        assert result["flags"] == [] and result["verdict"] == "keep", result
        assert result["counts_for_host_perf"]
        # Proving: the work command runs (restarted after its first death) and the
        # daemon's /status counts its proofs, which the coordinator sees.
        await until(
            lambda: (
                (tmp_path / "work-marker").exists()
                and (tmp_path / "work-marker").read_text().count("start") >= 2
            ),
            "the work command restarted",
        )

        async def proofs_counted() -> bool:
            inst = await f.instance()
            return inst["state"] == "proving" and inst["proofs_completed_total"] >= 8

        await until(proofs_counted, "proofs counted while proving")
        # The operator destroys it while vast.ai refuses the destroy: the coordinator
        # retries later and meanwhile tells the agent, which destroys its own instance.
        f.machines.destroy_error = ProviderError("vast.ai answered 429 (too many requests)")
        status, data = await f.destroy()
        assert status == 502 and "429" in data["message"], data
        code = await asyncio.wait_for(task, 60)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_TERMINATED
    assert h.destroyed == ["local"]
    inst = await f.instance()
    assert inst["state"] == "terminating"
    assert inst["terminate_reason"] == "destroyed by the operator"
    phases = f.phases()
    assert "benchmarking" in phases and phases[-1] == "terminating"
    assert phases.index("benchmarking") < phases.index("proving")
    hellos = f.hellos()
    assert len(hellos) == 1 and hellos[0].host.hostname == "test-host"
    # Benchmark heartbeats carried progress in proofs and each proof's seconds, each once.
    heartbeats = f.heartbeats()
    bench_hbs = [hb for hb in heartbeats if hb.phase == "benchmarking"]
    assert all(hb.progress is not None and hb.progress.unit == "proofs" for hb in bench_hbs)
    recent = [s for hb in heartbeats for s in hb.proof_seconds_recent]
    assert recent == [60.0, 60.0, 60.0]
    seqs = [hb.seq for hb in heartbeats]
    assert seqs == sorted(set(seqs))
    # Logs were shipped, from the agent and its children, with no key in them.
    text = await f.log_text()
    assert "[cuzk] fake cuzk up: devices=[]" in text
    assert "[cuzk-bench] === Batch Summary ===" in text
    assert "[work] work started" in text
    assert "[agent] INFO vast_manager.agent.lifecycle: phase" in text
    assert h.config.agent_key.hex() not in text
    # One daemon: the warm-up proof made its PCE and the benchmark ran in it; no
    # restart in between (a restart would throw the PCE away).
    assert text.count("fake cuzk up") == 1
    toml = (tmp_path / "state" / "cuzk.toml").read_text()
    # The budget is the container's 256 GB limit less 5 GiB, not the host's 512 GB.
    assert f'total_budget = "{(256 * 10**9 - 5 * 2**30) // 2**20}MiB"' in toml
    assert 'status_listen = "127.0.0.1:' in toml
    assert agent.spool.pending("result") == []
    assert_no_children()


async def test_multi_gpu_host_sends_a_scaling_result(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet(num_gpus=2)
    monkeypatch.setenv("FAKE_GPUS", "2")
    h = await Harness.deploy(tmp_path, f, n_gpus=2)
    task = asyncio.create_task(h.make_agent().run())
    try:
        await until(lambda: len(f.sent("/v1/result")) == 2, "the benchmark and scaling results")
        await until(lambda: f.saw_phase("proving"), "proving after the scaling run")
        # The one-GPU run restricted gpus.devices (its line shipped before the end).
        await until(logged(f, "devices=[0]"), "the one-GPU daemon's log line")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM and h.destroyed == []
    # A first claim on hardware the fleet never measured may be held for a watched
    # confirmation (docs/reliability.md): the counted benchmark is the one not held.
    (bench,) = [r for r in await f.results("benchmark") if "unconfirmed" not in r["flags"]]
    (scaling,) = await f.results("scaling")
    assert bench["gpus_used"] == [0, 1]
    assert bench["rate_per_hour"] == pytest.approx(180.0)
    assert scaling["gpus_used"] == [0]
    assert scaling["rate_per_hour"] == pytest.approx(120.0)
    assert [r["gpus_used"] for r in scaling["runs"]] == [[0, 1], [0]]
    assert scaling["efficiency"] == pytest.approx(180.0 / (2 * 120.0), abs=0.01)
    assert scaling["bottleneck"] == "cpu"  # the fake telemetry: CPU 97%, GPUs 45% busy
    assert scaling["evidence"]
    assert bench["flags"] == [] and scaling["flags"] == [], (bench, scaling)
    # The coordinator's own verdict from the reported runs agrees.
    (row,) = await f.ok("GET", "/api/scaling")
    assert row["bottleneck"] == "cpu", row
    phases = f.phases()
    assert phases.index("benchmarking") < phases.index("proving")
    assert_no_children()


async def test_result_answered_terminate_destroys_without_proving(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    # The operator wants 500/h of this host; the fake proves 120/h.
    h = await Harness.deploy(tmp_path, f, min_rate=500.0)
    # A result from a previous boot, still in the spool, is replayed once.
    old = Result(
        result_id="res_previous_boot",
        kind="benchmark",
        proof_type="porep-c2-32g",
        started_at=1.0,
        finished_at=2.0,
        gpus_used=[0],
        proofs_completed=1,
        proofs_failed=0,
        wall_seconds=60.0,
        rate_per_hour=60.0,
        proof_seconds=[60.0],
        telemetry=None,
    )
    from vast_manager.agent.spool import Spool

    Spool(tmp_path / "state" / "spool").put_result(old)
    code = await asyncio.wait_for(h.make_agent().run(), 60)
    assert code == EXIT_TERMINATED
    assert h.destroyed == ["local"]
    assert f.result_posts().count("res_previous_boot") == 1
    results = {r["result_id"]: r for r in await f.results()}
    assert "res_previous_boot" in results
    inst = await f.instance()
    assert inst["state"] == "terminating" and inst["terminate_reason"]
    assert "proving" not in f.phases()
    assert Spool(tmp_path / "state" / "spool").pending("result") == []
    assert_no_children()


async def test_the_concurrency_is_announced_once_the_daemon_has_the_batch(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cuzk-bench takes 2.5 s before each proof reaches the daemon: the heartbeats of
    # that time must not announce a running batch (the coordinator's early verdict
    # times the batch from the announcement, docs/policy.md).
    monkeypatch.setenv("FAKE_PROOF_DELAY", "2.5")
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    task = asyncio.create_task(h.make_agent().run())
    try:
        await until(lambda: f.sent("/v1/result"), "the benchmark result", 60)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    bench_hbs = [hb for hb in f.heartbeats() if hb.phase == "benchmarking"]
    before = bench_hbs[0].proofs_completed_total  # the warm-up proof's
    waiting = [hb for hb in bench_hbs if hb.proofs_completed_total == before]
    assert len(waiting) >= 2, [(hb.seq, hb.progress) for hb in bench_hbs]
    assert all(hb.progress is not None and hb.progress.concurrency is None
               for hb in waiting), [(hb.seq, hb.progress) for hb in waiting]
    announced = [hb for hb in bench_hbs if hb.progress and hb.progress.concurrency]
    assert announced and announced[0].proofs_completed_total > before
    assert {hb.progress.concurrency for hb in announced if hb.progress} == {2}


async def test_coordinator_outage_result_arrives_once(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: f.saw_phase("benchmarking"), "benchmarking")
        f.outage(True)
        await until(lambda: agent.spool.pending("result") != [], "the result spooled")
        await until(lambda: agent.client.consecutive_failures >= 2, "retries")
        assert f.result_posts() == []
        f.outage(False)
        await until(lambda: f.sent("/v1/result"), "the result after the outage", 90)
        await until(lambda: agent.phase == "proving", "proving")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM
    assert len(f.result_posts()) == len(set(f.result_posts())) == 1
    (result,) = await f.results()
    assert result["verdict"] == "keep" and result["flags"] == [], result
    assert_no_children()


@pytest.mark.parametrize("answers_lost", [False, True], ids=["answered", "answers-lost"])
async def test_rebenchmark_directive_while_proving(fleet: FleetFactory, tmp_path: Path,
                                                   answers_lost: bool) -> None:
    """``answers-lost``: the answers of the heartbeats after the ask are lost (committed,
    then the connection reset) and the agent retries: the coordinator answers the
    operator's benchmark until the agent acts on it, so it is run all the same."""
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.phase == "proving", "proving")
        lost_before = f.proxy.counts["reset_response"]
        if answers_lost:
            f.proxy.rates = FaultRates(reset_response=1.0)
        await f.ok("POST", f"/api/instances/{f.instance_id}/rebenchmark")
        if answers_lost:
            await until(lambda: f.proxy.counts["reset_response"] >= lost_before + 3,
                        "three answers lost after the ask")
            f.proxy.rates = FaultRates()
        await until(lambda: len(f.sent("/v1/result")) == 2, "a second benchmark result")
        # Proving again as the coordinator heard it (the agent's own phase changes a
        # moment before its heartbeat says so).
        await until(lambda: f.phases().count("proving") == 2, "proving again")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM
    results = await f.results("benchmark")
    assert len(results) == 2 and {r["verdict"] for r in results} == {"keep"}, results
    # Each benchmark echoes the id the coordinator directed it with: the first (given at
    # hello), then the operator's (a fresh one).
    ids = [orjson.loads(b).get("benchmark_id") for b in f.sent("/v1/result")]
    assert all(isinstance(i, str) and i.startswith("bm_") for i in ids), ids
    assert len(set(ids)) == 2, ids
    phases = f.phases()
    assert phases.count("benchmarking") == 2 and phases.count("proving") == 2, phases
    assert_no_children()


async def test_orphan_rule_before_proving(fleet: FleetFactory, tmp_path: Path) -> None:
    """The coordinator deployed it, then was never reachable: no verified answer ever."""
    f = await fleet()
    h = await Harness.deploy(tmp_path, f, VM_ORPHAN_TIMEOUT="1.5")
    f.outage(True)
    code = await asyncio.wait_for(h.make_agent().run(), 30)
    assert code == EXIT_ORPHANED
    assert h.destroyed == ["local"]
    assert f.proxy.counts["drop"] >= 1 and f.sent("/v1/hello") == []
    assert_no_children()


async def test_orphan_rule_while_proving_needs_no_proofs_too(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    h = await Harness.deploy(tmp_path, f, VM_ORPHAN_TIMEOUT="3")
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.phase == "proving", "proving")
        now = time.monotonic()
        # A silent coordinator alone is no reason to stop earning...
        agent.client.last_verified_at = now - 10
        agent.proving.last_proof_mono = now
        assert not agent.orphan_check()
        # ...but silent and no proof for as long is.
        agent.proving.last_proof_mono = now - 10
        assert agent.orphan_check()
        f.outage(True)
        code = await asyncio.wait_for(task, 30)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_ORPHANED and h.destroyed == ["local"]
    assert_no_children()


async def failed_reason(f: Fleet, agent_task: asyncio.Task[int]) -> str:
    """The reason the agent reported with its `failed` heartbeat, as the coordinator
    recorded it, after the coordinator's terminate ended the agent."""
    try:
        code = await asyncio.wait_for(agent_task, 60)
    finally:
        if not agent_task.done():
            agent_task.cancel()
    assert code == EXIT_FAILED
    assert f.saw_phase("failed")
    inst = await f.instance()
    assert inst["state"] == "failed", [(e["kind"], e["reason"]) for e in inst["events"]]
    prefix = "the agent reported failed: "
    reason: str = inst["terminate_reason"]
    assert reason.startswith(prefix), reason
    return reason.removeprefix(prefix)


async def test_crashing_bench_reports_failed_then_obeys_terminate(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet()
    monkeypatch.setenv("FAKE_BENCH_CRASH", "1")
    h = await Harness.deploy(tmp_path, f)
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert "ended before its summary" in reason
    assert "ended before its summary" in await f.log_text()
    assert h.destroyed == ["local"]
    assert await f.results() == []
    assert_no_children()


# --- the daemon-crash rule (docs/reliability.md, "When the cuzk daemon dies") ------------


def crash_line(doing: str, n: int) -> str:
    """What the agent logs (and ships) when the daemon fails for the ``n``-th time."""
    return f"the cuzk daemon failed while {doing} (failure {n} of the 2 allowed in 30 minutes)"


@pytest.mark.parametrize(
    ("proof", "doing", "benchmark_runs"),
    [(1, "warming up", 1),  # the warm-up proof
     (3, "benchmarking", 2)],  # the benchmark's second proof
    ids=["mid-warm-up", "mid-benchmark"],
)
async def test_a_daemon_killed_before_the_result_is_restarted_warmed_and_measured_again(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    proof: int, doing: str, benchmark_runs: int,
) -> None:
    f = await fleet()
    monkeypatch.setenv("FAKE_DAEMON_DIES_ON", str(proof))
    h = await Harness.deploy(tmp_path, f)
    task = asyncio.create_task(h.make_agent().run())
    try:
        await until(lambda: f.sent("/v1/result"), "the benchmark result")
        await until(logged(f, crash_line(doing, 1)), "the failure shipped")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM
    # One result, of a whole run on the new daemon: a killed run measured nothing.
    assert len(f.sent("/v1/result")) == 1
    (result,) = await f.results()
    assert (result["proofs_completed"], result["proofs_failed"]) == (3, 0), result
    assert result["verdict"] == "keep", result
    text = await f.log_text()
    assert f"[cuzk] fake cuzk killed as proof {proof} arrives" in text
    assert "(the daemon exited with status -9); restarting it" in text
    # A second daemon, warmed up (its own warm-up proof) before the benchmark ran in it.
    assert text.count("fake cuzk up") == 2
    assert text.count("[cuzk-bench] count:       1") == 2
    assert text.count("[cuzk-bench] count:       3") == benchmark_runs
    assert "failed" not in f.phases()
    assert_no_children()


async def test_a_daemon_killed_while_proving_is_restarted_and_proving_goes_on(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet()
    monkeypatch.setenv("FAKE_DAEMON_DIES_ON", "6")  # the work command's second proof
    work = write_script(tmp_path / "fake-work", FAKE_WORK)
    h = await Harness.deploy(tmp_path, f, VM_WORK_CMD=f"{work} {tmp_path / 'work-marker'}")
    task = asyncio.create_task(h.make_agent().run())
    try:
        await until(logged(f, crash_line("proving", 1)), "the failure shipped")

        async def proving_on_the_new_daemon() -> bool:
            inst = await f.instance()
            return inst["state"] == "proving" and inst["proofs_completed_total"] >= 10

        await until(proving_on_the_new_daemon, "proofs counted from the new daemon")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM
    text = await f.log_text()
    assert "[cuzk] fake cuzk killed as proof 6 arrives" in text
    assert "the cuzk daemon exited while proving (the daemon exited with status -9)" in text
    assert text.count("fake cuzk up") == 2
    assert len(f.sent("/v1/result")) == 1  # proving restarts no benchmark
    assert "failed" not in f.phases()
    assert_no_children()


async def test_the_third_daemon_failure_in_30_minutes_fails_the_agent_whatever_the_phases(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet()
    # Killed in the warm-up (1), in the benchmark on the second daemon (3), and while
    # proving on the third (9: the warm-up is 4, the benchmark 5 to 7, the work's 8, 9).
    monkeypatch.setenv("FAKE_DAEMON_DIES_ON", "1,3,9")
    work = write_script(tmp_path / "fake-work", FAKE_WORK)
    h = await Harness.deploy(tmp_path, f, VM_WORK_CMD=f"{work} {tmp_path / 'work-marker'}")
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert reason == (
        "the cuzk daemon failed 3 times in 30 minutes, the last while proving: the cuzk "
        "daemon exited while proving (the daemon exited with status -9)"), reason
    text = await f.log_text()
    assert crash_line("warming up", 1) in text and crash_line("benchmarking", 2) in text
    assert text.count("fake cuzk up") == 3  # no fourth daemon
    assert len(await f.results()) == 1  # the second daemon's benchmark was reported
    assert h.destroyed == ["local"]
    assert_no_children()


async def test_a_budget_under_one_partition_fails_before_anything_runs(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    h.memory = MemoryLimit(512 * 10**9, 16 * 10**9)  # a 16 GB container: 9.9 GiB of budget
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert "memory budget of 9.9 GiB" in reason and "14 GiB one PoRep partition" in reason
    assert "fetching_params" not in f.phases()
    assert "[cuzk]" not in await f.log_text()
    assert_no_children()


async def test_a_budget_that_cannot_hold_the_srs_and_a_partition_fails_before_the_daemon(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    # cuzk reserves the SRS's .params size, then 14 GiB per partition; a budget short of
    # both would leave the proofs waiting for ever (docs/cuzk.md, the memory budget).
    f = await fleet()
    params = tmp_path / "params"
    params.mkdir()
    with open(params / agent_cuzk.POREP_32G_PARAMS, "wb") as fh:
        fh.truncate(45 * 2**30)  # sparse: its size is what cuzk reserves
    h = await Harness.deploy(tmp_path, f, VM_CUZK_MEMORY_BUDGET="50GiB")
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert reason.startswith("cuzk's memory budget of 50.0 GiB cannot hold the 45.0 GiB SRS "
                             "and one 14 GiB PoRep partition"), reason
    assert "[cuzk]" not in await f.log_text()  # no daemon started
    assert await f.results() == []
    assert_no_children()


async def test_a_pce_extraction_that_never_finishes_fails_the_warm_up(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet()
    monkeypatch.setenv("FAKE_NO_PCE", "1")
    h = await Harness.deploy(tmp_path, f, VM_PCE_WAIT="1")
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert "PCE extraction did not finish within VM_PCE_WAIT (1 s)" in reason
    assert await f.results() == []
    assert "[cuzk-bench] count:       3" not in await f.log_text()  # no benchmark started
    assert_no_children()


async def test_a_failed_pce_extraction_fails_the_warm_up_without_waiting_it_out(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet()
    monkeypatch.setenv("FAKE_PCE_FAILS", "1")
    # A wait far past failed_reason's own: the daemon's failure line ends it, not the wait.
    h = await Harness.deploy(tmp_path, f, VM_PCE_WAIT="3600")
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert reason.startswith("the cuzk daemon's background PCE extraction failed"), reason
    assert await f.results() == []
    assert "[cuzk-bench] count:       3" not in await f.log_text()  # no benchmark started
    assert_no_children()


async def test_every_boot_warms_up_whatever_pce_file_an_earlier_one_left(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "pce-porep-32g.bin").write_bytes(b"from an earlier boot")
    h = await Harness.deploy(tmp_path, f, min_rate=500.0)  # its 120/h will not do
    assert await asyncio.wait_for(h.make_agent().run(), 60) == EXIT_TERMINATED
    assert "below the minimum" in (await f.instance())["terminate_reason"]
    text = await f.log_text()
    # The warm-up proof ran before the benchmark although a PCE file was there.
    assert text.index("[cuzk-bench] count:       1") < text.index("[cuzk-bench] count:       3")
    # The daemon was stopped the way cuzk understands: SIGINT first.
    assert "[cuzk] received SIGINT, shutting down" in text
    assert_no_children()


async def test_a_c1_for_another_miner_fails_the_warm_up_proof_on_the_simulator(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = await fleet(num_gpus=2, scale=3000.0)
    monkeypatch.setenv("VM_SIM_PROFILE", orjson.dumps(SIM_OFFER_2X).decode())
    monkeypatch.setenv("VM_SIM_TIME_SCALE", "3000")
    h = await Harness.deploy(
        tmp_path, f, n_gpus=2, VM_C1_MINER_ID="1001",  # the Harness's C1 is miner 1000's
        VM_CUZK_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk", "vast_manager.sim.daemon"),
        VM_CUZK_BENCH_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk-bench",
                                          "vast_manager.sim.bench"),
    )
    reason = await failed_reason(f, asyncio.create_task(h.make_agent().run()))
    assert reason.startswith("the warm-up proof FAILED: cuzk cannot prove C1 file")
    assert f"{tmp_path / 'c1.json'} as sector 1 of miner 1001" in reason
    assert await f.results() == []
    assert_no_children()


async def test_signal_stops_children_without_self_destroy(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.daemon.running, "the daemon")
        agent.request_stop(15)
        code = await asyncio.wait_for(task, 30)
    finally:
        if not task.done():
            task.cancel()
    assert code == 128 + 15
    assert h.destroyed == []
    assert_no_children()


def test_agent_environment_is_documented() -> None:
    from vast_manager.agent.config import SETTINGS

    doc = (REPO_ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## Agent configuration") :]
    table = table[: table.index("\n## ", 5)]
    for setting in SETTINGS:
        assert f"`{setting.env}`" in table, f"{setting.env} is not in docs/architecture.md"
    import re

    documented = set(re.findall(r"`(VM_[A-Z0-9_]+)`", table))
    assert documented <= {s.env for s in SETTINGS} | {
        "VM_CUZK_ADDR",
        "VM_CUZK_LISTEN",
        "VM_CUZK_STATUS_URL",
    }


def test_config_errors_name_the_variable_never_the_key() -> None:
    from vast_manager.agent.config import ConfigError

    good = {
        "VM_COORDINATOR_URL": "http://127.0.0.1:1",
        "VM_AGENT_ID": AGENT_ID,
        "VM_AGENT_KEY": KEY.hex(),
    }
    assert load_config(good).provider == "local"
    assert load_config({**good, "CONTAINER_ID": "123"}).provider == "vast"
    secret = "zz" + KEY.hex()[2:]
    with pytest.raises(ConfigError) as info:
        load_config({**good, "VM_AGENT_KEY": secret})
    assert "VM_AGENT_KEY" in str(info.value) and secret not in str(info.value)
    for name, value in [
        ("VM_BENCH_PROOFS", "many"),
        ("VM_NVML", "maybe"),
        ("VM_ORPHAN_TIMEOUT", "-1"),
        ("VM_COORDINATOR_URL", "ftp://x"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config({**good, name: value})
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="VM_AGENT_ID"):
        load_config({k: v for k, v in good.items() if k != "VM_AGENT_ID"})
    # Acknowledged results are kept for a coordinator restored within the orphan timeout.
    with pytest.raises(ConfigError, match=r"VM_ACK_RETENTION .* 0 or at least VM_ORPHAN_TIMEOUT"):
        load_config({**good, "VM_ORPHAN_TIMEOUT": "7200", "VM_ACK_RETENTION": "600"})
    assert load_config({**good, "VM_ORPHAN_TIMEOUT": "600",
                        "VM_ACK_RETENTION": "600"}).ack_retention_s == 600
    assert KEY.hex() not in repr(load_config(good))


def test_no_leftover_environment() -> None:
    assert "FAKE_GPUS" not in os.environ


SIM_OFFER_2X = {
    "gpu_name": "RTX 4080 Super", "num_gpus": 2, "cpu_name": "AMD EPYC 9354 32-Core Processor",
    "cpu_cores_effective": 64, "cpu_ram": 515000, "pci_gen": 4, "gpu_lanes": 16,
    "pcie_bw": 24.0, "sim": {"seed": 3},
}


def sim_entry_point(path: Path, module: str) -> str:
    """An executable standing in for the vm-sim-* console scripts (not installed here)."""
    root = REPO_ROOT
    return write_script(
        path,
        f"import sys\nsys.path.insert(0, {str(root)!r})\n"
        f"from {module} import main\nsys.exit(main())\n",
    )



async def test_lifecycle_on_the_simulated_cuzk_with_the_real_sampler(
    fleet: FleetFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vast_manager.agent.sampler")
    # The simulated machine runs 3000x faster; the coordinator counts its time so.
    f = await fleet(num_gpus=2, scale=3000.0)
    # The simulator and the fake NVML read these from the environment.
    monkeypatch.setenv("VM_SIM_PROFILE", orjson.dumps(SIM_OFFER_2X).decode())
    monkeypatch.setenv("VM_SIM_TIME_SCALE", "3000")
    monkeypatch.setenv("VM_SIM_STATE_FILE", str(tmp_path / "sim-state.json"))
    # Every command line the agent runs, checked below against cuzk's clap declarations.
    argvs: list[list[str]] = []

    class Recorded(agent_cuzk.ManagedProcess):
        def __init__(self, argv: list[str], **kw: Any) -> None:
            argvs.append(list(argv))
            super().__init__(argv, **kw)

    monkeypatch.setattr(agent_cuzk, "ManagedProcess", Recorded)
    h = await Harness.deploy(
        tmp_path, f, n_gpus=2, min_rate=1.0,
        VM_CUZK_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk", "vast_manager.sim.daemon"),
        VM_CUZK_BENCH_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk-bench",
                                          "vast_manager.sim.bench"),
        VM_NVML="sim", VM_SAMPLE_INTERVAL="0.1", VM_BENCH_PROOFS="6",
    )
    # The simulator's sampler factory and memory probe, as vm-sim-agent plugs them in.
    agent = h.make_agent(sampler_factory=sim_sampler_factory, memory_probe=sim_memory_probe)
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: len(f.sent("/v1/result")) == 2, "the benchmark and scaling results",
                    120)
        await until(lambda: agent.phase == "proving", "proving")
        # Everything up to the scaling verdict shipped before the end.
        await until(logged(f, "scaling: efficiency"), "the scaling run's log lines")
        code = await destroyed_by_the_operator(f, task)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM, (await f.log_text())[-3000:]
    hellos = f.hellos()
    assert len(hellos) == 1 and len(hellos[0].host.gpus) == 2
    (bench,) = await f.results("benchmark")
    (scaling,) = await f.results("scaling")
    # Simulated numbers the coordinator found plausible at the simulation's scale.
    assert bench["flags"] == [] and scaling["flags"] == [], (bench, scaling)
    assert bench["verdict"] == "keep"
    assert bench["gpus_used"] == [0, 1] and bench["proofs_completed"] == 6
    assert bench["rate_per_hour"] > 0 and len(bench["proof_seconds"]) == 6
    telemetry = bench["telemetry"]
    assert telemetry is not None and len(telemetry["gpus"]) == 2
    assert telemetry["cuzk"] is not None and telemetry["cuzk"]["synthesis_slots"] == 18
    assert len(scaling["runs"]) == 2
    assert scaling["efficiency"] is not None and 0 < scaling["efficiency"] <= 1.2
    assert scaling["bottleneck"] in ("gpu", "cpu", "pcie", "memory", "unknown")
    # The real command lines, and the lifecycle they make: each daemon that is
    # benchmarked gets a warm-up proof, then its PCE, then the benchmark, with
    # no restart in between; the one-GPU run is a new daemon, warmed up again,
    # and proving runs in a daemon on every GPU again.
    for argv in argvs:
        cuzk_surface.check(argv)
    kinds = []
    for argv in argvs:
        m = cuzk_surface.check(argv)
        if not m.path():
            kinds.append("daemon")
        elif m.path() == ["batch"]:
            v = m.leaf().values
            assert (v["sector_num"], v["miner_id"]) == (1, 1000)
            kinds.append(f"batch {v['count']}")
        else:
            kinds.append(m.path()[0])
    assert kinds == ["daemon", "preload", "batch 1", "batch 6",
                     "daemon", "preload", "batch 1", "batch 6",
                     "daemon", "preload"], kinds
    text = await f.log_text()
    assert text.count("PCE extracted and held in memory") == 2
    first_pce = text.index("PCE extracted and held in memory")
    assert text.index("warm-up proof") < first_pce < text.index("benchmark on GPUs [0, 1]")
    assert "restarting" not in text
    assert "[cuzk-bench] === Batch Summary ===" in text
    assert_no_children()


def test_cli_help_documents_exit_codes_and_settings() -> None:
    from click.testing import CliRunner

    from vast_manager.agent.cli import cli
    from vast_manager.agent.config import SETTINGS

    runner = CliRunner()
    top = runner.invoke(cli, ["--help"], catch_exceptions=False)
    assert top.exit_code == 0 and "run" in top.output
    run_help = runner.invoke(cli, ["run", "--help"], catch_exceptions=False)
    assert run_help.exit_code == 0
    assert "Exit status" in run_help.output and "143" in run_help.output
    for setting in SETTINGS:
        assert setting.env in run_help.output


def test_cli_run_with_bad_config_exits_2_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from vast_manager.agent.cli import cli

    for name in [n for n in os.environ if n.startswith("VM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VM_COORDINATOR_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("VM_AGENT_ID", AGENT_ID)
    result = CliRunner().invoke(cli, ["run"])
    assert result.exit_code == 2
    assert "VM_AGENT_KEY" in result.output


def test_the_agent_alone_refuses_the_simulated_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """VM_NVML=sim needs the simulator's entry point: the agent never imports it."""
    from click.testing import CliRunner

    from vast_manager.agent.cli import cli

    for name in [n for n in os.environ if n.startswith("VM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VM_COORDINATOR_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("VM_AGENT_ID", AGENT_ID)
    monkeypatch.setenv("VM_AGENT_KEY", "ab" * 32)
    monkeypatch.setenv("VM_NVML", "sim")
    result = CliRunner().invoke(cli, ["run"])
    assert result.exit_code == 2
    assert "vm-sim-agent run" in result.output




async def test_cli_process_stops_its_children_on_sigterm(
    fleet: FleetFactory, tmp_path: Path
) -> None:
    f = await fleet()
    h = await Harness.deploy(tmp_path, f)
    marker = f"agent-test-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ)
    env.update(f.env)  # what the deploy gave the machine
    env.update({
        "VM_STATE_DIR": str(h.config.state_dir), "VM_PARAMS_DIR": str(h.config.params_dir),
        "VM_CUZK_BIN": h.config.cuzk_bin, "VM_CUZK_BENCH_BIN": h.config.cuzk_bench_bin,
        "VM_C1_PATH": str(h.config.c1_path), "VM_BENCH_PROOFS": "2", "VM_NVML": "off",
        "VM_PROVIDER": "local", "VM_TEST_MARKER": marker,
        "PYTHONPATH": str(REPO_ROOT),
    })
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vast_manager.agent.cli", "run", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await until(lambda: state_is(f, "proving"), "proving")
        proc.send_signal(15)
        assert await asyncio.wait_for(proc.wait(), 30) == 128 + 15
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    left = []
    gone = (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess)
    for p in psutil.process_iter():
        with contextlib.suppress(*gone):
            if (p.environ().get("VM_TEST_MARKER") == marker
                    and p.status() != psutil.STATUS_ZOMBIE):
                left.append(p.cmdline())
    assert left == [], f"processes left behind: {left}"
    assert len(await f.results("benchmark")) == 1


@pytest.mark.parametrize("hide_package", [False, True], ids=["no-driver", "no-package"])
async def test_whole_lifecycle_without_nvml_sends_no_gpus_and_says_why_once(
    fleet: FleetFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    hide_package: bool,
) -> None:
    """On a machine with no NVML (this one) the agent still runs its whole lifecycle with
    the real sampler, reports gpus [], and logs the reason once."""
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if hide_package and name == "pynvml":
            raise ImportError("No module named 'pynvml' (hidden by the test)")
        return real_import(name, *args, **kwargs)

    f = await fleet()
    h = await Harness.deploy(tmp_path, f, VM_NVML="auto", VM_SAMPLE_INTERVAL="0.05")
    agent = h.make_agent(sampler_factory=default_sampler_factory)
    caplog.set_level(logging.INFO)
    builtins.__import__ = no_pynvml
    try:
        task = asyncio.create_task(agent.run())
        await until(lambda: f.sent("/v1/result"), "the benchmark result")
        await until(lambda: f.saw_phase("proving"), "proving")
        code = await destroyed_by_the_operator(f, task)
    finally:
        builtins.__import__ = real_import
        if not task.done():
            task.cancel()
    assert code == EXIT_SIGTERM
    assert f.hellos()[0].host.gpus == []
    (result,) = await f.results()
    assert result["proofs_completed"] == 3 and result["gpus_used"] == []
    with_telemetry = [hb.telemetry for hb in f.heartbeats() if hb.telemetry is not None]
    assert with_telemetry and all(t.gpus == [] for t in with_telemetry)
    reasons = [r for r in caplog.records
               if "NVML" in r.getMessage() and r.name.startswith("vast_manager.agent")]
    assert len(reasons) == 1, [r.getMessage() for r in reasons]
    assert_no_children()
