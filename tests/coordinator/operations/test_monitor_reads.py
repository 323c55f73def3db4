"""The monitor's fleet-wide reads run on the store's reader thread, never on the loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.operations.reconciliation import known_agent_ids
from vast_manager.coordinator.store.reads import Reads

from support.coord_support import Harness, start
from support.fakes_provider import FakeProvider, offer

#: The scans a monitor round makes over every instance (50,000 in production).
FLEET_SCANS = ("active_instances", "instance_values", "instances_of_kind",
               "instances_due_for_destroy", "next_destroy_due_at")


class HeldScans:
    """Every fleet-wide scan, on whichever thread calls it, first waits until ``release``
    (a scan of a large fleet that takes as long as the test wants); ``calls`` keeps each
    (scan, thread name), ``held`` how many wait now."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        self.release = threading.Event()
        self.held = 0
        self._lock = threading.Lock()
        for name in FLEET_SCANS:
            monkeypatch.setattr(Reads, name, self._wrap(name, getattr(Reads, name)))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def scan(reads: Reads, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((name, threading.current_thread().name))
                self.held += 1
            try:
                # On the loop's thread nothing could release it: it would hold the test
                # up this long, then fail it on the thread names.
                self.release.wait(30)
            finally:
                with self._lock:
                    self.held -= 1
            return original(reads, *args, **kwargs)

        return scan


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def proving(aiohttp_client: Any, tmp_path: Path) -> tuple[Harness, dict[str, Any], Any]:
    """A coordinator with one deployed instance whose agent said hello and is proving."""
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider([offer(1, 11)]))
    status, d = await h.admin("POST", "/api/deploy", {"offer_id": 1})
    assert status == 200, d
    agent = h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("proving")
    return h, d, agent


async def test_monitor_loop_keeps_serving_during_slow_scans(
    aiohttp_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, d, agent = await proving(aiohttp_client, tmp_path)
    monitor = h.core.monitor
    monitor._seeded = False  # the in-loop seeding scans too
    scans = HeldScans(monkeypatch)
    run = asyncio.create_task(monitor.run())
    try:
        await until(lambda: scans.held == 1, "a scan in progress")
        # A heartbeat is answered while the scan is still in progress.
        status, _ = await agent.heartbeat("proving")
        assert status == 200 and scans.held == 1
        scans.release.set()
        await until(lambda: {name for name, _ in scans.calls} == set(FLEET_SCANS),
                    "every fleet-wide scan of a monitor round")
    finally:
        scans.release.set()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    assert all(thread.startswith("store-reader") for _, thread in scans.calls), scans.calls
    inst = h.store.get_instance(d["instance_id"])
    assert inst is not None and inst["state"] == "proving"


async def test_async_seeding_starts_untracked_timers_only(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h, d, _ = await proving(aiohttp_client, tmp_path)
    monitor, tracker = h.core.monitor, h.core.monitor.tracker
    heard = tracker.last_seen(d["instance_id"])
    assert heard is not None
    await monitor.seed_async(h.clock() + 5)
    assert tracker.last_seen(d["instance_id"]) == heard  # already tracked: kept
    tracker.forget(d["instance_id"])
    await monitor.seed_async(h.clock() + 5)
    assert tracker.last_seen(d["instance_id"]) == h.clock() + 5


async def test_reconcile_knows_issued_and_revoked_agents(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    provider = FakeProvider([offer(1, 11)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    fleet = h.core.settings.fleet_id
    known = (await h.issue("rig-a")).agent_id
    revoked = (await h.issue("rig-b")).agent_id
    await h.store.write(lambda tx: tx.agents.revoke(revoked, now=h.clock(), reason="test"))
    for pid, agent_id in ((900, known), (901, "ag_unknown"), (902, revoked)):
        provider.instances[pid] = {
            "id": pid, "label": f"vm:{fleet}:{agent_id}", "machine_id": pid,
            "actual_status": "running", "start_date": 0.0,
        }
    actions = await h.core.monitor.reconcile(await provider.list_instances())
    # Unrecorded instances labelled with an agent we issued (revoked or not) are left
    # alone, as with the full agent list; an unknown agent's instance is a leak.
    assert [(a.kind, a.instance_id) for a in actions] == [("destroy_leaked", 901)]
    assert provider.destroyed == [901]


async def test_known_agent_ids_asks_in_chunks(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    a = (await h.issue("rig-a")).agent_id
    b = (await h.issue("rig-b")).agent_id
    asked = [f"ag_nobody{i}" for i in range(1200)] + [a, b, a]
    assert await h.store.read(lambda r: known_agent_ids(r, asked)) == {a, b}
    assert await h.store.read(lambda r: known_agent_ids(r, [])) == set()
