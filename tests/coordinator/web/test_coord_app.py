"""Agent and operator endpoints of the coordinator (docs/protocol.md), in-process."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.operations.deploy import mint_agent_id
from vast_manager.protocol import signing

from support.coord_support import (
    ADMIN,
    OLD_SECRET_HEX,
    SECRET_HEX,
    Harness,
    agent_key,
    hello_msg,
    response_signature,
    result_msg,
    start,
    telemetry_msg,
)
from support.fakes_provider import FakeProvider, offer


async def hello_agent(h: Harness, label: str = "my-rig", min_rate: float | None = None,
                      gpus: int | None = None):
    agent = await h.issue(label, min_rate, gpus)
    status, directive = await agent.hello()
    assert status == 200, directive
    return agent


# --- signing ---------------------------------------------------------------------------


def test_agent_key_and_signature_known_answer() -> None:
    # Computed here with hashlib/hmac only, then compared with the protocol package.
    secret = bytes.fromhex(SECRET_HEX)
    agent_id = "ag_0123456789abcdef0123"
    key = hmac.new(
        secret, b"vast-manager agent key v1:ag_0123456789abcdef0123", hashlib.sha256
    ).digest()
    assert signing.derive_agent_key(secret, agent_id) == key
    body = b'{"x":1}'
    canonical = (
        b"vm1-req\n1800000000\n"
        + b"ab" * 16
        + b"\nPOST\n/v1/heartbeat\n"
        + hashlib.sha256(body).hexdigest().encode()
    )
    expected = "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    assert (
        signing.sign_request(key, "1800000000", "ab" * 16, "POST", "/v1/heartbeat", body)
        == expected
    )


async def test_signed_hello_is_accepted_and_answer_is_signed(h: Harness) -> None:
    agent = await h.issue()
    status, data, (resp, raw, nonce) = await agent.post_raw("/v1/hello", orjson.dumps(hello_msg()))
    assert status == 200
    assert data["action"] == "continue"
    assert data["next_heartbeat_s"] == 15
    # The answer's signature, recomputed here from the contract.
    assert resp.headers["X-VM-Signature"] == response_signature(agent.key, nonce, 200, raw)
    assert int(resp.headers["X-VM-Server-Time"]) == int(h.clock())


async def test_fleet_secret_rotation_old_keys_still_verify(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, fleet_secret=f"{SECRET_HEX},{OLD_SECRET_HEX}")
    agent = await h.issue()
    old = h.agent(agent.agent_id, agent_key(agent.agent_id, OLD_SECRET_HEX))
    status, _, (resp, raw, nonce) = await old.post_raw("/v1/hello", orjson.dumps(hello_msg()))
    assert status == 200
    assert resp.headers["X-VM-Signature"] == response_signature(old.key, nonce, 200, raw)
    # New agents get keys from the newest secret.
    _, issued = await h.admin("POST", "/api/agents", {"label": "new"})
    assert issued["agent_key"] == agent_key(issued["agent_id"], SECRET_HEX).hex()


# --- rejected requests write nothing -------------------------------------------------------


async def test_content_digest_sees_an_update_that_row_counts_miss(h: Harness) -> None:
    """The 'writes nothing' checks below compare a digest of every row, not just counts:
    an accepted heartbeat only updates rows, and the digest must see it."""
    agent = await hello_agent(h)
    counts, digest = h.store.count_rows(), h.store.content_digest()
    h.clock.advance(5)
    assert (await agent.heartbeat("fetching_params"))[0] == 200
    assert h.store.content_digest() != digest
    assert h.store.count_rows()["instances"] == counts["instances"]


async def test_replayed_nonce_is_409_and_writes_nothing(h: Harness) -> None:
    agent = await hello_agent(h)
    body = orjson.dumps(
        {
            "seq": 1,
            "phase": "booting",
            "phase_started_at": 1.0,
            "progress": None,
            "proofs_completed_total": 0,
            "proof_seconds_recent": [],
            "telemetry": None,
        }
    )
    nonce = secrets.token_hex(16)
    status, _, _ = await agent.post_raw("/v1/heartbeat", body, nonce=nonce)
    assert status == 200
    before = h.store.count_rows(), h.store.content_digest()
    status, data, (resp, raw, _) = await agent.post_raw("/v1/heartbeat", body, nonce=nonce)
    assert status == 409
    assert data["error"] == "replayed_nonce"
    assert resp.headers["X-VM-Signature"] == response_signature(agent.key, nonce, 409, raw)
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_stale_timestamp_is_401_and_writes_nothing(h: Harness) -> None:
    agent = await hello_agent(h)
    before = h.store.count_rows(), h.store.content_digest()
    h.clock.advance(1000)
    status, data, (resp, _, _) = await agent.post_raw(
        "/v1/hello", orjson.dumps(hello_msg("boot-2")), ts=int(h.clock()) - 301
    )
    assert status == 401
    assert data["error"] == "stale_timestamp"
    assert resp.headers["X-VM-Server-Time"] == str(int(h.clock()))
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_timestamp_before_process_start_is_refused(h: Harness) -> None:
    agent = await h.issue()
    before = h.store.count_rows(), h.store.content_digest()
    status, data, _ = await agent.post_raw(
        "/v1/hello", orjson.dumps(hello_msg()), ts=int(h.clock()) - 1
    )
    assert (status, data["error"]) == (401, "stale_timestamp")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_another_agents_key_is_401_and_writes_nothing(h: Harness) -> None:
    victim = await hello_agent(h, "victim")
    other = await h.issue("attacker")
    impostor = h.agent(victim.agent_id, other.key)
    before = h.store.count_rows(), h.store.content_digest()
    status, data, (resp, _, _) = await impostor.post_raw(
        "/v1/result", orjson.dumps(result_msg("r1"))
    )
    assert status == 401
    assert data["error"] == "bad_signature"
    assert "X-VM-Signature" not in resp.headers
    assert "X-VM-Server-Time" in resp.headers
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_unknown_agent_and_missing_headers_are_401(h: Harness) -> None:
    before = h.store.count_rows(), h.store.content_digest()
    ghost = h.agent(mint_agent_id())
    status, data = await ghost.post("/v1/hello", hello_msg())
    assert (status, data["error"]) == (401, "unknown_agent")
    resp = await h.client.post("/v1/hello", data=orjson.dumps(hello_msg()))
    assert resp.status == 401
    assert (await resp.json())["error"] in ("unknown_agent", "bad_signature")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_body_over_one_mib_is_413_and_writes_nothing(h: Harness) -> None:
    agent = await hello_agent(h)
    before = h.store.count_rows(), h.store.content_digest()
    big = b'{"lines": [' + b" " * (1024 * 1024) + b"]}"
    status, data, _ = await agent.post_raw("/v1/logs", big)
    assert (status, data["error"]) == (413, "body_too_large")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_malformed_json_is_400_and_writes_nothing(h: Harness) -> None:
    agent = await hello_agent(h)
    before = h.store.count_rows(), h.store.content_digest()
    status, data, (resp, raw, nonce) = await agent.post_raw("/v1/heartbeat", b'{"seq": 1,')
    assert status == 400
    assert data["error"] == "malformed_json"
    assert resp.headers["X-VM-Signature"] == response_signature(agent.key, nonce, 400, raw)
    assert (h.store.count_rows(), h.store.content_digest()) == before


@pytest.mark.parametrize(
    ("path", "mutate", "field"),
    [
        ("/v1/heartbeat", lambda m: m.update(seq="1"), "seq"),
        ("/v1/heartbeat", lambda m: m.update(phase="dancing"), "phase"),
        ("/v1/result", lambda m: m.update(proofs_completed=1.5), "proofs_completed"),
        ("/v1/hello", lambda m: m["host"]["gpus"][0].update(index="0"), "host.gpus[0].index"),
        ("/v1/logs", lambda m: m["lines"][0].update(ts="now"), "lines[0].ts"),
    ],
)
async def test_wrong_field_type_is_400_naming_the_field(
    h: Harness, path: str, mutate: Any, field: str
) -> None:
    agent = await hello_agent(h)
    messages: dict[str, Any] = {
        "/v1/heartbeat": {
            "seq": 1,
            "phase": "booting",
            "phase_started_at": 1.0,
            "progress": None,
            "proofs_completed_total": 0,
            "proof_seconds_recent": [],
            "telemetry": None,
        },
        "/v1/result": result_msg("r1"),
        "/v1/hello": hello_msg("boot-2"),
        "/v1/logs": {"lines": [{"ts": 1.0, "source": "agent", "text": "hi"}]},
    }
    msg = messages[path]
    mutate(msg)
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.post(path, msg)
    assert status == 400
    assert data["field"] == field
    assert field in data["message"]
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_unsupported_protocol_is_400(h: Harness) -> None:
    agent = await h.issue()
    msg = hello_msg()
    msg["protocol"] = 2
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.post("/v1/hello", msg)
    assert (status, data["error"]) == (400, "unsupported_protocol")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_nonce_budget_full_is_429(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, nonces_per_agent=2)
    agent = await h.issue()
    assert (await agent.hello())[0] == 200
    assert (await agent.heartbeat("booting"))[0] == 200
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.heartbeat("booting")
    assert (status, data["error"]) == (429, "too_many_requests")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_heartbeat_before_hello_is_refused_without_writing(h: Harness) -> None:
    agent = await h.issue()
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.heartbeat("booting")
    assert (status, data["error"]) == (409, "hello_required")
    assert (h.store.count_rows(), h.store.content_digest()) == before


# --- results --------------------------------------------------------------------------------


async def test_result_posted_twice_is_stored_once_with_same_directive(h: Harness) -> None:
    agent = await hello_agent(h, min_rate=10.0)
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    status1, first = await agent.post("/v1/result", result_msg("res-1"))
    status2, second = await agent.post("/v1/result", result_msg("res-1"))
    assert status1 == status2 == 200
    assert first["duplicate"] is False
    assert second["duplicate"] is True
    assert second["directive"] == first["directive"]
    assert h.store.count_rows()["results"] == 1
    assert h.store.host_perf()[0]["samples"] == 1


async def test_lower_second_measurement_never_lowers_best(h: Harness) -> None:
    agent = await hello_agent(h, label="rig-7")
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    await agent.post("/v1/result", result_msg("a", proofs=20, wall_seconds=1200))  # 60/h
    await agent.heartbeat("proving")
    await h.rebenchmark(agent)  # each benchmark the coordinator asks for counts once
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    await agent.post("/v1/result", result_msg("b", proofs=10, wall_seconds=1200,
                                              finished_at=h.clock()))  # 30/h
    (row,) = h.store.host_perf()
    assert row["machine_id"] == "rig-7"
    assert row["best_rate_per_hour"] == pytest.approx(60.0)
    assert row["last_rate_per_hour"] == pytest.approx(30.0)
    assert row["samples"] == 2
    assert row["median_rate_per_hour"] == pytest.approx(45.0)


async def test_forged_rate_is_flagged_and_kept_out_of_host_perf(h: Harness) -> None:
    agent = await hello_agent(h)
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    status, data = await agent.post("/v1/result", result_msg("f", proofs=12, rate=500.0))
    assert status == 200
    assert data["directive"]["action"] == "terminate"
    assert "implausible" in data["directive"]["reason"]
    assert h.store.host_perf() == []
    _, inst = await h.admin("GET", f"/api/instances/{agent_instance(h, agent.agent_id)}")
    assert inst["results"][0]["flags"] == ["implausible"]


async def test_more_proofs_than_observed_time_allows_is_implausible(h: Harness) -> None:
    agent = await hello_agent(h)
    await agent.heartbeat("benchmarking")
    h.clock.advance(60)  # the coordinator saw one minute of benchmarking
    status, data = await agent.post("/v1/result", result_msg("f", proofs=12, wall_seconds=3600))
    assert status == 200
    assert data["directive"]["action"] == "terminate"
    assert "coordinator saw" in data["directive"]["reason"]


def agent_instance(h: Harness, agent_id: str) -> int:
    row = h.store.instance_by_agent(agent_id)
    assert row is not None
    return int(row["id"])


async def test_below_minimum_terminates_blocklists_and_destroys(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    provider = FakeProvider([offer(9001, 4242, dph_total=0.40)])  # minimum 50/h
    h = await start(aiohttp_client, tmp_path, provider=provider)
    status, deployed = await h.admin("POST", "/api/deploy", {"offer_id": 9001})
    assert status == 200, deployed
    agent = h.agent(deployed["agent_id"])
    assert (await agent.hello())[0] == 200
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    status, data = await agent.post("/v1/result", result_msg("r", proofs=10, wall_seconds=1200))
    assert status == 200
    directive = data["directive"]
    assert directive["action"] == "terminate"
    assert "30.00" in directive["reason"] and "below" in directive["reason"]
    assert directive["min_rate_per_hour"] == pytest.approx(50.0)
    (bad,) = h.store.bad_hosts()
    assert bad["machine_id"] == "4242"
    assert "30.00" in bad["reason"]
    # The agent gets its answer first; the monitor destroys after the grace.
    await h.core.monitor.tick()
    assert provider.destroyed == []
    h.clock.advance(11)
    await h.core.monitor.tick()
    assert provider.destroyed == [deployed["provider_instance_id"]]
    inst = h.store.get_instance(deployed["instance_id"])
    assert inst is not None and inst["state"] == "destroyed"
    kinds = [e["kind"] for e in h.store.events(deployed["instance_id"])]
    assert "verdict" in kinds and "destroy" in kinds
    # Destroyed instance's agent is refused from now on.
    assert (await agent.heartbeat("proving"))[0] == 401


async def test_below_minimum_byo_agent_is_revoked_not_destroyed(h: Harness) -> None:
    agent = await hello_agent(h, label="garage-box", min_rate=100.0)
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    _status, data = await agent.post("/v1/result", result_msg("r"))
    assert data["directive"]["action"] == "terminate"
    h.clock.advance(11)
    await h.core.monitor.tick()
    assert h.provider.destroyed == []
    row = h.store.get_agent(agent.agent_id)
    assert row is not None and row["revoked"] == 1
    assert (await agent.heartbeat("proving"))[0] == 401


async def test_scaling_result_is_stored(h: Harness) -> None:
    agent = await h.issue("quad", gpus=2)
    await agent.hello(gpus=2)
    await agent.heartbeat("benchmarking")
    h.clock.advance(3700)
    # The all-GPU benchmark (40/h), then the one-GPU run (30/h) as a scaling result.
    status, data = await agent.post("/v1/result", result_msg(
        "b1", proofs=40, wall_seconds=3600.0, gpus_used=[0, 1], finished_at=h.clock()))
    assert status == 200 and data["directive"]["action"] == "continue", data
    h.clock.advance(1300)
    msg = result_msg(
        "s1",
        kind="scaling",
        proofs=10,
        gpus_used=[0],
        finished_at=h.clock(),
        runs=[
            {"gpus_used": [0, 1], "rate_per_hour": 40.0, "telemetry": None},
            {"gpus_used": [0], "rate_per_hour": 30.0, "telemetry": None},
        ],
        efficiency=0.67,
        bottleneck="cpu",
        evidence=["cpu busy 97%"],
    )
    status, data = await agent.post("/v1/result", msg)
    assert status == 200, data
    status, rows = await h.admin("GET", "/api/scaling")
    assert status == 200
    (row,) = rows
    assert row["rate_all_per_hour"] == 40.0 and row["rate_one_per_hour"] == 30.0
    assert row["agent_bottleneck"] == "cpu"
    assert row["agent_evidence"] == ["cpu busy 97%"]
    # The coordinator's own reading, from the reported runs.
    assert row["efficiency"] == pytest.approx(40.0 / (2 * 30.0), abs=0.01)
    (perf,) = h.store.host_perf()  # scaling runs are not benchmark samples
    assert perf["samples"] == 1 and perf["median_rate_per_hour"] == pytest.approx(40.0)


async def test_terminated_multi_gpu_host_is_still_diagnosed(h: Harness) -> None:
    """A 4-GPU host terminated on its all-GPU benchmark sends no scaling run; the
    coordinator names its bottleneck from that run's telemetry anyway."""
    agent = await hello_agent(h, label="quad-5060", min_rate=57.5, gpus=4)
    await agent.hello(gpus=4)
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    tele = telemetry_msg(util=21.0)
    tele["gpus"] = [dict(tele["gpus"][0], index=i) for i in range(4)]
    tele["cpu"] = {"util_pct_mean": 98.0, "per_core_util_pct_mean": [98.0] * 16,
                   "load1": 31.5, "iowait_pct_mean": 0.2}
    msg = result_msg("bench-4", proofs=13, wall_seconds=1200.0, gpus_used=[0, 1, 2, 3],
                     telemetry=tele)
    status, data = await agent.post("/v1/result", msg)
    assert status == 200 and data["directive"]["action"] == "terminate", data
    status, rows = await h.admin("GET", "/api/scaling")
    assert status == 200
    (row,) = rows
    assert row["bottleneck"] == "cpu"
    assert row["rate_one_per_hour"] is None and row["efficiency"] is None
    assert row["agent_bottleneck"] is None
    assert any("98%" in e and "79%" in e for e in row["evidence"]), row["evidence"]


# --- directives -------------------------------------------------------------------------------


async def test_rebenchmark_is_asked_until_the_agent_begins_it(h: Harness) -> None:
    agent = await hello_agent(h)
    await agent.heartbeat("proving")
    iid = agent_instance(h, agent.agent_id)
    status, data = await h.admin("POST", f"/api/instances/{iid}/rebenchmark")
    assert status == 200 and data["ok"] is True
    status, first = await agent.heartbeat("proving")
    assert (status, first["action"]) == (200, "benchmark")
    # The answer is lost: the agent's retry (the same heartbeat, a fresh nonce) is told
    # the same, and so is its next heartbeat.
    agent.seq -= 1
    status, retried = await agent.heartbeat("proving")
    assert status == 200 and retried == first
    assert (await agent.heartbeat("proving"))[1]["action"] == "benchmark"
    # Its own heartbeat says it began: asked no more, a retry of that one included.
    status, began = await agent.heartbeat("benchmarking")
    assert (status, began["action"]) == (200, "continue")
    agent.seq -= 1
    assert (await agent.heartbeat("benchmarking"))[1] == began
    assert (await agent.heartbeat("proving"))[1]["action"] == "continue"
    events = [e for e in h.store.events(iid) if e["kind"] == "rebenchmark"]
    assert [e["reason"] for e in events] == [
        "the operator asked for a new benchmark", "the agent began the benchmark it was asked for"]


async def test_a_rebenchmark_asked_mid_benchmark_is_answered_by_its_result(
    h: Harness,
) -> None:
    """Asked while a benchmark is under way (no phase change will show it): the result
    that answers it closes it. From an agent that sends no benchmark ids, the result
    answers the operator's benchmark."""
    agent = await hello_agent(h)
    await agent.heartbeat("benchmarking")
    iid = agent_instance(h, agent.agent_id)
    assert (await h.admin("POST", f"/api/instances/{iid}/rebenchmark"))[0] == 200
    assert (await agent.heartbeat("benchmarking"))[1]["action"] == "benchmark"
    h.clock.advance(1200)
    status, data = await agent.post("/v1/result", result_msg("res-asked",
                                                             finished_at=h.clock()))
    assert status == 200 and data["directive"]["action"] == "continue", data
    assert (await agent.heartbeat("proving"))[1]["action"] == "continue"


async def test_revoked_agent_gets_401(h: Harness) -> None:
    agent = await hello_agent(h)
    status, _ = await h.admin("POST", f"/api/agents/{agent.agent_id}/revoke")
    assert status == 200
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.heartbeat("proving")
    assert (status, data["error"]) == (401, "unknown_agent")
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_old_heartbeat_does_not_move_phase_back(h: Harness) -> None:
    agent = await hello_agent(h)
    await agent.post(
        "/v1/heartbeat",
        {
            "seq": 5,
            "phase": "warming",
            "phase_started_at": 1.0,
            "progress": None,
            "proofs_completed_total": 0,
            "proof_seconds_recent": [],
            "telemetry": None,
        },
    )
    await agent.post(
        "/v1/heartbeat",
        {
            "seq": 4,
            "phase": "booting",
            "phase_started_at": 1.0,
            "progress": None,
            "proofs_completed_total": 0,
            "proof_seconds_recent": [],
            "telemetry": None,
        },
    )
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["state"] == "warming"
    # A new boot resets the expected sequence.
    await agent.hello("boot-2")
    _status, _ = await agent.post(
        "/v1/heartbeat",
        {
            "seq": 1,
            "phase": "fetching_params",
            "phase_started_at": 1.0,
            "progress": None,
            "proofs_completed_total": 0,
            "proof_seconds_recent": [],
            "telemetry": None,
        },
    )
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None and inst["state"] == "fetching_params"


# --- logs -----------------------------------------------------------------------------------------


async def test_logs_are_stored_bounded_and_filtered(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, log_lines_per_instance=5)
    agent = await hello_agent(h)
    lines = [
        {"ts": float(i), "source": "cuzk" if i % 2 else "agent", "text": f"line {i}"}
        for i in range(8)
    ]
    status, data = await agent.post("/v1/logs", {"lines": lines})
    assert (status, data) == (200, {"ok": True})
    assert h.store.count_rows()["logs"] == 5
    iid = agent_instance(h, agent.agent_id)
    status, rows = await h.admin("GET", f"/api/instances/{iid}/logs?tail=2&source=cuzk")
    assert status == 200
    assert [r["text"] for r in rows] == ["line 5", "line 7"]
    status, data = await h.admin("GET", f"/api/instances/{iid}/logs?tail=zero")
    assert (status, data["field"]) == (400, "tail")


async def test_too_many_log_lines_is_400(h: Harness) -> None:
    agent = await hello_agent(h)
    lines = [{"ts": 1.0, "source": "a", "text": "x"}] * 1001
    before = h.store.count_rows(), h.store.content_digest()
    status, data = await agent.post("/v1/logs", {"lines": lines})
    assert (status, data["field"]) == (400, "lines")
    assert (h.store.count_rows(), h.store.content_digest()) == before


# --- operator API --------------------------------------------------------------------------------


async def test_admin_api_needs_the_token(h: Harness) -> None:
    for method, path in [
        ("GET", "/api/instances"),
        ("POST", "/api/agents"),
        ("GET", "/api/host-perf"),
        ("GET", "/api/nonexistent"),
    ]:
        status, data = await h.admin(method, path, headers={})
        assert (status, data["error"]) == (401, "unauthorized"), path
        status, _ = await h.admin(method, path, headers={"Authorization": "Bearer wrong-token-xx"})
        assert status == 401


async def test_agent_signature_does_not_grant_admin(h: Harness) -> None:
    agent = await h.issue()
    headers = agent.headers("/api/instances", b"")
    resp = await h.client.get("/api/instances", headers=headers)
    assert resp.status == 401
    before = h.store.count_rows(), h.store.content_digest()
    body = orjson.dumps({"label": "sneaky"})
    resp = await h.client.post("/api/agents", data=body, headers=agent.headers("/api/agents", body))
    assert resp.status == 401
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_operator_bad_input_is_400_and_writes_nothing(h: Harness) -> None:
    before = h.store.count_rows(), h.store.content_digest()
    cases: list[tuple[str, str, Any, str | None]] = [
        ("POST", "/api/agents", {"label": 5}, "label"),
        ("POST", "/api/agents", {"label": "x", "min_rate_per_hour": "fast"}, "min_rate_per_hour"),
        ("POST", "/api/deploy", {"offer_id": "9001"}, "offer_id"),
        ("POST", "/api/deploy", {}, "offer_id"),
        ("POST", "/api/bad-hosts", {"reason": "x"}, "machine_id"),
        ("GET", "/api/instances/abc", None, "id"),
    ]
    for method, path, payload, field in cases:
        status, data = await h.admin(method, path, payload)
        assert status == 400, (path, data)
        assert data["field"] == field
    resp = await h.client.post("/api/agents", data=b"{nope", headers=ADMIN)
    assert resp.status == 400
    assert (await resp.json())["error"] == "invalid_field"
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_unknown_things_are_404_and_wrong_methods_405(h: Harness) -> None:
    for method, path in [
        ("GET", "/api/instances/77"),
        ("POST", "/api/instances/77/destroy"),
        ("POST", "/api/instances/77/rebenchmark"),
        ("DELETE", "/api/bad-hosts/123"),
        ("POST", f"/api/agents/{mint_agent_id()}/revoke"),
    ]:
        status, data = await h.admin(method, path)
        assert (status, data["error"]) == (404, "not_found"), path
    status, data = await h.admin("DELETE", "/api/instances")
    assert (status, data["error"]) == (405, "method_not_allowed")
    resp = await h.client.get("/v1/hello")
    assert resp.status == 405
    assert "X-VM-Server-Time" in resp.headers
    assert (await resp.json())["error"] == "method_not_allowed"


async def test_instances_listing_and_detail(h: Harness) -> None:
    agent = await hello_agent(h, label="rig-1", min_rate=10.0)
    await agent.heartbeat("proving", telemetry=True)
    status, rows = await h.admin("GET", "/api/instances")
    assert status == 200 and isinstance(rows, list)
    (row,) = rows
    for key in (
        "id",
        "agent_id",
        "label",
        "state",
        "phase",
        "progress",
        "machine_id",
        "gpu_name",
        "num_gpus",
        "dph_total",
        "rate_per_hour",
        "usd_per_proof",
        "last_seen",
    ):
        assert key in row
    assert row["machine_id"] == "rig-1" and row["state"] == "proving"
    status, detail = await h.admin("GET", f"/api/instances/{row['id']}")
    assert status == 200
    assert detail["telemetry"]["gpus"][0]["util_pct_mean"] == 95.0
    assert [e["kind"] for e in detail["events"]][:1] == ["hello"]
    assert detail["results"] == []
    assert "agent_key" not in orjson.dumps(detail).decode()


async def test_destroy_is_idempotent(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    _, deployed = await h.admin("POST", "/api/deploy", {"offer_id": 1})
    iid = deployed["instance_id"]
    status, first = await h.admin("POST", f"/api/instances/{iid}/destroy")
    status2, second = await h.admin("POST", f"/api/instances/{iid}/destroy")
    assert status == status2 == 200
    assert first["already"] is False and second["already"] is True
    assert provider.destroyed == [deployed["provider_instance_id"]]


async def test_bad_hosts_add_list_remove(h: Harness) -> None:
    status, _ = await h.admin("POST", "/api/bad-hosts", {"machine_id": 77, "reason": "flaky"})
    assert status == 200
    status, rows = await h.admin("GET", "/api/bad-hosts")
    assert [(r["machine_id"], r["reason"], r["source"]) for r in rows] == [
        ("77", "flaky", "operator")
    ]
    status, _ = await h.admin("DELETE", "/api/bad-hosts/77")
    assert status == 200
    assert (await h.admin("GET", "/api/bad-hosts"))[1] == []


async def test_offers_are_annotated(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 11), offer(2, 12, dph_total=0.2)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    await h.admin("POST", "/api/bad-hosts", {"machine_id": 12, "reason": "slow"})
    status, rows = await h.admin("GET", "/api/offers?filter=num_gpus>=1")
    assert status == 200
    assert provider.searched == ["num_gpus>=1"]
    by_id = {r["id"]: r for r in rows}
    assert by_id[2]["bad_host"] is True and by_id[1]["bad_host"] is False
    for r in rows:
        assert {
            "known",
            "predicted_rate_per_hour",
            "predicted_usd_per_proof",
            "prediction_basis",
        } <= set(r)


async def test_start_server_binds_a_free_port_and_stops(tmp_path: Path) -> None:
    import aiohttp

    from vast_manager.coordinator.web.server import start_server

    from support.coord_support import ADMIN_TOKEN, make_settings

    server = await start_server(make_settings(tmp_path, port=0), FakeProvider())
    try:
        assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":0")
        assert server.settings.coordinator_url == server.url
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with session.get(server.url + "/api/instances", headers=headers) as resp:
                assert resp.status == 200
                assert await resp.json() == []
    finally:
        await server.stop()


async def test_the_sub_applications_answer_their_edges_as_one_app(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    # /v1 and /api are sub-applications with their auth as middleware; what no route
    # serves is answered as anywhere else, and a stranger learns nothing of /api's routes.
    h = await start(aiohttp_client, tmp_path)
    cases = [
        ("GET", "/api", {}, 404, "not_found"),  # no operator path: not behind the token
        ("GET", "/api/nope", {}, 401, "unauthorized"),  # behind it, known or not
        ("DELETE", "/api/fleet", {}, 401, "unauthorized"),
        ("GET", "/api/nope", ADMIN, 404, "not_found"),
        ("DELETE", "/api/fleet", ADMIN, 405, "method_not_allowed"),
        ("POST", "/v1/nope", {}, 404, "not_found"),  # no route: not screened
        ("GET", "/v1/heartbeat", {}, 405, "method_not_allowed"),
        ("POST", "/v1/heartbeat", {}, 401, "unknown_agent"),  # a route: screened
        ("GET", "/metrics", {}, 401, "unauthorized"),
    ]
    for method, path, headers, status, code in cases:
        resp = await h.client.request(method, path, headers=headers)
        body = await resp.json()
        assert (resp.status, body["error"]) == (status, code), (method, path, headers)
        if path.startswith("/v1/"):
            assert resp.headers[signing.HEADER_SERVER_TIME] == str(int(h.clock()))
            assert signing.HEADER_SIGNATURE not in resp.headers
        if status == 405:
            assert resp.headers["Allow"]
