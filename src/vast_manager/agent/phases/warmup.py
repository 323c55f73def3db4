"""Warm-up (phase warming): the daemon's start, its warm-up proof and the wait for its
PCE extraction. Proving and benchmarking (re)start the daemon through it too."""

from __future__ import annotations

import asyncio
import contextlib

from vast_manager.agent.c1 import C1Input
from vast_manager.agent.cuzk import (
    GIB,
    POREP_PARTITION_FULL_BYTES,
    CuzkError,
    DaemonExited,
    has_pce,
    srs_reservation_bytes,
    synthesis_workers,
)
from vast_manager.agent.phases.context import AgentContext
from vast_manager.agent.phases.fetch import Checked
from vast_manager.agent.phases.shared import (
    PCE_POLL_S,
    AgentFailure,
    log,
)
from vast_manager.protocol import Progress


class Warming:
    """The daemon started and warm (phase warming), and restarted when others need."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self._checked: Checked | None = None  # from fetching, before the first start
        self._daemon_warm = False  # this daemon process has finished its PCE extraction

    @property
    def c1(self) -> C1Input:
        """The C1 input every proof of this agent proves (known once prepared)."""
        assert self._checked is not None
        return self._checked.c1

    async def run(self, checked: Checked) -> None:
        self._checked = checked
        self.ctx.set_phase("warming")
        await self._warm()

    async def start_daemon(self, devices: list[int] | None) -> None:
        """(Re)start the daemon on ``devices`` (None: all) and preload the SRS.

        A new daemon process has no PCE (cuzk keeps it in memory only), so it
        is not warm until `ensure_warm` has run on it.
        """
        sampler, daemon = self.ctx.sampler, self.ctx.daemon
        assert sampler is not None and self._checked is not None
        budget_bytes = self._checked.budget_bytes
        srs = srs_reservation_bytes(self.config.params_dir)
        need = srs + POREP_PARTITION_FULL_BYTES
        if budget_bytes < need:
            raise AgentFailure(
                f"cuzk's memory budget of {budget_bytes / GIB:.1f} GiB cannot hold the "
                f"{srs / GIB:.1f} GiB SRS and one {POREP_PARTITION_FULL_BYTES // GIB} GiB "
                "PoRep partition: its proofs would wait for ever"
            )
        self._daemon_warm = False
        sampler.set_cuzk_status_url(None)
        await daemon.start(devices, budget_bytes=budget_bytes)
        sampler.set_cuzk_status_url(daemon.status_url, synthesis_workers(budget_bytes))
        await self.ctx.bench.preload(daemon.addr)

    async def _warm(self) -> None:
        await self.start_daemon(None)
        await self.ctx.crashes.run("warming up", self.ensure_warm,
                                   lambda: self.start_daemon(None))
        self.ctx.progress = None

    async def ensure_warm(self) -> None:
        """One warm-up proof, then wait for the PCE extraction it started, in this daemon.

        Every boot and every new daemon process does this: cuzk never loads a PCE
        from disk; a proof dispatched while it has none starts a background
        extraction, whose result it keeps in memory only (docs/cuzk.md). The
        benchmark then runs in the same process, never beside a running
        extraction (it competes for RAM and cores).
        """
        if self._daemon_warm:
            return
        ctx, c1 = self.ctx, self.c1
        log.info("warm-up proof: starts the daemon's background PCE extraction")
        ctx.progress = Progress(done=0, total=1, unit="proofs")
        run = await ctx.bench.batch(
            ctx.daemon.addr, c1_path=c1.path, count=1, concurrency=1,
            sector_num=c1.sector_num, miner_id=self.config.c1_miner_id,
        )
        if run.completed < 1:
            if not ctx.daemon.running:
                raise DaemonExited("the cuzk daemon exited during the warm-up proof")
            status = run.proofs[0].status if run.proofs else "did not complete"
            raise AgentFailure(
                f"the warm-up proof {status}: cuzk cannot prove C1 file {c1.path} as sector "
                f"{c1.sector_num} of miner {self.config.c1_miner_id} (is VM_C1_MINER_ID the "
                "miner the C1 was made for?); no benchmark was started"
            )
        ctx.progress = Progress(done=1, total=1, unit="proofs")
        await self._wait_for_pce()
        self._daemon_warm = True

    async def _wait_for_pce(self) -> None:
        """Until ``/status`` lists the PoRep PCE in memory, within VM_PCE_WAIT."""
        wait_s = self.config.pce_wait_s
        if wait_s <= 0:
            log.warning("VM_PCE_WAIT is 0: benchmarking without waiting for the PCE extraction")
            return
        daemon, monotonic = self.ctx.daemon, self.ctx.monotonic
        started = monotonic()
        while True:
            if not daemon.running:
                raise DaemonExited("the cuzk daemon exited during its PCE extraction")
            if daemon.extraction_failed:
                raise AgentFailure("the cuzk daemon's background PCE extraction failed "
                                   "(its log says why); a benchmark would start another one")
            with contextlib.suppress(CuzkError):
                if has_pce(await daemon.status()):
                    log.info("PCE extracted and held in memory after %.0f s",
                             monotonic() - started)
                    return
            if monotonic() - started >= wait_s:
                raise AgentFailure(
                    f"the cuzk daemon's PCE extraction did not finish within VM_PCE_WAIT "
                    f"({wait_s:.0f} s) of the warm-up proof; a benchmark beside it would "
                    "measure the wrong rate"
                )
            await asyncio.sleep(PCE_POLL_S)
