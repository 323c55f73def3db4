"""POST /api/production: any cluster's own counts under a token of their own. The admin
token is refused there, bad bodies are named in one sentence and nothing is taken, and the
same decisions read what is taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.decisions.states import State

from support.coord_support import ADMIN, Harness, start

TOKEN = "prod-7f3a9c1e5b2d8046"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def _proving(h: Harness, label: str) -> int:
    agent = await h.issue(label, min_rate=50.0)
    assert (await agent.hello())[0] == 200
    await agent.heartbeat("proving")
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    ident = int(inst["id"])
    await h.store.write(lambda tx: tx.instances.update(
        ident, rate_per_hour=100.0, dph_total=0.5, state_since=h.clock() - 3600))
    return ident


async def test_the_reported_counts_are_judged_like_the_clusters(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path, production_token=TOKEN)
    low, fine = await _proving(h, "low"), await _proving(h, "fine")
    status, data = await h.admin("POST", "/api/production", {
        "window_s": 3600, "instances": [
            {"instance_id": low, "completed": 10, "failed": 5,
             "last_error": "PSProve: proof failed VerifySeal"},
            {"node_name": f"vm-{fine}", "completed": 95, "failed": 0}]}, headers=BEARER)
    assert status == 200, data
    assert data["instances"] == 2
    await h.core.monitor.tick()
    status, rows = await h.admin("GET", "/api/instances")
    by_id = {r["id"]: r for r in rows}
    assert by_id[low]["delivered_rate_per_hour"] == pytest.approx(10.0)
    assert by_id[low]["delivered_source"] == "cluster"
    assert by_id[low]["last_task_error"] == "PSProve: proof failed VerifySeal"
    assert by_id[low]["state"] == State.TERMINATING
    assert by_id[fine]["delivered_rate_per_hour"] == pytest.approx(95.0)
    assert by_id[fine]["state"] == State.PROVING


async def test_only_the_production_token_opens_it(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, production_token=TOKEN)
    ident = await _proving(h, "rig")
    body = {"window_s": 3600, "instances": [{"instance_id": ident, "completed": 1, "failed": 0}]}
    status, data = await h.admin("POST", "/api/production", body)  # the admin token
    assert status == 401 and "admin token is not accepted" in data["message"]
    status, data = await h.admin("POST", "/api/production", body, headers={})
    assert status == 401
    # The production token opens nothing else.
    status, _ = await h.admin("GET", "/api/instances", headers=BEARER)
    assert status == 401
    assert h.core.monitor.cluster.reports == {}

    off = await start(aiohttp_client, tmp_path / "off")
    status, data = await off.admin("POST", "/api/production", body, headers=BEARER)
    assert status == 403 and "VM_PRODUCTION_TOKEN" in data["message"]


@pytest.mark.parametrize(("body", "words"), [
    ({"instances": []}, "'window_s' must be seconds"),
    ({"window_s": 3600, "instances": []}, "'instances' must be a list of 1"),
    ({"window_s": 10, "instances": [{}]}, "'window_s' must be seconds from 60"),
    ({"window_s": 3600, "instances": [{"completed": 1, "failed": 0}]},
     "must name its instance by 'instance_id' or 'node_name'"),
    ({"window_s": 3600, "instances": [{"instance_id": 999, "completed": 1, "failed": 0}]},
     "instance 999, which is not one of ours"),
    ({"window_s": 3600, "instances": [{"node_name": "rig-1", "completed": 1, "failed": 0}]},
     "'node_name' must be a node name the coordinator gave"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": -1, "failed": 0}]},
     "'completed' must be a whole number"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": 1, "failed": True}]},
     "'failed' must be a whole number"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": 1, "failed": 0,
                                       "last_error": "x" * 501}]}, "'last_error' must be text"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": 1, "failed": 0,
                                       "last_error": "\x1b[31mred"}]}, "'last_error' must be"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": 1, "failed": 0},
                                      {"node_name": "vm-1", "completed": 2, "failed": 0}]},
     "names instance 1 a second time"),
    ({"window_s": 3600, "instances": [{"instance_id": 1, "completed": 1, "failed": 0}],
      "price": 3}, "Field 'price' is not accepted"),
])
async def test_bad_bodies_are_named_and_nothing_is_taken(
    aiohttp_client: Any, tmp_path: Path, body: dict[str, Any], words: str
) -> None:
    h = await start(aiohttp_client, tmp_path, production_token=TOKEN)
    await _proving(h, "rig")  # instance 1
    status, data = await h.admin("POST", "/api/production", body, headers=BEARER)
    assert status == 400, data
    assert words in data["message"]
    assert data["message"].count(".") >= 1 and "\n" not in data["message"]
    assert h.core.monitor.cluster.reports == {}
    # Still serving.
    status, _ = await h.admin("GET", "/api/fleet", headers=ADMIN)
    assert status == 200


async def test_a_body_that_is_not_json_is_refused(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, production_token=TOKEN)
    resp = await h.client.post("/api/production", data=b"{not json", headers=BEARER)
    assert resp.status == 400
    assert "not valid JSON" in (await resp.json())["message"]
