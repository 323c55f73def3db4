"""The coordinator's front processes: started on the shared socket, restarted, stopped.

``FrontPool`` runs ``python -m coordinator.front`` N times, each inheriting
the one listening socket and reading its ``FrontSpec`` from stdin (the fleet
secrets go through a pipe, never the command line or the environment). A
front that dies is started again after a pause, and its death is logged; the
others keep answering meanwhile. ``stop`` ends them with SIGTERM (they finish
the requests in flight) and SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

#: Pause before a dead front is started again (a front that cannot start must not spin).
RESTART_DELAY_S = 1.0
#: How long ``start`` waits for every front to connect its link.
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0


class FrontStartError(RuntimeError):
    """A front process exited or never connected while the pool started."""


class FrontPool:
    def __init__(self, count: int, spec: dict[str, Any], listen: socket.socket,
                 connected: Callable[[], int]) -> None:
        self.count = count
        self._spec = {**spec, "listen_fd": listen.fileno()}
        self._fd = listen.fileno()
        self._connected = connected  # how many fronts hold a link now
        self.procs: list[asyncio.subprocess.Process] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.returncode is None]

    async def _spawn(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "coordinator.front",
            stdin=asyncio.subprocess.PIPE, pass_fds=(self._fd,))
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps(self._spec))
        await proc.stdin.drain()
        proc.stdin.close()
        return proc

    async def start(self) -> None:
        """Start every front; return once each has connected its link."""
        for slot in range(self.count):
            self.procs.append(await self._spawn())
            self._watchers.append(asyncio.create_task(self._watch(slot),
                                                      name=f"front-watch-{slot}"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while self._connected() < self.count:
            if self.restarts:
                raise FrontStartError("a front process exited while starting; its error is "
                                      "logged above")
            if loop.time() > deadline:
                raise FrontStartError(f"the front processes did not connect within "
                                      f"{START_TIMEOUT_S:g} s")
            await asyncio.sleep(0.02)

    async def _watch(self, slot: int) -> None:
        while True:
            proc = self.procs[slot]
            status = await proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            log.warning("front process %d exited with status %s; starting another in %g s",
                        proc.pid, status, RESTART_DELAY_S)
            await asyncio.sleep(RESTART_DELAY_S)
            if self._stopping:
                return
            self.procs[slot] = await self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
