"""Destroy this agent's own instance through its provider.

vast.ai: ``DELETE {VAST_URL}/api/v0/instances/$CONTAINER_ID/`` with the
instance's own ``CONTAINER_API_KEY`` (docs/vast.md). The instance is gone when
vast.ai said so (``success: true``, or ``404 not_found``: already gone) *and*
a lookup (``GET /api/v0/instances/$CONTAINER_ID/``) no longer finds it
(``{"instances": null}``, a 404 whose body says the instance is not found, or
the instance's key refused right after the accepted delete);
otherwise the delete is sent again, under the one retry policy
(``vast_manager.common.retry``). A key vast.ai refuses
("Invalid user key", whatever the status) is not an instance that is gone.
If the instance survives every attempt, ``InstanceSurvived`` is raised and the
agent exits with its own status (``vast-agent run`` exit 4), never as if it
had worked. Local: nothing to destroy; the agent process exits and its
provider sees it end. The key is never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from vast_manager.common.retry import Backoff, retrying

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: What vast.ai says of a key it does not accept (vast-cli ``vastai/cli/main.py``).
_AUTH_MESSAGES = ("invalid user key", "session expired", "requires login")
#: ``error`` of a destroy whose instance no longer exists (OpenAPI: not_found; dstack:
#: no_such_instance).
_GONE_ERRORS = frozenset({"not_found", "no_such_instance"})


class SelfDestroyError(Exception):
    """The instance could not be destroyed."""


class InstanceSurvived(SelfDestroyError):
    """Every attempt to destroy the instance ended with it still there (or unconfirmed)."""


class _NotYet(Exception):
    """One delete and its lookup left the instance there, or unconfirmed; says why."""


def _said(status: int, text: str) -> tuple[dict[str, Any], str]:
    """The JSON object answered (or {}) and a short account of it for messages."""
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    msg = str(body.get("msg") or body.get("message") or body.get("detail") or text or "")
    msg = " ".join(msg.split())[:160]
    error = str(body.get("error") or "")
    return body, f"HTTP {status}" + (f" {error}" if error else "") + (f": {msg}" if msg else "")


def _refused_key(status: int, body: dict[str, Any], said: str) -> bool:
    return status == 401 or body.get("error") == "auth_error" or any(
        m in said.lower() for m in _AUTH_MESSAGES
    )


async def destroy_vast_instance(
    container_id: str,
    api_key: str,
    *,
    vast_url: str = "https://console.vast.ai",
    session: aiohttp.ClientSession | None = None,
    attempts: int = 8,
    base_delay_s: float = 1.0,
    cap_delay_s: float = 30.0,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> None:
    """Destroy instance ``container_id``; returns once vast.ai said so and a lookup agrees.

    Raises ``SelfDestroyError`` when vast.ai refuses the key (retrying cannot help),
    ``InstanceSurvived`` when ``attempts`` deletes left it in place or unconfirmed.
    """
    url = f"{vast_url.rstrip('/')}/api/v0/instances/{container_id}/"
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
    own = session is None
    http = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    tries = retrying(
        Backoff(base_s=base_delay_s, cap_s=cap_delay_s, factor=1.5),
        retry_on=lambda exc: isinstance(exc, _NotYet),
        attempts=attempts,
        sleep=sleep,
        log=log,
        what=f"destroying instance {container_id}",
    )
    try:
        async for attempt in tries:
            with attempt:
                try:
                    why = await _delete_and_confirm(http, url, headers, container_id)
                except aiohttp.ClientError as exc:
                    why = type(exc).__name__
                except TimeoutError:
                    why = "timed out"
                if why:
                    raise _NotYet(why)
    except _NotYet as last:
        raise InstanceSurvived(
            f"instance {container_id} is still there after {attempts} destroy attempts ({last})"
        ) from None
    finally:
        if own:
            await http.close()


async def _delete_and_confirm(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], container_id: str
) -> str:
    """One delete and the lookup after it: "" when the instance is gone, else why not."""
    async with http.delete(url, headers=headers, json={}) as resp:
        status, text = resp.status, await resp.text()
    body, said = _said(status, text)
    if status in RETRY_STATUSES:
        return f"the delete answered {said}"
    if _refused_key(status, body, said):
        raise SelfDestroyError(
            f"vast.ai refused CONTAINER_API_KEY for instance {container_id} ({said})"
        )
    gone = status == 404 or (body.get("success") is False and body.get("error") in _GONE_ERRORS)
    if not gone and not (200 <= status < 300 and body.get("success") is True):
        return f"vast.ai did not destroy it ({said})"
    # Said so; now look it up. The instance's key may die with the instance (vast.ai
    # does not say): a refused key right after an accepted delete counts as gone.
    async with http.get(url, headers=headers, params={"owner": "me"}) as resp:
        status, text = resp.status, await resp.text()
    body, said = _said(status, text)
    if status == 200 and body.get("instances") is None and "instances" in body:
        log.info("instance %s destroyed (confirmed gone)", container_id)
        return ""
    # A 404 is gone only when vast.ai's body says so: a 404 does not always mean gone.
    gone = status == 404 and body.get("error") in _GONE_ERRORS
    if gone or _refused_key(status, body, said):
        log.info("instance %s destroyed (its lookup answered %s)", container_id, said)
        return ""
    if status == 200 and isinstance(body.get("instances"), dict):
        state = body["instances"].get("actual_status")
        return f"the delete was accepted but the instance is still listed (status {state})"
    return f"the lookup after the delete answered {said}"


async def self_destroy(
    provider: str,
    *,
    container_id: str | None,
    api_key: str | None,
    vast_url: str = "https://console.vast.ai",
    session: aiohttp.ClientSession | None = None,
) -> None:
    """Destroy this instance through ``provider`` (``vast`` or ``local``)."""
    if provider == "local":
        log.info("local provider: nothing to destroy; the agent exits")
        return
    if provider != "vast":
        raise SelfDestroyError(f"unknown provider {provider!r}")
    if not container_id or not api_key:
        raise SelfDestroyError("CONTAINER_ID and CONTAINER_API_KEY are needed to self-destroy")
    await destroy_vast_instance(container_id, api_key, vast_url=vast_url, session=session)
