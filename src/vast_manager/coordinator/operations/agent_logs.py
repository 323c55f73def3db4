"""An agent's log batch: its lines kept, bounded per instance; a batch sent again after a
restore (at or below the agent's stored mark, ``operations.replay``) is stored once."""

from __future__ import annotations

from collections.abc import Callable

from vast_manager.coordinator.operations.directives import require_instance
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.writer import Tx
from vast_manager.protocol.messages import LogBatch


def logs_job(
    agent_id: str, batch: LogBatch, settings: Settings, now: float
) -> Callable[[Tx], int]:
    seq = batch.spool_seq

    def job(tx: Tx) -> int:
        inst = require_instance(tx, agent_id)
        tx.instances.update(inst["id"], last_seen=now)
        if seq is not None and seq <= tx.replay.mark(agent_id, "logs"):
            return 0  # stored before: the agent sends it again (docs/protocol.md, "Replay")
        written = tx.audit.add_logs(
            inst["id"], agent_id, now,
            ((line.ts, line.source, line.text) for line in batch.lines),
            keep_lines=settings.log_lines_per_instance,
        )
        if seq is not None:
            tx.replay.raise_to(agent_id, "logs", seq)
        return written

    return job
