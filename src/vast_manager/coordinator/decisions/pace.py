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

Each answer then gets jitter, as Nomad's heartbeat TTL does (``resetHeartbeatTimer`` in
hashicorp/nomad ``nomad/heartbeat.go`` adds ``RandomStagger(ttl)`` to the rate-scaled
TTL): a draw of up to ``JITTER_FRACTION`` of the pace is added, so agents restarted
together drift apart instead of heartbeating in lockstep. Jitter only lengthens a pace,
so the fleet stays under its budget, and the silence timer is set on the pace answered,
jitter included (docs/operations.md, "Heartbeat pace").

``HeartbeatTracker`` is Nomad's heartbeat timer as one small object: the agent handlers
``touch`` an instance with the pace they answered, the monitor calls ``expire_stale``;
each instance's silence is timed on its own pace, and the tracker's count of the agents
heard (``load``) sets the next pace. Times are passed in, so tests never sleep.
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


#: The last ``paces`` figured, with the (immutable) fleet and limits it was figured for:
#: every heartbeat asks, and the tracker hands out the same ``FleetLoad`` until the fleet
#: changes. One tuple, swapped whole, so either thread asking reads a consistent one.
_last_paces: tuple[FleetLoad, PaceSettings, Paces] | None = None


def paces(fleet: FleetLoad, limits: PaceSettings) -> Paces:
    """The paces for a fleet of ``fleet``.

    Quick agents get the least pace at which they alone stay under the budget; the
    others the least at which they stay under what the quick ones leave of it. So the
    base pace holds until the fleet would exceed the budget, and the fleet's load stays
    under it until the paces reach the longest.
    """
    global _last_paces
    last = _last_paces
    if last is not None and last[0] is fleet and last[1] is limits:
        return last[2]
    both = _paces(fleet, limits)
    _last_paces = (fleet, limits, both)
    return both


def _paces(fleet: FleetLoad, limits: PaceSettings) -> Paces:
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


# --- jitter ----------------------------------------------------------------------------

#: The most jitter added to a pace, as a share of it. Nomad staggers by up to a whole TTL;
#: a quarter is enough to spread a fleet restarted together within a few paces and keeps
#: silence found within 3 x 1.25 paces plus the grace.
JITTER_FRACTION = 0.25


class RandomSource(Protocol):
    """Where the jitter is drawn (``random.Random``; tests inject a seeded one)."""

    def random(self) -> float: ...


def jitter_spread_s(pace_s: int) -> int:
    """The most whole seconds of jitter for ``pace_s``: none under 4 s (a whole second
    would be more than a quarter of it; demos and tests pace at 1 s)."""
    return int(pace_s * JITTER_FRACTION)


def jittered_s(pace_s: int, rng: RandomSource | None) -> int:
    """``pace_s`` plus a draw of 0 to ``jitter_spread_s`` whole seconds (None: none)."""
    spread = jitter_spread_s(pace_s)
    if rng is None or spread <= 0:
        return pace_s
    return pace_s + min(spread, int(rng.random() * (spread + 1)))


def answer_s(phase: str | None, fleet: FleetLoad, limits: PaceSettings,
             rng: RandomSource | None = None) -> int:
    """The ``next_heartbeat_s`` an agent in ``phase`` is answered: its pace, jittered."""
    return jittered_s(next_heartbeat_s(phase, fleet, limits), rng)


# --- the heartbeat timer ------------------------------------------------------------------


def silence_ttl_s(next_heartbeat_s: float, grace_s: float) -> float:
    """Nomad-style TTL: three missed heartbeats plus a grace."""
    return 3 * next_heartbeat_s + grace_s



class HeartbeatTracker:
    """Last-seen times and paces per instance; an instance silent for longer than its TTL
    (``silence_ttl_s`` of the pace its agent was last given) expires."""

    def __init__(self, grace_s: float, base_pace_s: float) -> None:
        self.grace_s = grace_s
        self.base_pace_s = base_pace_s
        self._heard: dict[int, tuple[float, float]] = {}  # id -> (last seen, pace)
        # id -> when it expires: what the monitor's minute pass compares, at 200,000
        # instances a scan of floats rather than a TTL computed for each.
        self._expires: dict[int, float] = {}
        self._quick: set[int] = set()  # heard last in a quick phase (``is_quick``)
        self._load: FleetLoad | None = None  # the counts, until they change

    def touch(self, instance_id: int, now: float, pace_s: float | None = None,
              phase: str | None = None, extra_s: float = 0.0) -> None:
        """Heard from now, and told to report again within ``pace_s`` (None: the pace it
        was last given); ``phase`` (None: unchanged) says how it is paced; ``extra_s``:
        more time before it counts as silent (after a restart, the agents' backoff)."""
        known = self._heard.get(instance_id)
        if known is None:
            self._load = None
        if pace_s is None:
            pace_s = known[1] if known is not None else self.base_pace_s
        self._heard[instance_id] = (now, pace_s)
        self._expires[instance_id] = now + self.ttl_s(pace_s) + extra_s
        if phase is not None and is_quick(phase) != (instance_id in self._quick):
            self._load = None
            if is_quick(phase):
                self._quick.add(instance_id)
            else:
                self._quick.discard(instance_id)

    def forget(self, instance_id: int) -> None:
        if self._heard.pop(instance_id, None) is not None:
            self._load = None
        self._expires.pop(instance_id, None)
        self._quick.discard(instance_id)

    def last_seen(self, instance_id: int) -> float | None:
        heard = self._heard.get(instance_id)
        return None if heard is None else heard[0]

    def pace_s(self, instance_id: int) -> float | None:
        """The pace the instance's agent was last given, if it is tracked."""
        heard = self._heard.get(instance_id)
        return None if heard is None else heard[1]

    def expires_at(self, instance_id: int) -> float | None:
        """When the instance counts as silent, if it is tracked."""
        return self._expires.get(instance_id)

    def ttl_s(self, pace_s: float) -> float:
        """How long an agent told ``pace_s`` (jitter included) may stay silent."""
        return silence_ttl_s(pace_s, self.grace_s)

    def load(self) -> FleetLoad:
        """The agents heard from, by how they are paced."""
        if self._load is None:
            quick = len(self._quick)
            self._load = FleetLoad(quick, len(self._heard) - quick)
        return self._load

    def expire_stale(self, now: float) -> list[tuple[int, float]]:
        """Remove and return the instances silent for longer than their TTL, each with the
        pace it was last given."""
        stale = [i for i, expires in self._expires.items() if now > expires]
        out = [(i, self._heard[i][1]) for i in stale]
        for instance_id in stale:
            self.forget(instance_id)
        return out

    def __len__(self) -> int:
        return len(self._heard)
