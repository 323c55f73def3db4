"""``serve --fronts N``: heartbeats answered by front processes over one writer's process.

The coordinator runs here as ``vast-manager serve`` runs it (``start_server``), with two
real front processes on the shared socket; the agents are signed clients over loopback.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import pytest
from coord_support import (
    ADMIN,
    SECRET_HEX,
    Agent,
    heartbeat_msg,
    make_settings,
    response_signature,
)
from fakes_provider import FakeProvider
from fault_support import CoordinatorProcess, admin_call, process_env, wait_until

from coordinator import relay
from coordinator.auth import AgentAuth, AgentRecord
from coordinator.front import Front, front_app
from coordinator.server import RunningServer, start_server
from coordinator.settings import Settings
from protocol.codec import decode
from protocol.messages import Heartbeat


class Fronted:
    def __init__(self, server: RunningServer, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session

    @property
    def pool(self) -> Any:
        assert self.server.fronts is not None
        return self.server.fronts.pool

    async def admin(self, method: str, path: str, payload: Any = None,
                    headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = orjson.dumps(payload) if payload is not None else None
        async with self.session.request(method, path, data=data,
                                        headers=ADMIN if headers is None else headers) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def issue(self, label: str) -> Agent:
        status, data = await self.admin("POST", "/api/agents", {"label": label})
        assert status == 200, data
        return Agent(self.session, data["agent_id"], time.time)  # type: ignore[arg-type]


@pytest.fixture
async def fronted(tmp_path: Path) -> AsyncIterator[Fronted]:
    server = await start_server(make_settings(tmp_path, port=0, fronts=2), FakeProvider())
    pids = list(server.fronts.pool.pids) if server.fronts else []
    try:
        assert len(pids) == 2
        # Timestamps at or before the start second are refused (restart replay protection).
        await asyncio.sleep(int(time.time()) + 1.05 - time.time())
        async with aiohttp.ClientSession(base_url=server.url) as session:
            yield Fronted(server, session)
    finally:
        await server.stop()
    for pid in pids:
        assert not _alive(pid), f"front {pid} outlived the coordinator"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose; the pool waited for every child it started.
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _signed_by(agent: Agent, status: int, raw: bytes, nonce: str, resp: Any) -> bool:
    return resp.headers.get("X-VM-Signature") == response_signature(agent.key, nonce, status,
                                                                     raw)


async def test_heartbeats_through_fronts_are_verified_written_and_signed(
    fronted: Fronted,
) -> None:
    agent = await fronted.issue("rig-1")
    status, body = await agent.hello()
    assert status == 200, body
    store = fronted.server.store
    # A phase change (booting -> warming: decoded again by the writer), then steady ones.
    for phase in ("warming", "warming", "proving", "proving"):
        agent.seq += 1
        payload = heartbeat_msg(agent.seq, phase, telemetry=True)
        status, data, (resp, raw, nonce) = await agent.post_raw(
            "/v1/heartbeat", orjson.dumps(payload))
        assert status == 200, data
        assert data["action"] in ("continue", "benchmark")
        assert _signed_by(agent, status, raw, nonce, resp)
        assert resp.headers["X-VM-Server-Time"].isdigit()
    inst = store.instance_by_agent(agent.agent_id)
    assert inst is not None
    # The writer's cache holds steady heartbeats until the commit: read after it.
    await store.write(lambda tx: None)
    inst = store.instance_by_agent(agent.agent_id)
    assert inst is not None
    assert (inst["state"], inst["last_seq"]) == ("proving", 4)
    telemetry = store.latest_telemetry(inst["id"])
    assert telemetry is not None
    # What one process stores: the decoded telemetry, defaults filled in.
    sent = decode(Heartbeat, orjson.dumps(payload)).telemetry
    assert telemetry["telemetry_json"] == orjson.dumps(sent).decode()
    status, events = await fronted.admin("GET", "/api/events")
    assert status == 200
    assert any(e["kind"] == "phase" and "warming -> proving" in e["reason"] for e in events)


async def test_a_replay_on_a_new_connection_is_409_and_writes_nothing(
    fronted: Fronted,
) -> None:
    agent = await fronted.issue("rig-2")
    await agent.hello()
    body = orjson.dumps(heartbeat_msg(1, "warming"))
    headers = agent.headers("/v1/heartbeat", body)
    async with fronted.session.post("/v1/heartbeat", data=body, headers=headers) as resp:
        assert resp.status == 200
    # Fresh sessions: new connections, spread by the kernel over both fronts; the
    # nonce memory is in one place, so every one of them is a replay.
    for _ in range(4):
        async with aiohttp.ClientSession(base_url=fronted.server.url) as other, \
                other.post("/v1/heartbeat", data=body, headers=headers) as resp:
            raw = await resp.read()
            assert resp.status == 409, raw
            assert orjson.loads(raw)["error"] == "replayed_nonce"
            assert _signed_by(agent, 409, raw, headers["X-VM-Nonce"], resp)


async def test_an_invalid_body_is_400_signed_and_its_nonce_is_spent(fronted: Fronted) -> None:
    agent = await fronted.issue("rig-3")
    await agent.hello()
    body = orjson.dumps({**heartbeat_msg(1, "warming"), "seq": "one"})
    headers = agent.headers("/v1/heartbeat", body)
    async with fronted.session.post("/v1/heartbeat", data=body, headers=headers) as resp:
        raw = await resp.read()
        assert resp.status == 400
        assert orjson.loads(raw)["field"] == "seq"
        assert _signed_by(agent, 400, raw, headers["X-VM-Nonce"], resp)
    async with fronted.session.post("/v1/heartbeat", data=body, headers=headers) as resp:
        assert resp.status == 409  # checked before the body, as in one process
    inst = fronted.server.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["last_seq"] in (None, -1)


async def test_unknown_agents_and_bad_signatures_are_refused_at_the_front(
    fronted: Fronted,
) -> None:
    agent = await fronted.issue("rig-4")
    body = orjson.dumps(heartbeat_msg(1, "warming"))
    headers = agent.headers("/v1/heartbeat", body)
    headers["X-VM-Signature"] = "v1=" + "0" * 64
    async with fronted.session.post("/v1/heartbeat", data=body, headers=headers) as resp:
        assert resp.status == 401
        assert orjson.loads(await resp.read())["error"] == "bad_signature"
        assert "X-VM-Signature" not in resp.headers
    stranger = Agent(fronted.session, "ag_" + "ab" * 10, time.time)  # type: ignore[arg-type]
    status, data = await stranger.post("/v1/heartbeat", heartbeat_msg(1, "warming"))
    assert (status, data["error"]) == (401, "unknown_agent")
    async with fronted.session.post("/v1/heartbeat", data=b"x" * (1024 * 1024 + 1),
                                    headers=agent.headers("/v1/heartbeat", b"")) as resp:
        assert resp.status == 413


async def test_a_revoked_agent_is_refused_though_a_front_knows_its_key(
    fronted: Fronted,
) -> None:
    agent = await fronted.issue("rig-5")
    await agent.hello()
    for _ in range(3):  # every front that answers has the key cached by now
        assert (await agent.heartbeat("warming"))[0] == 200
    status, _ = await fronted.admin("POST", f"/api/agents/{agent.agent_id}/revoke")
    assert status == 200
    for _ in range(3):
        status, data = await agent.heartbeat("warming")
        assert (status, data["error"]) == (401, "unknown_agent")


async def test_operator_api_and_dashboard_answer_through_the_fronts(fronted: Fronted) -> None:
    status, data = await fronted.admin("GET", "/api/instances")
    assert (status, data) == (200, [])
    status, data = await fronted.admin("GET", "/api/instances", headers={})
    assert (status, data["error"]) == (401, "unauthorized")
    async with fronted.session.get("/") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/html")
    status, data = await fronted.admin("GET", "/no/such/path")
    assert (status, data["error"]) == (404, "not_found")
    async with fronted.session.get("/v1/heartbeat") as resp:
        assert resp.status == 405
        assert resp.headers["X-VM-Server-Time"].isdigit()


async def test_a_killed_front_is_replaced_and_the_fleet_is_still_answered(
    fronted: Fronted,
) -> None:
    agent = await fronted.issue("rig-6")
    await agent.hello()
    victim = fronted.pool.pids[0]
    os.kill(victim, signal.SIGKILL)
    fronts = fronted.server.fronts
    assert fronts is not None
    deadline = time.monotonic() + 30
    while not (fronted.pool.restarts == 1 and len(fronts.relay.links) == 2
               and len(fronted.pool.pids) == 2):
        assert time.monotonic() < deadline, "the killed front was not replaced"
        await asyncio.sleep(0.05)
    assert victim not in fronted.pool.pids
    for _ in range(6):
        assert (await agent.heartbeat("warming"))[0] == 200


def test_fronts_setting_is_bounded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="VM_FRONTS must be between 0 and 16"):
        make_settings(tmp_path, fronts=17)
    env = {"VM_FLEET_SECRET": "11" * 32, "VM_ADMIN_TOKEN": "fronts-token-0123", "VM_FRONTS": "2",
           "VM_CONFIG_DIR": str(tmp_path)}
    assert Settings.from_env(env).fronts == 2


# --- the relay's frames ---------------------------------------------------------------


def test_frames_survive_any_split_of_the_byte_stream() -> None:
    frames = [(["hb", 1, "ag", "n", 5, 1.5, None], [b"{}", b"", b"\x00" * 70000]),
              ([7, 200, True], [b'{"action":"continue"}']),
              (["admit", 2], [])]
    stream = b"".join(relay.pack(h, b) for h, b in frames)
    for step in (1, 3, 4096, len(stream)):
        buf = relay.FrameBuffer()
        got: list[relay.Frame] = []
        for at in range(0, len(stream), step):
            got += buf.feed(stream[at:at + step])
        assert got == [(h, b) for h, b in frames]


def test_a_frame_over_the_limit_or_malformed_is_refused() -> None:
    with pytest.raises(relay.FrameError, match="over"):
        relay.FrameBuffer().feed((relay.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    good = relay.pack([1], [b"abc"])
    bad = good[:4] + good[4:6] + (99).to_bytes(4, "big") + good[10:]
    with pytest.raises(relay.FrameError):
        relay.FrameBuffer().feed(bad)
    with pytest.raises(relay.FrameError):
        relay.unpack(relay.pack({"not": "a list"}, [])[4:])  # type: ignore[arg-type]


async def test_a_failing_frame_is_answered_500_and_the_link_goes_on(tmp_path: Path) -> None:
    def handler(header: list[Any], blobs: list[bytes], reply: Any) -> None:
        if header[2] == "boom":
            raise RuntimeError("a bug")
        reply([header[1], 200, False], [blobs[0]])

    server = relay.RelayServer(handler)
    path = str(tmp_path / "r.sock")
    await server.start(path)
    link = await relay.connect(path)
    try:
        header, blobs = await link.call("x", ["boom"], [b"1"])
        assert header[1:] == [500, False]
        assert orjson.loads(blobs[0])["error"] == "internal_error"
        header, blobs = await link.call("x", ["fine"], [b"2"])
        assert (header[1:], blobs) == ([200, False], [b"2"])
    finally:
        await server.close()
    await asyncio.wait_for(link.closed, 5)
    with pytest.raises(ConnectionError):
        await link.call("x", ["late"], [b"3"])


# --- a front on its own, over a link that misbehaves -----------------------------------


class _Link:
    def __init__(self, outcome: BaseException) -> None:
        self.outcome = outcome

    async def call(self, kind: str, fields: list[Any], blobs: Any = ()) -> relay.Frame:
        raise self.outcome


@pytest.mark.parametrize(("outcome", "status", "code", "signed"), [
    (ConnectionError("gone"), 503, "unavailable", False),
    (RuntimeError("a bug"), 500, "internal_error", True),
])
async def test_a_front_answers_when_the_writer_is_gone_or_a_bug_hits(
    aiohttp_client: Any, outcome: BaseException, status: int, code: str, signed: bool,
) -> None:
    agent_id = "ag_" + "cd" * 10
    auth = AgentAuth([bytes.fromhex(SECRET_HEX)], lambda a: AgentRecord(a, False), not_before=0)
    front = Front(auth, _Link(outcome), None)  # type: ignore[arg-type]
    client = await aiohttp_client(front_app(front))
    agent = Agent(client, agent_id, time.time)
    got, data, (resp, raw, nonce) = await agent.post_raw(
        "/v1/heartbeat", orjson.dumps(heartbeat_msg(1, "warming")))
    assert (got, data["error"]) == (status, code)
    assert _signed_by(agent, got, raw, nonce, resp) is signed
    # The front goes on answering.
    assert (await agent.post_raw("/v1/heartbeat", b"{}"))[0] == status


def _gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_fronts_exit_when_the_coordinator_is_sigkilled(tmp_path: Path) -> None:
    """Nothing is left holding the port: a restart on it serves again at once."""
    coord = CoordinatorProcess(tmp_path, process_env(tmp_path, VM_FRONTS="2"))
    try:
        coord.start()
        assert coord.proc is not None
        fronts = psutil.Process(coord.proc.pid).children()
        assert len(fronts) == 2
        coord.kill(signal.SIGKILL)
        wait_until(lambda: all(_gone(p) for p in fronts), "the fronts to exit", 15)
        coord.start()
        assert admin_call(coord.url, "GET", "/api/instances") == []
    finally:
        coord.kill(signal.SIGTERM)
