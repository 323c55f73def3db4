"""A heartbeat: the instance's gauges, phase and pace written in one ``Tx.heartbeats.write``
and answered; a steady heartbeat (most of a fleet's) from the writer's cached view alone, a
benchmarking one also judged for an early verdict (``verdict_tracking``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from vast_manager.coordinator.decisions import pace, policy, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.directives import (
    CONFIRM,
    agent_pace_s,
    current,
    directive_for_row,
    require_instance,
)
from vast_manager.coordinator.operations.verdict_tracking import judge_early
from vast_manager.coordinator.rows import InstanceRow, with_columns
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import dumps
from vast_manager.coordinator.store.writer import Ending, Gauges, HeartbeatWrite, Tx
from vast_manager.protocol.messages import Directive, Heartbeat


class SteadyFields(NamedTuple):
    """What a steady heartbeat writes, its JSON columns already encoded: all a heartbeat
    job needs unless the heartbeat moves the instance's state."""

    seq: int
    phase: str
    phase_started_at: float | None
    progress_json: str | None
    proofs_completed_total: int
    proof_seconds_recent_json: str
    telemetry_json: str | None
    net_rx_bytes: int | None = None  # the agent's NIC counters, when it reports them
    net_tx_bytes: int | None = None


def steady_fields(hb: Heartbeat) -> SteadyFields:
    return SteadyFields(
        hb.seq, hb.phase, hb.phase_started_at,
        dumps(hb.progress) if hb.progress else None,
        hb.proofs_completed_total,
        orjson.dumps(hb.proof_seconds_recent).decode(),
        dumps(hb.telemetry) if hb.telemetry is not None else None,
        hb.net_bytes_total.rx if hb.net_bytes_total is not None else None,
        hb.net_bytes_total.tx if hb.net_bytes_total is not None else None,
    )


def _steady(hot: InstanceRow, f: SteadyFields) -> bool:
    """A heartbeat that only moves the instance's gauges: the same phase as its state, in
    order, nothing for early verdicts to judge. Most heartbeats of a fleet are steady."""
    last_seq = hot["last_seq"]
    return (
        (last_seq is None or f.seq > last_seq)
        and f.phase == hot["state"]
        and f.phase != State.BENCHMARKING
        and hot["state"] not in states.ENDING
    )


def heartbeat_job(
    agent_id: str, hb: Heartbeat, settings: Settings, now: float,
    fleet: pace.FleetLoad = pace.NO_AGENTS, rng: pace.RandomSource | None = None,
) -> Callable[[Tx], tuple[int, Directive]]:
    """One pass: read the instance, decide everything (``decide_steady``, else
    ``decide_heartbeat``), write it in one ``Tx.heartbeats.write``, answer.

    ``fleet``: the agents heard from, which set the pace (none: the base pace); ``rng``:
    its jitter (None: none). A benchmarking heartbeat of a fleet with early verdicts is
    then judged (``judge_early``: the benchmark's own record), and answered from what
    the judgement left."""
    fields = steady_fields(hb)

    def job(tx: Tx) -> tuple[int, Directive]:
        hot = tx.heartbeats.view(agent_id)
        if hot is not None and _steady(hot, fields):
            pace_now = pace.answer_s(hot["state"], fleet, settings, rng)
            write, directive = decide_steady(hot, agent_id, fields, settings, now, pace_now)
            tx.heartbeats.write(write)
            return hot["id"], directive
        inst = require_instance(tx, agent_id)
        write, after = decide_heartbeat(inst, agent_id, hb, fields, settings, now, fleet, rng)
        pace_now = agent_pace_s(after, settings)
        tx.heartbeats.write(write)
        if not _judged_early(inst, hb, settings):
            return inst["id"], directive_for_row(after, pace_now)
        judge_early(tx, inst, hb, settings, now)
        return inst["id"], directive_for_row(current(tx, inst["id"]), pace_now)

    return job


def _history(agent_id: str, instance_id: int, f: SteadyFields, now: float) -> tuple[Any, ...]:
    """The heartbeat's ``heartbeat_history`` row (``store.writer.HISTORY_ROW`` order)."""
    return (agent_id, instance_id, now, f.seq, f.phase, f.proofs_completed_total,
            f.telemetry_json)


def decide_steady(
    hot: InstanceRow, agent_id: str, f: SteadyFields, settings: Settings, now: float, pace_now: int,
) -> tuple[HeartbeatWrite, Directive]:
    """What a steady heartbeat writes (its instance's gauges, which are its latest
    heartbeat too, and the pace it is answered, held by the writer and written with the
    others of its transaction; its telemetry and history) and its answer, from ``hot``
    (the writer's cached view of the instance) alone."""
    instance_id = hot["id"]
    directive = directive_for_row(hot, pace_now)
    write = HeartbeatWrite(
        instance_id, agent_id, hot["machine_id"], now,
        # A steady heartbeat is never a benchmarking one, hence last_non_benchmark_at.
        gauges=Gauges(
            last_seq=f.seq, last_seen=now, phase=f.phase, phase_started_at=f.phase_started_at,
            progress_json=f.progress_json, proofs_completed_total=f.proofs_completed_total,
            updated_at=now, last_non_benchmark_at=now, heartbeat_at=now,
            proof_seconds_recent_json=f.proof_seconds_recent_json, heartbeat_pace_s=pace_now,
            net_rx_bytes=f.net_rx_bytes, net_tx_bytes=f.net_tx_bytes),
        telemetry_json=f.telemetry_json, history=_history(agent_id, instance_id, f, now),
        history_interval_s=settings.heartbeat_history_interval_s,
        history_keep_rows=settings.heartbeat_history_rows,
    )
    return write, directive


def decide_heartbeat(
    inst: InstanceRow, agent_id: str, hb: Heartbeat, f: SteadyFields, settings: Settings,
    now: float, fleet: pace.FleetLoad, rng: pace.RandomSource | None,
) -> tuple[HeartbeatWrite, InstanceRow]:
    """What any other heartbeat writes, and the instance as it will then read (what its
    answer is decided on; ``heartbeat_pace_s`` holds the pace answered)."""
    ids = (inst["id"], agent_id, inst["machine_id"], now)
    last_seq = inst["last_seq"]
    if last_seq is not None and hb.seq <= last_seq:
        # Late or out of order within this boot: it must not move the phase back.
        pace_now = pace.answer_s(inst["state"], fleet, settings, rng)
        late = {"last_seen": now, "heartbeat_pace_s": pace_now}
        return HeartbeatWrite(*ids, updates=late), with_columns(inst, late)
    updates: dict[str, Any] = {
        "last_seq": hb.seq,
        "last_seen": now,
        "phase": hb.phase,
        "phase_started_at": hb.phase_started_at,
        "progress_json": f.progress_json,
        "proofs_completed_total": hb.proofs_completed_total,
        "updated_at": now,
        "heartbeat_at": now,
        "proof_seconds_recent_json": f.proof_seconds_recent_json,
        "net_rx_bytes": f.net_rx_bytes,
        "net_tx_bytes": f.net_tx_bytes,
    }
    if hb.phase != State.BENCHMARKING:
        updates["last_non_benchmark_at"] = now
    else:
        updates["benchmarking_seen_at"] = now
    if inst["directed_benchmark_kind"] == CONFIRM and inst["directed_benchmark_id"]:
        # A confirmation is watched for its whole length: the longest silence counts.
        last = float(inst["confirm_watch_at"] or inst["directed_benchmark_at"] or now)
        updates["confirm_watch_gap_s"] = max(float(inst["confirm_watch_gap_s"] or 0.0),
                                             now - last)
        updates["confirm_watch_at"] = now
    state = inst["state"]
    events: list[tuple[str, str]] = []
    if state in states.ENDING:
        pass
    elif hb.phase in states.ENDING_PHASES:
        updates.update(state=hb.phase, state_since=now)
    elif state != hb.phase:
        updates.update(state=hb.phase, state_since=now)
        if state == State.LOST:
            events.append(("recovered", "the agent spoke again after silence"))
        events.append(("phase", f"{state} -> {hb.phase}"))
        if hb.phase == State.BENCHMARKING and inst["rebenchmark_pending"]:
            # The agent acted on the benchmark it was asked for: it is asked no more.
            updates["rebenchmark_pending"] = 0
            events.append(("rebenchmark", "the agent began the benchmark it was asked for"))
    updates["heartbeat_pace_s"] = pace.answer_s(updates.get("state", state), fleet, settings,
                                                rng)
    after = with_columns(inst, updates)
    ending: Ending | None = None
    if state not in states.ENDING and hb.phase in states.ENDING_PHASES:
        failed = hb.phase == State.FAILED
        reason = (
            ("the agent reported failed: " + hb.failure if hb.failure
             else "the agent reported failed") if failed
            else "the agent is terminating on its own"
        )
        ending = Ending(reason, "failed" if failed else "terminate",
                        now + settings.terminate_grace_s,
                        # A trial that failed (a crash, a download or container failure)
                        # counts against its machine (docs/policy.md, "Strikes").
                        policy.StrikeRule.from_settings(settings) if failed else None,
                        failed_in=state)
        # As ``Tx.instances.begin_terminating`` leaves it: the first reason given stands.
        after["terminate_reason"] = after["terminate_reason"] or reason
    write = HeartbeatWrite(
        *ids, updates=updates, events=tuple(events), ending=ending,
        telemetry_json=f.telemetry_json, history=_history(agent_id, inst["id"], f, now),
        history_interval_s=settings.heartbeat_history_interval_s,
        history_keep_rows=settings.heartbeat_history_rows,
    )
    return write, after


def _judged_early(inst: InstanceRow, hb: Heartbeat, settings: Settings) -> bool:
    """Whether this heartbeat's benchmark progress is judged for an early verdict."""
    return bool(settings.verdict_early and hb.phase == State.BENCHMARKING
                and inst["state"] not in states.ENDING and not inst["terminate_reason"])
