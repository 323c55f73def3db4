"""Records without a provider instance id (the create's answer was lost, or the
coordinator stopped mid-create) given the instance that carries their label.

Without this, such an instance would never be matched to its record: once the record is
destroyed (no hello), reconciliation would see a known agent and leave a paid instance
running. The label is ours (fleet id) and names the record's agent, so the match is
exact. Reconciliation (``operations.reconciliation``) runs it each round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vast_manager.coordinator.decisions.reconcile import parse_label
from vast_manager.coordinator.providers.base import ProviderInstance
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.writer import Tx


def adoptions(provider_instances: Sequence[ProviderInstance], rows: Sequence[Row],
              fleet_id: str) -> list[tuple[Row, int]]:
    """(record, provider instance id) for each record waiting for its instance whose label
    a listed instance carries (and no other record holds)."""
    waiting = {
        str(r["agent_id"]): r for r in rows
        if r["provider_instance_id"] is None and r["agent_id"]
    }
    if not waiting:
        return []
    taken = {int(r["provider_instance_id"]) for r in rows
             if r["provider_instance_id"] is not None}
    labelled: list[tuple[int, str]] = []
    for inst in provider_instances:
        parsed = parse_label(inst.get("label"))
        if parsed is None or parsed[0] != fleet_id:
            continue
        try:
            labelled.append((int(inst["id"]), parsed[1]))
        except (KeyError, TypeError, ValueError):
            continue
    found: list[tuple[Row, int]] = []
    # Lowest id first, as the provider's own lookup by label picks; a second
    # instance with the same label is a double sale, destroyed as leaked.
    for pid, agent_id in sorted(labelled):
        row = waiting.pop(agent_id, None)
        if row is not None and pid not in taken:
            found.append((row, pid))
    return found


def adopt_job(found: Sequence[tuple[Row, int]], provider_name: str,
              now: float) -> Callable[[Tx], None]:
    """Each record given its instance (re-checked in the transaction), with its event."""

    def adopt(tx: Tx) -> None:
        for row, pid in found:
            current = tx.get_instance(int(row["id"]))
            if current is None or current["provider_instance_id"] is not None:
                continue
            tx.instances.update(row["id"], provider_instance_id=pid, updated_at=now)
            tx.audit.add(now, "adopted", f"{provider_name} instance {pid} carries this "
                         "agent's label", instance_id=row["id"], agent_id=row["agent_id"],
                         machine_id=row["machine_id"])

    return adopt
