"""VastProvider against the stateful fake vast.ai (tests/support/fakevast.py) over loopback."""

from __future__ import annotations

import random
import string
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.base import (
    AuthError,
    CreateFailed,
    DestroyUnconfirmed,
    OfferGone,
    Provider,
    ProviderError,
)
from vast_manager.coordinator.providers.vast.client import VastClient
from vast_manager.coordinator.providers.vast.filters import DEFAULT_FILTER, build_search_query
from vast_manager.coordinator.providers.vast.provider import (
    MAX_ONSTART_CHARS,
    VastProvider,
    fit_onstart,
)

from support.fakevast import FAKE_API_KEY, OCI_START_FAILURE, FakeVast
from support.tools import require_tool

AGENT_ID = "ag_0123456789abcdef0123"
AGENT_KEY = "ab" * 32
LABEL = f"vm:f1e2d3c4:{AGENT_ID}"
ONSTART = "#!/bin/sh\nexec vast-agent run\n"


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@dataclass
class Env:
    fake: FakeVast
    provider: VastProvider
    sleeps: Sleeps


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    now = [1_700_000_000.0]
    async with FakeVast(clock=lambda: now[0]) as fake:
        sleeps = Sleeps()
        client = VastClient(FAKE_API_KEY, fake.url, sleep=sleeps, rng=lambda: 0.0)
        provider = VastProvider(
            client,
            image="ghcr.io/example/vast-agent:1",
            onstart=ONSTART,
            disk_gb=300,
            extra_env={"VM_COORDINATOR_URL": "https://coord.example:8443", "TZ": "UTC"},
        )
        try:
            yield Env(fake, provider, sleeps)
        finally:
            await provider.close()


def agent_env() -> dict[str, str]:
    return {"VM_AGENT_ID": AGENT_ID, "VM_AGENT_KEY": AGENT_KEY, "TZ": "Europe/Paris"}


def test_vast_provider_satisfies_the_protocol() -> None:
    def accepts(p: Provider) -> str:
        return p.name

    assert accepts(VastProvider.__new__(VastProvider)) == "vast"


async def test_search_default_filter(env: Env) -> None:
    fake = env.fake
    fake.add_offer(1, 100)  # matches
    fake.add_offer(2, 200, cpu_ram=120000)  # too little RAM even for the whole host
    fake.add_offer(3, 300, dph_total=1.4)  # too expensive
    fake.add_offer(4, 400, rented=True, rentable=False)  # taken
    fake.add_offer(5, 500, cuda_max_good=12.4)  # old driver
    fake.add_offer(6, 600, verified=False)  # unverified
    fake.add_offer(7, 700, gpu_name="RTX 5090", gpu_ram=32607, score=250.0)  # matches
    # 1 of 8 GPUs of a 96-core host: 12 cores for the instance (the filter asks > 25).
    fake.add_slice(8, 800, num_gpus=1, host_gpus=8, host_cpu_cores=96, host_cpu_ram_mb=515000)
    offers = await env.provider.search_offers()
    assert [o.id for o in offers] == [7, 1]  # score descending, as the CLI orders
    assert offers[0].reliability == 0.995  # filled from reliability2
    (call,) = fake.calls("POST", "/api/v0/bundles/")
    assert call.body == build_search_query(DEFAULT_FILTER, storage_gb=300)
    assert call.body["allocated_storage"] == 300.0
    assert call.headers["Authorization"] == f"Bearer {FAKE_API_KEY}"


async def test_search_custom_filter(env: Env) -> None:
    env.fake.add_offer(1, 100)
    env.fake.add_offer(2, 200, gpu_name="RTX 5060 Ti", num_gpus=2)
    offers = await env.provider.search_offers("gpu_name=RTX_5060_Ti num_gpus>=2")
    assert [o.id for o in offers] == [2]


async def test_a_malformed_offer_is_skipped_with_its_reason_and_the_rest_kept(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    # vast.ai's numbers may come as text (kept: "3.1" is a clock) but a bool is never one.
    env.fake.add_offer(1, 100, cpu_ghz="3.1")
    env.fake.add_offer(2, 200, cpu_cores=True)
    with caplog.at_level("WARNING"):
        offers = await env.provider.search_offers("gpu_name=RTX_4090")
    assert [(o.id, o.cpu_ghz) for o in offers] == [(1, 3.1)]
    assert offers[0].raw["cpu_ghz"] == "3.1"  # what goes back out is what came in
    assert "vast.ai search: offer 2 skipped: cpu_cores must be a number, not True." in caplog.text


async def test_get_offer_rereads_and_sees_sold_offers(env: Env) -> None:
    fake = env.fake
    fake.add_offer(11, 1100, verified=False)
    offer = await env.provider.get_offer(11)
    assert offer is not None and offer.machine_id == "1100"  # unverified still found
    (call,) = fake.calls("POST", "/api/v0/bundles/")
    assert call.body["id"] == {"eq": "11"}
    assert call.body["rentable"] == {"eq": True}
    assert "verified" not in call.body

    await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    assert await env.provider.get_offer(11) is None  # sold
    assert await env.provider.get_offer(999) is None  # never existed
    fake.add_offer(12, 1200)
    fake.remove_offer(12)
    assert await env.provider.get_offer(12) is None  # gone


async def test_create_sends_the_cli_body(env: Env) -> None:
    fake = env.fake
    offer = fake.add_offer(21, 2100, dph_total=0.61)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=320)
    (call,) = fake.calls("PUT", "/api/v0/asks/21/")
    assert call.headers["Authorization"] == f"Bearer {FAKE_API_KEY}"
    assert call.body == {
        "client_id": "me",
        "image": "ghcr.io/example/vast-agent:1",
        "env": {
            "VM_COORDINATOR_URL": "https://coord.example:8443",
            "TZ": "Europe/Paris",  # the agent's own env wins over extras
            "VM_AGENT_ID": AGENT_ID,
            "VM_AGENT_KEY": AGENT_KEY,
        },
        "price": None,
        "disk": 320.0,
        "label": LABEL,
        "extra": None,
        "onstart": ONSTART,
        "image_login": None,
        "python_utf8": False,
        "lang_utf8": False,
        "use_jupyter_lab": False,
        "jupyter_dir": None,
        "force": False,
        "cancel_unavail": True,
        "template_hash_id": None,
        "user": None,
        "runtype": "ssh_direc ssh_proxy",
    }
    row = fake.instances[created.instance_id]
    assert row["label"] == LABEL and row["machine_id"] == 2100
    assert "instkey" not in created.message
    assert str(created.instance_id) in created.message


async def test_args_runtype_keeps_the_image_entrypoint(env: Env) -> None:
    provider = VastProvider(env.provider.client, image="img:1", onstart=ONSTART, runtype="args")
    body = provider.create_body(label=LABEL, env={}, disk_gb=100)
    assert body["runtype"] == "args"
    assert body["onstart"] is None
    assert "args" not in body


def test_onstart_up_to_4048_characters_is_sent_as_it_is() -> None:
    script = "#!/bin/bash\n" + "x" * (MAX_ONSTART_CHARS - 12)
    assert len(script) == MAX_ONSTART_CHARS
    assert fit_onstart(script) == script


def test_longer_onstart_is_sent_gzip_base64_and_runs_the_same(tmp_path: Path) -> None:
    # A script of 6000 characters whose output proves every line of it ran.
    lines = ["#!/bin/bash", "set -eu"]
    while sum(len(x) + 1 for x in lines) < 6000:
        lines.append(f"echo line-{len(lines)}")
    script = "\n".join(lines) + "\n"
    assert len(script) > MAX_ONSTART_CHARS
    sent = fit_onstart(script)
    assert len(sent) <= MAX_ONSTART_CHARS and "base64 -d | gunzip" in sent
    require_tool("bash", "it runs the wrapper")
    require_tool("gunzip", "the wrapper unpacks with it")
    ran = subprocess.run(["bash", "-c", sent], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    direct = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == direct.stdout and ran.stdout.count("\n") == len(lines) - 2
    assert list(tmp_path.iterdir()) == []  # the unpacked copy is removed
    failing = fit_onstart(script + "exit 7\n")
    assert subprocess.run(["bash", "-c", failing], capture_output=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}).returncode == 7


def test_onstart_too_long_even_compressed_is_refused() -> None:
    rng = random.Random(7)  # random text does not compress
    script = "".join(rng.choice(string.ascii_letters) for _ in range(8000))
    client = VastClient("k", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"8000 characters and \d+ even compressed, above "
                                         r"vast.ai's 4048"):
        VastProvider(client, image="img", onstart=script)


async def test_the_fake_refuses_an_onstart_over_4048_characters(env: Env) -> None:
    # What the provider prevents, vast.ai refuses: the fake as the real API.
    offer = env.fake.add_offer(22, 2200)
    body = env.provider.create_body(label=LABEL, env=agent_env(), disk_gb=300)
    body["onstart"] = "x" * (MAX_ONSTART_CHARS + 1)
    with pytest.raises(ProviderError, match="400 invalid_args: Invalid args: 'onstart'"):
        await env.provider.client.create_instance(22, body)
    assert env.fake.instances == {} and offer["rented"] is False


async def test_create_on_sold_offer_is_offer_gone_and_double_sale(env: Env) -> None:
    fake = env.fake
    offer = fake.add_offer(31, 3100)
    await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    with pytest.raises(OfferGone, match="no_such_ask"):
        await env.provider.create_instance(
            parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    # vast.ai sells one offer twice to racing callers: the fake can too.
    fake.sell_twice.add(31)
    await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    assert sum(1 for r in fake.instances.values() if r["ask_id"] == 31) == 2
    fake.remove_offer(31)
    with pytest.raises(OfferGone):
        await env.provider.create_instance(
            parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)


async def test_create_rides_out_429(env: Env) -> None:
    offer = env.fake.add_offer(41, 4100)
    env.fake.fail_next = 2
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    assert created.instance_id in env.fake.instances
    assert len(env.fake.calls("PUT", "/api/v0/asks/41/")) == 3
    assert len(env.sleeps.delays) == 2


async def test_persistent_429_is_rate_limited(env: Env) -> None:
    env.fake.fail_next = 100
    with pytest.raises(ProviderError, match="rate limited"):
        await env.provider.search_offers()
    assert len(env.fake.requests) == env.provider.client.max_attempts


async def test_destroy_is_idempotent(env: Env) -> None:
    fake = env.fake
    offer = fake.add_offer(51, 5100)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    await env.provider.destroy_instance(created.instance_id)
    assert created.instance_id not in fake.instances
    await env.provider.destroy_instance(created.instance_id)  # already gone: fine
    deletes = fake.calls("DELETE", f"/api/v0/instances/{created.instance_id}/")
    assert len(deletes) == 2
    # The first delete was verified by a show.
    assert fake.calls("GET", f"/api/v0/instances/{created.instance_id}/")
    # The machine is offered again.
    assert await env.provider.get_offer(51) is not None


async def test_list_instances_paginates_and_hides_secrets(env: Env) -> None:
    fake = env.fake
    fake.page_size = 3
    for i in range(7):
        offer = fake.add_offer(60 + i, 6000 + i)
        await env.provider.create_instance(
            parse_offer(offer), label=f"vm:f1e2d3c4:ag_{i:020x}", env=agent_env(), disk_gb=300
        )
    rows = await env.provider.list_instances()
    assert len(rows) == 7
    assert sorted(r["id"] for r in rows) == sorted(fake.instances)
    pages = fake.calls("GET", "/api/v1/instances/")
    assert len(pages) == 3
    assert "after_token" not in pages[0].query
    assert pages[1].query["after_token"] and pages[2].query["after_token"]
    for row in rows:
        assert "extra_env" not in row and "onstart" not in row
        assert AGENT_KEY not in repr(row)


async def test_key_never_in_urls(env: Env) -> None:
    offer = env.fake.add_offer(71, 7100)
    await env.provider.search_offers()
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    await env.provider.list_instances()
    await env.provider.destroy_instance(created.instance_id)
    for req in env.fake.requests:
        assert FAKE_API_KEY not in req.path
        assert all(FAKE_API_KEY not in v for v in req.query.values())


async def test_exited_status_visible_in_list(env: Env) -> None:
    offer = env.fake.add_offer(81, 8100)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    env.fake.set_status(created.instance_id, "exited")
    (row,) = await env.provider.list_instances()
    assert row["actual_status"] == "exited"
    assert row["label"] == LABEL


async def test_create_answer_lost_is_recovered_by_label(env: Env) -> None:
    offer = env.fake.add_offer(91, 9100)
    env.fake.lose_create_answers = 1
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    assert env.fake.instances[created.instance_id]["label"] == LABEL
    assert "found by its label" in created.message
    assert len(env.fake.calls("PUT", "/api/v0/asks/91/")) == 1  # never sent twice


async def test_create_failed_before_processing_is_outcome_unknown(env: Env) -> None:
    offer = env.fake.add_offer(92, 9200)
    env.fake.fail_next = 1
    env.fake.fail_status = 502
    with pytest.raises(ProviderError, match="outcome unknown"):
        await env.provider.create_instance(
            parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    assert env.fake.instances == {}
    assert len(env.fake.calls("PUT", "/api/v0/asks/92/")) == 1


async def test_a_create_that_fails_with_a_new_contract_names_the_instance(env: Env) -> None:
    offer = env.fake.add_offer(93, 9300)
    env.fake.create_fails_with_instance = 1
    with pytest.raises(CreateFailed) as err:
        await env.provider.create_instance(
            parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    iid = err.value.instance_id
    row = env.fake.instances[iid]  # it exists, stopped, and bills
    assert row["actual_status"] == "stopped" and row["label"] == LABEL
    await env.provider.destroy_instance(iid)
    assert iid not in env.fake.instances


async def test_destroy_is_confirmed_or_an_error(env: Env) -> None:
    offer = env.fake.add_offer(94, 9400)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    iid = created.instance_id
    env.fake.keep_after_destroy = 1  # accepted, still there
    with pytest.raises(DestroyUnconfirmed):
        await env.provider.destroy_instance(iid)
    env.fake.refuse_destroys = 1  # 200 success: false
    with pytest.raises(ProviderError, match="destroy_refused"):
        await env.provider.destroy_instance(iid)
    assert iid in env.fake.instances
    await env.provider.destroy_instance(iid)
    assert iid not in env.fake.instances


async def test_a_404_that_does_not_say_gone_confirms_no_destroy(env: Env) -> None:
    offer = env.fake.add_offer(97, 9700)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    iid = created.instance_id
    # Something in between answers the delete and the lookup with a bare 404 page: the
    # instance is still there, so the destroy is not done.
    env.fake.fail_next, env.fake.fail_status = 2, 404
    with pytest.raises(ProviderError, match="not read as gone"):
        await env.provider.destroy_instance(iid)
    assert iid in env.fake.instances
    await env.provider.destroy_instance(iid)  # sent again (the monitor's next round)
    assert iid not in env.fake.instances
    assert env.fake.destroys_of(iid) == ["account", "account"]


async def test_an_invalid_key_is_an_auth_error_on_every_call(env: Env) -> None:
    env.fake.add_offer(95, 9500)
    env.fake.api_key = "another-key"  # ours is now wrong
    with pytest.raises(AuthError, match=r"VAST_API_KEY \(POST /api/v0/bundles/ answered HTTP 404"):
        await env.provider.search_offers()
    with pytest.raises(AuthError, match="HTTP 404 auth_error: Invalid user key"):
        await env.provider.list_instances()
    with pytest.raises(AuthError, match="HTTP 401"):
        await env.provider.destroy_instance(12345)


async def test_statuses_and_messages_as_vast_shows_them(env: Env) -> None:
    offer = env.fake.add_offer(96, 9600)
    created = await env.provider.create_instance(
        parse_offer(offer), label=LABEL, env=agent_env(), disk_gb=300)
    env.fake.set_status(created.instance_id, "created", OCI_START_FAILURE)
    (row,) = await env.provider.list_instances()
    assert (row["actual_status"], row["status_msg"]) == ("created", OCI_START_FAILURE)
    # Stopping keeps it stopped: vast.ai never turns stopped into exited.
    await env.provider.client._request(
        "PUT", f"/api/v0/instances/{created.instance_id}/", json_body={"state": "stopped"})
    (row,) = await env.provider.list_instances()
    assert (row["actual_status"], row["intended_status"]) == ("stopped", "stopped")
    with pytest.raises(ValueError):
        env.fake.set_status(created.instance_id, "dead")
