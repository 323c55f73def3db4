"""A result: checked (plausibility, belief), judged (the benchmark's verdict), written in
one ``Tx.results.write`` with its measurement and scaling reading, answered; a replayed
result gets the answer it got the first time."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.decisions import pace, policy, states
from vast_manager.coordinator.decisions.early_verdict import steady_state_rate_per_hour
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.measurements import instance_offer
from vast_manager.coordinator.operations.beliefs import Belief, Expectation, judge_belief
from vast_manager.coordinator.operations.directives import (
    agent_pace_s,
    directive_for_row,
    directive_from_json,
    directive_to_dict,
    require_instance,
    time_scale,
)
from vast_manager.coordinator.operations.scaling_reading import scaling_of
from vast_manager.coordinator.operations.verdict_tracking import (
    BENCH_CLOSED,
    BENCH_OPEN,
    BENCH_PASSED,
)
from vast_manager.coordinator.rows import InstanceRow, instance_row, with_columns
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import dumps, loads
from vast_manager.coordinator.store.writer import Ending, ResultWrite, Tx
from vast_manager.protocol.messages import Directive, Result

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class ResultOutcome:
    instance_id: int
    duplicate: bool
    directive: Directive
    terminate: bool  # a destroy was scheduled by this result
    flood: str | None = None  # policy.THROTTLED or policy.REVOKED: too many unasked results


def _verdict_ending(verdict: policy.Verdict | None, settings: Settings,
                    now: float) -> Ending | None:
    """The end a terminate verdict brings (None: none)."""
    if verdict is None or verdict.action != "terminate":
        return None
    return Ending(verdict.reason, "verdict", now + settings.terminate_grace_s,
                  note=f"terminate: {verdict.reason}",
                  bad_host_source="benchmark" if verdict.bad_host else None,
                  # its block lasts VM_STRIKE_BLOCK_S, as a strikes block does
                  strike=policy.StrikeRule.from_settings(settings) if verdict.bad_host else None)


def _flood_ending(flood: str | None, settings: Settings, now: float) -> Ending | None:
    """The end of an instance whose agent's key a flood revoked (None: no such flood)."""
    if flood != policy.REVOKED:
        return None
    return Ending(f"its agent sent {policy.FLOOD_REVOKE_AT} results nobody asked for within "
                  f"{policy.FLOOD_WINDOW_S / 3600:.0f} h", "flood",
                  now + settings.terminate_grace_s, bad_host_source="flood")


def _unrequested(tx: Tx, inst: InstanceRow, check: policy.Plausibility, row: dict[str, Any],
                 now: float) -> str | None:
    """A result nobody asked for (undirected, after a terminate) is kept as a summary:
    its counts, rates, flags and reasons, not its proof times, telemetry, runs or
    evidence (``row`` is changed in place). Returns what the flood allowance says
    (``policy.flood_action``); a throttle and a revoke each write one event, the
    revoke revokes the agent's key."""
    if not set(check.flags) & policy.UNREQUESTED_FLAGS:
        return None
    left_out = [c for c in ("proof_seconds_json", "telemetry_json", "runs_json",
                            "evidence_json") if row.get(c) is not None]
    for col in left_out:
        row[col] = None
    reasons = list(loads(row["flag_reasons_json"]) or [])
    reasons.append("stored as a summary (nobody asked for it): " + ", ".join(
        c.removesuffix("_json").replace("_", " ") for c in left_out) + " left out")
    row["flag_reasons_json"] = dumps(reasons)
    agent_id = str(inst["agent_id"])
    count = tx.unrequested_results_since(agent_id, now - policy.FLOOD_WINDOW_S) + 1
    action = policy.flood_action(count)
    ids: dict[str, Any] = {"instance_id": inst["id"], "agent_id": agent_id,
                           "machine_id": inst["machine_id"]}
    window = f"{policy.FLOOD_WINDOW_S / 3600:.0f} h"
    if count == policy.FLOOD_THROTTLE_AT:
        tx.audit.add(now, "throttled", f"{count} results nobody asked for within {window}: "
                        f"answered 429 from now on; its key is revoked at "
                        f"{policy.FLOOD_REVOKE_AT}", **ids)
    if action == policy.REVOKED and tx.agents.revoke(
            agent_id, now=now, reason=f"{count} results nobody asked for within {window}"):
        tx.audit.add(now, "revoked", f"{count} results nobody asked for within {window}: "
                        "its key is revoked and its instance ended", **ids)
    return action


def _steady_rate(
    result: Result, inst: InstanceRow, settings: Settings, gpus: int
) -> tuple[float | None, int | None]:
    """The steady-state rate of a finished benchmark (early verdicts on), and its concurrency.

    The concurrency is the one the run's heartbeats announced; without it (an
    older agent, early verdicts off, a run already judged) the batch rate judges.
    """
    concurrency = inst["bench_concurrency"]
    if (not settings.verdict_early or not concurrency
            or inst["bench_status"] not in (BENCH_OPEN, BENCH_PASSED)):
        return None, None
    # Above the cap is read as the cap, as the early verdict reads it.
    j = min(int(concurrency), settings.max_concurrency_per_gpu * gpus)
    rate = steady_state_rate_per_hour(
        list(result.proof_seconds), j, result.wall_seconds,
        proofs_failed=result.proofs_failed, tolerance=settings.rate_tolerance,
    )
    return (rate, j) if rate is not None else (None, None)


def reported_gpus(inst: InstanceRow) -> frozenset[int] | None:
    """The GPU indexes of the instance's hello (None before its first hello)."""
    host = loads(inst.get("host_json"))
    if not isinstance(host, dict) or not isinstance(host.get("gpus"), list):
        return None
    return frozenset(
        g["index"] for g in host["gpus"]
        if isinstance(g, dict) and isinstance(g.get("index"), int)
        and not isinstance(g.get("index"), bool)
    )


def measured_rates(tx: Tx, inst: InstanceRow) -> dict[int, float]:
    """GPU count -> the recomputed rate of the instance's latest counted benchmark result
    on that many GPUs (the coordinator's own figures for a scaling diagnosis)."""
    rates: dict[int, float] = {}
    for row in tx.results_for_instance(inst["id"]):  # oldest first: the latest wins
        rate = row["recomputed_rate_per_hour"]
        if row["kind"] == "benchmark" and row["counts_for_host_perf"] and rate is not None:
            rates[max(1, len(set(loads(row["gpus_used_json"]) or [])))] = float(rate)
    return rates


def watch_of(inst: InstanceRow, settings: Settings, now: float,
             measured: dict[int, float] | None = None,
             watching_since: float | None = None, receipted: bool = False) -> policy.Watch:
    """What the coordinator saw of an instance, for judging its next result."""
    entered = inst["last_non_benchmark_at"] or inst["hello_at"]
    used = inst["result_window_at"]
    after_result = entered is not None and used is not None and float(used) >= float(entered)
    window_start = float(used) if used is not None and after_result else entered
    seen = inst["benchmarking_seen_at"]
    state = inst["state"]
    terminated = inst["terminate_reason"] or (
        f"the instance is {state}" if state in states.ENDING else None)
    return policy.Watch(
        now=now,
        window_start=None if window_start is None else float(window_start),
        window_after_result=after_result,
        benchmarking_seen=seen is not None and entered is not None
        and float(seen) >= float(entered),
        reported_gpus=reported_gpus(inst),
        # A deployed instance rents the offer's GPUs, whatever its hello says.
        max_gpus=(inst["num_gpus"] or None) if inst["kind"] == "deployed" else None,
        time_scale=time_scale(inst, settings),
        terminated=terminated,
        pace_s=agent_pace_s(inst, settings),
        watching_since=watching_since,
        receipted=receipted,
        measured_rates=measured or {},
        gpu_name=inst.get("gpu_name"),
        gpu_mem_bw_gbps=_offer_mem_bw(inst),
    )


def _offer_mem_bw(inst: InstanceRow) -> float | None:
    """A deployed instance's offer's ``gpu_mem_bw`` (vast.ai's per-host figure); a
    bring-your-own agent has no offer of vast.ai's."""
    if inst.get("kind") != "deployed":
        return None
    raw = loads(inst.get("offer_json"))
    value = raw.get("gpu_mem_bw") if isinstance(raw, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0 else None


def result_job(
    agent_id: str, result: Result, settings: Settings, now: float,
    watching_since: float | None = None, fleet: pace.FleetLoad = pace.NO_AGENTS,
    expect: Expectation | None = None, rng: pace.RandomSource | None = None,
    receipted: bool = False,
) -> Callable[[Tx], ResultOutcome]:
    """``watching_since``: when this coordinator process started (``policy.Watch``);
    ``fleet``: the agents heard from, which set the pace (none: the base pace), ``rng``
    its jitter (None: none);
    ``expect``: the rate model's 90th percentile for the instance's hardware;
    ``receipted``: it carries this fleet's receipt, a result sent again after a restore
    (``operations.replay``). Its spool sequence raises the agent's mark, a duplicate's too."""
    limits = policy.PolicyLimits.from_settings(settings)

    def job(tx: Tx) -> ResultOutcome:
        outcome = judged_and_written(tx)
        if result.spool_seq is not None:
            tx.replay.raise_to(agent_id, "result", result.spool_seq)
        return outcome

    def judged_and_written(tx: Tx) -> ResultOutcome:
        inst = require_instance(tx, agent_id)
        existing = tx.find_result(agent_id, result.result_id)
        if existing is not None:
            return _replayed(tx, inst, existing)
        # A deployed instance has its machine, a bring-your-own agent its label.
        machine_id = inst["machine_id"] or inst["label"] or "unknown"
        gpu_name = inst["gpu_name"] or "unknown"
        num_gpus = inst["num_gpus"] or max(len(set(result.gpus_used)), 1)
        watch = watch_of(inst, settings, now,
                         measured_rates(tx, inst) if result.kind == "scaling" else None,
                         watching_since, receipted)
        check = policy.check_result(result, watch=watch, limits=limits,
                                    contended_with=_contended_with(tx, inst, machine_id))
        rate = check.recomputed_rate_per_hour
        # Each result uses up the benchmarking seen before it: the next claims what follows.
        inst_updates: dict[str, Any] = {"last_seen": now, "updated_at": now,
                                        "result_window_at": now}
        events: list[tuple[str, str]] = []
        already_ending = watch.terminated is not None
        judged = _belief(tx, inst, result, check, settings, now, expect, inst_updates,
                         events, already_ending)
        if judged.counted_rate is not None:  # the lower of a claim and its confirmation
            rate = check.recomputed_rate_per_hour = judged.counted_rate
        # Everything read: from here on only decisions, then one write.
        if check.reasons:
            events.append(("flagged", "; ".join(check.reasons)))
        verdict = None
        if result.kind == "benchmark" or check.implausible:
            verdict = _benchmark_verdict(result, inst, settings, check, judged, already_ending,
                                         inst_updates, events)
        terminate = verdict is not None and verdict.action == "terminate"
        ending = _verdict_ending(verdict, settings, now)
        after = _after_result(inst, inst_updates, ending)
        pace_now = pace.answer_s(after["state"], fleet, settings, rng)
        directive = directive_for_row(after, pace_now)
        counts = result.kind == "benchmark" and check.counts_for_host_perf and rate is not None
        row = _result_row(agent_id, result, inst, check, verdict, directive, counts, now) | {
            "machine_id": machine_id, "gpu_name": gpu_name, "num_gpus": num_gpus}
        flood = _unrequested(tx, inst, check, row, now)
        ending = ending or _flood_ending(flood, settings, now)
        measurement = None if not counts or rate is None else _fleet_measurement(
            inst, machine_id, gpu_name, num_gpus, rate, now, judged.model_cap)
        scaling = scaling_of(result, after, (machine_id, gpu_name, num_gpus), check, watch,
                              terminate, now)
        tx.results.write(ResultWrite(
            inst["id"], agent_id, inst["machine_id"], now, inst_updates, tuple(events), row,
            ending=ending,
            pace_s=pace_now if pace_now != after["heartbeat_pace_s"] else None,
            measurement=measurement, scaling=scaling,
        ))
        return ResultOutcome(inst["id"], False, directive, terminate or ending is not None,
                             flood)

    return job


def _replayed(tx: Tx, inst: InstanceRow, existing: dict[str, Any]) -> ResultOutcome:
    """A result sent again: the same directive, its pace included (the agent's silence
    is timed on the pace it is given)."""
    replayed = directive_from_json(existing["directive_json"])
    tx.instances.update(inst["id"], heartbeat_pace_s=replayed.next_heartbeat_s)
    return ResultOutcome(inst["id"], True, replayed, False)


def _belief(tx: Tx, inst: InstanceRow, result: Result, check: policy.Plausibility,
            settings: Settings, now: float, expect: Expectation | None,
            updates: dict[str, Any], events: list[tuple[str, str]],
            already_ending: bool) -> Belief:
    """A benchmark's belief (``judge_belief``); anything else, an implausible result, or
    one on its way out counts as it is (its checks have already flagged it)."""
    rate = check.recomputed_rate_per_hour
    if result.kind != "benchmark" or check.implausible or already_ending or rate is None:
        return Belief(True)
    return judge_belief(tx, inst, result, check, rate, settings, now, expect, updates, events)


def _contended_with(tx: Tx, inst: InstanceRow, machine_id: str) -> list[int]:
    """Ours on the same machine at any time since this benchmark began (still active, or
    destroyed meanwhile, e.g. a doubly sold offer reconciled away); an instance that never
    said hello never ran a proof."""
    seen_from = inst["last_non_benchmark_at"] or inst["hello_at"]
    return [
        int(o["id"])
        for o in tx.instances_on_machine(machine_id, ("id", "hello_at", "destroyed_at"))
        if o["id"] != inst["id"]
        and o["hello_at"] is not None
        and (o["destroyed_at"] is None or seen_from is None
             or float(o["destroyed_at"]) >= float(seen_from))
    ]


def _benchmark_verdict(
    result: Result, inst: InstanceRow, settings: Settings, check: policy.Plausibility,
    judged: Belief, already_ending: bool, inst_updates: dict[str, Any],
    events: list[tuple[str, str]],
) -> policy.Verdict | None:
    """A benchmark's verdict (None: on its way out, or held: the result is evidence only);
    the instance's rate when it counts, and the keep event, go to ``inst_updates`` and
    ``events``."""
    steady, concurrency = _steady_rate(result, inst, settings, check.gpus)
    if inst["bench_status"] in (BENCH_OPEN, BENCH_PASSED):
        inst_updates["bench_status"] = BENCH_CLOSED  # the run is over: judge no more
    verdict = None
    if judged.terminate is not None:
        verdict = policy.Verdict("terminate", judged.terminate, True)
    elif not already_ending and judged.counts:
        verdict = policy.benchmark_verdict(
            check, inst["min_rate_per_hour"], steady_rate=steady, concurrency=concurrency,
            own_min_rate=inst.get("price_min_rate_per_hour"),
        )
    rate = check.recomputed_rate_per_hour
    if result.kind == "benchmark" and not check.implausible and not already_ending \
            and rate is not None and judged.counts:
        inst_updates["rate_per_hour"] = rate
    if verdict is not None and verdict.action != "terminate":
        events.append(("verdict", f"keep: {verdict.reason}"))
    return verdict


def _result_row(agent_id: str, result: Result, inst: InstanceRow, check: policy.Plausibility,
                verdict: policy.Verdict | None, directive: Directive, counts: bool,
                now: float) -> dict[str, Any]:
    """The ``results`` row, its hardware columns aside."""
    return {
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
        "recomputed_rate_per_hour": check.recomputed_rate_per_hour,
        "proof_seconds_json": dumps(result.proof_seconds),
        "telemetry_json": dumps(result.telemetry) if result.telemetry else None,
        "runs_json": dumps(result.runs) if result.runs else None,
        "efficiency": result.efficiency,
        "bottleneck": result.bottleneck,
        "evidence_json": dumps(result.evidence),
        "flags": ",".join(check.flags),
        "flag_reasons_json": dumps(check.reasons),
        "counts_for_host_perf": int(counts),
        "verdict": verdict.action if verdict else None,
        "verdict_reason": verdict.reason if verdict else None,
        "directive_json": dumps(directive_to_dict(directive)),
        "received_at": now,
        "benchmark_id": result.benchmark_id,
    }


def _fleet_measurement(inst: InstanceRow, machine_id: str, gpu_name: str, num_gpus: int,
                       rate: float, now: float, model_cap: float | None = None
                       ) -> dict[str, Any]:
    """The rate with the hardware it ran on: what the rate model learns from, and what
    host_perf is computed from. A bring-your-own agent names its own CPU and RAM in its
    hello: its measurement is ``host_reported``, shown in host_perf but kept out of the
    rate model and of other machines' twins (docs/reliability.md, "Judged by what
    it delivers")."""
    byo = inst["kind"] == "byo"
    offer = instance_offer(loads(inst.get("offer_json")),
                           loads(inst.get("host_json")) if byo else None,
                           instance_row({**inst, "machine_id": machine_id}))
    return {
        "machine_id": machine_id, "gpu_name": gpu_name, "num_gpus": num_gpus,
        "rate_per_hour": rate, "measured_at": now, "source": "fleet",
        "offer_json": dumps(offer), "instance_id": inst["id"], "recorded_at": now,
        "host_reported": int(byo), "model_cap_per_hour": model_cap,
    }


def _after_result(inst: InstanceRow, updates: dict[str, Any], ending: Ending | None) -> InstanceRow:
    """The instance as it reads once a result's write is done (what its answer is decided
    on): as ``Tx.instances.begin_terminating`` leaves it when the result ends it."""
    if ending is None:
        return with_columns(inst, updates)
    if inst["state"] in states.GONE:
        return inst  # nothing is written for an instance that is gone
    ended = {**updates, "terminate_reason": inst["terminate_reason"] or ending.reason}
    if inst["state"] not in states.ENDING:
        ended["state"] = State.TERMINATING
    return with_columns(inst, ended)
