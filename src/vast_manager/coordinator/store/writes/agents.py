"""Writes of ``agents``: issued, and revoked."""

from __future__ import annotations

from vast_manager.coordinator.store.writes.tx_base import TxBase


class AgentWrites:
    """An agent issued or revoked (the revoked flag's cache kept current)."""

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def add(
        self,
        agent_id: str,
        *,
        label: str,
        kind: str,
        min_rate_per_hour: float | None,
        issued_at: float,
        max_gpus: int | None = None,
        gpu_model: str | None = None,
    ) -> None:
        """``max_gpus``/``gpu_model``: what a bring-your-own agent's hello may list
        (docs/reliability.md, "No rate on a host's word alone")."""
        self._tx._insert(
            "agents",
            {
                "agent_id": agent_id,
                "label": label,
                "kind": kind,
                "min_rate_per_hour": min_rate_per_hour,
                "revoked": 0,
                "issued_at": issued_at,
                "max_gpus": max_gpus,
                "gpu_model": gpu_model,
            },
        )

    def revoke(self, agent_id: str, *, now: float, reason: str) -> bool:
        """Revoke; False when it was already revoked (idempotent)."""
        cur = self._tx._exec(
            "update agents set revoked = 1, revoked_at = ?, revoked_reason = ? "
            "where agent_id = ? and revoked = 0",
            (now, reason, agent_id),
        )
        self._tx._revoked.pop(agent_id, None)
        return cur.rowcount > 0
