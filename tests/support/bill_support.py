"""A coordinator against the fake vast.ai on an injected clock, for the whole-bill tests and
``bench/billing.py``: the real ``create_app``, ``VastProvider`` and ``VastClient``, the
monitor driven round by round, agents played by the test (signed, as ``coord_support``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from vast_manager.coordinator.providers.vast.client import VastClient
from vast_manager.coordinator.providers.vast.provider import DEFAULT_ONSTART, VastProvider
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.app import create_app

from support.coord_support import Agent, Harness, heartbeat_msg, make_settings
from support.fakes_provider import FakeClock
from support.fakevast import FAKE_API_KEY, FakeVast

MONITOR_INTERVAL_S = 60.0
HEARTBEAT_S = 15.0


async def no_sleep(_seconds: float) -> None:
    return None


@dataclass
class BillEnv:
    fake: FakeVast
    clock: FakeClock
    h: Harness
    provider: VastProvider

    async def deploy(self, offer_id: int, **body: Any) -> dict[str, Any]:
        status, data = await self.h.admin("POST", "/api/deploy", {"offer_id": offer_id, **body})
        assert status == 200, data
        return dict(data)

    async def heartbeat(self, agent: Agent, phase: str, rx: int | None = None,
                        tx: int = 0) -> tuple[int, Any]:
        """A heartbeat, with the agent's NIC byte counts when ``rx`` is given."""
        agent.seq += 1
        msg = heartbeat_msg(agent.seq, phase)
        if rx is not None:
            msg["net_bytes_total"] = {"rx": rx, "tx": tx}
        return await agent.post("/v1/heartbeat", msg)

    async def tick(self) -> None:
        await self.h.core.monitor.tick()


@contextlib.asynccontextmanager
async def bill_env(tmp_path: Path, *, loading: bool = True, credit: float = 1000.0,
                   **settings: Any) -> AsyncIterator[BillEnv]:
    clock = FakeClock()
    async with FakeVast(clock=clock, loading=loading, credit=credit) as fake:
        provider = VastProvider(
            VastClient(FAKE_API_KEY, fake.url, sleep=no_sleep, rng=lambda: 0.0),
            image="ghcr.io/example/vast-agent:bench", onstart=DEFAULT_ONSTART,
        )
        store = Store(tmp_path / "bill.db")
        values: dict[str, Any] = {"monitor_interval_s": MONITOR_INTERVAL_S,
                                  "next_heartbeat_s": int(HEARTBEAT_S)}
        values.update(settings)
        app = create_app(make_settings(tmp_path / "settings", **values), store, provider, clock,
                         run_monitor=False)
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            clock.advance(1)
            yield BillEnv(fake, clock, Harness(client, clock, provider),  # type: ignore[arg-type]
                          provider)
        finally:
            await client.close()
            store.close()
            await provider.close()
