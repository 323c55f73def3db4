"""Every state an instance can be in, and each named set of them, defined once.

The instance's lifecycle (docs/policy.md): ``deploying`` -> ``booting`` ->
``fetching_params`` -> ``warming`` -> ``benchmarking`` -> ``proving``, or ->
``terminating`` -> ``destroyed``; ``lost`` when its agent falls silent;
``failed`` when its agent reports it (then destroyed like a terminating one);
``vanished`` when the provider no longer lists it. The agent reports its
phase on the wire (``protocol.messages.PHASES``, docs/protocol.md); the
coordinator adds the states only it can see (``deploying``, ``lost``,
``destroyed``, ``vanished``). Every wire phase is a ``State`` (``PHASES``
below fails to import otherwise).

Python compares a row's ``state`` with these (a ``State`` is a ``str``), SQL
gets them through ``sql_in``, the dashboard through ``dashboard_script``
(``/static/states.js``). No other module lists states:
``tests/coordinator/decisions/test_states.py`` reads the tree for a second list and fails
on one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum

from vast_manager.protocol.messages import PHASES as WIRE_PHASES


class State(StrEnum):
    """An instance's state, in lifecycle order (the order SQL lists and gauges use)."""

    DEPLOYING = "deploying"  # rented (or being rented); its agent has not said hello
    BOOTING = "booting"
    FETCHING_PARAMS = "fetching_params"
    WARMING = "warming"
    BENCHMARKING = "benchmarking"
    PROVING = "proving"
    TERMINATING = "terminating"  # told to end; destroyed when its destroy_due_at comes
    LOST = "lost"  # its agent went silent (3 heartbeats + grace)
    FAILED = "failed"  # its agent reported an unrecoverable error; destroyed when due
    DESTROYED = "destroyed"  # destroyed through the provider (or, bring-your-own: revoked)
    VANISHED = "vanished"  # the provider no longer lists it


#: The phases an agent reports (the wire contract's, as states). ``State(p)`` raises on
#: a wire phase that is no state, so this module does not import until every one is.
PHASES: frozenset[State] = frozenset(State(p) for p in WIRE_PHASES)

#: No longer occupies its machine, nor bills for it. ``failed`` is not gone: a failed
#: instance still runs on (and bills for) its machine until the monitor destroys it
#: (its ``destroy_due_at``, like a terminating one), so it still counts against its
#: machine, still bills in the fleet's $/h, still gets its destroy retried, and
#: reconciliation leaves its destroy to that schedule.
GONE: frozenset[State] = frozenset({State.DESTROYED, State.VANISHED})

#: Still on its machine: it occupies it (a second deploy there is contended) and, when
#: we rented it, bills.
BILLING: frozenset[State] = frozenset(State) - GONE

#: Its fate is sealed: no phase the agent reports moves it back, the standing
#: directive is ``terminate``, and it is judged no more ("sticky").
ENDING: frozenset[State] = frozenset({State.TERMINATING, State.FAILED}) | GONE

#: The phases with which an agent ends its own instance.
ENDING_PHASES: frozenset[State] = PHASES & ENDING

#: Its agent is at work and heard from: silence makes it ``lost``, and its latest
#: telemetry describes the machine now.
ACTIVE_PHASES: frozenset[State] = PHASES - ENDING

#: On the way to its first benchmark result: all of these together have one time
#: budget from deploy (``policy.first_benchmark_budget_s``).
FIRST_BENCHMARK: frozenset[State] = ACTIVE_PHASES - {State.PROVING}

#: Its agent is not heard (no hello yet, or silent): it gets no grace before a destroy,
#: and its next hello starts it ``booting``.
UNHEARD: frozenset[State] = frozenset({State.DEPLOYING, State.LOST})

#: Its agent keeps the base heartbeat pace while the budget allows (``pace``): a benchmark
#: is judged early on its heartbeats, and the stretch of it a result may claim starts at
#: the last heartbeat of warming, so these phases want to be heard often.
QUICK_PACE: frozenset[State] = frozenset({State.WARMING, State.BENCHMARKING})

#: Every named set, by the name the dashboard's ``STATE_SETS`` uses.
NAMED_SETS: Mapping[str, frozenset[State]] = {
    "PHASES": PHASES,
    "GONE": GONE,
    "BILLING": BILLING,
    "ENDING": ENDING,
    "ENDING_PHASES": ENDING_PHASES,
    "ACTIVE_PHASES": ACTIVE_PHASES,
    "FIRST_BENCHMARK": FIRST_BENCHMARK,
    "UNHEARD": UNHEARD,
    "QUICK_PACE": QUICK_PACE,
}

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def ordered(members: Iterable[str]) -> list[State]:
    """``members`` as states, in lifecycle order; a value that is no state is refused."""
    wanted = {State(m) for m in members}
    return [s for s in State if s in wanted]


def sql_in(column: str, members: Iterable[State], *, negate: bool = False) -> str:
    """``column in ('a', 'b')`` (or ``not in``) for a set of states, in lifecycle order,
    so the statement's text is the same on every run (SQLite's statement cache, and a
    partial index's ``where`` must match a query's text to be used).

    Only identifiers reach the SQL: the column name and every value are checked, and a
    value must be a ``State``.
    """
    if _IDENTIFIER.fullmatch(column) is None:
        raise ValueError(f"not a column name: {column!r}")
    values = ordered(members)
    if not values:
        raise ValueError("an empty set of states has no SQL 'in' list")
    for value in values:
        if _IDENTIFIER.fullmatch(value.value) is None:  # a State defined wrongly
            raise ValueError(f"state {value.value!r} is not an identifier")
    listed = ", ".join(f"'{v.value}'" for v in values)
    return f"{column} {'not in' if negate else 'in'} ({listed})"


def dashboard_script() -> str:
    """The states and their named sets for the dashboard's JavaScript (served as
    ``/static/states.js``): ``STATES.PROVING``, ``STATE_SETS.GONE.has(state)``."""
    names = json.dumps({s.name: s.value for s in State}, indent=1)
    sets = ",\n".join(
        f" {json.dumps(name)}: new Set({json.dumps([s.value for s in ordered(members)])})"
        for name, members in NAMED_SETS.items()
    )
    return (
        "// Generated from coordinator/decisions/states.py: the one definition of the\n"
        "// instance states and their named sets.\n"
        '"use strict";\n'
        f"const STATES = Object.freeze({names});\n"
        f"const STATE_SETS = Object.freeze({{\n{sets},\n}});\n"
    )
