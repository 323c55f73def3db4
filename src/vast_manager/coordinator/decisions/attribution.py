"""Which instance delivered the cluster's proofs: Curio's rows matched to our instances.

Pure. Curio writes every task attempt to ``harmony_task_history`` with the
``completed_by_host_and_port`` of the node that ran it (``recordCompletion``,
harmony/harmonytask/task_type_handler.go in filecoin-project/curio at e0294b0f), and each
node's ``CURIO_NODE_NAME`` to ``harmony_machine_details.machine_name`` beside its
``harmony_machines.host_and_port`` (cmd/curio/tasks/tasks.go ``machineDetails``). The
coordinator names every instance's node (``node_name``) and, on vast.ai, knows the address
its public Curio port (``public_ipaddr`` and the port vast.ai mapped); an instance's
addresses are that one and those its node name holds in the cluster.

``host_and_port`` is not unique (harmony/resources/resources.go says so: NAT'd containers
can share one), so a row is never guessed: an address two instances claim makes both
unattributable, and rows from an address no instance holds are reported apart. Neither is
a reason to end anything (docs/operations.md, "Production as the cluster records it").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vast_manager.common.curio import CURIO_NODE_NAME, CURIO_PORT

__all__ = ["CURIO_NODE_NAME", "Claim", "Tally", "attribute", "listed_address", "node_name"]

NODE_NAME_PREFIX = "vm-"


def listed_address(listed: Mapping[str, object], port: int = CURIO_PORT) -> str | None:
    """The public address vast.ai gives an instance's Curio port: ``public_ipaddr`` and the
    ``HostPort`` mapped to ``<port>/tcp`` in its ``ports`` (vast-cli at 55679830, vast.py
    ``ssh-url`` reads ``ports["22/tcp"][0]["HostPort"]`` beside ``public_ipaddr`` the same
    way); None when either is missing. It is an instance's when its Curio writes it (an
    operator's CURIO_LISTEN, or a host that gives the container its public IP)."""
    ip = listed.get("public_ipaddr")
    ports = listed.get("ports")
    if not isinstance(ip, str) or not ip.strip() or not isinstance(ports, Mapping):
        return None
    mapped = ports.get(f"{port}/tcp")
    if not isinstance(mapped, list) or not mapped or not isinstance(mapped[0], Mapping):
        return None
    host_port = str(mapped[0].get("HostPort", "")).strip()
    return f"{ip.strip()}:{int(host_port)}" if host_port.isdigit() else None


def node_name(instance_id: int) -> str:
    """The Curio node name the coordinator gives an instance."""
    return f"{NODE_NAME_PREFIX}{int(instance_id)}"


@dataclass(frozen=True, slots=True)
class Tally:
    """Proving tasks one address finished in the window: succeeded, failed (``result`` false,
    not preempted), the newest failure's ``err``; and of them, those since the previous read."""

    completed: int = 0
    failed: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    new_completed: int = 0
    new_failed: int = 0

    def __add__(self, other: Tally) -> Tally:
        newest = self if (self.last_error_at or 0.0) >= (other.last_error_at or 0.0) else other
        return Tally(self.completed + other.completed, self.failed + other.failed,
                     newest.last_error, newest.last_error_at,
                     self.new_completed + other.new_completed,
                     self.new_failed + other.new_failed)


@dataclass(frozen=True, slots=True)
class Claim:
    """What the coordinator knows of an instance's Curio identity."""

    instance_id: int
    node_name: str
    address: str | None = None  # public IP and mapped port, from the provider's list


@dataclass(frozen=True, slots=True)
class Matched:
    """An instance's rows, summed over its addresses (none found: a zero tally)."""

    addresses: tuple[str, ...]
    tally: Tally


@dataclass(frozen=True, slots=True)
class Unattributable:
    """An instance whose rows cannot be told from another's: why, in a sentence."""

    reason: str


@dataclass(slots=True)
class Attribution:
    """Per instance whose node is in the cluster, its rows (or why they cannot be told
    apart); instances absent are not in it. And the rows no instance holds."""

    instances: dict[int, Matched | Unattributable] = field(default_factory=dict)
    unclaimed: dict[str, Tally] = field(default_factory=dict)


def attribute(claims: Iterable[Claim], machines: Iterable[tuple[str | None, str]],
              tallies: Mapping[str, Tally]) -> Attribution:
    """Match ``tallies`` (by ``host_and_port``) to ``claims``; ``machines`` are the cluster's
    (``machine_name``, ``host_and_port``) pairs."""
    claims = list(claims)
    by_name: dict[str, set[str]] = {}
    for name, address in machines:
        if name:
            by_name.setdefault(name, set()).add(address)
    addresses: dict[int, set[str]] = {}
    holders: dict[str, set[int]] = {}
    for claim in claims:
        mine = set(by_name.get(claim.node_name, ()))
        if claim.address:
            mine.add(claim.address)
        addresses[claim.instance_id] = mine
        for address in mine:
            holders.setdefault(address, set()).add(claim.instance_id)
    out = Attribution()
    for claim in claims:
        mine = addresses[claim.instance_id]
        shared = sorted(a for a in mine if len(holders[a]) > 1)
        if shared:
            others = sorted(holders[shared[0]] - {claim.instance_id})
            out.instances[claim.instance_id] = Unattributable(
                f"host_and_port {shared[0]} is also claimed by instance"
                f"{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}: its rows "
                "cannot be told apart")
            continue
        if claim.node_name not in by_name:
            continue  # its node never registered: nothing to judge it by (the agents' counts)
        total = Tally()
        for address in mine:
            total = total + tallies.get(address, Tally())
        out.instances[claim.instance_id] = Matched(tuple(sorted(mine)), total)
    out.unclaimed = {a: t for a, t in tallies.items() if a not in holders}
    return out
