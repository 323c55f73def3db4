"""The one retry policy: capped exponential backoff with equal jitter, run by tenacity.

Every caller that retries over the network uses it: the agent's signed client to the
coordinator, the parameter downloader and the self-destroy on the agent's side, the
vast.ai REST client on the coordinator's. Each keeps its own numbers (``Backoff``) and
its own judgement of which failures are worth another try; the waiting, counting and
giving up are tenacity's (``retrying``), and tests pass a ``sleep`` that returns at once.
A server that says how long to wait (HTTP ``Retry-After``) is believed instead of the
backoff (``server_wait``): the ``vastai`` 1.9.1 client does the same (docs/vast.md).

Wait *n* (after the *n*-th failure in a row) is drawn in ``[ceiling / 2, ceiling]``,
``ceiling = min(cap_s, base_s * factor ** (n - 1))``: half fixed, so the delay really
grows and a silent peer is not hammered; half random, so a fleet that lost its peer at
the same moment does not come back in lockstep. (tenacity's own jittered waits add a
bounded jitter under the cap, or draw from zero; neither keeps both halves.)
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_never

Sleep = Callable[[float], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait after each failure in a row; ``rng`` draws in [0, 1)."""

    base_s: float = 1.0
    cap_s: float = 60.0
    factor: float = 2.0
    rng: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def after(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row (0 for none)."""
        if failures <= 0:
            return 0.0
        # min() before the power would overflow: a long outage counts thousands of failures.
        exponent = min(failures - 1, 1000)
        ceiling = min(self.cap_s, self.base_s * self.factor**exponent)
        return ceiling / 2 + self.rng() * ceiling / 2

    def __call__(self, retry_state: RetryCallState) -> float:
        """tenacity's wait: the attempt that just failed is the n-th failure in a row."""
        return self.after(retry_state.attempt_number)


#: How an agent retries its coordinator (``agent.coordinator_client``): after a
#: coordinator restart an agent may still be waiting out up to ``cap_s`` of it, so the
#: coordinator times no silence before that has passed too (``Monitor.seed``).
COORDINATOR_BACKOFF = Backoff()


def retrying(
    backoff: Backoff,
    *,
    retry_on: Callable[[BaseException], bool],
    attempts: int | None,
    sleep: Sleep,
    log: logging.Logger,
    what: str,
    server_wait: Callable[[BaseException], float | None] | None = None,
) -> AsyncRetrying:
    """A tenacity loop under ``backoff``: a failure ``retry_on`` accepts is tried again,
    up to ``attempts`` tries in all (None: until it succeeds); any other failure, and
    the last one, is raised as it is. Each retry is logged as a warning naming ``what``.
    ``server_wait`` reads the wait a failure itself names (a ``Retry-After``), used in
    place of the backoff's when it gives one."""

    def wait(state: RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome is not None else None
        told = server_wait(failure) if server_wait is not None and failure is not None else None
        return told if told is not None else backoff(state)

    def log_retry(state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "%s: %s; retry %d in %.1f s", what, failure, state.attempt_number, state.upcoming_sleep
        )

    return AsyncRetrying(
        stop=stop_never if attempts is None else stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(retry_on),
        sleep=sleep,
        before_sleep=log_retry,
        reraise=True,
    )
