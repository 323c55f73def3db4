"""Whose fault, end to end on the fake vast.ai with real agents (docs/policy.md, "Blame"):
a setup error every agent meets (a missing C1 input) strikes no host, pauses deploys with
one alert naming the C1, and deploys resume once the operator fixed it and says so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli

from support.vast_fleet import TOKEN, Fleet, until, vast_fleet

OFFERS = (9001, 9002, 9003)  # three machines: 41001, 41002, 41003
MISSING_C1 = "/nonexistent/zk/c1.json"


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with vast_fleet(tmp_path, OFFERS, extra_env={"VM_C1_PATH": MISSING_C1},
                          terminate_grace_s=1.0) as running:
        yield running


async def test_a_missing_c1_everywhere_strikes_no_host_and_pauses_deploys(fleet: Fleet) -> None:
    api, agents = fleet.api, fleet.agents
    deployed = await asyncio.gather(*(api.ok("POST", "/api/deploy", {"offer_id": o})
                                      for o in OFFERS))
    ids = [d["instance_id"] for d in deployed]

    async def all_destroyed() -> bool:
        rows = [await api.ok("GET", f"/api/instances/{i}") for i in ids]
        return all(r["state"] == "destroyed" for r in rows)

    await until(all_destroyed, "the three failed instances to be destroyed", 120)
    for instance_id in ids:
        row = await api.ok("GET", f"/api/instances/{instance_id}")
        assert MISSING_C1 in row["terminate_reason"], row["terminate_reason"]

    # No host is blamed: no block, no strike counted, every failure the operator's.
    assert await api.ok("GET", "/api/bad-hosts") == []
    events = await api.ok("GET", "/api/events?limit=500")
    assert [e for e in events if e["kind"] in ("strike", "bad_host")] == []
    assert sum(e["kind"] == "blame" for e in events) == 3

    # One alert, naming the C1 and the fix.
    alerts = [e for e in events if e["kind"] == "fault"]
    assert len(alerts) == 1, alerts
    assert MISSING_C1 in alerts[0]["reason"] and "VM_C1_PATH" in alerts[0]["reason"]
    (fault,) = await api.ok("GET", "/api/faults")
    assert fault["open"] and fault["fault"] == "operator" and fault["failures"] == 3
    assert fault["machines"] == ["41001", "41002", "41003"]
    fleet_view = await api.ok("GET", "/api/fleet")
    assert MISSING_C1 in fleet_view["deploys_paused"]

    # Deploys are paused, naming the cause.
    status, refused = await api.call("POST", "/api/deploy", {"offer_id": 9003})
    assert status == 409 and refused["error"] == "fault_paused", refused
    assert MISSING_C1 in refused["message"]

    # The CLI says the same: the fault, its cause and its fix.
    cli_env = {"VM_URL": fleet.server.url, "VM_ADMIN_TOKEN": TOKEN, "COLUMNS": "200"}
    listed = await asyncio.to_thread(CliRunner().invoke, cli, ["faults", "list"], env=cli_env)
    assert listed.exit_code == 0 and "[OPEN] operator's, 3 failure(s)" in listed.output
    assert MISSING_C1 in listed.output and f"faults clear {fault['id']}" in listed.output

    # The operator fixes the C1 (the image's default again) and says so: deploys resume.
    agents.extra_env.pop("VM_C1_PATH")
    cleared = await api.ok("POST", f"/api/faults/{fault['id']}/clear",
                           {"note": "C1 in the image"})
    assert "resume" in cleared["message"]
    assert (await api.ok("GET", "/api/fleet"))["deploys_paused"] is None
    again = await api.ok("POST", "/api/deploy", {"offer_id": 9003})

    async def past_its_inputs() -> bool:
        row: dict[str, Any] = await api.ok("GET", f"/api/instances/{again['instance_id']}")
        return row["state"] in ("warming", "benchmarking", "proving")

    await until(past_its_inputs, "the fixed deploy to get past its input checks", 120)
    await api.ok("POST", f"/api/instances/{again['instance_id']}/destroy")
    await fleet.fake.settle()


async def test_an_operator_given_minimum_judges_that_deploy_only(tmp_path: Path) -> None:
    """`deploy 9003 --min-rate 1000` (a typo): the instance ends, the machine does not."""
    async with vast_fleet(tmp_path, (9003,), terminate_grace_s=1.0) as fleet:
        api = fleet.api
        typo = await api.ok("POST", "/api/deploy", {"offer_id": 9003, "min_rate_per_hour": 1000})

        async def ended() -> bool:
            row = await api.ok("GET", f"/api/instances/{typo['instance_id']}")
            return row["state"] == "destroyed"

        await until(ended, "the deploy judged on 1000/h to end", 120)
        row = await api.ok("GET", f"/api/instances/{typo['instance_id']}")
        assert "below the minimum" in row["terminate_reason"]
        assert "not blocked" in row["terminate_reason"], row["terminate_reason"]
        assert await api.ok("GET", "/api/bad-hosts") == []
        # The machine is as deployable as before.
        again = await api.ok("POST", "/api/deploy", {"offer_id": 9003})
        await api.ok("POST", f"/api/instances/{again['instance_id']}/destroy")
        await fleet.fake.settle()
