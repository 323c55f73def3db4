"""The one rule for a cuzk daemon that fails, whatever the agent was doing with it
(docs/reliability.md, "When the cuzk daemon dies").

A failure of cuzk's work (``CuzkError``: the daemon exited, or a cuzk-bench run against it
failed) while warming up, benchmarking or proving is logged, the daemon is restarted and
the step is done again from its start: the warm-up from its proof, the benchmark from its
first proof (a run the daemon failed in measures nothing), proving goes on. The
``LIMIT``-th failure within ``WINDOW_S`` fails the agent instead: a host whose daemon keeps
dying costs its rent and proves nothing. Failures count across phases: one ``DaemonCrashes``
per agent (``AgentContext.crashes``).
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from typing import TypeVar

from vast_manager.agent.cuzk import CuzkDaemon, CuzkError
from vast_manager.agent.phases.shared import AgentFailure, log

#: The failures within ``WINDOW_S`` that fail the agent.
LIMIT = 3
WINDOW_S = 1800.0
#: How long a failed step waits to see whether the daemon process has exited with it
#: (cuzk-bench can notice a killed daemon before the agent reaps it).
EXIT_SEEN_WITHIN_S = 2.0

T = TypeVar("T")


class DaemonCrashes:
    """The daemon's failures of the last ``window_s`` seconds, and the rule on them."""

    def __init__(self, daemon: CuzkDaemon, monotonic: Callable[[], float],
                 limit: int = LIMIT, window_s: float = WINDOW_S) -> None:
        self.daemon = daemon
        self.monotonic = monotonic
        self.limit = limit
        self.window_s = window_s
        self.times: collections.deque[float] = collections.deque()

    async def run(self, doing: str, step: Callable[[], Awaitable[T]],
                  restart: Callable[[], Awaitable[None]]) -> T:
        """``step()``'s value; on a ``CuzkError`` the failure is counted (``AgentFailure``
        at the limit), ``restart()`` brings a new daemon up and ``step()`` runs again. A
        restart that fails is one more failure."""
        failed = False
        while True:
            try:
                if failed:
                    await restart()
                return await step()
            except CuzkError as exc:
                await self.failed(doing, exc)
                failed = True

    async def failed(self, doing: str, exc: CuzkError) -> None:
        """Count one failure of the daemon while ``doing``; log it, or raise
        ``AgentFailure`` (the count and the last failure) when it reaches the limit."""
        what = f"{exc}{await self._exit_text()}"
        now = self.monotonic()
        while self.times and now - self.times[0] >= self.window_s:
            self.times.popleft()
        self.times.append(now)
        if len(self.times) >= self.limit:
            raise AgentFailure(
                f"the cuzk daemon failed {len(self.times)} times in "
                f"{self.window_s / 60:.0f} minutes, the last while {doing}: {what}")
        log.error("the cuzk daemon failed while %s (failure %d of the %d allowed in %.0f "
                  "minutes): %s; restarting it", doing, len(self.times), self.limit - 1,
                  self.window_s / 60, what)

    async def _exit_text(self) -> str:
        code = await self.daemon.exit_status(EXIT_SEEN_WITHIN_S)
        return "" if code is None else f" (the daemon exited with status {code})"
