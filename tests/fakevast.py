"""A stateful fake of vast.ai's REST API on loopback, for provider and end-to-end tests.

Serves the endpoints of reference/vast-api.md that the coordinator uses:
search (POST /api/v0/bundles/, honouring eq/neq/gt/gte/lt/lte/in/notin, order
and limit), create (PUT /api/v0/asks/{id}/), show, list (v1 with
``next_token`` pagination, and v0), destroy, label/state. Every request is
recorded (method, path, query, headers, JSON body). Switches: sell one offer
twice (``sell_twice``), answer 429 for the next N requests (``fail_next``),
lose the answer of a create that happened (``lose_create_answers``), sell an
offer to a racer between search and create (``gone_at_create``); gone offers
answer ``410 no_such_ask``; tests can set an instance's status.

Each created instance gets its own key (``instance_keys``, handed to it as
``CONTAINER_API_KEY``) that can show, change or destroy that instance only,
as on vast.ai. With a ``launcher`` (``SimAgents``), create really starts the
instance: a ``vast-agent run`` process on the simulated cuzk, with the
create's ``env`` plus what vast.ai sets inside a container (``CONTAINER_ID``,
``CONTAINER_API_KEY``, ``VAST_URL``); destroy stops it and everything it
started.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
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

import psutil
from aiohttp import web

from coordinator.providers.local import simulated_machine_env

FAKE_API_KEY = "fake-account-key-0123456789abcdef"

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
ROOT = Path(__file__).resolve().parent.parent


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
class FakeVast:
    """The fake server and its state; use ``async with FakeVast() as fake: fake.url``."""

    api_key: str = FAKE_API_KEY
    clock: Callable[[], float] = time.time
    page_size: int = 25
    offers: dict[int, dict[str, Any]] = field(default_factory=dict)
    instances: dict[int, dict[str, Any]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    #: Offer ids that may be rented once more although already rented (vast.ai
    #: sells the same offer twice to racing callers).
    sell_twice: set[int] = field(default_factory=set)
    #: Answer 429 to this many next requests (any endpoint).
    fail_next: int = 0
    #: Status code used by ``fail_next``.
    fail_status: int = 429
    #: Creates that succeed but whose answer is lost (a 504 instead), this many.
    lose_create_answers: int = 0
    #: Status new instances start in (vast.ai: null, then loading, running).
    initial_status: str | None = "running"
    #: Offer ids a racer rents between our search and our create: search still
    #: lists them, create answers ``410 no_such_ask``.
    gone_at_create: set[int] = field(default_factory=set)
    #: Each instance's own key (CONTAINER_API_KEY inside it).
    instance_keys: dict[int, str] = field(default_factory=dict)
    #: Runs each created instance (None: instances are rows only).
    launcher: Launcher | None = None

    def __post_init__(self) -> None:
        self._ids = itertools.count(30_000_001)
        self._runner: web.AppRunner | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self.url = ""

    # ---- state helpers for tests -----------------------------------------

    def add_offer(self, offer_id: int, machine_id: int, **fields: Any) -> dict[str, Any]:
        """An offer with sensible defaults (a verified, rentable 1x RTX 4090)."""
        offer: dict[str, Any] = {
            "id": offer_id,
            "machine_id": machine_id,
            "host_id": machine_id // 10,
            "num_gpus": 1,
            "gpu_name": "RTX 4090",
            "gpu_ram": 24564,
            "cpu_name": "AMD EPYC 7K62",
            "cpu_cores": 48,
            "cpu_cores_effective": 24.0,
            "cpu_ram": 257000,
            "disk_space": 500.0,
            "pcie_bw": 24.5,
            "inet_down": 900.0,
            "inet_up": 500.0,
            "cuda_max_good": 13.0,
            "dph_total": 0.45,
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
        self.offers[offer_id] = offer
        return offer

    def remove_offer(self, offer_id: int) -> None:
        """The offer is gone (create answers 410 no_such_ask)."""
        self.offers.pop(offer_id, None)

    def set_status(self, instance_id: int, status: str | None) -> None:
        self.instances[instance_id]["actual_status"] = status

    def add_instance(self, instance_id: int, **fields: Any) -> dict[str, Any]:
        """An instance created outside our API calls (another fleet's, a person's)."""
        row: dict[str, Any] = {
            "id": instance_id,
            "label": None,
            "machine_id": 1,
            "actual_status": "running",
            "start_date": self.clock(),
            "extra_env": [],
        }
        row.update(fields)
        self.instances[instance_id] = row
        return row

    def calls(self, method: str, path_prefix: str = "") -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    def destroys_of(self, instance_id: int) -> list[str]:
        """Who asked to destroy this instance, in order: ``account`` or ``instance`` key."""
        out = []
        for r in self.calls("DELETE", f"/api/v0/instances/{instance_id}/"):
            auth = r.headers.get("Authorization")
            if auth == f"Bearer {self.api_key}":
                out.append("account")
            elif auth == f"Bearer {self.instance_keys.get(instance_id)}":
                out.append("instance")
            else:
                out.append("other")
        return out

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
        app.router.add_get("/api/v1/instances/", self._list_v1)
        app.router.add_get("/api/v0/instances/{id}/", self._show)
        app.router.add_put("/api/v0/instances/{id}/", self._update)
        app.router.add_delete("/api/v0/instances/{id}/", self._destroy)
        self._runner = web.AppRunner(app)
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
            return _error(400, "key_in_url", "API keys do not belong in URLs")
        if not self._authorized(request):
            return _error(401, "unauthorized", "Invalid user key")
        if self.fail_next > 0:
            self.fail_next -= 1
            return _error(self.fail_status, "too_many_requests", "API requests too frequent")
        request[_BODY] = body
        response: web.StreamResponse = await handler(request)
        return response

    def _authorized(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization")
        if auth == f"Bearer {self.api_key}":
            return True
        own = _INSTANCE_PATH.match(request.path)
        if own is None or request.method not in ("GET", "PUT", "DELETE"):
            return False
        key = self.instance_keys.get(int(own.group(1)))
        return key is not None and auth == f"Bearer {key}"

    # ---- handlers ---------------------------------------------------------

    async def _search(self, request: web.Request) -> web.Response:
        query = _body(request)
        if not isinstance(query, dict):
            return _error(400, "bad_query", "query must be a JSON object")
        rows = [o for o in self.offers.values() if _matches(o, query)]
        for fld, direction in reversed(query.get("order") or []):
            rows.sort(key=_order_key(fld), reverse=direction == "desc")
        limit = query.get("limit")
        if isinstance(limit, int) and limit > 0:
            rows = rows[:limit]
        return web.json_response({"offers": copy.deepcopy(rows)})

    async def _create(self, request: web.Request) -> web.Response:
        offer_id = int(request.match_info["id"])
        body = _body(request) or {}
        offer = self.offers.get(offer_id)
        if offer is None or offer_id in self.gone_at_create:
            return _error(410, "no_such_ask", f"Instance type {offer_id} is no longer available")
        if offer.get("rented") and offer_id not in self.sell_twice:
            return _error(410, "no_such_ask", f"Instance type {offer_id} is no longer available")
        if offer.get("rented"):
            self.sell_twice.discard(offer_id)  # sold twice once; the next racer loses
        if not body.get("image"):
            return _error(400, "invalid_args", "image is required")
        offer["rented"] = True
        offer["rentable"] = False
        iid = next(self._ids)
        env = body.get("env") or {}
        self.instances[iid] = {
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
            "geolocation": offer.get("geolocation"),
            "reliability2": offer.get("reliability2"),
            "actual_status": self.initial_status,
            "intended_status": "running",
            "start_date": self.clock(),
            "image_uuid": body.get("image"),
            "disk_space": body.get("disk"),
            "extra_env": [[k, v] for k, v in env.items()],
            "onstart": body.get("onstart"),
            "runtype": body.get("runtype"),
        }
        key = f"instkey-{iid}-{secrets.token_hex(8)}"
        self.instance_keys[iid] = key
        if self.launcher is not None:
            # What vast.ai sets inside every container, beside the create's env.
            inside = {str(k): str(v) for k, v in env.items()}
            inside.update({
                "CONTAINER_ID": str(iid),
                "CONTAINER_API_KEY": key,
                "VAST_CONTAINERLABEL": f"C.{iid}",
                "VAST_URL": self.url,
                "GPU_COUNT": str(offer.get("num_gpus") or 1),
            })
            self.launcher.start(self.instances[iid], copy.deepcopy(offer), inside)
        if self.lose_create_answers > 0:
            self.lose_create_answers -= 1
            return _error(504, "gateway_timeout", "Gateway Timeout")
        return web.json_response({"success": True, "new_contract": iid, "instance_api_key": key})

    async def _show(self, request: web.Request) -> web.Response:
        row = self.instances.get(int(request.match_info["id"]))
        return web.json_response({"instances": copy.deepcopy(row)})

    async def _list_v0(self, request: web.Request) -> web.Response:
        rows = sorted(self.instances.values(), key=lambda r: r["id"])
        return web.json_response({"instances": copy.deepcopy(rows)})

    async def _list_v1(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "25"))
        except ValueError:
            return _error(400, "bad_limit", "limit must be an integer")
        limit = max(1, min(limit, self.page_size))
        after = request.query.get("after_token")
        rows = sorted(self.instances.values(), key=lambda r: r["id"])
        if after:
            rows = [r for r in rows if r["id"] > int(after)]
        page = rows[:limit]
        next_token = str(page[-1]["id"]) if len(rows) > limit else None
        return web.json_response(
            {
                "instances": copy.deepcopy(page),
                "next_token": next_token,
                "total_instances": len(self.instances),
            }
        )

    async def _update(self, request: web.Request) -> web.Response:
        row = self.instances.get(int(request.match_info["id"]))
        if row is None:
            return _error(404, "no_such_instance", "Instance not found")
        body = _body(request) or {}
        if "label" in body:
            row["label"] = body["label"]
        if body.get("state") == "stopped":
            row["actual_status"] = "exited"
            row["intended_status"] = "stopped"
        elif body.get("state") == "running":
            row["actual_status"] = "running"
            row["intended_status"] = "running"
        return web.json_response({"success": True})

    async def _destroy(self, request: web.Request) -> web.Response:
        row = self.instances.pop(int(request.match_info["id"]), None)
        if row is None:
            return _error(404, "no_such_instance", "Instance not found")
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


def _order_key(fld: str) -> Callable[[dict[str, Any]], tuple[bool, Any]]:
    def key(offer: dict[str, Any]) -> tuple[bool, Any]:
        return (offer.get(fld) is None, offer.get(fld) or 0)

    return key


def _error(status: int, error: str, msg: str) -> web.Response:
    return web.json_response({"success": False, "error": error, "msg": msg}, status=status)


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
    """A ``Launcher``: each instance runs ``python -m agent.cli run`` on the simulated cuzk.

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
        child_env.update(simulated_machine_env(home, offer, self.time_scale))
        child_env.update({"PYTHONPATH": str(ROOT), "VM_PROVIDER": "vast"})
        child_env.update(self.extra_env)
        child_env.update(env)
        child_env[self.MARKER_ENV] = self._marker(instance_id)
        self.envs[instance_id] = child_env
        with open(home / "agent.log", "ab") as log_file:
            self.processes[instance_id] = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "run"],
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
