"""What every phase of the agent shares besides its context (``phases.context``): the
seams tests replace (sampler, memory probe, destroyer), the exit statuses and the
constants of its pace."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Protocol

from vast_manager.agent.config import AgentConfig
from vast_manager.agent.host import MemoryLimit, read_memory_limit
from vast_manager.agent.selfdestroy import self_destroy
from vast_manager.protocol import HostInfo, Telemetry

log = logging.getLogger("vast_manager.agent.lifecycle")  # one name for every phase

PROOF_TYPE = "porep-c2-32g"

# Exit statuses of `vast-agent run` (documented in its --help).
EXIT_TERMINATED = 0  # terminated on the coordinator's directive, instance destroyed
EXIT_FAILED = 1  # an unrecoverable error (reported as phase `failed` first)
EXIT_CONFIG = 2  # bad configuration or usage (the CLI)
EXIT_ORPHANED = 3  # the orphan rule fired: instance destroyed without the coordinator
EXIT_DESTROY_FAILED = 4  # self-destroy failed: refused, unreachable, or the instance survives
EXIT_SIGNALLED = 128  # + the signal number (SIGTERM: 143, SIGINT: 130)

DEFAULT_HEARTBEAT_S = 30.0
#: Verified answers the agent hears at least within its orphan timeout, whatever pace the
#: coordinator sets (docs/operations.md, "Heartbeat pace"): the orphan rule must never
#: fire between two heartbeats of a healthy agent.
HEARTBEATS_PER_ORPHAN_TIMEOUT = 3
LOG_SHIP_INTERVAL_S = 5.0
PROVING_POLL_S = 2.0
PCE_POLL_S = 1.0
COMPLETION_POLL_S = 0.5  # how often /status counters are read while a benchmark runs
MIN_STEADY_SAMPLES = 3
#: The plans a ``benchmark`` directive interrupts (and so the only ones it is taken in):
#: while preparing or benchmarking a benchmark is already on its way.
REBENCHMARK_PLANS = frozenset({"prove", "failed"})


def heartbeat_interval_s(next_heartbeat_s: float, orphan_timeout_s: float) -> float:
    """The pace the coordinator set, never so long that fewer than
    ``HEARTBEATS_PER_ORPHAN_TIMEOUT`` answers fit in the orphan timeout."""
    return min(float(next_heartbeat_s), orphan_timeout_s / HEARTBEATS_PER_ORPHAN_TIMEOUT)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s``; True if it was set.

    Not ``asyncio.wait_for``: on Python 3.11 it can swallow a cancellation
    that arrives as the event is set, leaving a loop that cannot be stopped.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


def agent_version() -> str:
    try:
        return metadata.version("vast-manager")
    except metadata.PackageNotFoundError:
        return "0.1.0"


# --- telemetry seam ---------------------------------------------------------------


class SamplerLike(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def set_cuzk_status_url(
        self, url: str | None, synthesis_slots: int | None = None
    ) -> None: ...
    def open_window(self) -> int: ...
    def roll_window(self, wid: int) -> Telemetry | None: ...
    def close_window(self, wid: int) -> Telemetry | None: ...


SamplerFactory = Callable[[AgentConfig], tuple[HostInfo, SamplerLike]]


def default_sampler_factory(config: AgentConfig) -> tuple[HostInfo, SamplerLike]:
    """The real sampler (NVML / psutil); the simulator plugs in its own."""
    import vast_manager.agent.sampler as sampler_mod  # lazily: it loads NVML

    sources = sampler_mod.open_sources(config.nvml, str(config.params_dir))
    host = sampler_mod.describe_host(sources)
    sampler: SamplerLike = sampler_mod.Sampler(sources, interval_s=config.sample_interval_s)
    return host, sampler


Destroyer = Callable[[AgentConfig], Awaitable[None]]
MemoryProbe = Callable[[AgentConfig], MemoryLimit]


def default_memory_probe(config: AgentConfig) -> MemoryLimit:
    """The memory this container may use (cgroup limit, MemTotal); the simulator plugs in
    its own (its machine is the simulated one)."""
    return read_memory_limit()


async def default_destroyer(config: AgentConfig) -> None:
    await self_destroy(
        config.provider or "local",  # load_config resolves an unset one
        container_id=config.container_id,
        api_key=config.container_api_key,
        vast_url=config.vast_url,
    )


class AgentFailure(Exception):
    """An unrecoverable error of a phase: reported as phase ``failed``."""
