"""The agent's lifecycle (docs/policy.md): booting -> hello -> fetching_params -> warming ->
benchmarking -> result(s) -> proving, or terminating / failed.

One loop runs one plan at a time as a task ("hello", "prepare", "benchmark",
"prove", "failed"), each a phase of ``vast_manager.agent.phases`` given what it
needs, and interrupts it when a directive says ``terminate``, when ``benchmark``
arrives while proving (or failed), when the orphan rule fires or when a signal
asks the agent to stop (``phases.context.Orders``). Beside it run the heartbeat
loop (at the pace each directive sets), the log shipper (logs and results go
through the on-disk spool) and the orphan watchdog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from vast_manager.agent.config import AgentConfig
from vast_manager.agent.coordinator_client import CoordinatorClient, PermanentFailure
from vast_manager.agent.cuzk import CuzkDaemon, CuzkError
from vast_manager.agent.logbuffer import LogBuffer
from vast_manager.agent.params import ParamsError
from vast_manager.agent.phases.benchmark import Benchmarking
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.ending import Ending
from vast_manager.agent.phases.fetch import Fetching
from vast_manager.agent.phases.proving import Proving
from vast_manager.agent.phases.reporting import Reporting
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
    Destroyer,
    MemoryProbe,
    SamplerFactory,
    agent_version,
    default_destroyer,
    default_memory_probe,
    default_sampler_factory,
    heartbeat_interval_s,
    log,
)
from vast_manager.agent.phases.warmup import Warming
from vast_manager.agent.spool import Spool

__all__ = [
    "EXIT_CONFIG", "EXIT_DESTROY_FAILED", "EXIT_FAILED", "EXIT_ORPHANED", "EXIT_SIGNALLED",
    "EXIT_TERMINATED", "HEARTBEATS_PER_ORPHAN_TIMEOUT", "Agent", "AgentFailure", "LogBuffer",
    "default_destroyer", "default_memory_probe", "default_sampler_factory",
    "heartbeat_interval_s", "state_dir_writable",
]


class Agent:
    """One agent process's lifecycle. ``await Agent(config).run()`` returns the exit status.

    The loop is here; each phase is a class of ``vast_manager.agent.phases`` built on
    the shared ``AgentContext``, given the other phases it uses."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        sampler_factory: SamplerFactory = default_sampler_factory,
        client: CoordinatorClient | None = None,
        destroyer: Destroyer = default_destroyer,
        monotonic: Callable[[], float] = time.monotonic,
        watchdog_period_s: float | None = None,
        memory_probe: MemoryProbe = default_memory_probe,
    ) -> None:
        client = client or CoordinatorClient(
            config.coordinator_url, config.agent_id, config.agent_key
        )
        self.config = config
        self.ctx = ctx = AgentContext(config, client, monotonic)
        self.orders = orders = Orders()
        self._sampler_factory = sampler_factory
        self.reporting = Reporting(ctx, orders)
        self.fetching = Fetching(ctx, memory_probe)
        self.warming = Warming(ctx)
        self.proving = Proving(ctx, self.warming)
        self.benchmarking = Benchmarking(ctx, orders, self.warming, self.proving,
                                         self.reporting)
        self.ending = Ending(
            ctx, orders, self.proving, self.reporting, destroyer,
            watchdog_period_s or max(0.2, min(10.0, config.orphan_timeout_s / 10)),
        )
        self._prepared = False  # fetched and warmed once: a rebenchmark skips both

    # What tests and the CLI read of the agent.
    @property
    def client(self) -> CoordinatorClient:
        return self.ctx.client

    @property
    def spool(self) -> Spool:
        return self.ctx.spool

    @property
    def daemon(self) -> CuzkDaemon:
        return self.ctx.daemon

    @property
    def logs(self) -> LogBuffer:
        return self.ctx.logs

    @property
    def phase(self) -> str:
        return self.ctx.phase

    def orphan_check(self) -> bool:
        """True when the orphan rule (docs/operations.md) says this instance runs unwatched."""
        return self.ending.orphan_check()

    def request_stop(self, signum: int) -> None:
        """A signal asks the agent to stop: stop the children and exit (no self-destroy)."""
        self.orders.stop(signum)

    async def run(self) -> int:
        agent_log = logging.getLogger("vast_manager.agent")
        agent_log.setLevel(self.config.log_level)
        agent_log.addHandler(self.logs)
        try:
            return await self._run()
        finally:
            await self.ending.cleanup()
            logging.getLogger("vast_manager.agent").removeHandler(self.logs)

    async def _start(self) -> None:
        ctx = self.ctx
        # Opening NVML blocks: keep it off the event loop.
        host, sampler = await asyncio.to_thread(self._sampler_factory, self.config)
        ctx.host, ctx.sampler = host, sampler
        await sampler.start()
        self.reporting.open_window()
        log.info(
            "agent %s starting (version %s, %d GPUs, provider %s)",
            self.config.agent_id, agent_version(), len(host.gpus), self.config.provider,
        )
        if self.config.provider == "vast" and not self.config.container_api_key:
            log.warning("CONTAINER_API_KEY is not set: this instance cannot destroy itself")
        ctx.tasks.append(asyncio.create_task(self.ending.watchdog()))

    async def _run(self) -> int:
        await self._start()
        orders = self.orders
        plan = orders.plan = "hello"
        task = asyncio.create_task(self._execute(plan))
        while True:
            waker = asyncio.create_task(orders.wake.wait())
            await asyncio.wait({task, waker}, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            interrupted = orders.interrupts(plan)
            if not task.done():
                if not interrupted:
                    orders.wake.clear()  # nothing for this plan: keep waiting
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
                self.ctx.failure = str(exc)[:1024] or type(exc).__name__
                next_plan = "failed"
            except Exception as exc:
                log.exception("%s failed unexpectedly", plan)
                self.ctx.failure = f"the agent crashed in {plan}: {type(exc).__name__}"
                next_plan = "failed"
            if orders.signal is not None:
                log.info("stopping on signal %d", orders.signal)
                return EXIT_SIGNALLED + orders.signal
            if orders.orphaned:
                return await self.ending.orphaned()
            if orders.terminate:
                return await self.ending.terminate()
            if orders.rebenchmark and plan in REBENCHMARK_PLANS:
                orders.rebenchmark = False
                orders.wake.clear()
                next_plan = "benchmark" if self._prepared else "prepare"
            plan = orders.plan = next_plan or "failed"
            task = asyncio.create_task(self._execute(plan))

    async def _execute(self, plan: str) -> str:
        if plan == "hello":
            return await self.reporting.hello()
        if plan == "prepare":
            checked = await self.fetching.run()
            await self.warming.run(checked)
            self._prepared = True
            return "benchmark"
        if plan == "benchmark":
            return await self.benchmarking.run()
        if plan == "prove":
            return await self.proving.run()
        if plan == "failed":
            return await self.ending.failed()
        raise AssertionError(f"unknown plan {plan}")


def state_dir_writable(path: Path) -> None:
    """Create the state folder; raises OSError when it cannot be used."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    probe.write_bytes(b"")
    probe.unlink()
