"""Warm-up: the preparation in order (checks, fetch, warm), the daemon's start and its
warm-up proof, and the wait for its PCE extraction."""

from __future__ import annotations

import asyncio
import contextlib

from vast_manager.agent.cuzk import (
    GIB,
    POREP_PARTITION_FULL_BYTES,
    CuzkError,
    DaemonExited,
    has_pce,
    srs_reservation_bytes,
    synthesis_workers,
)
from vast_manager.agent.phases.fetch import Fetching
from vast_manager.agent.phases.shared import (
    PCE_POLL_S,
    AgentFailure,
    log,
)
from vast_manager.protocol import Progress


class Warming(Fetching):
    """The daemon started and warm (phase warming)."""

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
