"""Reporting: hello, the heartbeat loop, the log shipper and delivering results through
the spool (docs/protocol.md)."""

from __future__ import annotations

import asyncio
import contextlib

from vast_manager.agent.coordinator_client import (
    PermanentFailure,
    TransientFailure,
)
from vast_manager.agent.host import net_bytes_total
from vast_manager.agent.phases.shared import (
    LOG_SHIP_INTERVAL_S,
    AgentBase,
    AgentFailure,
    agent_version,
    log,
    wait_event,
)
from vast_manager.protocol import (
    PROTOCOL_VERSION,
    Directive,
    Heartbeat,
    Hello,
    Result,
)
from vast_manager.protocol.messages import MAX_LOG_LINES, NetBytesTotal


class Reporting(AgentBase):
    """Hello, heartbeats, shipped logs and delivered results."""

    async def _hello(self) -> str:
        assert self._host is not None
        hello = Hello(
            protocol=PROTOCOL_VERSION,
            agent_version=agent_version(),
            boot_id=self.boot_id,
            container_id=self.config.container_id,
            host=self._host,
        )
        # Retried until a verified answer; the orphan watchdog bounds the wait.
        directive = await self.client.hello(hello)
        log.info("coordinator answered hello: %s (%s)", directive.action, directive.reason)
        self._on_directive(directive)
        self._background.append(asyncio.create_task(self._heartbeat_loop()))
        self._background.append(asyncio.create_task(self._shipper_loop()))
        return "prepare"

    def _build_heartbeat(self) -> Heartbeat:
        self._seq += 1
        telemetry = None
        if self._sampler is not None and self._hb_window is not None:
            telemetry = self._sampler.roll_window(self._hb_window)
        return Heartbeat(
            seq=self._seq,
            phase=self.phase,  # type: ignore[arg-type]
            phase_started_at=self.phase_started_at,
            progress=self.progress,
            proofs_completed_total=self.proofs_completed_total,
            proof_seconds_recent=list(self._proof_seconds_recent),
            telemetry=telemetry,
            failure=self._failure if self.phase == "failed" else None,
            net_bytes_total=_net_bytes(),
        )

    async def _send_heartbeat(self, give_up_after_s: float) -> None:
        heartbeat = self._build_heartbeat()
        sent_recent = len(heartbeat.proof_seconds_recent)
        try:
            directive = await self.client.heartbeat(heartbeat, give_up_after_s=give_up_after_s)
        except PermanentFailure:
            # Logged by the client; the next heartbeat is a new message.
            return
        # Proof seconds are dropped only once the coordinator has them.
        del self._proof_seconds_recent[:sent_recent]
        self._on_directive(directive)

    async def _heartbeat_loop(self) -> None:
        while True:
            self._hb_wake.clear()
            with contextlib.suppress(TransientFailure):
                await self._send_heartbeat(give_up_after_s=max(self._heartbeat_interval_s, 5.0))
            await wait_event(self._hb_wake, self._heartbeat_interval_s)

    def _spool_logs(self) -> None:
        while len(self.logs):
            self.spool.put_logs(self.logs.take(MAX_LOG_LINES))

    async def _flush_spool(self, give_up_after_s: float, logs: bool = True) -> bool:
        """Send what the spool holds, results first. True when it all went."""
        async with self._spool_lock:
            entries = self.spool.pending("result") + (self.spool.pending("logs") if logs else [])
            for entry in entries:
                try:
                    if entry.kind == "result":
                        ack = await self.client.result(
                            entry.read(), give_up_after_s=give_up_after_s
                        )
                        if entry.result_id is not None:
                            self.results_sent[entry.result_id] = ack.directive
                        log.info("result %s delivered%s: %s", entry.result_id,
                                 " (duplicate)" if ack.duplicate else "", ack.directive.action)
                        self.spool.remove(entry)
                        self._on_directive(ack.directive)
                    else:
                        await self.client.logs(entry.read(), give_up_after_s=give_up_after_s)
                        self.spool.remove(entry)
                except TransientFailure:
                    return False
                except PermanentFailure as exc:
                    # The coordinator will never take it: keeping it would block the rest.
                    log.error("coordinator refused spooled %s (%s); dropping it", entry.kind, exc)
                    self.spool.remove(entry)
                except FileNotFoundError:
                    continue
            return True

    async def _shipper_loop(self) -> None:
        while True:
            await wait_event(self.logs.batch_ready, LOG_SHIP_INTERVAL_S)
            self._spool_logs()
            await self._flush_spool(give_up_after_s=LOG_SHIP_INTERVAL_S * 6)

    async def _deliver(self, result: Result) -> Directive:
        """Spool ``result`` and send it until the coordinator verifiably has it."""
        self.spool.put_result(result)
        log.info("result %s spooled (%s)", result.result_id, result.kind)
        while True:
            await self._flush_spool(give_up_after_s=max(self._heartbeat_interval_s, 30.0),
                                    logs=False)
            directive = self.results_sent.get(result.result_id)
            if directive is not None:
                return directive
            if self.spool.find_result(result.result_id) is None:
                raise AgentFailure(f"the coordinator refused result {result.result_id}")


def _net_bytes() -> NetBytesTotal | None:
    counts = net_bytes_total()
    return None if counts is None else NetBytesTotal(rx=counts[0], tx=counts[1])
