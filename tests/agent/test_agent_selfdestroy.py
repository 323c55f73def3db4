"""Agent self-destroy through the fake vast.ai (instance key only): vast.ai's ``success``,
the lookup that confirms it, retries with backoff, refused keys, and the exit status of
an agent whose instance survives. Log redaction of secrets."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from vast_manager.agent.config import AgentConfig, load_config
from vast_manager.agent.lifecycle import EXIT_DESTROY_FAILED, EXIT_ORPHANED, Agent, LogBuffer
from vast_manager.agent.selfdestroy import (
    InstanceSurvived,
    SelfDestroyError,
    destroy_vast_instance,
    self_destroy,
)

from support.fakevast import FakeVast

API_KEY = "instance-key-" + "k" * 40


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
async def fake() -> AsyncIterator[FakeVast]:
    async with FakeVast() as f:
        yield f


async def instance(fake: FakeVast) -> tuple[str, str]:
    """A rented instance and its own key (CONTAINER_ID, CONTAINER_API_KEY)."""
    fake.add_offer(9001, 41001)
    assert fake.url
    async with aiohttp.ClientSession() as s, s.put(
        f"{fake.url}/api/v0/asks/9001/", json={"image": "img:1", "runtype": "args"},
        headers={"Authorization": f"Bearer {fake.api_key}"},
    ) as resp:
        answer = await resp.json()
    iid = int(answer["new_contract"])
    return str(iid), fake.instance_keys[iid]


async def test_destroy_with_the_instance_key_is_confirmed_by_a_lookup(
    fake: FakeVast, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cid, key = await instance(fake)
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    assert int(cid) not in fake.instances
    assert fake.destroys_of(int(cid)) == ["instance"]
    # The lookup came after the delete (the key died with the instance: counted as gone).
    assert [r.method for r in fake.requests[-2:]] == ["DELETE", "GET"]
    assert key not in caplog.text


async def test_a_key_that_outlives_its_instance_sees_it_gone(fake: FakeVast) -> None:
    fake.instance_key_outlives_instance = True
    cid, key = await instance(fake)
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    (lookup,) = fake.calls("GET", f"/api/v0/instances/{cid}/")
    assert lookup.query == {"owner": "me"}


async def test_success_false_is_not_a_destroy_and_is_retried_with_backoff(
    fake: FakeVast,
) -> None:
    cid, key = await instance(fake)
    fake.refuse_destroys = 2  # 200 {"success": false}: the instance stays
    sleeps = Sleeps()
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=sleeps)
    assert fake.destroys_of(int(cid)) == ["instance"] * 3
    assert int(cid) not in fake.instances
    assert len(sleeps.delays) == 2 and sleeps.delays[1] > sleeps.delays[0] * 0.5
    # A refusal is read as one: the delete is sent again, and only the accepted one is
    # looked up.
    mine = [r.method for r in fake.requests if r.path == f"/api/v0/instances/{cid}/"]
    assert mine == ["DELETE", "DELETE", "DELETE", "GET"]


async def test_a_404_that_does_not_say_gone_is_not_gone(fake: FakeVast) -> None:
    cid, key = await instance(fake)
    # Something in between answers the delete and its lookup with a bare 404 page.
    fake.fail_next, fake.fail_status = 2, 404
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    assert fake.destroys_of(int(cid)) == ["instance"] * 2  # sent again, then confirmed
    assert int(cid) not in fake.instances


async def test_accepted_but_still_listed_is_sent_again(fake: FakeVast) -> None:
    cid, key = await instance(fake)
    fake.keep_after_destroy = 1  # {"success": true}, yet the lookup still finds it
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    assert fake.destroys_of(int(cid)) == ["instance"] * 2
    assert int(cid) not in fake.instances


async def test_an_instance_that_survives_every_attempt_raises_instance_survived(
    fake: FakeVast,
) -> None:
    cid, key = await instance(fake)
    fake.refuse_destroys = 100
    with pytest.raises(InstanceSurvived, match=f"instance {cid} is still there after 3"):
        await destroy_vast_instance(cid, key, vast_url=fake.url, attempts=3, sleep=Sleeps())
    assert int(cid) in fake.instances
    assert len(fake.destroys_of(int(cid))) == 3


@pytest.mark.parametrize("plain_text", [False, True], ids=["detail-json", "plain-text"])
async def test_429_in_either_shape_is_retried(fake: FakeVast, plain_text: bool) -> None:
    cid, key = await instance(fake)
    fake.fail_next, fake.rate_limit_plain_text = 2, plain_text
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    assert int(cid) not in fake.instances


async def test_a_refused_key_is_an_error_at_once_without_the_key(fake: FakeVast) -> None:
    cid, _ = await instance(fake)
    wrong = "instance-key-" + "w" * 40
    with pytest.raises(SelfDestroyError) as info:
        await destroy_vast_instance(cid, wrong, vast_url=fake.url, sleep=Sleeps())
    assert not isinstance(info.value, InstanceSurvived)
    assert "CONTAINER_API_KEY" in str(info.value) and "Invalid user key" in str(info.value)
    assert wrong not in str(info.value)
    assert len(fake.calls("DELETE")) == 1  # retrying cannot help
    assert int(cid) in fake.instances


async def test_already_gone_is_success(fake: FakeVast) -> None:
    fake.instance_key_outlives_instance = True
    cid, key = await instance(fake)
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    # Again: 404 not_found from the delete, then the lookup agrees.
    await destroy_vast_instance(cid, key, vast_url=fake.url, sleep=Sleeps())
    assert len(fake.calls("DELETE")) == 2


async def test_local_provider_destroys_nothing_and_vast_needs_its_ids() -> None:
    await self_destroy("local", container_id=None, api_key=None)
    with pytest.raises(SelfDestroyError):
        await self_destroy("vast", container_id="1", api_key=None)


class _Host:
    """The least a sampler must do for an agent that never gets past hello."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def open_window(self) -> int:
        return 0

    def roll_window(self, wid: int) -> None:
        return None

    def close_window(self, wid: int) -> None:
        return None

    def set_cuzk_status_url(self, url: str | None) -> None: ...


def _orphan_config(tmp_path: Path, fake: FakeVast, cid: str, key: str) -> AgentConfig:
    # The coordinator is a closed port: no answer ever comes, so the orphan rule fires.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return load_config({
        "VM_COORDINATOR_URL": f"http://127.0.0.1:{port}",
        "VM_AGENT_ID": "ag_" + "0" * 20,
        "VM_AGENT_KEY": "ab" * 32,
        "VM_STATE_DIR": str(tmp_path / "state"),
        "VM_PARAMS_DIR": str(tmp_path / "params"),
        "VM_ORPHAN_TIMEOUT": "1",
        "VM_PROVIDER": "vast",
        "CONTAINER_ID": cid,
        "CONTAINER_API_KEY": key,
        "VAST_URL": fake.url,
    })


@pytest.mark.parametrize("survives", [False, True], ids=["destroyed", "survives"])
async def test_the_agent_exits_with_its_own_status_when_the_instance_survives(
    tmp_path: Path, fake: FakeVast, survives: bool
) -> None:
    from vast_manager.protocol.messages import HostInfo

    cid, key = await instance(fake)
    if survives:
        fake.refuse_destroys = 100
    config = _orphan_config(tmp_path, fake, cid, key)

    async def destroyer(cfg: AgentConfig) -> None:  # the real one, without real sleeps
        assert cfg.container_id and cfg.container_api_key
        await destroy_vast_instance(cfg.container_id, cfg.container_api_key,
                                    vast_url=cfg.vast_url, attempts=3, sleep=Sleeps())

    host = HostInfo("h", "cpu", 2, 1, 10**9, None, None, [])
    agent = Agent(config, sampler_factory=lambda cfg: (host, _Host()),  # type: ignore[arg-type,return-value]
                  destroyer=destroyer)
    code = await asyncio.wait_for(agent.run(), 60)
    assert code == (EXIT_DESTROY_FAILED if survives else EXIT_ORPHANED)
    assert (int(cid) in fake.instances) is survives


def test_shipped_logs_are_redacted() -> None:
    key_hex = "ab" * 32
    buf = LogBuffer([key_hex, API_KEY], clock=lambda: 1.0)
    buf.add("work", f"export VM_AGENT_KEY={key_hex} CONTAINER_API_KEY={API_KEY}")
    logger = logging.getLogger("vast_manager.agent.test_redaction")
    logger.addHandler(buf)
    logger.setLevel(logging.INFO)
    try:
        logger.info("leaked %s", API_KEY)
    finally:
        logger.removeHandler(buf)
    lines = buf.take()
    assert len(lines) == 2
    assert all(key_hex not in x.text and API_KEY not in x.text for x in lines)
    assert "[redacted]" in lines[0].text

