"""A fleet of 9 real agents (the simulated local fleet) talks to the
coordinator only through the fault proxy (drops, delays, resets mid-request and
mid-response, duplicated requests) and still completes its lifecycle, with every result
it produced stored exactly once."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web.server import start_server

from support.coord_support import ADMIN, ADMIN_TOKEN, SECRET_HEX
from support.fault_support import (
    TEST_MARKER_ENV,
    audit_results,
    fleet_settled,
    gone_instances,
    kill_marked,
    spooled_results,
)
from support.faultproxy import FaultProxy, FaultRates

RATES = FaultRates(drop=0.04, delay=0.08, reset_request=0.04, reset_response=0.04,
                   duplicate=0.04, max_delay_s=0.4)
TIME_SCALE = 240.0


async def api(session: aiohttp.ClientSession, url: str, method: str, path: str,
              body: Any = None) -> Any:
    async with session.request(method, url + path, json=body, headers=ADMIN) as resp:
        data = await resp.json(content_type=None)
        assert resp.status == 200, (method, path, resp.status, data)
        return data


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_fleet_through_fault_proxy_stores_every_result_once(tmp_path: Path) -> None:
    marker = f"fleet-{os.getpid()}-{time.monotonic_ns()}"
    proxy = await FaultProxy(RATES, seed=20240605).start()
    settings = Settings.from_env(
        {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_FLEET_SECRET": SECRET_HEX},
        db_path=str(tmp_path / "fleet.db"), host="127.0.0.1", port=0,
        next_heartbeat_s=1, monitor_interval_s=1.0, terminate_grace_s=3.0,
        config_dir=str(tmp_path / "config"), sim_time_scale=TIME_SCALE,
        public_url=proxy.url,  # what agents are told: every agent request crosses the proxy
    )
    provider = LocalProvider(tmp_path / "instances", time_scale=TIME_SCALE,
                             agent_env={TEST_MARKER_ENV: marker})
    server = await start_server(settings, provider)
    proxy.set_upstream(server.settings.port)
    try:
        async with aiohttp.ClientSession() as session:
            for o in local_offers():
                await api(session, server.url, "POST", "/api/deploy", {"offer_id": o["id"]})
            deadline = time.monotonic() + 300
            while True:
                instances = await api(session, server.url, "GET", "/api/instances")
                scaling = await api(session, server.url, "GET", "/api/scaling")
                if fleet_settled(instances, scaling) and not spooled_results(
                        tmp_path / "instances", instances):
                    break
                assert time.monotonic() < deadline, [
                    (i["id"], i["state"], i["phase"]) for i in instances]
                await asyncio.sleep(0.5)
        assert len(instances) >= 8
        assert all(i["state"] not in ("failed", "lost", "vanished") for i in instances), [
            (i["id"], i["state"], i["terminate_reason"]) for i in instances]
        totals = audit_results(tmp_path / "instances", tmp_path / "fleet.db",
                               gone_instances(instances))
        print(f"fleet through the fault proxy: {totals}; proxy {dict(proxy.counts)}")
        assert totals["agents"] == len(instances)
        # Every agent measured its host: a result of its own, or the early verdict that
        # stopped its benchmark.
        assert totals["without_result"] == 0, totals
        assert totals["produced"] + totals["stopped_early"] >= len(instances), totals
        for fate in ("drop", "delay", "reset_request", "reset_response", "duplicate"):
            assert proxy.counts[fate] > 0, (fate, proxy.counts)
    finally:
        await provider.close()
        await server.stop()
        await proxy.close()
        kill_marked(marker)
