"""10,000 requests with bad signatures against a coordinator in its
own process. Its resident memory grows by less than ``RSS_BOUND_BYTES`` over the flood
(measured after a warm-up, so the allocator's first arenas are not counted), it answers
every one with a ``401`` error body, writes nothing, and a good agent's signed heartbeat,
sent between every batch, is answered ``200`` within a second throughout."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from support.coord_support import OLD_SECRET_HEX, agent_key, heartbeat_msg, hello_msg
from support.fault_support import (
    TEST_MARKER_ENV,
    CoordinatorProcess,
    admin_call,
    count_all_rows,
    http,
    kill_marked,
    process_env,
    signed_headers,
)

FLOOD = 10_000
WARMUP = 1_000
BATCH = 250
CONCURRENCY = 32
RSS_BOUND_BYTES = 8 * 1024 * 1024
GOOD_ANSWER_WITHIN_S = 1.0


def bad_request(rng: random.Random, agent_id: str, key: bytes) -> tuple[str, bytes, dict[str, str]]:
    path = rng.choice(["/v1/heartbeat", "/v1/result", "/v1/logs", "/v1/hello"])
    body = rng.randbytes(rng.choice([0, 64, 512, 2048]))
    kind = rng.randrange(4)
    if kind == 0:  # a known agent, a made-up signature
        headers = signed_headers(agent_id, key, "POST", path, body)
        headers["X-VM-Signature"] = "v1=" + rng.randbytes(32).hex()
    elif kind == 1:  # a made-up agent id each time (never cached)
        headers = signed_headers("ag_" + rng.randbytes(10).hex(), key, "POST", path, body)
    elif kind == 2:  # a known agent, signed with a key of another fleet secret
        headers = signed_headers(agent_id, agent_key(agent_id, OLD_SECRET_HEX), "POST", path,
                                 body)
    else:  # malformed signing headers
        headers = {"X-VM-Agent": agent_id, "X-VM-Timestamp": "soon",
                   "X-VM-Nonce": rng.randbytes(40).hex(), "X-VM-Signature": "v2=" + "0" * 64}
    return path, body, headers


async def flood(url: str, agent_id: str, key: bytes, count: int, rng: random.Random,
                good: list[float], seq: list[int]) -> int:
    """``count`` bad requests, ``CONCURRENCY`` at a time; a good heartbeat after each batch."""
    answered = 0
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(path: str, body: bytes, headers: dict[str, str]) -> None:
            nonlocal answered
            async with session.post(url + path, data=body, headers=headers) as resp:
                data = orjson.loads(await resp.read())
                assert resp.status == 401, (resp.status, data)
                assert data["error"] in ("bad_signature", "unknown_agent"), data
                assert "X-VM-Signature" not in resp.headers  # unverified: never signed
                answered += 1

        for start in range(0, count, BATCH):
            batch = [bad_request(rng, agent_id, key) for _ in range(min(BATCH, count - start))]
            await asyncio.gather(*(one(*b) for b in batch))
            seq[0] += 1
            body = orjson.dumps(heartbeat_msg(seq[0], "proving"))
            t0 = time.monotonic()
            async with session.post(url + "/v1/heartbeat", data=body,
                                    headers=signed_headers(agent_id, key, "POST",
                                                           "/v1/heartbeat", body)) as resp:
                assert resp.status == 200, await resp.read()
            good.append(time.monotonic() - t0)
    return answered


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bad_signature_flood_keeps_memory_flat_and_good_agents_served(tmp_path: Path) -> None:
    env = process_env(tmp_path)
    coord = CoordinatorProcess(tmp_path, env, provider="local")
    try:
        coord.start()
        issued = admin_call(coord.url, "POST", "/api/agents", {"label": "flood-rig"})
        agent_id, key = issued["agent_id"], bytes.fromhex(issued["agent_key"])
        body = orjson.dumps(hello_msg())
        good: list[float] = []
        seq = [0]
        rng = random.Random(20240605)

        status, raw, _ = http(coord.url + "/v1/hello", "POST", body,
                              signed_headers(agent_id, key, "POST", "/v1/hello", body))
        assert status == 200, raw
        first = orjson.dumps(heartbeat_msg(1, "proving"))
        status, raw, _ = http(coord.url + "/v1/heartbeat", "POST", first,
                              signed_headers(agent_id, key, "POST", "/v1/heartbeat", first))
        assert status == 200, raw
        seq[0] = 1

        async def run() -> tuple[int, int, int, list[int]]:
            warm = await flood(coord.url, agent_id, key, WARMUP, rng, good, seq)
            baseline = coord.rss_bytes()
            samples = []
            answered = 0
            for _ in range(FLOOD // 1000):
                answered += await flood(coord.url, agent_id, key, 1000, rng, good, seq)
                samples.append(coord.rss_bytes())
            return warm, answered, baseline, samples

        rows_before = count_all_rows(coord.db_path)
        warm, answered, baseline, samples = asyncio.run(run())
        rows_after = count_all_rows(coord.db_path)
        growth = max(samples) - baseline
        print(f"flood: {answered} bad requests after {warm} warm-up; RSS {baseline / 2**20:.1f} "
              f"MiB -> max {max(samples) / 2**20:.1f} MiB (growth {growth / 2**20:.2f} MiB, "
              f"bound {RSS_BOUND_BYTES / 2**20:.0f} MiB); {len(good)} good heartbeats, "
              f"slowest {max(good) * 1000:.0f} ms")
        assert answered == FLOOD
        assert growth < RSS_BOUND_BYTES
        assert max(good) < GOOD_ANSWER_WITHIN_S
        # Only the good heartbeats wrote (their history is paced, the rest are upserts).
        rows_after.pop("heartbeat_history")
        rows_before.pop("heartbeat_history")
        assert rows_after == rows_before
    finally:
        coord.kill()
        kill_marked(env[TEST_MARKER_ENV])
