"""Replay: what a coordinator restored from an asynchronous replica lost, the agents send again.

Replication runs behind the writes (``store.replica``): a coordinator restored from its
replica may lack the last results and log batches it acknowledged. The agents keep
what was acknowledged for a while (``agent.spool``, ``VM_ACK_RETENTION``), numbered by
their spool's sequence (``spool_seq`` on each result and log batch). The coordinator
stores, in the transaction of each item, the highest sequence of each kind it holds for
the agent (``spool_marks``), and answers every heartbeat that says what the agent keeps
(``acked_seq``) with those marks; the agent sends again, in order, what it was
acknowledged above them (docs/protocol.md, "Replay").

An item whose ``prev_acked_seq`` (the agent's acknowledged item of its kind just below
it) is above the mark is refused, before anything is written: the agent may not yet know
that this coordinator lacks what it was acknowledged (the first request it sent after
the restore was not a heartbeat), and stored first, the item would raise the mark past
what is to be sent again.

Stored once: a result by its ``result_id`` (as ever); a log batch by its sequence, since
an agent sends the batches of each kind in sequence order and the database is a prefix
of its commits (what Litestream restores), so a batch at or below the agent's mark was
stored.

``SpoolMarks`` keeps the marks in memory for the heartbeat answers (no read on the hot
path), loaded from the database at start: how far the restored state reaches.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import msgspec
import orjson

from vast_manager.coordinator.exceptions import Refusal
from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.store.writes.spool_marks import SpoolKind
from vast_manager.protocol import Directive, Result
from vast_manager.protocol.codec import encode

_RECEIPT_DOMAIN = b"vast-manager result receipt v2"
#: The receipts coordinators made before v2, over every field's value; still honoured.
_RECEIPT_DOMAIN_V1 = b"vast-manager result receipt v1"


def receipt_for(fleet_secret: bytes, agent_id: str, result: Result) -> str:
    """The receipt of ``result`` (its ``receipt`` field left out): an HMAC under a key
    derived from the fleet secret, which no agent holds, of the result's fields that
    differ from their defaults. A field the contract adds later has a default
    (docs/protocol.md), so a receipt made before an upgrade still holds after it, where a
    digest of every field would change with each one added to ``Result`` or a message
    inside it."""
    return _digest(fleet_secret, _RECEIPT_DOMAIN, agent_id,
                   orjson.dumps(_set_fields(_receipted_part(result))))


def receipted(fleet_secrets: Sequence[bytes], agent_id: str, result: Result) -> bool:
    """The result carries a receipt this fleet's coordinator made for this agent (v2, or
    v1 as coordinators made them before, over every field)."""
    if result.receipt is None:
        return False
    v1_body = encode(_receipted_part(result))
    return any(hmac.compare_digest(made, result.receipt)
               for s in fleet_secrets
               for made in (receipt_for(s, agent_id, result),
                            _digest(s, _RECEIPT_DOMAIN_V1, agent_id, v1_body)))


def _receipted_part(result: Result) -> Result:
    # ``prev_acked_seq`` is left out with the receipt: it says what the agent kept when it
    # sent, which a replay may say differently.
    return msgspec.structs.replace(result, receipt=None, prev_acked_seq=None)


def _digest(fleet_secret: bytes, domain: bytes, agent_id: str, body: bytes) -> str:
    key = hmac.new(fleet_secret, domain, hashlib.sha256).digest()
    return hmac.new(key, agent_id.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def _set_fields(value: Any) -> Any:
    """``value`` as JSON values, each message as only its fields that differ from their
    defaults (in declaration order)."""
    if isinstance(value, msgspec.Struct):
        out = {}
        for f in msgspec.structs.fields(value):
            v = getattr(value, f.name)
            if f.default is not msgspec.NODEFAULT and v == f.default:
                continue
            if f.default_factory is not msgspec.NODEFAULT and v == f.default_factory():
                continue
            out[f.name] = _set_fields(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_set_fields(v) for v in value]
    if isinstance(value, dict):
        return {k: _set_fields(v) for k, v in value.items()}
    return value


class SpoolMarks:
    """Each agent's highest stored spool sequence, (results, log batches), in memory."""

    def __init__(self, marks: dict[str, tuple[int, int]] | None = None) -> None:
        self._marks = dict(marks or {})

    async def load(self, store: Store) -> None:
        """Read the marks the database holds (at start: how far a restored one reaches)."""
        self._marks = await store.read(lambda reads: reads.spool_marks())

    def of(self, agent_id: str) -> tuple[int, int]:
        return self._marks.get(agent_id, (0, 0))

    def raised(self, agent_id: str, kind: SpoolKind, seq: int | None) -> None:
        """Note a committed item's sequence (after its write returned)."""
        if seq is None:
            return
        results, logs = self.of(agent_id)
        self._marks[agent_id] = (max(results, seq), logs) if kind == "result" \
            else (results, max(logs, seq))

    def refuse_lacking(self, agent_id: str, kind: SpoolKind, spool_seq: int | None,
                       prev_acked_seq: int | None) -> None:
        """Refuse (409 ``replay_first``) an item whose ``prev_acked_seq`` is above the mark
        of its kind: the agent was acknowledged an item before it that this store lacks (a
        restore lost it). Stored first, this one would raise the mark past what is to be
        sent again; refused, the agent's next heartbeat answer says what to send."""
        if prev_acked_seq is None:
            return
        mark = self.of(agent_id)[0 if kind == "result" else 1]
        if mark < prev_acked_seq:
            raise Refusal(409, "replay_first", f"This {kind} (spool_seq {spool_seq}) follows "
                          f"the acknowledged {kind} {prev_acked_seq}, which this "
                          f"coordinator's store lacks (it reaches {mark}): send what was "
                          f"acknowledged above {mark} again first (docs/protocol.md, "
                          "\"Replay\").")

    def answer(self, agent_id: str, directive: Directive, acked_seq: int | None) -> Directive:
        """``directive`` with the agent's marks, when its heartbeat said it keeps items."""
        if acked_seq is None:
            return directive
        results, logs = self.of(agent_id)
        return msgspec.structs.replace(directive, stored_result_seq=results, stored_logs_seq=logs)
