"""Nobody without a key can spend the coordinator's memory (docs/reliability.md,
"Strangers on the open internet"), against ``vast-manager serve`` in its own process.

100 connections each declare a 1 MiB body under a never-issued agent id, with well-formed
signing headers, send all of it but the last byte and hold the connection open. The
coordinator's resident memory must grow by less than ``RSS_BOUND_BYTES`` over the
attack (measured from after a warm-up round, so the allocator's first arenas are not
counted), and a good agent's signed heartbeats, sent all along, must be answered within
a second each. Before the defence the bodies were read whole first: 200 such
connections grew the process by about 200 MB, which stayed; while sockets were read 256
KiB at a time, what came with each head could reach the bound on a loaded machine.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from pathlib import Path

import orjson
import pytest

from support.coord_support import heartbeat_msg, hello_msg
from support.fault_support import (
    TEST_MARKER_ENV,
    CoordinatorProcess,
    admin_call,
    http,
    kill_marked,
    process_env,
    signed_headers,
)

CONNECTIONS = 100
WARMUP_CONNECTIONS = 20
BODY_BYTES = 1024 * 1024
RSS_BOUND_BYTES = 16 * 1024 * 1024
GOOD_ANSWER_WITHIN_S = 1.0


async def hold_strangers(port: int, count: int, hold_s: float) -> int:
    """``count`` connections: head, all of a 1 MiB body but its last byte, then held."""

    async def one() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        stranger = "ag_" + secrets.token_hex(10)
        headers = signed_headers(stranger, secrets.token_bytes(32), "POST", "/v1/result",
                                 b"\0" * BODY_BYTES)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write((f"POST /v1/result HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      f"\r\nContent-Length: {BODY_BYTES}\r\n{head}\r\n").encode())
        writer.write(b"\0" * (BODY_BYTES - 1))
        answered = False
        try:
            await asyncio.wait_for(writer.drain(), hold_s)
            line = await asyncio.wait_for(reader.readline(), hold_s)
            answered = line.startswith(b"HTTP/1.1 401")
            await asyncio.sleep(hold_s)  # held, one byte short
        except (ConnectionError, TimeoutError):
            pass  # the coordinator may close first: that is allowed
        finally:
            writer.close()
        return answered

    results = await asyncio.gather(*(one() for _ in range(count)))
    return sum(results)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_strangers_holding_1_mib_bodies_cost_no_memory(tmp_path: Path) -> None:
    env = process_env(tmp_path)
    coord = CoordinatorProcess(tmp_path, env, provider="local")
    try:
        coord.start()
        issued = admin_call(coord.url, "POST", "/api/agents", {"label": "good-rig"})
        agent_id, key = issued["agent_id"], bytes.fromhex(issued["agent_key"])
        body = orjson.dumps(hello_msg("boot-good"))
        status, raw, _ = http(coord.url + "/v1/hello", "POST", body,
                              signed_headers(agent_id, key, "POST", "/v1/hello", body))
        assert status == 200, raw

        stop = threading.Event()
        latencies: list[float] = []
        failures: list[str] = []
        rss: list[int] = []

        def good_agent() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                hb = orjson.dumps(heartbeat_msg(seq, "proving"))
                t0 = time.monotonic()
                status, raw, _ = http(coord.url + "/v1/heartbeat", "POST", hb,
                                      signed_headers(agent_id, key, "POST", "/v1/heartbeat", hb),
                                      timeout_s=10)
                latencies.append(time.monotonic() - t0)
                if status != 200:
                    failures.append(f"{status} {raw[:200]!r}")
                rss.append(coord.rss_bytes())
                stop.wait(0.1)

        started = coord.rss_bytes()  # shown, not bounded: it counts the warm-up's arenas
        asyncio.run(hold_strangers(coord.port, WARMUP_CONNECTIONS, 0.5))
        baseline = coord.rss_bytes()
        watcher = threading.Thread(target=good_agent, daemon=True)
        watcher.start()
        try:
            answered = asyncio.run(hold_strangers(coord.port, CONNECTIONS, 3.0))
            after = coord.rss_bytes()
        finally:
            stop.set()
            watcher.join(30)
        peak = max([after, *rss])
        growth = peak - baseline
        print(f"{CONNECTIONS} strangers holding 1 MiB bodies: {answered} answered 401 at once; "
              f"RSS {baseline / 2**20:.1f} MiB -> peak {peak / 2**20:.1f} MiB (growth "
              f"{growth / 2**20:.2f} MiB, bound {RSS_BOUND_BYTES / 2**20:.0f} MiB; "
              f"{(peak - started) / 2**20:.2f} MiB since before the warm-up); "
              f"{len(latencies)} good heartbeats, slowest {max(latencies) * 1000:.0f} ms")
        assert failures == []
        assert answered == CONNECTIONS
        assert growth < RSS_BOUND_BYTES
        assert latencies and max(latencies) < GOOD_ANSWER_WITHIN_S
    finally:
        coord.kill()
        kill_marked(env[TEST_MARKER_ENV])
