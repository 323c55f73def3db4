"""Proving: the daemon kept ready, the operator's work command supervised, the daemon's
proofs counted for the heartbeats and the orphan rule."""

from __future__ import annotations

import asyncio
import contextlib
import os

from vast_manager.agent.cuzk import (
    CuzkError,
    DaemonExited,
    completed_total,
)
from vast_manager.agent.phases.context import AgentContext
from vast_manager.agent.phases.shared import (
    PROVING_POLL_S,
    log,
)
from vast_manager.agent.phases.warmup import Warming
from vast_manager.agent.procs import ManagedProcess
from vast_manager.common.curio import CURIO_LISTEN, CURIO_PORT


def curio_listen(env: dict[str, str]) -> str | None:
    """A Curio address unique to this instance, unless the operator gave ``CURIO_LISTEN``:
    every interface, on the public port vast.ai mapped to Curio's (``VAST_TCP_PORT_12300``,
    set inside the instance: docs/vast.md). Curio binds this address and writes it, with
    0.0.0.0 replaced by its database connection's local IP, as ``host_and_port`` on every
    task it finishes; vast.ai hands each instance on a public IP its own ports, so no two
    of ours share one there. Not the public IP itself: Curio would have to bind it, and a
    vast.ai container does not hold it (docs/operations.md, "Production as the cluster
    records it"). None off vast.ai or when the port is not opened."""
    if env.get(CURIO_LISTEN):
        return None
    port = env.get(f"VAST_TCP_PORT_{CURIO_PORT}", "").strip()
    return f"0.0.0.0:{int(port)}" if port.isdigit() else None


class Proving:
    """Phase proving: the work command and its end."""

    def __init__(self, ctx: AgentContext, warming: Warming) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self._warming = warming  # restarts the daemon
        # Monotonic times the orphan rule reads while proving (``Ending.orphan_check``).
        self.since: float | None = None
        self.last_proof_mono: float | None = None
        self._work_task: asyncio.Task[None] | None = None

    async def run(self) -> str:
        ctx, daemon, monotonic = self.ctx, self.ctx.daemon, self.ctx.monotonic
        ctx.set_phase("proving")
        if not daemon.running or daemon.devices is not None:
            await self._warming.start_daemon(None)
        self.since = monotonic()
        self.last_proof_mono = self.since
        if self.config.work_cmd:
            self._work_task = asyncio.create_task(self._supervise_work(self.config.work_cmd))
        else:
            log.info("no VM_WORK_CMD: the daemon stays up, ready")
        try:
            await ctx.crashes.run("proving", self._count_proofs,
                                  lambda: self._warming.start_daemon(None))
        finally:
            await self.stop_work()
        raise AssertionError("unreachable: proving ends by an interruption or a failure")

    async def _count_proofs(self) -> None:
        """The daemon's completed proofs into the heartbeats' counter, until it exits."""
        ctx, daemon = self.ctx, self.ctx.daemon
        last_count: int | None = None  # a new daemon counts from 0
        while True:
            if not daemon.running:
                raise DaemonExited("the cuzk daemon exited while proving")
            with contextlib.suppress(CuzkError):
                count = completed_total(await daemon.status())
                if count is not None:
                    if last_count is not None and count > last_count:
                        ctx.proofs_completed_total += count - last_count
                        self.last_proof_mono = ctx.monotonic()
                    last_count = count
            await asyncio.sleep(PROVING_POLL_S)

    def _work_env(self) -> dict[str, str]:
        env = dict(os.environ)
        daemon = self.ctx.daemon
        # The daemon's ports are picked at start; the work command finds them here.
        env["VM_CUZK_ADDR"] = daemon.addr
        env["VM_CUZK_LISTEN"] = f"127.0.0.1:{daemon.port}"
        env["VM_CUZK_STATUS_URL"] = daemon.status_url
        env["FIL_PROOFS_PARAMETER_CACHE"] = str(self.config.params_dir)
        listen = curio_listen(env)
        if listen is not None:
            env[CURIO_LISTEN] = listen
        for name in ("VM_AGENT_KEY", "CONTAINER_API_KEY"):
            env.pop(name, None)  # the work command needs neither
        return env

    async def _supervise_work(self, command: str) -> None:
        failures = 0
        while True:
            proc = ManagedProcess(
                ["/bin/sh", "-c", command], source="work", sink=self.ctx.logs.child_line,
                env=self._work_env(),
            )
            started = self.ctx.monotonic()
            try:
                await proc.start()
                log.info("work command started (pid %s)", proc.pid)
                code: int | None = await proc.wait()
            except OSError as exc:
                log.error("cannot start the work command: %s", exc)
                code = None
            finally:
                await proc.stop()
            ran_s = self.ctx.monotonic() - started
            failures = 0 if ran_s > 60 else failures + 1
            delay = min(60.0, 2.0 ** failures) if failures else 1.0
            log.warning("work command exited (status %s after %.0f s); restarting in %.0f s",
                        code, ran_s, delay)
            await asyncio.sleep(delay)

    async def stop_work(self) -> None:
        """Stop the work command (a benchmark or an end of the agent needs it gone)."""
        task, self._work_task = self._work_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
