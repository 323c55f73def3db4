"""Writes of ``autopilot``: the switch, and when it last explored."""

from __future__ import annotations

from vast_manager.coordinator.store.writes.tx_base import TxBase


class AutopilotWrites:
    """The autopilot's switch (one row)."""

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def set(self, state: str, *, now: float, by: str, reason: str) -> None:
        self._tx._exec(
            "insert into autopilot (id, state, changed_at, changed_by, reason) "
            "values (1, ?, ?, ?, ?) on conflict (id) do update set state = excluded.state, "
            "changed_at = excluded.changed_at, changed_by = excluded.changed_by, "
            "reason = excluded.reason",
            (state, now, by, reason),
        )

    def note_exploration(self, now: float) -> None:
        self._tx._exec("update autopilot set last_exploration_at = ? where id = 1", (now,))
