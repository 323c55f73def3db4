"""Failed trials judged in the write path (``Tx.blocklist.strike``; docs/policy.md, "Blame"):
the host's count and block for a while; the same failure on a second machine is taken
back from the first, lifts its block and opens one fleet fault; forgiving a machine
takes back its strikes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vast_manager.coordinator.decisions import blame
from vast_manager.coordinator.store.writer import Store, Tx

HOUR = 3600.0
SLOW = "warm-up timed out after 1200 s"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db.sqlite")
    yield s
    s.close()


def strike(store: Store, machine: str, instance_id: int, at: float, reason: str = SLOW,
           limit: int = 2) -> str | None:
    def job(tx: Tx) -> str | None:
        return tx.blocklist.strike(machine, reason, now=at, instance_id=instance_id, limit=limit,
                                   window_s=24 * HOUR, block_s=48 * HOUR, kind=blame.TIMEOUT,
                                   state="warming")
    return store.write_blocking(job)


def kinds(store: Store) -> list[str]:
    return [str(e["kind"]) for e in store.events()]


def test_the_hosts_own_failures_block_it_with_an_expiry(store: Store) -> None:
    assert strike(store, "41001", 1, 0.0) is None
    assert strike(store, "41001", 2, 60.0, reason="benchmark timed out after 2700 s") is not None
    (block,) = store.bad_hosts()
    assert block["source"] == "strikes" and block["expires_at"] == 60.0 + 48 * HOUR
    assert "benchmark timed out" in block["reason"]
    assert store.bad_host("41001", now=61.0 + 48 * HOUR) is None  # it ends
    assert store.fleet_faults() == []


def test_the_same_failure_on_a_second_machine_is_taken_back_from_the_first(store: Store) -> None:
    strike(store, "41001", 1, 0.0)
    strike(store, "41001", 2, 60.0)  # blocked: two of its own
    assert store.bad_host("41001") is not None
    strike(store, "41002", 3, 120.0)  # the same failure elsewhere: the setup's
    assert store.bad_hosts() == []
    assert {s["fault"] for s in store.strikes()} == {"operator"}
    (fault,) = store.fleet_faults(open_only=True)
    assert fault["cause"].startswith("the same failure on 2 machines (41001, 41002)")
    strike(store, "41003", 4, 180.0)  # a third: the same fault, no second alert
    (fault,) = store.fleet_faults(open_only=True)
    assert fault["failures"] == 3
    assert kinds(store).count("fault") == 1 and "unblocked" in kinds(store)
    assert "41003" not in {b["machine_id"] for b in store.bad_hosts()}
    assert store.write_blocking(
        lambda tx: tx.blocklist.clear_fault(int(fault["id"]), "fixed", 200.0))
    assert store.fleet_faults(open_only=True) == []
    assert not store.write_blocking(
        lambda tx: tx.blocklist.clear_fault(int(fault["id"]), "again", 201.0))


def test_forgive_lifts_the_block_and_takes_back_the_strikes(store: Store) -> None:
    strike(store, "41001", 1, 0.0)
    strike(store, "41001", 2, 60.0)
    assert store.write_blocking(lambda tx: tx.blocklist.forgive("41001", 100.0))
    assert store.bad_hosts() == []
    assert {s["fault"] for s in store.strikes("41001")} == {"forgiven"}
    assert strike(store, "41001", 3, 200.0) is None  # counting starts again
    assert not store.write_blocking(lambda tx: tx.blocklist.forgive("49999", 300.0))


def test_after_a_fault_is_cleared_its_old_failures_are_not_counted_again(store: Store) -> None:
    strike(store, "41001", 1, 0.0)
    strike(store, "41002", 2, 60.0)
    (fault,) = store.fleet_faults(open_only=True)
    store.write_blocking(lambda tx: tx.blocklist.clear_fault(int(fault["id"]), "fixed", 100.0))
    strike(store, "41003", 3, 200.0)  # the same failure once after the fix: the host's
    assert store.fleet_faults(open_only=True) == []
    assert [s["fault"] for s in store.strikes("41003")] == ["host"]
    strike(store, "41004", 4, 300.0)  # and again elsewhere: not fixed after all
    (again,) = store.fleet_faults(open_only=True)
    assert again["id"] != fault["id"] and again["machines_json"] == '["41003","41004"]'
