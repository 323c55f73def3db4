"""The fleet-sized reads and the monitor's scans use an index (EXPLAIN QUERY PLAN of the
statements each ``Reads`` method really sends), not a scan of every instance."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.coordinator.web.metrics import LIVE_STATES


class _Recording:
    """A connection that notes every statement (and its parameters) sent through it."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.sent: list[tuple[str, Sequence[Any]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        self.sent.append((sql, params))
        return self.conn.execute(sql, params)


class _Probe(Reads):
    def __init__(self, conn: _Recording) -> None:
        self._conn = conn  # type: ignore[assignment]


def _fleet(tx: Tx) -> None:
    for i in range(300):
        tx.instances.add({
            "label": f"rig-{i}", "kind": "byo" if i % 10 == 0 else "deployed",
            "state": ("proving", "destroyed", "lost", "terminating")[i % 4],
            "machine_id": f"m{i % 50}", "created_at": 1.0,
            "destroy_due_at": 100.0 + i if i % 4 in (1, 3) else None,
        })


@pytest.fixture(scope="module")
def conn(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("indexes") / "coord.db"
    store = Store(path)  # every migration
    store.write_blocking(_fleet)
    store.close()
    out = sqlite3.connect(path, isolation_level=None)
    yield out
    out.close()


#: Each read, and the index its statements must use.
READS: list[tuple[str, Callable[[Reads], Any], str]] = [
    # The monitor: seeding, timeouts and the writer's preload read what is on a machine.
    ("active_instances", lambda r: r.active_instances(("id", "state")), "idx_instances_active"),
    ("instances_due_for_destroy", lambda r: r.instances_due_for_destroy(500.0),
     "idx_instances_destroy_due"),
    ("next_destroy_due_at", lambda r: r.next_destroy_due_at(), "idx_instances_destroy_due"),
    ("instances_of_kind", lambda r: r.instances_of_kind("byo", ("id", "state")),
     "idx_instances_kind"),
    # The operator's state filter, a page of it, and the counts by state.
    ("instance_values state", lambda r: r.instance_values(("id",), states=("lost",)),
     "idx_instances_state"),
    ("instance_values page", lambda r: r.instance_values(("id",), states=("lost",),
                                                         after_id=20, limit=5),
     "idx_instances_state"),
    ("instances_by_state", lambda r: r.instances_by_state(), "idx_instances_state"),
    # /metrics: the live instances' telemetry; ingest: a machine's instances.
    ("live_telemetry", lambda r: r.live_telemetry(sorted(LIVE_STATES)), "idx_instances_state"),
    ("instances_on_machine", lambda r: r.instances_on_machine("m3", ("id",)),
     "idx_instances_machine_id_state"),
]


@pytest.mark.parametrize(("name", "read", "index"), READS, ids=[n for n, _, _ in READS])
def test_the_read_uses_its_index(conn: sqlite3.Connection, name: str,
                                 read: Callable[[Reads], Any], index: str) -> None:
    recording = _Recording(conn)
    read(_Probe(recording))
    assert recording.sent, name
    for sql, params in recording.sent:
        if sql.startswith("pragma table_info"):  # the instance columns, once a connection
            continue
        plan = [row[3] for row in conn.execute(f"explain query plan {sql}", params)]
        assert any(index in step for step in plan), (name, plan)
        # Never a walk of every instance row without an index.
        assert not {"SCAN instances", "SCAN i"} & set(plan), (name, plan)


def test_the_paged_list_needs_no_sort(conn: sqlite3.Connection) -> None:
    """One state's page comes off the index in id order: no temporary sort, so a page
    costs its own rows whatever the fleet's size; the unfiltered page walks the primary
    key from ``after_id``."""
    for states in (("proving",), None):
        recording = _Recording(conn)
        _Probe(recording).instance_values(("id",), states=states, after_id=40, limit=10)
        ((sql, params),) = recording.sent
        plan = " / ".join(row[3] for row in conn.execute(f"explain query plan {sql}", params))
        assert "TEMP B-TREE" not in plan, plan
        assert "SEARCH instances" in plan, plan


def test_the_indexed_reads_answer_what_a_scan_would(tmp_path: Path) -> None:
    """The partial indexes hold exactly the rows their condition names: an instance that
    leaves the active states leaves them, and the reads agree with a plain filter."""
    store = Store(tmp_path / "coord.db")
    try:
        store.write_blocking(_fleet)
        store.write_blocking(lambda tx: tx.instances.update(4, state="vanished"))  # was due
        rows = {r["id"]: r for r in store.db.query(
            "select id, state, kind, destroy_due_at from instances")}
        active = {i for i, r in rows.items() if r["state"] not in ("destroyed", "vanished")}
        due = sorted((r["destroy_due_at"], i) for i, r in rows.items()
                     if i in active and r["destroy_due_at"] is not None)
        assert 4 not in active and rows[4]["destroy_due_at"] is not None
        assert [r["id"] for r in store.active_instances(("id",))] == sorted(active)
        assert [r["id"] for r in store.instances_due_for_destroy(250.0)] == [
            i for at, i in due if at <= 250.0]
        assert store.next_destroy_due_at() == due[0][0]
        assert [r["id"] for r in store.instances_of_kind("byo", ("id",))] == sorted(
            i for i, r in rows.items() if r["kind"] == "byo")
        assert [v[0] for v in store.instance_values(("id",), states=("lost", "proving"))] == \
            sorted(i for i, r in rows.items() if r["state"] in ("lost", "proving"))
    finally:
        store.close()
