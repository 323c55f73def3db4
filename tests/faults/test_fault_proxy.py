"""The loopback fault proxy itself (tests/support/faultproxy.py): each fate does what it says."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from support.faultproxy import FaultProxy, FaultRates


@pytest.fixture
async def upstream(aiohttp_server: Any) -> Any:
    seen: list[bytes] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(body)
        return web.json_response({"n": len(seen), "body": body.decode()})

    app = web.Application()
    app.router.add_post("/echo", echo)
    server = await aiohttp_server(app)
    server.seen = seen
    return server


async def post(url: str, body: bytes) -> tuple[int, Any] | str:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.post(url + "/echo", data=body) as resp,
        ):
            return resp.status, await resp.json()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return type(exc).__name__


async def test_pass_through_untouched(upstream: Any) -> None:
    proxy = await FaultProxy(seed=1).start(upstream.port)
    try:
        for i in range(5):
            assert await post(proxy.url, b"hello %d" % i) == (200, {"n": i + 1,
                                                                   "body": f"hello {i}"})
    finally:
        await proxy.close()
    assert proxy.counts["pass"] == 5 and proxy.counts["requests"] == 5


@pytest.mark.parametrize(
    ("fate", "upstream_sees", "client_ok"),
    [("drop", 0, False), ("reset_request", 0, False), ("reset_response", 1, False),
     ("duplicate", 2, True), ("delay", 1, True)],
)
async def test_each_fate(upstream: Any, fate: str, upstream_sees: int, client_ok: bool) -> None:
    rates = FaultRates(**{fate: 1.0}, max_delay_s=0.05)
    proxy = await FaultProxy(rates, seed=2).start(upstream.port)
    try:
        answer = await post(proxy.url, b'{"x": 1}')
    finally:
        await proxy.close()
    assert proxy.counts[fate] == 1
    assert isinstance(answer, tuple) is client_ok, answer
    # A truncated request never reaches a handler; a whole one is handled (twice if duplicated).
    assert len(upstream.seen) == upstream_sees
    assert all(b == b'{"x": 1}' for b in upstream.seen)


async def test_same_seed_same_fates(upstream: Any) -> None:
    rates = FaultRates(drop=0.2, delay=0.2, duplicate=0.2, max_delay_s=0.01)
    runs = []
    for _ in range(2):
        proxy = await FaultProxy(rates, seed=42).start(upstream.port)
        try:
            outcomes = [await post(proxy.url, b"x") for _ in range(20)]
        finally:
            await proxy.close()
        runs.append(([o if isinstance(o, str) else o[0] for o in outcomes], dict(proxy.counts)))
    assert runs[0] == runs[1]
    assert runs[0][1]["drop"] > 0 and runs[0][1]["duplicate"] > 0


async def test_no_upstream_is_a_closed_connection() -> None:
    proxy = await FaultProxy(seed=3).start()
    try:
        assert isinstance(await post(proxy.url, b"x"), str)
    finally:
        await proxy.close()
    assert proxy.counts["upstream_unreachable"] == 1
