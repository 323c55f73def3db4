"""Ending: failed, terminated on a directive, orphaned, or stopped; the watchdog of the
orphan rule and the cleanup every end shares."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from vast_manager.agent.coordinator_client import ClientError
from vast_manager.agent.phases.benchmark import Benchmarking
from vast_manager.agent.phases.shared import (
    EXIT_DESTROY_FAILED,
    EXIT_FAILED,
    EXIT_ORPHANED,
    EXIT_TERMINATED,
    log,
)
from vast_manager.agent.selfdestroy import SelfDestroyError


class Ending(Benchmarking):
    """Every way the agent ends, and the orphan watchdog."""

    async def _failed(self) -> str:
        self._has_failed = True
        self._set_phase("failed")
        await self._stop_children()
        self.logs.batch_ready.set()  # ship the reason now
        # Stay, heartbeating `failed`, until the coordinator decides (terminate,
        # or benchmark to retry); the orphan rule bounds the wait.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def orphan_check(self) -> bool:
        """True when the orphan rule (docs/operations.md) says this instance runs unwatched."""
        now = self._monotonic()
        timeout = self.config.orphan_timeout_s
        last_answer = self.client.last_verified_at or self._started_mono
        if now - last_answer < timeout:
            return False
        if self.phase == "proving":
            # A silent coordinator is no reason to stop earning.
            last_proof = self._last_proof_mono or self._proving_since or now
            return now - last_proof >= timeout
        return True

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self._watchdog_period_s)
            if self.orphan_check():
                log.error("no verified answer from the coordinator for %.0f s%s: orphaned",
                          self.config.orphan_timeout_s,
                          " and no proof completed" if self.phase == "proving" else "")
                self._orphaned = True
                self._wake.set()
                return

    async def _stop_background(self) -> None:
        tasks, self._background = self._background, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_children(self) -> None:
        await self._stop_work()
        if self._sampler is not None:
            self._sampler.set_cuzk_status_url(None)
        await self.daemon.stop()

    async def _destroy(self) -> bool:
        try:
            await self._destroyer(self.config)
            return True
        except (SelfDestroyError, aiohttp.ClientError, OSError) as exc:
            log.error("self-destroy failed: %s", exc)
            return False

    async def _finish_terminate(self) -> int:
        self._set_phase("terminating")
        await self._stop_background()
        await self._stop_children()
        with contextlib.suppress(ClientError):
            await self._send_heartbeat(give_up_after_s=15.0)
        self._spool_logs()
        await self._flush_spool(give_up_after_s=30.0)
        log.info("terminating: destroying this instance through provider %s",
                 self.config.provider)
        if not await self._destroy():
            return EXIT_DESTROY_FAILED
        return EXIT_FAILED if self._has_failed else EXIT_TERMINATED

    async def _finish_orphaned(self) -> int:
        await self._stop_background()
        await self._stop_children()
        self._spool_logs()  # kept on disk; nobody is listening now
        log.error("self-destroying: the coordinator is gone")
        return EXIT_ORPHANED if await self._destroy() else EXIT_DESTROY_FAILED

    async def _cleanup(self) -> None:
        await self._stop_background()
        with contextlib.suppress(Exception):
            await self._stop_work()
        with contextlib.suppress(Exception):
            await self.daemon.close()
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                await self._sampler.stop()
            sources = getattr(self._sampler, "sources", None)
            if sources is not None and hasattr(sources, "close"):
                with contextlib.suppress(Exception):
                    sources.close()  # NVML shutdown
        with contextlib.suppress(Exception):
            self._spool_logs()
        await self.client.close()
