"""Destroy this agent's own instance through its provider.

vast.ai: ``DELETE {VAST_URL}/api/v0/instances/$CONTAINER_ID/`` with the
instance's own ``CONTAINER_API_KEY`` (reference/vast-api.md), retried and
idempotent (404: already gone). Local: nothing to destroy; the agent process
exits and its provider sees it end. The key is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

log = logging.getLogger("agent.selfdestroy")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class SelfDestroyError(Exception):
    """The instance could not be destroyed."""


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
    """Destroy instance ``container_id``; returns once vast.ai says it is gone (or was)."""
    url = f"{vast_url.rstrip('/')}/api/v0/instances/{container_id}/"
    headers = {"Authorization": f"Bearer {api_key}"}
    own = session is None
    http = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        for attempt in range(1, attempts + 1):
            why: str
            try:
                async with http.delete(url, headers=headers) as resp:
                    await resp.read()
                    if resp.status in (200, 204):
                        log.info("instance %s destroyed", container_id)
                        return
                    if resp.status == 404:
                        log.info("instance %s was already gone", container_id)
                        return
                    if resp.status not in RETRY_STATUSES:
                        raise SelfDestroyError(
                            f"vast.ai refused to destroy instance {container_id}: {resp.status}"
                        )
                    why = f"answered {resp.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                why = f"{type(exc).__name__}"
            if attempt == attempts:
                raise SelfDestroyError(
                    f"could not destroy instance {container_id} after {attempts} tries ({why})"
                )
            delay = min(cap_delay_s, base_delay_s * 1.5 ** (attempt - 1))
            delay *= 0.5 + random.random() / 2
            log.warning("destroying instance %s: %s; retrying in %.1f s", container_id, why, delay)
            await sleep(delay)
    finally:
        if own:
            await http.close()


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
