"""Proving: the daemon kept ready, the operator's work command supervised."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os

from vast_manager.agent.cuzk import (
    CuzkError,
    completed_total,
)
from vast_manager.agent.phases.shared import (
    PROVING_POLL_S,
    AgentFailure,
    log,
)
from vast_manager.agent.phases.warmup import Warming
from vast_manager.agent.procs import ManagedProcess


class Proving(Warming):
    """Phase proving: the work command and its end."""

    async def _prove(self) -> str:
        self._set_phase("proving")
        if not self.daemon.running or self.daemon.devices is not None:
            await self._start_daemon(None)
        self._proving_since = self._monotonic()
        self._last_proof_mono = self._proving_since
        last_count: int | None = None
        restarts: collections.deque[float] = collections.deque(maxlen=5)
        if self.config.work_cmd:
            self._work_task = asyncio.create_task(self._supervise_work(self.config.work_cmd))
        else:
            log.info("no VM_WORK_CMD: the daemon stays up, ready")
        try:
            while True:
                if not self.daemon.running:
                    now = self._monotonic()
                    if len(restarts) == restarts.maxlen and now - restarts[0] < 600:
                        raise AgentFailure("the cuzk daemon died 5 times in 10 minutes")
                    log.error("the cuzk daemon exited while proving; restarting it")
                    restarts.append(self._monotonic())
                    await self._start_daemon(None)
                    last_count = None
                with contextlib.suppress(CuzkError):
                    count = completed_total(await self.daemon.status())
                    if count is not None:
                        if last_count is not None and count > last_count:
                            self.proofs_completed_total += count - last_count
                            self._last_proof_mono = self._monotonic()
                        last_count = count
                await asyncio.sleep(PROVING_POLL_S)
        finally:
            await self._stop_work()

    def _work_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The daemon's ports are picked at start; the work command finds them here.
        env["VM_CUZK_ADDR"] = self.daemon.addr
        env["VM_CUZK_LISTEN"] = f"127.0.0.1:{self.daemon.port}"
        env["VM_CUZK_STATUS_URL"] = self.daemon.status_url
        env["FIL_PROOFS_PARAMETER_CACHE"] = str(self.config.params_dir)
        for name in ("VM_AGENT_KEY", "CONTAINER_API_KEY"):
            env.pop(name, None)  # the work command needs neither
        return env

    async def _supervise_work(self, command: str) -> None:
        failures = 0
        while True:
            proc = ManagedProcess(
                ["/bin/sh", "-c", command], source="work", sink=self.logs.child_line,
                env=self._work_env(),
            )
            started = self._monotonic()
            try:
                await proc.start()
                log.info("work command started (pid %s)", proc.pid)
                code: int | None = await proc.wait()
            except OSError as exc:
                log.error("cannot start the work command: %s", exc)
                code = None
            finally:
                await proc.stop()
            ran_s = self._monotonic() - started
            failures = 0 if ran_s > 60 else failures + 1
            delay = min(60.0, 2.0 ** failures) if failures else 1.0
            log.warning("work command exited (status %s after %.0f s); restarting in %.0f s",
                        code, ran_s, delay)
            await asyncio.sleep(delay)

    async def _stop_work(self) -> None:
        task, self._work_task = self._work_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
