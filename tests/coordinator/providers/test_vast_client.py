"""VastClient against aioresponses: requests sent, retries, error mapping, key hygiene.

Error bodies are vast.ai's own (docs/vast.md): the OpenAPI description's shapes and
messages, vast-cli's reading of them."""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aioresponses import aioresponses
from yarl import URL

from vast_manager.coordinator.providers.base import (
    AuthError,
    BadRequest,
    CreateFailed,
    DestroyUnconfirmed,
    OfferGone,
    ProviderError,
    RateLimited,
)
from vast_manager.coordinator.providers.vast.client import VastClient, find_api_key

BASE = "https://vast.example.test"
KEY = "sk-test-0123456789abcdef0123456789abcdef"


class _CompatClientResponse(aiohttp.ClientResponse):
    """aiohttp 3.14 made ``stream_writer`` a required argument that aioresponses
    0.7.x does not pass (pnuckowski/aioresponses#289); supply an idle one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stream_writer", SimpleNamespace(output_size=0))
        super().__init__(*args, **kwargs)


@pytest.fixture(autouse=True)
def _aioresponses_compat(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    params = inspect.signature(aiohttp.ClientResponse.__init__).parameters
    if "stream_writer" in params:
        monkeypatch.setattr("aioresponses.core.ClientResponse", _CompatClientResponse)
    yield


class Sleeps:
    """An injected sleep that records the delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(sleeps: Sleeps) -> AsyncIterator[VastClient]:
    c = VastClient(KEY, BASE, sleep=sleeps, rng=lambda: 1.0, max_attempts=4)
    yield c
    await c.close()


def only_call(m: aioresponses, method: str, url: str) -> Any:
    calls = m.requests[(method, URL(url))]
    assert len(calls) == 1, calls
    return calls[0]


def assert_auth(call: Any) -> None:
    assert call.kwargs["headers"]["Authorization"] == f"Bearer {KEY}"


def all_urls(m: aioresponses) -> list[str]:
    return [str(url) for (_, url) in m.requests]


async def test_search_offers_posts_query(client: VastClient) -> None:
    query = {"rentable": {"eq": True}, "order": [["score", "desc"]], "type": "on-demand"}
    offers = [{"id": 1, "machine_id": 10}, {"id": 2, "machine_id": 20}]
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/", payload={"offers": offers})
        got = await client.search_offers(query)
        call = only_call(m, "POST", f"{BASE}/api/v0/bundles/")
    assert got == offers
    assert call.kwargs["json"] == query
    assert_auth(call)


async def test_create_instance_puts_body(client: VastClient) -> None:
    body = {"client_id": "me", "image": "img:1", "env": {"A": "1"}, "disk": 250.0}
    answer = {"success": True, "new_contract": 777, "instance_api_key": "inst-secret"}
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/4242/", payload=answer)
        got = await client.create_instance(4242, body)
        call = only_call(m, "PUT", f"{BASE}/api/v0/asks/4242/")
    assert got["new_contract"] == 777
    assert call.kwargs["json"] == body
    assert_auth(call)


async def test_show_instance(client: VastClient) -> None:
    url = f"{BASE}/api/v0/instances/55/?owner=me"
    with aioresponses() as m:
        m.get(url, payload={"instances": {"id": 55, "actual_status": "running"}})
        row = await client.show_instance(55)
        call = only_call(m, "GET", url)
    assert row == {"id": 55, "actual_status": "running"}
    assert call.kwargs["params"] == {"owner": "me"}
    assert call.kwargs["json"] is None
    assert_auth(call)


@pytest.mark.parametrize(
    ("status", "payload"),
    [(200, {"instances": None}), (404, {"success": False, "error": "no_such_instance"})],
)
async def test_show_instance_gone_is_none(
    client: VastClient, status: int, payload: dict[str, Any]
) -> None:
    with aioresponses() as m:
        m.get(f"{BASE}/api/v0/instances/55/?owner=me", status=status, payload=payload)
        assert await client.show_instance(55) is None


@pytest.mark.parametrize(
    ("status", "body", "payload"),
    [
        (404, "404: Not Found", None),  # a page from something in between, not vast.ai
        (404, None, {"success": False, "error": "invalid_args", "msg": "bad request"}),
        (200, None, {"success": True}),  # no instances field: not "null", so not gone
    ],
    ids=["404-page", "404-other-error", "200-without-instances"],
)
async def test_a_lookup_that_does_not_say_gone_is_an_error_not_gone(
    client: VastClient, status: int, body: str | None, payload: dict[str, Any] | None
) -> None:
    with aioresponses() as m:
        m.get(f"{BASE}/api/v0/instances/55/?owner=me", status=status, body=body,
              payload=payload)
        with pytest.raises(ProviderError) as err:
            await client.show_instance(55)
    assert not isinstance(err.value, AuthError)


async def test_list_instances_follows_next_token(client: VastClient) -> None:
    order_by = json.dumps([{"col": "id", "dir": "asc"}])
    page = re.compile(re.escape(f"{BASE}/api/v1/instances/") + r"\?.*")
    with aioresponses() as m:
        m.get(page, payload={"instances": [{"id": 1}, {"id": 2}], "next_token": "tok-2"})
        m.get(page, payload={"instances": [{"id": 3}], "next_token": "tok-3"})
        m.get(page, payload={"instances": [], "next_token": None})
        rows = await client.list_instances()
        calls = [c for (meth, _), cs in m.requests.items() if meth == "GET" for c in cs]
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert len(calls) == 3
    params = [c.kwargs["params"] for c in calls]
    assert params[0] == {"select_filters": "{}", "order_by": order_by, "limit": "25"}
    assert params[1] == {**params[0], "after_token": "tok-2"}
    assert params[2] == {**params[0], "after_token": "tok-3"}
    for c in calls:
        assert_auth(c)


async def test_list_instances_repeated_token_is_an_error(client: VastClient) -> None:
    page = re.compile(re.escape(f"{BASE}/api/v1/instances/") + r"\?.*")
    with aioresponses() as m:
        m.get(page, payload={"instances": [{"id": 1}], "next_token": "same"}, repeat=True)
        with pytest.raises(ProviderError, match="repeated a page token"):
            await client.list_instances()


async def test_destroy_instance_deletes_then_verifies(client: VastClient) -> None:
    with aioresponses() as m:
        m.delete(f"{BASE}/api/v0/instances/55/", payload={"success": True})
        m.get(f"{BASE}/api/v0/instances/55/?owner=me", payload={"instances": None})
        await client.destroy_instance(55)
        call = only_call(m, "DELETE", f"{BASE}/api/v0/instances/55/")
        only_call(m, "GET", f"{BASE}/api/v0/instances/55/?owner=me")
    assert call.kwargs["json"] == {}
    assert_auth(call)


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (404, {"success": False, "error": "not_found", "msg": "Instance not found"}),  # OpenAPI
        (404, {"success": False, "error": "no_such_instance"}),  # what dstack checks
        (200, {"success": False, "error": "no_such_instance", "msg": "gone"}),
    ],
)
async def test_destroy_already_gone_is_success_once_the_lookup_agrees(
    client: VastClient, status: int, payload: dict[str, Any]
) -> None:
    with aioresponses() as m:
        m.delete(f"{BASE}/api/v0/instances/55/", status=status, payload=payload)
        m.get(f"{BASE}/api/v0/instances/55/?owner=me", payload={"instances": None})
        await client.destroy_instance(55)
        only_call(m, "GET", f"{BASE}/api/v0/instances/55/?owner=me")


async def test_destroy_still_listed_is_unconfirmed(client: VastClient) -> None:
    with aioresponses() as m:
        m.delete(f"{BASE}/api/v0/instances/55/", payload={"success": True})
        m.get(
            f"{BASE}/api/v0/instances/55/?owner=me",
            payload={"instances": {"id": 55, "actual_status": "running"}},
        )
        with pytest.raises(DestroyUnconfirmed, match=r"still listed \(status running"):
            await client.destroy_instance(55)


async def test_destroy_success_false_is_a_refusal_not_a_destroy(client: VastClient) -> None:
    with aioresponses() as m:
        m.delete(f"{BASE}/api/v0/instances/55/",
                 payload={"success": False, "error": "busy", "msg": "try again later"})
        with pytest.raises(ProviderError, match="busy: try again later"):
            await client.destroy_instance(55)
        assert ("GET", URL(f"{BASE}/api/v0/instances/55/?owner=me")) not in m.requests


async def test_destroy_with_an_invalid_key_is_an_auth_error_not_gone(
    client: VastClient,
) -> None:
    with aioresponses() as m:
        m.delete(f"{BASE}/api/v0/instances/55/", status=404,
                 payload={"success": False, "error": "auth_error", "msg": "Invalid user key"})
        with pytest.raises(AuthError, match="VAST_API_KEY"):
            await client.destroy_instance(55)


async def test_set_label_puts_label(client: VastClient) -> None:
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/instances/55/", payload={"success": True})
        await client.set_label(55, "vm:abcd1234:ag_0123456789abcdef0123")
        call = only_call(m, "PUT", f"{BASE}/api/v0/instances/55/")
    assert call.kwargs["json"] == {"label": "vm:abcd1234:ag_0123456789abcdef0123"}
    assert_auth(call)


async def test_429_then_200_succeeds(client: VastClient, sleeps: Sleeps) -> None:
    with aioresponses() as m:
        m.post(
            f"{BASE}/api/v0/bundles/",
            status=429,
            payload={"success": False, "msg": "API requests too frequent"},
        )
        m.post(f"{BASE}/api/v0/bundles/", payload={"offers": [{"id": 9}]})
        assert await client.search_offers({}) == [{"id": 9}]
        assert len(m.requests[("POST", URL(f"{BASE}/api/v0/bundles/"))]) == 2
    assert sleeps.delays == [0.5]


async def test_create_retries_429(client: VastClient, sleeps: Sleeps) -> None:
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/1/", status=429, payload={"msg": "too frequent"})
        m.put(f"{BASE}/api/v0/asks/1/", payload={"success": True, "new_contract": 5})
        assert (await client.create_instance(1, {"image": "x"}))["new_contract"] == 5
    assert len(sleeps.delays) == 1


async def test_persistent_5xx_ends_in_clear_error(client: VastClient, sleeps: Sleeps) -> None:
    with aioresponses() as m:
        m.get(
            f"{BASE}/api/v0/instances/7/?owner=me",
            status=503,
            body="Service Unavailable",
            repeat=True,
        )
        with pytest.raises(ProviderError) as err:
            await client.show_instance(7)
        calls = m.requests[("GET", URL(f"{BASE}/api/v0/instances/7/?owner=me"))]
    assert len(calls) == 4  # max_attempts, no more
    assert "failed after 4 attempts (HTTP 503: Service Unavailable)" in str(err.value)
    assert not isinstance(err.value, RateLimited)
    # Exponential, capped and jittered (rng fixed at 1.0 here: the full delay).
    assert sleeps.delays == [0.5, 1.0, 2.0]


async def test_backoff_is_capped_and_jittered(sleeps: Sleeps) -> None:
    # Seven waits; tenacity also draws one after the last attempt, before it stops.
    draws = iter([0.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    c = VastClient(
        KEY, BASE, sleep=sleeps, rng=lambda: next(draws), max_attempts=8, backoff_cap_s=3.0
    )
    try:
        with aioresponses() as m:
            m.post(f"{BASE}/api/v0/bundles/", status=502, repeat=True)
            with pytest.raises(ProviderError, match="HTTP 502"):
                await c.search_offers({})
    finally:
        await c.close()
    assert sleeps.delays == [0.25, 1.0, 1.0, 3.0, 2.25, 2.25, 2.25]
    assert max(sleeps.delays) <= 3.0


async def test_persistent_429_is_rate_limited(client: VastClient) -> None:
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/", status=429, repeat=True)
        with pytest.raises(RateLimited, match="still rate limited"):
            await client.search_offers({})


async def test_connection_errors_and_timeouts_are_retried(
    client: VastClient, sleeps: Sleeps
) -> None:
    url = f"{BASE}/api/v0/instances/7/?owner=me"
    with aioresponses() as m:
        m.get(url, exception=aiohttp.ClientConnectionError("reset by peer"))
        m.get(url, exception=TimeoutError())
        m.get(url, payload={"instances": {"id": 7}})
        assert await client.show_instance(7) == {"id": 7}
    assert len(sleeps.delays) == 2


async def test_create_not_retried_when_outcome_unknown(client: VastClient) -> None:
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/1/", status=504, repeat=True)
        with pytest.raises(ProviderError, match="outcome unknown"):
            await client.create_instance(1, {"image": "x"})
        assert len(m.requests[("PUT", URL(f"{BASE}/api/v0/asks/1/"))]) == 1
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/1/", exception=TimeoutError(), repeat=True)
        with pytest.raises(ProviderError, match="outcome unknown"):
            await client.create_instance(1, {"image": "x"})
        assert len(m.requests[("PUT", URL(f"{BASE}/api/v0/asks/1/"))]) == 1


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        # The OpenAPI description's two answers for an offer that is not there.
        (404, {"success": False, "error": "invalid_args", "ask_id": 4242,
               "msg": "error 404/3603: no_such_ask Instance type by id 4242 is not available."}),
        (410, {"success": False, "error": "no_such_ask", "ask_id": 4242,
               "msg": "error 410/3907: no_such_ask Instance type 4242 is no longer available."}),
    ],
)
async def test_no_such_ask_on_create_is_offer_gone(
    client: VastClient, status: int, payload: dict[str, Any]
) -> None:
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/4242/", status=status, payload=payload)
        with pytest.raises(OfferGone, match=rf"offer gone \(HTTP {status}"):
            await client.create_instance(4242, {"image": "x"})


@pytest.mark.parametrize("status", [200, 400])
async def test_create_success_false_with_a_new_contract_carries_the_instance(
    client: VastClient, status: int
) -> None:
    with aioresponses() as m:
        m.put(f"{BASE}/api/v0/asks/4242/", status=status,
              payload={"success": False, "error": "start_failed", "msg": "could not start",
                       "new_contract": 31337})
        with pytest.raises(CreateFailed) as err:
            await client.create_instance(4242, {"image": "x"})
    assert err.value.instance_id == 31337
    assert "made instance 31337" in str(err.value) and "could not start" in str(err.value)


async def test_create_success_false_no_such_ask_is_offer_gone(client: VastClient) -> None:
    with aioresponses() as m:
        m.put(
            f"{BASE}/api/v0/asks/4242/",
            payload={"success": False, "error": "no_such_ask", "msg": "gone"},
        )
        with pytest.raises(OfferGone):
            await client.create_instance(4242, {"image": "x"})


@pytest.mark.parametrize(
    ("status", "exc"),
    [(401, AuthError), (403, BadRequest), (400, BadRequest), (500, ProviderError)],
)
async def test_error_mapping(client: VastClient, status: int, exc: type[Exception]) -> None:
    with aioresponses() as m:
        m.post(
            f"{BASE}/api/v0/bundles/",
            status=status,
            payload={"success": False, "error": "some_error", "msg": "details here"},
        )
        with pytest.raises(exc) as err:
            await client.search_offers({})
    assert "some_error" in str(err.value)
    assert "details here" in str(err.value)


@pytest.mark.parametrize(
    ("method", "path", "status", "payload"),
    [
        # The offers search answers a wrong key 404 (OpenAPI: error and msg only).
        ("POST", "/api/v0/bundles/", 404, {"error": "auth_error", "msg": "Invalid user key"}),
        # So does the v1 instance list (with success); show and create answer 401.
        ("GET", "/api/v1/instances/", 404,
         {"success": False, "error": "auth_error", "msg": "Invalid user key"}),
        ("GET", "/api/v1/instances/", 403,
         {"success": False, "error": "auth_error", "msg": "This action requires login."}),
        ("GET", "/api/v0/instances/55/", 401,
         {"success": False, "error": "auth_error", "msg": "Invalid user key"}),
        # An expired 2FA session key (vast-cli main.py).
        ("GET", "/api/v0/instances/55/", 404,
         {"success": False, "msg": "Session expired. Please log in again."}),
    ],
)
async def test_a_refused_key_is_an_auth_error_naming_its_source_whatever_the_status(
    method: str, path: str, status: int, payload: dict[str, Any], sleeps: Sleeps
) -> None:
    c = VastClient(KEY, BASE, key_source="/home/op/.config/vastai/vast_api_key", sleep=sleeps)
    try:
        with aioresponses() as m:
            url = re.compile(re.escape(BASE + path) + r".*")
            m.add(url, method, status=status, payload=payload)
            with pytest.raises(AuthError) as err:
                if path == "/api/v0/bundles/":
                    await c.search_offers({})
                elif path == "/api/v1/instances/":
                    await c.list_instances()
                else:
                    await c.show_instance(55)  # not "gone": a 404 is not always that
    finally:
        await c.close()
    assert "refused the API key from /home/op/.config/vastai/vast_api_key" in str(err.value)
    assert f"HTTP {status}" in str(err.value)
    assert sleeps.delays == []  # not retried


@pytest.mark.parametrize(
    ("body", "payload"),
    [("API requests too frequent", None),
     (None, {"detail": "API requests too frequent endpoint threshold=4.5"})],
    ids=["plain-text", "detail-json"],
)
async def test_429_bodies_are_read_in_either_shape(
    client: VastClient, body: str | None, payload: dict[str, Any] | None
) -> None:
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/", status=429, body=body, payload=payload, repeat=True)
        with pytest.raises(RateLimited, match="HTTP 429: API requests too frequent"):
            await client.search_offers({})


async def test_a_200_saying_success_false_is_an_error(client: VastClient) -> None:
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/",
               payload={"success": False, "error": "invalid_request", "msg": "bad query"})
        with pytest.raises(ProviderError, match="invalid_request: bad query"):
            await client.search_offers({})


async def test_key_never_in_urls_messages_or_logs(
    client: VastClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with aioresponses() as m:
        # A server that echoes the key back must not get it into our messages.
        m.post(
            f"{BASE}/api/v0/bundles/",
            status=401,
            payload={"success": False, "error": "bad_key", "msg": f"Invalid user key {KEY}"},
        )
        m.get(
            re.compile(re.escape(f"{BASE}/api/v1/instances/") + r".*"),
            exception=aiohttp.ClientConnectionError(f"boom {KEY}"),
            repeat=True,
        )
        with pytest.raises(AuthError) as err1:
            await client.search_offers({})
        with pytest.raises(ProviderError) as err2:
            await client.list_instances()
        urls = all_urls(m)
    for text in (str(err1.value), str(err2.value), repr(client), caplog.text, *urls):
        assert KEY not in text
    assert "***" in str(err1.value)


def test_missing_key_is_auth_error() -> None:
    with pytest.raises(AuthError):
        VastClient("", BASE)


def test_base_url_from_vast_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_URL", "http://127.0.0.1:9999/")
    assert VastClient(KEY).base_url == "http://127.0.0.1:9999"
    assert VastClient(KEY, "http://other").base_url == "http://other"
    monkeypatch.delenv("VAST_URL")
    assert VastClient(KEY).base_url == "https://console.vast.ai"


def test_find_api_key_order_and_source(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert find_api_key({}, home) is None
    (home / ".vast_api_key").write_text("legacy-key\n")
    assert find_api_key({}, home) == ("legacy-key", str(home / ".vast_api_key"))
    cfg = home / ".config" / "vastai"
    cfg.mkdir(parents=True)
    (cfg / "vast_api_key").write_text("  config-key \n")
    assert find_api_key({}, home) == ("config-key", str(cfg / "vast_api_key"))
    xdg = tmp_path / "xdg"
    (xdg / "vastai").mkdir(parents=True)
    (xdg / "vastai" / "vast_api_key").write_text("xdg-key")
    assert find_api_key({"XDG_CONFIG_HOME": str(xdg)}, home) == (
        "xdg-key", str(xdg / "vastai" / "vast_api_key"))
    # A relative XDG_CONFIG_HOME is ignored, as the xdg package does.
    assert find_api_key({"XDG_CONFIG_HOME": "rel"}, home) == (
        "config-key", str(cfg / "vast_api_key"))
    assert find_api_key({"VAST_API_KEY": " env-key "}, home) == ("env-key", "VAST_API_KEY")
    assert find_api_key({"VAST_API_KEY": ""}, home) == ("config-key", str(cfg / "vast_api_key"))


def test_find_api_key_skips_empty_files(tmp_path: Path) -> None:
    cfg = tmp_path / ".config" / "vastai"
    cfg.mkdir(parents=True)
    (cfg / "vast_api_key").write_text("\n")
    (tmp_path / ".vast_api_key").write_text("legacy")
    assert find_api_key({}, tmp_path) == ("legacy", str(tmp_path / ".vast_api_key"))


async def test_instance_list_without_instances_is_an_error_not_empty(
    client: VastClient,
) -> None:
    """Read as 'no instances', a broken 200 would mark the whole fleet vanished."""
    with aioresponses() as m:
        m.get(re.compile(rf"{re.escape(BASE)}/api/v1/instances/.*"), payload={"success": True})
        with pytest.raises(ProviderError, match="instances"):
            await client.list_instances()


async def test_an_answer_past_the_bound_is_refused_not_held(
    client: VastClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vast.ai answers are read up to ``MAX_ANSWER_BYTES`` (64 MiB; 4 KiB here): a larger
    one is refused with a sentence saying so, and not tried again."""
    from vast_manager.coordinator.providers.vast import client as client_module

    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 4096)
    offers = [{"id": i, "machine_id": i, "note": "x" * 100} for i in range(100)]
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/", payload={"offers": offers})
        with pytest.raises(client_module.AnswerTooLarge, match="over 4,096 bytes; refused"):
            await client.search_offers({})
        assert len(m.requests[("POST", URL(f"{BASE}/api/v0/bundles/"))]) == 1
    with aioresponses() as m:
        m.post(f"{BASE}/api/v0/bundles/", payload={"offers": offers[:5]})
        assert len(await client.search_offers({})) == 5
