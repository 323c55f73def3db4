"""The autopilot end to end: real agents on the simulated cuzk, rented through the local
provider by the autopilot alone, within its caps, every action logged with its reason,
and stopped by one call. Every rate here is simulated."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.providers.local.catalog import catalog_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider, marked_processes
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.server import start_server

from support.coord_support import ADMIN, make_settings

pytestmark = pytest.mark.slow

CAPS = {"autopilot": True, "autopilot_target_rate_per_hour": 150.0,
        "autopilot_max_dph_total": 1.0, "autopilot_max_instances": 3,
        "autopilot_interval_s": 1.0}


def peak_billing(rows: list[dict[str, Any]], now: float) -> tuple[float, int]:
    """The most $/h and instances that ever billed at once (from created to destroyed)."""
    spans = [(float(r["created_at"]), float(r["destroyed_at"] or now), float(r["dph_total"]))
             for r in rows]
    peak_dph, peak_n = 0.0, 0
    for start, _, _ in spans:
        live = [s for s in spans if s[0] <= start < s[1]]
        peak_dph = max(peak_dph, sum(s[2] for s in live))
        peak_n = max(peak_n, len(live))
    return peak_dph, peak_n


async def test_the_autopilot_rents_real_agents_within_its_caps(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "instances", time_scale=240.0, offers=catalog_offers())
    settings = make_settings(tmp_path, port=0, next_heartbeat_s=1, monitor_interval_s=1.0,
                             terminate_grace_s=3.0, model_refit_interval_s=1.0,
                             idle_destroy_after_s=0.0,  # no work command: kept idle
                             **CAPS)
    server = await start_server(settings, provider)
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            async def get(path: str) -> Any:
                async with http.get(server.url + path) as resp:
                    assert resp.status == 200, await resp.text()
                    return await resp.json()

            deadline = time.monotonic() + 150
            proving: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                rows = await get("/api/instances")
                proving = [r for r in rows if r["state"] == "proving" and r["rate_per_hour"]]
                if proving:
                    break
                await asyncio.sleep(0.5)
            assert proving, "no instance the autopilot rented reached proving"
            async with http.post(server.url + "/api/autopilot/stop",
                                 json={"reason": "end of the test"}) as resp:
                assert resp.status == 200
            view = await get("/api/autopilot?limit=1000")
            count = len(await get("/api/instances"))
            await asyncio.sleep(3)  # three intervals: nothing more is rented
            assert len(await get("/api/instances")) == count
    finally:
        await provider.close()
        await server.stop()
    for instance_id in range(700001, 700001 + count):
        assert not marked_processes(f"{provider._token}:{instance_id}")
    assert view["state"] == "stopped"
    deploys = [e for e in view["events"] if e["data"]["action"] == "deploy"]
    assert len(deploys) == count >= 1
    assert all(e["instance_id"] and "break-even" in e["reason"] for e in deploys)
    store = Store(settings.db_path)
    try:
        peak_dph, peak_n = peak_billing(store.list_instances(), time.time())
    finally:
        store.close()
    assert peak_dph <= CAPS["autopilot_max_dph_total"] + 1e-9
    assert peak_n <= CAPS["autopilot_max_instances"]
