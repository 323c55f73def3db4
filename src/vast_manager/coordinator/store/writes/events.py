"""Writes of ``events`` and ``logs``: what happened, and what agents printed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vast_manager.coordinator.store.migrations import dumps
from vast_manager.coordinator.store.writes.held import keep_newest
from vast_manager.coordinator.store.writes.tx_base import TxBase


class EventWrites:
    """``events`` rows, and agents' log lines with their retention."""

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def add(
        self,
        now: float,
        kind: str,
        reason: str,
        *,
        instance_id: int | None = None,
        agent_id: str | None = None,
        machine_id: str | None = None,
        data: Any = None,
    ) -> int:
        return self._tx._insert(
            "events",
            {
                "ts": now,
                "kind": kind,
                "reason": reason,
                "instance_id": instance_id,
                "agent_id": agent_id,
                "machine_id": machine_id,
                "data_json": dumps(data),
            },
        )

    def add_logs(
        self,
        instance_id: int,
        agent_id: str,
        now: float,
        lines: Iterable[tuple[float, str, str]],
        *,
        keep_lines: int,
    ) -> int:
        rows = [(instance_id, agent_id, ts, source, text, now) for ts, source, text in lines]
        self._tx._conn.executemany(
            "insert into logs (instance_id, agent_id, ts, source, text, received_at) "
            "values (?, ?, ?, ?, ?, ?)",
            rows,
        )
        self._tx._exec(keep_newest("logs", "instance_id"), (instance_id, instance_id, keep_lines))
        return len(rows)
