"""Replay (docs/protocol.md, "Replay"): the marks a heartbeat answer carries, a replayed
log batch stored once, a result's receipt and what it spares a replayed result."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import orjson

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.operations import replay
from vast_manager.protocol import Result
from vast_manager.protocol.codec import decode, encode
from vast_manager.protocol.signing import parse_secrets

from support.coord_support import OLD_SECRET_HEX, SECRET_HEX, result_msg, start


def _query(tmp_path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The database file, read apart from the coordinator (as a restore would read it)."""
    path = tmp_path / "coord.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return [tuple(r) for r in db.execute(sql, args)]


def _lines(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"ts": 1_800_000_000.0 + i, "source": "agent", "text": f"{tag} {i}"}
            for i in range(n)]


async def test_marks_answer_a_heartbeat_that_keeps_items_and_replayed_logs_store_once(
        aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    agent = await h.issue()
    assert (await agent.hello())[0] == 200
    status, plain = await agent.heartbeat("warming")
    assert status == 200 and plain["stored_logs_seq"] is None  # an agent that keeps nothing
    for seq, tag in ((5, "a"), (5, "a"), (4, "old"), (9, "b")):
        status, _ = await agent.post("/v1/logs", {"lines": _lines(3, tag), "spool_seq": seq})
        assert status == 200
    status, _ = await agent.post("/v1/logs", {"lines": _lines(2, "no-seq")})  # older agent
    assert status == 200
    texts = [t for (t,) in _query(tmp_path, "select text from logs where agent_id = ? "
                                  "order by id", agent.agent_id)]
    assert texts == ["a 0", "a 1", "a 2", "b 0", "b 1", "b 2", "no-seq 0", "no-seq 1"]
    agent.seq += 1
    msg = {"seq": agent.seq, "phase": "warming", "phase_started_at": 1_800_000_000.0,
           "progress": None, "proofs_completed_total": 0, "proof_seconds_recent": [],
           "telemetry": None, "acked_seq": 12}
    status, answer = await agent.post("/v1/heartbeat", msg)
    assert status == 200
    assert (answer["stored_result_seq"], answer["stored_logs_seq"]) == (0, 9)
    # How far the database reaches is what a restored coordinator reads at start.
    assert _query(tmp_path, "select result_seq, logs_seq from spool_marks where agent_id = ?",
                  agent.agent_id) == [(0, 9)]


async def _benchmarking_agent(aiohttp_client: Any, tmp_path: Path) -> tuple[Any, Any]:
    """A coordinator and an agent that has benchmarked long enough for a result."""
    h = await start(aiohttp_client, tmp_path)
    agent = await h.issue()
    await agent.hello()
    await agent.heartbeat("benchmarking")
    h.clock.advance(1200)
    await agent.heartbeat("benchmarking")
    return h, agent


async def test_a_result_gets_a_receipt_and_raises_the_mark_a_duplicate_too(
        aiohttp_client: Any, tmp_path: Path) -> None:
    h, agent = await _benchmarking_agent(aiohttp_client, tmp_path)
    body = result_msg("res_one", finished_at=h.clock(), spool_seq=7)
    status, ack = await agent.post("/v1/result", body)
    assert status == 200 and not ack["duplicate"]
    result = decode(Result, orjson.dumps(body))
    secrets = parse_secrets(SECRET_HEX)
    assert ack["receipt"] == replay.receipt_for(secrets[0], agent.agent_id, result)
    status, again = await agent.post("/v1/result", {**body, "spool_seq": 8,
                                                     "receipt": ack["receipt"]})
    assert status == 200 and again["duplicate"]
    assert h.core.spool_marks.of(agent.agent_id) == (8, 0)


async def test_an_item_after_one_this_store_lacks_is_refused_and_nothing_written(
        aiohttp_client: Any, tmp_path: Path) -> None:
    # A restored store reaches result 7 and log batch 9; the agent was acknowledged more.
    h, agent = await _benchmarking_agent(aiohttp_client, tmp_path)
    assert (await agent.post("/v1/logs", {"lines": _lines(1, "kept"), "spool_seq": 9}))[0] == 200
    body = result_msg("res_kept", finished_at=h.clock(), spool_seq=7)
    assert (await agent.post("/v1/result", body))[0] == 200
    stored_before = _query(tmp_path, "select count(*) from results")

    status, refused = await agent.post("/v1/logs", {"lines": _lines(1, "new"),
                                                    "spool_seq": 14, "prev_acked_seq": 12})
    assert status == 409 and refused["error"] == "replay_first"
    assert "reaches 9" in refused["message"]
    status, refused = await agent.post("/v1/result", {
        **result_msg("res_new", finished_at=h.clock(), spool_seq=13), "prev_acked_seq": 11})
    assert status == 409 and refused["error"] == "replay_first"
    assert _query(tmp_path, "select text from logs where text like 'new%'") == []
    assert _query(tmp_path, "select count(*) from results") == stored_before
    assert h.core.spool_marks.of(agent.agent_id) == (7, 9)

    # Sent again in order, the lost items first: each is taken.
    for seq, prev, tag in ((12, 9, "lost"), (14, 12, "new")):
        status, _ = await agent.post("/v1/logs", {"lines": _lines(1, tag), "spool_seq": seq,
                                                  "prev_acked_seq": prev})
        assert status == 200
    for result_id, seq, prev in (("res_lost", 11, 7), ("res_new", 13, 11)):
        status, _ = await agent.post("/v1/result", {
            **result_msg(result_id, finished_at=h.clock(), spool_seq=seq),
            "prev_acked_seq": prev})
        assert status == 200
    assert h.core.spool_marks.of(agent.agent_id) == (13, 14)


def _result(**changes: Any) -> Result:
    base = Result(result_id="res_r", kind="benchmark", proof_type="porep-c2-32g",
                  started_at=1000.0, finished_at=2200.0, gpus_used=[0], proofs_completed=12,
                  proofs_failed=0, wall_seconds=1200.0, rate_per_hour=36.0,
                  proof_seconds=[200.0] * 12, telemetry=None)
    return msgspec.structs.replace(base, **changes)


def test_a_receipt_holds_for_this_fleet_and_this_result_only() -> None:
    secret, old = parse_secrets(SECRET_HEX)[0], parse_secrets(OLD_SECRET_HEX)[0]
    result = _result()
    receipt = replay.receipt_for(secret, "ag_a", result)
    assert replay.receipted([secret], "ag_a", msgspec.structs.replace(result, receipt=receipt))
    # A rotated secret still honours receipts made under the old one.
    assert replay.receipted([old, secret], "ag_a", msgspec.structs.replace(result, receipt=receipt))
    assert not replay.receipted([secret], "ag_b", msgspec.structs.replace(result, receipt=receipt))
    assert not replay.receipted([secret], "ag_a", _result(rate_per_hour=99.0, receipt=receipt))
    assert not replay.receipted([secret], "ag_a", _result(receipt="00" * 32))
    assert not replay.receipted([secret], "ag_a", result)


class _LaterResult(Result):
    """``Result`` as a later contract has it: one field added, with its default."""

    later_field: int | None = None


def _v1_receipt(secret: bytes, agent_id: str, result: Result) -> str:
    """A receipt as coordinators made them before v2: every field's value, encoded."""
    key = hmac.new(secret, b"vast-manager result receipt v1", hashlib.sha256).digest()
    body = encode(msgspec.structs.replace(result, receipt=None, prev_acked_seq=None))
    return hmac.new(key, agent_id.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def test_a_receipt_holds_across_an_upgrade_that_adds_a_field() -> None:
    secret = parse_secrets(SECRET_HEX)[0]
    result = _result(benchmark_id="bm_1")
    later = _LaterResult(**msgspec.structs.asdict(result))
    receipt = replay.receipt_for(secret, "ag_a", result)
    # A digest of every field changes with the one added: why v1 receipts would not hold.
    assert _v1_receipt(secret, "ag_a", result) != _v1_receipt(secret, "ag_a", later)
    assert replay.receipt_for(secret, "ag_a", later) == receipt
    assert replay.receipted([secret], "ag_a", msgspec.structs.replace(later, receipt=receipt))
    # The added field set is a different result.
    assert not replay.receipted(
        [secret], "ag_a", msgspec.structs.replace(later, receipt=receipt, later_field=3))
    # A receipt a coordinator made before v2 still holds on the same contract.
    v1 = _v1_receipt(secret, "ag_a", result)
    assert replay.receipted([secret], "ag_a", msgspec.structs.replace(result, receipt=v1))
    assert not replay.receipted(
        [secret], "ag_a", msgspec.structs.replace(result, receipt=v1, rate_per_hour=99.0))


def test_a_receipted_result_is_not_judged_on_a_window_this_coordinator_never_saw() -> None:
    # The restored coordinator saw the instance's benchmarking begin long after the run
    # (its own start); the coordinator that acknowledged the run saw all of it.
    watch = policy.Watch(now=2300.0, window_start=2100.0, window_after_result=False,
                         benchmarking_seen=True, reported_gpus=frozenset({0}))
    limits = policy.PolicyLimits()
    fresh = policy.check_result(_result(), watch=watch, limits=limits)
    assert fresh.implausible and any("before the benchmarking" in r for r in fresh.reasons)
    replayed = policy.check_result(_result(), watch=dataclasses.replace(watch, receipted=True),
                                   limits=limits)
    assert not replayed.implausible, replayed.reasons
    # The rest of the checks still hold: a receipt does not make bad arithmetic good.
    wrong = policy.check_result(_result(rate_per_hour=360.0),
                                watch=dataclasses.replace(watch, receipted=True), limits=limits)
    assert wrong.reasons
