"""What every agent message shares: the agent and its instance looked up, the directive it
is answered, and the benchmarks the coordinator directs (docs/reliability.md, "No rate on
a host's word alone").

Every job here runs on the store's writer thread, inside one transaction."""

from __future__ import annotations

import hmac
import secrets
from typing import Any

import msgspec
import orjson

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.exceptions import HelloRequired, UnknownAgent
from vast_manager.coordinator.rows import AgentRow, InstanceRow, agent_row, instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.writer import Tx
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import Directive, Result


def directive_to_dict(d: Directive) -> dict[str, Any]:
    return msgspec.structs.asdict(d)


def directive_from_json(text: str) -> Directive:
    return from_obj(Directive, orjson.loads(text))


def agent_pace_s(inst: InstanceRow, settings: Settings) -> int:
    """The pace the instance's agent was last given (the base pace before any): every job
    stores the pace it answers (``pace.answer_s``, jitter included) in ``heartbeat_pace_s``, and the
    agent's silence is timed on it (docs/operations.md, "Heartbeat pace")."""
    return int(inst.get("heartbeat_pace_s") or settings.next_heartbeat_s)


def directive_for_row(inst: InstanceRow, pace_now: int) -> Directive:
    """The directive an instance's row answers, at the pace ``pace_now``.

    An open ``benchmark`` (``rebenchmark_pending``) is answered in every answer, a
    retried message's included, until the agent's own messages show it acted on it:
    its phase moved to benchmarking (``heartbeat.started_asked_benchmark``) or the
    result of the benchmark asked for arrived (``beliefs.judge_belief``). An answer
    lost on the way is so never a directive lost."""
    return policy.directive_for(instance_row(inst), next_heartbeat_s=pace_now,
                                min_rate=inst.get("min_rate_per_hour"))


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


def open_directed_benchmark(tx: Tx, inst: InstanceRow, kind: str, now: float) -> str:
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
    tx.instances.update(inst["id"], **updates)
    return benchmark_id


def directed(result: Result, inst: InstanceRow) -> tuple[bool, str]:
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


def watched_whole(result: Result, inst: InstanceRow, settings: Settings, now: float) -> str | None:
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


def time_scale(inst: InstanceRow, settings: Settings) -> float:
    """Simulated seconds per real second of this instance: the simulated fleet's scale
    for an instance we deployed (``VM_SIM_TIME_SCALE``, 1 outside a simulation), 1 for a
    bring-your-own agent, which is a real machine even beside a simulated fleet."""
    return settings.sim_time_scale if inst.get("kind") == "deployed" else 1.0


def require_agent(tx: Tx, agent_id: str) -> AgentRow:
    agent = tx.get_agent(agent_id)
    if agent is None or agent["revoked"]:
        # Auth checked this already; a revoke may have committed in between.
        raise UnknownAgent("This agent id is unknown or revoked.")
    return agent_row(agent)


def require_instance(tx: Tx, agent_id: str) -> InstanceRow:
    require_agent(tx, agent_id)
    inst = tx.instance_by_agent(agent_id)
    if inst is None:
        raise HelloRequired("Send /v1/hello before anything else.")
    return instance_row(inst)


def current(tx: Tx, instance_id: int) -> InstanceRow:
    """The instance as this transaction sees it now (one the job has read: it exists)."""
    found = tx.get_instance(instance_id)
    assert found is not None
    return instance_row(found)
