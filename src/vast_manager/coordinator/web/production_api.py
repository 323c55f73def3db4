"""``POST /api/production``: a cluster's own counts, under its own token.

The token is ``VM_PRODUCTION_TOKEN``, never the admin token (a settings rule keeps them
apart): a cluster that reports its production can do nothing else here, and the admin
token is refused on this path. Failed attempts count against the address as the admin
token's do. The body's rules are ``operations.production_report``'s.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vast_manager.coordinator.exceptions import Refusal
from vast_manager.coordinator.operations.production_report import parse_report
from vast_manager.coordinator.web.auth import admin_authorized
from vast_manager.coordinator.web.core import Core
from vast_manager.coordinator.web.dashboard import THROTTLE, throttled

PATH = "/api/production"


def authorize_production(request: web.Request, token: str) -> None:
    """Raise ``Refusal`` unless the request carries ``VM_PRODUCTION_TOKEN``."""
    if not token:
        raise Refusal(403, "forbidden", "POST /api/production is off: the coordinator has no "
                      "VM_PRODUCTION_TOKEN.")
    refusal = throttled(request, "production-token attempts")
    if refusal is not None:
        raise refusal
    if admin_authorized(request.headers.get("Authorization"), token):
        request.config_dict[THROTTLE].succeeded(request.remote)
        return
    request.config_dict[THROTTLE].failed(request.remote)
    raise Refusal(401, "unauthorized", "POST /api/production needs Authorization: Bearer "
                  "<VM_PRODUCTION_TOKEN> (the admin token is not accepted here).")


async def report_production(core: Core, request: web.Request, body: dict[str, Any]) -> Any:
    """Check the report whole against the active instances, then hand it to the cluster
    source; the next monitor round judges on it."""
    active = await core.store.read(
        lambda reads: {int(r["id"]) for r in reads.active_instances(("id",))})
    counts = parse_report(body, active.__contains__)
    core.monitor.cluster.report(counts, core.clock())
    return {"ok": True, "instances": len(counts),
            "message": f"Took the counts of {len(counts)} instance(s); the next monitor "
                       "round judges them."}
