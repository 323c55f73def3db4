"""The steady-heartbeat fast path writes what the full path writes, and the
writer's cached view of each instance follows every change made to it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.operations import directives, heartbeat
from vast_manager.coordinator.operations.hello import hello_job
from vast_manager.coordinator.operations.result import result_job
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.coordinator.store.writes import heartbeats as heartbeats_module
from vast_manager.coordinator.store.writes import held as held_module
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.heartbeats import HeartbeatWrites
from vast_manager.coordinator.store.writes.instances import InstanceWrites
from vast_manager.coordinator.store.writes.results import ResultWrites
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import Heartbeat, Hello, Result

from support.coord_support import (
    Harness,
    heartbeat_msg,
    hello_msg,
    make_settings,
    result_msg,
)

AGENT = "ag_" + "5" * 20
NOW = 1_800_000_100.0


def _issue(settings: Any, ids: list[str], now: float = NOW) -> Callable[[Tx], list[int]]:
    """A write job: issue bring-your-own agents and say hello for each; their instances."""
    def job(tx: Tx) -> list[int]:
        instances = []
        for agent_id in ids:
            tx.agents.add(agent_id, label=agent_id, kind="byo", min_rate_per_hour=None,
                          issued_at=now)
            instance_id, _ = hello_job(agent_id, from_obj(Hello, hello_msg()), settings,
                                              now)(tx)
            instances.append(instance_id)
        return instances
    return job


def _heartbeat(seq: int, phase: str = "proving") -> Heartbeat:
    return from_obj(Heartbeat, heartbeat_msg(seq, phase, telemetry=True))


def _fleet_rows(store: Store) -> dict[str, Any]:
    inst = store.instance_by_agent(AGENT)
    assert inst is not None
    return {
        "instance": inst,
        "heartbeat": store.latest_heartbeat(AGENT),
        "telemetry": store.latest_telemetry(int(inst["id"])),
        "history": store.heartbeat_history(AGENT),
    }


async def _drive(path: Path, *, fast: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Hello, then heartbeats through the phases, at fixed times; the rows they leave."""
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(heartbeat, "_steady", lambda *a: False)
        settings = make_settings(path.parent)
        store = Store(path)
        try:
            now = NOW
            await store.write(_issue(settings, [AGENT]))
            phases = ["booting", "fetching_params", "warming", "warming", "proving",
                      "proving", "proving"]
            answers = []
            for seq, phase in enumerate(phases, start=1):
                now += 15.0
                answers.append(await store.write(
                    heartbeat.heartbeat_job(AGENT, _heartbeat(seq, phase), settings, now)))
            # Late and repeated heartbeats must not move anything back.
            answers.append(await store.write(
                heartbeat.heartbeat_job(AGENT, _heartbeat(3, "warming"), settings, now + 1)))
            rows = _fleet_rows(store)
            rows["answers"] = answers
            return rows
        finally:
            store.close()


async def test_fast_path_leaves_the_rows_the_full_path_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    steady = heartbeat._steady

    def counting(*args: Any) -> bool:
        calls.append(steady(*args))
        return calls[-1]

    monkeypatch.setattr(heartbeat, "_steady", counting)
    # The first benchmark's id is random: the same one in both runs.
    monkeypatch.setattr(directives, "new_benchmark_id", lambda: "bm_" + "0" * 32)
    (tmp_path / "fast").mkdir()
    (tmp_path / "full").mkdir()
    fast = await _drive(tmp_path / "fast" / "c.db", fast=True, monkeypatch=monkeypatch)
    # Steady: booting (the state hello set), the second warming, the two later provings.
    assert calls == [True, False, False, True, False, True, True, False]
    full = await _drive(tmp_path / "full" / "c.db", fast=False, monkeypatch=monkeypatch)
    assert fast == full
    assert fast["instance"]["state"] == "proving" and fast["instance"]["last_seq"] == 7


async def test_every_change_to_an_instance_reaches_its_next_heartbeat(h: Harness) -> None:
    agent = await h.issue()
    assert (await agent.hello())[0] == 200
    for _ in range(3):  # the cache is warm: these take the fast path
        status, directive = await agent.heartbeat("proving")
        assert (status, directive["action"]) == (200, "continue")
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None

    assert (await h.admin("POST", f"/api/instances/{inst['id']}/rebenchmark"))[0] == 200
    assert (await agent.heartbeat("proving"))[1]["action"] == "benchmark"
    # Asked again until the agent acts on it (docs/protocol.md, "Directives").
    assert (await agent.heartbeat("proving"))[1]["action"] == "benchmark"
    assert (await agent.heartbeat("benchmarking"))[1]["action"] == "continue"

    # What the monitor's timeout job writes (through the writer, like every change).
    await h.store.write(lambda tx: tx.instances.update(
        inst["id"], state="terminating", terminate_reason="stayed too long in test",
        destroy_due_at=h.clock() + 10))
    status, directive = await agent.heartbeat("proving")
    assert (status, directive["action"]) == (200, "terminate")
    assert directive["reason"] == "stayed too long in test"


async def test_revoking_an_agent_stops_its_fast_path(h: Harness) -> None:
    agent = await h.issue()
    await agent.hello()
    assert (await agent.heartbeat("proving"))[0] == 200
    assert (await h.admin("POST", f"/api/agents/{agent.agent_id}/revoke"))[0] == 200
    # Auth refuses first; the writer's own check (behind it) is the one tested below.
    assert (await agent.heartbeat("proving"))[0] == 401


async def test_the_writer_refuses_a_revoked_agent_even_with_a_warm_cache(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db")
    try:
        now = NOW
        await store.write(_issue(settings, [AGENT]))
        for seq in (1, 2):
            await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(seq), settings, now))
        await store.write(lambda tx: tx.agents.revoke(AGENT, now=now, reason="test"))
        with pytest.raises(Exception, match="unknown or revoked"):
            await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(3), settings, now))
    finally:
        store.close()


async def test_a_rolled_back_job_cannot_leave_the_cache_behind(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db")
    try:
        now = NOW
        (instance_id,) = await store.write(_issue(settings, [AGENT]))
        for seq in (1, 2):
            await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(seq), settings, now))

        def doomed(tx: Tx) -> None:
            tx.instances.update(instance_id, terminate_reason="never committed")
            raise RuntimeError("this job fails after changing the instance")

        with pytest.raises(RuntimeError):
            await store.write(doomed)
        _, directive = await store.write(
            heartbeat.heartbeat_job(AGENT, _heartbeat(3), settings, now))
        assert directive.action == "continue"
        row = store.get_instance(instance_id)
        assert row is not None and row["terminate_reason"] is None
    finally:
        store.close()


async def test_concurrent_heartbeats_of_many_agents_all_land(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db", commit_window_s=0.005)
    ids = [f"ag_{i:020x}" for i in range(40)]
    try:
        now = NOW
        await store.write(_issue(settings, ids))
        for seq in (1, 2, 3):
            answers = await asyncio.gather(*(
                store.write(heartbeat.heartbeat_job(a, _heartbeat(seq), settings, now + seq))
                for a in ids))
            assert {d.action for _, d in answers} == {"continue"}
        assert {r["seq"] for r in (store.latest_heartbeat(a) for a in ids) if r} == {3}
    finally:
        store.close()


async def _warm_store(tmp_path: Path, **store_kw: Any) -> tuple[Store, Any, float]:
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db", **store_kw)
    now = NOW
    await store.write(_issue(settings, [AGENT]))
    for seq in (1, 2):  # booting, then proving: the cache is warm and the state proving
        phase = "booting" if seq == 1 else "proving"
        await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(seq, phase), settings, now))
    return store, settings, now


async def test_a_failing_job_in_the_same_transaction_keeps_held_heartbeats(
    tmp_path: Path,
) -> None:
    store, settings, now = await _warm_store(tmp_path)
    try:
        def doomed(tx: Tx) -> None:
            tx.audit.add(now, "test", "undone")
            raise RuntimeError("fails after the steady heartbeat was held")

        commits = store.commits
        outcomes = await asyncio.gather(
            store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(3), settings, now + 15)),
            store.write(doomed),
            return_exceptions=True,
        )
        assert store.commits - commits == 1  # one transaction for both
        assert isinstance(outcomes[1], RuntimeError)
        latest = store.latest_heartbeat(AGENT)
        inst = store.instance_by_agent(AGENT)
        assert latest is not None and latest["seq"] == 3
        assert inst is not None and inst["last_seq"] == 3 and inst["last_seen"] == now + 15
        assert [e for e in store.events() if e["reason"] == "undone"] == []
    finally:
        store.close()


async def test_a_late_heartbeat_behind_a_held_one_sees_it(tmp_path: Path) -> None:
    store, settings, now = await _warm_store(tmp_path)
    try:
        # seq 4 is held; seq 3 arrives after it in the same transaction and must be
        # recognised as late (it reads the instance, which writes the held rows first).
        await asyncio.gather(
            store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(4), settings, now + 15)),
            store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(3, "warming"), settings,
                                             now + 16)),
        )
        inst = store.instance_by_agent(AGENT)
        assert inst is not None
        assert (inst["last_seq"], inst["state"], inst["phase"]) == (4, "proving", "proving")
        assert inst["last_seen"] == now + 16  # the late one still counts as a sign of life
    finally:
        store.close()


async def _four_rounds(store: Store, settings: Any,
                       at: Callable[[int, int], float]) -> list[str]:
    """Register 150 agents (more than one multi-row statement holds), then four rounds of
    one heartbeat each (booting, then proving), agent ``i``'s round ``seq`` at
    ``at(seq, i)``; each round must be one transaction. Returns the agent ids."""
    ids = [f"ag_{i:020x}" for i in range(150)]
    await store.write(_issue(settings, ids))
    for seq, phase in ((1, "booting"), (2, "proving"), (3, "proving"), (4, "proving")):
        commits = store.commits
        await asyncio.gather(*(
            store.write(heartbeat.heartbeat_job(a, _heartbeat(seq, phase), settings, at(seq, i)))
            for i, a in enumerate(ids)))
        assert store.commits - commits == 1
    return ids


@pytest.mark.parametrize("max_parameters", [32766, 999], ids=["sqlite-3.32", "older-sqlite"])
async def test_many_held_heartbeats_land_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_parameters: int
) -> None:
    monkeypatch.setattr(held_module, "_MAX_PARAMETERS", max_parameters)
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db")
    try:
        now = NOW
        ids = await _four_rounds(store, settings, lambda seq, i: now + seq + i / 1000)
        for i, agent_id in enumerate(ids):
            inst = store.instance_by_agent(agent_id)
            latest = store.latest_heartbeat(agent_id)
            assert inst is not None and latest is not None
            assert (inst["last_seq"], latest["seq"]) == (4, 4)
            assert inst["last_seen"] == latest["received_at"] == now + 4 + i / 1000
    finally:
        store.close()


async def test_history_rows_are_held_and_trimmed_with_their_transaction(tmp_path: Path) -> None:
    """Heartbeats due a history row hold it like their other rows: a round of 150 agents
    is still one transaction, every row lands, and retention keeps each agent's newest."""
    settings = make_settings(tmp_path, heartbeat_history_interval_s=10.0,
                             heartbeat_history_rows=2)
    store = Store(tmp_path / "c.db")
    try:
        now = NOW
        for agent_id in await _four_rounds(store, settings, lambda seq, i: now + 15 * seq):
            history = store.heartbeat_history(agent_id)
            assert [h["seq"] for h in history] == [3, 4]
            assert [h["received_at"] for h in history] == [now + 45, now + 60]
            assert all(h["telemetry_json"] for h in history)
    finally:
        store.close()


async def test_a_failed_job_loses_only_its_own_history_row(tmp_path: Path) -> None:
    store, settings, now = await _warm_store(tmp_path)
    other = "ag_" + "6" * 20
    await store.write(_issue(settings, [other]))
    try:
        def doomed(tx: Tx) -> None:
            tx.heartbeats.append_history(
                {"agent_id": other, "instance_id": 2, "received_at": now + 15, "seq": 9,
                 "phase": "proving", "proofs_completed_total": 0, "telemetry_json": None},
                interval_s=settings.heartbeat_history_interval_s, keep_rows=10)
            raise RuntimeError("fails after holding a history row")

        later = now + settings.heartbeat_history_interval_s + 1
        outcomes = await asyncio.gather(
            store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(3), settings, later)),
            store.write(doomed),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], RuntimeError)
        assert [h["seq"] for h in store.heartbeat_history(AGENT)][-1] == 3
        assert store.heartbeat_history(other) == []
        # The failed job's row was never written, and the writer did not remember it:
        # the agent's next heartbeat is still due a history row.
        await store.write(heartbeat.heartbeat_job(other, _heartbeat(1), settings, later + 1))
        assert [h["seq"] for h in store.heartbeat_history(other)] == [1]
    finally:
        store.close()


async def test_after_a_restart_an_agent_without_history_is_not_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's preload knows every issued agent: one with no history row yet gets its
    first row without a read (which would write the batch's held rows early)."""
    settings = make_settings(tmp_path)
    store = Store(tmp_path / "c.db")
    await store.write(_issue(settings, [AGENT]))
    store.close()

    def no_read(*_args: Any, **_kw: Any) -> None:
        raise AssertionError("the history of a preloaded agent was read")

    monkeypatch.setattr(heartbeats_module, "one_row", no_read)
    store = Store(tmp_path / "c.db")  # a restart: the caches are preloaded
    try:
        for seq, phase in ((1, "booting"), (2, "proving")):
            await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(seq, phase), settings,
                                                      NOW + 15 * seq))
        assert [h["seq"] for h in store.heartbeat_history(AGENT)] == [1]
    finally:
        store.close()


def test_serving_shortens_the_gil_switch_interval() -> None:
    from vast_manager.coordinator.web.server import SWITCH_INTERVAL_S, tune_switch_interval

    before = sys.getswitchinterval()
    try:
        tune_switch_interval()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert before > SWITCH_INTERVAL_S  # shorter than CPython's 5 ms
    finally:
        sys.setswitchinterval(before)


# --- one pass: read, decide, one write, answer ------------------------------------------------

#: Every table writer's method that writes (``Tx``'s ``name.method``); a heartbeat's or a
#: result's job calls none of them itself.
TX_WRITES = (("instances", InstanceWrites, "update"), ("audit", EventWrites, "add"),
             ("instances", InstanceWrites, "begin_terminating"),
             ("heartbeats", HeartbeatWrites, "hold"),
             ("heartbeats", HeartbeatWrites, "upsert_telemetry"),
             ("heartbeats", HeartbeatWrites, "append_history"),
             ("results", ResultWrites, "add"), ("results", ResultWrites, "add_measurement"),
             ("results", ResultWrites, "add_scaling"))


def _spy_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """(the one-pass writes called, the write methods called outside them)."""
    whole: list[str] = []
    stray: list[str] = []
    depth = [0]

    def around(name: str, fn: Callable[..., Any], one_pass: bool) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if one_pass:
                whole.append(name)
            elif depth[0] == 0:
                stray.append(name)
            depth[0] += 1
            try:
                return fn(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    for table, cls, method in (("heartbeats", HeartbeatWrites, "write"),
                               ("results", ResultWrites, "write"), *TX_WRITES):
        one_pass = method == "write"
        monkeypatch.setattr(cls, method, around(f"{table}.{method}", getattr(cls, method),
                                                one_pass))
    return whole, stray


async def test_a_heartbeat_and_a_result_write_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, verdict_early=False)
    store = Store(tmp_path / "coord.db")
    try:
        await store.write(_issue(settings, [AGENT]))
        whole, stray = _spy_writes(monkeypatch)
        now = NOW
        # A phase change (the full path), steady ones, a late one, then the agent failing.
        for seq, phase in enumerate(["warming", "proving", "proving"], start=1):
            now += 15.0
            await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(seq, phase), settings, now))
        await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(2), settings, now + 1))
        assert whole == ["heartbeats.write"] * 4 and stray == []
        # A result, counted or not, and a heartbeat that ends the instance.
        await store.write(result_job(AGENT, from_obj(Result, result_msg(
            "res-1", finished_at=now)), settings, now + 2))
        assert whole[-1] == "results.write" and stray == []
        await store.write(heartbeat.heartbeat_job(AGENT, _heartbeat(4, "failed"), settings,
                                               now + 3))
        assert whole[-1] == "heartbeats.write" and stray == []
        assert len(whole) == 6
        inst = store.instance_by_agent(AGENT)
        assert inst is not None and inst["state"] in ("failed", "terminating")
        assert inst["terminate_reason"]
        # The spy is live: a write outside the one call is seen.
        await store.write(lambda tx: tx.audit.add(now, "note", "by hand"))
        assert stray == ["audit.add"]
    finally:
        store.close()
