"""Replay after a restore the agent never noticed (docs/protocol.md, "Replay").

The coordinator that acknowledged a result is lost between two of the agent's requests
and comes back restored from a replica that lacks that result. The agent saw no failed
request, so the first thing it sends the new coordinator is its next spooled item, not a
heartbeat: that item names the acknowledged one below it (``prev_acked_seq``), the
coordinator's own rule (``SpoolMarks.refuse_lacking``) refuses it, and the heartbeat
answer that follows has the agent send the lost result again before the new one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from vast_manager.agent.config import load_config
from vast_manager.agent.coordinator_client import CoordinatorClient, TransientFailure
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.reporting import Reporting
from vast_manager.coordinator.exceptions import Refusal
from vast_manager.coordinator.operations.replay import SpoolMarks
from vast_manager.protocol import Directive, Heartbeat, Result
from vast_manager.protocol.codec import decode
from vast_manager.protocol.messages import ResultAck

AGENT_ID = "ag_" + "0" * 20


class Coordinator:
    """The coordinator's side of the spool as far as replay goes: its marks (the real
    ``SpoolMarks``, refusal included) and the results it stored, in order."""

    def __init__(self, marks: tuple[int, int]) -> None:
        self.marks = SpoolMarks({AGENT_ID: marks})
        self.stored: list[str] = []
        self.refused: list[tuple[str, int | None]] = []

    async def heartbeat(self, heartbeat: Heartbeat, **_: Any) -> Directive:
        return self.marks.answer(AGENT_ID, Directive("continue", "test", 30.0, None),
                                 heartbeat.acked_seq)

    async def result(self, body: bytes, **_: Any) -> ResultAck:
        result = decode(Result, body)
        try:
            self.marks.refuse_lacking(AGENT_ID, "result", result.spool_seq,
                                      result.prev_acked_seq)
        except Refusal as refusal:
            self.refused.append((result.result_id, result.prev_acked_seq))
            raise TransientFailure(f"/v1/result answered 409 {refusal.code}") from None
        if result.result_id not in self.stored:
            self.stored.append(result.result_id)
        self.marks.raised(AGENT_ID, "result", result.spool_seq)
        return ResultAck(True, False, Directive("continue", "test", 30.0, None))


def _result(result_id: str) -> Result:
    return Result(result_id=result_id, kind="benchmark", proof_type="porep-c2-32g",
                  started_at=1.0, finished_at=2.0, gpus_used=[0], proofs_completed=1,
                  proofs_failed=0, wall_seconds=60.0, rate_per_hour=60.0,
                  proof_seconds=[60.0], telemetry=None)


async def test_a_restore_the_agent_never_noticed_loses_no_acknowledged_result(
        tmp_path: Path) -> None:
    config = load_config({
        "VM_COORDINATOR_URL": "http://127.0.0.1:9", "VM_AGENT_ID": AGENT_ID,
        "VM_AGENT_KEY": "ab" * 32, "VM_STATE_DIR": str(tmp_path / "state"),
    })
    real_client = CoordinatorClient(config.coordinator_url, config.agent_id, config.agent_key)
    try:
        ctx = AgentContext(config, real_client, lambda: 0.0)
        reporting = Reporting(ctx, Orders())
        old = Coordinator((0, 0))
        ctx.client = old  # type: ignore[assignment]
        for result_id in ("res_kept", "res_lost"):
            ctx.spool.put_result(_result(result_id))
            assert await reporting.flush_spool(give_up_after_s=5.0, logs=False)
        assert old.stored == ["res_kept", "res_lost"] and old.refused == []
        kept_seq, lost_seq = (e.seq for e in ctx.spool.acked("result"))
        await reporting.send_heartbeat(give_up_after_s=5.0)  # the old one's marks: all held

        # Lost between two requests: its replica reaches res_kept, not res_lost.
        new = Coordinator((kept_seq, 0))
        ctx.client = new  # type: ignore[assignment]
        ctx.spool.put_result(_result("res_new"))
        flush = asyncio.create_task(reporting.flush_spool(give_up_after_s=10.0, logs=False))
        for _ in range(500):
            if new.refused or flush.done():
                break
            await asyncio.sleep(0.01)
        # Refused before anything was stored; the agent waits for a heartbeat's answer.
        assert new.refused == [("res_new", lost_seq)] and new.stored == []
        await asyncio.sleep(0.05)
        assert not flush.done() and new.stored == []
        await reporting.send_heartbeat(give_up_after_s=5.0)
        assert await asyncio.wait_for(flush, 5.0)
        assert new.stored == ["res_lost", "res_new"]
        assert new.marks.of(AGENT_ID)[0] > lost_seq
    finally:
        await real_client.close()
