"""A benchmarking heartbeat's early-verdict tracking (docs/policy.md): the run's proofs
folded into the instance's benchmark state, judged, and a clearly failing host stopped
after a few proofs."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.decisions.early_verdict import EarlyVerdict, VerdictSettings, assess
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.directives import (
    agent_pace_s,
    current,
    directive_to_dict,
    time_scale,
)
from vast_manager.coordinator.rows import InstanceRow, instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import dumps, loads
from vast_manager.coordinator.store.writer import Tx
from vast_manager.protocol.messages import Heartbeat, Progress

log = logging.getLogger(__name__)

BENCH_OPEN, BENCH_PASSED, BENCH_TERMINATED, BENCH_CLOSED = "open", "passed", "terminated", "closed"


def verdict_settings(settings: Settings, planned_proofs: int) -> VerdictSettings:
    """The early-verdict knobs of ``settings`` for a benchmark of ``planned_proofs``."""
    return VerdictSettings(
        confidence=settings.verdict_confidence,
        min_proofs=settings.verdict_min_proofs,
        sigma_floor=settings.verdict_sigma_floor,
        planned_proofs=max(planned_proofs, settings.verdict_min_proofs),
    )


def judge_early(tx: Tx, inst: InstanceRow, hb: Heartbeat, settings: Settings, now: float) -> None:
    """Fold a benchmarking heartbeat into the instance's benchmark state; judge it early.

    A bug here must not cost the agent its heartbeat: the work runs in its own
    savepoint, undone on error.
    """
    try:
        with tx.db.atomic():
            _track_benchmark(tx, inst, hb, settings, now)
    except Exception:
        tx.drop_caches()  # they may hold what the savepoint undid
        log.exception("early verdict failed for instance %s", inst["id"])


def _without_progress(hb: Heartbeat, inst: InstanceRow) -> Heartbeat:
    """A heartbeat of a run that announced its concurrency, then stopped reporting
    progress: read as no progress at all (nothing more done, no new proof)."""
    progress = Progress(done=int(inst["bench_done"] or 0), total=int(inst["bench_total"] or 0),
                        unit="proofs", concurrency=int(inst["bench_concurrency"] or 0))
    return Heartbeat(hb.seq, hb.phase, hb.phase_started_at, progress,
                     int(inst["bench_completed_total"] or 0), [], None)


def _judge_unannounced(tx: Tx, inst: InstanceRow, hb: Heartbeat, settings: Settings,
                       now: float) -> None:
    """A benchmarking heartbeat of a run that never announced its concurrency: no proof
    counted, on as many slots as its planned proofs and never fewer than its GPUs could
    hold (the most generous reading), timed from when the coordinator saw benchmarking
    begin less the warm-up's limit (``warmup_timeout_s``: the agent benchmarks only
    after a warm-up proof and the PCE, reporting no concurrency meanwhile). So the
    stall test of docs/policy.md still stops a host that never reports progress."""
    min_rate = inst["min_rate_per_hour"]
    if min_rate is None or not min_rate > 0:
        return
    since = (float(inst["state_since"]) if inst["state"] == State.BENCHMARKING
             and inst["state_since"] is not None else now)
    real_s = now - since - settings.warmup_timeout_s - 2.0 * agent_pace_s(inst, settings)
    if real_s <= 0:
        return
    elapsed_s = real_s * time_scale(inst, settings)
    gpus = max(1, int(inst["num_gpus"] or 1))
    total = max(hb.progress.total if hb.progress is not None else 0,
                settings.verdict_min_proofs)
    concurrency = max(settings.max_concurrency_per_gpu * gpus, total)
    total = max(total, concurrency)  # the stall test needs every slot busy: N >= J
    vs = verdict_settings(settings, total)
    v = assess([], concurrency, elapsed_s, float(min_rate), vs)
    if v.decision != "terminate":
        return
    v = replace(v, reason=f"{v.reason} (its heartbeats report no progress: read as none, "
                          f"after {settings.warmup_timeout_s:.0f} s for the warm-up)")
    state: dict[str, Any] = {
        "bench_key": f"{inst['boot_id']}|{hb.phase_started_at!r}", "bench_seen_at": since,
        "bench_anchor_at": None, "bench_last_seq": hb.seq,
        "bench_completed_total": hb.proofs_completed_total, "bench_proof_seconds_json": "[]",
        "bench_failed": 0, "bench_done": 0, "bench_total": total,
        "bench_concurrency": concurrency, "bench_status": BENCH_OPEN,
    }
    data = _verdict_numbers(v, vs, concurrency, elapsed_s, 0, float(min_rate))
    _terminate_early(tx, inst, v, data, state, [], settings, now)


def _track_benchmark(tx: Tx, inst: InstanceRow, hb: Heartbeat, settings: Settings,
                     now: float) -> None:
    progress = hb.progress
    key = f"{inst['boot_id']}|{hb.phase_started_at!r}"
    if progress is None or progress.unit != "proofs" or progress.concurrency is None:
        # Missing progress counts as no progress (docs/reliability.md, "No rate on a
        # host's word alone"): a run that announced its concurrency keeps being judged
        # on what it reported; one that never did, from when its benchmarking began.
        if inst["bench_key"] != key or not inst["bench_concurrency"]:
            _judge_unannounced(tx, inst, hb, settings, now)
            return
        hb = _without_progress(hb, inst)
        progress = hb.progress
    assert progress is not None and progress.concurrency is not None
    same = inst["bench_key"] == key
    last_seq = inst["bench_last_seq"]
    if same and last_seq is not None and hb.seq <= last_seq:
        return  # a replay (same boot, seq already counted)
    # Proof seconds of non-positive length are no proofs: left out, counted as failed.
    recent = [w for w in hb.proof_seconds_recent if w > 0]
    concurrency = progress.concurrency
    restarted = (concurrency != inst["bench_concurrency"]
                 or progress.done < (inst["bench_done"] or 0))
    if same and inst["bench_status"] != BENCH_OPEN:
        return  # decided or finished: later runs of this phase (the scaling run) are not judged
    anchor: float | None
    if not same or restarted:
        # A new benchmark, or a new run of this one (the agent's retry): start afresh.
        fresh = recent[len(recent) - min(len(recent), progress.done):]
        proofs = fresh
        seen_at, anchor = now, None
    else:
        # proofs_completed_total says how many of the listed proofs are new: a list
        # resent after a lost answer repeats the old ones at its start.
        new = hb.proofs_completed_total - int(inst["bench_completed_total"] or 0)
        fresh = recent[len(recent) - max(0, min(len(recent), new)):] if new > 0 else []
        proofs = list(loads(inst["bench_proof_seconds_json"]) or []) + fresh
        seen_at, anchor = float(inst["bench_seen_at"] or now), inst["bench_anchor_at"]
    anchor, elapsed_s = _elapsed(inst, settings, fresh, seen_at, anchor, now)
    failed = max(0, progress.done - len(proofs))
    state: dict[str, Any] = {
        "bench_key": key,
        "bench_seen_at": seen_at,
        "bench_anchor_at": anchor,
        "bench_last_seq": hb.seq,
        "bench_completed_total": hb.proofs_completed_total,
        "bench_proof_seconds_json": dumps(proofs),
        "bench_failed": failed,
        "bench_done": progress.done,
        "bench_total": progress.total,
        "bench_concurrency": concurrency,
        "bench_status": BENCH_OPEN,
    }
    min_rate = inst["min_rate_per_hour"]
    if min_rate is None or not min_rate > 0:
        tx.instances.update(inst["id"], **state)  # nothing to judge against
        return
    # A concurrency above the cap is read as the cap (docs/reliability.md): more slots
    # than cuzk runs would only stretch the time the stall test allows.
    concurrency = min(concurrency,
                      settings.max_concurrency_per_gpu * max(1, inst["num_gpus"] or 1))
    vs = verdict_settings(settings, progress.total)
    v = assess(proofs, concurrency, elapsed_s, float(min_rate), vs, proofs_failed=failed)
    if v.decision == "undecided":
        tx.instances.update(inst["id"], **state)
        return
    data = _verdict_numbers(v, vs, concurrency, elapsed_s, failed, float(min_rate))
    if v.decision == "pass":
        state["bench_status"] = BENCH_PASSED
        tx.instances.update(inst["id"], **state)
        tx.audit.add(now, "verdict", f"early pass: {v.reason}", data=data,
                     instance_id=inst["id"], agent_id=inst["agent_id"],
                     machine_id=inst["machine_id"])
        return
    _terminate_early(tx, inst, v, data, state, proofs, settings, now)


def _elapsed(inst: InstanceRow, settings: Settings, fresh: list[float], seen_at: float,
             anchor: float | None, now: float) -> tuple[float | None, float]:
    """(the batch's start the host cannot dispute, the benchmarking seconds since).

    A proof seen now that ran w seconds started at or before now - w, and so did the
    batch: the least such time is a start the host cannot dispute (a late heartbeat only
    makes it later, in the host's favour). Before the first completion only the first
    sight is known: our agent announces the run once the daemon has its first proof,
    and two heartbeat intervals (of the pace the agent was on) are allowed for one that
    announces early."""
    scale = time_scale(inst, settings)
    for w in fresh:
        anchor = min(now - w / scale, anchor if anchor is not None else now)
    if anchor is not None:
        return anchor, max(0.0, now - float(anchor)) * scale
    return None, max(0.0, now - seen_at - 2.0 * agent_pace_s(inst, settings)) * scale


def _verdict_numbers(
    v: EarlyVerdict, vs: VerdictSettings, concurrency: int, elapsed_s: float, failed: int,
    min_rate: float,
) -> dict[str, Any]:
    return {
        "decision": v.decision,
        "rate_estimate_per_hour": v.rate_estimate_per_hour,
        "bound_per_hour": v.bound_per_hour,
        "min_rate_per_hour": min_rate,
        "proofs": v.proofs,
        "proofs_failed": failed,
        "statistic": v.statistic,
        "concurrency": concurrency,
        "elapsed_s": elapsed_s,
        "confidence": vs.confidence,
        "min_proofs": vs.min_proofs,
        "sigma_floor": vs.sigma_floor,
        "planned_proofs": vs.planned_proofs,
    }


def _terminate_early(
    tx: Tx, inst: InstanceRow, v: EarlyVerdict, data: dict[str, Any], state: dict[str, Any],
    proofs: list[float], settings: Settings, now: float,
) -> None:
    """The below-minimum path of a benchmark result, on the proofs seen so far."""
    machine_id = inst["machine_id"] or inst["label"]
    reason = f"early verdict: {v.reason}"
    state["bench_status"] = BENCH_TERMINATED
    # Only a bound below the minimum the machine's own price sets blocks it.
    blocks = policy.blocks_machine(v.bound_per_hour, inst.get("price_min_rate_per_hour"))
    if not blocks:
        reason += " (given at deploy; the machine is not blocked)"
    tx.instances.begin_terminating(
        inst["id"], reason, kind="verdict", note=f"terminate: {reason}", data=data,
        bad_host_source="benchmark" if blocks else None, now=now,
        strike=policy.StrikeRule.from_settings(settings) if blocks else None,
        destroy_due_at=now + settings.terminate_grace_s,
        **state, rate_per_hour=v.rate_estimate_per_hour, last_seen=now,
    )
    fresh = current(tx, inst["id"])
    directive = policy.directive_for(
        instance_row(fresh), next_heartbeat_s=agent_pace_s(fresh, settings),
        min_rate=fresh["min_rate_per_hour"],
    )
    failed = int(data["proofs_failed"])
    flag_reasons = [
        f"{policy.PARTIAL}: the benchmark was stopped after {len(proofs)} of "
        f"{state['bench_total']} proofs ({failed} failed)",
        f"{policy.EARLY_VERDICT}: {v.reason}",
    ]
    tx.results.add(
        {
            "agent_id": inst["agent_id"],
            # One early verdict per benchmark run; the agent's own ids start "res_".
            "result_id": f"early-verdict:{state['bench_key']}:{state['bench_last_seq']}",
            "instance_id": inst["id"],
            "kind": "benchmark",
            "proof_type": None,
            "started_at": state["bench_seen_at"],
            "finished_at": now,
            "gpus_used_json": None,
            "proofs_completed": len(proofs),
            "proofs_failed": failed,
            "wall_seconds": data["elapsed_s"],
            "rate_per_hour": v.rate_estimate_per_hour,
            "recomputed_rate_per_hour": v.rate_estimate_per_hour,
            "proof_seconds_json": dumps(proofs),
            "telemetry_json": None,
            "runs_json": None,
            "efficiency": None,
            "bottleneck": None,
            "evidence_json": None,
            "flags": f"{policy.PARTIAL},{policy.EARLY_VERDICT}",
            "flag_reasons_json": dumps(flag_reasons),
            "counts_for_host_perf": 0,
            "verdict": "terminate",
            "verdict_reason": reason,
            "directive_json": dumps(directive_to_dict(directive)),
            "machine_id": machine_id,
            "gpu_name": inst["gpu_name"] or "unknown",
            "num_gpus": inst["num_gpus"] or 1,
            "received_at": now,
        }
    )
