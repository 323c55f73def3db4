"""What the agent's phases share, passed to each explicitly: the ``AgentContext`` (the
handles every phase uses and the state its heartbeats report) and the ``Orders`` (what
interrupts the loop's plan: the coordinator's directives, the orphan rule, a signal)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vast_manager.agent.config import AgentConfig
from vast_manager.agent.coordinator_client import CoordinatorClient
from vast_manager.agent.cuzk import CuzkBench, CuzkDaemon
from vast_manager.agent.logbuffer import LogBuffer
from vast_manager.agent.phases.crashes import DaemonCrashes
from vast_manager.agent.phases.shared import REBENCHMARK_PLANS, SamplerLike, log
from vast_manager.agent.spool import Spool
from vast_manager.protocol import Directive, HostInfo, Progress


class AgentContext:
    """The handles every phase uses (configuration, coordinator client, log buffer, spool,
    cuzk daemon and bench, telemetry) and what the heartbeats report: the phase, its
    progress and the proof counters. Phases keep everything else to themselves."""

    def __init__(
        self,
        config: AgentConfig,
        client: CoordinatorClient,
        monotonic: Callable[[], float],
    ) -> None:
        self.config = config
        self.client = client
        self.monotonic = monotonic
        self.logs = LogBuffer(config.secrets(), client.now)
        self.spool = Spool(config.state_dir / "spool", config.spool_max_bytes,
                           retention_s=config.ack_retention_s)
        self.daemon = CuzkDaemon(
            config.cuzk_bin,
            state_dir=config.state_dir,
            params_dir=config.params_dir,
            sink=self.logs.child_line,
            start_timeout_s=config.cuzk_start_timeout_s,
        )
        self.bench = CuzkBench(config.cuzk_bench_bin, sink=self.logs.child_line)
        #: The daemon's failures, whatever the phase, and the one rule on them.
        self.crashes = DaemonCrashes(self.daemon, monotonic)
        # Known once the loop has opened the telemetry (``Agent._start``).
        self.host: HostInfo | None = None
        self.sampler: SamplerLike | None = None

        # What the heartbeats report.
        self.phase = "booting"
        self.phase_started_at = client.now()
        self.progress: Progress | None = None
        self.proofs_completed_total = 0
        self.proof_seconds_recent: list[float] = []
        self.failure: str | None = None  # why, once phase is failed
        #: Set when the phase changes: the heartbeat loop says it at once.
        self.phase_changed = asyncio.Event()
        #: The tasks beside the loop (heartbeats, log shipper, orphan watchdog) that
        #: every end of the agent stops.
        self.tasks: list[asyncio.Task[None]] = []

    def set_phase(self, phase: str, progress: Progress | None = None) -> None:
        if phase != self.phase:
            log.info("phase %s -> %s", self.phase, phase)
            self.phase = phase
            self.phase_started_at = self.client.now()
            self.phase_changed.set()  # the coordinator's timeouts follow the phase: say it now
        self.progress = progress

    def all_gpus(self) -> list[int]:
        assert self.host is not None
        return [g.index for g in self.host.gpus]


class Orders:
    """What the loop obeys between (and during) its plans: the latest directive's
    ``terminate`` and ``benchmark``, the orphan rule and a signal. Each sets ``wake``."""

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.plan = "hello"  # what the loop runs now (set by ``Agent._run``)
        self.last_directive: Directive | None = None
        # The benchmark the coordinator directs now (its id in the latest directive): a
        # benchmark result carries it back, or counts for nothing (docs/protocol.md).
        self.benchmark_id: str | None = None
        self.terminate = False
        self.rebenchmark = False
        self.orphaned = False
        self.signal: int | None = None

    def obey(self, directive: Directive, phase: str) -> None:
        """Take the coordinator's latest directive (``phase``: the agent's, for the log)."""
        self.last_directive = directive
        self.benchmark_id = directive.benchmark_id
        if directive.action == "terminate":
            if not self.terminate:
                log.info("coordinator directive: terminate (%s)", directive.reason)
            self.terminate = True
            self.wake.set()
        elif directive.action == "benchmark":
            if self.plan in REBENCHMARK_PLANS:
                if not self.rebenchmark:
                    log.info("coordinator directive: benchmark again (%s)", directive.reason)
                self.rebenchmark = True
                self.wake.set()
            else:
                log.debug("directive benchmark while %s: a benchmark is under way", phase)

    def stop(self, signum: int) -> None:
        self.signal = signum
        self.wake.set()

    def orphan(self) -> None:
        self.orphaned = True
        self.wake.set()

    def interrupts(self, plan: str) -> bool:
        """True when something asks the loop to stop running ``plan``."""
        return (
            self.signal is not None
            or self.orphaned
            or self.terminate
            or (self.rebenchmark and plan in REBENCHMARK_PLANS)
        )
