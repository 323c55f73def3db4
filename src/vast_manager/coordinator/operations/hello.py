"""A hello: the agent's boot recorded, a bring-your-own agent's instance created, its GPUs
checked against what it was issued for, answered with its directive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vast_manager.common.hardware_facts import canonical_gpu_name
from vast_manager.coordinator.decisions import pace, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.exceptions import InvalidInput
from vast_manager.coordinator.operations.directives import (
    FIRST,
    current,
    directive_for_row,
    open_directed_benchmark,
    require_agent,
)
from vast_manager.coordinator.rows import AgentRow, InstanceRow, instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import dumps
from vast_manager.coordinator.store.writer import Tx
from vast_manager.protocol.messages import Directive, Hello, HostInfo

#: GPUs a bring-your-own agent issued before GPUs were declared may list: vast.ai buckets
#: machines at 1, 2, 4 and 8 GPUs (docs/reliability.md, "No rate on a host's word
#: alone"), twice that.
LEGACY_MAX_GPUS = 16


def hello_job(
    agent_id: str, hello: Hello, settings: Settings, now: float,
    fleet: pace.FleetLoad = pace.NO_AGENTS, rng: pace.RandomSource | None = None,
) -> Callable[[Tx], tuple[int, Directive]]:
    """Record a hello; creates the instance of a bring-your-own agent (machine_id = label).

    ``fleet``: the agents heard from, which set the pace (none: the base pace); ``rng``:
    where the pace's jitter is drawn (None: no jitter)."""

    def job(tx: Tx) -> tuple[int, Directive]:
        agent = require_agent(tx, agent_id)
        host = hello.host
        if agent["kind"] == "byo":
            _check_declared_gpus(agent, host)
        found = tx.instance_by_agent(agent_id)
        inst = instance_row(found) if found is not None else _byo_instance(tx, agent, host, now)
        new_boot = inst["boot_id"] != hello.boot_id
        updates: dict[str, Any] = {
            "boot_id": hello.boot_id,
            "agent_version": hello.agent_version,
            "container_id": hello.container_id,
            "host_json": dumps(host),
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
        tx.instances.update(inst["id"], **updates)
        if new_boot:
            tx.audit.add(
                now, "hello", f"agent {hello.agent_version} started (boot {hello.boot_id})",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        if inst["state"] == State.LOST:
            tx.audit.add(
                now, "recovered", "the agent spoke again after silence",
                instance_id=inst["id"], agent_id=agent_id, machine_id=inst["machine_id"],
            )
        _check_gpu_count(tx, inst, len(host.gpus), now)
        return inst["id"], directive_for_row(current(tx, inst["id"]), pace_now)

    return job


def _byo_instance(tx: Tx, agent: AgentRow, host: HostInfo, now: float) -> InstanceRow:
    """The instance an agent without one gets at its first hello: a bring-your-own
    agent's, its machine_id the label."""
    agent_id = agent["agent_id"]
    machine_id = agent["label"] if agent["kind"] == "byo" else None
    instance_id = tx.instances.add(
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
    tx.audit.add(
        now, "hello", f"bring-your-own agent registered its machine {machine_id!r}",
        instance_id=instance_id, agent_id=agent_id, machine_id=machine_id,
    )
    return current(tx, instance_id)


def _check_gpu_count(tx: Tx, inst: InstanceRow, seen: int, now: float) -> None:
    """An event when a deployed instance's agent sees other than the offer's GPU count."""
    expected = inst["num_gpus"]
    if inst["kind"] == "deployed" and expected is not None and expected != seen:
        tx.audit.add(
            now, "hardware_mismatch",
            f"the offer promised {expected} GPUs, the agent sees {seen}",
            instance_id=inst["id"], agent_id=inst["agent_id"], machine_id=inst["machine_id"],
        )


def _check_declared_gpus(agent: AgentRow, host: HostInfo) -> None:
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
