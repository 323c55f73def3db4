"""Reporting: hello, the heartbeat loop, the log shipper and delivering results through
the spool (docs/protocol.md). Every directive the coordinator answers with goes to the
loop's ``Orders``.

Replay (docs/protocol.md, "Replay"): each heartbeat says the highest spool sequence the
coordinator acknowledged that the agent still keeps (``acked_seq``); the answer says
how far the coordinator's store reaches (``stored_result_seq``, ``stored_logs_seq``),
and the next flush of the spool sends again, in order, what was acknowledged above it.
After the coordinator went silent (it may come back restored) the spool waits for a
heartbeat's answer before it sends anything, so nothing new overtakes what is to be sent
again: per kind, the coordinator stores the items in sequence order. Each item says the
acknowledged item of its kind just below it that the agent keeps (``prev_acked_seq``): a
coordinator restored without it refuses the item, so a restore the agent never noticed
(its first request to the new coordinator was not a heartbeat) loses nothing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import msgspec

from vast_manager.agent.coordinator_client import (
    PermanentFailure,
    TransientFailure,
)
from vast_manager.agent.host import net_bytes_total
from vast_manager.agent.phases.context import AgentContext, Orders
from vast_manager.agent.phases.shared import (
    DEFAULT_HEARTBEAT_S,
    LOG_SHIP_INTERVAL_S,
    AgentFailure,
    agent_version,
    heartbeat_interval_s,
    log,
    wait_event,
)
from vast_manager.agent.spool import Kind, SpoolEntry
from vast_manager.protocol import (
    PROTOCOL_VERSION,
    Directive,
    Heartbeat,
    Hello,
    LogBatch,
    Result,
)
from vast_manager.protocol.codec import decode, encode
from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.messages import MAX_LOG_LINES, NetBytesTotal


class Reporting:
    """Hello, heartbeats, shipped logs and delivered results."""

    def __init__(self, ctx: AgentContext, orders: Orders) -> None:
        self.ctx = ctx
        self.orders = orders
        self.boot_id = secrets.token_hex(16)
        self.heartbeat_interval_s = heartbeat_interval_s(DEFAULT_HEARTBEAT_S,
                                                         ctx.config.orphan_timeout_s)
        #: The directive that answered each delivered result, by result id.
        self.results_sent: dict[str, Directive] = {}
        self._seq = 0
        self._window: int | None = None  # the sampler's window each heartbeat rolls
        self._spool_lock = asyncio.Lock()
        #: How far the coordinator said its store reaches, by kind (None: it did not say).
        self._stored: dict[str, int] | None = None
        #: A heartbeat was answered since the coordinator last went silent; at start, set
        #: unless the spool keeps acknowledged entries (then the first answer says what
        #: the coordinator lacks).
        self._heard = asyncio.Event()
        if ctx.spool.acked_seq() is None:
            self._heard.set()

    def open_window(self) -> None:
        """Open the telemetry window the heartbeats report (once the sampler runs)."""
        assert self.ctx.sampler is not None
        self._window = self.ctx.sampler.open_window()

    def on_directive(self, directive: Directive) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s(directive.next_heartbeat_s,
                                                         self.ctx.config.orphan_timeout_s)
        self.orders.obey(directive, self.ctx.phase)

    async def hello(self) -> str:
        ctx = self.ctx
        assert ctx.host is not None
        hello = Hello(
            protocol=PROTOCOL_VERSION,
            agent_version=agent_version(),
            boot_id=self.boot_id,
            container_id=ctx.config.container_id,
            host=ctx.host,
        )
        # Retried until a verified answer; the orphan watchdog bounds the wait.
        directive = await ctx.client.hello(hello)
        log.info("coordinator answered hello: %s (%s)", directive.action, directive.reason)
        self.on_directive(directive)
        ctx.tasks.append(asyncio.create_task(self._heartbeat_loop()))
        ctx.tasks.append(asyncio.create_task(self._shipper_loop()))
        return "prepare"

    def _build_heartbeat(self) -> Heartbeat:
        ctx = self.ctx
        self._seq += 1
        telemetry = None
        if ctx.sampler is not None and self._window is not None:
            telemetry = ctx.sampler.roll_window(self._window)
        return Heartbeat(
            seq=self._seq,
            phase=ctx.phase,  # type: ignore[arg-type]
            phase_started_at=ctx.phase_started_at,
            progress=ctx.progress,
            proofs_completed_total=ctx.proofs_completed_total,
            proof_seconds_recent=list(ctx.proof_seconds_recent),
            telemetry=telemetry,
            failure=ctx.failure if ctx.phase == "failed" else None,
            net_bytes_total=_net_bytes(),
            acked_seq=ctx.spool.acked_seq(),
        )

    async def send_heartbeat(self, give_up_after_s: float) -> None:
        heartbeat = self._build_heartbeat()
        sent_recent = len(heartbeat.proof_seconds_recent)
        try:
            directive = await self.ctx.client.heartbeat(heartbeat,
                                                        give_up_after_s=give_up_after_s)
        except PermanentFailure:
            # Logged by the client; the next heartbeat is a new message.
            return
        # Proof seconds are dropped only once the coordinator has them.
        del self.ctx.proof_seconds_recent[:sent_recent]
        if directive.stored_result_seq is not None and directive.stored_logs_seq is not None:
            self._stored = {"result": directive.stored_result_seq,
                            "logs": directive.stored_logs_seq}
        self._heard.set()
        self.on_directive(directive)

    def _went_silent(self) -> None:
        """No answer: the next coordinator may be one restored with less (the module doc)."""
        self._heard.clear()
        self._stored = None

    async def _heartbeat_loop(self) -> None:
        wake = self.ctx.phase_changed
        while True:
            wake.clear()
            try:
                await self.send_heartbeat(give_up_after_s=max(self.heartbeat_interval_s, 5.0))
            except TransientFailure:
                self._went_silent()
            await wait_event(wake, self.heartbeat_interval_s)

    def spool_logs(self) -> None:
        logs, spool = self.ctx.logs, self.ctx.spool
        while len(logs):
            spool.put_logs(logs.take(MAX_LOG_LINES))

    async def flush_spool(self, give_up_after_s: float, logs: bool = True) -> bool:
        """Send what the spool holds, results first. True when it all went.

        Each entry gets one try: after a failure the coordinator is silent, and the flush
        waits (within ``give_up_after_s``) for a heartbeat's answer, then starts over with
        what that answer says is to be sent again (the module doc)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + give_up_after_s
        async with self._spool_lock:
            while True:
                try:
                    await asyncio.wait_for(self._heard.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return False
                if await self._flush_once(logs):
                    return True

    async def _flush_once(self, logs: bool) -> bool:
        """One pass over what is to be sent again and the pending entries; False at the
        first entry that got no answer."""
        spool = self.ctx.spool
        kinds: tuple[Kind, ...] = ("result", "logs") if logs else ("result",)
        acked = {kind: spool.acked(kind) for kind in kinds}  # one listing a pass
        # The acknowledged sequences kept, by kind: each entry names the one below it.
        kept = {kind: [e.seq for e in entries] for kind, entries in acked.items()}
        for entry in self._to_replay(acked) + [e for kind in kinds
                                               for e in spool.pending(kind)]:
            below = kept[entry.kind]
            try:
                body = await self._send(entry, max((s for s in below if s < entry.seq),
                                                   default=None))
                spool.acknowledged(entry, body)
                below.append(entry.seq)
            except TransientFailure:
                self._went_silent()
                return False
            except PermanentFailure as exc:
                # The coordinator will never take it: keeping it would block the rest.
                log.error("coordinator refused spooled %s (%s); dropping it", entry.kind, exc)
                spool.remove(entry)
                with contextlib.suppress(ValueError):
                    below.remove(entry.seq)
            except FileNotFoundError:
                continue
            if self._stored is not None:  # taken (or refused for good): past it now
                self._stored[entry.kind] = max(self._stored[entry.kind], entry.seq)
        return True

    def _to_replay(self, acked: dict[Kind, list[SpoolEntry]]) -> list[SpoolEntry]:
        """Of ``acked`` (by kind, in sequence order), the entries above what the
        coordinator said it stores, results first (the order the coordinator took them
        in)."""
        stored = self._stored
        if stored is None:
            return []
        again = [e for kind, entries in acked.items() for e in entries if e.seq > stored[kind]]
        if again:
            log.warning("the coordinator lacks %d acknowledged item(s) (its store reaches "
                        "result %d, logs %d): sending them again", len(again),
                        stored["result"], stored["logs"])
        return again

    async def _send(self, entry: SpoolEntry, prev: int | None) -> bytes | None:
        """Send one entry, one try (``give_up_after_s=0``: the client's backoff is the
        heartbeat's to wait out), saying ``prev``, the acknowledged entry of its kind below
        it that the coordinator must hold (the module doc); returns the body to keep for a
        replay when it changed (a result with the coordinator's receipt), else None."""
        client = self.ctx.client
        if entry.kind != "result":
            await client.logs(_with_prev(LogBatch, entry.read(), prev), give_up_after_s=0)
            return None
        body = _with_prev(Result, entry.read(), prev)
        ack = await client.result(body, give_up_after_s=0)
        if entry.result_id is not None:
            self.results_sent[entry.result_id] = ack.directive
        log.info("result %s delivered%s: %s", entry.result_id,
                 " (duplicate)" if ack.duplicate else "", ack.directive.action)
        self.on_directive(ack.directive)
        if ack.receipt is None:
            return None
        return encode(msgspec.structs.replace(decode(Result, body), receipt=ack.receipt))

    async def _shipper_loop(self) -> None:
        while True:
            await wait_event(self.ctx.logs.batch_ready, LOG_SHIP_INTERVAL_S)
            self.spool_logs()
            await self.flush_spool(give_up_after_s=LOG_SHIP_INTERVAL_S * 6)

    async def deliver(self, result: Result) -> Directive:
        """Spool ``result`` and send it until the coordinator verifiably has it."""
        spool = self.ctx.spool
        spool.put_result(result)
        log.info("result %s spooled (%s)", result.result_id, result.kind)
        while True:
            await self.flush_spool(give_up_after_s=max(self.heartbeat_interval_s, 30.0),
                                   logs=False)
            directive = self.results_sent.get(result.result_id)
            if directive is not None:
                return directive
            if spool.find_result(result.result_id) is None:
                raise AgentFailure(f"the coordinator refused result {result.result_id}")


def _with_prev(cls: type[Result] | type[LogBatch], body: bytes, prev: int | None) -> bytes:
    """``body`` (a spooled ``cls``) saying ``prev_acked_seq``; as it is when it does not
    decode (the coordinator refuses it for good, and the spool drops it)."""
    try:
        item = decode(cls, body)
    except ProtocolError:
        return body
    return encode(msgspec.structs.replace(item, prev_acked_seq=prev))


def _net_bytes() -> NetBytesTotal | None:
    counts = net_bytes_total()
    return None if counts is None else NetBytesTotal(rx=counts[0], tx=counts[1])
