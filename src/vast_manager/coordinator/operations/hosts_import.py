"""The operator's hosts import (docs/discovery.md): measurements made elsewhere, each with
the hardware it ran on, added in one transaction; those already known are counted, not
written twice."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.store.migrations import dumps
from vast_manager.coordinator.store.writer import Tx


def measurement_row(m: Measurement, now: float) -> dict[str, Any]:
    f = m.features()  # the offer's fields as the model reads them ("2.0" GPUs is 2)
    return {
        "machine_id": m.machine_id, "gpu_name": f.gpu_name,
        "num_gpus": f.num_gpus, "rate_per_hour": m.rate_per_hour, "measured_at": m.measured_at,
        "source": "imported", "offer_json": dumps(m.offer.raw), "recorded_at": now,
        "bottleneck": m.bottleneck,
    }


def import_job(measurements: Sequence[Measurement], now: float,
               lines: int) -> Callable[[Tx], dict[str, Any]]:
    """One transaction: every new measurement (host_perf is computed from them)."""

    def job(tx: Tx) -> dict[str, Any]:
        touched: set[tuple[str, str, int]] = set()
        added = 0
        for m in measurements:
            row = measurement_row(m, now)
            if tx.results.add_measurement(row):
                added += 1
                touched.add((row["machine_id"], row["gpu_name"], row["num_gpus"]))
        message = (f"imported {added} measurement(s) of {len(touched)} host configuration(s) "
                   f"from {lines} line(s); {len(measurements) - added} already known")
        tx.audit.add(now, "hosts_import", message,
                     data={"imported": added, "duplicates": len(measurements) - added})
        return {"ok": True, "imported": added, "duplicates": len(measurements) - added,
                "hosts": len(touched), "message": message[0].upper() + message[1:] + "."}

    return job
