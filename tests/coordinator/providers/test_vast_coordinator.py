"""The coordinator app with the real VastProvider against the fake vast.ai on loopback.

Deploys and their refusals, reconciliation, contention, ranking, and vast.ai read as
vast.ai means it (docs/vast.md): statuses that never run, failed creates that made an
instance, the instance's share of its host, a refused key. The clock is injected and
the monitor is driven round by round (``tick``), so nothing sleeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.providers.vast.client import VastClient
from vast_manager.coordinator.providers.vast.provider import DEFAULT_ONSTART, VastProvider

from support.coord_support import Harness, result_msg, start
from support.fakes_provider import FakeClock
from support.fakevast import FAKE_API_KEY, OCI_START_FAILURE, FakeVast

IMAGE = "ghcr.io/example/vast-agent:test"
OTHER_AGENT = "ag_" + "f" * 20


async def no_sleep(_seconds: float) -> None:
    return None


@dataclass
class Env:
    h: Harness
    fake: FakeVast
    clock: FakeClock

    @property
    def fleet_id(self) -> str:
        return self.h.core.settings.fleet_id

    def creates(self) -> list[Any]:
        return self.fake.calls("PUT", "/api/v0/asks/")

    async def tick(self) -> None:
        await self.h.core.monitor.tick()

    async def deploy(self, offer_id: int, **body: Any) -> tuple[int, Any]:
        return await self.h.admin("POST", "/api/deploy", {"offer_id": offer_id, **body})

    async def deployed(self, offer_id: int) -> dict[str, Any]:
        status, data = await self.deploy(offer_id)
        assert status == 200, data
        return dict(data)

    def row(self, instance_id: int) -> dict[str, Any]:
        row = self.h.store.get_instance(instance_id)
        assert row is not None
        return dict(row)

    def event_kinds(self, instance_id: int | None = None) -> list[str]:
        return [e["kind"] for e in self.h.store.events(instance_id)]


@pytest.fixture
async def env(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[Env]:
    clock = FakeClock()
    async with FakeVast(clock=clock) as fake:
        fake.add_offer(9101, 51001, dph_total=0.42)
        fake.add_offer(9102, 51001, dph_total=0.40)  # a second offer on the same machine
        fake.add_offer(9103, 51003, dph_total=0.30)
        fake.add_offer(9104, 51004, dph_total=3.50)
        provider = VastProvider(
            VastClient(FAKE_API_KEY, fake.url, sleep=no_sleep, rng=lambda: 0.0),
            image=IMAGE, onstart=DEFAULT_ONSTART,
        )
        try:
            h = await start(aiohttp_client, tmp_path, provider=provider,  # type: ignore[arg-type]
                            clock=clock, unowned_grace_s=600.0, max_deploy_dph_total=2.0)
            yield Env(h, fake, clock)
        finally:
            await provider.close()


# --- 410 no_such_ask at create -> 409 offer_gone -----------------------------------


async def test_no_such_ask_at_create_is_409_offer_gone(env: Env) -> None:
    env.fake.gone_at_create.add(9103)  # a racer rents it between our re-read and create
    status, data = await env.deploy(9103)
    assert (status, data["error"]) == (409, "offer_gone"), data
    (create,) = env.creates()
    assert create.path == "/api/v0/asks/9103/"
    (row,) = env.h.store.list_instances()
    assert row["state"] == "destroyed" and row["provider_instance_id"] is None
    agent = env.h.store.get_agent(row["agent_id"])
    assert agent is not None and agent["revoked"] == 1


# --- reconciliation -------------------------------------------------------------------


async def test_leaked_instance_is_destroyed_after_the_grace_not_before(env: Env) -> None:
    leaked = env.fake.add_instance(
        31_000_001, label=f"vm:{env.fleet_id}:{OTHER_AGENT}", machine_id=7,
        start_date=env.clock.now,
    )
    await env.tick()
    env.clock.advance(599)
    await env.tick()
    assert env.fake.destroys_of(leaked["id"]) == []
    env.clock.advance(2)
    await env.tick()
    assert env.fake.destroys_of(leaked["id"]) == ["account"]
    assert leaked["id"] not in env.fake.instances
    assert "destroy_leaked" in env.event_kinds()


@pytest.mark.parametrize("status", ["exited", "unknown", "offline", "stopped"])
async def test_an_instance_that_will_never_run_is_destroyed_in_the_second_round(
    env: Env, status: str
) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    await env.tick()
    assert env.fake.destroys_of(vid) == []
    env.fake.set_status(vid, status)
    await env.tick()
    assert env.fake.destroys_of(vid) == []  # seen once: one odd answer ends nothing
    await env.tick()
    assert env.fake.destroys_of(vid) == ["account"]
    # Destroyed means: vast.ai said so, and a lookup after it no longer found it.
    mine = [r.method for r in env.fake.requests if r.path == f"/api/v0/instances/{vid}/"]
    assert mine == ["DELETE", "GET"] and vid not in env.fake.instances
    row = env.row(d["instance_id"])  # the outcome, with its reason
    assert row["state"] == "destroyed"
    assert f"vast.ai status {status}" in row["terminate_reason"]
    assert "seen in 2 rounds in a row" in row["terminate_reason"]
    (event,) = [e for e in env.h.store.events(d["instance_id"]) if e["kind"] == "destroy"]
    assert f"vast.ai status {status}" in event["reason"] and "destroy_dead" in event["reason"]
    agent = env.h.store.get_agent(d["agent_id"])
    assert agent is not None and agent["revoked"] == 1
    await env.tick()  # idempotent: nothing more to do
    assert env.fake.destroys_of(vid) == ["account"]


async def test_vanished_instance_is_marked(env: Env) -> None:
    d = await env.deployed(9103)
    agent = env.h.agent(d["agent_id"])
    assert (await agent.hello())[0] == 200
    assert (await agent.heartbeat("proving"))[0] == 200
    del env.fake.instances[d["provider_instance_id"]]  # gone without our destroy
    await env.tick()
    assert env.row(d["instance_id"])["state"] == "proving"  # just created: list may lag
    env.clock.advance(601)
    assert (await agent.heartbeat("proving"))[0] == 200
    await env.tick()
    # One list that misses it may be a hiccup: a healthy instance is not ended on it.
    assert env.row(d["instance_id"])["state"] == "proving"
    env.clock.advance(60)
    assert (await agent.heartbeat("proving"))[0] == 200
    await env.tick()
    row = env.row(d["instance_id"])
    assert row["state"] == "vanished" and "no longer listed" in row["terminate_reason"]
    assert env.fake.calls("DELETE") == []
    # Its machine is free again for a deploy.
    assert (await env.deploy(9103))[0] == 409  # the fake still shows the offer rented
    env.fake.offers[9103].update(rented=False, rentable=True)
    assert (await env.deploy(9103))[0] == 200


async def test_phase_timeout_destroys_through_vast(env: Env) -> None:
    d = await env.deployed(9103)
    env.clock.advance(901)  # no hello for 15 minutes
    await env.tick()
    assert env.fake.destroys_of(d["provider_instance_id"]) == ["account"]
    row = env.row(d["instance_id"])
    assert row["state"] == "destroyed" and "no hello" in row["terminate_reason"]


# --- refused deploys, another fleet's instances -----------------------------------------


async def test_deploy_onto_a_bad_host_is_refused_without_create(env: Env) -> None:
    status, _ = await env.h.admin("POST", "/api/bad-hosts",
                                  {"machine_id": 51001, "reason": "measured 12/h"})
    assert status == 200
    status, data = await env.deploy(9101)
    assert (status, data["error"]) == (409, "bad_host"), data
    assert "measured 12/h" in data["message"]
    assert env.creates() == []
    assert env.h.store.list_instances() == []


async def test_deploy_onto_a_busy_machine_is_refused_without_create(env: Env) -> None:
    await env.deployed(9101)
    status, data = await env.deploy(9102)  # another offer on machine 51001
    assert (status, data["error"]) == (409, "machine_busy"), data
    assert [c.path for c in env.creates()] == ["/api/v0/asks/9101/"]


async def test_gone_and_overpriced_offers_are_refused_without_create(env: Env) -> None:
    env.fake.remove_offer(9103)
    status, data = await env.deploy(9103)
    assert (status, data["error"]) == (409, "offer_gone")
    status, data = await env.deploy(9104)  # $3.50/h, above the $2/h ceiling
    assert (status, data["error"]) == (409, "price_changed")
    status, data = await env.deploy(9101, max_dph_total=0.41)  # now $0.42/h
    assert (status, data["error"]) == (409, "price_changed")
    assert env.creates() == []


async def test_instances_without_our_fleet_id_survive_reconciliation(env: Env) -> None:
    old = env.clock.now - 100_000
    others = [
        env.fake.add_instance(31_000_101, label=f"vm:otherflt:{OTHER_AGENT}",
                              actual_status="exited", start_date=old),
        env.fake.add_instance(31_000_102, label=f"vm:otherflt:{OTHER_AGENT}", start_date=old),
        env.fake.add_instance(31_000_103, label=None, actual_status="offline", start_date=old),
        env.fake.add_instance(31_000_104, label="my jupyter box", start_date=old),
        env.fake.add_instance(31_000_105, label=f"vm:{env.fleet_id}x:{OTHER_AGENT}",
                              start_date=old),
    ]
    ours = env.fake.add_instance(31_000_106, label=f"vm:{env.fleet_id}:{OTHER_AGENT}",
                                 start_date=old)
    for _ in range(3):
        await env.tick()
        env.clock.advance(3600)
    assert env.fake.destroys_of(ours["id"]) == ["account"]
    assert [r.path for r in env.fake.calls("DELETE")] == [f"/api/v0/instances/{ours['id']}/"]
    assert all(o["id"] in env.fake.instances for o in others)
    assert env.fake.calls("PUT", "/api/v0/instances/") == []  # not even relabelled


# --- the monitor adopts an instance whose create answer was lost --------------------------


async def test_record_without_instance_id_adopts_the_labelled_instance(env: Env) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    # As if the coordinator stopped between vast.ai's create and recording its answer.
    await env.h.store.write(
        lambda tx: tx.instances.update(d["instance_id"], provider_instance_id=None)
    )
    await env.tick()
    assert env.row(d["instance_id"])["provider_instance_id"] == vid
    assert "adopted" in env.event_kinds(d["instance_id"])
    env.clock.advance(901)  # never says hello: destroyed on vast.ai, not leaked
    await env.tick()
    assert env.fake.destroys_of(vid) == ["account"]


async def test_abandoned_record_still_on_vast_is_destroyed_once_aged(env: Env) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    # As the deploy records a create whose outcome it could not learn.
    await env.h.store.write(lambda tx: tx.instances.update(
        d["instance_id"], provider_instance_id=None, state="destroyed",
        destroyed_at=env.clock.now, terminate_reason="create outcome unknown",
    ))
    await env.tick()
    assert env.fake.destroys_of(vid) == []
    env.clock.advance(601)
    await env.tick()
    assert env.fake.destroys_of(vid) == ["account"]
    assert vid not in env.fake.instances


# --- contention -----------------------------------------------------------------------


async def test_result_measured_beside_another_of_ours_is_contended(env: Env) -> None:
    d = await env.deployed(9101)
    agent = env.h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("benchmarking")
    # A second instance of ours on the same machine (a doubly sold offer, say),
    # running during the benchmark and reconciled away before the result lands.
    twin_id = await env.h.store.write(lambda tx: int(tx.instances.add({
        "agent_id": None, "label": "twin", "kind": "deployed", "provider": "vast",
        "machine_id": "51001", "state": "destroyed", "hello_at": env.clock.now,
        "destroyed_at": env.clock.now + 30, "created_at": env.clock.now,
        "state_since": env.clock.now, "updated_at": env.clock.now,
    })))
    env.clock.advance(1200)
    status, data = await agent.post("/v1/result", result_msg("r-1", proofs=12,
                                                             wall_seconds=1100.0))
    assert status == 200, data
    (result,) = env.h.store.results_for_instance(d["instance_id"])
    assert "contended" in result["flags"].split(",")
    assert f"#{twin_id}" in result["flag_reasons_json"]
    assert result["counts_for_host_perf"] == 0
    assert env.h.store.host_perf() == []
    # Not judged on a contended measurement: kept.
    assert data["directive"]["action"] != "terminate"


async def test_result_alone_on_its_machine_counts(env: Env) -> None:
    d = await env.deployed(9101)
    agent = env.h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("benchmarking")
    # Ours on the same machine, but destroyed before this benchmark began.
    await env.h.store.write(lambda tx: tx.instances.add({
        "agent_id": None, "label": "earlier", "kind": "deployed", "provider": "vast",
        "machine_id": "51001", "state": "destroyed", "hello_at": env.clock.now - 5000,
        "destroyed_at": env.clock.now - 100, "created_at": env.clock.now - 5000,
        "state_since": env.clock.now - 100, "updated_at": env.clock.now - 100,
    }))
    env.clock.advance(1200)
    status, data = await agent.post("/v1/result", result_msg("r-1", proofs=12,
                                                             wall_seconds=1100.0))
    assert status == 200, data
    (result,) = env.h.store.results_for_instance(d["instance_id"])
    assert result["flags"] == "" and result["counts_for_host_perf"] == 1
    (perf,) = env.h.store.host_perf()
    assert perf["machine_id"] == "51001"


# --- offers ranked by the rate model, through GET /api/offers ----------------------------


def _reference_rate(basis: str) -> float:
    return float(basis.split("vs reference ")[1].split("/h")[0])


async def test_offers_ranked_by_the_rate_model_from_the_fleets_results(env: Env) -> None:
    fake = env.fake
    for offer_id in list(fake.offers):
        fake.remove_offer(offer_id)
    deployed = fake.add_offer(9201, 61001, gpu_name="RTX 4090", dph_total=0.42)
    fake.add_offer(9202, 61002, gpu_name="RTX 4090", dph_total=0.45)  # the same, unmeasured
    fake.add_offer(9204, 61004, gpu_name="RTX 5090", dph_total=0.60)  # no 5090 measured
    fake.add_offer(9205, 61005, gpu_name="RTX 4090", dph_total=0.20)  # on bad_hosts
    await env.h.store.write(lambda tx: tx.blocklist.add("61005", reason="slow",
                                                        source="operator", now=env.clock.now,
                                                        expires_at=env.clock.now + 3600))
    # A benchmark of machine 61001 through the real path: its result is kept with the
    # offer it was deployed from, and the model learns from it.
    d = await env.deployed(9201)
    agent = env.h.agent(d["agent_id"])
    await agent.hello()
    await agent.heartbeat("benchmarking")
    env.clock.advance(800)
    status, data = await agent.post("/v1/result", result_msg("r-1", proofs=12,
                                                             wall_seconds=720.0))
    assert status == 200, data
    (m,) = env.h.store.measurements()
    assert m["source"] == "fleet" and m["machine_id"] == "61001"
    assert m["rate_per_hour"] == pytest.approx(60.0)
    fake.add_offer(9203, 61001, gpu_name="RTX 4090", dph_total=0.42)  # listed again
    kept = orjson.loads(m["offer_json"])  # the offer as deployed, whole
    for name in ("machine_id", "gpu_name", "num_gpus", "cpu_name", "cpu_cores",
                 "cpu_cores_effective", "cpu_ram", "pcie_bw", "inet_down", "dph_total"):
        assert kept[name] == deployed[name], name
    await env.h.core.models.refresh()

    status, rows = await env.h.admin("GET", "/api/offers")
    assert status == 200, rows
    by_id = {r["id"]: r for r in rows}
    assert [r["id"] for r in rows][-1] == 9205 and by_id[9205]["bad_host"] is True
    for r in rows:
        low, mid, high = (r["predicted_rate_low"], r["predicted_rate_per_hour"],
                          r["predicted_rate_high"])
        assert low < mid < high
        # The full figure: dph_total (rent and storage) and the setup download's bandwidth.
        assert r["full_dph"] > r["dph_total"]
        assert r["usd_per_hour"]["bandwidth"] > 0
        assert r["predicted_usd_per_proof"] == pytest.approx(r["full_dph"] / mid, abs=1e-6)
        # The factors multiply the reference host's rate into the prediction.
        product = math.prod(f["factor"] for f in r["prediction_factors"])
        assert product * _reference_rate(r["prediction_basis"]) == pytest.approx(mid, rel=0.02)
        # After the served model's label (which model answered), the interval.
        basis = re.sub(r"^\[[^\]]*\] ", "", r["prediction_basis"])
        assert basis.startswith(f"{low:.0f}-{high:.0f}/h (80%)")

    own, twin, unseen = by_id[9203], by_id[9202], by_id[9204]
    assert own["known"] is True and twin["known"] is False and unseen["known"] is False
    # Its own run pins the measured machine near its rate; a twin of it is less certain,
    # a GPU model nobody measured less still.
    assert own["predicted_rate_low"] < 60.0 < own["predicted_rate_high"]
    assert "this machine x" in own["prediction_basis"]
    widths = [r["predicted_rate_high"] / r["predicted_rate_low"] for r in (own, twin, unseen)]
    assert widths == sorted(widths)
    assert "no RTX 5090 measured yet" in unseen["prediction_basis"]


async def test_vanished_instance_listed_again_is_destroyed(env: Env) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    agent = env.h.agent(d["agent_id"])
    assert (await agent.hello())[0] == 200
    hidden = env.fake.instances.pop(vid)
    env.clock.advance(601)
    await env.tick()
    env.clock.advance(60)
    await env.tick()
    assert env.row(d["instance_id"])["state"] == "vanished"
    env.fake.instances[vid] = hidden  # it was there after all: it bills, nobody watches
    env.clock.advance(60)
    await env.tick()
    assert env.fake.destroys_of(vid), "a vanished instance listed again must be destroyed"


# --- vast.ai as vast.ai means it: dead statuses, failed creates, shares, keys ------------


async def test_created_with_a_start_failure_is_destroyed_and_the_destroy_confirmed(
    env: Env,
) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    env.fake.set_status(vid, "created", OCI_START_FAILURE)
    await env.tick()
    await env.tick()
    assert env.fake.destroys_of(vid) == ["account"]
    # Destroyed means: vast.ai said so, and a lookup after it no longer found it.
    after = [r for r in env.fake.requests if r.path == f"/api/v0/instances/{vid}/"]
    assert [r.method for r in after][-2:] == ["DELETE", "GET"]
    row = env.row(d["instance_id"])
    assert row["state"] == "destroyed"
    assert "created, start failed: Error response from daemon" in row["terminate_reason"]
    (event,) = [e for e in env.h.store.events(d["instance_id"]) if e["kind"] == "destroy"]
    assert "OCI runtime create failed" in event["reason"] and "destroy_dead" in event["reason"]


async def test_one_odd_answer_ends_nothing(env: Env) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    env.fake.set_status(vid, "unknown")
    await env.tick()
    env.fake.set_status(vid, "running")  # it was a hiccup
    await env.tick()
    env.fake.set_status(vid, "unknown")
    await env.tick()
    assert env.fake.destroys_of(vid) == []
    assert env.row(d["instance_id"])["state"] == "deploying"


async def test_an_unconfirmed_destroy_is_recorded_and_sent_again(env: Env) -> None:
    d = await env.deployed(9103)
    vid = d["provider_instance_id"]
    env.fake.set_status(vid, "exited")
    env.fake.keep_after_destroy = 1  # {"success": true}, yet the lookup still finds it
    await env.tick()
    await env.tick()
    row = env.row(d["instance_id"])
    assert row["state"] == "terminating" and vid in env.fake.instances
    (failed,) = [e for e in env.h.store.events(d["instance_id"]) if e["kind"] == "destroy_failed"]
    assert "still listed" in failed["reason"]
    env.clock.advance(60)
    await env.tick()
    assert env.fake.destroys_of(vid) == ["account", "account"]
    assert env.row(d["instance_id"])["state"] == "destroyed" and vid not in env.fake.instances


@pytest.mark.parametrize("fail_status", [200, 400])
async def test_a_failed_create_that_made_an_instance_is_destroyed_and_recorded(
    env: Env, fail_status: int
) -> None:
    env.fake.create_fails_with_instance = 1
    env.fake.create_fail_status = fail_status
    status, data = await env.deploy(9103)
    assert (status, data["error"]) == (502, "provider_error"), data
    (row,) = env.h.store.list_instances()
    vid = row["provider_instance_id"]
    assert vid is not None and f"made instance {vid}" in data["message"]
    assert "being destroyed" in data["message"]
    assert row["state"] == "destroyed" and f"left vast instance {vid}" in row["terminate_reason"]
    assert env.fake.destroys_of(vid) == ["account"] and vid not in env.fake.instances
    kinds = env.event_kinds(row["id"])
    assert kinds[-2:] == ["deploy_failed", "destroy"], kinds
    agent = env.h.store.get_agent(row["agent_id"])
    assert agent is not None and agent["revoked"] == 1


async def test_a_failed_create_whose_destroy_fails_is_finished_by_the_monitor(env: Env) -> None:
    env.fake.create_fails_with_instance = 1
    env.fake.refuse_destroys = 1
    status, _ = await env.deploy(9103)
    assert status == 502
    (row,) = env.h.store.list_instances()
    vid = row["provider_instance_id"]
    assert row["state"] == "terminating" and vid in env.fake.instances  # recorded, not lost
    env.clock.advance(60)
    await env.tick()
    assert vid not in env.fake.instances
    assert env.row(row["id"])["state"] == "destroyed"


async def test_the_instance_share_is_judged_not_the_host(env: Env) -> None:
    fake = env.fake
    # 1 GPU of an 8-GPU 512 GB host (256 logical cores: 32 for the instance).
    fake.add_slice(9301, 62001, num_gpus=1, host_gpus=8, host_cpu_cores=256,
                   host_cpu_ram_mb=515000, dph_total=0.35)
    # A whole 2-GPU host with 256 GB.
    fake.add_offer(9302, 62002, num_gpus=2, cpu_cores=64, cpu_cores_effective=64.0,
                   cpu_ram=257000, dph_total=0.80)
    status, rows = await env.h.admin("GET", "/api/offers")
    assert status == 200, rows
    by_id = {r["id"]: r for r in rows}
    small, whole = by_id[9301], by_id[9302]
    assert small["too_small"] is True and small["instance_ram_gb"] == 64.4
    assert small["instance_cpu_cores"] == 32.0
    assert small["instance_share"] == "515 GB x 32/256 cores = 64.4 GB"
    assert "would get about 64 GB of RAM (515 GB x 32/256 cores = 64.4 GB), below the 128 GB" \
        in small["too_small_reason"]
    assert small["predicted_rate_per_hour"] is None
    assert whole["too_small"] is False and whole["instance_ram_gb"] == 257.0
    assert whole["too_small_reason"] is None
    assert [r["id"] for r in rows].index(9301) > [r["id"] for r in rows].index(9302)

    status, data = await env.deploy(9301)
    assert (status, data["error"]) == (409, "too_small"), data
    assert data["message"].startswith("Offer 9301 is refused: its instance would get about 64 GB")
    assert data["message"].endswith("(VM_MIN_INSTANCE_RAM_GB).")
    assert env.creates() == []
    status, data = await env.deploy(9302)
    assert status == 200, data
    row = env.row(data["instance_id"])
    assert (row["cpu_cores"], row["cpu_cores_effective"], row["instance_ram_gb"]) == (
        64.0, 64.0, 257.0)


async def test_an_invalid_key_reaches_the_operator_as_an_auth_error(env: Env) -> None:
    env.fake.api_key = "the-key-vast-ai-has-now"
    status, data = await env.h.admin("GET", "/api/offers")
    assert status == 502, data
    assert "refused the API key from VAST_API_KEY" in data["message"]
    assert "HTTP 404 auth_error: Invalid user key" in data["message"]
