"""A stateful fake of vast.ai's REST API on loopback: the tests' and benches' vast.ai, and
the one ``vast-manager serve --provider fake`` runs in-process for an operator's drills
(docs/operations.md, "Rehearsing on the fake vast.ai"). Every number it bills is simulated.

It is pinned to what vast.ai publishes, not to what the coordinator expects:
every status, error body and shape below is one that docs/vast.md cites
(vast.ai's OpenAPI description ``api-reference/openapi.yaml`` and docs at
c6246226, vast-cli at 55679830, dstack's vastai backend at 511c318c). Where
the real API refuses an input, the fake refuses it the same way:

- a wrong key is ``404 {"error": "auth_error", "msg": "Invalid user key"}`` on the
  offers search and the v1 instance list (with ``success: false`` on the list),
  ``401`` with the same body elsewhere; no key at all is ``403 "This action
  requires login."`` on the v1 list;
- an offer that does not exist is ``404 invalid_args`` whose message names
  ``no_such_ask``; one rented meanwhile is ``410 no_such_ask``;
- ``429`` is plain text ("API requests too frequent", the offers search) or
  ``{"detail": ...}`` (create, show, manage, list), or the destroy's
  ``{"success": false, "error": "rate_limit_exceeded", ...}``; never a
  ``Retry-After``;
- a create with no image, an ``onstart`` over 4048 characters, an unknown run
  type, a label over 1024 characters, or a body that is not an object is
  ``400 invalid_args``;
- statuses are the instance's ``actual_status`` (null, ``loading``,
  ``created``, ``running``, ``exited``, ``unknown``, ``offline``, ``stopped``)
  with its ``status_msg``; a stopped instance stays ``stopped``;
- destroy answers ``{"success": true}``; an instance that does not exist is
  ``404 {"success": false, "error": "not_found", ...}``; show answers
  ``{"instances": null}`` for it.

Switches for faults: sell one offer twice (``sell_twice``); answer 429 (or
another status) to the next N requests (``fail_next``, ``fail_status``,
``rate_limit_plain_text``); lose the answer of a create that happened
(``lose_create_answers``); sell an offer to a racer between search and create
(``gone_at_create``); answer creates ``success: false`` although they made an
instance (``create_fails_with_instance``, as dstack saw vast.ai do); refuse
destroys (``refuse_destroys``) or accept them and leave the instance
(``keep_after_destroy``); set any status (``set_status``). The texts of
messages vast.ai does not publish (e.g. why a create failed) are the fake's
own, and say so.

Of 2026 (docs/vast.md, from "Searches: the daily quota, and the one offer cache" to
"Machine reports"): ``search_quota_per_day`` answers the search
``429 {"error": "search_quota_exceeded"}`` with ``X-RateLimit-Reset`` (the next UTC
midnight) once that many searches were made this UTC day (the ``vastai`` 1.9.1 client's
reading; the quota's size and the body's other words are the fake's); ``retry_after_s``
puts a ``Retry-After`` on the other 429s; ``raise_price`` files a host's pending price
increase (``GET /api/v0/instances/pending-price-increases/``, answered by ``PUT
.../accept-price-increase/`` or ``.../reject-price-increase/``, vast-cli
``vastai/api/price_increase.py``): accepted, the new price bills from the contract's end
date; rejected, the instance is stopped then; ``outbid`` may name the winning bid, and
``PUT /api/v0/instances/bid_price/{id}/`` at or above it runs the instance again;
``add_report`` files a renter's report (``GET /api/v0/machines/{id}/reports/``); with
``webhook_url`` and ``webhook_secret``, ``notify`` POSTs a signed notification as
notification-webhooks.mdx describes (its ``notif_type`` slugs other than ``outbid`` and
``low_credit`` are the fake's own).

Each created instance gets its own key (``instance_keys``, handed to it as
``CONTAINER_API_KEY``) that can show, change or destroy that instance only, as
on vast.ai; it stops working when the instance is destroyed (what vast.ai
does is undocumented: ``instance_key_outlives_instance`` switches to the other
reading). ``billing`` keeps when each instance began and stopped billing (the
fake's clock), so tests and benches can count instance-minutes.

As vast.ai bills (docs/vast.md, "Billing and the account"; billing.mdx and the
OpenAPI description at c6246226): offers carry ``storage_cost`` ($/GB/month),
``inet_down_cost`` and ``inet_up_cost`` ($/GB), and a search's
``allocated_storage`` prices ``dph_total`` (an offer's stored ``dph_total`` is
at ``PRICED_STORAGE_GB``); ``accrue`` bills dollars by part (``dollars``) into
``credit``: rent while running (at the bid for a create with a ``price``),
storage for ``disk_space`` in every status but offline, bandwidth as
``add_traffic`` says; at zero credit every instance is stopped and stays so
until started (``add_credit``, PUT state running). ``GET /api/v0/users/current``
answers ``balance`` and ``credit``. With ``loading`` an instance is null, then
``loading`` for its image pull (``image_gb`` at the offer's ``inet_down``), then
``running`` (hello-world.mdx's progression); ``never_loads`` machines never
finish. ``host_trouble`` shows offline, unknown, rebooting or frozen for a while
(``frozen`` is SkyPilot's, not in vast.ai's docs), ``outbid`` stops an
interruptible instance. ``min_interval_s`` answers 429 inside a minimum interval
per endpoint (rate-limits-and-errors.mdx); ``revoke_account_key`` refuses the
account's key from then on.

With a ``launcher`` (``SimAgents``), create really starts the instance: a
``vast-agent run`` process on the simulated cuzk, with the create's ``env``
plus what vast.ai sets inside a container (``CONTAINER_ID``,
``CONTAINER_API_KEY``, ``VAST_CONTAINERLABEL``, ``PUBLIC_IPADDR``,
``GPU_COUNT``) and ``VAST_URL`` pointing at the fake (the fake's own: vast.ai
sets no such variable, and the agent defaults to console.vast.ai); destroy
stops it and everything it started.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import hmac
import itertools
import json
import operator
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import psutil
from aiohttp import web

from vast_manager.coordinator.offers import parse_offer
from vast_manager.coordinator.providers.local.provider import simulated_machine_env

FAKE_API_KEY = "fake-account-key-0123456789abcdef"
#: The ``onstart`` limit of the OpenAPI description ("limited to 4048 characters").
MAX_ONSTART_CHARS = 4048
#: The label limit of the manage endpoint's schema (``maxLength: 1024``).
MAX_LABEL_CHARS = 1024
#: Words a create's ``runtype`` may hold: the OpenAPI enum, and the CLI's own
#: spellings it sends space-separated (``ssh_direc ssh_proxy``, vast.py ``get_runtype``).
RUNTYPE_WORDS = frozenset({
    "ssh", "jupyter", "args", "ssh_proxy", "ssh_direct", "ssh_direc", "jupyter_proxy",
    "jupyter_direct", "jupyter_direc",
})
#: ``actual_status`` values vast.ai shows (docs/vast.md); ``set_status`` takes no other.
STATUSES = frozenset({
    None, "loading", "created", "running", "exited", "unknown", "offline", "stopped",
    "rebooting", "frozen",
})
#: Storage in $/GB/month is billed per second over a month of 30 days (docs/vast.md).
HOURS_PER_MONTH = 30 * 24.0
#: The disk an offer's stored ``dph_total`` is priced at (``allocated_storage``): a search
#: for another disk answers another ``dph_total`` (storage priced by size, docs/vast.md).
PRICED_STORAGE_GB = 250.0
#: Seconds vast.ai shows ``null`` before ``loading`` (the fake's figure).
SCHEDULING_S = 10.0
#: The text docker leaves in ``status_msg`` when a container cannot start (dstack's check).
OCI_START_FAILURE = (
    "Error response from daemon: failed to create task for container: failed to create "
    "shim task: OCI runtime create failed: runc create failed: unable to start container "
    "process: error during container init: nvidia-container-cli: device error: unknown device"
)

_OPS = ("eq", "neq", "gt", "gte", "lt", "lte", "in", "notin")
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq,
    "neq": operator.ne,
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}
# The parsed JSON body, read once by the recording middleware.
_BODY = web.RequestKey("fakevast_body", object)
_QUERY_META = frozenset({"order", "type", "limit", "allocated_storage", "disable_bundling"})
# What an instance's own key may touch: that one instance (vast.ai's CONTAINER_API_KEY).
_INSTANCE_PATH = re.compile(r"^/api/v0/instances/(\d+)/$")


class Launcher(Protocol):
    """Starts and stops what runs inside a fake instance."""

    def start(self, instance: dict[str, Any], offer: dict[str, Any], env: dict[str, str]) -> None:
        ...

    async def stop(self, instance_id: int) -> None: ...

    async def close(self) -> None: ...


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class Billing:
    """When one instance billed: from its create to its destroy (the fake's clock).

    vast.ai bills compute while running and storage while the instance exists,
    stopped or not (docs/vast.md), so an instance bills from create to destroy."""

    instance_id: int
    created_at: float
    destroyed_at: float | None = None

    def seconds(self, since: float, until: float) -> float:
        """Seconds billed between ``since`` and ``until``."""
        end = until if self.destroyed_at is None else min(until, self.destroyed_at)
        return max(0.0, end - max(since, self.created_at))


@dataclass
class FakeVast:
    """The fake server and its state; use ``async with FakeVast() as fake: fake.url``."""

    api_key: str = FAKE_API_KEY
    clock: Callable[[], float] = time.time
    #: Largest page of GET /api/v1/instances/ (the OpenAPI description: max 25).
    page_size: int = 25
    offers: dict[int, dict[str, Any]] = field(default_factory=dict)
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    #: Offer ids that may be rented once more although already rented (vast.ai
    #: sells the same offer twice to racing callers).
    sell_twice: set[int] = field(default_factory=set)
    #: Answer ``fail_status`` to this many next requests (any endpoint).
    fail_next: int = 0
    #: Status used by ``fail_next``: 429 in the endpoint's documented shape, else plain text.
    fail_status: int = 429
    #: 429 as plain text on every endpoint ("The response body is often plain text").
    rate_limit_plain_text: bool = False
    #: Creates that succeed but whose answer is lost (a 504 instead), this many.
    lose_create_answers: int = 0
    #: Creates that answer ``success: false`` with a ``new_contract``: the instance
    #: exists (``stopped``, billing), this many.
    create_fails_with_instance: int = 0
    #: HTTP status of such an answer (dstack reads both a 200 and an error status).
    create_fail_status: int = 200
    #: Destroys answered 200 ``success: false`` (the instance stays), this many.
    refuse_destroys: int = 0
    #: Destroys answered ``success: true`` that leave the instance in place, this many.
    keep_after_destroy: int = 0
    #: Status new instances start in (vast.ai: null, then loading, running).
    initial_status: str | None = "running"
    #: Offer ids a racer rents between our search and our create: search still
    #: lists them, create answers ``410 no_such_ask``.
    gone_at_create: set[int] = field(default_factory=set)
    #: Each instance's own key (CONTAINER_API_KEY inside it).
    instance_keys: dict[int, str] = field(default_factory=dict)
    #: An instance's key still shows it (as ``null``) and destroys it (404) after its
    #: destroy.
    instance_key_outlives_instance: bool = False
    #: When each instance billed.
    billing: dict[int, Billing] = field(default_factory=dict)
    #: Runs each created instance (None: instances are rows only).
    launcher: Launcher | None = None
    #: New instances go null -> loading (the image pull: ``image_gb`` at the offer's
    #: ``inet_down``) -> running, on the fake's clock; False: ``initial_status`` at once.
    loading: bool = False
    #: GB of the image an instance pulls while ``loading``.
    image_gb: float = 5.0
    #: Machines whose instances never finish loading (a stalled pull).
    never_loads: set[int] = field(default_factory=set)
    #: The account's funds (``credit`` of users/current) and ``balance``; billing in
    #: dollars draws the credit down, and at zero every instance is stopped.
    credit: float = 1000.0
    balance: float = 0.0
    #: Dollars billed per instance by part: rent, storage, bandwidth.
    dollars: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Minimum seconds between two requests to one endpoint (``"METHOD /path/"``, ids
    #: replaced by ``{id}``), answered 429 inside it, as vast.ai enforces (docs/vast.md).
    min_interval_s: dict[str, float] = field(default_factory=dict)
    #: Searches answered a UTC day (the fake's clock) before ``search_quota_exceeded``;
    #: None: no quota.
    search_quota_per_day: int | None = None
    #: ``Retry-After`` seconds on the 429s other than the quota's; None: no header.
    retry_after_s: float | None = None
    #: Seconds from a price increase's filing to its contract end date.
    contract_end_s: float = 3600.0
    #: Pending price increases by ``pending_price_increase_id``.
    pending_increases: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Renters' reports by machine id.
    reports: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    #: Where ``notify`` POSTs, and the secret it signs with.
    webhook_url: str | None = None
    webhook_secret: str | None = None
    #: ``(event_id, status)`` of each webhook delivery.
    webhook_deliveries: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ids = itertools.count(30_000_001)
        self._runner: web.AppRunner | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self._dead_keys: dict[int, str] = {}
        self.url = ""
        self._billed_to: dict[int, float] = {}  # when each instance was last billed
        self._loaded_at: dict[int, float] = {}  # when a loading instance starts running
        self._back_at: dict[int, tuple[float, str | None]] = {}  # host trouble ending
        self._stopped_for_funds: set[int] = set()
        self._last_call: dict[str, float] = {}
        self._searches: dict[int, int] = {}  # searches answered by UTC day
        self._pending_ids = itertools.count(501)
        self._contract_ends: dict[int, tuple[float, float | None]] = {}  # iid: (at, new rent)
        self._outbid_by: dict[int, float] = {}  # the winning bid over an outbid instance

    # ---- state helpers for tests -----------------------------------------

    def add_offer(self, offer_id: int, machine_id: int, **fields: Any) -> dict[str, Any]:
        """An offer with sensible defaults: a verified, rentable host with one RTX 4090,
        all of it (48 cores, 257 GB) for the instance."""
        offer: dict[str, Any] = {
            "id": offer_id,
            "ask_contract_id": offer_id,
            "machine_id": machine_id,
            "host_id": machine_id // 10,
            "num_gpus": 1,
            "gpu_name": "RTX 4090",
            "gpu_ram": 24564,
            "gpu_frac": 1.0,
            "cpu_name": "AMD EPYC 7K62",
            "cpu_cores": 48,
            "cpu_cores_effective": 48.0,
            "cpu_ram": 257000,
            "disk_space": 500.0,
            "pcie_bw": 24.5,
            "inet_down": 900.0,
            "inet_up": 500.0,
            "cuda_max_good": 13.0,
            "dph_total": 0.45,
            # $/GB/month and $/GB (OpenAPI ``storage_cost``, ``inet_down_cost``,
            # ``inet_up_cost``); not in dph_total but the storage of allocated_storage.
            "storage_cost": 0.15,
            "inet_down_cost": 0.005,
            "inet_up_cost": 0.005,
            "score": 100.0,
            "reliability2": 0.995,
            "geolocation": "Quebec, CA",
            "verified": True,
            "verification": "verified",
            "external": False,
            "rentable": True,
            "rented": False,
        }
        offer.update(fields)
        storage_h = float(offer["storage_cost"] or 0) * PRICED_STORAGE_GB / HOURS_PER_MONTH
        # What the host asks per hour without the disk (``dph_base``), so that a search
        # with another allocated_storage is priced with that disk.
        offer["dph_base"] = max(0.0, float(offer["dph_total"]) - storage_h)
        self.offers[offer_id] = offer
        return offer

    def add_slice(
        self, offer_id: int, machine_id: int, *, num_gpus: int, host_gpus: int,
        host_cpu_cores: int, host_cpu_ram_mb: int, **fields: Any,
    ) -> dict[str, Any]:
        """An offer of ``num_gpus`` of a host's ``host_gpus``: vast.ai lists the host's
        ``cpu_ram`` and ``cpu_cores`` and the instance's ``cpu_cores_effective``."""
        frac = num_gpus / host_gpus
        return self.add_offer(
            offer_id, machine_id, num_gpus=num_gpus, gpu_frac=frac,
            cpu_cores=host_cpu_cores, cpu_cores_effective=host_cpu_cores * frac,
            cpu_ram=host_cpu_ram_mb, **fields,
        )

    def remove_offer(self, offer_id: int) -> None:
        """The offer is gone (create answers 404 invalid_args: no_such_ask)."""
        self.offers.pop(offer_id, None)

    def set_status(
        self, instance_id: int, status: str | None, status_msg: str | None = None
    ) -> None:
        """What vast.ai shows of the instance now (``actual_status``, ``status_msg``)."""
        if status not in STATUSES:
            raise ValueError(f"vast.ai shows no status {status!r}")
        self.accrue()
        self._loaded_at.pop(instance_id, None)
        self._back_at.pop(instance_id, None)
        row = self.instances[instance_id]
        row["actual_status"] = status
        row["status_msg"] = status_msg
        if status in ("running", "stopped"):
            row["cur_state"] = status

    def add_instance(self, instance_id: int, **fields: Any) -> dict[str, Any]:
        """An instance created outside our API calls (another fleet's, a person's)."""
        row: dict[str, Any] = {
            "id": instance_id,
            "label": None,
            "machine_id": 1,
            "actual_status": "running",
            "intended_status": "running",
            "cur_state": "running",
            "next_state": "running",
            "status_msg": None,
            "start_date": self.clock(),
            "extra_env": [],
        }
        row.update(fields)
        self.instances[instance_id] = row
        self.billing[instance_id] = Billing(instance_id, float(row["start_date"]))
        return row

    def calls(self, method: str, path_prefix: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    def destroys_of(self, instance_id: int) -> list[str]:
        """Who asked to destroy this instance, in order: ``account`` or ``instance`` key."""
        out = []
        for r in self.calls("DELETE", f"/api/v0/instances/{instance_id}/"):
            auth = r.headers.get("Authorization")
            key = self.instance_keys.get(instance_id) or self._dead_keys.get(instance_id)
            if auth == f"Bearer {self.api_key}":
                out.append("account")
            elif auth == f"Bearer {key}":
                out.append("instance")
            else:
                out.append("other")
        return out

    # ---- vast.ai as it bills (docs/vast.md "Billing") ---------------------------

    def host_trouble(self, instance_id: int, status: str, for_s: float,
                     status_msg: str | None = None) -> None:
        """The host shows ``status`` (offline, unknown, rebooting, frozen) for ``for_s``
        seconds of the fake's clock, then ``running`` again."""
        self.set_status(instance_id, status, status_msg)
        self._back_at[instance_id] = (self.clock() + for_s, "running")

    def outbid(self, instance_id: int, for_s: float | None = None,
               winning_bid: float | None = None) -> None:
        """A higher bid takes the host: the interruptible instance is ``stopped`` (its disk
        kept and billed), and with ``for_s`` runs again after that long; a bid raised to
        ``winning_bid`` or more (``PUT bid_price``) runs it again at once."""
        self.set_status(instance_id, "stopped",
                        "outbid: a higher bid took the host (fake vast.ai's text)")
        # dstack reads an interruption as cur_state == intended_status == next_state ==
        # "stopped" (its vastai compute.py at 511c318c).
        self.instances[instance_id].update(intended_status="stopped", next_state="stopped")
        if for_s is not None:
            self._back_at[instance_id] = (self.clock() + for_s, "running")
        if winning_bid is not None:
            self._outbid_by[instance_id] = winning_bid

    def raise_price(self, instance_id: int, new_rent_per_hour: float) -> dict[str, Any]:
        """The host files a price increase on the instance's contract: a pending row as
        vast-cli's ``list_pending`` documents it (costs per second, $/GB bandwidth)."""
        self.accrue()
        row = self.instances[instance_id]
        offer = self._offer_of(instance_id)
        old_rent = self._rent_of(row, offer)
        disk = float(row.get("disk_space") or PRICED_STORAGE_GB)
        disk_s = float(offer.get("storage_cost") or 0) * disk / HOURS_PER_MONTH / 3600.0
        pid = next(self._pending_ids)
        now = self.clock()
        pending = {
            "pending_price_increase_id": pid, "contract_id": instance_id,
            "host_id": row.get("host_id"),
            "new_gpu_costpersec": new_rent_per_hour / 3600.0,
            "new_disk_ram_costpersec": disk_s,
            "new_bwu_cost": offer.get("inet_up_cost"), "new_bwd_cost": offer.get("inet_down_cost"),
            "new_platform_fee": None,
            "old_gpu_costpersec": old_rent / 3600.0, "old_disk_ram_costpersec": disk_s,
            "old_bwu_cost": offer.get("inet_up_cost"), "old_bwd_cost": offer.get("inet_down_cost"),
            "old_platform_fee": None,
            "contract_end_date": now + self.contract_end_s, "ask_end_date": None,
            "created_at": now,
        }
        self.pending_increases[pid] = pending
        return pending

    def add_report(self, machine_id: int, problem: str, message: str) -> dict[str, Any]:
        """A renter's report against a machine (OpenAPI ``showReports``)."""
        report = {"problem": problem, "message": message,
                  "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))}
        self.reports.setdefault(int(machine_id), []).append(report)
        return report

    async def notify(self, notif_type: str, subject: str, message: str, *,
                     event_id: str | None = None, timestamp: int | None = None,
                     secret: str | None = None) -> int:
        """POST one notification to ``webhook_url``, signed as notification-webhooks.mdx
        says: ``X-Vast-Signature-256: sha256=HMAC(secret, "<X-Vast-Timestamp>.<body>")``.
        ``event_id``, ``timestamp`` and ``secret`` may be forced (a replay, an old or a
        wrongly signed delivery). Returns the receiver's status."""
        if not self.webhook_url:
            raise ValueError("no webhook_url to notify")
        event_id = event_id or secrets.token_hex(16)
        stamp = int(self.clock()) if timestamp is None else int(timestamp)
        body = json.dumps({"event_id": event_id, "user_id": 4242, "notif_type": notif_type,
                           "subject": subject, "message": message,
                           "timestamp": float(self.clock())}).encode()
        key = (secret if secret is not None else self.webhook_secret or "").encode()
        signature = hmac.new(key, str(stamp).encode() + b"." + body, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/json", "X-Vast-Event-Id": event_id,
                   "X-Vast-Delivery-Attempt": "1", "X-Vast-Timestamp": str(stamp),
                   "X-Vast-Signature-256": f"sha256={signature}"}
        async with aiohttp.ClientSession() as session, session.post(
                self.webhook_url, data=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=10)) as resp:
            self.webhook_deliveries.append((event_id, resp.status))
            return resp.status

    def _rent_of(self, row: dict[str, Any], offer: dict[str, Any]) -> float:
        """$/h the instance's GPU rent bills at: a price increase taken, its bid, the ask."""
        for value in (row.get("rent_per_hour"), row.get("bid_price"),
                      offer.get("dph_base", offer.get("dph_total"))):
            if value is not None:
                return float(value)
        return 0.0

    def add_traffic(self, instance_id: int, down_bytes: float, up_bytes: float = 0.0) -> None:
        """Bytes the instance moved: billed at its offer's ``inet_down_cost`` and
        ``inet_up_cost`` per GB, in any state."""
        self.accrue()
        offer = self._offer_of(instance_id)
        usd = (down_bytes * float(offer.get("inet_down_cost") or 0)
               + up_bytes * float(offer.get("inet_up_cost") or 0)) / 1e9
        self._charge(instance_id, "bandwidth", usd)

    def billed_dollars(self, instance_id: int | None = None) -> dict[str, float]:
        """Dollars billed by part (one instance, or all), up to now."""
        self.accrue()
        ids = [instance_id] if instance_id is not None else list(self.dollars)
        out = {"rent": 0.0, "storage": 0.0, "bandwidth": 0.0}
        for iid in ids:
            for part, usd in self.dollars.get(iid, {}).items():
                out[part] += usd
        return out

    def add_credit(self, usd: float) -> None:
        """Funds added; instances stopped at zero stay stopped until started (as on
        vast.ai, docs/vast.md)."""
        self.accrue()
        self.credit += usd

    def revoke_account_key(self) -> None:
        """The account's key is deleted: every call with it is refused from now on."""
        self.api_key = "revoked-" + secrets.token_hex(8)

    def _offer_of(self, instance_id: int) -> dict[str, Any]:
        row = self.instances.get(instance_id) or {}
        return self.offers.get(row.get("ask_id", -1)) or row

    def _charge(self, instance_id: int, part: str, usd: float) -> None:
        if usd <= 0:
            return
        parts = self.dollars.setdefault(instance_id,
                                        {"rent": 0.0, "storage": 0.0, "bandwidth": 0.0})
        parts[part] += usd
        self.credit -= usd

    def accrue(self) -> None:
        """Bill every instance up to now, status by status, moving loads and host trouble
        along the way: rent while ``running``, storage in every status but ``offline``
        (its ``disk_space``: the allocated disk). At zero credit every instance stops."""
        now = self.clock()
        while True:
            # The next scheduled change (a load finishing, a host coming back) before now.
            events: list[tuple[float, int, str | None, bool]] = [
                (t, iid, "running", True) for iid, t in self._loaded_at.items()
                      if t <= now]
            events += [(t, iid, st, False) for iid, (t, st) in self._back_at.items()
                       if t <= now]
            ends = [(t, iid) for iid, (t, _rent) in self._contract_ends.items() if t <= now]
            if ends and (not events or min(ends)[0] <= min(e[0] for e in events)):
                t, iid = min(ends)
                self._bill_until(t)
                self._end_contract(iid)
                continue
            until = min((e[0] for e in events), default=now)
            self._bill_until(until)
            if self.credit <= 0 and not self._stopped_for_funds >= set(self.instances):
                self._stop_all_for_funds()
            if not events:
                break
            _t, iid, st, loaded = min(events)
            (self._loaded_at if loaded else self._back_at).pop(iid, None)
            row = self.instances.get(iid)
            if row is not None and iid not in self._stopped_for_funds:
                row["actual_status"] = st
                row["status_msg"] = None
                row.update(cur_state="running", intended_status="running", next_state="running")
        self._bill_until(now)

    def _bill_until(self, until: float) -> None:
        for iid, row in self.instances.items():
            since = self._billed_to.get(iid, float(row.get("start_date") or until))
            if until <= since:
                continue
            self._billed_to[iid] = until
            hours = (until - since) / 3600.0
            offer = self._offer_of(iid)
            status = row.get("actual_status")
            base = self._rent_of(row, offer)
            if status == "running":
                self._charge(iid, "rent", base * hours)
            if status != "offline":
                disk = float(row.get("disk_space") or PRICED_STORAGE_GB)
                per_h = float(offer.get("storage_cost") or 0) * disk / HOURS_PER_MONTH
                self._charge(iid, "storage", per_h * hours)

    def _end_contract(self, instance_id: int) -> None:
        """The contract's end date: an accepted increase bills from now; a rejected one
        stops the instance (its disk kept and billed, as at any stop)."""
        _at, rent = self._contract_ends.pop(instance_id)
        row = self.instances.get(instance_id)
        if row is None:
            return
        if rent is not None:
            row["rent_per_hour"] = rent
            storage = float(self._offer_of(instance_id).get("storage_cost") or 0)
            disk = float(row.get("disk_space") or PRICED_STORAGE_GB)
            row["dph_total"] = round(rent + storage * disk / HOURS_PER_MONTH, 6)
            return
        self._back_at.pop(instance_id, None)
        row.update(actual_status="stopped", cur_state="stopped", intended_status="stopped",
                   next_state="stopped",
                   status_msg="contract ended: the price increase was rejected (fake vast.ai)")

    def _stop_all_for_funds(self) -> None:
        """vast.ai at zero funds: every instance stopped, its disk kept and billed."""
        for iid, row in self.instances.items():
            if iid in self._stopped_for_funds:
                continue
            self._stopped_for_funds.add(iid)
            self._loaded_at.pop(iid, None)
            self._back_at.pop(iid, None)
            row.update(actual_status="stopped", cur_state="stopped", intended_status="stopped",
                       status_msg="stopped: account balance at or below zero (fake vast.ai)")

    async def settle(self) -> None:
        """Wait until every destroyed instance's processes have stopped."""
        while self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)

    # ---- server -------------------------------------------------------------

    async def __aenter__(self) -> FakeVast:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/api/v0/bundles/", self._search)
        app.router.add_put("/api/v0/asks/{id}/", self._create)
        app.router.add_get("/api/v0/instances/", self._list_v0)
        # Before /api/v0/instances/{id}/, which would take these words for an id.
        app.router.add_get("/api/v0/instances/pending-price-increases/", self._pending)
        app.router.add_put("/api/v0/instances/accept-price-increase/", self._accept_increase)
        app.router.add_put("/api/v0/instances/reject-price-increase/", self._reject_increase)
        app.router.add_put("/api/v0/instances/bid_price/{id}/", self._change_bid)
        app.router.add_get("/api/v0/machines/{id}/reports/", self._reports)
        app.router.add_get("/api/v1/instances/", self._list_v1)
        app.router.add_get("/api/v0/instances/{id}/", self._show)
        app.router.add_put("/api/v0/instances/{id}/", self._update)
        app.router.add_delete("/api/v0/instances/{id}/", self._destroy)
        app.router.add_get("/api/v0/users/current", self._user)
        self._runner = web.AppRunner(app, access_log=None)  # the coordinator logs its calls
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.settle()
        if self.launcher is not None:
            await self.launcher.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.requests.append(
            RecordedRequest(
                method=request.method,
                path=request.path,
                query=dict(request.query),
                headers=dict(request.headers),
                body=body,
            )
        )
        if "api_key" in request.query:
            return _error(400, "key_in_url", "API keys do not belong in URLs (the fake's rule)")
        refusal = self._auth_refusal(request)
        if refusal is not None:
            return refusal
        if self.fail_next > 0:
            self.fail_next -= 1
            return self._failure(request)
        endpoint = f"{request.method} {re.sub(r'/[0-9]+/', '/{id}/', request.path)}"
        interval = self.min_interval_s.get(endpoint)
        if interval is not None:
            last = self._last_call.get(endpoint)
            now = self.clock()
            if last is not None and now - last < interval:
                return self._failure(request, forced=429)
            self._last_call[endpoint] = now
        self.accrue()
        request[_BODY] = body
        response: web.StreamResponse = await handler(request)
        return response

    def _auth_refusal(self, request: web.Request) -> web.Response | None:
        """vast.ai's answer to a request without a key it accepts, per endpoint."""
        auth = request.headers.get("Authorization")
        if auth == f"Bearer {self.api_key}":
            return None
        own = _INSTANCE_PATH.match(request.path)
        if own is not None and request.method in ("GET", "PUT", "DELETE"):
            iid = int(own.group(1))
            if auth == f"Bearer {self.instance_keys.get(iid)}":
                return None
            if (self.instance_key_outlives_instance and request.method in ("GET", "DELETE")
                    and auth == f"Bearer {self._dead_keys.get(iid)}"):
                return None
        v1_list = request.path == "/api/v1/instances/"
        if auth is None and v1_list:
            return _error(403, "auth_error", "This action requires login.")
        if request.path == "/api/v0/bundles/":
            # The search's 404 carries error and msg only (no success field).
            return web.json_response({"error": "auth_error", "msg": "Invalid user key"},
                                     status=404)
        return _error(404 if v1_list else 401, "auth_error", "Invalid user key")

    def _failure(self, request: web.Request, forced: int | None = None) -> web.Response:
        status = forced or self.fail_status
        if status != 429:
            return web.Response(status=status, text=f"{status} error from the gateway",
                                content_type="text/plain")
        plain = "API requests too frequent"
        headers = ({} if self.retry_after_s is None
                   else {"Retry-After": f"{self.retry_after_s:g}"})
        if self.rate_limit_plain_text or request.path == "/api/v0/bundles/":
            return web.Response(status=429, text=plain, content_type="text/plain",
                                headers=headers)
        if request.method == "DELETE":
            answer = _error(429, "rate_limit_exceeded", f"{plain} endpoint threshold=3.0")
        else:
            answer = web.json_response({"detail": f"{plain} endpoint threshold=1.0"}, status=429)
        answer.headers.update(headers)
        return answer

    # ---- handlers ---------------------------------------------------------

    def searches_today(self) -> int:
        """Searches answered this UTC day (the fake's clock)."""
        return self._searches.get(int(self.clock() // 86400), 0)

    async def _search(self, request: web.Request) -> web.Response:
        day = int(self.clock() // 86400)
        if self.search_quota_per_day is not None and \
                self._searches.get(day, 0) >= self.search_quota_per_day:
            # vastai 1.9.1 reads error == "search_quota_exceeded" and X-RateLimit-Reset
            # ("only resets at UTC midnight"); the msg is the fake's own words.
            answer = _error(429, "search_quota_exceeded",
                            "daily search quota exceeded (fake vast.ai)")
            answer.headers["X-RateLimit-Reset"] = str((day + 1) * 86400)
            return answer
        self._searches[day] = self._searches.get(day, 0) + 1
        query = _body(request)
        if not isinstance(query, dict):
            return web.json_response(
                {"error": "invalid_request", "msg": "Invalid json body"}, status=400
            )
        alloc = query.get("allocated_storage")
        gb = float(alloc) if isinstance(alloc, (int, float)) and alloc > 0 else 5.0
        priced = []
        for o in self.offers.values():
            # dph_total and storage_total_cost priced with the search's allocated_storage.
            storage_h = float(o.get("storage_cost") or 0) * gb / HOURS_PER_MONTH
            priced.append({**o, "dph_total": round(float(o["dph_base"]) + storage_h, 6),
                           "storage_total_cost": round(storage_h, 6),
                           "allocated_storage": gb})
        rows = [o for o in priced if _matches(o, query)]
        for fld, direction in reversed(query.get("order") or []):
            rows.sort(key=_order_key(fld), reverse=direction == "desc")
        limit = query.get("limit")
        if isinstance(limit, int) and limit > 0:
            rows = rows[:limit]
        return web.json_response({"offers": copy.deepcopy(rows)})

    def _container_env(self, iid: int, offer: dict[str, Any], env: dict[str, Any],
                       key: str) -> dict[str, str]:
        # What vast.ai sets inside every container, beside the create's env
        # (docs/vast.md); VAST_URL is the fake's own, so the agent's self-destroy
        # reaches this fake instead of console.vast.ai.
        inside = {str(k): str(v) for k, v in env.items()}
        inside.update({
            "CONTAINER_ID": str(iid),
            "CONTAINER_API_KEY": key,
            "VAST_CONTAINERLABEL": f"C.{iid}",
            "PUBLIC_IPADDR": "127.0.0.1",
            "GPU_COUNT": str(offer.get("num_gpus") or 1),
            "VAST_URL": self.url,
        })
        return inside

    async def _create(self, request: web.Request) -> web.Response:
        offer_id = int(request.match_info["id"])
        body = _body(request)
        offer = self.offers.get(offer_id)
        if offer is None:
            return _error(404, "invalid_args", f"error 404/3603: no_such_ask Instance type by id "
                          f"{offer_id} is not available.", ask_id=offer_id)
        if offer_id in self.gone_at_create or (
            offer.get("rented") and offer_id not in self.sell_twice
        ):
            return _error(410, "no_such_ask", f"error 410/3907: no_such_ask Instance type "
                          f"{offer_id} is no longer available.", ask_id=offer_id)
        problem = _create_problem(body)
        if problem is not None:
            return _error(400, "invalid_args", f"Invalid args: {problem}", ask_id=offer_id)
        assert isinstance(body, dict)
        if offer.get("rented"):
            self.sell_twice.discard(offer_id)  # sold twice once; the next racer loses
        offer["rented"] = True
        offer["rentable"] = False
        iid = next(self._ids)
        env = body.get("env") or {}
        env = env if isinstance(env, dict) else {}
        fails = self.create_fails_with_instance > 0
        now = self.clock()
        self.instances[iid] = _instance_row(iid, offer_id, offer, body, env, now,
                                            self.initial_status, fails)
        self.billing[iid] = Billing(iid, now)
        self._billed_to[iid] = now
        if self.loading and not fails:
            # null while scheduled, loading while the image is pulled, then running.
            row = self.instances[iid]
            row.update(actual_status=None, cur_state="running")
            pull_s = self.image_gb * 8e3 / max(float(offer.get("inet_down") or 100.0), 1.0)
            self._back_at[iid] = (now + SCHEDULING_S, "loading")
            if int(offer["machine_id"]) not in self.never_loads:
                self._loaded_at[iid] = now + SCHEDULING_S + pull_s
        key = f"instkey-{iid}-{secrets.token_hex(8)}"
        self.instance_keys[iid] = key
        if fails:
            self.create_fails_with_instance -= 1
            # The text is the fake's: vast.ai does not publish this answer's wording.
            return web.json_response(
                {"success": False, "error": "start_failed",
                 "msg": "the instance could not be started (fake vast.ai)",
                 "new_contract": iid},
                status=self.create_fail_status,
            )
        if self.launcher is not None:
            inside = self._container_env(iid, offer, env, key)
            self.launcher.start(self.instances[iid], copy.deepcopy(offer), inside)
        if self.lose_create_answers > 0:
            self.lose_create_answers -= 1
            return web.Response(status=504, text="504 Gateway Time-out", content_type="text/plain")
        return web.json_response({"success": True, "new_contract": iid, "instance_api_key": key})

    async def _pending(self, request: web.Request) -> web.Response:
        rows = [copy.deepcopy(r) for r in self.pending_increases.values()
                if r["contract_id"] in self.instances]
        return web.json_response({"success": True, "count": len(rows), "truncated": False,
                                  "pending_price_increases": rows})

    async def _answer_increase(self, request: web.Request, accept: bool) -> web.Response:
        body = _body(request)
        # The backend forbids any other key (``extra='forbid'``): 400.
        if not isinstance(body, dict) or set(body) != {"pending_price_increase_id"} or \
                not isinstance(body["pending_price_increase_id"], int):
            return _error(400, "invalid_args", "body must be exactly "
                          '{"pending_price_increase_id": <int>} (fake vast.ai)')
        row = self.pending_increases.pop(body["pending_price_increase_id"], None)
        if row is None or row["contract_id"] not in self.instances:
            return web.json_response({"success": False, "error": "no_pending_price_increase"},
                                     status=404)
        new_rent = float(row["new_gpu_costpersec"]) * 3600.0 if accept else None
        self._contract_ends[int(row["contract_id"])] = (float(row["contract_end_date"]),
                                                        new_rent)
        return web.json_response({"success": True, "contract_id": row["contract_id"],
                                  "pending_price_increase_id": row["pending_price_increase_id"]})

    async def _accept_increase(self, request: web.Request) -> web.Response:
        return await self._answer_increase(request, True)

    async def _reject_increase(self, request: web.Request) -> web.Response:
        return await self._answer_increase(request, False)

    async def _change_bid(self, request: web.Request) -> web.Response:
        iid = int(request.match_info["id"])
        row = self.instances.get(iid)
        if row is None:
            return _error(404, "no_such_instance", "Instance with that ID does not exist.")
        body = _body(request)
        price = body.get("price") if isinstance(body, dict) else None
        # OpenAPI changeBid: price 0.001 to 32 $/h.
        if isinstance(price, bool) or not isinstance(price, (int, float)) or \
                not 0.001 <= price <= 32.0:
            return _error(400, "invalid_args", "Please set a bid price >= 0.001.")
        row["bid_price"] = float(price)
        winning = self._outbid_by.get(iid)
        if winning is not None and price >= winning and row.get("actual_status") == "stopped":
            self._outbid_by.pop(iid)
            self._back_at.pop(iid, None)
            row.update(actual_status="running", cur_state="running", intended_status="running",
                       next_state="running", status_msg=None)
        return web.json_response({"success": True})

    async def _reports(self, request: web.Request) -> web.Response:
        return web.json_response(copy.deepcopy(self.reports.get(int(request.match_info["id"]),
                                                                 [])))

    async def _user(self, request: web.Request) -> web.Response:
        """``vastai show user``: the account's fields, ``balance`` and ``credit`` among them."""
        return web.json_response({
            "id": 4242, "email": "fleet@example.com", "balance": round(self.balance, 6),
            "credit": round(self.credit, 6), "balance_threshold": 0.0,
            "balance_threshold_enabled": False, "can_pay": self.credit > 0,
        })

    async def _show(self, request: web.Request) -> web.Response:
        row = self.instances.get(int(request.match_info["id"]))
        return web.json_response({"instances": copy.deepcopy(row)})

    async def _list_v0(self, request: web.Request) -> web.Response:
        rows = sorted(self.instances.values(), key=lambda r: r["id"])
        return web.json_response({"instances": copy.deepcopy(rows)})

    async def _list_v1(self, request: web.Request) -> web.Response:
        q = request.query
        try:
            limit = int(q.get("limit", "25"))
        except ValueError:
            return web.json_response(
                {"error": "invalid_request", "msg": "Error in query parameters: limit"},
                status=400)
        # "Default 25, max 25. Values <= 0 are treated as 5."
        limit = 5 if limit <= 0 else min(limit, self.page_size)
        for name, kind in (("select_filters", dict), ("order_by", list)):
            if name in q:
                try:
                    ok = isinstance(json.loads(q[name]), kind)
                except ValueError:
                    ok = False
                if not ok:
                    return web.json_response(
                        {"error": "invalid_request", "msg": f"Error in query parameters: {name}"},
                        status=400)
        after = _token_id(q["after_token"]) if "after_token" in q else 0
        if after is None:
            return _error(400, "invalid_token", "Invalid pagination token")
        rows = sorted(self.instances.values(), key=lambda r: r["id"])
        rows = [r for r in rows if r["id"] > after]
        page = rows[:limit]
        labels: dict[str, int] = {}
        for r in self.instances.values():
            labels[r.get("label") or ""] = labels.get(r.get("label") or "", 0) + 1
        return web.json_response(
            {
                "success": True,
                "instances_found": len(page),
                "total_instances": len(self.instances),
                "label_counts": labels,
                "next_token": _token(page[-1]["id"]) if len(rows) > limit else None,
                "instances": copy.deepcopy(page),
            }
        )

    async def _update(self, request: web.Request) -> web.Response:
        row = self.instances.get(int(request.match_info["id"]))
        if row is None:
            return _error(404, "no_such_instance", "Instance not found")
        body = _body(request)
        if not isinstance(body, dict) or not ({"state", "label"} & body.keys()):
            return _error(400, "invalid_args", "state or label is required")
        state = body.get("state")
        if "state" in body and state not in ("stopped", "running"):
            return _error(400, "invalid_args", f"state must be stopped or running, not {state!r}")
        label = body.get("label")
        if "label" in body and not (isinstance(label, str) and len(label) <= MAX_LABEL_CHARS):
            return _error(400, "invalid_args", f"label must be text of at most {MAX_LABEL_CHARS}")
        if "label" in body:
            row["label"] = label
        if state == "running" and self.credit <= 0:
            # The fake's wording: vast.ai does not publish this refusal's text.
            return _error(400, "insufficient_credit", "add credit to start the instance "
                          "(fake vast.ai)")
        if state is not None:
            self._stopped_for_funds.discard(row["id"])
            # A stopped instance stays stopped (billing its disk) until started again.
            row.update(actual_status=state, intended_status=state, cur_state=state,
                       next_state=state)
        return web.json_response({"success": True})

    async def _destroy(self, request: web.Request) -> web.Response:
        iid = int(request.match_info["id"])
        if iid not in self.instances:
            return _error(404, "not_found", "Instance not found")
        if self.refuse_destroys > 0:
            self.refuse_destroys -= 1
            # The fake's wording: vast.ai does not publish why a destroy is refused.
            return _error(200, "destroy_refused", "the instance could not be destroyed now "
                          "(fake vast.ai)")
        if self.keep_after_destroy > 0:
            self.keep_after_destroy -= 1
            return web.json_response({"success": True})
        row = self.instances.pop(iid)
        self._billed_to.pop(iid, None)
        self._loaded_at.pop(iid, None)
        self._back_at.pop(iid, None)
        self.billing[iid].destroyed_at = self.clock()
        key = self.instance_keys.pop(iid, None)
        if key is not None:
            self._dead_keys[iid] = key
        offer = self.offers.get(row.get("ask_id", -1))
        if offer is not None:
            # The machine is listed again once its instance is gone.
            offer["rented"] = False
            offer["rentable"] = True
        if self.launcher is not None:
            # Torn down after the answer, as vast.ai does (the caller may be inside).
            task = asyncio.create_task(self.launcher.stop(row["id"]))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        return web.json_response({"success": True})


def _body(request: web.Request) -> Any:
    return request[_BODY]



def _instance_row(iid: int, offer_id: int, offer: dict[str, Any], body: dict[str, Any],
                  env: dict[str, Any], now: float, initial_status: str | None,
                  fails: bool) -> dict[str, Any]:
    """A new instance as ``GET /instances/`` lists it, from its offer and the create's body."""
    return {
        "id": iid,
        "label": body.get("label"),
        "machine_id": offer["machine_id"],
        "host_id": offer.get("host_id"),
        "ask_id": offer_id,
        "num_gpus": offer.get("num_gpus"),
        "gpu_name": offer.get("gpu_name"),
        "dph_total": offer.get("dph_total"),
        "cpu_name": offer.get("cpu_name"),
        "cpu_ram": offer.get("cpu_ram"),
        "cpu_cores_effective": offer.get("cpu_cores_effective"),
        "geolocation": offer.get("geolocation"),
        "reliability2": offer.get("reliability2"),
        # A failed start leaves it stopped, billing its storage (dstack's account).
        "actual_status": "stopped" if fails else initial_status,
        "intended_status": "stopped" if fails else "running",
        "cur_state": "stopped" if fails else "running",
        "next_state": "stopped" if fails else "running",
        "status_msg": None,
        "start_date": now,
        "image_uuid": body.get("image"),
        "image_runtype": body.get("runtype"),
        "disk_space": body.get("disk"),
        "extra_env": [[k, v] for k, v in env.items()],
        "onstart": body.get("onstart"),
        # A create with a ``price`` is an interruptible instance at that bid (vast-cli
        # ``create instance --bid_price``): its rent is the bid.
        "is_bid": body.get("price") is not None,
        "bid_price": body.get("price"),
    }


def _create_problem(body: Any) -> str | None:
    """Why vast.ai would refuse this create body (400 invalid_args), or None."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    image = body.get("image")
    if not isinstance(image, str) or not image.strip():
        return "'image' is required"
    onstart = body.get("onstart")
    if onstart is not None and (not isinstance(onstart, str) or len(onstart) > MAX_ONSTART_CHARS):
        return f"'onstart' is limited to {MAX_ONSTART_CHARS} characters"
    runtype = body.get("runtype")
    if runtype is not None and (
        not isinstance(runtype, str) or not runtype.split()
        or not set(runtype.split()) <= RUNTYPE_WORDS
    ):
        return f"unknown runtype {runtype!r}"
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_CHARS):
        return f"'label' is limited to {MAX_LABEL_CHARS} characters"
    disk = body.get("disk")
    if disk is not None and (isinstance(disk, bool) or not isinstance(disk, (int, float))):
        return "'disk' must be a number of GB"
    if not isinstance(body.get("env", {}), (dict, str, type(None))):
        return "'env' must be an object or a string of docker options"
    return None


def _token(last_id: int) -> str:
    """An opaque keyset cursor, shaped as the OpenAPI description's example
    (base64 of ``{"values": {"id": 123}}``)."""
    return base64.b64encode(json.dumps({"values": {"id": last_id}}).encode()).decode()


def _token_id(token: str) -> int | None:
    try:
        value = json.loads(base64.b64decode(token, validate=True))["values"]["id"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def _order_key(fld: str) -> Callable[[dict[str, Any]], tuple[bool, Any]]:
    def key(offer: dict[str, Any]) -> tuple[bool, Any]:
        return (offer.get(fld) is None, offer.get(fld) or 0)

    return key


def _error(status: int, error: str, msg: str, **extra: Any) -> web.Response:
    """vast.ai's usual error body (rate-limits-and-errors.mdx)."""
    return web.json_response({"success": False, "error": error, "msg": msg, **extra},
                             status=status)


def _coerce(have: Any, want: Any) -> tuple[Any, Any]:
    """vast.ai compares numerically when the offer's field is a number, even though the
    CLI sends most numbers as strings (``"num_gpus": {"gte": "2"}``)."""
    if isinstance(have, (int, float)) and not isinstance(have, bool) and isinstance(want, str):
        try:
            return have, float(want)
        except ValueError:
            return have, want
    return have, want


def _matches(offer: dict[str, Any], query: dict[str, Any]) -> bool:
    for fld, cond in query.items():
        if fld in _QUERY_META or not isinstance(cond, dict):
            continue
        have = offer.get(fld)
        for op, want in cond.items():
            if op not in _OPS:
                continue
            if op in ("in", "notin"):
                values = [_coerce(have, w)[1] for w in (want or [])]
                inside = have in values
                if inside != (op == "in"):
                    return False
                continue
            if have is None:
                if op == "neq":
                    continue
                return False
            a, b = _coerce(have, want)
            try:
                ok = bool(_COMPARE[op](a, b))
            except TypeError:
                return False
            if not ok:
                return False
    return True


# ---- running instances: real agents on the simulated cuzk -------------------


class SimAgents:
    """A ``Launcher``: each instance runs ``vm-sim-agent run`` (the agent, simulated cuzk).

    The environment is what the image would bake in (the simulation's binaries,
    state and parameter folders, the fake NVML, ``VM_PROVIDER=vast``; no
    parameter manifest, so nothing is downloaded), overridden by the create's
    ``env`` and what vast.ai sets inside a container. The account key of the
    test process never reaches an instance. Every process carries ``marker`` in
    its environment so ``stop`` and ``leftovers`` find it even after a re-parent.
    """

    MARKER_ENV = "FAKEVAST_INSTANCE"

    def __init__(
        self,
        workdir: Path,
        *,
        time_scale: float = 240.0,
        extra_env: dict[str, str] | None = None,
        stop_grace_s: float = 5.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.time_scale = time_scale
        self.extra_env = dict(extra_env or {})
        self.stop_grace_s = stop_grace_s
        self.marker = f"fakevast-{os.getpid()}-{secrets.token_hex(6)}"
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.envs: dict[int, dict[str, str]] = {}

    def _marker(self, instance_id: int) -> str:
        return f"{self.marker}:{instance_id}"

    def log_path(self, instance_id: int) -> Path:
        return self.workdir / f"instance-{instance_id}" / "agent.log"

    def start(self, instance: dict[str, Any], offer: dict[str, Any], env: dict[str, str]) -> None:
        instance_id = int(instance["id"])
        home = self.workdir / f"instance-{instance_id}"
        child_env = {
            k: v for k, v in os.environ.items()
            if k not in ("VAST_API_KEY", "CONTAINER_ID", "CONTAINER_API_KEY", "VM_AGENT_KEY")
            and not k.startswith("PYTEST_")
        }
        # The image's defaults, as the simulation provides them.
        child_env.update(simulated_machine_env(home, parse_offer(offer), self.time_scale))
        child_env.update({"VM_PROVIDER": "vast"})
        child_env.update(self.extra_env)
        child_env.update(env)
        child_env[self.MARKER_ENV] = self._marker(instance_id)
        self.envs[instance_id] = child_env
        with open(home / "agent.log", "ab") as log_file:
            self.processes[instance_id] = subprocess.Popen(
                [sys.executable, "-m", "vast_manager.sim.agent_run", "run"],
                env=child_env, cwd=home, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def alive(self, instance_id: int) -> bool:
        proc = self.processes.get(instance_id)
        return proc is not None and proc.poll() is None

    def leftovers(self, instance_id: int | None = None) -> list[psutil.Process]:
        """Processes of our instances (one, or all) still running."""
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                mark = p.environ().get(self.MARKER_ENV, "")
                wanted = (
                    mark.startswith(self.marker + ":") if instance_id is None
                    else mark == self._marker(instance_id)
                )
                if wanted:
                    found.append(p)
        return found

    async def stop(self, instance_id: int) -> None:
        await asyncio.to_thread(self._stop_sync, instance_id)

    def _stop_sync(self, instance_id: int) -> None:
        """SIGTERM the agent and everything it started, then SIGKILL what is left."""
        proc = self.processes.get(instance_id)
        procs = {p.pid: p for p in self.leftovers(instance_id)}
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(proc.pid)
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(list(procs.values()), timeout=self.stop_grace_s)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    async def close(self) -> None:
        """Stop every instance's processes (the test's last resort)."""
        for instance_id in list(self.processes):
            await self.stop(instance_id)
        for p in self.leftovers():
            with contextlib.suppress(psutil.Error):
                p.kill()
