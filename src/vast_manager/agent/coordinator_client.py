"""Signed HTTP client from the agent to the coordinator (docs/protocol.md, signing).

Every try is signed afresh (new nonce, current corrected time). An answer is
acted on only when its response signature verifies; anything else (no
answer, an unsigned or badly signed answer, a 5xx) is a transient failure,
retried under the one retry policy (``vast_manager.common.retry``: tenacity
runs the tries, ``Backoff`` says how long to wait). The wait is the client's,
not one call's: failures in a row count across calls and every call waits its
turn, so the heartbeat and the log shipper together, or a caller looping on
``TransientFailure``, never hammer a silent coordinator. The clock offset
follows ``X-VM-Server-Time``; a ``stale_timestamp`` refusal is retried at once
with the corrected time, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from vast_manager.common.retry import COORDINATOR_BACKOFF, Backoff
from vast_manager.protocol import (
    Directive,
    Heartbeat,
    Hello,
    LogBatch,
    ProtocolError,
    Result,
    ResultAck,
)
from vast_manager.protocol.codec import decode, encode, parse_json
from vast_manager.protocol.signing import (
    HEADER_SERVER_TIME,
    HEADER_SIGNATURE,
    request_headers,
    verify_response,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# Signed answers that will never succeed however often they are retried.
PERMANENT_STATUSES = frozenset({400, 403, 404, 405, 413, 422})


class ClientError(Exception):
    """Base of the client's errors."""


class TransientFailure(ClientError):
    """No verified answer before the caller's deadline; try again later."""


class PermanentFailure(ClientError):
    """The coordinator refused the request in a signed answer; retrying will not help."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class _Unanswered(ClientError):
    """One try got no verified answer that settles it; another may."""


class _StaleClock(_Unanswered):
    """A verified ``401 stale_timestamp``: the offset was just corrected from it."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes


class CoordinatorClient:
    """Talks to one coordinator as one agent. One instance per agent process."""

    def __init__(
        self,
        base_url: str,
        agent_id: str,
        agent_key: bytes,
        *,
        backoff: Backoff | None = None,
        request_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_id = agent_id
        self._key = agent_key
        backoff = backoff or COORDINATOR_BACKOFF
        self.backoff = dataclasses.replace(backoff, rng=rng.random) if rng else backoff
        self.request_timeout_s = request_timeout_s
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._session = session
        self._own_session = session is None
        # Seconds to add to the local clock to get the coordinator's.
        self.clock_offset_s = 0.0
        # Monotonic time of the last answer whose signature verified (orphan rule).
        self.last_verified_at: float | None = None
        self.consecutive_failures = 0
        self._next_try_at = 0.0  # monotonic: every call waits its turn (the module docstring)

    # -- time -----------------------------------------------------------------

    def now(self) -> float:
        """Unix time as the coordinator sees it (local clock + learned offset)."""
        return self._clock() + self.clock_offset_s

    def _learn_server_time(self, header: str | None, sent_at: float, verified: bool,
                           status: int) -> None:
        if not header:
            return
        try:
            server_time = float(header)
        except ValueError:
            return
        # An unverified header could come from anyone on the path, so it is
        # only believed for a 401: the one answer a skewed clock causes, which
        # the coordinator may send before it has verified us.
        if not verified and status != 401:
            return
        local_mid = (sent_at + self._clock()) / 2
        offset = server_time - local_mid
        # Whole-second timestamps: ignore sub-second jitter to keep signatures steady.
        if abs(offset - self.clock_offset_s) >= 1.0:
            log.info("clock offset to the coordinator is now %+.0f s", offset)
            self.clock_offset_s = offset

    # -- plumbing -------------------------------------------------------------

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s)
            )
            self._own_session = True
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    def _failed(self, why: str) -> _Unanswered:
        self.consecutive_failures += 1
        delay = self.backoff.after(self.consecutive_failures)
        self._next_try_at = self._monotonic() + delay
        log.warning("coordinator: %s; retry %d in %.1f s", why, self.consecutive_failures, delay)
        return _Unanswered(why)

    def _settled(self) -> None:
        """A verified answer: the coordinator is up, the next call need not wait."""
        self.last_verified_at = self._monotonic()
        self.consecutive_failures = 0
        self._next_try_at = 0.0

    async def _wait_turn(self, path: str, deadline: float | None) -> None:
        """Wait until the client's backoff lets a try go out (tenacity's ``before``);
        ``TransientFailure`` when that is after ``deadline``."""
        while (wait := self._next_try_at - self._monotonic()) > 0:
            if deadline is not None and self._next_try_at > deadline:
                # Use the time up to the deadline, so a caller that loops on
                # TransientFailure never spins.
                await self._sleep(max(0.0, deadline - self._monotonic()))
                raise TransientFailure(f"{path}: no verified answer in time")
            await self._sleep(wait)

    async def _try_once(self, path: str, body: bytes) -> tuple[Reply | None, str]:
        """One signed try. Returns the verified reply, or None and why it failed."""
        session = await self._get_session()
        nonce = secrets.token_hex(16)
        timestamp = int(self.now())
        headers = request_headers(self.agent_id, self._key, timestamp, nonce, "POST", path, body)
        sent_at = self._clock()
        try:
            async with session.post(self.base_url + path, data=body, headers=headers) as resp:
                data = await resp.read()
                status = resp.status
                verified = verify_response(
                    self._key, resp.headers.get(HEADER_SIGNATURE), nonce, status, data
                )
                self._learn_server_time(
                    resp.headers.get(HEADER_SERVER_TIME), sent_at, verified, status
                )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return None, f"{path} failed: {type(exc).__name__}: {exc}"
        if not verified:
            return None, f"{path} answered {status} without a valid signature (not acted on)"
        return Reply(status, data), ""

    async def call(self, path: str, body: bytes, *, give_up_after_s: float | None = None) -> Reply:
        """POST ``body`` to ``path`` until a verified answer that is final.

        Returns a verified 200. Raises ``PermanentFailure`` on a verified
        refusal that retrying cannot fix, ``TransientFailure`` when the next
        try would start after ``give_up_after_s`` seconds from now.
        """
        deadline = None if give_up_after_s is None else self._monotonic() + give_up_after_s

        async def my_turn(_state: RetryCallState) -> None:
            await self._wait_turn(path, deadline)

        # No stop and no wait of tenacity's own: the deadline and the client's turn decide.
        tries = AsyncRetrying(
            before=my_turn,
            retry=retry_if_exception_type(_Unanswered),
            sleep=_waited_in_turn,
            reraise=True,
        )
        stale_before = False
        async for attempt in tries:
            with attempt:
                try:
                    return await self._try_to_settle(path, body)
                except _StaleClock:
                    if stale_before:  # the corrected time was stale too: back off
                        raise self._failed(f"{path} answered 401 stale_timestamp") from None
                    stale_before = True
                    log.warning("coordinator said our clock is off; retrying with the "
                                "corrected time")
                    raise
        raise AssertionError("unreachable: tenacity returns or raises")

    async def _try_to_settle(self, path: str, body: bytes) -> Reply:
        """One try: the verified 200, or ``PermanentFailure``, or ``_Unanswered``."""
        reply, why = await self._try_once(path, body)
        if reply is None:
            raise self._failed(why)
        if reply.status == 200:
            self._settled()
            return reply
        code, message = _error_of(reply.body)
        if reply.status in PERMANENT_STATUSES:
            self._settled()  # verified, so the coordinator is up
            log.error("coordinator refused %s: %s %s: %s", path, reply.status, code, message)
            raise PermanentFailure(reply.status, code, message)
        self.last_verified_at = self._monotonic()
        if reply.status == 401 and code == "stale_timestamp":
            raise _StaleClock(f"{path} answered 401 stale_timestamp")
        # 409 replayed_nonce, 429, 5xx and anything unexpected: back off and retry.
        raise self._failed(f"{path} answered {reply.status} {code}")

    # -- the four endpoints ---------------------------------------------------

    async def hello(self, hello: Hello, *, give_up_after_s: float | None = None) -> Directive:
        reply = await self.call("/v1/hello", encode(hello), give_up_after_s=give_up_after_s)
        return _decode_answer(Directive, reply)

    async def heartbeat(
        self, heartbeat: Heartbeat, *, give_up_after_s: float | None = None
    ) -> Directive:
        reply = await self.call("/v1/heartbeat", encode(heartbeat), give_up_after_s=give_up_after_s)
        return _decode_answer(Directive, reply)

    async def result(
        self, result: Result | bytes, *, give_up_after_s: float | None = None
    ) -> ResultAck:
        body = result if isinstance(result, bytes) else encode(result)
        reply = await self.call("/v1/result", body, give_up_after_s=give_up_after_s)
        return _decode_answer(ResultAck, reply)

    async def logs(self, batch: LogBatch | bytes, *, give_up_after_s: float | None = None) -> None:
        body = batch if isinstance(batch, bytes) else encode(batch)
        await self.call("/v1/logs", body, give_up_after_s=give_up_after_s)


async def _waited_in_turn(_seconds: float) -> None:
    """tenacity's sleep between tries, always 0 s here: ``_wait_turn`` does the waiting."""


def _error_of(body: bytes) -> tuple[str, str]:
    try:
        obj = parse_json(body)
    except ProtocolError:
        return "unknown", "the answer is not JSON"
    if isinstance(obj, dict):
        return str(obj.get("error", "unknown"))[:100], str(obj.get("message", ""))[:500]
    return "unknown", ""


def _decode_answer(cls: type[T], reply: Reply) -> T:
    try:
        return decode(cls, reply.body)
    except ProtocolError as exc:
        # Signed but not understood: a coordinator of another contract. Not retried.
        raise PermanentFailure(reply.status, "bad_answer", exc.message) from None
