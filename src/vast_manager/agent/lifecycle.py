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
import collections
import contextlib
import logging
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol

import aiohttp

from vast_manager.agent.benchparse import BenchRun
from vast_manager.agent.benchwatch import BenchWatch
from vast_manager.agent.c1 import C1Error, C1Input, check_c1
from vast_manager.agent.config import AgentConfig
from vast_manager.agent.coordinator_client import (
    ClientError,
    CoordinatorClient,
    PermanentFailure,
    TransientFailure,
)
from vast_manager.agent.cuzk import (
    GIB,
    POREP_PARTITION_FULL_BYTES,
    SAFETY_MARGIN_BYTES,
    BenchFailed,
    CuzkBench,
    CuzkDaemon,
    CuzkError,
    DaemonExited,
    completed_total,
    has_pce,
    parse_budget_text,
    srs_reservation_bytes,
    synthesis_workers,
)
from vast_manager.agent.host import MemoryLimit, net_bytes_total, read_memory_limit
from vast_manager.agent.params import Downloader, ParamsError, load_manifest, run_params_cmd
from vast_manager.agent.procs import ManagedProcess
from vast_manager.agent.selfdestroy import SelfDestroyError, self_destroy
from vast_manager.agent.spool import Spool
from vast_manager.protocol import (
    PROTOCOL_VERSION,
    Directive,
    Heartbeat,
    Hello,
    HostInfo,
    LogLine,
    Progress,
    Result,
    ScalingRun,
    Telemetry,
)
from vast_manager.protocol.messages import MAX_LOG_LINES, MAX_LOG_TEXT_CHARS, NetBytesTotal

log = logging.getLogger(__name__)
child_log = logging.getLogger("vast_agent_child")  # outside "vast_manager.agent": not shipped twice

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


# --- logs --------------------------------------------------------------------------


class LogBuffer(logging.Handler):
    """Collects the agent's own log records and its children's output for /v1/logs.

    Known secrets are redacted before a line is stored, so they never reach
    the spool or the coordinator. Bounded: the oldest lines go first.
    """

    def __init__(
        self, secrets_to_hide: list[str], clock: Callable[[], float], max_lines: int = 20000
    ) -> None:
        super().__init__(level=logging.DEBUG)
        self._secrets = [s for s in secrets_to_hide if s]
        self._clock = clock
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=max_lines)
        self.batch_ready = asyncio.Event()

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return text

    def add(self, source: str, text: str) -> None:
        text = self.redact(text)[:MAX_LOG_TEXT_CHARS]
        self._lines.append(LogLine(ts=self._clock(), source=source[:64], text=text))
        if len(self._lines) >= MAX_LOG_LINES:
            self.batch_ready.set()

    def child_line(self, source: str, text: str) -> None:
        child_log.debug("[%s] %s", source, self.redact(text))
        self.add(source, text)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self.add("agent", text)
        except Exception:
            self.handleError(record)

    def take(self, limit: int = MAX_LOG_LINES) -> list[LogLine]:
        out: list[LogLine] = []
        while self._lines and len(out) < limit:
            out.append(self._lines.popleft())
        if len(self._lines) < MAX_LOG_LINES:
            self.batch_ready.clear()
        return out

    def __len__(self) -> int:
        return len(self._lines)


class AgentFailure(Exception):
    """An unrecoverable error of a phase: reported as phase ``failed``."""


@dataclass(slots=True)
class _Measured:
    run: BenchRun
    telemetry: Telemetry | None
    started_at: float
    finished_at: float
    gpus_used: list[int]


# --- the agent ---------------------------------------------------------------------


class Agent:
    """One agent process's lifecycle. ``await Agent(config).run()`` returns the exit status."""

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

    # -- public controls ------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """A signal asks the agent to stop: stop the children and exit (no self-destroy)."""
        self._signal = signum
        self._wake.set()

    # -- state ----------------------------------------------------------------------

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

    # -- run --------------------------------------------------------------------------

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

    # -- hello ------------------------------------------------------------------------

    async def _hello(self) -> str:
        assert self._host is not None
        hello = Hello(
            protocol=PROTOCOL_VERSION,
            agent_version=agent_version(),
            boot_id=self.boot_id,
            container_id=self.config.container_id,
            host=self._host,
        )
        # Retried until a verified answer; the orphan watchdog bounds the wait.
        directive = await self.client.hello(hello)
        log.info("coordinator answered hello: %s (%s)", directive.action, directive.reason)
        self._on_directive(directive)
        self._background.append(asyncio.create_task(self._heartbeat_loop()))
        self._background.append(asyncio.create_task(self._shipper_loop()))
        return "prepare"

    # -- fetching params and warming -------------------------------------------------

    async def _prepare(self) -> str:
        # Both checks are cheap and need nothing fetched: a C1 that cuzk cannot prove,
        # or a budget that cannot hold one partition, fails now, before any rent is
        # spent on parameters or proofs.
        await self._check_c1()
        self._budget_bytes = await self._memory_budget()
        self._set_phase("fetching_params")
        await self._fetch_params()
        self._set_phase("warming")
        await self._warm()
        self._prepared = True
        return "benchmark"

    async def _check_c1(self) -> None:
        try:
            c1 = await asyncio.to_thread(check_c1, self.config.c1_path)
        except C1Error as exc:
            raise AgentFailure(f"{exc}; no benchmark was started") from None
        self._c1 = c1
        log.info("C1 input %s: sector %d, %s, %d bytes (miner %d from VM_C1_MINER_ID)",
                 c1.path, c1.sector_num, c1.registered_proof, c1.size_bytes,
                 self.config.c1_miner_id)

    async def _memory_budget(self) -> int:
        """cuzk's ``[memory] total_budget`` in bytes: set, or the container's memory less
        cuzk's safety margin (cuzk's own "auto" would read the host's MemTotal)."""
        if self.config.memory_budget is not None:
            budget = parse_budget_text(self.config.memory_budget)
            source = "VM_CUZK_MEMORY_BUDGET"
        else:
            limit = await asyncio.to_thread(self._memory_probe, self.config)
            usable = limit.usable_bytes
            if usable is None:
                raise AgentFailure("cannot tell how much memory this container has "
                                   "(no MemTotal, no cgroup limit); set VM_CUZK_MEMORY_BUDGET")
            budget = max(0, usable - SAFETY_MARGIN_BYTES)
            where = ("its cgroup limit" if limit.cgroup_limit_bytes is not None
                     and limit.cgroup_limit_bytes == usable else "MemTotal")
            source = f"this container's {usable / GIB:.1f} GiB ({where}) less 5 GiB"
        if budget < POREP_PARTITION_FULL_BYTES:
            raise AgentFailure(
                f"cuzk's memory budget of {budget / GIB:.1f} GiB ({source}) is under the "
                f"{POREP_PARTITION_FULL_BYTES // GIB} GiB one PoRep partition reserves: "
                "its proofs would wait for ever"
            )
        log.info("cuzk memory budget %.1f GiB (%s)", budget / GIB, source)
        return budget

    def _bytes_progress(self, done: int, total: int) -> None:
        self.progress = Progress(done=max(done, 0), total=max(total, 0), unit="bytes")

    async def _fetch_params(self) -> None:
        cfg = self.config
        cfg.params_dir.mkdir(parents=True, exist_ok=True)  # cuzk's param_cache, even if empty
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60, sock_read=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if cfg.params_cmd:
                total: int | None = None
                if cfg.params_manifest:
                    try:
                        entries = await load_manifest(cfg.params_manifest, session)
                        total = sum(e.size for e in entries)
                    except ParamsError as exc:
                        log.warning("params total unknown: %s", exc)
                await run_params_cmd(
                    cfg.params_cmd, cfg.params_dir, sink=self.logs.child_line,
                    total_bytes=total, on_progress=self._bytes_progress,
                )
            elif cfg.params_manifest:
                entries = await load_manifest(cfg.params_manifest, session)
                downloader = Downloader(cfg.params_dir, session)
                await downloader.fetch(entries, on_progress=self._bytes_progress)
            else:
                log.info("no VM_PARAMS_CMD or VM_PARAMS_MANIFEST: no parameters to fetch")
        log.info("parameters ready in %s", cfg.params_dir)

    async def _start_daemon(self, devices: list[int] | None) -> None:
        """(Re)start the daemon on ``devices`` (None: all) and preload the SRS.

        A new daemon process has no PCE (cuzk keeps it in memory only), so it
        is not warm until `_ensure_warm` has run on it.
        """
        assert self._sampler is not None
        srs = srs_reservation_bytes(self.config.params_dir)
        need = srs + POREP_PARTITION_FULL_BYTES
        if self._budget_bytes < need:
            raise AgentFailure(
                f"cuzk's memory budget of {self._budget_bytes / GIB:.1f} GiB cannot hold the "
                f"{srs / GIB:.1f} GiB SRS and one {POREP_PARTITION_FULL_BYTES // GIB} GiB "
                "PoRep partition: its proofs would wait for ever"
            )
        self._daemon_warm = False
        self._sampler.set_cuzk_status_url(None)
        await self.daemon.start(devices, budget_bytes=self._budget_bytes)
        self._sampler.set_cuzk_status_url(
            self.daemon.status_url, synthesis_workers(self._budget_bytes)
        )
        await self.bench.preload(self.daemon.addr)

    async def _warm(self) -> None:
        await self._start_daemon(None)
        await self._ensure_warm()
        self.progress = None

    async def _ensure_warm(self) -> None:
        """One warm-up proof, then wait for the PCE extraction it started, in this daemon.

        Every boot and every new daemon process does this: cuzk never loads a PCE
        from disk; a proof dispatched while it has none starts a background
        extraction, whose result it keeps in memory only (docs/cuzk.md). The
        benchmark then runs in the same process, never beside a running
        extraction (it competes for RAM and cores).
        """
        if self._daemon_warm:
            return
        c1 = self._c1
        assert c1 is not None
        log.info("warm-up proof: starts the daemon's background PCE extraction")
        self.progress = Progress(done=0, total=1, unit="proofs")
        run = await self.bench.batch(
            self.daemon.addr, c1_path=c1.path, count=1, concurrency=1,
            sector_num=c1.sector_num, miner_id=self.config.c1_miner_id,
        )
        if run.completed < 1:
            status = run.proofs[0].status if run.proofs else "did not complete"
            raise AgentFailure(
                f"the warm-up proof {status}: cuzk cannot prove C1 file {c1.path} as sector "
                f"{c1.sector_num} of miner {self.config.c1_miner_id} (is VM_C1_MINER_ID the "
                "miner the C1 was made for?); no benchmark was started"
            )
        self.progress = Progress(done=1, total=1, unit="proofs")
        await self._wait_for_pce()
        self._daemon_warm = True

    async def _wait_for_pce(self) -> None:
        """Until ``/status`` lists the PoRep PCE in memory, within VM_PCE_WAIT."""
        wait_s = self.config.pce_wait_s
        if wait_s <= 0:
            log.warning("VM_PCE_WAIT is 0: benchmarking without waiting for the PCE extraction")
            return
        started = self._monotonic()
        while True:
            if not self.daemon.running:
                raise DaemonExited("the cuzk daemon exited during its PCE extraction")
            if self.daemon.extraction_failed:
                raise AgentFailure("the cuzk daemon's background PCE extraction failed "
                                   "(its log says why); a benchmark would start another one")
            with contextlib.suppress(CuzkError):
                if has_pce(await self.daemon.status()):
                    log.info("PCE extracted and held in memory after %.0f s",
                             self._monotonic() - started)
                    return
            if self._monotonic() - started >= wait_s:
                raise AgentFailure(
                    f"the cuzk daemon's PCE extraction did not finish within VM_PCE_WAIT "
                    f"({wait_s:.0f} s) of the warm-up proof; a benchmark beside it would "
                    "measure the wrong rate"
                )
            await asyncio.sleep(PCE_POLL_S)

    # -- benchmarking ------------------------------------------------------------------

    def _all_gpus(self) -> list[int]:
        assert self._host is not None
        return [g.index for g in self._host.gpus]

    async def _measure(self, devices: list[int] | None) -> _Measured:
        """One benchmark run on the running, warm daemon; retried once on a fresh daemon."""
        assert self._sampler is not None and self._c1 is not None
        cfg = self.config
        c1 = self._c1
        gpus_used = list(devices) if devices is not None else self._all_gpus()
        # One proof's partitions spread over the GPUs; two proofs in flight per
        # GPU keep each fed while the next proof synthesises.
        concurrency = cfg.bench_concurrency or 2 * max(1, len(gpus_used))
        sampler = self._sampler
        for attempt in (1, 2):
            await self._ensure_warm()
            self.progress = Progress(done=0, total=cfg.bench_proofs, unit="proofs",
                                     concurrency=concurrency)
            steady: list[int] = []
            watch = await self._bench_watch()
            watcher = asyncio.create_task(self._watch_benchmark(watch, steady, concurrency))
            wid = sampler.open_window()
            started_at = self.client.now()
            try:
                run = await self.bench.batch(
                    self.daemon.addr, c1_path=c1.path, count=cfg.bench_proofs,
                    concurrency=concurrency, sector_num=c1.sector_num,
                    miner_id=cfg.c1_miner_id,
                )
                await self._stop_watcher(watcher)
                await self._take_finished(watch, None, concurrency)  # the last ones
            except BenchFailed as exc:
                for w in (wid, *steady):
                    sampler.close_window(w)
                if attempt == 2:
                    raise
                log.warning("benchmark run failed (%s); restarting the daemon and retrying", exc)
                await self._start_daemon(devices)
                continue
            except BaseException:
                for w in (wid, *steady):
                    sampler.close_window(w)
                raise
            finally:
                await self._stop_watcher(watcher)
            full_run = sampler.close_window(wid)
            steady_state = sampler.close_window(steady[0]) if steady else None
            # A steady window opened moments before the end says less than the whole run.
            enough = steady_state is not None and steady_state.samples >= MIN_STEADY_SAMPLES
            telemetry = steady_state if enough else full_run
            finished_at = self.client.now()
            log.info(
                "benchmark on GPUs %s: %d completed, %d failed in %.1f s: %.1f proofs/h",
                gpus_used, run.completed, run.failed, run.total_seconds, run.rate_per_hour,
            )
            return _Measured(run, telemetry, started_at, finished_at, gpus_used)
        raise AssertionError("unreachable")

    @staticmethod
    async def _stop_watcher(task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _bench_watch(self) -> BenchWatch | None:
        with contextlib.suppress(CuzkError):
            return BenchWatch(await self.daemon.status())
        return None

    async def _watch_benchmark(
        self, watch: BenchWatch | None, steady: list[int], concurrency: int
    ) -> None:
        """Report the benchmark's proofs as the daemon finishes them (`agent.benchwatch`)."""
        poll_s = min(COMPLETION_POLL_S, self.config.sample_interval_s)
        while True:
            await asyncio.sleep(poll_s)
            if watch is None:
                watch = await self._bench_watch()
                continue
            await self._take_finished(watch, steady, concurrency)

    async def _take_finished(
        self, watch: BenchWatch | None, steady: list[int] | None, concurrency: int
    ) -> None:
        """One /status read: proofs finished since the last go to the heartbeats, and the
        first one opens the steady-state window (the pipeline is full from then on)."""
        if watch is None:
            return
        try:
            finished = watch.update(await self.daemon.status())
        except CuzkError:
            return
        if not finished:
            return
        assert self._sampler is not None and self.progress is not None
        for f in finished:
            if f.completed:
                self.proofs_completed_total += 1
                if f.wall_seconds is not None:
                    self._proof_seconds_recent.append(f.wall_seconds)
        total = self.progress.total
        self.progress = Progress(done=min(self.progress.done + len(finished), total),
                                 total=total, unit="proofs", concurrency=concurrency)
        if steady is not None and not steady:
            steady.append(self._sampler.open_window())

    def _result_of(self, kind: str, m: _Measured, benchmark_id: str | None = None) -> Result:
        return Result(
            result_id=f"res_{uuid.uuid4().hex}",
            kind="scaling" if kind == "scaling" else "benchmark",
            proof_type=PROOF_TYPE,
            started_at=m.started_at,
            finished_at=m.finished_at,
            gpus_used=m.gpus_used,
            proofs_completed=m.run.completed,
            proofs_failed=m.run.failed,
            wall_seconds=m.run.total_seconds,
            rate_per_hour=m.run.rate_per_hour,
            proof_seconds=m.run.proof_seconds,
            telemetry=m.telemetry,
            benchmark_id=benchmark_id,
        )

    async def _benchmark(self) -> str:
        self._set_phase("benchmarking", Progress(done=0, total=self.config.bench_proofs,
                                                 unit="proofs"))
        await self._stop_work()
        if not self.daemon.running or self.daemon.devices is not None:
            await self._start_daemon(None)
        all_gpus = self._all_gpus()
        # The id the coordinator gave before this run began: its answer to that request.
        benchmark_id = self._benchmark_id
        measured_all = await self._measure(None)  # warms a new daemon up first
        result = self._result_of("benchmark", measured_all, benchmark_id)
        directive = await self._deliver(result)
        if directive.action != "continue":
            return "benchmark" if directive.action == "benchmark" else "prove"
        if len(all_gpus) > 1:
            directive = await self._scaling(measured_all, all_gpus)
            if directive.action == "benchmark":
                return "benchmark"
        return "prove"

    async def _scaling(self, measured_all: _Measured, all_gpus: list[int]) -> Directive:
        from vast_manager.common.scaling import diagnose  # the coordinator runs the same function

        assert self._host is not None
        one = [all_gpus[0]]
        log.info("one-GPU run for the scaling diagnosis (GPU %d of %d): a new daemon, "
                 "warmed up again (it starts without the PCE)", one[0], len(all_gpus))
        self.progress = None
        await self._start_daemon(one)
        try:
            measured_one = await self._measure(one)
        finally:
            # Proving (or anything next) wants every GPU again.
            await self._start_daemon(None)
        diagnosis = diagnose(
            len(all_gpus),
            measured_all.run.rate_per_hour,
            measured_one.run.rate_per_hour,
            measured_all.telemetry,
            list(self._host.gpus),
        )
        result = self._result_of("scaling", measured_one)
        result.runs = [
            ScalingRun(all_gpus, measured_all.run.rate_per_hour, measured_all.telemetry),
            ScalingRun(one, measured_one.run.rate_per_hour, measured_one.telemetry),
        ]
        result.efficiency = diagnosis.efficiency
        result.bottleneck = diagnosis.bottleneck  # type: ignore[assignment]
        result.evidence = [e[:1024] for e in diagnosis.evidence]
        log.info("scaling: efficiency %s, bottleneck %s", diagnosis.efficiency,
                 diagnosis.bottleneck)
        return await self._deliver(result)

    async def _deliver(self, result: Result) -> Directive:
        """Spool ``result`` and send it until the coordinator verifiably has it."""
        self.spool.put_result(result)
        log.info("result %s spooled (%s)", result.result_id, result.kind)
        while True:
            await self._flush_spool(give_up_after_s=max(self._heartbeat_interval_s, 30.0),
                                    logs=False)
            directive = self.results_sent.get(result.result_id)
            if directive is not None:
                return directive
            if self.spool.find_result(result.result_id) is None:
                raise AgentFailure(f"the coordinator refused result {result.result_id}")

    # -- proving -------------------------------------------------------------------------

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

    # -- failed -----------------------------------------------------------------------------

    async def _failed(self) -> str:
        self._has_failed = True
        self._set_phase("failed")
        await self._stop_children()
        self.logs.batch_ready.set()  # ship the reason now
        # Stay, heartbeating `failed`, until the coordinator decides (terminate,
        # or benchmark to retry); the orphan rule bounds the wait.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    # -- heartbeats, logs, spool ---------------------------------------------------------------

    def _build_heartbeat(self) -> Heartbeat:
        self._seq += 1
        telemetry = None
        if self._sampler is not None and self._hb_window is not None:
            telemetry = self._sampler.roll_window(self._hb_window)
        return Heartbeat(
            seq=self._seq,
            phase=self.phase,  # type: ignore[arg-type]
            phase_started_at=self.phase_started_at,
            progress=self.progress,
            proofs_completed_total=self.proofs_completed_total,
            proof_seconds_recent=list(self._proof_seconds_recent),
            telemetry=telemetry,
            failure=self._failure if self.phase == "failed" else None,
            net_bytes_total=_net_bytes(),
        )

    async def _send_heartbeat(self, give_up_after_s: float) -> None:
        heartbeat = self._build_heartbeat()
        sent_recent = len(heartbeat.proof_seconds_recent)
        try:
            directive = await self.client.heartbeat(heartbeat, give_up_after_s=give_up_after_s)
        except PermanentFailure:
            # Logged by the client; the next heartbeat is a new message.
            return
        # Proof seconds are dropped only once the coordinator has them.
        del self._proof_seconds_recent[:sent_recent]
        self._on_directive(directive)

    async def _heartbeat_loop(self) -> None:
        while True:
            self._hb_wake.clear()
            with contextlib.suppress(TransientFailure):
                await self._send_heartbeat(give_up_after_s=max(self._heartbeat_interval_s, 5.0))
            await wait_event(self._hb_wake, self._heartbeat_interval_s)

    def _spool_logs(self) -> None:
        while len(self.logs):
            self.spool.put_logs(self.logs.take(MAX_LOG_LINES))

    async def _flush_spool(self, give_up_after_s: float, logs: bool = True) -> bool:
        """Send what the spool holds, results first. True when it all went."""
        async with self._spool_lock:
            entries = self.spool.pending("result") + (self.spool.pending("logs") if logs else [])
            for entry in entries:
                try:
                    if entry.kind == "result":
                        ack = await self.client.result(
                            entry.read(), give_up_after_s=give_up_after_s
                        )
                        if entry.result_id is not None:
                            self.results_sent[entry.result_id] = ack.directive
                        log.info("result %s delivered%s: %s", entry.result_id,
                                 " (duplicate)" if ack.duplicate else "", ack.directive.action)
                        self.spool.remove(entry)
                        self._on_directive(ack.directive)
                    else:
                        await self.client.logs(entry.read(), give_up_after_s=give_up_after_s)
                        self.spool.remove(entry)
                except TransientFailure:
                    return False
                except PermanentFailure as exc:
                    # The coordinator will never take it: keeping it would block the rest.
                    log.error("coordinator refused spooled %s (%s); dropping it", entry.kind, exc)
                    self.spool.remove(entry)
                except FileNotFoundError:
                    continue
            return True

    async def _shipper_loop(self) -> None:
        while True:
            await wait_event(self.logs.batch_ready, LOG_SHIP_INTERVAL_S)
            self._spool_logs()
            await self._flush_spool(give_up_after_s=LOG_SHIP_INTERVAL_S * 6)

    # -- the orphan rule -------------------------------------------------------------------------

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

    # -- endings ----------------------------------------------------------------------

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


def state_dir_writable(path: Path) -> None:
    """Create the state folder; raises OSError when it cannot be used."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".write-test"
    probe.write_bytes(b"")
    probe.unlink()


def _net_bytes() -> NetBytesTotal | None:
    counts = net_bytes_total()
    return None if counts is None else NetBytesTotal(rx=counts[0], tx=counts[1])
