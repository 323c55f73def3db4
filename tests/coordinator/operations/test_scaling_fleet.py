"""Multi-GPU scaling end to end: real agents on the simulated cuzk and the fake NVML, deployed
through the local provider, get the scaling verdict their hardware earns."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider, marked_processes
from vast_manager.coordinator.web.server import start_server

from support.coord_support import ADMIN, make_settings

pytestmark = pytest.mark.slow

# machine_id -> expected bottleneck (coordinator/providers/local/catalog.py):
EXPECTED = {
    "41008": "cpu",  # 4x RTX 5060 Ti on an 8-core desktop CPU (the operator's 38.8/h box)
    "41009": "pcie",  # 4x RTX 3090 on PCIe Gen3 x4 risers
    "41007": "gpu",  # 2x RTX 4080 Super on a 64-thread EPYC with 512 GB
}


async def test_three_profiles_get_cpu_pcie_and_gpu_verdicts(tmp_path: Path) -> None:
    offers = [o for o in local_offers() if str(o["machine_id"]) in EXPECTED]
    provider = LocalProvider(tmp_path / "instances", time_scale=240.0, offers=offers)
    settings = make_settings(tmp_path, port=0, next_heartbeat_s=1, monitor_interval_s=1.0,
                             terminate_grace_s=3.0)
    server = await start_server(settings, provider)
    rows: list[dict[str, Any]] = []
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            for offer in offers:
                async with http.post(f"{server.url}/api/deploy",
                                     json={"offer_id": offer["id"]}) as resp:
                    assert resp.status == 200, await resp.text()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:
                async with http.get(f"{server.url}/api/scaling") as resp:
                    rows = await resp.json()
                if {str(r["machine_id"]) for r in rows} >= set(EXPECTED):
                    break
                await asyncio.sleep(0.5)
    finally:
        await provider.close()
        await server.stop()
    for instance_id in range(700001, 700001 + len(offers)):
        assert not marked_processes(f"{provider._token}:{instance_id}")
    verdicts = {str(r["machine_id"]): r for r in rows}
    assert set(verdicts) >= set(EXPECTED), f"scaling rows: {sorted(verdicts)}"
    for machine, kind in EXPECTED.items():
        row = verdicts[machine]
        assert row["bottleneck"] == kind, (machine, row["evidence"])
        # The evidence quotes measured numbers (percentages, GB/s, rates).
        assert any(re.search(r"\d+(\.\d+)?(%| GB/s)", e) for e in row["evidence"]), row
        # Read from the host's own telemetry, and labelled so wherever it is shown.
        assert all(e.startswith("host-reported telemetry: ") for e in row["evidence"]), row
    # The healthy 2-GPU box was kept and measured with one GPU too.
    assert verdicts["41007"]["efficiency"] is not None and verdicts["41007"]["efficiency"] > 0.9
