"""Run the coordinator: bind, serve, stop cleanly (for the CLI, the demo and tests).

``start_server`` binds first (port 0 picks a free one) so the URL handed to
agents is known before the first deploy, then opens the runtime (the composition
root, ``coordinator.runtime``: the store and the core), serves it on that socket and
starts its loops.
``run_server`` is the blocking entry point of ``vast-manager serve``: it
builds the provider by name and stops on SIGTERM or SIGINT.

Exposure: with ``tls_cert``/``tls_key`` every listener speaks HTTPS; with
``admin_listen`` a second listener carries the operator API, the dashboard
and /metrics while the main one answers only the agents (/v1/*).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.providers.base import Provider
from vast_manager.coordinator.providers.factory import make_provider
from vast_manager.coordinator.runtime import Runtime
from vast_manager.coordinator.settings import Settings, parse_listen
from vast_manager.coordinator.store.dbfile import DbLock, check_db_path
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web import agent_api
from vast_manager.coordinator.web.app import serve
from vast_manager.coordinator.web.core import CORE
from vast_manager.coordinator.web.http import error_response
from vast_manager.coordinator.web.logs import (
    configure_logging,
    store_token,
    stored_token,
    token_path,
)

log = logging.getLogger(__name__)

# Paths the agents' address serves when the operator side listens elsewhere.
AGENT_SIDE_EXACT = frozenset({"/openapi.json"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


#: Seconds a new connection has to finish its first request head. aiohttp has no such
#: timer (its keep-alive timer starts after a first answer), so a connection that never
#: finishes one (slowloris) would stay open for ever, holding a socket and its buffers.
HEAD_TIMEOUT_S = 20.0
#: Seconds an idle keep-alive connection is kept (agents heartbeat every 15 s by default;
#: aiohttp's own default is an hour).
KEEPALIVE_TIMEOUT_S = 75.0
#: Bytes read from a connection's socket at a time (asyncio's default is 256 KiB). A
#: request head, and whatever of its body came with it, is read before anyone is
#: identified: at 256 KiB a read, 100 strangers sending 1 MiB bodies could have 25 MiB
#: read before their 401s (16.6 MiB was seen on a loaded machine); at 16 KiB, about 3 MiB
#: (docs/reliability.md, "Strangers on the open internet"). A heartbeat still arrives in
#: one read.
SOCKET_READ_BYTES = 16 * 1024


def bound_socket_reads(server: web.Server, max_bytes: int) -> None:
    """Read at most ``max_bytes`` at a time from each plain TCP connection of ``server``.

    It sets the ``max_size`` of asyncio's socket transport (the size of each ``recv``),
    which is not a documented setting: ``tests/coordinator/web/test_adversarial_http.py``
    fails if it stops taking effect. A TLS connection reads through asyncio's own TLS buffer (256
    KiB a connection), which this does not change."""
    made = server.connection_made

    def connection_made(handler: Any, transport: asyncio.Transport) -> None:
        if isinstance(getattr(type(transport), "max_size", None), int):
            transport.max_size = max_bytes  # type: ignore[attr-defined]
        made(handler, transport)

    server.connection_made = connection_made  # type: ignore[method-assign]


class HeadDeadline:
    """Closes every connection that has not finished its first request head within
    ``timeout_s`` of connecting. Each connection is looked at once, when its time is up
    (a queue in connection order), so the cost follows new connections, not open ones.

    It reads aiohttp's per-connection request count (``RequestHandler._request_count``,
    which aiohttp keeps for its own logging);
    ``tests/coordinator/web/test_adversarial_http.py`` fails if that ever goes away."""

    def __init__(self, server: web.Server, timeout_s: float, on_cut: Callable[[], None]) -> None:
        self.server = server
        self.timeout_s = timeout_s
        self.on_cut = on_cut
        # Connections in the order they came, with their deadline; a connection leaves
        # when it closes or its time is up, so none is kept alive by this table.
        self._pending: dict[Any, float] = {}
        self._loop = asyncio.get_running_loop()
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._pending[handler] = self._loop.time() + self.timeout_s

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self._pending.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def sweep(self) -> int:
        """Close the connections whose time is up with no request head; how many."""
        now = self._loop.time()
        cut = 0
        while self._pending:
            handler, deadline = next(iter(self._pending.items()))
            if deadline > now:
                break
            del self._pending[handler]
            if handler.transport is not None and handler._request_count == 0:
                handler.force_close()
                self.on_cut()
                cut += 1
        return cut

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.timeout_s / 4)
            self.sweep()


@dataclass(slots=True)
class RunningServer:
    url: str
    settings: Settings
    store: Store
    app: web.Application
    runner: web.AppRunner
    provider: Provider
    runtime: Runtime
    admin_url: str | None = None
    db_lock: DbLock | None = None

    async def stop(self) -> None:
        """Stop serving, then stop the runtime (its loops, then the store).

        The provider belongs to the caller (it may outlive the server).
        """
        await self.runner.cleanup()
        await self.runtime.stop()
        if self.db_lock is not None:
            self.db_lock.release()


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class ServeConfigError(ValueError):
    """A serve setting that cannot work (unreadable certificate or key)."""


def tls_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server context (TLS 1.2 and up) from PEM files; errors name the files, not keys."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as err:
        raise ServeConfigError(f"cannot load the TLS certificate {cert_path} with key "
                               f"{key_path}: {err.__class__.__name__}") from None
    return context


def admin_listener(admin_host: str, admin_port: int) -> Callable[[web.BaseRequest], bool]:
    """Whether a request arrived on the admin listener, told apart by the local address
    its connection arrived on."""
    wildcard = admin_host in WILDCARD_HOSTS

    def on_admin(request: web.BaseRequest) -> bool:
        local = request.transport.get_extra_info("sockname") if request.transport else None
        return (
            isinstance(local, tuple) and len(local) >= 2 and local[1] == admin_port
            and (wildcard or local[0] == admin_host)
        )

    return on_admin


def listener_split(admin_host: str, admin_port: int) -> Middleware:
    """A middleware: the admin listener refuses /v1/*, the agents' refuses the rest."""
    admin = admin_listener(admin_host, admin_port)

    @web.middleware
    async def split(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        on_admin = admin(request)
        path = request.path
        agent_path = path.startswith("/v1/")
        if path in AGENT_SIDE_EXACT or agent_path != on_admin:
            return await handler(request)
        where = "the agents' address" if on_admin else "the admin address (--admin-listen)"
        return error_response(404, "not_found", f"{path} is served on {where}.")

    return split


def _bind_problem(host: str, port: int, err: OSError) -> str:
    """What a failed bind means to the operator, and what to do about it."""
    if err.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (another coordinator?); stop what holds it "
                "or pick another port with --port")
    if err.errno == errno.EADDRNOTAVAIL:
        return (f"{host} is not an address of this machine; listen on one of its own "
                "addresses with --host (127.0.0.1, or 0.0.0.0 for all of them)")
    if err.errno == errno.EACCES:
        return f"port {port} needs privileges on this machine; pick one above 1023 with --port"
    return f"cannot listen on {host}:{port}: {err.strerror}; check --host and --port"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ServeConfigError(_bind_problem(host, port, err)) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def start_server(
    settings: Settings, provider: Provider, *, clock: policy.Clock = time.time
) -> RunningServer:
    """Open the store, bind ``settings.host:port`` and serve; returns once listening."""
    scale = getattr(provider, "time_scale", None)
    if provider.name in ("local", "fake") and settings.sim_time_scale == 1.0 and scale:
        # The local fleet reports simulated seconds; its own scale is the truth.
        settings = settings.with_values(sim_time_scale=float(scale))
    ssl_context = (
        tls_context(settings.tls_cert, settings.tls_key)
        if settings.tls_cert and settings.tls_key else None
    )
    scheme = "https" if ssl_context is not None else "http"
    # One coordinator per database: refused before anything listens or is opened.
    await asyncio.to_thread(Path(settings.db_path).parent.mkdir, parents=True, exist_ok=True)
    db_lock = DbLock(settings.db_path)
    try:
        sock = _bind(settings.host, settings.port)
    except BaseException:
        db_lock.release(remove=True)
        raise
    port = sock.getsockname()[1]
    url = _url(scheme, settings.host, port)
    if port != settings.port:
        settings = settings.with_values(port=port)
    socks = [sock]
    admin_url: str | None = None
    admin_addr: tuple[str, int] | None = None
    try:
        if settings.admin_listen:
            admin_host, admin_port = parse_listen(settings.admin_listen)
            admin_sock = _bind(admin_host, admin_port)
            socks.append(admin_sock)
            admin_addr = (admin_host, admin_sock.getsockname()[1])
            admin_url = _url(scheme, *admin_addr)
        runtime = await Runtime.open(settings, provider, clock)
    except BaseException:
        for s in socks:
            s.close()
        db_lock.release(remove=True)
        raise
    app = serve(runtime, outer=None if admin_addr is None else listener_split(*admin_addr))
    guard = app[CORE].guard
    # aiohttp's server logs through the guard: a malformed request costs a counted kind
    # and at most a line an interval, not a traceback each.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0,
                           logger=guard.server_logger(), keepalive_timeout=KEEPALIVE_TIMEOUT_S)
    try:
        await runner.setup()
        assert runner.server is not None
        # Agents' requests skip the application's layers (on the admin listener they
        # meet the split's refusal there).
        agent_api.serve_agents_first(
            runner.server, app, None if admin_addr is None else admin_listener(*admin_addr))
        bound_socket_reads(runner.server, SOCKET_READ_BYTES)
        deadline = HeadDeadline(runner.server, HEAD_TIMEOUT_S,
                                lambda: guard.refused("head_timeout"))
        runtime.spawn(deadline.run(), "coordinator-head-deadline")
        await runtime.start()  # the loops run before the first request is served
        for s in socks:
            await web.SockSite(runner, s, ssl_context=ssl_context).start()
    except BaseException:
        await runner.cleanup()
        for s in socks:
            s.close()
        await runtime.stop()
        db_lock.release()
        raise
    return RunningServer(url, settings, runtime.store, app, runner, provider, runtime,
                         admin_url, db_lock)


#: Container allocations between young-generation collections (CPython's default: 700).
GC_YOUNG_THRESHOLD = 100_000


def tune_gc() -> None:
    """Make Python's cyclic garbage collector cheap for a long-running server.

    A heartbeat allocates a few hundred short-lived containers (request, task, message
    objects), so CPython's default threshold runs a young collection every few requests,
    and the older generations, which hold the caches that grow with the fleet, are walked
    again and again: at 2,000 heartbeats/s the defaults spent ~3.8 s collecting in a
    45 s run, with pauses up to 78 ms (``python bench/ingest.py --gc default``).
    Everything alive once the server is up (modules, the app, the preloaded caches) is
    moved out of the collector's sight for good, and young collections run every
    ``GC_YOUNG_THRESHOLD`` allocations. Reference counting still frees almost
    everything at once; the collector only has cycles left to find.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


#: Seconds a thread waiting for the GIL waits before it asks the running one to let go
#: (CPython's default: 0.005).
SWITCH_INTERVAL_S = 0.001


def tune_switch_interval(seconds: float = SWITCH_INTERVAL_S) -> None:
    """Let the store's writer thread get the GIL back sooner.

    The writer gives up the GIL around every SQLite statement, and a busy event loop
    only hands it back when the switch interval runs out: with CPython's 5 ms, each
    statement of a commit could wait that long, and a transaction of several
    statements held its heartbeats' answers for tens of milliseconds. In three pairs
    of runs at 2,500 heartbeats/s (37,500 agents), ``python bench/ingest.py --rates
    2500 --switch-interval-ms 5`` against ``1``, the p99 was lower with 1 ms each time
    (143 against 43 ms, 2.9 s against 0.74 s, 407 against 244 ms; this VM is noisy).
    """
    sys.setswitchinterval(seconds)


def _say(settings: Settings, line: str) -> None:
    if settings.log_format == "json":
        log.info(line)
    else:
        print(line, file=sys.stderr, flush=True)


async def _billing_instances(server: RunningServer) -> list[int]:
    """The ids of instances still rented (not destroyed): what keeps billing."""
    rows = await server.store.read(lambda r: r.active_instances(["id"]))
    return [int(r["id"]) for r in rows]


async def _local_children(server: RunningServer) -> list[int]:
    """The ids of the local provider's instances still running: this process's children,
    which stop with it (bring-your-own agents are not)."""
    rows = await server.store.read(lambda r: r.active_instances(["id", "kind", "provider"]))
    return [int(r["id"]) for r in rows if r["kind"] == "deployed" and r["provider"] == "local"]


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


async def _serve_until_signalled(settings: Settings, provider: Provider) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    start = getattr(provider, "start", None)
    if start is not None:
        await start()  # the fake vast.ai listens before the first search
    server = await start_server(settings, provider)
    if settings.admin_token_generated:
        _announce_new_token(settings)
    tune_gc()
    tune_switch_interval()
    admin = f", operator API and dashboard on {server.admin_url}" if server.admin_url else ""
    _say(settings, f"vast-manager coordinator on {server.url}{admin} (fleet "
                   f"{settings.fleet_id}, db {settings.db_path})")
    rented = await _billing_instances(server)
    if rented:
        _say(settings, f"{len(rented)} instance(s) from before are still rented ({_ids(rented)}): "
                       f"their state is checked against {provider.name} in the first monitor "
                       f"round (every {settings.monitor_interval_s:g} s); until an agent "
                       "speaks again, status shows its last heartbeat's age")
    try:
        await stop.wait()
        children = await _local_children(server) if provider.name == "local" else []
        if children:
            _say(settings, f"stopping: the {len(children)} local instance(s) "
                           f"({_ids(children)}) and their agents stop with this coordinator "
                           "(simulated; nothing bills)")
        rented = [i for i in await _billing_instances(server) if i not in set(children)]
        if rented and provider.name == "fake":
            _say(settings, f"stopping: the fake vast.ai stops with the coordinator, and its "
                           f"{len(rented)} instance(s) with it ({_ids(rented)}); nothing was "
                           "billed for real")
        elif rented:
            _say(settings, f"stopping: {len(rented)} instance(s) stay rented and keep billing "
                           f"({_ids(rented)}); their agents keep working. Serve this database "
                           "again to manage them, or destroy them (vast-manager destroy ID) "
                           "before you stop for good")
        elif not children:
            _say(settings, "stopping: no instance is rented, nothing keeps billing")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
        with contextlib.suppress(Exception):
            await provider.close()


def run_server(settings: Settings, provider_name: str) -> None:
    """Serve until SIGTERM/SIGINT (blocking; ``vast-manager serve``). A setting that
    cannot work raises ``ServeConfigError`` (or ``DatabaseFileError``) before anything is
    written."""
    if settings.tls_cert and settings.tls_key:
        tls_context(settings.tls_cert, settings.tls_key)  # fail before anything starts
    check_db_path(settings.db_path)
    reused = False
    if settings.admin_token_generated:
        try:
            stored = stored_token(settings)
        except ValueError as err:
            raise ServeConfigError(str(err)) from None
        if stored is not None:
            settings, reused = stored, True
    configure_logging(settings)
    if reused:
        log.warning("admin token read from %s (set VM_ADMIN_TOKEN to choose your own)",
                    token_path(settings))
    provider = make_provider(settings, provider_name)
    asyncio.run(_serve_until_signalled(settings, provider))


def _announce_new_token(settings: Settings) -> None:
    """A generated token, kept beside the database for restarts and said once: in the
    log as its file's name with JSON logs (shipped elsewhere), else itself on stderr."""
    try:
        path = store_token(settings)
    except FileExistsError:
        path = token_path(settings)
        log.warning("%s appeared meanwhile; this run uses its own generated token", path)
    if settings.log_format == "json":
        log.warning("admin token generated into %s (mode 0600); set VM_ADMIN_TOKEN to "
                    "choose your own", path)
    else:
        # Printed once, to stderr only, so it never lands in a log file of stdout.
        print(f"VM_ADMIN_TOKEN={settings.admin_token}  (generated, kept in {path} for "
              "restarts; set VM_ADMIN_TOKEN to choose your own)", file=sys.stderr, flush=True)
