"""The agents' own path (``agent_api.serve_agents_first``): a running coordinator answers an
agent's POST before the application's router, middleware and response signal, and that
answer is the one the application's route gives, header for header."""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from vast_manager.coordinator.web.core import CORE
from vast_manager.coordinator.web.server import RunningServer, start_server

from support.coord_support import (
    ADMIN,
    agent_key,
    heartbeat_msg,
    hello_msg,
    make_settings,
    response_signature,
    sign,
)
from support.fakes_provider import FakeProvider

# Headers whose values differ between any two answers.
_PER_ANSWER = {"Date", "X-VM-Signature", "X-VM-Server-Time", "Content-Length"}


class _Agent:
    def __init__(self, session: aiohttp.ClientSession, url: str, agent_id: str) -> None:
        self.session, self.url, self.agent_id = session, url, agent_id
        self.key = agent_key(agent_id)

    async def post(self, path_qs: str, payload: Any) -> tuple[int, dict[str, str], Any]:
        """Signed over ``path_qs`` exactly as sent; the answer's signature is checked."""
        body = orjson.dumps(payload)
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        headers = {"X-VM-Agent": self.agent_id, "X-VM-Timestamp": ts, "X-VM-Nonce": nonce,
                   "X-VM-Signature": sign(self.key, ts, nonce, "POST", path_qs, body),
                   "Content-Type": "application/json"}
        async with self.session.post(self.url + path_qs, data=body, headers=headers) as resp:
            raw = await resp.read()
            assert resp.headers["X-VM-Signature"] == response_signature(
                self.key, nonce, resp.status, raw)
            return resp.status, dict(resp.headers), orjson.loads(raw)


async def _issued(tmp_path: Path) -> tuple[RunningServer, aiohttp.ClientSession, _Agent]:
    server = await start_server(make_settings(tmp_path, port=0), FakeProvider())
    session = aiohttp.ClientSession()
    async with session.post(server.url + "/api/agents", headers=ADMIN,
                            data=orjson.dumps({"label": "rig"})) as resp:
        assert resp.status == 200
        agent_id = (await resp.json())["agent_id"]
    # Timestamps at or before the second the coordinator started are refused.
    await asyncio.sleep(int(time.time()) + 1.05 - time.time())
    return server, session, _Agent(session, server.url, agent_id)


def _steady(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer less its pace, which carries a random jitter."""
    return {k: v for k, v in answer.items() if k != "next_heartbeat_s"}


def _names(headers: dict[str, str]) -> set[str]:
    return set(headers) - _PER_ANSWER


async def test_an_agents_answer_is_the_applications_header_for_header(tmp_path: Path) -> None:
    server, session, agent = await _issued(tmp_path)
    try:
        assert (await agent.post("/v1/hello", hello_msg()))[0] == 200
        # A query string keeps a request off the agents' own path: the application's
        # route answers it (the signature covers the path and query as sent).
        first = await agent.post("/v1/heartbeat", heartbeat_msg(1, "booting"))
        through_app = await agent.post("/v1/heartbeat?via=app", heartbeat_msg(2, "booting"))
        assert first[0] == through_app[0] == 200
        assert _steady(first[2]) == _steady(through_app[2])
        assert _names(first[1]) == _names(through_app[1])
        for answer in (first, through_app):
            headers = answer[1]
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert headers["Referrer-Policy"] == "no-referrer"
            assert "Content-Security-Policy" not in headers
            assert abs(int(headers["X-VM-Server-Time"]) - time.time()) < 60
        # A late heartbeat (an earlier seq): answered, moving nothing, the same either way.
        late = heartbeat_msg(1, "booting")
        late_first, late_app = (await agent.post("/v1/heartbeat", late),
                                await agent.post("/v1/heartbeat?via=app", late))
        assert late_first[0] == late_app[0] == 200
        assert _steady(late_first[2]) == _steady(late_app[2])
        assert _names(late_first[1]) == _names(late_app[1])
    finally:
        await session.close()
        await server.stop()


async def test_a_failure_inside_the_agents_path_is_answered_as_the_application_would(
    tmp_path: Path,
) -> None:
    server, session, agent = await _issued(tmp_path)
    auth = server.app[CORE].auth

    def broken(headers: Any) -> str:
        raise RuntimeError("a bug")

    auth.screen = broken  # type: ignore[method-assign]
    try:
        answers = []
        for path in ("/v1/heartbeat", "/v1/heartbeat?via=app"):
            async with session.post(server.url + path, data=b"{}",
                                    headers={"X-VM-Agent": agent.agent_id}) as resp:
                answers.append((resp.status, dict(resp.headers), await resp.json()))
        for status, headers, body in answers:
            assert status == 500
            assert body["error"] == "internal_error"
            assert headers["X-Content-Type-Options"] == "nosniff"
            assert "X-VM-Server-Time" in headers
        assert _names(answers[0][1]) == _names(answers[1][1])
    finally:
        await session.close()
        await server.stop()


async def test_other_methods_and_paths_still_meet_the_application(tmp_path: Path) -> None:
    server, session, _agent = await _issued(tmp_path)
    try:
        async with session.get(server.url + "/v1/heartbeat") as resp:
            assert resp.status == 405
            assert (await resp.json())["error"] == "method_not_allowed"
            assert "POST" in resp.headers["Allow"]
            assert "X-VM-Server-Time" in resp.headers
        async with session.post(server.url + "/v1/nothing", data=b"{}") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"] == "not_found"
        # Expect: 100-continue is the application route's to answer before the body.
        async with session.post(server.url + "/v1/heartbeat", data=b"{}",
                                headers={"Expect": "100-continue"}) as resp:
            assert resp.status == 401
            assert (await resp.json())["error"] == "unknown_agent"
    finally:
        await session.close()
        await server.stop()


async def test_an_agents_plain_post_never_reaches_the_application(
    tmp_path: Path, monkeypatch: Any,
) -> None:
    """The path is taken: the application's request handler sees the POST with a query
    string, never the plain one (which the answers above cannot tell apart)."""
    seen: list[str] = []
    handle = aiohttp.web.Application._handle

    async def counted(self: aiohttp.web.Application, request: Any) -> Any:
        seen.append(request.raw_path)
        return await handle(self, request)

    monkeypatch.setattr(aiohttp.web.Application, "_handle", counted)
    server, session, agent = await _issued(tmp_path)
    try:
        seen.clear()
        assert (await agent.post("/v1/hello", hello_msg()))[0] == 200
        assert (await agent.post("/v1/heartbeat", heartbeat_msg(1, "booting")))[0] == 200
        assert seen == []
        assert (await agent.post("/v1/heartbeat?via=app", heartbeat_msg(2, "booting")))[0] \
            == 200
        assert seen == ["/v1/heartbeat?via=app"]
    finally:
        await session.close()
        await server.stop()
