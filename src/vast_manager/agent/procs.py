"""Child processes the agent runs (cuzk, cuzk-bench, the params and work commands).

Each child gets its own process group, so stopping it (SIGTERM, then SIGKILL
after a timeout) also stops whatever it spawned; every child is reaped, and
its output goes line by line to a sink (the agent's shipped logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

LineSink = Callable[[str, str], None]  # (source, text)
READ_LIMIT = 1024 * 1024  # longest line read whole; real cuzk logs can be long


def _kill_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class ManagedProcess:
    """One child process in its own process group, with its output pumped to a sink."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        source: str,
        sink: LineSink,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_stdout_line: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.source = source
        self._sink = sink
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._on_stdout_line = on_stdout_line
        self._proc: asyncio.subprocess.Process | None = None
        self._pumps: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.source} is already running")
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            cwd=self._cwd,
            start_new_session=True,  # its own process group: stop() reaches its children
            limit=READ_LIMIT,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._pumps = [
            asyncio.create_task(self._pump(self._proc.stdout, self._on_stdout_line)),
            asyncio.create_task(self._pump(self._proc.stderr, None)),
        ]
        log.debug("started %s (pid %d): %s", self.source, self._proc.pid, self.argv[0])

    async def _pump(
        self, stream: asyncio.StreamReader, on_line: Callable[[str], None] | None
    ) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:
                # A line over READ_LIMIT: skip what is buffered rather than die.
                raw = await stream.read(READ_LIMIT)
            if not raw:
                return
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if on_line is not None:
                try:
                    on_line(text)
                except Exception:
                    log.exception("handling a line of %s failed", self.source)
            self._sink(self.source, text)

    async def wait(self) -> int:
        """Wait for the child to exit and its output to be read; returns its exit status."""
        if self._proc is None:
            raise RuntimeError(f"{self.source} was never started")
        code = await self._proc.wait()
        # The pipes close when the last holder exits; a grandchild may keep
        # them open, so do not wait for ever on the output.
        if self._pumps:
            _done, pending = await asyncio.wait(self._pumps, timeout=5.0)
            for task in pending:
                task.cancel()
            for task in self._pumps:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._pumps = []
        return code

    async def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout_s``; always reaps."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid
        try:
            if proc.returncode is None:
                _kill_group(pgid, signal.SIGTERM)
                try:
                    # asyncio.timeout, not wait_for, which can swallow a cancellation (3.11).
                    async with asyncio.timeout(timeout_s):
                        await proc.wait()
                except TimeoutError:
                    log.warning("%s did not stop in %.0f s; killing it", self.source, timeout_s)
        finally:
            # Whatever is left of the group (the leader, or children it left
            # behind) goes now, also when this stop is itself cancelled.
            _kill_group(pgid, signal.SIGKILL)
        return await self.wait()
