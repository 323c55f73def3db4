"""A coordinator on the fake vast.ai with real agents, as the end-to-end tests use it.

The coordinator runs in-process (``start_server``) with the provider
``vast-manager serve --provider vast`` builds (``from_settings``: the API key found
as the CLI finds it, ``VAST_URL`` pointing at the fake). Every create on the fake
starts a real ``vast-agent`` on the simulated cuzk (``SimAgents``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.vast.provider import from_settings
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web.server import RunningServer, start_server

from support.fakevast import FAKE_API_KEY, FakeVast, SimAgents

TOKEN = "vast-e2e-admin-token-0123456789"
IMAGE = "ghcr.io/example/vast-agent:e2e"
TIME_SCALE = 240.0
SLOW_OFFER = 9006  # 1x RTX 5090 on 128 GB RAM at $0.69/h: far below its minimum rate
FAST_OFFER = 9003  # 1x RTX 5070 Ti at $0.19/h: well above it


async def until(cond: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def catalog(offer_id: int) -> dict[str, Any]:
    (offer,) = [o for o in local_offers() if o["id"] == offer_id]
    return offer


def add_catalog_offer(fake: FakeVast, offer_id: int) -> dict[str, Any]:
    offer = catalog(offer_id)
    fields = {k: v for k, v in offer.items() if k not in ("id", "machine_id")}
    return fake.add_offer(offer_id, offer["machine_id"], **fields)


class Api:
    """The operator API over HTTP, as the CLI uses it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(
            method, self.url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            return resp.status, await resp.json(content_type=None)

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = await self.call(method, path, body)
        assert status == 200, (method, path, status, data)
        return data


@dataclass
class Fleet:
    fake: FakeVast
    agents: SimAgents
    server: RunningServer
    api: Api


@contextlib.asynccontextmanager
async def vast_fleet(tmp_path: Path, offers: tuple[int, ...], *,
                     extra_env: dict[str, str] | None = None,
                     **settings: Any) -> AsyncIterator[Fleet]:
    """The fake vast.ai selling ``offers`` (the local catalog's), a coordinator on it at
    240x simulated time, and the operator API; every process is gone afterwards."""
    agents = SimAgents(tmp_path / "instances", time_scale=TIME_SCALE, extra_env=extra_env)
    try:
        async with FakeVast(launcher=agents) as fake:
            for offer_id in offers:
                add_catalog_offer(fake, offer_id)
            fields: dict[str, Any] = {
                "db_path": str(tmp_path / "fleet.db"), "config_dir": str(tmp_path / "config"),
                "host": "127.0.0.1", "port": 0, "next_heartbeat_s": 1,
                "monitor_interval_s": 1.0, "terminate_grace_s": 3.0,
                "sim_time_scale": TIME_SCALE, "vast_image": IMAGE,
                # Tests reach loopback only: no registry is asked about the image.
                "preflight_registry": False, **settings,
            }
            config = Settings.from_env(
                {"VM_ADMIN_TOKEN": TOKEN, "VM_FLEET_SECRET": secrets.token_hex(32)}, **fields)
            provider = from_settings(
                config, environ={"VAST_API_KEY": FAKE_API_KEY, "VAST_URL": fake.url},
                home=tmp_path / "home")
            server = await start_server(config, provider)
            try:
                async with aiohttp.ClientSession() as session:
                    yield Fleet(fake, agents, server, Api(session, server.url))
            finally:
                await server.stop()
                await provider.close()
    finally:
        await agents.close()
    assert agents.leftovers() == [], "agent or simulator processes were left running"
