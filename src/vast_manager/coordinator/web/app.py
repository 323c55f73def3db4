"""The coordinator's HTTP face: agent endpoints and operator API (docs/protocol.md).

``create_app(settings, store, provider, clock)`` builds the aiohttp
application; its state lives under one typed ``web.AppKey`` and the monitor
loop in ``cleanup_ctx``. Handlers decode, check and call the core
(``ingest``, ``deploy``, ``monitor``); every error answer is an error
JSON body (docs/protocol.md), every agent answer carries ``X-VM-Server-Time`` and, once the
request's signature verified, ``X-VM-Signature``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.operations.autopilot_loop import Autopilot
from vast_manager.coordinator.operations.deploy import Deployer
from vast_manager.coordinator.operations.model_keeper import ModelKeeper
from vast_manager.coordinator.operations.monitor import HeartbeatTracker, Monitor
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web import agent_api, operator_api
from vast_manager.coordinator.web.auth import (
    MAX_BODY_BYTES,
    AgentAuth,
    AgentRecord,
)
from vast_manager.coordinator.web.core import CORE, Core
from vast_manager.coordinator.web.dashboard import setup_dashboard
from vast_manager.coordinator.web.guard import Guard
from vast_manager.coordinator.web.http import error_middleware

log = logging.getLogger(__name__)

# --- the published API description -----------------------------------------------------


@functools.cache
def openapi_document() -> bytes:
    """docs/openapi.yaml as JSON (packaged as coordinator/web/data/openapi.json)."""
    data = importlib.resources.files("vast_manager.coordinator.web") / "data"
    return (data / "openapi.json").read_bytes()


async def _openapi(request: web.Request) -> web.Response:
    # No token: the description holds no secret, and clients need it before they have one.
    return web.Response(body=openapi_document(), content_type="application/json")


# --- the application ------------------------------------------------------------------


def agent_lookup(reads: Reads) -> Callable[[str], AgentRecord | None]:
    """``AgentAuth``'s lookup: an agent's record from the store (None: never issued)."""

    def lookup(agent_id: str) -> AgentRecord | None:
        row = reads.get_agent(agent_id)
        return None if row is None else AgentRecord(agent_id, bool(row["revoked"]))

    return lookup


def create_app(
    settings: Settings,
    store: Store,
    provider: Provider,
    clock: policy.Clock = time.time,
    *,
    run_monitor: bool = True,
) -> web.Application:
    """The coordinator application. ``run_monitor=False`` leaves the loop to the caller
    (tests drive ``app[CORE].monitor.tick()`` with an injected clock)."""
    started_second = int(clock())

    auth = AgentAuth(settings.fleet_secrets, agent_lookup(store), not_before=started_second,
                     nonces_per_agent=settings.nonces_per_agent)
    auth.preload(store.agent_states())
    tracker = HeartbeatTracker(settings.silence_grace_s, settings.next_heartbeat_s)
    monitor = Monitor(settings, store, provider, clock, tracker,
                      on_agent_revoked=auth.mark_revoked)
    monitor.seed(clock())
    guard = Guard(clock, settings.admin_failures_per_minute)
    deployer = Deployer(settings, store, provider, clock, destroy=monitor.destroy,
                        account=monitor.account)
    models = ModelKeeper(store, clock, settings.model_refit_interval_s)
    core = Core(settings, store, provider, clock, auth, tracker, monitor, deployer, guard,
                float(started_second), models,
                Autopilot(settings, store, provider, deployer, monitor, models, clock))

    # Bodies are read (and bounded) by read_body, so aiohttp's own limit never answers first.
    app = web.Application(middlewares=[error_middleware], client_max_size=2 * MAX_BODY_BYTES)
    app[CORE] = core

    agent_api.add_routes(app)
    operator_api.add_routes(app)
    app.router.add_get("/openapi.json", _openapi)
    setup_dashboard(app, admin_token=settings.admin_token, session_ttl_s=settings.session_ttl_s,
                    clock=clock, throttle=guard.credentials, on_refused=guard.refused)

    app.on_startup.append(_autopilot_start_up)
    app.on_cleanup.append(_close_models)
    if run_monitor:
        app.cleanup_ctx.append(_monitor_ctx)
    return app


async def _close_models(app: web.Application) -> None:
    app[CORE].models.close()  # the rate model's worker process, if one was started


async def _autopilot_start_up(app: web.Application) -> None:
    line = await app[CORE].autopilot.start_up()
    if app[CORE].autopilot.configured:
        log.warning("%s", line)


async def _monitor_ctx(app: web.Application) -> AsyncIterator[None]:
    """The background loops: the monitor, the rate model's refits, the autopilot."""
    core = app[CORE]
    tasks = [asyncio.create_task(core.monitor.run(), name="coordinator-monitor"),
             asyncio.create_task(core.models.run(), name="coordinator-rate-model")]
    if core.autopilot.configured:
        tasks.append(asyncio.create_task(core.autopilot.run(), name="coordinator-autopilot"))
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
