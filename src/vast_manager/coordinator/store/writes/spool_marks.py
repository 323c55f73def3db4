"""Writes of ``spool_marks``: the highest spool sequence number stored for each agent, by
kind (docs/protocol.md, "Replay")."""

from __future__ import annotations

from typing import Literal

from vast_manager.coordinator.store.writes.tx_base import TxBase

SpoolKind = Literal["result", "logs"]


class SpoolMarkWrites:
    """Raise an agent's mark, in the transaction that stores the item it counts."""

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def mark(self, agent_id: str, kind: SpoolKind) -> int:
        row = self._tx._conn.execute(
            f"select {kind}_seq from spool_marks where agent_id = ?", (agent_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def raise_to(self, agent_id: str, kind: SpoolKind, seq: int) -> None:
        column = f"{kind}_seq"
        self._tx._exec(
            f"insert into spool_marks (agent_id, {column}) values (?, ?) on conflict "
            f"(agent_id) do update set {column} = max({column}, excluded.{column})",
            (agent_id, seq))
