"""The fake vast.ai's 2026 endpoints against what their sources say (docs/vast.md): vast-cli's
``vastai/api/price_increase.py`` (55679830), the OpenAPI description (c6246226), the
``vastai`` 1.9.1 client and the docs' webhook receiver, copied here as they are written."""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from support.fakevast import FAKE_API_KEY, FakeVast

#: vast-cli ``list_pending``'s documented row keys.
PENDING_ROW_KEYS = {
    "pending_price_increase_id", "contract_id", "host_id", "new_gpu_costpersec",
    "new_disk_ram_costpersec", "new_bwu_cost", "new_bwd_cost", "new_platform_fee",
    "old_gpu_costpersec", "old_disk_ram_costpersec", "old_bwu_cost", "old_bwd_cost",
    "old_platform_fee", "contract_end_date", "ask_end_date", "created_at",
}


def verify_vast_signature(headers: Any, raw_body: bytes, webhook_secret: str) -> bool:
    """notification-webhooks.mdx, "Verify Signatures", as written there."""
    timestamp = headers.get("X-Vast-Timestamp", "")
    signature = headers.get("X-Vast-Signature-256", "")
    if not timestamp or not signature.startswith("sha256="):
        return False
    try:
        age = abs(time.time() - int(timestamp))
    except ValueError:
        return False
    if age > 300:
        return False
    signed = timestamp.encode("utf-8") + b"." + raw_body
    expected = hmac.new(webhook_secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(signature, f"sha256={expected}")


async def call(fake: FakeVast, method: str, path: str, body: Any = None) -> tuple[int, Any,
                                                                               Any]:
    async with aiohttp.ClientSession() as s, s.request(
            method, fake.url + path, json=body,
            headers={"Authorization": f"Bearer {FAKE_API_KEY}"}) as r:
        return r.status, await r.json(content_type=None), r.headers


async def test_pending_price_increases_answer_as_vast_cli_documents() -> None:
    async with FakeVast() as fake:
        fake.add_offer(1, 10)
        _, made, _ = await call(fake, "PUT", "/api/v0/asks/1/", {"image": "x"})
        fake.raise_price(made["new_contract"], 0.9)
        status, body, _ = await call(fake, "GET", "/api/v0/instances/pending-price-increases/")
        assert status == 200 and set(body) == {"success", "count", "truncated",
                                               "pending_price_increases"}
        (row,) = body["pending_price_increases"]
        assert set(row) == PENDING_ROW_KEYS
        pid = row["pending_price_increase_id"]
        # extra='forbid': any other key is a 400.
        status, _, _ = await call(fake, "PUT", "/api/v0/instances/accept-price-increase/",
                                  {"pending_price_increase_id": pid, "instance_ids": [1]})
        assert status == 400
        status, body, _ = await call(fake, "PUT", "/api/v0/instances/accept-price-increase/",
                                     {"pending_price_increase_id": pid})
        assert status == 200 and body == {"success": True, "contract_id": made["new_contract"],
                                          "pending_price_increase_id": pid}
        # A stale row: 404 no_pending_price_increase.
        status, body, _ = await call(fake, "PUT", "/api/v0/instances/reject-price-increase/",
                                     {"pending_price_increase_id": pid})
        assert (status, body) == (404, {"success": False, "error": "no_pending_price_increase"})


@pytest.mark.parametrize(("price", "status"), [(0.0005, 400), (0.001, 200), (32.0, 200),
                                               (32.5, 400), ("1", 400)])
async def test_bid_price_takes_the_openapi_range(price: Any, status: int) -> None:
    async with FakeVast() as fake:
        fake.add_instance(7)
        got, body, _ = await call(fake, "PUT", "/api/v0/instances/bid_price/7/",
                                  {"client_id": "me", "price": price})
        assert got == status
        if status == 400:
            assert body["error"] == "invalid_args"
    async with FakeVast() as fake:
        got, body, _ = await call(fake, "PUT", "/api/v0/instances/bid_price/8/",
                                  {"client_id": "me", "price": 1.0})
        assert (got, body["error"]) == (404, "no_such_instance")


async def test_reports_are_an_array_of_problem_message_created_at() -> None:
    async with FakeVast() as fake:
        fake.add_report(41, "gpu_error", "fell off the bus")
        status, body, _ = await call(fake, "GET", "/api/v0/machines/41/reports/")
        assert status == 200 and isinstance(body, list)
        assert set(body[0]) == {"problem", "message", "created_at"}
        assert (await call(fake, "GET", "/api/v0/machines/42/reports/"))[1] == []


async def test_the_quota_answers_as_vastai_1_9_1_reads_it() -> None:
    async with FakeVast(search_quota_per_day=1) as fake:
        assert (await call(fake, "POST", "/api/v0/bundles/", {}))[0] == 200
        status, body, headers = await call(fake, "POST", "/api/v0/bundles/", {})
        # is_search_quota_exceeded: 429 and error == "search_quota_exceeded".
        assert status == 429 and body["error"] == "search_quota_exceeded"
        # with_quota_reset: int(X-RateLimit-Reset), a UTC midnight.
        assert int(headers["X-RateLimit-Reset"]) % 86400 == 0


async def test_the_fakes_webhooks_verify_with_the_docs_own_receiver() -> None:
    seen: list[bool] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append(verify_vast_signature(request.headers, await request.read(), "s3cret"))
        assert request.headers["X-Vast-Delivery-Attempt"] == "1"
        assert request.headers["X-Vast-Event-Id"]
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with FakeVast() as fake:
            fake.webhook_url, fake.webhook_secret = f"http://127.0.0.1:{port}/hook", "s3cret"
            assert await fake.notify("outbid", "s", "m") == 204
            await fake.notify("outbid", "s", "m", secret="other")
            await fake.notify("outbid", "s", "m", timestamp=int(time.time()) - 301)
        assert seen == [True, False, False]
    finally:
        await runner.cleanup()
