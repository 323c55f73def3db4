"""The fleet's rate model, refitted off the event loop when measurements arrive.

Requests never fit: ``ModelKeeper.current()`` hands them the latest fit, waiting only
for the very first one after a start. ``run()`` refits on a worker thread when the
``measurements`` table changed (a counted benchmark result, an import), at most once
every ``model_refit_interval_s``; ``wake()`` says one may have changed, so the next
fit comes as soon as that interval allows rather than at the next poll.
docs/discovery.md explains the model itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import contextlib
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.discovery.measurements import (
    Measurement,
    MeasurementError,
    parse_measurement,
    weigh_sources,
)
from vast_manager.coordinator.discovery.served import ServedModel, fit_served_model
from vast_manager.coordinator.store.migrations import Row, loads
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FittedModel:
    """One fit: the model, what it was fitted on, and when."""

    model: ServedModel
    version: tuple[int, int]  # (count, highest id) of the measurements it saw
    fitted_at: float
    fit_seconds: float
    imported: int  # of its measurements, how many were imported
    skipped: int  # measurements whose hardware the model cannot read

    @property
    def measurements_used(self) -> int:
        return self.version[0] - self.skipped

    def summary(self) -> dict[str, Any]:
        """For the operator: what the fit saw and learned (``ServedModel.summary``)."""
        return {**self.model.summary(), "imported": self.imported, "skipped": self.skipped,
                "fitted_at": self.fitted_at, "fit_seconds": round(self.fit_seconds, 3),
                "measurements_used": self.measurements_used}


def measurement_of(row: Row) -> Measurement:
    """A stored measurement row as the model's ``Measurement`` (MeasurementError if its
    offer cannot be read). A counted rate is read at most at what was believed of its
    hardware before it until its delivery agrees (``model_cap_per_hour``,
    docs/reliability.md "Judged by what it delivers")."""
    rate = row["rate_per_hour"]
    cap = row.get("model_cap_per_hour")
    if cap is not None and isinstance(rate, int | float) and rate > cap:
        rate = cap
    return parse_measurement(
        {"machine_id": row["machine_id"], "offer": loads(row["offer_json"]),
         "rate_per_hour": rate, "measured_at": row["measured_at"],
         "source": row["source"], "bottleneck": row.get("bottleneck")},
        default_source=row["source"],
    )


def fit_rows(rows: list[Row], version: tuple[int, int], now: float) -> FittedModel:
    """Fit on stored rows (blocking: run it on a worker thread)."""
    started = time.perf_counter()
    usable: list[Measurement] = []
    skipped = 0
    for row in rows:
        if row.get("host_reported"):
            continue  # a bring-your-own agent's hardware is its own word: not the model's
        try:
            usable.append(measurement_of(row))
        except MeasurementError:
            skipped += 1
    # Imported rates that disagree with the fleet's own of the same machine weigh nothing.
    model = fit_served_model(weigh_sources(usable), now=now)
    return FittedModel(model, version, now, time.perf_counter() - started,
                       sum(1 for m in usable if m.source == "imported"), skipped)


#: A fit on this many measurements or more runs in a worker process: its Python-level
#: work (the cross-validation's folds, the learners' binning) would otherwise hold the
#: interpreter's lock for seconds at a time and delay heartbeats (bench/refit.py measures
#: it). Smaller fits take well under a second and stay on a thread (no process to start).
PROCESS_FIT_MIN_MEASUREMENTS = 500

#: How long a request waits for a refit of new measurements before it answers from the
#: previous fit, flagged stale (the refit goes on; the next request gets it).
ANSWER_WAIT_S = 5.0


def _fit_worker_start() -> None:
    """The fit's worker process yields the CPU to the coordinator's own (heartbeats come
    first; a refit may take longer), and uses one thread per library."""
    os.environ["OMP_NUM_THREADS"] = "1"
    with contextlib.suppress(OSError):
        os.nice(10)


class ModelKeeper:
    """Holds the latest fit; refits when the measurements change. A request whose
    measurements changed since the fit waits for the refit (up to ``ANSWER_WAIT_S``), so
    an answer after an import or a stored result uses it; past that it answers from the
    previous fit and says so (``freshness``)."""

    def __init__(self, store: Store, clock: policy.Clock, refit_interval_s: float,
                 answer_wait_s: float = ANSWER_WAIT_S) -> None:
        self.store = store
        self.clock = clock
        self.refit_interval_s = refit_interval_s
        self.answer_wait_s = answer_wait_s
        self._fitted: FittedModel | None = None
        self._lock = asyncio.Lock()  # one fit at a time
        self._wake = asyncio.Event()
        self._seen: tuple[int, int] | None = None  # the measurements' latest version seen
        self._task: asyncio.Task[FittedModel] | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.fits = 0  # fits made (tests read it)

    def close(self) -> None:
        """Stop the worker process, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def _fit(self, rows: list[Row], version: tuple[int, int], now: float) -> FittedModel:
        if len(rows) < PROCESS_FIT_MIN_MEASUREMENTS:
            return await asyncio.to_thread(fit_rows, rows, version, now)
        if self._pool is None:
            # spawn, not fork: the coordinator has threads (the store's), and a forked
            # child would inherit their locks mid-use.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=_fit_worker_start)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, fit_rows, rows, version, now)
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None  # the next fit starts a new worker
            raise

    @property
    def latest(self) -> FittedModel | None:
        return self._fitted

    @property
    def refitting(self) -> bool:
        return self._lock.locked()

    async def current(self) -> FittedModel:
        """The fit of the current measurements: refits first when they changed (waiting
        at most ``answer_wait_s`` once a fit exists; then the previous fit, stale)."""
        version = await self.store.read(lambda r: r.measurements_version())
        self._seen = version
        if self._fitted is not None and self._fitted.version == version:
            return self._fitted
        task = self._refresh_task()
        if self._fitted is None:
            return await asyncio.shield(task)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(task), self.answer_wait_s)
        return self._fitted

    def _refresh_task(self) -> asyncio.Task[FittedModel]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.refresh())
        return self._task

    def freshness(self, fitted: FittedModel) -> dict[str, Any]:
        """What every prediction carries: the fit it came from, and whether newer
        measurements are still being fitted."""
        stale = self._seen is not None and self._seen != fitted.version
        reason = None
        if stale and self._seen is not None:
            new = self._seen[0] - fitted.version[0]
            reason = (f"a refit for {new} new measurement(s) is running; this answer is from "
                      f"the fit of {fitted.measurements_used}" if self.refitting else
                      f"{new} new measurement(s) wait for the next refit")
        return {"model_fitted_at": fitted.fitted_at,
                "measurements_used": fitted.measurements_used,
                "model_stale": stale, "model_stale_reason": reason}

    async def refresh(self) -> FittedModel:
        """Fit now if the measurements changed since the last fit (waits for a fit under
        way); the fit runs on a worker thread, the reads on the store's reader."""
        async with self._lock:
            version = await self.store.read(lambda r: r.measurements_version())
            self._seen = version
            if self._fitted is not None and self._fitted.version == version:
                return self._fitted
            rows = await self.store.read(Reads.measurements)
            self._fitted = await self._fit(rows, version, self.clock())
            self.fits += 1
            log.info("rate model refitted on %d measurements in %.2f s", version[0],
                     self._fitted.fit_seconds)
            return self._fitted

    def wake(self) -> None:
        """Measurements may have changed: refit as soon as the interval allows."""
        self._wake.set()

    async def run(self) -> None:
        """Refit when the measurements changed: at most once an interval, and look at
        least once every two (writes by any path are seen)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.refresh()
            except Exception:
                log.exception("rate model refit failed; the previous fit stays in use")
            await asyncio.sleep(max(0.0, started + self.refit_interval_s - loop.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.refit_interval_s)
            self._wake.clear()
