"""Bounded memory of recently seen request nonces (docs/protocol.md, request signing, step 4).

A nonce is remembered until its timestamp leaves the acceptance window, after
which the timestamp check alone refuses a replay. Per agent at most
``max_per_agent`` nonces are held; beyond that the agent is over the pace the
window allows and gets ``429``. Memory is therefore bounded by the number of
issued agents times ``max_per_agent``, whatever an attacker sends (only
requests whose signature verified reach this object).

Restart: the memory is not persisted. Instead the coordinator refuses every
timestamp at or before the second it started (``not_before``), so a request
captured before a restart cannot be replayed after it. Agents sign every try
afresh, so they never notice.
"""

from __future__ import annotations

from enum import Enum

from vast_manager.protocol.signing import TIMESTAMP_WINDOW_S


class NonceVerdict(Enum):
    OK = "ok"
    STALE = "stale_timestamp"
    REPLAYED = "replayed_nonce"
    TOO_MANY = "too_many_requests"


class NonceMemory:
    def __init__(
        self,
        *,
        window_s: int = TIMESTAMP_WINDOW_S,
        max_per_agent: int = 2000,
        not_before: int | None = None,
    ) -> None:
        self.window_s = window_s
        self.max_per_agent = max_per_agent
        self.not_before = not_before
        # Per agent: nonce -> when it may be forgotten, in arrival order (an agent's own
        # clock orders them). Plain str -> int dicts: the garbage collector never walks
        # them, where a heap of (time, nonce) tuples added one tracked object a request.
        self._seen: dict[str, dict[str, int]] = {}

    def check_timestamp(self, timestamp: int, now: float) -> bool:
        if abs(now - timestamp) > self.window_s:
            return False
        return not (self.not_before is not None and timestamp <= self.not_before)

    @staticmethod
    def _purge(seen: dict[str, int], now: float, *, everything: bool = False) -> None:
        """Forget expired nonces: from the oldest while they are expired (cheap, every
        request), or all of them (before refusing an agent as over the limit, in case a
        late arrival kept older ones queued behind it)."""
        if everything:
            for nonce in [n for n, expires in seen.items() if expires < now]:
                del seen[nonce]
            return
        while seen:
            oldest = next(iter(seen))
            if seen[oldest] >= now:
                return
            del seen[oldest]

    def check_and_remember(
        self, agent_id: str, nonce: str, timestamp: int, now: float
    ) -> NonceVerdict:
        """Check the timestamp and nonce of a request whose signature verified."""
        if not self.check_timestamp(timestamp, now):
            return NonceVerdict.STALE
        seen = self._seen.get(agent_id)
        if seen is None:
            seen = self._seen[agent_id] = {}
        else:
            self._purge(seen, now)
            if nonce in seen:
                return NonceVerdict.REPLAYED
            if len(seen) >= self.max_per_agent:
                self._purge(seen, now, everything=True)
                if len(seen) >= self.max_per_agent:
                    return NonceVerdict.TOO_MANY
        seen[nonce] = timestamp + self.window_s + 1
        return NonceVerdict.OK

    def forget_agent(self, agent_id: str) -> None:
        self._seen.pop(agent_id, None)

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())
