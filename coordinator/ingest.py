"""What each agent message does to the store: write jobs for hello, heartbeat, result, logs.

Each function returns a job for ``Store.write``: it runs on the writer
thread inside one transaction, reads what it needs there (so two requests of
one agent can never interleave half-way), decides with ``policy`` and
records every decision in ``events``. The HTTP layer (``app.py``) only
decodes, calls these, and encodes the answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from coordinator import policy
from coordinator.errors import HelloRequired, UnknownAgent
from coordinator.settings import Settings
from coordinator.store import Row, Tx, dumps, loads
from protocol.codec import from_obj
from protocol.messages import Directive, Heartbeat, Hello, HostInfo, LogBatch, Result

log = logging.getLogger(__name__)


def directive_to_dict(d: Directive) -> dict[str, Any]:
    return asdict(d)


def directive_from_json(text: str) -> Directive:
    return from_obj(Directive, orjson.loads(text))


def _take_directive(tx: Tx, inst: Row, settings: Settings, now: float) -> Directive:
    """The directive for an instance now; a pending rebenchmark is delivered once."""
    directive = policy.directive_for(
        inst,
        next_heartbeat_s=settings.next_heartbeat_s,
        min_rate=inst.get("min_rate_per_hour"),
    )
    if directive.action == "benchmark":
        tx.update_instance(inst["id"], rebenchmark_pending=0, updated_at=now)
        tx.insert_event(
            now, "rebenchmark", "benchmark directive delivered to the agent",
            instance_id=inst["id"], agent_id=inst["agent_id"], machine_id=inst["machine_id"],
        )
    return directive


def _require_agent(tx: Tx, agent_id: str) -> Row:
    agent = tx.get_agent(agent_id)
    if agent is None or agent["revoked"]:
        # Auth checked this already; a revoke may have committed in between.
        raise UnknownAgent("This agent id is unknown or revoked.")
    return agent


def _require_instance(tx: Tx, agent_id: str) -> Row:
    _require_agent(tx, agent_id)
    inst = tx.instance_by_agent(agent_id)
    if inst is None:
        raise HelloRequired("Send /v1/hello before anything else.")
    return inst


def _schedule_termination(
    tx: Tx, inst: Row, reason: str, now: float, delay_s: float, *, kind: str
) -> None:
    """Mark an instance terminating; the monitor destroys it (or revokes its agent) when due."""
    tx.update_instance(
        inst["id"],
        state="terminating" if inst["state"] != "failed" else "failed",
        state_since=now,
        terminate_reason=reason,
        destroy_due_at=now + delay_s,
        updated_at=now,
    )
    tx.insert_event(
        now, kind, reason,
        instance_id=inst["id"], agent_id=inst["agent_id"], machine_id=inst["machine_id"],
    )


# --- hello -----------------------------------------------------------------------


def hello_job(
    agent_id: str, hello: Hello, settings: Settings, now: float
) -> Callable[[Tx], tuple[int, Directive]]:
    """Record a hello; creates the instance of a bring-your-own agent (machine_id = label)."""

    def job(tx: Tx) -> tuple[int, Directive]:
        agent = _require_agent(tx, agent_id)
        host = hello.host
        gpu_name = next((g.name for g in host.gpus if g.name), None)
        inst = tx.instance_by_agent(agent_id)
        if inst is None:
            machine_id = agent["label"] if agent["kind"] == "byo" else None
            instance_id = tx.insert_instance(
                {
                    "agent_id": agent_id,
                    "label": agent["label"],
                    "kind": agent["kind"],
                    "state": "booting",
                    "state_since": now,
                    "machine_id": machine_id,
                    "gpu_name": gpu_name,
                    "num_gpus": len(host.gpus),
                    "min_rate_per_hour": agent["min_rate_per_hour"],
                    "created_at": now,
                    "updated_at": now,
                }
            )
            tx.insert_event(
                now, "hello", f"bring-your-own agent registered its machine {machine_id!r}",
                instance_id=instance_id, agent_id=agent_id, machine_id=machine_id,
            )
            inst = tx.get_instance(instance_id)
            assert inst is not None
        new_boot = inst["boot_id"] != hello.boot_id
        updates: dict[str, Any] = {
            "boot_id": hello.boot_id,
            "agent_version": hello.agent_version,
            "container_id": hello.container_id,
            "host_json": dumps(asdict(host)),
            "hello_at": now,
            "last_seen": now,
            "last_non_benchmark_at": now,
            "updated_at": now,
        }
        if new_boot:
            updates["last_seq"] = -1  # a new agent process counts seq from scratch
        if inst["state"] in ("deploying", "lost"):
            updates["state"] = "booting"
            updates["state_since"] = now
        tx.update_instance(inst["id"], **updates)
        if new_boot:
            tx.insert_event(
                now, "hello", f"agent {hello.agent_version} started (boot {hello.boot_id})",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        if inst["state"] == "lost":
            tx.insert_event(
                now, "recovered", "the agent spoke again after silence",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        expected = inst["num_gpus"]
        if inst["kind"] == "deployed" and expected is not None and expected != len(host.gpus):
            tx.insert_event(
                now, "hardware_mismatch",
                f"the offer promised {expected} GPUs, the agent sees {len(host.gpus)}",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        fresh = tx.get_instance(inst["id"])
        assert fresh is not None
        return fresh["id"], _take_directive(tx, fresh, settings, now)

    return job


# --- heartbeat -------------------------------------------------------------------


def heartbeat_job(
    agent_id: str, hb: Heartbeat, settings: Settings, now: float
) -> Callable[[Tx], tuple[int, Directive]]:
    def job(tx: Tx) -> tuple[int, Directive]:
        inst = _require_instance(tx, agent_id)
        last_seq = inst["last_seq"]
        if last_seq is not None and hb.seq <= last_seq:
            # Late or out of order within this boot: it must not move the phase back.
            tx.update_instance(inst["id"], last_seen=now)
            return inst["id"], _take_directive(tx, inst, settings, now)
        updates: dict[str, Any] = {
            "last_seq": hb.seq,
            "last_seen": now,
            "phase": hb.phase,
            "phase_started_at": hb.phase_started_at,
            "progress_json": dumps(asdict(hb.progress)) if hb.progress else None,
            "proofs_completed_total": hb.proofs_completed_total,
            "updated_at": now,
        }
        if hb.phase != "benchmarking":
            updates["last_non_benchmark_at"] = now
        state = inst["state"]
        ids = {"instance_id": inst["id"], "agent_id": agent_id, "machine_id": inst["machine_id"]}
        if state in policy.STICKY_STATES:
            pass
        elif hb.phase == "failed":
            updates.update(state="failed", state_since=now)
        elif hb.phase == "terminating":
            updates.update(state="terminating", state_since=now)
        elif state != hb.phase:
            updates.update(state=hb.phase, state_since=now)
            if state == "lost":
                tx.insert_event(now, "recovered", "the agent spoke again after silence", **ids)
            tx.insert_event(now, "phase", f"{state} -> {hb.phase}", **ids)
        tx.update_instance(inst["id"], **updates)
        if state not in policy.STICKY_STATES and hb.phase in ("failed", "terminating"):
            fresh = tx.get_instance(inst["id"])
            assert fresh is not None
            reason = (
                "the agent reported failed" if hb.phase == "failed"
                else "the agent is terminating on its own"
            )
            _schedule_termination(
                tx, fresh, reason, now, settings.terminate_grace_s,
                kind="failed" if hb.phase == "failed" else "terminate",
            )
        tx.upsert_heartbeat(
            {
                "agent_id": agent_id,
                "instance_id": inst["id"],
                "received_at": now,
                "seq": hb.seq,
                "phase": hb.phase,
                "phase_started_at": hb.phase_started_at,
                "progress_json": updates["progress_json"],
                "proofs_completed_total": hb.proofs_completed_total,
                "proof_seconds_recent_json": dumps(hb.proof_seconds_recent),
            }
        )
        telemetry_json = dumps(asdict(hb.telemetry)) if hb.telemetry is not None else None
        if telemetry_json is not None:
            tx.upsert_telemetry(inst["id"], now, telemetry_json)
        tx.append_heartbeat_history(
            {
                "agent_id": agent_id,
                "instance_id": inst["id"],
                "received_at": now,
                "seq": hb.seq,
                "phase": hb.phase,
                "proofs_completed_total": hb.proofs_completed_total,
                "telemetry_json": telemetry_json,
            },
            interval_s=settings.heartbeat_history_interval_s,
            keep_rows=settings.heartbeat_history_rows,
        )
        fresh = tx.get_instance(inst["id"])
        assert fresh is not None
        return inst["id"], _take_directive(tx, fresh, settings, now)

    return job


# --- result ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResultOutcome:
    instance_id: int
    duplicate: bool
    directive: Directive
    terminate: bool  # a destroy was scheduled by this result


def _scaling_diagnosis(result: Result, inst: Row) -> tuple[float, float, Any] | None:
    """(rate_all, rate_one, coordinator's Diagnosis or None) from the reported runs."""
    runs = result.runs or []
    if not runs:
        return None
    run_all = max(runs, key=lambda r: len(r.gpus_used))
    singles = [r for r in runs if len(r.gpus_used) == 1]
    if not singles:
        return None
    rate_all, rate_one = run_all.rate_per_hour, singles[0].rate_per_hour
    try:
        from protocol import scaling as scaling_module
    except ImportError:
        return rate_all, rate_one, None
    gpus = []
    if inst.get("host_json"):
        try:
            gpus = from_obj(HostInfo, loads(inst["host_json"])).gpus
        except ValueError:
            gpus = []
    num_gpus = max(len(run_all.gpus_used), 1)
    diagnosis = scaling_module.diagnose(num_gpus, rate_all, rate_one, run_all.telemetry, gpus)
    return rate_all, rate_one, diagnosis


def result_job(
    agent_id: str, result: Result, settings: Settings, now: float
) -> Callable[[Tx], ResultOutcome]:
    limits = policy.PolicyLimits.from_settings(settings)

    def job(tx: Tx) -> ResultOutcome:
        inst = _require_instance(tx, agent_id)
        existing = tx.find_result(agent_id, result.result_id)
        if existing is not None:
            return ResultOutcome(
                inst["id"], True, directive_from_json(existing["directive_json"]), False
            )
        ids = {"instance_id": inst["id"], "agent_id": agent_id, "machine_id": inst["machine_id"]}
        machine_id = inst["machine_id"] or inst["label"]
        gpu_name = inst["gpu_name"] or "unknown"
        num_gpus = inst["num_gpus"] or max(len(result.gpus_used), 1)
        seen_from = inst["last_non_benchmark_at"] or inst["hello_at"]
        observed = None if seen_from is None else max(0.0, now - float(seen_from))
        contended = [
            int(o["id"])
            for o in tx.active_instances_on_machine(machine_id, exclude_instance_id=inst["id"])
            if o["state"] not in ("deploying",)
        ]
        check = policy.check_result(
            result, observed_max_seconds=observed, limits=limits, contended_with=contended
        )
        rate = check.recomputed_rate_per_hour
        inst_updates: dict[str, Any] = {"last_seen": now, "updated_at": now}
        verdict: policy.Verdict | None = None
        terminate = False
        already_ending = inst["state"] in policy.STICKY_STATES or bool(inst["terminate_reason"])
        if result.kind == "benchmark":
            verdict = policy.benchmark_verdict(check, inst["min_rate_per_hour"])
            if not check.implausible and rate is not None:
                inst_updates["rate_per_hour"] = rate
            if check.reasons:
                tx.insert_event(now, "flagged", "; ".join(check.reasons), **ids)
            if already_ending:
                pass  # already on its way out; the result is kept as evidence only
            elif verdict.action == "terminate":
                terminate = True
                tx.insert_event(now, "verdict", f"terminate: {verdict.reason}", **ids)
                if verdict.bad_host:
                    tx.add_bad_host(
                        machine_id, reason=verdict.reason, source="benchmark", now=now,
                        instance_id=inst["id"],
                    )
                    tx.insert_event(now, "bad_host", f"{machine_id}: {verdict.reason}", **ids)
            else:
                tx.insert_event(now, "verdict", f"keep: {verdict.reason}", **ids)
        tx.update_instance(inst["id"], **inst_updates)
        if terminate and verdict is not None:
            tx.update_instance(
                inst["id"], state="terminating", state_since=now,
                terminate_reason=verdict.reason, destroy_due_at=now + settings.terminate_grace_s,
            )
        fresh = tx.get_instance(inst["id"])
        assert fresh is not None
        directive = _take_directive(tx, fresh, settings, now)
        counts = (
            result.kind == "benchmark" and check.counts_for_host_perf and rate is not None
        )
        row_id = tx.insert_result(
            {
                "agent_id": agent_id,
                "result_id": result.result_id,
                "instance_id": inst["id"],
                "kind": result.kind,
                "proof_type": result.proof_type,
                "started_at": result.started_at,
                "finished_at": result.finished_at,
                "gpus_used_json": dumps(result.gpus_used),
                "proofs_completed": result.proofs_completed,
                "proofs_failed": result.proofs_failed,
                "wall_seconds": result.wall_seconds,
                "rate_per_hour": result.rate_per_hour,
                "recomputed_rate_per_hour": rate,
                "proof_seconds_json": dumps(result.proof_seconds),
                "telemetry_json": dumps(asdict(result.telemetry)) if result.telemetry else None,
                "runs_json": dumps([asdict(r) for r in result.runs]) if result.runs else None,
                "efficiency": result.efficiency,
                "bottleneck": result.bottleneck,
                "evidence_json": dumps(result.evidence),
                "flags": ",".join(check.flags),
                "flag_reasons_json": dumps(check.reasons),
                "counts_for_host_perf": int(counts),
                "verdict": verdict.action if verdict else None,
                "verdict_reason": verdict.reason if verdict else None,
                "directive_json": dumps(directive_to_dict(directive)),
                "machine_id": machine_id,
                "gpu_name": gpu_name,
                "num_gpus": num_gpus,
                "received_at": now,
            }
        )
        if counts and rate is not None:
            tx.record_measurement(
                machine_id=machine_id, gpu_name=gpu_name, num_gpus=num_gpus,
                rate_per_hour=rate, dph_total=inst["dph_total"], now=now,
            )
        if result.kind == "scaling":
            _record_scaling(tx, result, fresh, row_id, machine_id, gpu_name, num_gpus, now)
        return ResultOutcome(inst["id"], False, directive, terminate)

    return job


def _record_scaling(
    tx: Tx,
    result: Result,
    inst: Row,
    row_id: int,
    machine_id: str,
    gpu_name: str,
    num_gpus: int,
    now: float,
) -> None:
    try:
        found = _scaling_diagnosis(result, inst)
    except Exception:  # a diagnosis bug must not lose the agent's result
        log.exception("scaling diagnosis failed for result %s", row_id)
        found = None
    rate_all, rate_one, diagnosis = found if found else (None, None, None)
    tx.insert_scaling(
        {
            "result_row_id": row_id,
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
            "evidence_json": dumps(getattr(diagnosis, "evidence", None)),
            "created_at": now,
        }
    )
    if diagnosis is not None:
        eff = diagnosis.efficiency
        text = "?" if eff is None else f"{eff:.2f}"
        reason = f"efficiency {text}, bottleneck {diagnosis.bottleneck} (coordinator's reading)"
    else:
        reason = f"agent reports efficiency {result.efficiency}, bottleneck {result.bottleneck}"
    tx.insert_event(
        now, "scaling", reason,
        instance_id=inst["id"], agent_id=inst["agent_id"], machine_id=machine_id,
    )


# --- logs --------------------------------------------------------------------------


def logs_job(
    agent_id: str, batch: LogBatch, settings: Settings, now: float
) -> Callable[[Tx], int]:
    def job(tx: Tx) -> int:
        inst = _require_instance(tx, agent_id)
        tx.update_instance(inst["id"], last_seen=now)
        return tx.insert_logs(
            inst["id"], agent_id, now,
            ((line.ts, line.source, line.text) for line in batch.lines),
            keep_lines=settings.log_lines_per_instance,
        )

    return job
