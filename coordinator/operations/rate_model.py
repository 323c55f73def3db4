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
import contextlib
import logging
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
from vast_manager.coordinator.discovery.model import RateModel, fit_rate_model
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.schema import Row, loads
from vast_manager.coordinator.store.writer import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FittedModel:
    """One fit: the model, what it was fitted on, and when."""

    model: RateModel
    version: tuple[int, int]  # (count, highest id) of the measurements it saw
    fitted_at: float
    fit_seconds: float
    imported: int  # of its measurements, how many were imported
    skipped: int  # measurements whose hardware the model cannot read

    def summary(self) -> dict[str, Any]:
        """For the operator: what the fit saw and learned (``RateModel.summary``)."""
        return {**self.model.summary(), "imported": self.imported, "skipped": self.skipped,
                "fitted_at": self.fitted_at, "fit_seconds": round(self.fit_seconds, 3)}


def measurement_of(row: Row) -> Measurement:
    """A stored measurement row as the model's ``Measurement`` (MeasurementError if its
    offer cannot be read)."""
    return parse_measurement(
        {"machine_id": row["machine_id"], "offer": loads(row["offer_json"]),
         "rate_per_hour": row["rate_per_hour"], "measured_at": row["measured_at"],
         "source": row["source"]},
        default_source=row["source"],
    )


def fit_rows(rows: list[Row], version: tuple[int, int], now: float) -> FittedModel:
    """Fit on stored rows (blocking: run it on a worker thread)."""
    started = time.perf_counter()
    usable: list[Measurement] = []
    skipped = 0
    for row in rows:
        try:
            usable.append(measurement_of(row))
        except MeasurementError:
            skipped += 1
    # Imported rates that disagree with the fleet's own of the same machine weigh nothing.
    model = fit_rate_model(weigh_sources(usable), now=now)
    return FittedModel(model, version, now, time.perf_counter() - started,
                       sum(1 for m in usable if m.source == "imported"), skipped)


class ModelKeeper:
    """Holds the latest fit; refits when the measurements change, never per request."""

    def __init__(self, store: Store, clock: policy.Clock, refit_interval_s: float) -> None:
        self.store = store
        self.clock = clock
        self.refit_interval_s = refit_interval_s
        self._fitted: FittedModel | None = None
        self._lock = asyncio.Lock()  # one fit at a time
        self._wake = asyncio.Event()
        self.fits = 0  # fits made (tests read it)

    @property
    def latest(self) -> FittedModel | None:
        return self._fitted

    async def current(self) -> FittedModel:
        """The latest fit; only before the first one does this wait (for that fit)."""
        if self._fitted is not None:
            return self._fitted
        return await self.refresh()

    async def refresh(self) -> FittedModel:
        """Fit now if the measurements changed since the last fit (waits for a fit under
        way); the fit runs on a worker thread, the reads on the store's reader."""
        async with self._lock:
            version = await self.store.read(lambda r: r.measurements_version())
            if self._fitted is not None and self._fitted.version == version:
                return self._fitted
            rows = await self.store.read(Reads.measurements)
            self._fitted = await asyncio.to_thread(fit_rows, rows, version, self.clock())
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
