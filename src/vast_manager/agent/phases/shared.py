"""What every phase of the agent shares: its state (``AgentBase``), the seams tests
replace (sampler, memory probe, destroyer) and the constants of its pace."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Protocol

from vast_manager.agent.c1 import C1Input
from vast_manager.agent.config import AgentConfig
from vast_manager.agent.coordinator_client import CoordinatorClient
from vast_manager.agent.cuzk import (
    CuzkBench,
    CuzkDaemon,
)
from vast_manager.agent.host import MemoryLimit, read_memory_limit
from vast_manager.agent.logbuffer import LogBuffer
from vast_manager.agent.selfdestroy import self_destroy
from vast_manager.agent.spool import Spool
from vast_manager.protocol import (
    Directive,
    HostInfo,
    Progress,
    Telemetry,
)

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
    """The real sampler (NVML / psutil, or the simulation's fakes with VM_NVML=sim)."""
    import vast_manager.agent.sampler as sampler_mod  # lazily: it loads NVML

    sources = sampler_mod.open_sources(config.nvml, str(config.params_dir))
    host = sampler_mod.describe_host(sources)
    sampler: SamplerLike = sampler_mod.Sampler(sources, interval_s=config.sample_interval_s)
    return host, sampler


Destroyer = Callable[[AgentConfig], Awaitable[None]]
MemoryProbe = Callable[[AgentConfig], MemoryLimit]


def default_memory_probe(config: AgentConfig) -> MemoryLimit:
    """The memory this container may use (cgroup limit, MemTotal); the simulation's own
    with ``VM_NVML=sim``, whose machine is the simulated one."""
    if config.nvml == "sim":
        from vast_manager.sim.fake_host import (
            FakeHostProbe,  # lazily: the simulator is optional
        )

        return FakeHostProbe(str(config.params_dir)).memory_limit()
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


class AgentBase:
    """The agent's state, shared by every phase, and what changes it: the phase and the
    latest directive."""

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
        self.config = config
        self._sampler_factory = sampler_factory
        self._memory_probe = memory_probe
        self.client = client or CoordinatorClient(
            config.coordinator_url, config.agent_id, config.agent_key
        )
        self._destroyer = destroyer
        self._monotonic = monotonic
        self._watchdog_period_s = watchdog_period_s or max(
            0.2, min(10.0, config.orphan_timeout_s / 10)
        )
        self.boot_id = secrets.token_hex(16)
        self.logs = LogBuffer(config.secrets(), self.client.now)
        self.spool = Spool(config.state_dir / "spool", config.spool_max_bytes)
        self.daemon = CuzkDaemon(
            config.cuzk_bin,
            state_dir=config.state_dir,
            params_dir=config.params_dir,
            sink=self.logs.child_line,
            start_timeout_s=config.cuzk_start_timeout_s,
        )
        self.bench = CuzkBench(config.cuzk_bench_bin, sink=self.logs.child_line)

        self.phase = "booting"
        self.phase_started_at = self.client.now()
        self.progress: Progress | None = None
        self.proofs_completed_total = 0
        self._proof_seconds_recent: list[float] = []
        self._seq = 0
        self._heartbeat_interval_s = heartbeat_interval_s(DEFAULT_HEARTBEAT_S,
                                                          config.orphan_timeout_s)
        self.last_directive: Directive | None = None
        self.results_sent: dict[str, Directive] = {}

        self._host: HostInfo | None = None
        self._sampler: SamplerLike | None = None
        self._hb_window: int | None = None
        self._spool_lock = asyncio.Lock()
        self._hb_wake = asyncio.Event()
        self._wake = asyncio.Event()
        self._terminate_requested = False
        self._rebench_requested = False
        # The benchmark the coordinator directs now (its id in the latest directive): a
        # benchmark result carries it back, or counts for nothing (docs/protocol.md).
        self._benchmark_id: str | None = None
        self._orphaned = False
        self._signal: int | None = None
        self._started_mono = monotonic()
        self._proving_since: float | None = None
        self._last_proof_mono: float | None = None
        self._background: list[asyncio.Task[None]] = []
        self._work_task: asyncio.Task[None] | None = None
        self._plan = "hello"  # what the controller runs now (``_run``)
        self._prepared = False
        self._has_failed = False
        self._failure: str | None = None  # why, once phase is failed
        self._c1: C1Input | None = None
        self._budget_bytes = 0
        self._daemon_warm = False  # this daemon process has finished its PCE extraction

    def request_stop(self, signum: int) -> None:
        """A signal asks the agent to stop: stop the children and exit (no self-destroy)."""
        self._signal = signum
        self._wake.set()

    def _set_phase(self, phase: str, progress: Progress | None = None) -> None:
        if phase != self.phase:
            log.info("phase %s -> %s", self.phase, phase)
            self.phase = phase
            self.phase_started_at = self.client.now()
            self._hb_wake.set()  # the coordinator's timeouts follow the phase: say it now
        self.progress = progress

    def _on_directive(self, directive: Directive) -> None:
        self.last_directive = directive
        self._benchmark_id = directive.benchmark_id
        self._heartbeat_interval_s = heartbeat_interval_s(directive.next_heartbeat_s,
                                                          self.config.orphan_timeout_s)
        if directive.action == "terminate":
            if not self._terminate_requested:
                log.info("coordinator directive: terminate (%s)", directive.reason)
            self._terminate_requested = True
            self._wake.set()
        elif directive.action == "benchmark":
            if self._plan in REBENCHMARK_PLANS:
                if not self._rebench_requested:
                    log.info("coordinator directive: benchmark again (%s)", directive.reason)
                self._rebench_requested = True
                self._wake.set()
            else:
                log.debug("directive benchmark while %s: a benchmark is under way", self.phase)
