"""Benchmarking: the measured cuzk-bench run, watched while it runs, its result and the
scaling run on fewer GPUs the coordinator may ask for."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

from vast_manager.agent.benchparse import BenchRun
from vast_manager.agent.benchwatch import BenchWatch
from vast_manager.agent.cuzk import (
    CuzkError,
)
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.proving import Proving
from vast_manager.agent.phases.reporting import Reporting
from vast_manager.agent.phases.shared import (
    COMPLETION_POLL_S,
    MIN_STEADY_SAMPLES,
    PROOF_TYPE,
    log,
)
from vast_manager.agent.phases.warmup import Warming
from vast_manager.protocol import (
    Directive,
    Progress,
    Result,
    ScalingRun,
    Telemetry,
)


@dataclass(slots=True)
class _Measured:
    run: BenchRun
    telemetry: Telemetry | None
    started_at: float
    finished_at: float
    gpus_used: list[int]


class Benchmarking:
    """Phase benchmarking: measure, report, and scale down when asked."""

    def __init__(
        self,
        ctx: AgentContext,
        orders: Orders,
        warming: Warming,
        proving: Proving,
        reporting: Reporting,
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self._orders = orders  # the benchmark id the coordinator directs
        self._warming = warming  # starts the daemon on the GPUs measured, warm
        self._proving = proving  # its work command stops while a benchmark runs
        self._reporting = reporting  # delivers the results

    async def _measure(self, devices: list[int] | None) -> _Measured:
        """One benchmark run on the running daemon, warmed first; run again from its start
        on a new daemon when the daemon fails (``AgentContext.crashes``: the one rule)."""
        return await self.ctx.crashes.run(
            "benchmarking", lambda: self._measure_once(devices),
            lambda: self._warming.start_daemon(devices))

    async def _measure_once(self, devices: list[int] | None) -> _Measured:
        ctx = self.ctx
        assert ctx.sampler is not None
        cfg = self.config
        c1 = self._warming.c1
        gpus_used = list(devices) if devices is not None else ctx.all_gpus()
        # One proof's partitions spread over the GPUs; two proofs in flight per
        # GPU keep each fed while the next proof synthesises.
        concurrency = cfg.bench_concurrency or 2 * max(1, len(gpus_used))
        sampler = ctx.sampler
        await self._warming.ensure_warm()
        # The concurrency is announced once the daemon has the batch (_take_finished).
        ctx.progress = Progress(done=0, total=cfg.bench_proofs, unit="proofs")
        steady: list[int] = []
        watch = await self._bench_watch()
        watcher = asyncio.create_task(self._watch_benchmark(watch, steady, concurrency))
        wid = sampler.open_window()
        started_at = ctx.client.now()
        try:
            run = await ctx.bench.batch(
                ctx.daemon.addr, c1_path=c1.path, count=cfg.bench_proofs,
                concurrency=concurrency, sector_num=c1.sector_num,
                miner_id=cfg.c1_miner_id,
            )
            await self._stop_watcher(watcher)
            await self._take_finished(watch, None, concurrency)  # the last ones
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
        finished_at = ctx.client.now()
        log.info(
            "benchmark on GPUs %s: %d completed, %d failed in %.1f s: %.1f proofs/h",
            gpus_used, run.completed, run.failed, run.total_seconds, run.rate_per_hour,
        )
        return _Measured(run, telemetry, started_at, finished_at, gpus_used)

    @staticmethod
    async def _stop_watcher(task: asyncio.Task[None]) -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _bench_watch(self) -> BenchWatch | None:
        with contextlib.suppress(CuzkError):
            return BenchWatch(await self.ctx.daemon.status())
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
        """One /status read: the run's concurrency is announced once the daemon shows the
        batch begun; proofs finished since the last go to the heartbeats, and the first
        one opens the steady-state window (the pipeline is full from then on)."""
        if watch is None:
            return
        ctx = self.ctx
        try:
            status = await ctx.daemon.status()
        except CuzkError:
            return
        assert ctx.sampler is not None and ctx.progress is not None
        if ctx.progress.concurrency is None and watch.saw_batch_begin(status):
            ctx.progress = Progress(done=ctx.progress.done, total=ctx.progress.total,
                                    unit="proofs", concurrency=concurrency)
        finished = watch.update(status)
        if not finished:
            return
        for f in finished:
            if f.completed:
                ctx.proofs_completed_total += 1
                if f.wall_seconds is not None:
                    ctx.proof_seconds_recent.append(f.wall_seconds)
        total = ctx.progress.total
        ctx.progress = Progress(done=min(ctx.progress.done + len(finished), total),
                                total=total, unit="proofs", concurrency=concurrency)
        if steady is not None and not steady:
            steady.append(ctx.sampler.open_window())

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

    async def run(self) -> str:
        ctx = self.ctx
        ctx.set_phase("benchmarking", Progress(done=0, total=self.config.bench_proofs,
                                               unit="proofs"))
        await self._proving.stop_work()
        if not ctx.daemon.running or ctx.daemon.devices is not None:
            await self._warming.start_daemon(None)
        all_gpus = ctx.all_gpus()
        # The id the coordinator gave before this run began: its answer to that request.
        benchmark_id = self._orders.benchmark_id
        measured_all = await self._measure(None)  # warms a new daemon up first
        result = self._result_of("benchmark", measured_all, benchmark_id)
        directive = await self._reporting.deliver(result)
        if directive.action != "continue":
            return "benchmark" if directive.action == "benchmark" else "prove"
        if len(all_gpus) > 1:
            directive = await self._scaling(measured_all, all_gpus)
            if directive.action == "benchmark":
                return "benchmark"
        return "prove"

    async def _scaling(self, measured_all: _Measured, all_gpus: list[int]) -> Directive:
        from vast_manager.common.scaling import diagnose  # the coordinator runs the same function

        host = self.ctx.host
        assert host is not None
        one = [all_gpus[0]]
        log.info("one-GPU run for the scaling diagnosis (GPU %d of %d): a new daemon, "
                 "warmed up again (it starts without the PCE)", one[0], len(all_gpus))
        self.ctx.progress = None
        await self._warming.start_daemon(one)
        try:
            measured_one = await self._measure(one)
        finally:
            # Proving (or anything next) wants every GPU again.
            await self._warming.start_daemon(None)
        diagnosis = diagnose(
            len(all_gpus),
            measured_all.run.rate_per_hour,
            measured_one.run.rate_per_hour,
            measured_all.telemetry,
            list(host.gpus),
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
        return await self._reporting.deliver(result)
