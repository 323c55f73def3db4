"""The coordinator's HTTP face: agent endpoints and operator API (docs/protocol.md).

``serve(runtime)`` builds the aiohttp application over a runtime the composition root
(``coordinator.runtime``) built: the agents' routes at ``/v1/*``, each behind
``agent_api.agent_endpoint``, the operators' sub-application at ``/api`` behind
``operator_api.operator_auth``,
and beside them ``/metrics``, ``/openapi.json`` and the dashboard. Its state lives under
one typed ``web.AppKey``; it starts no loop (the runtime does). Every error answer is an
error JSON body (docs/protocol.md), every agent answer carries ``X-VM-Server-Time`` and,
once the request's signature verified, ``X-VM-Signature``.

``create_app(settings, store, provider, clock)`` is the one call tests and benches use:
a runtime on that store, served, with the runtime's start and stop tied to the app's.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from vast_manager.coordinator.decisions import pace, policy
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.runtime import Runtime
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web import (
    agent_api,
    discovery_api,
    fake_api,
    operator_api,
    vast_webhook,
)
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


def serve(runtime: Runtime, *, outer: Middleware | None = None) -> web.Application:
    """The application serving ``runtime``. ``outer``: a middleware run before all others
    (the listener split of ``web.server``)."""
    settings, clock = runtime.settings, runtime.clock
    auth = AgentAuth(settings.fleet_secrets, agent_lookup(runtime.store),
                     not_before=runtime.started_second,
                     nonces_per_agent=settings.nonces_per_agent)
    auth.preload(runtime.store.agent_states())
    runtime.on_agent_revoked(auth.mark_revoked)
    guard = Guard(clock, settings.admin_failures_per_minute)
    core = Core(runtime, auth, guard)

    # Bodies are read (and bounded) by read_body, so aiohttp's own limit never answers first.
    middlewares = [error_middleware] if outer is None else [outer, error_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=2 * MAX_BODY_BYTES)
    app[CORE] = core
    operators = operator_api.operators_app()
    discovery_api.add_routes(operators, operator_api.operator_endpoint)
    fake_api.add_routes(operators, operator_api.operator_endpoint)
    vast_webhook.add_routes(app)
    agent_api.add_routes(app)
    app.add_subapp("/api", operators)
    app.router.add_get("/metrics", operator_api.metrics_handler(core))
    app.router.add_get("/openapi.json", _openapi)
    setup_dashboard(app, admin_token=settings.admin_token, session_ttl_s=settings.session_ttl_s,
                    clock=clock, throttle=guard.credentials, on_refused=guard.refused)
    return app


def create_app(
    settings: Settings,
    store: Store,
    provider: Provider,
    clock: policy.Clock = time.time,
    *,
    run_monitor: bool = True,
    rng: pace.RandomSource | None = None,
) -> web.Application:
    """A runtime on ``store``, served; the app's startup starts it and its cleanup stops
    it. ``run_monitor=False`` leaves the loops to the caller (tests drive
    ``app[CORE].monitor.tick()`` with an injected clock); ``rng`` draws the heartbeat
    jitter."""
    runtime = Runtime(settings, store, provider, clock, rng=rng)
    app = serve(runtime)
    app.cleanup_ctx.append(runtime.hosted(loops=run_monitor))
    return app
