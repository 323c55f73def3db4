"""Rotation, revocation, isolation, clock skew, forged results.

In-process against the real app (aiohttp's test client, an injected clock), except the
clock-skew test, which runs the agent's real ``CoordinatorClient`` with a clock ten
minutes off against the real app on a real loopback port.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.agent.coordinator_client import Backoff, CoordinatorClient
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app
from vast_manager.protocol import Heartbeat, Hello
from vast_manager.protocol.codec import from_obj

from support.coord_support import (
    ADMIN,
    OLD_SECRET_HEX,
    SECRET_HEX,
    Harness,
    agent_key,
    heartbeat_msg,
    hello_msg,
    make_settings,
    response_signature,
    result_msg,
    start,
)
from support.fakes_provider import FakeProvider

THIRD_SECRET_HEX = "33" * 32


async def hello(h: Harness, label: str) -> Any:
    agent = await h.issue(label)
    status, data = await agent.hello()
    assert status == 200, data
    return agent


# --- rotation -------------------------------------------------------------------------------


async def test_rotation_old_agents_keep_working_new_ones_get_the_new_key(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # Before the rotation: one secret; an agent is issued with a key from it.
    h = await start(aiohttp_client, tmp_path, fleet_secret=OLD_SECRET_HEX)
    _, issued_before = await h.admin("POST", "/api/agents", {"label": "old-rig"})
    old_id = issued_before["agent_id"]
    assert issued_before["agent_key"] == agent_key(old_id, OLD_SECRET_HEX).hex()
    await h.client.close()

    # After: two secrets listed, newest first, on the same database.
    h = await start(aiohttp_client, tmp_path, fleet_secret=f"{SECRET_HEX},{OLD_SECRET_HEX}")
    old = h.agent(old_id, agent_key(old_id, OLD_SECRET_HEX))
    for path, body in (("/v1/hello", hello_msg()), ("/v1/heartbeat", heartbeat_msg(1, "warming")),
                       ("/v1/result", result_msg("r-old"))):
        status, data, (resp, raw, nonce) = await old.post_raw(path, orjson.dumps(body))
        assert status == 200, (path, data)
        # Answered with the key that verified: the agent's own, old one.
        assert resp.headers["X-VM-Signature"] == response_signature(old.key, nonce, 200, raw)
    _, issued_after = await h.admin("POST", "/api/agents", {"label": "new-rig"})
    assert issued_after["agent_key"] == agent_key(issued_after["agent_id"], SECRET_HEX).hex()
    new = h.agent(issued_after["agent_id"])
    assert (await new.hello())[0] == 200
    # A key from a secret that is not listed verifies against nothing.
    stranger = h.agent(old_id, agent_key(old_id, THIRD_SECRET_HEX))
    before = h.store.count_rows()
    status, data = await stranger.post("/v1/heartbeat", heartbeat_msg(2, "warming"))
    assert (status, data["error"]) == (401, "bad_signature")
    assert h.store.count_rows() == before
    await h.client.close()

    # Once the old secret is dropped from the list, its keys stop working.
    h = await start(aiohttp_client, tmp_path, fleet_secret=SECRET_HEX)
    old = h.agent(old_id, agent_key(old_id, OLD_SECRET_HEX))
    status, data = await old.post("/v1/heartbeat", heartbeat_msg(3, "warming"))
    assert (status, data["error"]) == (401, "bad_signature")
    assert (await h.agent(issued_after["agent_id"]).heartbeat("warming"))[0] == 200


# --- revocation -----------------------------------------------------------------------------


async def test_revoked_agent_is_refused_everywhere_and_after_a_restart(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await hello(h, "to-revoke")
    status, data = await h.admin("POST", f"/api/agents/{agent.agent_id}/revoke")
    assert status == 200 and data["revoked"] is True
    before = h.store.count_rows()
    for path, body in (("/v1/hello", hello_msg("boot-2")),
                       ("/v1/heartbeat", heartbeat_msg(5, "proving")),
                       ("/v1/result", result_msg("r-after-revoke")),
                       ("/v1/logs", {"lines": [{"ts": 1.0, "source": "agent", "text": "x"}]})):
        status, data = await agent.post(path, body)
        assert (status, data["error"]) == (401, "unknown_agent"), path
    assert h.store.count_rows() == before
    # Revoking twice is fine; an unknown id is 404.
    assert (await h.admin("POST", f"/api/agents/{agent.agent_id}/revoke"))[0] == 200
    assert (await h.admin("POST", "/api/agents/ag_00000000000000000000/revoke"))[0] == 404
    await h.client.close()
    # The revocation is in the database: a restarted coordinator refuses it too.
    h = await start(aiohttp_client, tmp_path)
    status, data = await h.agent(agent.agent_id).post("/v1/heartbeat", heartbeat_msg(6, "proving"))
    assert (status, data["error"]) == (401, "unknown_agent")


# --- isolation ------------------------------------------------------------------------------


async def test_an_agent_key_cannot_call_the_operator_api(aiohttp_client: Any,
                                                        tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await hello(h, "rig")
    before = h.store.count_rows()
    for method, path in (("GET", "/api/instances"), ("POST", "/api/agents"),
                         ("POST", "/api/deploy"), ("GET", "/metrics")):
        for headers in ({"Authorization": f"Bearer {agent.key.hex()}"},
                        agent.headers(path, b"{}")):
            resp = await h.client.request(method, path, data=b"{}", headers=headers)
            assert resp.status == 401, (method, path)
            assert (await resp.json())["error"] == "unauthorized"
    assert h.store.count_rows() == before


async def test_an_agent_cannot_write_read_or_decide_for_another(aiohttp_client: Any,
                                                                tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    a = await hello(h, "rig-a")
    b = await hello(h, "rig-b")
    before = h.store.count_rows()
    # Speaking as B with A's key: refused, nothing written.
    impostor = h.agent(b.agent_id, a.key)
    for path, body in (("/v1/heartbeat", heartbeat_msg(9, "terminating")),
                       ("/v1/result", result_msg("r-b")),
                       ("/v1/logs", {"lines": [{"ts": 1.0, "source": "agent", "text": "x"}]})):
        status, data = await impostor.post(path, body)
        assert (status, data["error"]) == (401, "bad_signature"), path
    assert h.store.count_rows() == before
    # No agent endpoint reads anything back.
    for path in ("/v1/result", "/v1/logs", "/v1/heartbeat"):
        resp = await h.client.get(path, headers=a.headers(path, b""))
        assert resp.status == 405
    # A's "terminating" moves A's instance only.
    b_before = h.store.instance_by_agent(b.agent_id)
    assert (await a.heartbeat("terminating"))[0] == 200
    inst_a = h.store.instance_by_agent(a.agent_id)
    assert inst_a is not None and inst_a["state"] == "terminating"
    assert h.store.instance_by_agent(b.agent_id) == b_before
    # Result ids are per agent: A cannot shadow (or learn of) B's result with the same id.
    assert (await b.post("/v1/result", result_msg("same-id")))[0] == 200
    status, data = await a.post("/v1/result", result_msg("same-id"))
    assert status == 200 and data["duplicate"] is False
    stored_a = h.store.find_result(a.agent_id, "same-id")
    stored_b = h.store.find_result(b.agent_id, "same-id")
    assert stored_a is not None and stored_b is not None and stored_a["id"] != stored_b["id"]


# --- clock skew, end to end -------------------------------------------------------------------


@pytest.mark.parametrize("skew_s", [600.0, -600.0])
async def test_agent_ten_minutes_off_corrects_itself_against_the_real_app(
    aiohttp_server: Any, tmp_path: Path, skew_s: float
) -> None:
    store = Store(tmp_path / "coord.db")
    app = create_app(make_settings(tmp_path), store, FakeProvider(), time.time, run_monitor=False)
    app.on_cleanup.append(lambda _app: _close(store))
    server = await aiohttp_server(app)
    h_url = str(server.make_url("")).rstrip("/")
    resp = await server_admin(server, "POST", "/api/agents", {"label": "skewed"})
    agent_id, key = resp["agent_id"], bytes.fromhex(resp["agent_key"])
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)

    client = CoordinatorClient(h_url, agent_id, key, clock=lambda: time.time() + skew_s,
                               backoff=Backoff(base_s=0.05, cap_s=0.2), sleep=sleep)
    try:
        # The coordinator refuses its start second; the client just retries through it.
        directive = await client.hello(from_obj(Hello, hello_msg("boot-skew")))
        assert directive.action == "continue"
        assert client.clock_offset_s == pytest.approx(-skew_s, abs=2)
        waits.clear()
        for seq in range(1, 4):
            d = await client.heartbeat(from_obj(Heartbeat, heartbeat_msg(seq, "warming")))
            assert d.action == "continue"
        # Corrected once and for all: no heartbeat needed a retry.
        assert client.consecutive_failures == 0 and waits == []
    finally:
        await client.close()
    inst = store.instance_by_agent(agent_id)
    assert inst is not None and inst["last_seq"] == 3 and inst["phase"] == "warming"


async def server_admin(server: Any, method: str, path: str, payload: Any) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.request(
        method, str(server.make_url(path)), data=orjson.dumps(payload), headers=ADMIN
    ) as resp:
        assert resp.status == 200
        return orjson.loads(await resp.read())


async def _close(store: Store) -> None:
    store.close()


# --- forged results ---------------------------------------------------------------------------

FORGED: dict[str, dict[str, Any]] = {
    "rate_not_matching_proofs_and_seconds": dict(proofs=12, wall_seconds=1200.0, rate=500.0),
    "more_proofs_than_observed_time_allows": dict(proofs=12, wall_seconds=40.0,
                                                  proof_seconds=[40.0] * 12),
    "proof_seconds_count_differs": dict(proofs=12, wall_seconds=1200.0,
                                        proof_seconds=[200.0] * 5),
    "proof_seconds_sum_beyond_wall_x_concurrency": dict(proofs=12, wall_seconds=1200.0,
                                                        proof_seconds=[1190.0] * 12),
    "a_proof_longer_than_the_run": dict(proofs=12, wall_seconds=1200.0,
                                        proof_seconds=[5000.0] + [100.0] * 11),
    "claims_more_benchmarking_than_seen": dict(proofs=120, wall_seconds=12000.0),
}


@pytest.mark.parametrize("case", sorted(FORGED))
async def test_forged_result_is_stored_flagged_and_kept_out_of_host_perf(
    aiohttp_client: Any, tmp_path: Path, case: str
) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await hello(h, "forger")
    await agent.heartbeat("benchmarking")
    # The coordinator sees 20 minutes of benchmarking (only 10 s for the too-many-proofs case).
    h.clock.advance(10 if case == "more_proofs_than_observed_time_allows" else 1200)
    status, data = await agent.post("/v1/result", result_msg(f"forged-{case}", **FORGED[case]))
    assert status == 200, data
    stored = h.store.find_result(agent.agent_id, f"forged-{case}")
    assert stored is not None, "a forged result is still stored, as evidence"
    assert "implausible" in stored["flags"].split(",")
    assert stored["counts_for_host_perf"] == 0
    reasons = orjson.loads(stored["flag_reasons_json"])
    assert any(r.startswith("implausible:") for r in reasons), reasons
    assert h.store.host_perf() == []
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["rate_per_hour"] is None
    assert data["directive"]["action"] == "terminate"
    # The operator sees why, through the API.
    _, detail = await h.admin("GET", f"/api/instances/{inst['id']}")
    assert "implausible" in detail["results"][0]["flags"]
    assert any(e["kind"] == "flagged" for e in detail["events"])


async def test_an_honest_result_does_count(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await hello(h, "honest")
    await agent.heartbeat("benchmarking")
    h.clock.advance(1200)
    status, _ = await agent.post("/v1/result", result_msg("honest", proofs=12,
                                                          wall_seconds=1200.0))
    assert status == 200
    stored = h.store.find_result(agent.agent_id, "honest")
    assert stored is not None and stored["flags"] == "" and stored["counts_for_host_perf"] == 1
    assert len(h.store.host_perf()) == 1
