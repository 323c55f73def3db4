"""The whole agent lifecycle against a minimal signed coordinator stand-in.

The cuzk daemon and cuzk-bench are small fake executables written here (the
real programs' flags, cuzk.toml, GET /status and batch output format), so
these tests run real child processes and check every one is reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cuzk_surface
import orjson
import psutil
import pytest
from agent_fakes import FAKE_BENCH, FAKE_DAEMON, FAKE_WORK, write_script
from aiohttp import web

import vast_manager.agent.cuzk as agent_cuzk
from vast_manager.agent.config import AgentConfig, load_config
from vast_manager.agent.host import MemoryLimit
from vast_manager.agent.lifecycle import EXIT_FAILED, EXIT_ORPHANED, EXIT_TERMINATED, Agent
from vast_manager.agent.sim.c1 import write_c1
from vast_manager.protocol import (
    CpuTelemetry,
    Gpu,
    GpuTelemetry,
    Heartbeat,
    Hello,
    HostInfo,
    LogBatch,
    NetTelemetry,
    RamTelemetry,
    Result,
    Telemetry,
    decode,
)
from vast_manager.protocol.signing import (
    HEADER_AGENT,
    HEADER_NONCE,
    HEADER_SERVER_TIME,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    sign_response,
    verify_request,
)

AGENT_ID = "ag_" + "a" * 20
KEY = bytes(range(100, 132))

def directive(action: str) -> dict[str, Any]:
    return {
        "action": action,
        "reason": f"stand-in says {action}",
        "next_heartbeat_s": 1,
        "min_rate_per_hour": 10.0,
    }


class StandIn:
    """The coordinator's agent endpoints, minimal: verifies, decodes, records, signs."""

    def __init__(self) -> None:
        self.hellos: list[Hello] = []
        self.heartbeats: list[Heartbeat] = []
        self.results: dict[str, Result] = {}
        self.result_posts: list[str] = []
        self.result_directives: dict[str, dict[str, Any]] = {}
        self.log_lines: list[dict[str, Any]] = []
        self.down = False
        self.heartbeat_action = "continue"
        self.next_action_once: str | None = None  # like POST .../rebenchmark: one directive
        self.result_action: Callable[[Result], str] = lambda r: "continue"

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.down:
            return web.Response(status=503, text="proxy: upstream down")
        h = request.headers
        if h.get(HEADER_AGENT) != AGENT_ID or not verify_request(
            KEY,
            h.get(HEADER_SIGNATURE, ""),
            h.get(HEADER_TIMESTAMP, ""),
            h.get(HEADER_NONCE, ""),
            request.method,
            request.path_qs,
            body,
        ):
            return web.json_response({"error": "bad_signature", "message": "no"}, status=401)
        name = request.match_info["name"]
        answer: Any
        if name == "hello":
            self.hellos.append(decode(Hello, body))
            answer = directive("continue")
        elif name == "heartbeat":
            self.heartbeats.append(decode(Heartbeat, body))
            answer = directive(self.next_action_once or self.heartbeat_action)
            self.next_action_once = None
        elif name == "result":
            result = decode(Result, body)
            self.result_posts.append(result.result_id)
            duplicate = result.result_id in self.results
            if not duplicate:
                self.results[result.result_id] = result
                self.result_directives[result.result_id] = directive(self.result_action(result))
            answer = {
                "ok": True,
                "duplicate": duplicate,
                "directive": self.result_directives[result.result_id],
            }
        elif name == "logs":
            batch = decode(LogBatch, body)
            assert len(batch.lines) <= 1000
            self.log_lines.extend({"source": x.source, "text": x.text} for x in batch.lines)
            answer = {"ok": True}
        else:
            return web.json_response({"error": "not_found", "message": "no"}, status=404)
        data = orjson.dumps(answer)
        return web.Response(
            body=data,
            content_type="application/json",
            headers={
                HEADER_SIGNATURE: sign_response(KEY, h[HEADER_NONCE], 200, data),
                HEADER_SERVER_TIME: str(int(time.time())),
            },
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/{name}", self.handle)
        return app

    def phases(self) -> list[str]:
        out: list[str] = []
        for hb in self.heartbeats:
            if not out or out[-1] != hb.phase:
                out.append(hb.phase)
        return out

    def results_of(self, kind: str) -> list[Result]:
        return [r for r in self.results.values() if r.kind == kind]

    def log_text(self) -> str:
        return "\n".join(f"[{x['source']}] {x['text']}" for x in self.log_lines)


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
    def __init__(self, tmp_path: Path, url: str, n_gpus: int = 1, **env: str) -> None:
        self.tmp = tmp_path
        self.sampler = FakeSampler(n_gpus)
        self.n_gpus = n_gpus
        self.destroyed: list[str] = []
        # A 256 GB container on a 512 GB host: the budget must come from the limit.
        self.memory = MemoryLimit(512 * 10**9, 256 * 10**9)
        write_c1(tmp_path / "c1.json")
        base = {
            "VM_COORDINATOR_URL": url,
            "VM_AGENT_ID": AGENT_ID,
            "VM_AGENT_KEY": KEY.hex(),
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
        base.update(env)
        self.config: AgentConfig = load_config(base)

    def make_agent(self) -> Agent:
        async def destroyer(config: AgentConfig) -> None:
            self.destroyed.append(config.provider)

        return Agent(
            self.config,
            sampler_factory=lambda cfg: (host_info(self.n_gpus), self.sampler),
            destroyer=destroyer,
            memory_probe=lambda cfg: self.memory,
        )


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def assert_no_children() -> None:
    children = psutil.Process().children(recursive=True)
    live = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert live == [], f"child processes left: {[c.cmdline() for c in live]}"


@pytest.fixture
async def stand_in(aiohttp_server: Any) -> tuple[StandIn, str]:
    coord = StandIn()
    server = await aiohttp_server(coord.app())
    return coord, str(server.make_url("")).rstrip("/")


async def test_benchmark_result_then_proving_then_terminate(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    work = write_script(tmp_path / "fake-work", FAKE_WORK)
    h = Harness(tmp_path, url, VM_WORK_CMD=f"{work} {tmp_path / 'work-marker'}")
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: len(coord.results) == 1, "the benchmark result")
        result = next(iter(coord.results.values()))
        assert result.kind == "benchmark" and result.proof_type == "porep-c2-32g"
        assert result.proofs_completed == 3 and result.proofs_failed == 0
        assert result.proof_seconds == [60.0, 60.0, 60.0]
        assert result.wall_seconds == pytest.approx(90.0)
        assert result.rate_per_hour == pytest.approx(120.0)
        assert result.gpus_used == [0]
        assert result.telemetry is not None
        # Proving: the work command runs (restarted after its first death) and the
        # daemon's /status counts its proofs.
        await until(
            lambda: (
                (tmp_path / "work-marker").exists()
                and (tmp_path / "work-marker").read_text().count("start") >= 2
            ),
            "the work command restarted",
        )
        await until(
            lambda: any(
                hb.phase == "proving" and hb.proofs_completed_total >= 8 for hb in coord.heartbeats
            ),
            "proofs counted while proving",
        )
        coord.heartbeat_action = "terminate"
        code = await asyncio.wait_for(task, 60)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_TERMINATED
    assert h.destroyed == ["local"]
    phases = coord.phases()
    assert "benchmarking" in phases and phases[-1] == "terminating"
    assert phases.index("benchmarking") < phases.index("proving")
    assert len(coord.hellos) == 1 and coord.hellos[0].host.hostname == "test-host"
    # Benchmark heartbeats carried progress in proofs and each proof's seconds.
    bench_hbs = [hb for hb in coord.heartbeats if hb.phase == "benchmarking"]
    assert all(hb.progress is not None and hb.progress.unit == "proofs" for hb in bench_hbs)
    recent = [s for hb in coord.heartbeats for s in hb.proof_seconds_recent]
    assert recent == [60.0, 60.0, 60.0]
    seqs = [hb.seq for hb in coord.heartbeats]
    assert seqs == sorted(set(seqs))
    # Logs were shipped, from the agent and its children, with no key in them.
    text = coord.log_text()
    assert "[cuzk] fake cuzk up: devices=[]" in text
    assert "[cuzk-bench] === Batch Summary ===" in text
    assert "[work] work started" in text
    assert "[agent] INFO vast_manager.agent.lifecycle: phase" in text
    assert KEY.hex() not in text
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
    stand_in: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, url = stand_in
    monkeypatch.setenv("FAKE_GPUS", "2")
    coord.result_action = lambda r: "terminate" if r.kind == "scaling" else "continue"
    h = Harness(tmp_path, url, n_gpus=2)
    code = await asyncio.wait_for(h.make_agent().run(), 90)
    assert code == EXIT_TERMINATED
    (bench,) = coord.results_of("benchmark")
    (scaling,) = coord.results_of("scaling")
    assert bench.gpus_used == [0, 1]
    assert bench.rate_per_hour == pytest.approx(180.0)
    assert scaling.gpus_used == [0]
    assert scaling.rate_per_hour == pytest.approx(120.0)
    assert scaling.runs is not None and [r.gpus_used for r in scaling.runs] == [[0, 1], [0]]
    assert scaling.efficiency == pytest.approx(180.0 / (2 * 120.0), abs=0.01)
    assert scaling.bottleneck == "cpu"  # the fake telemetry: CPU 97%, GPUs 45% busy
    assert scaling.evidence
    assert "devices=[0]" in coord.log_text()  # the one-GPU run restricted gpus.devices
    assert "proving" not in coord.phases()
    assert_no_children()


async def test_result_answered_terminate_destroys_without_proving(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    coord.result_action = lambda r: "terminate"
    h = Harness(tmp_path, url)
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
    assert "res_previous_boot" in coord.results
    assert coord.result_posts.count("res_previous_boot") == 1
    assert "proving" not in coord.phases()
    assert Spool(tmp_path / "state" / "spool").pending("result") == []
    assert_no_children()


async def test_coordinator_outage_result_arrives_once(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    h = Harness(tmp_path, url)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(
            lambda: any(hb.phase == "benchmarking" for hb in coord.heartbeats), "benchmarking"
        )
        coord.down = True
        await until(lambda: agent.spool.pending("result") != [], "the result spooled")
        await until(lambda: agent.client.consecutive_failures >= 2, "retries")
        assert coord.results == {}
        coord.down = False
        await until(lambda: len(coord.results) == 1, "the result after the outage", 90)
        await until(lambda: agent.phase == "proving", "proving")
        coord.heartbeat_action = "terminate"
        code = await asyncio.wait_for(task, 60)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_TERMINATED
    assert len(coord.result_posts) == len(set(coord.result_posts)) == 1
    assert_no_children()


async def test_rebenchmark_directive_while_proving(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    h = Harness(tmp_path, url)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.phase == "proving", "proving")
        coord.next_action_once = "benchmark"
        await until(lambda: len(coord.results) == 2, "a second benchmark result")
        await until(lambda: agent.phase == "proving", "proving again")
        coord.heartbeat_action = "terminate"
        code = await asyncio.wait_for(task, 60)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_TERMINATED
    assert len(coord.results_of("benchmark")) == 2
    assert_no_children()


async def test_orphan_rule_before_proving(tmp_path: Path, aiohttp_server: Any) -> None:
    async def silent(request: web.Request) -> web.Response:
        return web.Response(status=502, text="bad gateway")  # unsigned: never acted on

    app = web.Application()
    app.router.add_post("/v1/{name}", silent)
    server = await aiohttp_server(app)
    h = Harness(tmp_path, str(server.make_url("")).rstrip("/"), VM_ORPHAN_TIMEOUT="1.5")
    code = await asyncio.wait_for(h.make_agent().run(), 30)
    assert code == EXIT_ORPHANED
    assert h.destroyed == ["local"]
    assert_no_children()


async def test_orphan_rule_while_proving_needs_no_proofs_too(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    h = Harness(tmp_path, url, VM_ORPHAN_TIMEOUT="3")
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent.phase == "proving", "proving")
        now = time.monotonic()
        # A silent coordinator alone is no reason to stop earning...
        agent.client.last_verified_at = now - 10
        agent._last_proof_mono = now
        assert not agent.orphan_check()
        # ...but silent and no proof for as long is.
        agent._last_proof_mono = now - 10
        assert agent.orphan_check()
        coord.down = True
        code = await asyncio.wait_for(task, 30)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_ORPHANED and h.destroyed == ["local"]
    assert_no_children()


async def test_crashing_bench_reports_failed_then_obeys_terminate(
    stand_in: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, url = stand_in
    monkeypatch.setenv("FAKE_BENCH_CRASH", "1")
    h = Harness(tmp_path, url)
    agent = h.make_agent()
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: any(hb.phase == "failed" for hb in coord.heartbeats), "failed")
        await until(lambda: "ended before its summary" in coord.log_text(), "the reason shipped")
        coord.heartbeat_action = "terminate"
        code = await asyncio.wait_for(task, 30)
    finally:
        if not task.done():
            task.cancel()
    assert code == EXIT_FAILED
    assert h.destroyed == ["local"]
    assert coord.results == {}
    assert_no_children()


async def failed_reason(coord: StandIn, agent_task: asyncio.Task[int]) -> str:
    """Wait for the `failed` heartbeat; return its reason, after terminating the agent."""
    try:
        await until(lambda: any(hb.phase == "failed" for hb in coord.heartbeats), "failed")
        reason = next(hb.failure for hb in coord.heartbeats if hb.phase == "failed")
        coord.heartbeat_action = "terminate"
        assert await asyncio.wait_for(agent_task, 30) == EXIT_FAILED
    finally:
        if not agent_task.done():
            agent_task.cancel()
    assert reason is not None
    return reason


async def test_a_budget_under_one_partition_fails_before_anything_runs(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    h = Harness(tmp_path, url)
    h.memory = MemoryLimit(512 * 10**9, 16 * 10**9)  # a 16 GB container: 9.9 GiB of budget
    reason = await failed_reason(coord, asyncio.create_task(h.make_agent().run()))
    assert "memory budget of 9.9 GiB" in reason and "14 GiB one PoRep partition" in reason
    assert "fetching_params" not in coord.phases()
    assert "[cuzk]" not in coord.log_text()
    assert_no_children()


async def test_a_pce_extraction_that_never_finishes_fails_the_warm_up(
    stand_in: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, url = stand_in
    monkeypatch.setenv("FAKE_NO_PCE", "1")
    h = Harness(tmp_path, url, VM_PCE_WAIT="1")
    reason = await failed_reason(coord, asyncio.create_task(h.make_agent().run()))
    assert "PCE extraction did not finish within VM_PCE_WAIT (1 s)" in reason
    assert coord.results == {}
    assert "[cuzk-bench] count:       3" not in coord.log_text()  # no benchmark started
    assert_no_children()


async def test_every_boot_warms_up_whatever_pce_file_an_earlier_one_left(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    coord.result_action = lambda r: "terminate"
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "pce-porep-32g.bin").write_bytes(b"from an earlier boot")
    h = Harness(tmp_path, url)
    assert await asyncio.wait_for(h.make_agent().run(), 60) == EXIT_TERMINATED
    text = coord.log_text()
    # The warm-up proof ran before the benchmark although a PCE file was there.
    assert text.index("[cuzk-bench] count:       1") < text.index("[cuzk-bench] count:       3")
    # The daemon was stopped the way cuzk understands: SIGINT first.
    assert "[cuzk] received SIGINT, shutting down" in text
    assert_no_children()


async def test_a_c1_for_another_miner_fails_the_warm_up_proof_on_the_simulator(
    stand_in: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coord, url = stand_in
    monkeypatch.setenv("VM_SIM_PROFILE", orjson.dumps(SIM_OFFER_2X).decode())
    monkeypatch.setenv("VM_SIM_TIME_SCALE", "3000")
    h = Harness(
        tmp_path, url, VM_C1_MINER_ID="1001",  # the Harness's C1 is miner 1000's
        VM_CUZK_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk", "vast_manager.agent.sim.daemon"),
        VM_CUZK_BENCH_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk-bench",
                                          "vast_manager.agent.sim.bench"),
    )
    reason = await failed_reason(coord, asyncio.create_task(h.make_agent().run()))
    assert reason.startswith("the warm-up proof FAILED: cuzk cannot prove C1 file")
    assert f"{tmp_path / 'c1.json'} as sector 1 of miner 1001" in reason
    assert coord.results == {}
    assert_no_children()


async def test_signal_stops_children_without_self_destroy(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    _coord, url = stand_in
    h = Harness(tmp_path, url)
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

    doc = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## Agent configuration") :]
    table = table[: table.index("\n## ", 5)]
    for setting in SETTINGS:
        assert f"`{setting.name}`" in table, f"{setting.name} is not in docs/architecture.md"
    import re

    documented = set(re.findall(r"`(VM_[A-Z0-9_]+)`", table))
    assert documented <= {s.name for s in SETTINGS} | {
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
    root = Path(__file__).resolve().parent.parent
    return write_script(
        path,
        f"import sys\nsys.path.insert(0, {str(root)!r})\n"
        f"from {module} import main\nsys.exit(main())\n",
    )


async def test_lifecycle_on_the_simulated_cuzk_with_the_real_sampler(
    stand_in: tuple[StandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("vast_manager.agent.sampler")
    coord, url = stand_in
    coord.result_action = lambda r: "terminate" if r.kind == "scaling" else "continue"
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
    h = Harness(
        tmp_path, url,
        VM_CUZK_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk", "vast_manager.agent.sim.daemon"),
        VM_CUZK_BENCH_BIN=sim_entry_point(tmp_path / "vm-sim-cuzk-bench",
                                          "vast_manager.agent.sim.bench"),
        VM_NVML="sim", VM_SAMPLE_INTERVAL="0.1", VM_BENCH_PROOFS="6",
    )

    async def destroyer(config: AgentConfig) -> None:
        h.destroyed.append(config.provider)

    agent = Agent(h.config, destroyer=destroyer)  # the real sampler factory and memory probe
    code = await asyncio.wait_for(agent.run(), 120)
    assert code == EXIT_TERMINATED, coord.log_text()[-3000:]
    assert len(coord.hellos) == 1 and len(coord.hellos[0].host.gpus) == 2
    (bench,) = coord.results_of("benchmark")
    (scaling,) = coord.results_of("scaling")
    assert bench.gpus_used == [0, 1] and bench.proofs_completed == 6
    assert bench.rate_per_hour > 0 and len(bench.proof_seconds) == 6
    assert bench.telemetry is not None and len(bench.telemetry.gpus) == 2
    assert bench.telemetry.cuzk is not None and bench.telemetry.cuzk.synthesis_slots == 18
    assert scaling.runs is not None and len(scaling.runs) == 2
    assert scaling.efficiency is not None and 0 < scaling.efficiency <= 1.2
    assert scaling.bottleneck in ("gpu", "cpu", "pcie", "memory", "unknown")
    # The real command lines, and the lifecycle they make: each daemon that is
    # benchmarked gets a warm-up proof, then its PCE, then the benchmark, with
    # no restart in between; the one-GPU run is a new daemon, warmed up again.
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
    text = coord.log_text()
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
        assert setting.name in run_help.output


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


async def test_cli_process_stops_its_children_on_sigterm(
    stand_in: tuple[StandIn, str], tmp_path: Path
) -> None:
    coord, url = stand_in
    h = Harness(tmp_path, url)
    marker = f"agent-test-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ)
    env.update({
        "VM_COORDINATOR_URL": url, "VM_AGENT_ID": AGENT_ID, "VM_AGENT_KEY": KEY.hex(),
        "VM_STATE_DIR": str(h.config.state_dir), "VM_PARAMS_DIR": str(h.config.params_dir),
        "VM_CUZK_BIN": h.config.cuzk_bin, "VM_CUZK_BENCH_BIN": h.config.cuzk_bench_bin,
        "VM_C1_PATH": str(h.config.c1_path), "VM_BENCH_PROOFS": "2", "VM_NVML": "off",
        "VM_PROVIDER": "local", "VM_TEST_MARKER": marker,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    })
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vast_manager.agent.cli", "run", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await until(lambda: any(hb.phase == "proving" for hb in coord.heartbeats), "proving")
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
    assert len(coord.results_of("benchmark")) == 1


@pytest.mark.parametrize("hide_package", [False, True], ids=["no-driver", "no-package"])
async def test_whole_lifecycle_without_nvml_sends_no_gpus_and_says_why_once(
    stand_in: tuple[StandIn, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    hide_package: bool,
) -> None:
    """Issue 3: on a machine with no NVML (this one) the agent still runs its whole
    lifecycle with the real sampler, reports gpus [], and logs the reason once."""
    import builtins

    from vast_manager.agent.lifecycle import default_sampler_factory

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if hide_package and name == "pynvml":
            raise ImportError("No module named 'pynvml' (hidden by the test)")
        return real_import(name, *args, **kwargs)

    coord, url = stand_in
    h = Harness(tmp_path, url, VM_NVML="auto", VM_SAMPLE_INTERVAL="0.05")
    agent = Agent(
        h.config, sampler_factory=default_sampler_factory,
        destroyer=lambda cfg: asyncio.sleep(0),
    )
    caplog.set_level(logging.INFO)
    builtins.__import__ = no_pynvml
    try:
        task = asyncio.create_task(agent.run())
        await until(lambda: len(coord.results) == 1, "the benchmark result")
        await until(lambda: any(hb.phase == "proving" for hb in coord.heartbeats), "proving")
        coord.heartbeat_action = "terminate"
        code = await asyncio.wait_for(task, 60)
    finally:
        builtins.__import__ = real_import
        if not task.done():
            task.cancel()
    assert code == EXIT_TERMINATED
    assert coord.hellos[0].host.gpus == []
    result = next(iter(coord.results.values()))
    assert result.proofs_completed == 3
    with_telemetry = [hb.telemetry for hb in coord.heartbeats if hb.telemetry is not None]
    assert with_telemetry and all(t.gpus == [] for t in with_telemetry)
    reasons = [r for r in caplog.records
               if "NVML" in r.getMessage() and r.name.startswith("vast_manager.agent")]
    assert len(reasons) == 1, [r.getMessage() for r in reasons]
    assert_no_children()
