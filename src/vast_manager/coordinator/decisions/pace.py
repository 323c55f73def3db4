"""The heartbeat pace: the ``next_heartbeat_s`` each agent is told, from the fleet's size
and the agent's phase, under a budget of heartbeats per second (docs/operations.md,
"Heartbeat pace").

As Nomad does with ``max_heartbeats_per_second``: every agent reports at the base pace
(``next_heartbeat_s``) until the fleet would send more than the budget; then the pace
stretches just enough to keep it under, never beyond ``max_next_heartbeat_s`` (silence is
found after three paces, so the pace bounds how long a dead host goes unnoticed). Agents
in a quick phase (``states.QUICK_PACE``: warming and benchmarking, whose heartbeats early
verdicts and the result's plausibility checks are judged on) draw on the budget first;
every other agent shares what they leave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.settings import DEFAULTS

#: A pace computed as ``agents / budget`` is rounded up to whole seconds; this much of
#: float noise (15,000 / 1,000.0000001) must not cost a second.
_ROUNDING_S = 1e-9


class PaceSettings(Protocol):
    """What the pace follows: ``Settings`` has it; ``PaceLimits`` holds just that."""

    @property
    def next_heartbeat_s(self) -> int: ...

    @property
    def max_next_heartbeat_s(self) -> int: ...

    @property
    def max_heartbeats_per_second(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PaceLimits:
    """The settings the pace follows, alone."""

    next_heartbeat_s: int = DEFAULTS.next_heartbeat_s
    """The base pace, and the least: a small fleet reports this often."""
    max_next_heartbeat_s: int = DEFAULTS.max_next_heartbeat_s
    """The longest pace (never below ``next_heartbeat_s``)."""
    max_heartbeats_per_second: float = DEFAULTS.max_heartbeats_per_second
    """The fleet's heartbeats per second the pace keeps under, while it can."""


class FleetLoad(NamedTuple):
    """The agents heard from, by how they are paced (the heartbeat tracker counts them).

    A tuple: one is made for every agent request."""

    quick: int = 0
    """Agents last heard in a quick phase (``states.QUICK_PACE``)."""
    steady: int = 0
    """Every other agent heard from."""


#: No agent heard yet: every pace is the base pace.
NO_AGENTS = FleetLoad()


class Paces(NamedTuple):
    """The two paces of a fleet, seconds."""

    quick_s: int
    """For an agent in a quick phase."""
    steady_s: int
    """For every other agent."""


def is_quick(phase: str | None) -> bool:
    """Whether an agent in ``phase`` draws on the budget first."""
    return phase in states.QUICK_PACE


def _stretched_s(agents: int, per_second: float, base_s: int, longest_s: int) -> int:
    """The least whole pace at which ``agents`` send at most ``per_second`` heartbeats a
    second, between ``base_s`` and ``longest_s`` (the longest when no budget is left)."""
    if per_second <= 0:
        return longest_s
    needed = math.ceil(agents / per_second - _ROUNDING_S)
    return min(longest_s, max(base_s, needed))


def paces(fleet: FleetLoad, limits: PaceSettings) -> Paces:
    """The paces for a fleet of ``fleet``.

    Quick agents get the least pace at which they alone stay under the budget; the
    others the least at which they stay under what the quick ones leave of it. So the
    base pace holds until the fleet would exceed the budget, and the fleet's load stays
    under it until the paces reach the longest.
    """
    base_s = limits.next_heartbeat_s
    longest_s = max(base_s, limits.max_next_heartbeat_s)
    budget = limits.max_heartbeats_per_second
    quick_s = _stretched_s(fleet.quick, budget, base_s, longest_s)
    left = budget - fleet.quick / quick_s
    return Paces(quick_s, _stretched_s(fleet.steady, left, base_s, longest_s))


def next_heartbeat_s(phase: str | None, fleet: FleetLoad, limits: PaceSettings) -> int:
    """The pace, in whole seconds, for an agent in ``phase`` of a fleet of ``fleet``."""
    both = paces(fleet, limits)
    return both.quick_s if is_quick(phase) else both.steady_s


def heartbeats_per_second(fleet: FleetLoad, limits: PaceSettings) -> float:
    """What ``fleet`` sends a second at the paces it is given."""
    both = paces(fleet, limits)
    return fleet.quick / both.quick_s + fleet.steady / both.steady_s
