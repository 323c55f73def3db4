"""Fetching: the checks that need nothing fetched (the C1, the memory budget), then
the proof parameters (phase fetching_params). What it checked goes to warm-up."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from vast_manager.agent.c1 import C1Error, C1Input, check_c1
from vast_manager.agent.cuzk import (
    GIB,
    POREP_PARTITION_FULL_BYTES,
    SAFETY_MARGIN_BYTES,
    parse_budget_text,
)
from vast_manager.agent.params import Downloader, ParamsError, load_manifest, run_params_cmd
from vast_manager.agent.phases.context import AgentContext
from vast_manager.agent.phases.shared import (
    AgentFailure,
    MemoryProbe,
    log,
)
from vast_manager.protocol import Progress


@dataclass(frozen=True, slots=True)
class Checked:
    """What the checks found, for the daemon's start: the C1 it proves, its memory budget."""

    c1: C1Input
    budget_bytes: int


class Fetching:
    """The C1 and memory checks, then the parameter fetch (phase fetching_params)."""

    def __init__(self, ctx: AgentContext, memory_probe: MemoryProbe) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self._memory_probe = memory_probe

    async def run(self) -> Checked:
        # Both checks are cheap and need nothing fetched: a C1 that cuzk cannot prove,
        # or a budget that cannot hold one partition, fails now, before any rent is
        # spent on parameters or proofs.
        c1 = await self._check_c1()
        budget_bytes = await self._memory_budget()
        self.ctx.set_phase("fetching_params")
        await self._fetch_params()
        return Checked(c1, budget_bytes)

    async def _check_c1(self) -> C1Input:
        try:
            c1 = await asyncio.to_thread(check_c1, self.config.c1_path)
        except C1Error as exc:
            raise AgentFailure(f"{exc}; no benchmark was started") from None
        log.info("C1 input %s: sector %d, %s, %d bytes (miner %d from VM_C1_MINER_ID)",
                 c1.path, c1.sector_num, c1.registered_proof, c1.size_bytes,
                 self.config.c1_miner_id)
        return c1

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
        self.ctx.progress = Progress(done=max(done, 0), total=max(total, 0), unit="bytes")

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
                    cfg.params_cmd, cfg.params_dir, sink=self.ctx.logs.child_line,
                    total_bytes=total, on_progress=self._bytes_progress,
                )
            elif cfg.params_manifest:
                entries = await load_manifest(cfg.params_manifest, session)
                downloader = Downloader(cfg.params_dir, session)
                await downloader.fetch(entries, on_progress=self._bytes_progress)
            else:
                log.info("no VM_PARAMS_CMD or VM_PARAMS_MANIFEST: no parameters to fetch")
        log.info("parameters ready in %s", cfg.params_dir)
