"""``/api/fake/*``: the fault controls of ``serve --provider fake`` (``vast-manager fake``).

Each route injects one of vast.ai's faults into the in-process fake vast.ai
(``providers.fakevast``) so an operator can rehearse a drill of docs/operations.md;
the coordinator then meets it over HTTP as it would meet vast.ai. Instances are named by
the coordinator's own id (what ``status`` shows). On any other provider every route
answers 404: nothing here touches a real account.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from vast_manager.coordinator.exceptions import InvalidInput, NotFound
from vast_manager.coordinator.providers.fakevast import STATUSES, FakeVast
from vast_manager.coordinator.web.core import Core
from vast_manager.coordinator.web.operator_api import _integer, _json_object, _number, _text

Handler = Callable[[Core, web.Request], Awaitable[Any]]
#: The longest a fault may last, in seconds (a week).
MAX_FOR_S = 7 * 86_400.0
MAX_TEXT = 500
#: Statuses an operator may set directly (the others have their own drill).
SETTABLE = sorted(s for s in STATUSES if s is not None)
#: The webhook slugs the fake sends with each drill: ``outbid`` and ``low_credit`` are
#: vast.ai's (notification-webhooks.mdx); the others are the fake's own.
SLUGS = {"offline": "instance_offline", "outbid": "outbid", "funds": "low_credit"}


def _fake(core: Core) -> FakeVast:
    fake = getattr(core.provider, "fake", None)
    if not isinstance(fake, FakeVast):
        raise NotFound("No fake vast.ai here: serve with --provider fake.")
    return fake


def _vast_id(core: Core, body: dict[str, Any], fake: FakeVast) -> int:
    instance_id = _integer(body, "instance_id", required=True)
    row = core.store.get_instance(int(instance_id or 0))
    pid = row["provider_instance_id"] if row is not None else None
    if pid is None or int(pid) not in fake.instances:
        raise NotFound(f"Instance {instance_id} has no instance on the fake vast.ai.")
    return int(pid)


def _for_s(body: dict[str, Any]) -> float | None:
    value = _number(body, "for_s")
    if value is not None and value > MAX_FOR_S:
        raise InvalidInput(f"Field 'for_s' must be at most {MAX_FOR_S:g}.", field="for_s")
    return value


async def _notify(core: Core, fake: FakeVast, kind: str, subject: str) -> int | None:
    """Deliver the drill's webhook when a secret is configured (else polling finds it)."""
    secret = core.settings.vast_webhook_secret
    if not secret:
        return None
    fake.webhook_secret = secret
    fake.webhook_url = fake.webhook_url or core.settings.coordinator_url + "/v1/vast/webhook"
    return await fake.notify(SLUGS.get(kind, kind), subject, f"{subject} (fake vast.ai)")


async def state(core: Core, request: web.Request) -> Any:
    fake = _fake(core)
    fake.accrue()
    return {
        "url": fake.url, "credit_usd": round(fake.credit, 4),
        "search_quota_per_day": fake.search_quota_per_day,
        "searches_today": fake.searches_today(),
        "key_revoked": fake.api_key.startswith("revoked-"),
        "pending_price_increases": list(fake.pending_increases.values()),
        "instances": [{"vast_id": i, "actual_status": r.get("actual_status"),
                       "status_msg": r.get("status_msg"), "bid_price": r.get("bid_price"),
                       "dph_total": r.get("dph_total")} for i, r in fake.instances.items()],
        "webhook_deliveries": len(fake.webhook_deliveries),
        "simulated": "every dollar and rate of the fake vast.ai is simulated",
    }


async def offline(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    pid = _vast_id(core, body, fake)
    for_s = _for_s(body) or 600.0
    fake.host_trouble(pid, "offline", for_s, "host offline (fake vast.ai)")
    hook = await _notify(core, fake, "offline", f"Instance {pid} is offline")
    return {"ok": True, "message": f"vast.ai instance {pid} is offline for {for_s:g} s.",
            "webhook_status": hook}


async def outbid(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    pid = _vast_id(core, body, fake)
    fake.outbid(pid, _for_s(body), _number(body, "winning_bid"))
    hook = await _notify(core, fake, "outbid", f"Instance {pid} was outbid")
    return {"ok": True, "message": f"vast.ai instance {pid} is outbid (stopped).",
            "webhook_status": hook}


async def set_status(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    pid = _vast_id(core, body, fake)
    status = _text(body, "status", required=True, max_chars=20)
    if status not in SETTABLE:
        raise InvalidInput(f"Field 'status' must be one of {', '.join(SETTABLE)}.",
                           field="status")
    fake.set_status(pid, status, _text(body, "status_msg", required=False, max_chars=MAX_TEXT))
    return {"ok": True, "message": f"vast.ai instance {pid} shows {status}."}


async def price_increase(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    pid = _vast_id(core, body, fake)
    rent = _number(body, "rent_per_hour")
    if rent is None:
        raise InvalidInput("Field 'rent_per_hour' is missing.", field="rent_per_hour")
    row = fake.raise_price(pid, rent)
    return {"ok": True, "pending": row, "message": f"The host of vast.ai instance {pid} asks "
            f"${rent:g}/h from its contract's end (pending increase "
            f"{row['pending_price_increase_id']})."}


async def funds(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    add = _number(body, "add_usd", positive=False)
    if add is None:
        raise InvalidInput("Field 'add_usd' is missing.", field="add_usd")
    if abs(add) > 1e6:
        raise InvalidInput("Field 'add_usd' must be within 1,000,000.", field="add_usd")
    fake.add_credit(add)
    hook = await _notify(core, fake, "funds", "Credit is low") if fake.credit <= 0 else None
    return {"ok": True, "credit_usd": round(fake.credit, 4), "webhook_status": hook,
            "message": f"Simulated funds now ${fake.credit:.2f}."}


async def revoke_key(core: Core, request: web.Request) -> Any:
    _fake(core).revoke_account_key()
    return {"ok": True, "message": "The fake vast.ai refuses the account's key from now on."}


async def quota(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    n = _integer(body, "searches_per_day", minimum=0, maximum=1_000_000)
    fake.search_quota_per_day = n
    said = "no quota" if n is None else f"{n} searches a UTC day"
    return {"ok": True, "message": f"The fake vast.ai's search quota: {said} "
            f"({fake.searches_today()} made today)."}


async def report(core: Core, request: web.Request) -> Any:
    fake, body = _fake(core), await _json_object(request)
    machine = _integer(body, "machine_id", required=True)
    problem = _text(body, "problem", required=True, max_chars=100)
    message = _text(body, "message", required=False, max_chars=MAX_TEXT) or ""
    fake.add_report(int(machine or 0), str(problem), message)
    return {"ok": True, "message": f"A renter reported machine {machine}: {problem}."}


def add_routes(app: web.Application, endpoint: Callable[[Handler], Any]) -> None:
    app.router.add_get("/fake", endpoint(state))
    for name, handler in (("offline", offline), ("outbid", outbid), ("status", set_status),
                          ("price-increase", price_increase), ("funds", funds),
                          ("revoke-key", revoke_key), ("quota", quota), ("report", report)):
        app.router.add_post(f"/fake/{name}", endpoint(handler))
