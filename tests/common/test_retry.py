"""The one retry policy (``vast_manager.common.retry``): the backoff's bounds, the tenacity
loop every caller runs (an injected sleep, so nothing waits), and the downloader resuming
a dropped file where it ended instead of from zero."""

from __future__ import annotations

import hashlib
import logging
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from vast_manager.agent.params import Downloader, ManifestEntry, ParamsError
from vast_manager.common.retry import Backoff, retrying


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def test_each_wait_is_half_fixed_half_random_under_a_doubling_ceiling() -> None:
    backoff = Backoff(base_s=0.5, cap_s=10.0, rng=random.Random(3).random)
    assert backoff.after(0) == 0.0
    for n in range(1, 40):
        ceiling = min(10.0, 0.5 * 2 ** (n - 1))
        assert ceiling / 2 <= backoff.after(n) <= ceiling
    # The same failure count draws differently on two agents: no lockstep at the cap.
    draws = {round(Backoff(cap_s=60.0, rng=random.Random(s).random).after(30), 6)
             for s in range(5)}
    assert len(draws) == 5 and all(30.0 <= d <= 60.0 for d in draws)
    assert Backoff(factor=1.5, cap_s=30.0).after(10**9) <= 30.0  # no overflow in a long outage
    assert Backoff(rng=lambda: 1.0).after(3) == 4.0 and Backoff(rng=lambda: 0.0).after(3) == 2.0


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


async def test_retrying_tries_again_only_what_it_is_told_and_gives_up_with_the_last_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleeps = Sleeps()
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        raise Flaky(f"try {len(calls)}")

    tries = retrying(Backoff(base_s=1.0, cap_s=3.0, rng=lambda: 1.0),
                     retry_on=lambda exc: isinstance(exc, Flaky), attempts=4, sleep=sleeps,
                     log=logging.getLogger("test.retry"), what="the flaky thing")
    with caplog.at_level(logging.WARNING, logger="test.retry"), pytest.raises(Flaky, match="try 4"):
        await tries(flaky)
    assert len(calls) == 4 and sleeps.delays == [1.0, 2.0, 3.0]
    assert "the flaky thing: try 1; retry 1 in 1.0 s" in caplog.text

    calls.clear()

    async def broken() -> str:
        calls.append(1)
        raise Broken("no")

    with pytest.raises(Broken):
        await retrying(Backoff(), retry_on=lambda exc: isinstance(exc, Flaky), attempts=None,
                       sleep=sleeps, log=logging.getLogger("test"), what="x")(broken)
    assert len(calls) == 1 and len(sleeps.delays) == 3  # not retried, never waited

    outcomes = iter([Flaky("once"), Flaky("twice"), None])

    async def third_time() -> str:
        failure = next(outcomes)
        if failure:
            raise failure
        return "done"

    no_limit = retrying(Backoff(), retry_on=lambda exc: isinstance(exc, Flaky), attempts=None,
                        sleep=Sleeps(), log=logging.getLogger("test"), what="x")
    assert await no_limit(third_time) == "done"


DATA = bytes(range(256)) * 2000  # 512,000 bytes


class DroppingServer:
    """Sends half the file, then drops the connection; afterwards honours Range."""

    def __init__(self) -> None:
        self.ranges: list[str | None] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rng = request.headers.get("Range")
        self.ranges.append(rng)
        if len(self.ranges) == 1:
            resp = web.StreamResponse(headers={"Content-Length": str(len(DATA))})
            await resp.prepare(request)
            await resp.write(DATA[: len(DATA) // 2])
            assert request.transport is not None
            request.transport.close()  # mid-body: the client sees a payload error
            return resp
        start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
        return web.Response(status=206 if rng else 200, body=DATA[start:])


async def test_a_dropped_download_resumes_where_it_ended(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    fs = DroppingServer()
    app = web.Application()
    app.router.add_get("/p", fs.handle)
    server = await aiohttp_server(app)
    entry = ManifestEntry("v28-x.params", str(server.make_url("/p")), len(DATA),
                          hashlib.sha256(DATA).hexdigest())
    sleeps = Sleeps()
    async with aiohttp.ClientSession() as session:
        await Downloader(tmp_path, session, sleep=sleeps).fetch([entry])
    assert (tmp_path / entry.name).read_bytes() == DATA
    assert fs.ranges[0] is None and len(fs.ranges) == 2
    # The second try asked only for what the first did not bring, after one backoff wait.
    assert fs.ranges[1] is not None and fs.ranges[1] != "bytes=0-"
    assert int(fs.ranges[1].removeprefix("bytes=").rstrip("-")) > 0
    assert len(sleeps.delays) == 1 and 1.0 <= sleeps.delays[0] <= 2.0


async def test_a_download_that_keeps_failing_names_the_file_after_its_attempts(
    aiohttp_server: Any, tmp_path: Path
) -> None:
    hits: list[int] = []

    async def gone(_request: web.Request) -> web.Response:
        hits.append(1)
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/p", gone)
    server = await aiohttp_server(app)
    entry = ManifestEntry("v28-y.params", str(server.make_url("/p")), 10, "0" * 64)
    sleeps = Sleeps()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(ParamsError, match=r"^v28-y.params: .* answered 503$"):
            await Downloader(tmp_path, session, attempts=3, sleep=sleeps).fetch([entry])
    assert len(hits) == 3 and len(sleeps.delays) == 2
