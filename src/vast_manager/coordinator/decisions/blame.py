"""Whose fault a failed trial is, before it counts against anyone (docs/policy.md, "Blame").

A trial fails for one of four parties:

- the **host**: its hardware or its network, seen on this machine only;
- the **operator**: the setup every instance shares (image, settings, the C1
  input, the parameter source, the work command): the same failure on two or
  more machines, or a failure the agent met checking its inputs, before the
  hardware was touched;
- **vast.ai**: its statuses and its API, when a status that never runs names
  no image problem and is seen on several machines;
- the **coordinator** itself: its restart. That one never reaches this module:
  after a restart silence is timed from the restart plus the agents' backoff
  (``Monitor.seed``), so its downtime ends no instance.

Only the host's count as strikes (``policy.StrikeRule``). A fault that is not
the host's and reaches beyond one machine (``Blame.fleet_wide``) pauses deploys
and the autopilot with one alert naming the cause and the fix, and strikes no
one. Pure: the caller passes the failure and the recent failures it read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from vast_manager.coordinator.decisions.states import State


class Fault(StrEnum):
    HOST = "host"
    OPERATOR = "operator"
    VAST = "vast"


#: The same failure on this many machines is the setup's, not theirs.
FLEET_MACHINES = 2
#: How far back a failure on another machine counts as "the same failure again".
FLEET_WINDOW_S = 6 * 3600.0

#: States in which an agent has said hello but has not touched the hardware: it checks
#: its C1 input and its memory budget in ``booting``, before any parameter or proof
#: (agent/phases/fetch.py).
BEFORE_HARDWARE: frozenset[str] = frozenset({State.BOOTING})

#: How the ending that counts as a failure came about (``Tx.instances.begin_terminating``'s
#: kind).
AGENT_FAILED, TIMEOUT, DEAD_STATUS = "failed", "timeout", "dead"
#: A failure proven on the machine itself (a delivered shortfall against its own kept
#: rate: docs/reliability.md, "Judged by what it delivers"): the host's, however many
#: machines fail the same way (each lied on its own).
HOST_EVIDENCE = "host_evidence"

# A failure's text names what each party would have to fix; the first match wins.
_FIXES: tuple[tuple[re.Pattern[str], Fault, str], ...] = (
    (re.compile(r"\bc1\b", re.I), Fault.OPERATOR,
     "put a valid C1 file where VM_C1_PATH points on the instance (in the image, or fetched "
     "by VM_VAST_ONSTART), check a copy with `vast-manager preflight` (VM_PREFLIGHT_C1), "
     "then `vast-manager faults clear ID`"),
    (re.compile(r"image|pull|manifest unknown|unauthorized|OCI runtime|exec format", re.I),
     Fault.OPERATOR,
     "check VM_VAST_IMAGE (its tag exists, its registry answers) and VM_VAST_IMAGE_LOGIN, "
     "then `vast-manager faults clear ID`"),
    (re.compile(r"params|parameter|VM_PARAMS_MANIFEST", re.I), Fault.OPERATOR,
     "make the parameter source reachable from the instances (VM_PARAMS_CMD or "
     "VM_PARAMS_MANIFEST in VM_VAST_ENV; the image holds no `curio`), check it with "
     "`vast-manager preflight`, then `vast-manager faults clear ID`"),
    (re.compile(r"memory budget|VM_CUZK_MEMORY_BUDGET|how much memory", re.I), Fault.OPERATOR,
     "set VM_CUZK_MEMORY_BUDGET in VM_VAST_ENV, then `vast-manager faults clear ID`"),
    (re.compile(r"VM_WORK_CMD|work command", re.I), Fault.OPERATOR,
     "fix VM_WORK_CMD in VM_VAST_ENV, then `vast-manager faults clear ID`"),
)
_DEFAULT_FIX = {
    Fault.OPERATOR: "fix the setup the message names (VM_VAST_ENV, the image, the settings), "
                    "then `vast-manager faults clear ID`",
    Fault.VAST: "check vast.ai's status (https://vast.ai) and the instances' status_msg "
                "(`vast-manager instance ID`), then `vast-manager faults clear ID`",
}


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed trial: what ended it, where, and on which machine."""

    machine_id: str
    reason: str
    kind: str  # AGENT_FAILED, TIMEOUT, DEAD_STATUS or HOST_EVIDENCE
    state: str  # the instance's state when it failed
    at: float


@dataclass(frozen=True, slots=True)
class Blame:
    fault: Fault
    signature: str
    fleet_wide: bool  # pause deploys and the autopilot, with one alert
    cause: str  # one sentence, naming the failure and why it is this party's
    fix: str  # what to do (empty for the host's: its strikes block it)
    machines: tuple[str, ...]  # every machine that failed this way in the window


_NUMBER = re.compile(r"\d+(\.\d+)?")
_SPACES = re.compile(r"\s+")
_ROUNDS = re.compile(r", seen in # rounds in a row$")


def signature(reason: str) -> str:
    """The failure with what varies per instance taken out (numbers, spacing), so the
    same failure on two machines reads the same."""
    text = _SPACES.sub(" ", _NUMBER.sub("#", reason.strip().lower()))
    return _ROUNDS.sub("", text)[:300]


def _fix(reason: str, fault: Fault) -> tuple[Fault, str]:
    for pattern, party, fix in _FIXES:
        if pattern.search(reason):
            return (party if fault is not Fault.HOST else fault), fix
    return fault, _DEFAULT_FIX.get(fault, "")


def judge(failure: Failure, recent: Iterable[Failure]) -> Blame:
    """Whose fault ``failure`` is, given the failures ``recent``ly seen on any machine
    (within ``FLEET_WINDOW_S`` of it; the failure itself may be among them)."""
    sig = signature(failure.reason)
    if failure.kind == HOST_EVIDENCE:
        return Blame(Fault.HOST, sig, False, failure.reason, "", (failure.machine_id,))
    machines = sorted({f.machine_id for f in recent
                       if signature(f.reason) == sig and failure.at - f.at <= FLEET_WINDOW_S}
                      | {failure.machine_id})
    before_hardware = failure.kind == AGENT_FAILED and failure.state in BEFORE_HARDWARE
    if len(machines) >= FLEET_MACHINES:
        # A status that never runs, seen fleet-wide, is vast.ai's unless it names the image.
        first = Fault.VAST if failure.kind == DEAD_STATUS else Fault.OPERATOR
        fault, fix = _fix(failure.reason, first)
        return Blame(fault, sig, True,
                     f"the same failure on {len(machines)} machines ({', '.join(machines)}): "
                     f"{failure.reason}", fix, tuple(machines))
    if before_hardware:
        fault, fix = _fix(failure.reason, Fault.OPERATOR)
        return Blame(fault, sig, True,
                     f"the agent failed checking its inputs, before the hardware was "
                     f"touched: {failure.reason}", fix, tuple(machines))
    return Blame(Fault.HOST, sig, False, failure.reason, "", tuple(machines))
