"""The agent's lifecycle (docs/policy.md): booting -> hello -> fetching_params -> warming ->
benchmarking -> result(s) -> proving, or terminating / failed.

One controller runs one plan at a time as a task ("hello", "prepare",
"benchmark", "prove", "failed") and interrupts it when a directive says
``terminate``, when ``benchmark`` arrives while proving (or failed), when the
orphan rule fires or when a signal asks the agent to stop. Beside it run the
heartbeat loop (at the pace each directive sets), the log shipper (logs and
results go through the on-disk spool) and the orphan watchdog.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from vast_manager.agent.coordinator_client import PermanentFailure
from vast_manager.agent.cuzk import CuzkError
from vast_manager.agent.logbuffer import LogBuffer
from vast_manager.agent.params import ParamsError
from vast_manager.agent.phases.ending import Ending
from vast_manager.agent.phases.shared import (
    EXIT_CONFIG,
    EXIT_DESTROY_FAILED,
    EXIT_FAILED,
    EXIT_ORPHANED,
    EXIT_SIGNALLED,
    EXIT_TERMINATED,
    HEARTBEATS_PER_ORPHAN_TIMEOUT,
    REBENCHMARK_PLANS,
    AgentFailure,
    agent_version,
    default_destroyer,
    default_memory_probe,
    default_sampler_factory,
    heartbeat_interval_s,
    log,
)

__all__ = [
    "EXIT_CONFIG", "EXIT_DESTROY_FAILED", "EXIT_FAILED", "EXIT_ORPHANED", "EXIT_SIGNALLED",
    "EXIT_TERMINATED", "HEARTBEATS_PER_ORPHAN_TIMEOUT", "Agent", "AgentFailure", "LogBuffer",
    "default_destroyer", "default_memory_probe", "default_sampler_factory",
    "heartbeat_interval_s", "state_dir_writable",
]


class Agent(Ending):
    """One agent process's lifecycle. ``await Agent(config).run()`` returns the exit status.

    The loop is here; each phase is a module of ``vast_manager.agent.phases``, layered in
    the order the agent goes through them (each may use the ones before it)."""

    async def run(self) -> int:
        agent_log = logging.getLogger("vast_manager.agent")
        agent_log.setLevel(self.config.log_level)
        agent_log.addHandler(self.logs)
        try:
            return await self._run()
        finally:
            await self._cleanup()
            logging.getLogger("vast_manager.agent").removeHandler(self.logs)

    async def _run(self) -> int:
        # Opening NVML blocks: keep it off the event loop.
        host, sampler = await asyncio.to_thread(self._sampler_factory, self.config)
        self._host, self._sampler = host, sampler
        await sampler.start()
        self._hb_window = sampler.open_window()
        log.info(
            "agent %s starting (version %s, %d GPUs, provider %s)",
            self.config.agent_id, agent_version(), len(host.gpus), self.config.provider,
        )
        if self.config.provider == "vast" and not self.config.container_api_key:
            log.warning("CONTAINER_API_KEY is not set: this instance cannot destroy itself")
        self._background.append(asyncio.create_task(self._watchdog()))
        plan = self._plan = "hello"
        task = asyncio.create_task(self._execute(plan))
        while True:
            waker = asyncio.create_task(self._wake.wait())
            await asyncio.wait({task, waker}, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            interrupted = (
                self._signal is not None
                or self._orphaned
                or self._terminate_requested
                or (self._rebench_requested and plan in REBENCHMARK_PLANS)
            )
            if not task.done():
                if not interrupted:
                    self._wake.clear()  # nothing for this plan: keep waiting
                    continue
                task.cancel()
            next_plan: str | None = None
            try:
                next_plan = await task
            except asyncio.CancelledError:
                if not interrupted:
                    raise
            except (AgentFailure, CuzkError, ParamsError, PermanentFailure, OSError) as exc:
                log.error("%s failed: %s", plan, exc)
                self._failure = str(exc)[:1024] or type(exc).__name__
                next_plan = "failed"
            except Exception as exc:
                log.exception("%s failed unexpectedly", plan)
                self._failure = f"the agent crashed in {plan}: {type(exc).__name__}"
                next_plan = "failed"
            if self._signal is not None:
                log.info("stopping on signal %d", self._signal)
                return EXIT_SIGNALLED + self._signal
            if self._orphaned:
                return await self._finish_orphaned()
            if self._terminate_requested:
                return await self._finish_terminate()
            if self._rebench_requested and plan in REBENCHMARK_PLANS:
                self._rebench_requested = False
                self._wake.clear()
                next_plan = "benchmark" if self._prepared else "prepare"
            plan = self._plan = next_plan or "failed"
            task = asyncio.create_task(self._execute(plan))

    async def _execute(self, plan: str) -> str:
        if plan == "hello":
            return await self._hello()
        if plan == "prepare":
            return await self._prepare()
        if plan == "benchmark":
            return await self._benchmark()
        if plan == "prove":
            return await self._prove()
        if plan == "failed":
            return await self._failed()
        raise AssertionError(f"unknown plan {plan}")


def state_dir_writable(path: Path) -> None:
    """Create the state folder; raises OSError when it cannot be used."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    probe.write_bytes(b"")
    probe.unlink()
