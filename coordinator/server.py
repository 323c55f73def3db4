"""Run the coordinator: bind, serve, stop cleanly (for the CLI, the demo and tests).

``start_server`` binds first (port 0 picks a free one) so the URL handed to
agents is known before the first deploy, then serves the app on that socket.
``run_server`` is the blocking entry point of ``vast-manager serve``: it
builds the provider by name and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from coordinator import policy
from coordinator.app import create_app
from coordinator.providers.base import Provider
from coordinator.settings import Settings
from coordinator.store import Store


@dataclass(slots=True)
class RunningServer:
    url: str
    settings: Settings
    store: Store
    app: web.Application
    runner: web.AppRunner
    provider: Provider

    async def stop(self) -> None:
        """Stop serving, let the monitor loop end, then close the store.

        The provider belongs to the caller (it may outlive the server).
        """
        await self.runner.cleanup()
        await asyncio.to_thread(self.store.close)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def start_server(
    settings: Settings, provider: Provider, *, clock: policy.Clock = time.time
) -> RunningServer:
    """Open the store, bind ``settings.host:port`` and serve; returns once listening."""
    scale = getattr(provider, "time_scale", None)
    if provider.name == "local" and settings.sim_time_scale == 1.0 and scale:
        # The local fleet reports simulated seconds; its own scale is the truth.
        settings = settings.with_values(sim_time_scale=float(scale))
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    host_in_url = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host_in_url}:{port}"
    if port != settings.port:
        settings = settings.with_values(port=port)
    try:
        store = await asyncio.to_thread(Store, settings.db_path,
                                        batch_max=settings.write_batch_max)
    except BaseException:
        sock.close()
        raise
    app = create_app(settings, store, provider, clock)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    try:
        await runner.setup()
        site = web.SockSite(runner, sock)
        await site.start()
    except BaseException:
        await runner.cleanup()
        sock.close()
        await asyncio.to_thread(store.close)
        raise
    return RunningServer(url, settings, store, app, runner, provider)


def make_provider(settings: Settings, provider_name: str) -> Provider:
    """Build the provider named on the command line (imports only the one needed)."""
    if provider_name == "local":
        from coordinator.providers.local import LocalProvider

        workdir = Path(settings.db_path).resolve().parent / "local-instances"
        return LocalProvider(workdir)  # type: ignore[return-value]
    if provider_name == "vast":
        from coordinator.providers import vast as vast_provider

        # The vast.ai provider needs a REST client, an image and an onstart script;
        # its module owns building them from the environment.
        factory = getattr(vast_provider, "from_settings", None)
        if factory is None:
            raise ValueError("the vast provider cannot be built from settings yet")
        return factory(settings)  # type: ignore[no-any-return]
    raise ValueError(f"unknown provider {provider_name!r} (local or vast)")


async def _serve_until_signalled(settings: Settings, provider: Provider) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await start_server(settings, provider)
    print(f"vast-manager coordinator on {server.url} (fleet {settings.fleet_id}, "
          f"db {settings.db_path})", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
        with contextlib.suppress(Exception):
            await provider.close()


def run_server(settings: Settings, provider_name: str) -> None:
    """Serve until SIGTERM/SIGINT (blocking; ``vast-manager serve``)."""
    if settings.admin_token_generated:
        # Printed once, to stderr only, so it never lands in a log file of stdout.
        print(f"VM_ADMIN_TOKEN={settings.admin_token}  (generated; set VM_ADMIN_TOKEN to "
              "choose your own)", file=sys.stderr, flush=True)
    provider = make_provider(settings, provider_name)
    asyncio.run(_serve_until_signalled(settings, provider))
