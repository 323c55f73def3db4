"""Reconciliation plan: leaked, dead (will never run), vanished; other fleets and unlabelled
ones untouched. Statuses and start-failure messages are vast.ai's (docs/vast.md)."""

from __future__ import annotations

from typing import Any

import pytest

from vast_manager.coordinator.decisions.reconcile import Action, never_runs, parse_label, plan

FLEET = "f1e2d3c4"
NOW = 1_700_000_000.0
GRACE = 900.0
KNOWN = "ag_" + "a" * 20
UNKNOWN = "ag_" + "b" * 20


#: A start failure as docker reports it in vast.ai's status_msg (dstack's check).
OCI_FAILURE = (
    "Error response from daemon: failed to create task for container: failed to create "
    "shim task: OCI runtime create failed: runc create failed: unable to start container "
    "process: error during container init: nvidia-container-cli: device error: unknown device"
)


def inst(
    iid: int, label: str | None, *, age_s: float = 3600.0, status: str | None = "running",
    status_msg: str | None = None,
) -> dict[str, Any]:
    return {
        "id": iid,
        "label": label,
        "machine_id": iid * 10,
        "actual_status": status,
        "status_msg": status_msg,
        "start_date": NOW - age_s,
    }


def ours(iid: int | None, agent: str, state: str = "proving", **extra: Any) -> dict[str, Any]:
    return {"instance_id": iid, "agent_id": agent, "state": state, **extra}


def run(provider: list[dict[str, Any]], our: list[dict[str, Any]]) -> list[Action]:
    return plan(provider, our, FLEET, {KNOWN}, NOW, GRACE)


def test_our_running_instance_is_left_alone() -> None:
    assert run([inst(1, f"vm:{FLEET}:{KNOWN}")], [ours(1, KNOWN)]) == []


def test_leaked_instance_destroyed_after_grace_not_before() -> None:
    young = inst(2, f"vm:{FLEET}:{UNKNOWN}", age_s=GRACE - 1)
    assert run([young], []) == []
    old = inst(2, f"vm:{FLEET}:{UNKNOWN}", age_s=GRACE)
    (action,) = run([old], [])
    assert action.kind == "destroy_leaked"
    assert action.instance_id == 2
    assert UNKNOWN in action.reason


def test_leaked_without_start_date_is_not_aged() -> None:
    row = inst(2, f"vm:{FLEET}:{UNKNOWN}")
    del row["start_date"]
    assert run([row], []) == []


@pytest.mark.parametrize("status", ["exited", "unknown", "offline", "stopped"])
def test_statuses_that_never_run_are_destroyed(status: str) -> None:
    # Even a young one: it bills (storage at least) until destroyed.
    row = inst(3, f"vm:{FLEET}:{KNOWN}", age_s=10, status=status)
    (action,) = run([row], [ours(3, KNOWN)])
    assert action == Action("destroy_dead", 3, f"vast.ai status {status} (agent {KNOWN})")


def test_created_with_a_start_failure_is_destroyed() -> None:
    row = inst(3, f"vm:{FLEET}:{KNOWN}", age_s=10, status="created", status_msg=OCI_FAILURE)
    (action,) = run([row], [ours(3, KNOWN, "deploying")])
    assert action.kind == "destroy_dead"
    assert action.reason.startswith("vast.ai status created, start failed: Error response")
    assert action.reason.endswith(f"... (agent {KNOWN})")  # the host's text is clipped


@pytest.mark.parametrize(
    ("status", "msg"),
    [
        (None, None),  # provisioning
        ("loading", "Pulling image"),
        ("created", None),  # made, not started yet
        ("created", "Creating container"),
        ("running", "success, running ghcr.io/x/y"),
        ("scheduling", None),
    ],
)
def test_statuses_that_may_still_run_are_left_alone(status: str | None, msg: str | None) -> None:
    row = inst(3, f"vm:{FLEET}:{KNOWN}", status=status, status_msg=msg)
    assert never_runs(row) is None
    assert run([row], [ours(3, KNOWN, "deploying")]) == []


def test_never_runs_strips_control_characters_of_the_host_text() -> None:
    reason = never_runs({"actual_status": "created",
                         "status_msg": "OCI runtime create failed:\n\x1b[31mboom"})
    assert reason == "vast.ai status created, start failed: OCI runtime create failed: [31mboom"


def test_dead_unknown_agent_destroyed_as_dead() -> None:
    (action,) = run([inst(4, f"vm:{FLEET}:{UNKNOWN}", status="exited", age_s=5)], [])
    assert action.kind == "destroy_dead"


def test_vanished_instance_marked() -> None:
    (action,) = run([], [ours(5, KNOWN, "benchmarking")])
    assert action.kind == "mark_vanished"
    assert action.instance_id == 5
    assert "benchmarking" in action.reason


def test_vanish_rules_skip_destroyed_young_and_unassigned_records() -> None:
    our = [
        ours(6, KNOWN, "destroyed"),
        ours(7, KNOWN, "deploying", created_at=NOW - 30),
        ours(None, KNOWN, "deploying"),  # no vast.ai id yet
    ]
    assert run([], our) == []
    assert run([], [ours(7, KNOWN, "deploying", created_at=NOW - GRACE)])[0].kind == (
        "mark_vanished"
    )


@pytest.mark.parametrize(
    "label",
    [
        None,
        "",
        "my own box",
        "vm:0badf1ee:" + UNKNOWN,  # another fleet
        f"vm:{FLEET}",  # malformed
        f"vm:{FLEET}:{UNKNOWN}:x",  # malformed
        f"xvm:{FLEET}:{UNKNOWN}",
        f"VM:{FLEET}:{UNKNOWN}",
    ],
)
def test_instances_without_our_fleet_id_are_never_touched(label: str | None) -> None:
    for status in ("running", "exited", "offline", "unknown", "stopped"):
        row = inst(8, label, age_s=10 * GRACE, status=status)
        assert run([row], []) == []
    row = inst(8, label, age_s=10 * GRACE, status="created", status_msg=OCI_FAILURE)
    assert run([row], []) == []


def test_other_fleet_survives_beside_ours() -> None:
    provider = [
        inst(9, f"vm:0badf1ee:{KNOWN}", status="exited"),
        inst(10, f"vm:{FLEET}:{UNKNOWN}"),
        inst(11, None, status="offline"),
    ]
    actions = run(provider, [])
    assert [(a.kind, a.instance_id) for a in actions] == [("destroy_leaked", 10)]


def test_duplicate_instance_of_a_known_agent_is_leaked() -> None:
    # vast.ai sold the offer twice: two instances carry the same label.
    provider = [inst(12, f"vm:{FLEET}:{KNOWN}"), inst(13, f"vm:{FLEET}:{KNOWN}")]
    actions = run(provider, [ours(12, KNOWN)])
    assert [(a.kind, a.instance_id) for a in actions] == [("destroy_leaked", 13)]
    assert "duplicate" in actions[0].reason
    young_dup = [inst(12, f"vm:{FLEET}:{KNOWN}"), inst(13, f"vm:{FLEET}:{KNOWN}", age_s=5)]
    assert run(young_dup, [ours(12, KNOWN)]) == []


def test_known_agent_without_recorded_instance_is_adopted_not_destroyed() -> None:
    # A deploy whose create answer was lost: the record has no id yet.
    assert run([inst(14, f"vm:{FLEET}:{KNOWN}")], [ours(None, KNOWN, "deploying")]) == []


def test_recorded_destroyed_but_still_listed_is_destroyed_again() -> None:
    (action,) = run([inst(15, f"vm:{FLEET}:{KNOWN}")], [ours(15, KNOWN, "destroyed")])
    assert action.kind == "destroy_leaked"
    assert "recorded as destroyed" in action.reason


def test_actions_are_sorted_and_combined() -> None:
    provider = [
        inst(21, f"vm:{FLEET}:{UNKNOWN}"),
        inst(20, f"vm:{FLEET}:{KNOWN}", status="exited"),
    ]
    actions = run(provider, [ours(20, KNOWN), ours(22, KNOWN)])
    assert [(a.kind, a.instance_id) for a in actions] == [
        ("destroy_dead", 20),
        ("destroy_leaked", 21),
        ("mark_vanished", 22),
    ]


def test_parse_label() -> None:
    assert parse_label(f"vm:{FLEET}:{KNOWN}") == (FLEET, KNOWN)
    assert parse_label(f" vm:{FLEET}:{KNOWN} ") == (FLEET, KNOWN)
    assert parse_label("vm::x") is None
    assert parse_label(42) is None


def test_store_rows_with_provider_instance_id() -> None:
    # The store's rows: own "id", vast.ai's id in "provider_instance_id".
    row = {"id": 1, "provider_instance_id": 31, "agent_id": KNOWN, "state": "proving"}
    assert run([inst(31, f"vm:{FLEET}:{KNOWN}")], [row]) == []
    (action,) = run([], [row])
    assert (action.kind, action.instance_id) == ("mark_vanished", 31)
