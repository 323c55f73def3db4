"""Reconciliation plan: vast.ai's instance list against ours, as a list of actions.

Pure (docs/policy.md): no I/O, the clock passed in. The monitor loop carries
the actions out (destroy through the provider, mark in the store). An
instance whose label does not carry our fleet id (``vm:<fleet_id>:<agent_id>``,
docs/protocol.md) is never acted on: it belongs to another fleet or to a person.

``our_instances`` rows are the coordinator's: vast.ai's instance id as
``provider_instance_id`` (the store's column) or ``instance_id`` (None while a
deploy has not returned one), ``agent_id``, ``state`` (``states.State``) and
optionally ``created_at`` (epoch seconds). ``Action.instance_id`` is always
vast.ai's id.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.offers import as_float, as_int
from vast_manager.coordinator.rows import ListedInstance, OurRecord

ActionKind = Literal["destroy_leaked", "destroy_dead", "mark_vanished"]

#: vast.ai ``actual_status`` values of an instance that will never run (again) by
#: itself, and bills until destroyed (docs/vast.md): ``exited``, ``unknown`` and
#: ``offline`` never reach ``running`` (the OpenAPI description: "destroy and
#: retry"); ``stopped`` bills its storage and we never stop ours.
DEAD_STATUSES = frozenset({"exited", "unknown", "offline", "stopped"})
#: ``status_msg`` of an instance left ``created`` by a container that could not
#: start (dstack fails such a start on this text).
START_FAILURES = ("OCI runtime create failed",)

_LABEL = re.compile(r"^vm:([^:\s]+):([^:\s]+)$")


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    instance_id: int
    reason: str


def never_runs(inst: ListedInstance) -> str | None:
    """Why vast.ai's instance will never run, from its status; None while it may."""
    status = inst.get("actual_status")
    if not isinstance(status, str):
        return None  # null while provisioning
    if status in DEAD_STATUSES:
        return f"vast.ai status {status}"
    msg = str(inst.get("status_msg") or "")
    if status == "created" and any(m in msg for m in START_FAILURES):
        return f"vast.ai status created, start failed: {_clip(msg)}"
    return None


def _clip(text: str, limit: int = 160) -> str:
    # status_msg is the host's docker error: untrusted, possibly long, multi-line.
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def parse_label(label: object) -> tuple[str, str] | None:
    """``vm:<fleet_id>:<agent_id>`` -> (fleet_id, agent_id); None for any other label."""
    if not isinstance(label, str):
        return None
    m = _LABEL.match(label.strip())
    return (m.group(1), m.group(2)) if m else None


def plan(
    provider_instances: Sequence[ListedInstance],
    our_instances: Sequence[OurRecord],
    fleet_id: str,
    known_agent_ids: set[str],
    now: float,
    grace_s: float,
    provider: str = "vast.ai",
) -> list[Action]:
    """What to do so that vast.ai (``provider``, as reasons name it) and our records
    agree.

    - ``destroy_dead``: ours (our fleet's label) that will never run
      (``never_runs``: exited, unknown, offline, stopped, or created with a
      start failure). The monitor acts on it only once two rounds in a row
      agree, so one odd answer ends nothing.
    - ``destroy_leaked``, once ``start_date`` is ``grace_s`` old: ours whose
      agent id we do not know; or a second instance carrying a known agent's
      label beside the one we recorded (a doubly sold offer); or one we
      recorded as gone (destroyed, vanished) that is still there. Without a
      ``start_date`` an unknown instance is not aged, so it is left alone.
    - ``mark_vanished``: one of our records with an instance id that vast.ai
      no longer lists (past ``grace_s`` after ``created_at`` when given).
    """
    ours_by_id, recorded_by_agent = _index_ours(our_instances)
    actions: list[Action] = []
    listed: set[int] = set()
    for inst in provider_instances:
        iid = as_int(inst.get("id"))
        if iid is None:
            continue
        listed.add(iid)
        parsed = parse_label(inst.get("label"))
        if parsed is None or parsed[0] != fleet_id:
            continue  # another fleet's, or not ours at all: never touched
        action = _listed_action(inst, iid, parsed[1], ours_by_id.get(iid),
                                recorded_by_agent.get(parsed[1], set()), known_agent_ids,
                                now, grace_s)
        if action is not None:
            actions.append(action)
    actions += _vanished(ours_by_id, listed, now, grace_s, provider)
    actions.sort(key=lambda a: (a.kind, a.instance_id))
    return actions


def _index_ours(
    our_instances: Sequence[OurRecord],
) -> tuple[dict[int, OurRecord], dict[str, set[int]]]:
    """Our records by provider instance id, and each agent's recorded instance ids."""
    ours_by_id: dict[int, OurRecord] = {}
    recorded_by_agent: dict[str, set[int]] = {}
    for row in our_instances:
        iid = as_int(
            row["provider_instance_id"] if "provider_instance_id" in row else row.get("instance_id")
        )
        agent = row.get("agent_id")
        if iid is not None:
            ours_by_id[iid] = row
            if isinstance(agent, str):
                recorded_by_agent.setdefault(agent, set()).add(iid)
    return ours_by_id, recorded_by_agent


def _listed_action(
    inst: ListedInstance,
    iid: int,
    agent_id: str,
    record: OurRecord | None,
    recorded: set[int],
    known_agent_ids: set[str],
    now: float,
    grace_s: float,
) -> Action | None:
    """What to do with one of our fleet's instances that vast.ai lists (None: nothing)."""
    dead = never_runs(inst)
    if dead is not None:
        return Action("destroy_dead", iid, f"{dead} (agent {agent_id})")
    start = as_float(inst.get("start_date"))
    if start is None or now - start < grace_s:
        return None  # young, or not aged at all: vast.ai's lists may lag behind ours
    age = f"{now - start:.0f} s old"
    # Recorded as gone (``states.GONE``) yet listed: a leak (a vanished instance
    # listed again is destroyed too: its agent was told to stop). A failed one is
    # not gone: its destroy is already due, the monitor's to carry out and retry.
    if record is not None and record.get("state") in states.GONE:
        return Action("destroy_leaked", iid,
                      f"recorded as {record.get('state')} but still on vast.ai ({age})")
    if agent_id not in known_agent_ids:
        return Action("destroy_leaked", iid, f"agent {agent_id} unknown to us ({age})")
    if recorded and iid not in recorded:
        others = ", ".join(str(i) for i in sorted(recorded))
        return Action("destroy_leaked", iid,
                      f"duplicate of agent {agent_id}'s instance {others} ({age})")
    return None


def _vanished(ours_by_id: dict[int, OurRecord], listed: set[int], now: float,
              grace_s: float, provider: str) -> list[Action]:
    """Our records whose instance vast.ai no longer lists."""
    actions: list[Action] = []
    for iid, rec in ours_by_id.items():
        if iid in listed or rec.get("state") in states.GONE:  # gone: its absence is no news
            continue
        created = as_float(rec.get("created_at"))
        if created is not None and now - created < grace_s:
            continue  # just created: vast.ai's list may not show it yet
        actions.append(
            Action(
                "mark_vanished",
                iid,
                f"no longer listed by {provider} (was {rec.get('state')}, "
                f"agent {rec.get('agent_id')})",
            )
        )
    return actions
