"""The coordinator's own scaling reading of a result (docs/architecture.md, "Scaling
diagnosis"): on the rates it recomputed, never the host's arithmetic."""

from __future__ import annotations

import logging
from typing import Any

from vast_manager.common import scaling
from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.rows import InstanceRow
from vast_manager.coordinator.store.migrations import dumps, loads
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import HostInfo, Result, ScalingRun

log = logging.getLogger(__name__)


def scaling_of(result: Result, after: InstanceRow, hardware: tuple[str, str, int],
                check: policy.Plausibility, watch: policy.Watch, terminate: bool,
                now: float) -> tuple[dict[str, Any], str, str] | None:
    """The scaling reading a result makes: a scaling run's, or a terminated multi-GPU
    benchmark's. ``hardware``: the result's machine, GPU model and count."""
    rate = check.recomputed_rate_per_hour
    machine_id, gpu_name, num_gpus = hardware
    if result.kind == "scaling":
        one = {len(set(result.gpus_used)): rate} if rate is not None else {}
        return scaling_reading(result, after, machine_id, gpu_name, num_gpus, now,
                                {**watch.measured_rates, **one})
    if terminate and check.gpus > 1:
        # No one-GPU run follows a terminated host, yet why its GPUs scale badly is
        # exactly what the operator wants to know: diagnose the all-GPU run's telemetry.
        return scaling_reading(result, after, machine_id, gpu_name, num_gpus, now,
                                {check.gpus: rate} if rate is not None else {})
    return None


def scaling_reading(
    result: Result,
    inst: InstanceRow,
    machine_id: str,
    gpu_name: str,
    num_gpus: int,
    now: float,
    measured: dict[int, float],
) -> tuple[dict[str, Any], str, str]:
    """The scaling table's row (its result's row id is the writer's to fill): the
    coordinator's reading (on ``measured``, GPU count -> the rate it recomputed) beside the
    agent's own; the reason of its event, and the machine the event names."""
    runs = result.runs or [ScalingRun(result.gpus_used, result.rate_per_hour, result.telemetry)]
    sizes = sorted({max(1, len(set(r.gpus_used))) for r in runs})
    rate_all = measured.get(sizes[-1])
    rate_one = measured.get(1) if len(sizes) > 1 and sizes[0] == 1 else None
    try:
        found = _scaling_diagnosis(runs, inst, rate_all, rate_one)
    except Exception:  # a diagnosis bug must not lose the agent's result
        log.exception("scaling diagnosis failed for result %s of instance %s",
                      result.result_id, inst["id"])
        found = None
    rate_all, rate_one, diagnosis = found if found else (None, None, None)
    row = {
        "instance_id": inst["id"],
        "machine_id": machine_id,
        "gpu_name": gpu_name,
        "num_gpus": num_gpus,
        "rate_all_per_hour": rate_all,
        "rate_one_per_hour": rate_one,
        "agent_efficiency": result.efficiency,
        "agent_bottleneck": result.bottleneck,
        "agent_evidence_json": dumps(result.evidence),
        "efficiency": getattr(diagnosis, "efficiency", None),
        "bottleneck": getattr(diagnosis, "bottleneck", None),
        "evidence_json": dumps(_labelled(getattr(diagnosis, "evidence", None))),
        "created_at": now,
    }
    if diagnosis is not None:
        eff = diagnosis.efficiency
        text = "?" if eff is None else f"{eff:.2f}"
        reason = (f"efficiency {text}, bottleneck {diagnosis.bottleneck} (coordinator's reading "
                  "of the host's own telemetry)")
    else:
        reason = f"agent reports efficiency {result.efficiency}, bottleneck {result.bottleneck}"
    return row, reason, machine_id


#: What each piece of a diagnosis's evidence is read from: the efficiency is the
#: coordinator's (its measured rates), the bottleneck and its evidence the host's own
#: telemetry, which a hostile host forges (docs/reliability.md, "Untrusted hosts").
HOST_TELEMETRY = "host-reported telemetry:"


def _labelled(evidence: list[str] | None) -> list[str] | None:
    return None if evidence is None else [f"{HOST_TELEMETRY} {e}" for e in evidence]


def _scaling_diagnosis(
    runs: list[ScalingRun], inst: InstanceRow, rate_all: float | None, rate_one: float | None
) -> tuple[float | None, float | None, scaling.Diagnosis] | None:
    """(rate_all, rate_one, the coordinator's own Diagnosis) of the reported runs, on the
    rates the coordinator measured (never the runs' own: a host's arithmetic).

    Without a one-GPU run (a host terminated on its all-GPU benchmark) or a measured
    all-GPU run the efficiency is unknown, but the telemetry still names the bottleneck.
    """
    if not runs:
        return None
    run_all = max(runs, key=lambda r: len(set(r.gpus_used)))
    gpus = []
    if inst.get("host_json"):
        try:
            gpus = from_obj(HostInfo, loads(inst["host_json"])).gpus
        except ValueError:
            gpus = []
    num_gpus = max(len(set(run_all.gpus_used)), 1)
    diagnosis = scaling.diagnose(num_gpus, rate_all or 0.0,
                                 rate_one if rate_all is not None and rate_one else 0.0,
                                 run_all.telemetry, gpus)
    return rate_all, rate_one, diagnosis
