"""End to end against the fake vast.ai, with real agent processes.

The coordinator runs in-process (``start_server``) with the provider
``vast-manager serve --provider vast`` builds (``from_settings``: the API key
found as the CLI finds it, ``VAST_URL`` pointing at the fake). Every create on
the fake starts a real ``vast-agent`` on the simulated cuzk with the create's
environment plus what vast.ai sets inside a container (``CONTAINER_ID``, the
instance's own ``CONTAINER_API_KEY``, ``VAST_URL``); a destroy on the fake
stops it. Simulated time runs 240x faster, as in the demo.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.operations.deploy import agent_env, mint_agent_id
from vast_manager.coordinator.providers.vast.provider import (
    DEFAULT_ONSTART,
    VastProvider,
    from_settings,
)
from vast_manager.coordinator.settings import Settings
from vast_manager.protocol import signing

from support.fakevast import FAKE_API_KEY, FakeVast, SimAgents
from support.vast_fleet import (
    IMAGE,
    TIME_SCALE,
    TOKEN,
    Fleet,
    add_catalog_offer,
    catalog,
    until,
    vast_fleet,
)

SLOW_OFFER = 9006  # 1x RTX 5090 on 128 GB RAM at $0.69/h: far below its minimum rate
FAST_OFFER = 9003  # 1x RTX 5070 Ti at $0.19/h: well above it


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    # No work command feeds the fast host: it is kept proving, not stopped idle.
    async with vast_fleet(tmp_path, (SLOW_OFFER, FAST_OFFER),
                          idle_destroy_after_s=0.0) as running:
        yield running


async def test_slow_host_destroyed_and_blocklisted_fast_keeps_proving(fleet: Fleet) -> None:
    fake, agents, api = fleet.fake, fleet.agents, fleet.api
    slow = await api.ok("POST", "/api/deploy", {"offer_id": SLOW_OFFER, "max_dph_total": 0.69})
    fast = await api.ok("POST", "/api/deploy", {"offer_id": FAST_OFFER})
    slow_vid, fast_vid = slow["provider_instance_id"], fast["provider_instance_id"]

    # What vast.ai was asked for: our image, label, onstart, disk, the agent's env,
    # and never the account key.
    creates = {int(r.path.split("/")[-2]): r.body for r in fake.calls("PUT", "/api/v0/asks/")}
    assert set(creates) == {SLOW_OFFER, FAST_OFFER}
    fleet_id = fleet.server.settings.fleet_id
    for offer_id, answer in ((SLOW_OFFER, slow), (FAST_OFFER, fast)):
        body = creates[offer_id]
        assert body["image"] == IMAGE and body["onstart"] == DEFAULT_ONSTART
        assert body["disk"] == 250.0 and body["runtype"] == "ssh_direc ssh_proxy"
        assert body["label"] == f"vm:{fleet_id}:{answer['agent_id']}"
        assert body["env"]["VM_AGENT_ID"] == answer["agent_id"]
        assert body["env"]["VM_COORDINATOR_URL"] == fleet.server.url
        assert FAKE_API_KEY not in json.dumps(body)
    assert agents.alive(slow_vid) and agents.alive(fast_vid)
    assert agents.envs[slow_vid]["CONTAINER_ID"] == str(slow_vid)
    assert "VAST_API_KEY" not in agents.envs[slow_vid]

    async def state(instance_id: int) -> dict[str, Any]:
        data: dict[str, Any] = await api.ok("GET", f"/api/instances/{instance_id}")
        return data

    async def slow_destroyed() -> bool:
        return (await state(slow["instance_id"]))["state"] == "destroyed"

    await until(slow_destroyed, "the slow host to be destroyed")
    slow_row = await state(slow["instance_id"])
    assert "below the minimum" in slow_row["terminate_reason"]
    # Destroyed on vast.ai through DELETE: by the agent with its own instance key
    # (terminate directive) and/or by the coordinator with the account key.
    assert slow_vid not in fake.instances
    who = fake.destroys_of(slow_vid)
    assert who and set(who) <= {"instance", "account"}, who
    bad = await api.ok("GET", "/api/bad-hosts")
    assert [b["machine_id"] for b in bad] == [str(catalog(SLOW_OFFER)["machine_id"])]
    assert "below the minimum" in bad[0]["reason"]

    async def slow_processes_gone() -> bool:
        return not agents.leftovers(slow_vid)

    await until(slow_processes_gone, "the slow instance's processes to stop", 30)

    async def fast_proving() -> bool:
        row = await state(fast["instance_id"])
        return row["state"] == "proving" and row["rate_per_hour"] is not None

    await until(fast_proving, "the fast host to prove after its benchmark")
    fast_row = await state(fast["instance_id"])
    assert fast_row["rate_per_hour"] > fast_row["min_rate_per_hour"]
    first_seen = float(fast_row["last_seen"])

    async def more_heartbeats() -> bool:
        return float((await state(fast["instance_id"]))["last_seen"]) >= first_seen + 3

    # It keeps proving: heartbeats go on, the coordinator leaves it alone.
    await until(more_heartbeats, "more heartbeats from the fast host", 30)
    assert (await state(fast["instance_id"]))["state"] == "proving"
    assert fast_vid in fake.instances and agents.alive(fast_vid)
    assert fake.destroys_of(fast_vid) == []
    perf = await api.ok("GET", "/api/host-perf")
    assert str(catalog(FAST_OFFER)["machine_id"]) in {p["machine_id"] for p in perf}

    # The operator ends it; nothing is left on the fake vast.ai or on this machine.
    await api.ok("POST", f"/api/instances/{fast['instance_id']}/destroy")
    assert fake.destroys_of(fast_vid)[-1] == "account"
    assert fake.instances == {}
    await fake.settle()
    assert agents.leftovers() == []
    instances = await api.ok("GET", "/api/instances")
    assert {i["state"] for i in instances} == {"destroyed"}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_orphaned_agent_destroys_its_own_instance_with_its_instance_key(
    tmp_path: Path,
) -> None:
    """The agent alone (docs/policy.md): no verified answer for VM_ORPHAN_TIMEOUT before proving ->
    DELETE /api/v0/instances/$CONTAINER_ID/ with Bearer $CONTAINER_API_KEY."""
    agents = SimAgents(tmp_path / "instances", time_scale=TIME_SCALE,
                       extra_env={"VM_ORPHAN_TIMEOUT": "2"})
    try:
        async with FakeVast(launcher=agents) as fake:
            add_catalog_offer(fake, FAST_OFFER)
            provider = from_settings(
                Settings.from_env(
                    {"VM_ADMIN_TOKEN": TOKEN, "VM_FLEET_SECRET": "33" * 32},
                    config_dir=str(tmp_path / "config"), vast_image=IMAGE,
                ),
                environ={"VAST_API_KEY": FAKE_API_KEY, "VAST_URL": fake.url},
                home=tmp_path / "home",
            )
            assert isinstance(provider, VastProvider)
            try:
                agent_id = mint_agent_id()
                key = signing.derive_agent_key(bytes.fromhex("33" * 32), agent_id)
                offer = await provider.get_offer(FAST_OFFER)
                assert offer is not None
                # The coordinator this agent is told about never answers.
                created = await provider.create_instance(
                    offer, label=f"vm:fleet0001:{agent_id}",
                    env=agent_env(closed_port_url(), agent_id, key), disk_gb=250,
                )
                vid = created.instance_id
                inst_key = fake.instance_keys[vid]  # it dies with the instance
                assert agents.alive(vid)

                async def gone() -> bool:
                    return vid not in fake.instances

                await until(gone, "the orphaned agent to destroy its instance", 60)
                assert fake.destroys_of(vid) == ["instance"]
                (delete,) = fake.calls("DELETE", f"/api/v0/instances/{vid}/")
                assert delete.headers["Authorization"] == f"Bearer {inst_key}"
                await fake.settle()
                assert agents.leftovers(vid) == []
                log_text = agents.log_path(vid).read_text(errors="replace")
                assert "orphaned" in log_text
                assert inst_key not in log_text
                # It looked itself up after the delete: destroyed, confirmed.
                lookups = [r.method for r in fake.requests
                           if r.path == f"/api/v0/instances/{vid}/"]
                assert lookups[-2:] == ["DELETE", "GET"]
                assert FAKE_API_KEY not in log_text
            finally:
                await provider.close()
    finally:
        await agents.close()
    assert agents.leftovers() == []
