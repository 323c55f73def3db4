"""Agent self-destroy through vast.ai (instance key only) and the log redaction of secrets."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp import web

from agent.lifecycle import LogBuffer
from agent.selfdestroy import SelfDestroyError, destroy_vast_instance, self_destroy

API_KEY = "instance-key-" + "k" * 40


class FakeVast:
    """Answers DELETE /api/v0/instances/{id}/ with the statuses given, in turn."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.calls: list[tuple[str, str | None]] = []

    async def delete(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, request.headers.get("Authorization")))
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if status == 0:  # drop the connection mid-answer
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        return web.json_response({"success": status == 200}, status=status)

    async def start(self, aiohttp_server: Any) -> str:
        app = web.Application()
        app.router.add_delete("/api/v0/instances/{id}/", self.delete)
        server = await aiohttp_server(app)
        return str(server.make_url("")).rstrip("/")


async def no_sleep(_s: float) -> None:
    return None


async def test_delete_with_the_instance_key_retrying_transient_answers(
    aiohttp_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    vast = FakeVast(503, 0, 200)
    base = await vast.start(aiohttp_server)
    await destroy_vast_instance("4242", API_KEY, vast_url=base, sleep=no_sleep)
    assert vast.calls == [("/api/v0/instances/4242/", f"Bearer {API_KEY}")] * 3
    assert API_KEY not in caplog.text


async def test_404_means_already_gone(aiohttp_server: Any) -> None:
    vast = FakeVast(404)
    base = await vast.start(aiohttp_server)
    await destroy_vast_instance("4242", API_KEY, vast_url=base, sleep=no_sleep)
    assert len(vast.calls) == 1


async def test_refusal_and_persistent_failure_are_errors_without_the_key(
    aiohttp_server: Any,
) -> None:
    vast = FakeVast(401)
    base = await vast.start(aiohttp_server)
    with pytest.raises(SelfDestroyError) as info:
        await destroy_vast_instance("4242", API_KEY, vast_url=base, sleep=no_sleep)
    assert API_KEY not in str(info.value) and len(vast.calls) == 1
    vast.statuses = [502]
    with pytest.raises(SelfDestroyError):
        await destroy_vast_instance("4242", API_KEY, vast_url=base, attempts=3, sleep=no_sleep)
    assert len(vast.calls) == 4


async def test_local_provider_destroys_nothing_and_vast_needs_its_ids() -> None:
    await self_destroy("local", container_id=None, api_key=None)
    with pytest.raises(SelfDestroyError):
        await self_destroy("vast", container_id="1", api_key=None)


def test_shipped_logs_are_redacted() -> None:
    key_hex = "ab" * 32
    buf = LogBuffer([key_hex, API_KEY], clock=lambda: 1.0)
    buf.add("work", f"export VM_AGENT_KEY={key_hex} CONTAINER_API_KEY={API_KEY}")
    logger = logging.getLogger("agent.test_redaction")
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
