"""The vast.ai REST client: search offers, create, show, list, destroy and label instances.

Speaks the endpoints of docs/vast.md with aiohttp, Bearer auth only (the
official CLI also appends ``?api_key=`` to every URL; we never put the key in
a URL, a log line or an exception message). Transient failures (429, 502,
503, 504, connection errors, timeouts) are retried under the one retry policy
(``vast_manager.common.retry``: capped exponential backoff with jitter, run by
tenacity); everything else maps to the named errors of
``vast_manager.coordinator.providers.base``, read as vast.ai means them (docs/vast.md):

- an invalid key is an ``AuthError`` naming where the key came from, whatever
  the status (the offers search and the instance list answer ``404`` "Invalid
  user key");
- an offer is gone on ``410 no_such_ask`` or ``404 invalid_args`` whose message
  names ``no_such_ask``;
- a create answering ``success: false`` with a ``new_contract`` made an
  instance anyway: ``CreateFailed`` carries its id;
- a destroy is done when ``success`` says so (or the instance is already gone)
  and a lookup no longer finds it;
- a 429 ``search_quota_exceeded`` is ``SearchQuotaExceeded`` at once, never retried (the
  quota "only resets at UTC midnight"); another 429's ``Retry-After`` is waited out when
  it is at most ``MAX_RETRY_AFTER_S``, and not retried when longer (``vastai`` 1.9.1
  ``vastai/api/client.py`` ``retry_delay``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from vast_manager.common.retry import Backoff, retrying
from vast_manager.coordinator.providers.base import (
    AuthError,
    BadRequest,
    CreateFailed,
    DestroyUnconfirmed,
    OfferGone,
    ProviderError,
    RateLimited,
    SearchQuotaExceeded,
)

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://console.vast.ai"
#: Page size of GET /api/v1/instances/ (the CLI's; the server caps pages at 25).
LIST_PAGE_SIZE = 25
# A runaway next_token (a server bug) must not page forever.
_MAX_LIST_PAGES = 400

_RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
#: The most of one answer read: an offers search of the whole market is a few MB; a
#: larger answer (a broken or hostile endpoint) is refused, never held in memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
#: The longest ``Retry-After`` waited out inline; a longer one ends the call (``vastai``
#: 1.9.1 ``_MAX_RETRY_AFTER_SECONDS``).
MAX_RETRY_AFTER_S = 60.0
#: The 429 ``error`` of the daily search quota (``vastai`` 1.9.1 ``is_search_quota_exceeded``).
SEARCH_QUOTA_ERROR = "search_quota_exceeded"
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
#: What vast.ai says of a key it does not accept, whatever the status code: a deleted
#: or wrong key ("Invalid user key", as 401 or, on the search and the v1 list, 404),
#: and an expired 2FA session key (404); vast-cli ``vastai/cli/main.py``.
_AUTH_MESSAGES = ("invalid user key", "session expired", "requires login")
#: ``error`` codes of a destroy whose instance no longer exists (the OpenAPI
#: description says ``not_found``; dstack checks ``no_such_instance``).
_GONE_ERRORS = frozenset({"not_found", "no_such_instance"})

Sleep = Callable[[float], Awaitable[Any]]


def find_api_key(environ: Mapping[str, str], home: Path) -> tuple[str, str] | None:
    """``(key, where it came from)``, found where the official CLI looks; None when absent.

    The source is ``VAST_API_KEY`` or the file's path, for error messages (never the key).

    Order (vast-cli ``vastai/cli/main.py`` and ``vastai/cli/util.py``): the
    ``VAST_API_KEY`` environment variable; ``$XDG_CONFIG_HOME/vastai/vast_api_key``
    (``~/.config`` when XDG_CONFIG_HOME is unset or relative, as the ``xdg``
    package the CLI uses decides); the legacy ``~/.vast_api_key`` (the CLI copies
    it into the config file on start; we just read it). The CLI's short-lived
    2FA session key file is not used: it expires, and a fleet needs a key that
    does not.
    """
    key = environ.get("VAST_API_KEY", "").strip()
    if key:
        return key, "VAST_API_KEY"
    xdg = environ.get("XDG_CONFIG_HOME", "")
    config_home = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".config"
    for path in (config_home / "vastai" / "vast_api_key", home / ".vast_api_key"):
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            return text, str(path)
    return None


class VastClient:
    """Async client of vast.ai's REST API; one instance per account key.

    ``sleep`` and ``rng`` are injectable so tests never wait; ``session`` may be
    shared (the client then leaves closing it to its owner). ``key_source`` names
    where the key came from (``VAST_API_KEY``, a file) in the error vast.ai's
    refusal of it becomes.
    """

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        key_source: str = "VAST_API_KEY",
        session: aiohttp.ClientSession | None = None,
        sleep: Sleep = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        max_attempts: int = 6,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 10.0,
        timeout_s: float = 60.0,
    ) -> None:
        if not api_key:
            raise AuthError("no vast.ai API key (set VAST_API_KEY)")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._api_key = api_key
        self.key_source = key_source
        self.base_url = (base_url or os.environ.get("VAST_URL") or DEFAULT_BASE_URL).rstrip("/")
        self._session = session
        self._owns_session = session is None
        self._sleep = sleep
        self.max_attempts = max_attempts
        # Delays start at 0.5 s and double (the CLI waits 0.15 s x 1.5^n): the offers
        # search allows about 10 requests a minute per IP, so the CLI's delays would
        # spend every attempt inside the same rate-limit window (docs/vast.md).
        self._backoff = Backoff(base_s=backoff_base_s, cap_s=backoff_cap_s, rng=rng)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def __repr__(self) -> str:  # never show the key
        return f"VastClient(base_url={self.base_url!r})"

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> VastClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- endpoints -------------------------------------------------------

    async def search_offers(self, query: Mapping[str, Any]) -> list[dict[str, Any]]:
        """POST /api/v0/bundles/ with a query from ``filters.build_search_query``."""
        body = await self._request("POST", "/api/v0/bundles/", json_body=dict(query))
        self._check_success(body, "offer search")
        offers = body.get("offers")
        if not isinstance(offers, list):
            raise ProviderError("vast.ai search answered without an offers list")
        return [o for o in offers if isinstance(o, dict)]

    async def create_instance(self, offer_id: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT /api/v0/asks/{offer_id}/: rent the offer. Returns vast.ai's answer
        (``new_contract`` is the instance id; ``instance_api_key`` is a credential
        the caller must not log).

        Not retried after the request may have reached vast.ai (5xx, timeout,
        dropped connection): a retry could rent a second instance. Only 429 and a
        connection that was never made are retried. A refusal that still names a
        ``new_contract`` raises ``CreateFailed`` with that instance's id.
        """
        path = f"/api/v0/asks/{int(offer_id)}/"
        answer = await self._request("PUT", path, json_body=dict(body), idempotent=False)
        if answer.get("success") is not True:
            # The CLI's answer is {"success": true, "new_contract": id}; anything else
            # is a refusal, even with an id (dstack destroys that instance).
            raise self._error_from_body(200, answer, f"PUT {path}")
        new_id = answer.get("new_contract")
        if not isinstance(new_id, int) or isinstance(new_id, bool):
            raise ProviderError(
                f"vast.ai create on offer {offer_id} answered without an instance id"
            )
        return answer

    async def show_instance(self, instance_id: int) -> dict[str, Any] | None:
        """GET /api/v0/instances/{id}/?owner=me; None when the instance does not exist.

        vast.ai answers ``{"instances": null}`` for an instance that does not exist
        (docs/vast.md); a ``404`` counts as gone only when its body says so
        (``no_such_instance``, ``not_found``). Any other answer (a 404 page from
        something in between, a 200 without ``instances``) is an error, never "gone":
        a destroy is confirmed by this lookup.
        """
        what = f"show of instance {instance_id}"
        try:
            body = await self._request(
                "GET", f"/api/v0/instances/{int(instance_id)}/", params={"owner": "me"}
            )
        except _NotFound as err:
            if err.error in _GONE_ERRORS:
                return None
            raise ProviderError(f"{err}; not read as gone") from None
        self._check_success(body, what)
        if "instances" not in body:
            raise ProviderError(f"vast.ai {what} answered without an instances field")
        row = body["instances"]
        if row is None:
            return None
        if not isinstance(row, dict):
            raise ProviderError(f"vast.ai {what} answered an instances field that is not an object")
        return row

    async def list_instances(self) -> list[dict[str, Any]]:
        """Every instance of the account: GET /api/v1/instances/, following ``next_token``.

        Parameters as the CLI's ``show_instances`` sends them (JSON-encoded
        ``select_filters`` and ``order_by``, ``limit`` 25, ``after_token``).
        """
        rows: list[dict[str, Any]] = []
        params: dict[str, str] = {
            "select_filters": "{}",
            "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
            "limit": str(LIST_PAGE_SIZE),
        }
        seen_tokens: set[str] = set()
        for _ in range(_MAX_LIST_PAGES):
            body = await self._request("GET", "/api/v1/instances/", params=params)
            self._check_success(body, "instance list")
            # A 200 without an instances list is a broken answer, never "no
            # instances": read as empty, it would mark the whole fleet vanished.
            page = body.get("instances") if isinstance(body, dict) else None
            if not isinstance(page, list):
                raise ProviderError("vast.ai instance list answered without an instances list")
            rows.extend(r for r in page if isinstance(r, dict))
            token = body.get("next_token")
            if not token:
                return rows
            token = str(token)
            if token in seen_tokens:
                raise ProviderError("vast.ai instance list repeated a page token")
            seen_tokens.add(token)
            params["after_token"] = token
        raise ProviderError(f"vast.ai instance list did not end after {_MAX_LIST_PAGES} pages")

    async def destroy_instance(self, instance_id: int) -> None:
        """DELETE /api/v0/instances/{id}/, then look it up: returns once vast.ai said so
        (``success``, or the instance was already gone) and no longer lists it.

        Raises ``DestroyUnconfirmed`` when the instance is still there afterwards
        (the caller retries; the delete is idempotent) and a ``ProviderError`` when
        vast.ai refused (``success: false``).
        """
        what = f"destroy of instance {instance_id}"
        try:
            body = await self._request(
                "DELETE", f"/api/v0/instances/{int(instance_id)}/", json_body={}
            )
        except _NotFound:
            log.info("vast.ai instance %s already gone (404)", instance_id)
        else:
            error = str(body.get("error") or "")
            if body.get("success") is False and error in _GONE_ERRORS:
                log.info("vast.ai instance %s already gone (%s)", instance_id, error)
            else:
                self._check_success(body, what)
        row = await self.show_instance(instance_id)
        if row is None:
            return
        status = _clean(str(row.get("actual_status")))
        raise DestroyUnconfirmed(
            f"vast.ai {what}: accepted, but the instance is still listed (status {status})"
        )

    async def current_user(self) -> dict[str, Any]:
        """GET /api/v0/users/current (``vastai show user``): the account's ``balance`` and
        ``credit`` among its fields (docs/vast.md "The account"); the key itself is dropped."""
        body = await self._request("GET", "/api/v0/users/current")
        if not isinstance(body, dict):
            raise ProviderError("vast.ai users/current answered something that is not an object")
        self._check_success(body, "account read")
        body.pop("api_key", None)
        return body

    async def set_state(self, instance_id: int, state: str) -> None:
        """PUT /api/v0/instances/{id}/ {"state": ...} (``vastai start instance``)."""
        await self._put_instance(instance_id, "state", state)

    async def set_label(self, instance_id: int, label: str) -> None:
        """PUT /api/v0/instances/{id}/ {"label": ...}."""
        await self._put_instance(instance_id, "label", label)

    async def _put_instance(self, instance_id: int, field: str, value: str) -> None:
        try:
            body = await self._request(
                "PUT", f"/api/v0/instances/{int(instance_id)}/", json_body={field: value}
            )
        except _NotFound:
            raise ProviderError(f"vast.ai instance {instance_id} not found") from None
        self._check_success(body, f"{field} of instance {instance_id}")

    # ---- price increases, bids, machine reports (docs/vast.md, "2026") -----------

    async def pending_price_increases(self) -> list[dict[str, Any]]:
        """GET /api/v0/instances/pending-price-increases/: the rows of
        ``pending_price_increases`` (vast-cli ``vastai/api/price_increase.py``)."""
        body = await self._request("GET", "/api/v0/instances/pending-price-increases/")
        self._check_success(body, "pending price increases")
        rows = body.get("pending_price_increases")
        if rows is None:
            return []
        if not isinstance(rows, list):
            raise ProviderError("vast.ai pending price increases answered without a list")
        return [r for r in rows if isinstance(r, dict)]

    async def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        """PUT accept-price-increase/ or reject-price-increase/ with exactly
        ``{"pending_price_increase_id": N}`` (any other key is a 400)."""
        verb = "accept" if accept else "reject"
        try:
            body = await self._request(
                "PUT", f"/api/v0/instances/{verb}-price-increase/",
                json_body={"pending_price_increase_id": int(pending_id)})
        except _NotFound:
            # A stale row: 404 no_pending_price_increase (older backends 409).
            raise ProviderError(f"vast.ai has no pending price increase {pending_id} "
                                "any more") from None
        self._check_success(body, f"{verb} of price increase {pending_id}")

    async def change_bid(self, instance_id: int, price_per_hour: float) -> None:
        """PUT /api/v0/instances/bid_price/{id}/ ``{"client_id": "me", "price": P}``
        (vast-cli ``change_bid``; OpenAPI: 0.001 to 32 $/h)."""
        try:
            body = await self._request(
                "PUT", f"/api/v0/instances/bid_price/{int(instance_id)}/",
                json_body={"client_id": "me", "price": round(float(price_per_hour), 6)})
        except _NotFound:
            raise ProviderError(f"vast.ai instance {instance_id} not found") from None
        self._check_success(body, f"bid of instance {instance_id}")

    async def machine_reports(self, machine_id: int) -> list[dict[str, Any]]:
        """GET /api/v0/machines/{id}/reports/: renters' reports ``{problem, message,
        created_at}`` (OpenAPI ``showReports``)."""
        body: Any = await self._request(
            "GET", f"/api/v0/machines/{int(machine_id)}/reports/", allow_list=True)
        rows = body.get("reports") if isinstance(body, dict) else body
        if not isinstance(rows, list):
            raise ProviderError("vast.ai machine reports answered without a list")
        return [r for r in rows if isinstance(r, dict)]

    # ---- transport -------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._api_key}",
            "Accept": "application/json",
            "User-Agent": "vast-manager",
        }

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        idempotent: bool = True,
        allow_list: bool = False,
    ) -> dict[str, Any]:
        """One call with retries; returns the JSON object answered (or, with
        ``allow_list``, the JSON array: typed as the object for the callers that need none).

        Raises ``_NotFound`` for a plain 404/410 (callers decide what gone means),
        ``OfferGone`` for ``no_such_ask``, and the named errors otherwise.
        """
        what = f"{method} {path}"
        attempts = retrying(
            self._backoff,
            retry_on=lambda exc: isinstance(exc, _Transient),
            attempts=self.max_attempts,
            sleep=self._sleep,
            log=log,
            what=f"vast.ai {what}",
            server_wait=lambda exc: exc.retry_after_s if isinstance(exc, _Transient) else None,
        )
        try:
            async for attempt in attempts:
                with attempt:
                    return await self._request_once(method, path, params, json_body, idempotent,
                                                    allow_list)
        except _Transient as last:
            if last.status == 429:
                raise RateLimited(
                    f"vast.ai {what}: still rate limited after {self.max_attempts} attempts "
                    f"({last})"
                ) from None
            raise ProviderError(
                f"vast.ai {what}: failed after {self.max_attempts} attempts ({last})"
            ) from None
        raise AssertionError("unreachable: tenacity returns or raises")

    async def _request_once(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        json_body: Any,
        idempotent: bool,
        allow_list: bool = False,
    ) -> dict[str, Any]:
        """One try: the JSON object answered, ``_Transient`` for a failure worth another
        try, ``OutcomeUnknown`` for one that is not (a create that may have happened)."""
        what = f"{method} {path}"
        try:
            async with self._get_session().request(
                method,
                self.base_url + path,
                params=dict(params) if params else None,
                json=json_body,
                headers=self._headers(),
                timeout=self._timeout,
            ) as resp:
                status = resp.status
                text = await read_bounded(resp, MAX_ANSWER_BYTES, what)
                headers = resp.headers
        except aiohttp.ClientConnectorError as exc:
            # Never connected: the request did not reach vast.ai, so even a create
            # may be retried.
            raise _Transient(f"cannot connect ({type(exc).__name__})") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            problem = _describe(exc, self._scrub)
            if not idempotent:
                raise OutcomeUnknown(
                    f"vast.ai {what}: outcome unknown ({problem}); "
                    "not retried so as not to act twice"
                ) from None
            raise _Transient(problem) from None
        log.debug("vast.ai %s -> %d", what, status)
        body = _parse_json(text)
        if status == 429 and isinstance(body, dict) and body.get("error") == SEARCH_QUOTA_ERROR:
            raise SearchQuotaExceeded(
                f"vast.ai {what}: the daily search quota is spent (HTTP 429 "
                f"{SEARCH_QUOTA_ERROR}); it resets at UTC midnight",
                _epoch(headers.get("X-RateLimit-Reset")))
        if status in _RETRYABLE_STATUS:
            # 429 bodies are plain text or {"detail": ...}; a Retry-After is believed.
            if status != 429 and not idempotent:
                raise OutcomeUnknown(
                    f"vast.ai {what}: answered {status}, outcome unknown; "
                    "not retried so as not to act twice"
                )
            problem = f"HTTP {status}"
            detail = _message(body, text)
            if detail:
                problem += f": {_clean(self._scrub(detail))[:120]}"
            retry_after = _epoch(headers.get("Retry-After"))
            if retry_after is not None and retry_after > MAX_RETRY_AFTER_S:
                raise RateLimited(f"vast.ai {what}: {problem}; Retry-After {retry_after:g} s "
                                  f"is longer than {MAX_RETRY_AFTER_S:g} s, not waited out")
            raise _Transient(problem, status, retry_after)
        if 200 <= status < 300:
            if allow_list and isinstance(body, list):
                return body  # type: ignore[return-value]
            if not isinstance(body, dict):
                raise ProviderError(f"vast.ai {what}: answered {status} without a JSON object")
            return body
        raise self._error_from_body(status, body if body is not None else text, what)

    def _check_success(self, body: dict[str, Any], what: str) -> None:
        """A 200 answering ``success: false`` is a refusal, not a result."""
        if body.get("success") is False:
            raise self._error_from_body(200, body, what)

    def _error_from_body(self, status: int, body: Any, what: str) -> ProviderError:
        """The named error for a refusal: ``body`` is the parsed JSON, or the text."""
        error = ""
        if isinstance(body, dict):
            error = _clean(self._scrub(str(body.get("error") or "")))[:80]
        detail = _clean(self._scrub(_message(body, body if isinstance(body, str) else "")))
        detail = detail[:200]
        said = f"HTTP {status}" + (f" {error}" if error else "") + (f": {detail}" if detail else "")
        lowered = detail.lower()
        if status == 401 or error == "auth_error" or any(m in lowered for m in _AUTH_MESSAGES):
            return AuthError(
                f"vast.ai refused the API key from {self.key_source} ({what} answered "
                f"{said}); check that key"
            )
        new_contract = body.get("new_contract") if isinstance(body, dict) else None
        if isinstance(new_contract, int) and not isinstance(new_contract, bool):
            return CreateFailed(
                f"vast.ai {what} answered {said} but made instance {new_contract}",
                new_contract,
            )
        if error == "no_such_ask" or "no_such_ask" in detail or (
            status in (404, 410) and "/asks/" in what
        ):
            return OfferGone(f"vast.ai {what}: offer gone ({said})")
        if status in (404, 410):
            return _NotFound(f"vast.ai {what}: not found ({said})", error)
        if status in (400, 403):
            return BadRequest(f"vast.ai {what}: refused ({said})")
        if status == 429:
            return RateLimited(f"vast.ai {what}: rate limited ({said})")
        return ProviderError(f"vast.ai {what}: refused ({said})")

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text


class AnswerTooLarge(ProviderError):
    """vast.ai answered more than ``MAX_ANSWER_BYTES``: refused, not retried."""


async def read_bounded(resp: aiohttp.ClientResponse, limit: int, what: str) -> str:
    """The answer's text, read ``limit`` bytes at most (``AnswerTooLarge`` past it, on its
    declared length before anything is read)."""
    too_large = AnswerTooLarge(f"vast.ai {what}: the answer is over {limit:,} bytes; refused")
    if resp.content_length is not None and resp.content_length > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks).decode(resp.charset or "utf-8", errors="replace")


class OutcomeUnknown(ProviderError):
    """A create may or may not have happened (5xx, timeout or dropped connection
    after the request was sent); it was not retried so as not to rent twice."""


class _Transient(ProviderError):
    """One try failed in a way another may not (429, 502-504, no connection, a timeout):
    the message says how, never the key."""

    def __init__(self, problem: str, status: int | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(problem)
        self.status = status
        self.retry_after_s = retry_after_s


class _NotFound(ProviderError):
    """404/410 for something other than an offer; callers decide what it means (``error``
    is the body's error code, "" when it has none)."""

    def __init__(self, message: str, error: str = "") -> None:
        super().__init__(message)
        self.error = error


def _describe(exc: BaseException, scrub: Callable[[str], str]) -> str:
    detail = _clean(scrub(str(exc)))[:200]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _message(body: Any, text: str) -> str:
    """What vast.ai said: ``msg``, ``message`` or ``detail`` of a JSON body (endpoints differ,
    rate-limits-and-errors.mdx), else the plain text."""
    if isinstance(body, dict):
        for key in ("msg", "message", "detail"):
            if body.get(key):
                return str(body[key])
        return ""
    return text if isinstance(text, str) else ""


def _epoch(text: str | None) -> float | None:
    """A header's number of seconds (``Retry-After``, ``X-RateLimit-Reset``), None when
    absent or not a finite number at or above zero (an HTTP date is not read)."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 <= value < float("inf") else None


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _clean(text: str) -> str:
    """Server text is untrusted: no control characters into our messages and logs."""
    return _CONTROL_CHARS.sub(" ", text).strip()
