"""Deploy: every refusal happens before the provider is asked to create anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vast_manager.coordinator.providers.base import OfferGone, ProviderError
from vast_manager.protocol import signing

from support.coord_support import SECRET_HEX, Harness, agent_key, start
from support.fakes_provider import FakeProvider, offer


async def deploy(h: Harness, **body: Any) -> tuple[int, Any]:
    return await h.admin("POST", "/api/deploy", body)


async def test_deploy_creates_labelled_instance_with_agent_env(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    provider = FakeProvider([offer(9001, 4242, dph_total=0.4, num_gpus=2)])
    h = await start(aiohttp_client, tmp_path, provider=provider, public_url="https://c.example")
    status, data = await deploy(h, offer_id=9001, disk_gb=80)
    assert status == 200, data
    assert data["ok"] is True
    (created,) = provider.created
    fleet_id = signing.fleet_id(bytes.fromhex(SECRET_HEX))
    assert created["label"] == f"vm:{fleet_id}:{data['agent_id']}"
    assert created["disk_gb"] == 80
    assert created["env"] == {
        "VM_COORDINATOR_URL": "https://c.example",
        "VM_AGENT_ID": data["agent_id"],
        "VM_AGENT_KEY": agent_key(data["agent_id"]).hex(),
        # The Curio node name its work command runs under (docs/operations.md).
        "CURIO_NODE_NAME": f"vm-{data['instance_id']}",
    }
    assert signing.is_agent_id(data["agent_id"])
    inst = h.store.get_instance(data["instance_id"])
    assert inst is not None
    assert (inst["machine_id"], inst["num_gpus"], inst["dph_total"], inst["offer_id"]) == (
        "4242",
        2,
        0.4,
        9001,
    )
    assert inst["provider_instance_id"] == data["provider_instance_id"]
    assert inst["state"] == "deploying"
    assert inst["min_rate_per_hour"] == 50.0
    # The key is never stored.
    dump = "\n".join(str(r) for r in h.store.db.query("select * from events"))
    assert agent_key(data["agent_id"]).hex() not in dump


async def refused(h: Harness, body: dict[str, Any], code: str) -> None:
    before = h.store.count_rows()
    status, data = await deploy(h, **body)
    assert (status, data["error"]) == (409, code), data
    assert h.provider.created == []
    assert h.store.count_rows() == before


async def test_offer_gone(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider([]))
    await refused(h, {"offer_id": 1}, "offer_gone")


async def test_bad_host_refused(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider([offer(1, 77)]))
    await h.admin("POST", "/api/bad-hosts", {"machine_id": "77", "reason": "slow"})
    await refused(h, {"offer_id": 1}, "bad_host")


async def test_machine_busy_refused(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 77), offer(2, 77)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    assert (await deploy(h, offer_id=1))[0] == 200
    provider.created.clear()
    await refused(h, {"offer_id": 2}, "machine_busy")


async def test_price_changed_refused(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 77, dph_total=0.5), offer(2, 78, dph_total=9.0)])
    h = await start(aiohttp_client, tmp_path, provider=provider, max_deploy_dph_total=2.0)
    await refused(h, {"offer_id": 1, "max_dph_total": 0.45}, "price_changed")
    await refused(h, {"offer_id": 2}, "price_changed")


async def test_offer_sold_during_create(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 77)])
    provider.create_error = OfferGone("sold")
    h = await start(aiohttp_client, tmp_path, provider=provider)
    status, data = await deploy(h, offer_id=1)
    assert (status, data["error"]) == (409, "offer_gone")
    (inst,) = h.store.list_instances()
    assert inst["state"] == "destroyed"
    agent = h.store.get_agent(inst["agent_id"])
    assert agent is not None and agent["revoked"] == 1
    # The machine is free again.
    provider.create_error = None
    assert (await deploy(h, offer_id=1))[0] == 200


async def test_provider_failure_is_502(aiohttp_client: Any, tmp_path: Path) -> None:
    provider = FakeProvider([offer(1, 77)])
    provider.create_error = ProviderError("vast.ai is down")
    h = await start(aiohttp_client, tmp_path, provider=provider)
    status, data = await deploy(h, offer_id=1)
    assert (status, data["error"]) == (502, "provider_error")
    assert "vast.ai is down" in data["message"]


async def test_explicit_min_rate(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider([offer(1, 77)]))
    status, data = await deploy(h, offer_id=1, min_rate_per_hour=12.5)
    assert status == 200
    inst = h.store.get_instance(data["instance_id"])
    assert inst is not None and inst["min_rate_per_hour"] == 12.5


async def test_a_deploy_waits_for_the_replica_and_is_not_made_without_it(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """With a replica (docs/operations.md, "Losing the coordinator") the new agent's rows
    are in it before the provider is asked: a restored coordinator knows every key."""
    from vast_manager.coordinator.store.replica import ReplicaError

    provider = FakeProvider([offer(9001, 4242), offer(9002, 4343)])
    h = await start(aiohttp_client, tmp_path, provider=provider)
    seen: list[tuple[int, int]] = []  # (instances recorded, creates made) at each sync

    async def durable() -> None:
        rows = h.store.db.query("select count(*) as n from instances")
        seen.append((next(iter(rows))["n"], len(provider.created)))

    h.core.deployer.durable = durable
    status, data = await deploy(h, offer_id=9001)
    assert status == 200, data
    assert seen == [(1, 0)]  # recorded, synced, then created

    async def unconfirmed() -> None:
        raise ReplicaError("TimeoutError")

    h.core.deployer.durable = unconfirmed
    status, data = await deploy(h, offer_id=9002)
    assert status != 200 and "replica did not confirm" in data["message"], data
    assert len(provider.created) == 1  # nothing rented without its key replicated
