"""What each agent message does to the store: write jobs for hello, heartbeat, result, logs.

Each function returns a job for ``Store.write``: it runs on the writer
thread inside one transaction, reads what it needs there (so two requests of
one agent can never interleave half-way), decides with ``policy`` and
records every decision in ``events``. The HTTP layer (``app.py``) only
decodes, calls these, and encodes the answer.
"""

from __future__ import annotations

import hmac
import logging
import math
import secrets
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple

import orjson

from vast_manager.common import scaling
from vast_manager.coordinator.decisions import belief, pace, policy, states
from vast_manager.coordinator.decisions.early_verdict import (
    EarlyVerdict,
    VerdictSettings,
    assess,
    steady_state_rate_per_hour,
)
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.features import canonical_gpu_name
from vast_manager.coordinator.discovery.measurements import instance_offer
from vast_manager.coordinator.exceptions import HelloRequired, InvalidInput, UnknownAgent
from vast_manager.coordinator.offers import Offer, OfferError, parse_offer, stored_offer
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row, dumps, loads
from vast_manager.coordinator.store.writer import Ending, HeartbeatWrite, ResultWrite, Tx
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import (
    Directive,
    Heartbeat,
    Hello,
    HostInfo,
    LogBatch,
    Progress,
    Result,
    ScalingRun,
)

log = logging.getLogger(__name__)


def directive_to_dict(d: Directive) -> dict[str, Any]:
    return asdict(d)


def directive_from_json(text: str) -> Directive:
    return from_obj(Directive, orjson.loads(text))


def agent_pace_s(inst: Row, settings: Settings) -> int:
    """The pace the instance's agent was last given (the base pace before any): every job
    stores the pace it answers (``pace.answer_s``, jitter included) in ``heartbeat_pace_s``, and the
    agent's silence is timed on it (docs/operations.md, "Heartbeat pace")."""
    return int(inst.get("heartbeat_pace_s") or settings.next_heartbeat_s)


def _take_directive(tx: Tx, inst: Row, settings: Settings, now: float,
                    next_heartbeat_s: int) -> Directive:
    """The directive for an instance now; a pending rebenchmark is delivered once."""
    directive = policy.directive_for(
        instance_row(inst),
        next_heartbeat_s=next_heartbeat_s,
        min_rate=inst.get("min_rate_per_hour"),
    )
    if directive.action == "benchmark":
        tx.deliver_rebenchmark(inst["id"], inst["agent_id"], inst["machine_id"], now)
    return directive


# --- directed benchmarks (docs/reliability.md, "No rate on a host's word alone") -----------

#: Why the coordinator directed a benchmark: the instance's first, the operator's
#: ``rebenchmark``, or the re-benchmark that must confirm a held claim.
FIRST, OPERATOR, CONFIRM = "first", "operator", "confirm"
#: Re-benchmarks asked for one held claim before the instance is terminated for it.
MAX_CONFIRM_TRIES = 2
#: GPUs a bring-your-own agent issued before GPUs were declared may list: vast.ai buckets
#: machines at 1, 2, 4 and 8 GPUs (docs/reliability.md, "No rate on a host's word
#: alone"), twice that.
LEGACY_MAX_GPUS = 16


def new_benchmark_id() -> str:
    """A directed benchmark's id: a nonce no host can guess before it is sent."""
    return "bm_" + secrets.token_hex(16)


def open_directed_benchmark(tx: Tx, inst: Row, kind: str, now: float) -> str:
    """Open a benchmark the coordinator directs: a fresh id (a nonce the host cannot
    guess) that the result must carry; a confirmation is also delivered as a
    ``benchmark`` directive, and its heartbeats are watched from now on."""
    benchmark_id = new_benchmark_id()
    updates: dict[str, Any] = {
        "directed_benchmark_id": benchmark_id, "directed_benchmark_at": now,
        "directed_benchmark_kind": kind, "confirm_watch_at": now, "confirm_watch_gap_s": 0.0,
        "updated_at": now,
    }
    if kind != FIRST:
        updates["rebenchmark_pending"] = 1
    tx.update_instance(inst["id"], **updates)
    return benchmark_id


def _directed(result: Result, inst: Row) -> tuple[bool, str]:
    """Whether ``result`` answers the instance's open directed benchmark, and if not, why.

    A result that carries an id must carry the open one. One without (an agent older than
    directed benchmarks) answers the open first or operator benchmark, never a
    confirmation: that needs the nonce."""
    open_id = inst.get("directed_benchmark_id")
    if open_id is None:
        return False, "no benchmark was asked for (each directed benchmark counts once)"
    given = result.benchmark_id
    if given is None:
        if inst.get("directed_benchmark_kind") == CONFIRM:
            return False, "a confirming re-benchmark must carry the benchmark_id it was given"
        return True, ""
    if not hmac.compare_digest(given.encode(), str(open_id).encode()):
        return False, "its benchmark_id is not the benchmark the coordinator asked for"
    return True, ""


def _watched_whole(result: Result, inst: Row, settings: Settings, now: float) -> str | None:
    """Why a confirming re-benchmark was not watched for its whole length, or None."""
    asked = inst.get("directed_benchmark_at")
    if asked is None:
        return "the coordinator has no record of asking for it"
    if result.started_at < float(asked) - policy.CLOCK_SKEW_S:
        return (f"it started {float(asked) - result.started_at:.0f} s before the coordinator "
                "asked for it")
    last = float(inst.get("confirm_watch_at") or asked)
    gap = max(float(inst.get("confirm_watch_gap_s") or 0.0), now - last)
    allowed = policy.silence_ttl_s(agent_pace_s(inst, settings), settings.silence_grace_s)
    if gap > allowed:
        return (f"the coordinator heard nothing from it for {gap:.0f} s while it ran "
                f"(at most {allowed:.0f} s)")
    return None


def time_scale(inst: Row, settings: Settings) -> float:
    """Simulated seconds per real second of this instance: the simulated fleet's scale
    for an instance we deployed (``VM_SIM_TIME_SCALE``, 1 outside a simulation), 1 for a
    bring-your-own agent, which is a real machine even beside a simulated fleet."""
    return settings.sim_time_scale if inst.get("kind") == "deployed" else 1.0


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


# --- hello -----------------------------------------------------------------------


def hello_job(
    agent_id: str, hello: Hello, settings: Settings, now: float,
    fleet: pace.FleetLoad = pace.NO_AGENTS, rng: pace.RandomSource | None = None,
) -> Callable[[Tx], tuple[int, Directive]]:
    """Record a hello; creates the instance of a bring-your-own agent (machine_id = label).

    ``fleet``: the agents heard from, which set the pace (none: the base pace); ``rng``:
    where the pace's jitter is drawn (None: no jitter)."""

    def job(tx: Tx) -> tuple[int, Directive]:
        agent = _require_agent(tx, agent_id)
        host = hello.host
        if agent["kind"] == "byo":
            _check_declared_gpus(agent, host)
        inst = tx.instance_by_agent(agent_id) or _byo_instance(tx, agent, host, now)
        new_boot = inst["boot_id"] != hello.boot_id
        updates: dict[str, Any] = {
            "boot_id": hello.boot_id,
            "agent_version": hello.agent_version,
            "container_id": hello.container_id,
            "host_json": dumps(host),  # orjson encodes dataclasses itself
            "hello_at": now,
            "last_seen": now,
            "last_non_benchmark_at": now,
            "updated_at": now,
        }
        if new_boot:
            updates["last_seq"] = -1  # a new agent process counts seq from scratch
        if inst["hello_at"] is None and inst["directed_benchmark_id"] is None \
                and inst["state"] not in states.ENDING:
            # The first hello: the benchmark the agent runs after warming up is one the
            # coordinator asked for (its id travels on every directive until answered).
            open_directed_benchmark(tx, inst, FIRST, now)
        if inst["state"] in states.UNHEARD:
            updates["state"] = State.BOOTING
            updates["state_since"] = now
        pace_now = updates["heartbeat_pace_s"] = pace.answer_s(
            updates.get("state", inst["state"]), fleet, settings, rng)
        tx.update_instance(inst["id"], **updates)
        if new_boot:
            tx.insert_event(
                now, "hello", f"agent {hello.agent_version} started (boot {hello.boot_id})",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        if inst["state"] == State.LOST:
            tx.insert_event(
                now, "recovered", "the agent spoke again after silence",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        _check_gpu_count(tx, inst, len(host.gpus), now)
        fresh = tx.get_instance(inst["id"])
        assert fresh is not None
        return fresh["id"], _take_directive(tx, fresh, settings, now, pace_now)

    return job


def _byo_instance(tx: Tx, agent: Row, host: HostInfo, now: float) -> Row:
    """The instance an agent without one gets at its first hello: a bring-your-own
    agent's, its machine_id the label."""
    agent_id = agent["agent_id"]
    machine_id = agent["label"] if agent["kind"] == "byo" else None
    instance_id = tx.insert_instance(
        {
            "agent_id": agent_id,
            "label": agent["label"],
            "kind": agent["kind"],
            "state": State.BOOTING,
            "state_since": now,
            "machine_id": machine_id,
            "gpu_name": next((g.name for g in host.gpus if g.name), None),
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
    return inst


def _check_gpu_count(tx: Tx, inst: Row, seen: int, now: float) -> None:
    """An event when a deployed instance's agent sees other than the offer's GPU count."""
    expected = inst["num_gpus"]
    if inst["kind"] == "deployed" and expected is not None and expected != seen:
        tx.insert_event(
            now, "hardware_mismatch",
            f"the offer promised {expected} GPUs, the agent sees {seen}",
            instance_id=inst["id"], agent_id=inst["agent_id"], machine_id=inst["machine_id"],
        )


def _check_declared_gpus(agent: Row, host: HostInfo) -> None:
    """A bring-your-own hello lists at most the GPUs its agent was issued for, of the
    declared model (``agents issue --gpus N --gpu-model M``); InvalidInput otherwise."""
    declared = agent.get("max_gpus")
    limit = int(declared) if declared is not None else LEGACY_MAX_GPUS
    listed = len(host.gpus)
    if listed > limit:
        how = (f"was issued for {limit} GPU(s)" if declared is not None
               else f"was issued before GPUs were declared (at most {limit})")
        raise InvalidInput(
            f"This agent {how}; its hello lists {listed}. Issue a new agent with "
            f"'vast-manager agents issue --gpus {listed}'.", field="host.gpus")
    model = agent.get("gpu_model")
    if model:
        for g in host.gpus:
            if not g.name or canonical_gpu_name(g.name) != model:
                raise InvalidInput(
                    f"This agent was issued for {model} GPUs; its hello lists GPU {g.index} "
                    f"as {g.name!r}.", field="host.gpus")


# --- heartbeat -------------------------------------------------------------------


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
    # orjson encodes the dataclasses directly: asdict() deep-copies, the costliest step.
    return SteadyFields(
        hb.seq, hb.phase, hb.phase_started_at,
        dumps(hb.progress) if hb.progress else None,
        hb.proofs_completed_total,
        orjson.dumps(hb.proof_seconds_recent).decode(),
        dumps(hb.telemetry) if hb.telemetry is not None else None,
        hb.net_bytes_total.rx if hb.net_bytes_total is not None else None,
        hb.net_bytes_total.tx if hb.net_bytes_total is not None else None,
    )


def _steady(hot: Row, f: SteadyFields) -> bool:
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
    ``decide_heartbeat``), write it in one ``Tx.write_heartbeat``, answer.

    ``fleet``: the agents heard from, which set the pace (none: the base pace); ``rng``:
    its jitter (None: none). A benchmarking heartbeat of a fleet with early verdicts is
    then judged (``_judge_early``: the benchmark's own record), and answered from what
    the judgement left."""
    fields = steady_fields(hb)

    def job(tx: Tx) -> tuple[int, Directive]:
        hot = tx.heartbeat_view(agent_id)
        if hot is not None and _steady(hot, fields):
            pace_now = pace.answer_s(hot["state"], fleet, settings, rng)
            write, directive = decide_steady(hot, agent_id, fields, settings, now, pace_now)
            tx.write_heartbeat(write)
            return hot["id"], directive
        inst = _require_instance(tx, agent_id)
        write, after = decide_heartbeat(inst, agent_id, hb, fields, settings, now, fleet, rng)
        pace_now = int(after["heartbeat_pace_s"])
        if not _judged_early(inst, hb, settings):
            directive = _directive(after, pace_now)
            tx.write_heartbeat(write._replace(benchmark_delivered=directive.action == "benchmark"))
            return inst["id"], directive
        tx.write_heartbeat(write)
        _judge_early(tx, inst, hb, settings, now)
        fresh = tx.get_instance(inst["id"])
        assert fresh is not None
        return inst["id"], _take_directive(tx, fresh, settings, now, pace_now)

    return job


def _directive(inst: Row, pace_now: int) -> Directive:
    return policy.directive_for(instance_row(inst), next_heartbeat_s=pace_now,
                                min_rate=inst.get("min_rate_per_hour"))


def _history(agent_id: str, instance_id: int, f: SteadyFields, now: float) -> tuple[Any, ...]:
    """The heartbeat's ``heartbeat_history`` row (``store.writer.HISTORY_ROW`` order)."""
    return (agent_id, instance_id, now, f.seq, f.phase, f.proofs_completed_total,
            f.telemetry_json)


def decide_steady(
    hot: Row, agent_id: str, f: SteadyFields, settings: Settings, now: float, pace_now: int,
) -> tuple[HeartbeatWrite, Directive]:
    """What a steady heartbeat writes (its instance's gauges, which are its latest
    heartbeat too, and the pace it is answered, held by the writer and written with the
    others of its transaction; its telemetry and history) and its answer, from ``hot``
    (the writer's cached view of the instance) alone."""
    instance_id = hot["id"]
    directive = _directive(hot, pace_now)
    write = HeartbeatWrite(
        instance_id, agent_id, hot["machine_id"], now,
        # In HEARTBEAT_COLUMNS order; a steady heartbeat is never a benchmarking one,
        # hence last_non_benchmark_at.
        gauges=(f.seq, now, f.phase, f.phase_started_at, f.progress_json,
                f.proofs_completed_total, now, now, now, f.proof_seconds_recent_json,
                pace_now, f.net_rx_bytes, f.net_tx_bytes),
        telemetry_json=f.telemetry_json, history=_history(agent_id, instance_id, f, now),
        history_interval_s=settings.heartbeat_history_interval_s,
        history_keep_rows=settings.heartbeat_history_rows,
        benchmark_delivered=directive.action == "benchmark",
    )
    return write, directive


def decide_heartbeat(
    inst: Row, agent_id: str, hb: Heartbeat, f: SteadyFields, settings: Settings, now: float,
    fleet: pace.FleetLoad, rng: pace.RandomSource | None,
) -> tuple[HeartbeatWrite, Row]:
    """What any other heartbeat writes, and the instance as it will then read (what its
    answer is decided on; ``heartbeat_pace_s`` holds the pace answered)."""
    ids = (inst["id"], agent_id, inst["machine_id"], now)
    last_seq = inst["last_seq"]
    if last_seq is not None and hb.seq <= last_seq:
        # Late or out of order within this boot: it must not move the phase back.
        pace_now = pace.answer_s(inst["state"], fleet, settings, rng)
        late = {"last_seen": now, "heartbeat_pace_s": pace_now}
        return HeartbeatWrite(*ids, updates=late), {**inst, **late}
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
    updates["heartbeat_pace_s"] = pace.answer_s(updates.get("state", state), fleet, settings,
                                                rng)
    after = {**inst, **updates}
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
                        policy.StrikeRule.from_settings(settings) if failed else None)
        # As ``Tx.begin_terminating`` leaves it: the first reason given stands.
        after["terminate_reason"] = after["terminate_reason"] or reason
    write = HeartbeatWrite(
        *ids, updates=updates, events=tuple(events), ending=ending,
        telemetry_json=f.telemetry_json, history=_history(agent_id, inst["id"], f, now),
        history_interval_s=settings.heartbeat_history_interval_s,
        history_keep_rows=settings.heartbeat_history_rows,
    )
    return write, after


def _judged_early(inst: Row, hb: Heartbeat, settings: Settings) -> bool:
    """Whether this heartbeat's benchmark progress is judged for an early verdict."""
    return bool(settings.verdict_early and hb.phase == State.BENCHMARKING
                and inst["state"] not in states.ENDING and not inst["terminate_reason"])


# --- early verdicts (docs/policy.md) ------------------------------------------------

BENCH_OPEN, BENCH_PASSED, BENCH_TERMINATED, BENCH_CLOSED = "open", "passed", "terminated", "closed"


def verdict_settings(settings: Settings, planned_proofs: int) -> VerdictSettings:
    """The early-verdict knobs of ``settings`` for a benchmark of ``planned_proofs``."""
    return VerdictSettings(
        confidence=settings.verdict_confidence,
        min_proofs=settings.verdict_min_proofs,
        sigma_floor=settings.verdict_sigma_floor,
        planned_proofs=max(planned_proofs, settings.verdict_min_proofs),
    )


def _judge_early(tx: Tx, inst: Row, hb: Heartbeat, settings: Settings, now: float) -> None:
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


def _without_progress(hb: Heartbeat, inst: Row) -> Heartbeat:
    """A heartbeat of a run that announced its concurrency, then stopped reporting
    progress: read as no progress at all (nothing more done, no new proof)."""
    progress = Progress(done=int(inst["bench_done"] or 0), total=int(inst["bench_total"] or 0),
                        unit="proofs", concurrency=int(inst["bench_concurrency"]))
    return Heartbeat(hb.seq, hb.phase, hb.phase_started_at, progress,
                     int(inst["bench_completed_total"] or 0), [], None)


def _judge_unannounced(tx: Tx, inst: Row, hb: Heartbeat, settings: Settings,
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


def _track_benchmark(tx: Tx, inst: Row, hb: Heartbeat, settings: Settings, now: float) -> None:
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
        seen_at, anchor = float(inst["bench_seen_at"]), inst["bench_anchor_at"]
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
    max_concurrency = settings.max_concurrency_per_gpu * max(1, inst["num_gpus"] or 1)
    if min_rate is None or not min_rate > 0 or concurrency > max_concurrency:
        tx.update_instance(inst["id"], **state)  # nothing to judge against, or not believable
        return
    vs = verdict_settings(settings, progress.total)
    v = assess(proofs, concurrency, elapsed_s, float(min_rate), vs, proofs_failed=failed)
    if v.decision == "undecided":
        tx.update_instance(inst["id"], **state)
        return
    ids = {"instance_id": inst["id"], "agent_id": inst["agent_id"],
           "machine_id": inst["machine_id"]}
    data = _verdict_numbers(v, vs, concurrency, elapsed_s, failed, float(min_rate))
    if v.decision == "pass":
        state["bench_status"] = BENCH_PASSED
        tx.update_instance(inst["id"], **state)
        tx.insert_event(now, "verdict", f"early pass: {v.reason}", data=data, **ids)
        return
    _terminate_early(tx, inst, v, data, state, proofs, settings, now)


def _elapsed(inst: Row, settings: Settings, fresh: list[float], seen_at: float,
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
    tx: Tx, inst: Row, v: EarlyVerdict, data: dict[str, Any], state: dict[str, Any],
    proofs: list[float], settings: Settings, now: float,
) -> None:
    """The below-minimum path of a benchmark result, on the proofs seen so far."""
    machine_id = inst["machine_id"] or inst["label"]
    reason = f"early verdict: {v.reason}"
    state["bench_status"] = BENCH_TERMINATED
    tx.begin_terminating(
        inst["id"], reason, kind="verdict", note=f"terminate: {reason}", data=data,
        bad_host_source="benchmark", now=now, destroy_due_at=now + settings.terminate_grace_s,
        **state, rate_per_hour=v.rate_estimate_per_hour, last_seen=now,
    )
    fresh = tx.get_instance(inst["id"])
    assert fresh is not None
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
    tx.insert_result(
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


# --- result ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResultOutcome:
    instance_id: int
    duplicate: bool
    directive: Directive
    terminate: bool  # a destroy was scheduled by this result


def _scaling_diagnosis(
    runs: list[ScalingRun], inst: Row, rate_all: float | None, rate_one: float | None
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


def _steady_rate(
    result: Result, inst: Row, settings: Settings, gpus: int
) -> tuple[float | None, int | None]:
    """The steady-state rate of a finished benchmark (early verdicts on), and its concurrency.

    The concurrency is the one the run's heartbeats announced; without it (an
    older agent, early verdicts off, a run already judged) the batch rate judges.
    """
    concurrency = inst["bench_concurrency"]
    if (not settings.verdict_early or not concurrency
            or inst["bench_status"] not in (BENCH_OPEN, BENCH_PASSED)):
        return None, None
    j = int(concurrency)
    if j > settings.max_concurrency_per_gpu * gpus:
        return None, None
    rate = steady_state_rate_per_hour(
        list(result.proof_seconds), j, result.wall_seconds,
        proofs_failed=result.proofs_failed, tolerance=settings.rate_tolerance,
    )
    return (rate, j) if rate is not None else (None, None)


def reported_gpus(inst: Row) -> frozenset[int] | None:
    """The GPU indexes of the instance's hello (None before its first hello)."""
    host = loads(inst.get("host_json"))
    if not isinstance(host, dict) or not isinstance(host.get("gpus"), list):
        return None
    return frozenset(
        g["index"] for g in host["gpus"]
        if isinstance(g, dict) and isinstance(g.get("index"), int)
        and not isinstance(g.get("index"), bool)
    )


def measured_rates(tx: Tx, inst: Row) -> dict[int, float]:
    """GPU count -> the recomputed rate of the instance's latest counted benchmark result
    on that many GPUs (the coordinator's own figures for a scaling diagnosis)."""
    rates: dict[int, float] = {}
    for row in tx.results_for_instance(inst["id"]):  # oldest first: the latest wins
        rate = row["recomputed_rate_per_hour"]
        if row["kind"] == "benchmark" and row["counts_for_host_perf"] and rate is not None:
            rates[max(1, len(set(loads(row["gpus_used_json"]) or [])))] = float(rate)
    return rates


def watch_of(inst: Row, settings: Settings, now: float,
             measured: dict[int, float] | None = None,
             watching_since: float | None = None) -> policy.Watch:
    """What the coordinator saw of an instance, for judging its next result."""
    entered = inst["last_non_benchmark_at"] or inst["hello_at"]
    used = inst["result_window_at"]
    after_result = entered is not None and used is not None and float(used) >= float(entered)
    window_start = float(used) if after_result else entered
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
        measured_rates=measured or {},
        gpu_name=inst.get("gpu_name"),
        gpu_mem_bw_gbps=_offer_mem_bw(inst),
    )


def _offer_mem_bw(inst: Row) -> float | None:
    """A deployed instance's offer's ``gpu_mem_bw`` (vast.ai's per-host figure); a
    bring-your-own agent has no offer of vast.ai's."""
    if inst.get("kind") != "deployed":
        return None
    raw = loads(inst.get("offer_json"))
    value = raw.get("gpu_mem_bw") if isinstance(raw, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0 else None


#: The model's view of an offer's hardware as a new host's (its 90th percentile and what
#: it never measured; None: no model, or it cannot read the offer); passed in by the HTTP
#: layer, which holds the fitted model.
Expectation = Callable[[Offer], belief.Expected | None]


def _references(tx: Tx, inst: Row, offer: Offer | None, gpus: int,
                expected: belief.Expected | None) -> belief.References:
    """What a claim is compared with (docs/reliability.md, "No rate on a host's word
    alone"): the model's view, the median rate per GPU of *other* machines' counted
    measurements (none confirmed beyond belief) on the same hardware (the same GPU model
    and count, the same CPU, within a quarter of the RAM), and this machine's own first
    counted rate."""
    machine = str(inst["machine_id"] or inst["label"] or "")
    model = canonical_gpu_name(str((offer and offer.gpu_name) or inst.get("gpu_name") or ""))
    cpu = offer.cpu_name if offer else None
    ram = offer.cpu_ram if offer else None
    others: list[float] = []
    own_first: float | None = None
    for row in tx.fleet_measurements_of(gpus):  # oldest first
        cap = row["model_cap_per_hour"]
        per_gpu = min(float(row["rate_per_hour"]), float(cap) if cap else math.inf) / gpus
        if str(row["machine_id"]) == machine:
            own_first = per_gpu if own_first is None else own_first
            continue
        if cap is not None:
            continue  # believed beyond belief on its host's re-benchmark alone: no twin
        other = stored_offer(row["offer_json"]) or Offer()
        if canonical_gpu_name(other.gpu_name or "") != model:
            continue
        if cpu and other.cpu_name and other.cpu_name != cpu:
            continue
        their_ram = other.cpu_ram
        if ram is not None and their_ram is not None and ram > 0 \
                and not 0.8 <= their_ram / ram <= 1.25:
            continue
        others.append(per_gpu)
    return belief.References(
        expected_high=expected.high if expected is not None else None,
        novel=expected.novel if expected is not None else (),
        twin_median_per_gpu=statistics.median(others) if others else None,
        own_first_per_gpu=own_first)


def _readable(raw: dict[str, object]) -> Offer | None:
    """The instance's offer JSON as an ``Offer``; None (logged) when it is malformed."""
    try:
        return parse_offer(raw)
    except OfferError as exc:
        log.warning("offer of machine %s unreadable: %s", raw.get("machine_id"), exc.message)
        return None


@dataclass(frozen=True, slots=True)
class _Belief:
    counts: bool  # the result may enter host_perf, the model, the ranking and a verdict
    terminate: str | None = None  # a held claim that could not be confirmed
    counted_rate: float | None = None  # a confirmation's: the lower of it and the claim
    model_cap: float | None = None  # the most the rate model reads of a confirmed claim


def _judge_belief(
    tx: Tx, inst: Row, result: Result, check: policy.Plausibility, rate: float,
    settings: Settings, now: float, expect: Expectation | None, updates: dict[str, Any],
    events: list[tuple[str, str]],
) -> _Belief:
    """Samples only when asked, beyond belief held (docs/reliability.md): flags
    ``check``, fills ``updates`` (the directed benchmark consumed, a confirmation
    opened) and ``events``. Reads (the fleet's measurements) but writes nothing."""
    confirming = inst["directed_benchmark_kind"] == CONFIRM and inst["directed_benchmark_id"]
    claimed = inst["unconfirmed_rate_per_hour"]
    directed, why = _directed(result, inst)
    failed: str | None = None
    if directed:
        updates.update(directed_benchmark_id=None, directed_benchmark_kind=None)
        if confirming:
            failed = _watched_whole(result, inst, settings, now)
    elif not confirming:
        check.flag(policy.UNDIRECTED, why)
        return _Belief(False)
    else:
        failed = why
    offer = _readable(instance_offer(
        loads(inst.get("offer_json")),
        loads(inst.get("host_json")) if inst["kind"] == "byo" else None,
        instance_row({**inst, "machine_id": inst["machine_id"] or inst["label"]})))
    held: str | None = None
    if failed is None:
        expected: belief.Expected | None = None
        if expect is not None and offer is not None:
            try:
                expected = expect(offer)
            except Exception:  # a model bug must not lose the agent's result
                log.exception("rate expectation failed for instance %s", inst["id"])
        refs = _references(tx, inst, offer, check.gpus, expected)
        if confirming and claimed is not None and belief.agrees(rate, float(claimed)):
            updates.update(unconfirmed_rate_per_hour=None, confirm_tries=0)
            counted = belief.counted_rate(rate, float(claimed))
            # Believed for this instance; its influence on the model (and on other
            # machines' twins) stays bounded by what was believed before it.
            line = belief.line_of(check.gpus, refs)
            cap = line[0] if line is not None and line[0] < counted else None
            events.append(("confirmed", f"a directed re-benchmark measured {rate:.2f} "
                           f"proofs/h, agreeing with the held {float(claimed):.2f}/h "
                           f"(counted: {counted:.2f}/h, the lower" + (
                               f"; the rate model reads at most {cap:.2f}/h)" if cap
                               else ")")))
            return _Belief(True, counted_rate=counted, model_cap=cap)
        held = belief.beyond_belief(rate, check.gpus, refs)
        if held is None:
            if confirming:  # an ordinary rate after all: counted, the claim dropped
                updates.update(unconfirmed_rate_per_hour=None, confirm_tries=0)
            return _Belief(True)
    else:
        held = f"the re-benchmark does not confirm the held claim: {failed}"
    tries = int(inst["confirm_tries"] or 0) + (1 if confirming else 0)
    check.flag(policy.UNCONFIRMED, held)
    if tries >= MAX_CONFIRM_TRIES:
        updates.update(directed_benchmark_id=None, directed_benchmark_kind=None)
        return _Belief(False, f"{tries} directed re-benchmarks did not confirm a rate beyond "
                              f"belief ({held})")
    updates.update(unconfirmed_rate_per_hour=float(claimed) if confirming and claimed
                   else rate, confirm_tries=tries)
    confirm_id = new_benchmark_id()
    updates.update(directed_benchmark_id=confirm_id, directed_benchmark_at=now,
                   directed_benchmark_kind=CONFIRM, confirm_watch_at=now,
                   confirm_watch_gap_s=0.0, rebenchmark_pending=1)
    events.append(("held", f"unconfirmed: {held}; a directed re-benchmark was asked for"))
    return _Belief(False)


def result_job(
    agent_id: str, result: Result, settings: Settings, now: float,
    watching_since: float | None = None, fleet: pace.FleetLoad = pace.NO_AGENTS,
    expect: Expectation | None = None, rng: pace.RandomSource | None = None,
) -> Callable[[Tx], ResultOutcome]:
    """``watching_since``: when this coordinator process started (``policy.Watch``);
    ``fleet``: the agents heard from, which set the pace (none: the base pace), ``rng``
    its jitter (None: none);
    ``expect``: the rate model's 90th percentile for the instance's hardware."""
    limits = policy.PolicyLimits.from_settings(settings)

    def job(tx: Tx) -> ResultOutcome:
        inst = _require_instance(tx, agent_id)
        existing = tx.find_result(agent_id, result.result_id)
        if existing is not None:
            # The same directive again, its pace included: the agent's silence is timed
            # on the pace it is given.
            replayed = directive_from_json(existing["directive_json"])
            tx.update_instance(inst["id"], heartbeat_pace_s=replayed.next_heartbeat_s)
            return ResultOutcome(inst["id"], True, replayed, False)
        machine_id = inst["machine_id"] or inst["label"]
        gpu_name = inst["gpu_name"] or "unknown"
        num_gpus = inst["num_gpus"] or max(len(set(result.gpus_used)), 1)
        watch = watch_of(inst, settings, now,
                         measured_rates(tx, inst) if result.kind == "scaling" else None,
                         watching_since)
        check = policy.check_result(result, watch=watch, limits=limits,
                                    contended_with=_contended_with(tx, inst, machine_id))
        rate = check.recomputed_rate_per_hour
        # Every result uses up the stretch of benchmarking before it: the next may claim
        # only what the coordinator sees after this one.
        inst_updates: dict[str, Any] = {"last_seen": now, "updated_at": now,
                                        "result_window_at": now}
        events: list[tuple[str, str]] = []
        already_ending = watch.terminated is not None
        judged = _Belief(True)
        if result.kind == "benchmark" and not check.implausible and not already_ending \
                and rate is not None:
            judged = _judge_belief(tx, inst, result, check, rate, settings, now, expect,
                                   inst_updates, events)
            if judged.counted_rate is not None:
                # A confirmation counts the lower of the claim and itself.
                rate = check.recomputed_rate_per_hour = judged.counted_rate
        # Everything read: from here on only decisions, then one write.
        if check.reasons:
            events.append(("flagged", "; ".join(check.reasons)))
        verdict = None
        if result.kind == "benchmark" or check.implausible:
            verdict = _benchmark_verdict(result, inst, settings, check, judged, already_ending,
                                         inst_updates, events)
        terminate = verdict is not None and verdict.action == "terminate"
        ending: Ending | None = None
        if terminate and verdict is not None:
            ending = Ending(verdict.reason, "verdict", now + settings.terminate_grace_s,
                            note=f"terminate: {verdict.reason}",
                            bad_host_source="benchmark" if verdict.bad_host else None)
        after = _after_result(inst, inst_updates, ending)
        pace_now = pace.answer_s(after["state"], fleet, settings, rng)
        directive = _directive(after, pace_now)
        counts = (
            result.kind == "benchmark" and check.counts_for_host_perf and rate is not None
        )
        row = _result_row(agent_id, result, inst, check, verdict, directive, counts, now) | {
            "machine_id": machine_id, "gpu_name": gpu_name, "num_gpus": num_gpus}
        measurement = None if not counts or rate is None else _fleet_measurement(
            inst, machine_id, gpu_name, num_gpus, rate, now) | {
                "model_cap_per_hour": judged.model_cap}
        scaling = _scaling_of(result, after, (machine_id, gpu_name, num_gpus), check, watch,
                              terminate, now)
        tx.write_result(ResultWrite(
            inst["id"], agent_id, inst["machine_id"], now, inst_updates, tuple(events), row,
            ending=ending,
            pace_s=pace_now if pace_now != after["heartbeat_pace_s"] else None,
            benchmark_delivered=directive.action == "benchmark",
            measurement=measurement, scaling=scaling,
        ))
        return ResultOutcome(inst["id"], False, directive, terminate)

    return job


def _scaling_of(result: Result, after: Row, hardware: tuple[str, str, int],
                check: policy.Plausibility, watch: policy.Watch, terminate: bool,
                now: float) -> tuple[dict[str, Any], str, str] | None:
    """The scaling reading a result makes: a scaling run's, or a terminated multi-GPU
    benchmark's. ``hardware``: the result's machine, GPU model and count."""
    rate = check.recomputed_rate_per_hour
    machine_id, gpu_name, num_gpus = hardware
    if result.kind == "scaling":
        one = {len(set(result.gpus_used)): rate} if rate is not None else {}
        return _scaling_reading(result, after, machine_id, gpu_name, num_gpus, now,
                                {**watch.measured_rates, **one})
    if terminate and check.gpus > 1:
        # No one-GPU run follows a terminated host, yet why its GPUs scale badly is
        # exactly what the operator wants to know: diagnose the all-GPU run's telemetry.
        return _scaling_reading(result, after, machine_id, gpu_name, num_gpus, now,
                                {check.gpus: rate} if rate is not None else {})
    return None


def _contended_with(tx: Tx, inst: Row, machine_id: str) -> list[int]:
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
    result: Result, inst: Row, settings: Settings, check: policy.Plausibility, judged: _Belief,
    already_ending: bool, inst_updates: dict[str, Any], events: list[tuple[str, str]],
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
        )
    rate = check.recomputed_rate_per_hour
    if result.kind == "benchmark" and not check.implausible and not already_ending \
            and rate is not None and judged.counts:
        inst_updates["rate_per_hour"] = rate
    if verdict is not None and verdict.action != "terminate":
        events.append(("verdict", f"keep: {verdict.reason}"))
    return verdict


def _result_row(agent_id: str, result: Result, inst: Row, check: policy.Plausibility,
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


def _fleet_measurement(inst: Row, machine_id: str, gpu_name: str, num_gpus: int, rate: float,
                       now: float) -> dict[str, Any]:
    """The rate with the hardware it ran on: what the rate model learns from, and what
    host_perf is computed from."""
    offer = instance_offer(loads(inst.get("offer_json")),
                           loads(inst.get("host_json")) if inst["kind"] == "byo" else None,
                           instance_row({**inst, "machine_id": machine_id}))
    return {
        "machine_id": machine_id, "gpu_name": gpu_name, "num_gpus": num_gpus,
        "rate_per_hour": rate, "measured_at": now, "source": "fleet",
        "offer_json": dumps(offer), "instance_id": inst["id"], "recorded_at": now,
    }


def _after_result(inst: Row, updates: dict[str, Any], ending: Ending | None) -> Row:
    """The instance as it reads once a result's write is done (what its answer is decided
    on): as ``Tx.begin_terminating`` leaves it when the result ends it."""
    if ending is None:
        return {**inst, **updates}
    if inst["state"] in states.GONE:
        return inst  # nothing is written for an instance that is gone
    after = {**inst, **updates, "terminate_reason": inst["terminate_reason"] or ending.reason}
    if inst["state"] not in states.ENDING:
        after["state"] = State.TERMINATING
    return after


def _scaling_reading(
    result: Result,
    inst: Row,
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
        "evidence_json": dumps(getattr(diagnosis, "evidence", None)),
        "created_at": now,
    }
    if diagnosis is not None:
        eff = diagnosis.efficiency
        text = "?" if eff is None else f"{eff:.2f}"
        reason = f"efficiency {text}, bottleneck {diagnosis.bottleneck} (coordinator's reading)"
    else:
        reason = f"agent reports efficiency {result.efficiency}, bottleneck {result.bottleneck}"
    return row, reason, machine_id


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
