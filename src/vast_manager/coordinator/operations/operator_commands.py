"""The operator's commands that change the store (docs/cli.md): an agent issued or
revoked, a re-benchmark asked for, a machine put on or taken off ``bad_hosts``.

Each function returns a job for ``Store.write``: one transaction, its event recorded
with it. The web decodes and checks the request, calls one of these, and encodes the
answer; it builds no write of its own."""

from __future__ import annotations

from collections.abc import Callable

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.directives import (
    CONFIRM,
    OPERATOR,
    open_directed_benchmark,
)
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.writer import Tx

#: Why an operator's revoke ended an instance.
REVOKED = "revoked by the operator"


def issue_agent_job(agent_id: str, *, label: str, min_rate_per_hour: float | None,
                    max_gpus: int, gpu_model: str | None, now: float) -> Callable[[Tx], None]:
    """A bring-your-own agent issued for ``label``: the GPUs its hello may list, declared
    once (docs/reliability.md, "No rate on a host's word alone")."""

    def job(tx: Tx) -> None:
        tx.agents.add(agent_id, label=label, kind="byo", min_rate_per_hour=min_rate_per_hour,
                      issued_at=now, max_gpus=max_gpus, gpu_model=gpu_model)
        tx.audit.add(now, "agent_issued", f"bring-your-own agent for {label!r} issued",
                     agent_id=agent_id, machine_id=label)

    return job


def revoke_agent_job(agent_id: str, now: float) -> Callable[[Tx], bool]:
    """The agent revoked (True: it was not already); a deployed instance of it destroyed
    now (it bills and its agent may no longer speak), a bring-your-own one let go."""

    def job(tx: Tx) -> bool:
        changed = tx.agents.revoke(agent_id, now=now, reason=REVOKED)
        inst = tx.instance_by_agent(agent_id)
        if inst is not None and inst["state"] not in states.GONE:
            if inst["kind"] != "byo":
                # (The revoke's event is recorded with the instance's ending.)
                tx.instances.begin_terminating(inst["id"], REVOKED, kind="revoke", now=now,
                                               destroy_due_at=now)
                return changed
            # Not ours to destroy: the machine simply stops counting as our instance.
            tx.instances.update(inst["id"], state=State.DESTROYED, state_since=now,
                                destroyed_at=now, terminate_reason=REVOKED, updated_at=now)
        if changed:
            tx.audit.add(now, "revoke", REVOKED, agent_id=agent_id,
                         instance_id=inst["id"] if inst else None)
        return changed

    return job


def rebenchmark_job(inst: Row, now: float) -> Callable[[Tx], None]:
    """The operator's re-benchmark of ``inst``: a directed benchmark opened (unless a
    confirmation is open: it is the benchmark the instance owes), delivered at its next
    heartbeat."""
    instance_id = inst["id"]

    def job(tx: Tx) -> None:
        fresh = tx.get_instance(instance_id)
        if fresh is not None and fresh["directed_benchmark_kind"] != CONFIRM:
            open_directed_benchmark(tx, instance_row(fresh), OPERATOR, now)
        tx.instances.update(instance_id, rebenchmark_pending=1, updated_at=now)
        tx.audit.add(now, "rebenchmark", "the operator asked for a new benchmark",
                     instance_id=instance_id, agent_id=inst["agent_id"],
                     machine_id=inst["machine_id"])

    return job


def add_bad_host_job(machine_id: str, reason: str, now: float,
                     block_s: float) -> Callable[[Tx], None]:
    """Block a machine for ``block_s``: every block ends (docs/policy.md, "Blame")."""
    def job(tx: Tx) -> None:
        tx.blocklist.add(machine_id, reason=reason, source="operator", now=now,
                         expires_at=now + block_s)
        tx.audit.add(now, "bad_host", f"{machine_id}: {reason} (operator, for "
                     f"{block_s / 3600:.0f} h)", machine_id=machine_id)

    return job


def forgive_job(machine_id: str, now: float) -> Callable[[Tx], bool]:
    """Lift a machine's block and take back its strikes (False: nothing to forgive)."""
    return lambda tx: tx.blocklist.forgive(machine_id, now)


def clear_fault_job(fault_id: int, note: str, now: float) -> Callable[[Tx], bool]:
    """The operator says a fleet fault is fixed (False: no such open fault)."""
    return lambda tx: tx.blocklist.clear_fault(fault_id, note, now)


def remove_bad_host_job(machine_id: str, now: float) -> Callable[[Tx], bool]:
    def job(tx: Tx) -> bool:
        removed = tx.blocklist.remove(machine_id)
        if removed:
            tx.audit.add(now, "bad_host_removed", f"{machine_id} removed by the operator",
                         machine_id=machine_id)
        return removed

    return job
