"""Ending: failed, terminated on a directive, orphaned, or stopped; the watchdog of the
orphan rule and the cleanup every end shares."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from vast_manager.agent.coordinator_client import ClientError
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.proving import Proving
from vast_manager.agent.phases.reporting import Reporting
from vast_manager.agent.phases.shared import (
    EXIT_DESTROY_FAILED,
    EXIT_FAILED,
    EXIT_ORPHANED,
    EXIT_TERMINATED,
    Destroyer,
    log,
)
from vast_manager.agent.selfdestroy import SelfDestroyError


class Ending:
    """Every way the agent ends, and the orphan watchdog."""

    def __init__(
        self,
        ctx: AgentContext,
        orders: Orders,
        proving: Proving,
        reporting: Reporting,
        destroyer: Destroyer,
        watchdog_period_s: float,
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self._orders = orders  # the watchdog's orphan rule interrupts the loop
        self._proving = proving  # its work command stops; its proofs keep the agent alive
        self._reporting = reporting  # the last heartbeat and logs
        self._destroyer = destroyer
        self._watchdog_period_s = watchdog_period_s
        self._started_mono = ctx.monotonic()
        self.has_failed = False  # phase failed was reported: terminating exits 1

    async def failed(self) -> str:
        self.has_failed = True
        self.ctx.set_phase("failed")
        await self._stop_children()
        self.ctx.logs.batch_ready.set()  # ship the reason now
        # Stay, heartbeating `failed`, until the coordinator decides (terminate,
        # or benchmark to retry); the orphan rule bounds the wait.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def orphan_check(self) -> bool:
        """True when the orphan rule (docs/operations.md) says this instance runs unwatched."""
        now = self.ctx.monotonic()
        timeout = self.config.orphan_timeout_s
        last_answer = self.ctx.client.last_verified_at or self._started_mono
        if now - last_answer < timeout:
            return False
        if self.ctx.phase == "proving":
            # A silent coordinator is no reason to stop earning.
            last_proof = self._proving.last_proof_mono or self._proving.since or now
            return now - last_proof >= timeout
        return True

    async def watchdog(self) -> None:
        while True:
            await asyncio.sleep(self._watchdog_period_s)
            if self.orphan_check():
                log.error("no verified answer from the coordinator for %.0f s%s: orphaned",
                          self.config.orphan_timeout_s,
                          " and no proof completed" if self.ctx.phase == "proving" else "")
                self._orders.orphan()
                return

    async def _stop_background(self) -> None:
        tasks, self.ctx.tasks = self.ctx.tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_children(self) -> None:
        await self._proving.stop_work()
        if self.ctx.sampler is not None:
            self.ctx.sampler.set_cuzk_status_url(None)
        await self.ctx.daemon.stop()

    async def _destroy(self) -> bool:
        try:
            await self._destroyer(self.config)
            return True
        except (SelfDestroyError, aiohttp.ClientError, OSError) as exc:
            log.error("self-destroy failed: %s", exc)
            return False

    async def terminate(self) -> int:
        """The coordinator's ``terminate``: say so, ship the logs, destroy the instance."""
        self.ctx.set_phase("terminating")
        await self._stop_background()
        await self._stop_children()
        with contextlib.suppress(ClientError):
            await self._reporting.send_heartbeat(give_up_after_s=15.0)
        self._reporting.spool_logs()
        await self._reporting.flush_spool(give_up_after_s=30.0)
        log.info("terminating: destroying this instance through provider %s",
                 self.config.provider)
        if not await self._destroy():
            return EXIT_DESTROY_FAILED
        return EXIT_FAILED if self.has_failed else EXIT_TERMINATED

    async def orphaned(self) -> int:
        """The orphan rule fired: destroy the instance without the coordinator."""
        await self._stop_background()
        await self._stop_children()
        self._reporting.spool_logs()  # kept on disk; nobody is listening now
        log.error("self-destroying: the coordinator is gone")
        return EXIT_ORPHANED if await self._destroy() else EXIT_DESTROY_FAILED

    async def cleanup(self) -> None:
        """What every end shares, however the loop ended (even by an exception)."""
        ctx = self.ctx
        await self._stop_background()
        with contextlib.suppress(Exception):
            await self._proving.stop_work()
        with contextlib.suppress(Exception):
            await ctx.daemon.close()
        if ctx.sampler is not None:
            with contextlib.suppress(Exception):
                await ctx.sampler.stop()
            sources = getattr(ctx.sampler, "sources", None)
            if sources is not None and hasattr(sources, "close"):
                with contextlib.suppress(Exception):
                    sources.close()  # NVML shutdown
        with contextlib.suppress(Exception):
            self._reporting.spool_logs()
        await ctx.client.close()
