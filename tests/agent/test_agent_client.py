"""The agent's signed client: fresh signatures, verified answers only, backoff, clock offset."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from vast_manager.agent.coordinator_client import (
    Backoff,
    CoordinatorClient,
    PermanentFailure,
    TransientFailure,
)
from vast_manager.coordinator.web.auth import AgentAuth, AgentRecord, AuthFailure
from vast_manager.protocol import Heartbeat
from vast_manager.protocol.signing import (
    HEADER_NONCE,
    HEADER_SERVER_TIME,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    derive_agent_key,
    sign_response,
)

FLEET_SECRET = bytes(range(32))
AGENT_ID = "ag_" + "1" * 20
KEY = derive_agent_key(FLEET_SECRET, AGENT_ID)
OTHER_KEY = derive_agent_key(bytes(range(1, 33)), AGENT_ID)

Behaviour = Callable[[web.Request, bytes], web.Response]


def directive(action: str = "continue") -> bytes:
    return orjson.dumps(
        {"action": action, "reason": "test", "next_heartbeat_s": 5, "min_rate_per_hour": None}
    )


def signed(request: web.Request, status: int, body: bytes, key: bytes = KEY) -> web.Response:
    nonce = request.headers[HEADER_NONCE]
    return web.Response(
        status=status,
        body=body,
        content_type="application/json",
        headers={
            HEADER_SIGNATURE: sign_response(key, nonce, status, body),
            HEADER_SERVER_TIME: str(int(time.time())),
        },
    )


def unsigned(status: int, body: bytes) -> Behaviour:
    def answer(request: web.Request, _body: bytes) -> web.Response:
        return web.Response(
            status=status,
            body=body,
            content_type="application/json",
            headers={HEADER_SERVER_TIME: str(int(time.time()))},
        )

    return answer


def ok(action: str = "continue", key: bytes = KEY) -> Behaviour:
    return lambda request, _body: signed(request, 200, directive(action), key)


def error(status: int, code: str) -> Behaviour:
    body = orjson.dumps({"error": code, "message": "test"})
    return lambda request, _body: signed(request, status, body)


class FakeCoordinator:
    """Answers in turn with the behaviours given (the misbehaviours a client must survive,
    which the real coordinator never sends); checks every request's signature with the
    coordinator's own verifier."""

    def __init__(self, *behaviours: Behaviour, check_time: bool = False) -> None:
        self.behaviours = list(behaviours)
        self.check_time = check_time
        self.requests: list[dict[str, Any]] = []
        self.auth = AgentAuth([FLEET_SECRET], lambda agent_id: AgentRecord(agent_id, False),
                              not_before=0)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        h = request.headers
        try:
            self.auth.authenticate(method=request.method, path_qs=request.path_qs,
                                   headers=h, body=body)
            good = True
        except AuthFailure:
            good = False
        self.requests.append(
            {"nonce": h[HEADER_NONCE], "ts": int(h[HEADER_TIMESTAMP]), "good": good}
        )
        assert good, "the client signed a request wrongly"
        if self.check_time and abs(time.time() - int(h[HEADER_TIMESTAMP])) > 300:
            # Before the nonce is remembered: like the coordinator, unsigned is allowed.
            return unsigned(401, orjson.dumps({"error": "stale_timestamp", "message": "clock"}))(
                request, body
            )
        behaviour = self.behaviours.pop(0) if len(self.behaviours) > 1 else self.behaviours[0]
        return behaviour(request, body)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/{name}", self.handle)
        return app


class FakeTime:
    """A monotonic clock that only moves when the client sleeps: no real waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def heartbeat() -> Heartbeat:
    return Heartbeat(
        seq=1,
        phase="booting",
        phase_started_at=1.0,
        progress=None,
        proofs_completed_total=0,
        proof_seconds_recent=[],
        telemetry=None,
    )


async def make_client(
    aiohttp_server: Any, coord: FakeCoordinator, fake: FakeTime, **kwargs: Any
) -> CoordinatorClient:
    server = await aiohttp_server(coord.app())
    kwargs.setdefault("backoff", Backoff(base_s=1.0, cap_s=8.0))
    return CoordinatorClient(
        str(server.make_url("")),
        AGENT_ID,
        KEY,
        monotonic=fake.monotonic,
        sleep=fake.sleep,
        rng=random.Random(7),
        **kwargs,
    )


async def test_retries_5xx_with_capped_jittered_backoff_and_fresh_signatures(
    aiohttp_server: Any,
) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(*[unsigned(503, b"{}")] * 7, error(500, "internal"), ok())
    client = await make_client(aiohttp_server, coord, fake)
    try:
        d = await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert d.action == "continue"
    assert len(coord.requests) == 9
    # Every try signed afresh: a new nonce each time.
    assert len({r["nonce"] for r in coord.requests}) == 9
    # Exponential ceilings 1, 2, 4, 8, 8, ... each waited in [ceiling/2, ceiling].
    ceilings = [min(8.0, 2.0**i) for i in range(8)]
    assert len(fake.sleeps) == 8
    for waited, ceiling in zip(fake.sleeps, ceilings, strict=True):
        assert ceiling / 2 <= waited <= ceiling
    assert max(fake.sleeps) <= 8.0
    # Jittered: the capped tries do not all wait the same.
    assert len({round(s, 6) for s in fake.sleeps[3:]}) > 1
    assert client.consecutive_failures == 0


def test_backoff_jitter_differs_between_agents() -> None:
    a = [Backoff(base_s=1.0, cap_s=60.0, rng=random.Random(1).random).after(5)]
    c = [Backoff(base_s=1.0, cap_s=60.0, rng=random.Random(2).random).after(5)]
    assert a != c
    assert all(8.0 <= x <= 16.0 for x in a + c)
    assert Backoff(base_s=1.0, cap_s=60.0).after(50) <= 60.0


async def test_unsigned_and_badly_signed_answers_are_never_acted_on(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(
        unsigned(200, directive("terminate")),  # no signature at all
        ok("terminate", key=OTHER_KEY),  # signed with another key
        ok("continue"),
    )
    client = await make_client(aiohttp_server, coord, fake)
    try:
        d = await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert d.action == "continue"
    assert len(coord.requests) == 3
    assert len(fake.sleeps) == 2  # both bad answers were transient failures


async def test_last_verified_at_only_moves_on_a_verified_answer(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(unsigned(200, directive()), ok())
    client = await make_client(aiohttp_server, coord, fake)
    try:
        assert client.last_verified_at is None
        with pytest.raises(TransientFailure):
            await client.heartbeat(heartbeat(), give_up_after_s=0.1)
        assert client.last_verified_at is None
        await client.heartbeat(heartbeat())
        assert client.last_verified_at == fake.now
    finally:
        await client.close()


async def test_connection_errors_give_up_at_the_deadline_without_spinning() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    fake = FakeTime()
    client = CoordinatorClient(
        f"http://127.0.0.1:{port}",
        AGENT_ID,
        KEY,
        monotonic=fake.monotonic,
        sleep=fake.sleep,
        backoff=Backoff(base_s=1.0, cap_s=4.0),
        request_timeout_s=2,
    )
    try:
        with pytest.raises(TransientFailure):
            await client.heartbeat(heartbeat(), give_up_after_s=30.0)
        # It waited out the whole window in growing steps, then gave up.
        assert sum(fake.sleeps) == pytest.approx(30.0)
        assert all(s <= 4.0 for s in fake.sleeps)
        attempts = client.consecutive_failures
        # The next call keeps the backoff instead of retrying at once.
        before = len(fake.sleeps)
        with pytest.raises(TransientFailure):
            await client.heartbeat(heartbeat(), give_up_after_s=0.0)
        assert len(fake.sleeps) == before + 1 and client.consecutive_failures == attempts
    finally:
        await client.close()


async def test_clock_ten_minutes_off_corrects_itself(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(ok(), check_time=True)
    client = await make_client(aiohttp_server, coord, fake, clock=lambda: time.time() - 600)
    try:
        d = await client.heartbeat(heartbeat())
        assert d.action == "continue"
        assert client.clock_offset_s == pytest.approx(600, abs=2)
        # The first try was stale, the retry went out with the corrected time.
        assert abs(coord.requests[0]["ts"] - time.time()) > 500
        assert abs(coord.requests[-1]["ts"] - time.time()) <= 2
        # And it carries on: the next request is right first time.
        n = len(coord.requests)
        await client.heartbeat(heartbeat())
        assert len(coord.requests) == n + 1
    finally:
        await client.close()


async def test_signed_stale_timestamp_answer_also_corrects(aiohttp_server: Any) -> None:
    def stale_signed(request: web.Request, body: bytes) -> web.Response:
        resp = error(401, "stale_timestamp")(request, body)
        resp.headers[HEADER_SERVER_TIME] = str(int(time.time()) + 900)
        return resp

    fake = FakeTime()
    coord = FakeCoordinator(stale_signed, ok())
    client = await make_client(aiohttp_server, coord, fake)
    try:
        await client.heartbeat(heartbeat())
    finally:
        await client.close()
    # The retry went out on the coordinator's time (whose next answer then says real time).
    assert coord.requests[1]["ts"] - time.time() == pytest.approx(900, abs=2)
    assert fake.sleeps == []  # corrected and retried at once
    assert len(coord.requests) == 2


async def test_unverified_server_time_is_ignored_except_on_401(aiohttp_server: Any) -> None:
    def liar(request: web.Request, body: bytes) -> web.Response:
        return web.Response(status=502, headers={HEADER_SERVER_TIME: "1"})

    fake = FakeTime()
    coord = FakeCoordinator(liar, ok())
    client = await make_client(aiohttp_server, coord, fake)
    try:
        await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert client.clock_offset_s == pytest.approx(0, abs=2)


async def test_permanent_400_is_not_retried(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(error(400, "invalid_field"))
    client = await make_client(aiohttp_server, coord, fake)
    try:
        with pytest.raises(PermanentFailure) as info:
            await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert info.value.status == 400 and info.value.code == "invalid_field"
    assert len(coord.requests) == 1 and fake.sleeps == []
    assert client.last_verified_at is not None  # the coordinator is alive


async def test_replayed_nonce_and_429_are_retried(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(error(409, "replayed_nonce"), error(429, "too_many_requests"), ok())
    client = await make_client(aiohttp_server, coord, fake)
    try:
        d = await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert d.action == "continue" and len(coord.requests) == 3 and len(fake.sleeps) == 2


async def test_signed_but_undecodable_answer_is_permanent(aiohttp_server: Any) -> None:
    fake = FakeTime()
    coord = FakeCoordinator(lambda r, b: signed(r, 200, b'{"action": "explode"}'))
    client = await make_client(aiohttp_server, coord, fake)
    try:
        with pytest.raises(PermanentFailure) as info:
            await client.heartbeat(heartbeat())
    finally:
        await client.close()
    assert info.value.code == "bad_answer"
