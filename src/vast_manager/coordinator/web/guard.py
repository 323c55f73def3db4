"""What keeps strangers on the open internet from spending the coordinator.

- ``BodyBudget``: the request-body bytes held in memory at once, in total and per agent.
  Only requests that named an issued agent with well-formed signing headers (or carried
  the admin credentials) ever claim from it: a stranger's body is never read.
- ``CredentialThrottle``: failed admin-token attempts (dashboard logins and bearer
  tokens) per client address; past the limit every attempt from that address is refused
  with ``429`` before the token is compared, so guessing runs at a few tries a minute.
- ``QuietLog``: a log line per kind of malformed request and per interval at most, the
  rest counted; ``server_logger`` hands aiohttp's server one that writes through it.
- ``Counters``: refusals by code and malformed requests by kind, for ``/metrics``.

One ``Guard`` holds them all for one application (``create_app``); no module globals.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from vast_manager.coordinator.textsafe import clean

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: Request-body bytes held at once by every request together; beyond it ``503 busy``.
BODIES_IN_FLIGHT_MAX_BYTES = 32 * 1024 * 1024
#: ... and by the requests of one agent (a result and a log batch of 1 MiB each, and a
#: heartbeat): one hostile host holding its own key cannot take the whole budget.
AGENT_IN_FLIGHT_MAX_BYTES = 2 * 1024 * 1024 + 64 * 1024
#: ... and by the unverified bodies from one address (an agent id is no credential: it is
#: in every vast.ai label), a few agents' worth, for agents behind one NAT.
ADDRESS_IN_FLIGHT_MAX_BYTES = 4 * AGENT_IN_FLIGHT_MAX_BYTES
#: The prefix of an address's key in ``BodyBudget`` (agent ids start ``ag_``).
ADDRESS_KEY_PREFIX = "addr:"
#: Failed admin-token attempts per address within ``CREDENTIAL_WINDOW_S``.
CREDENTIAL_FAILURES = 10
CREDENTIAL_WINDOW_S = 60.0
#: Addresses remembered at once (oldest forgotten first): the table's memory is bounded.
CREDENTIAL_ADDRESSES = 4096
#: At most one line per kind of incident within this many seconds.
QUIET_LOG_INTERVAL_S = 60.0


class BodyBudget:
    """Bytes of request bodies held in memory, in total and per key (an agent id)."""

    def __init__(self, total_bytes: int = BODIES_IN_FLIGHT_MAX_BYTES,
                 per_key_bytes: int = AGENT_IN_FLIGHT_MAX_BYTES,
                 per_address_bytes: int = ADDRESS_IN_FLIGHT_MAX_BYTES) -> None:
        self.total_bytes = total_bytes
        self.per_key_bytes = per_key_bytes
        self.per_address_bytes = per_address_bytes
        self.in_flight_bytes = 0
        self._by_key: dict[str, int] = {}

    def claim(self, key: str, n: int) -> str | None:
        """Take ``n`` bytes for ``key``; None when granted, else why not (one sentence)."""
        held = self._by_key.get(key, 0)
        address = key.startswith(ADDRESS_KEY_PREFIX)
        limit = self.per_address_bytes if address else self.per_key_bytes
        if held + n > limit:
            who = "This address" if address else "This agent"
            return (f"{who} already has {held} body bytes in flight (at most "
                    f"{limit}); retry when they are answered.")
        if self.in_flight_bytes + n > self.total_bytes:
            return "The coordinator is reading too many request bodies at once; retry shortly."
        self._by_key[key] = held + n
        self.in_flight_bytes += n
        return None

    def transfer(self, from_key: str, to_key: str, n: int) -> str | None:
        """Move ``n`` claimed bytes from one key to another (an address's unverified body
        to the agent it verified as); None when done, else why not (nothing moved)."""
        if n <= 0:
            return None
        self.release(from_key, n)
        refused = self.claim(to_key, n)
        if refused is not None:
            self._by_key[from_key] = self._by_key.get(from_key, 0) + n
            self.in_flight_bytes += n
        return refused

    def release(self, key: str, n: int) -> None:
        if n <= 0:
            return
        left = self._by_key.get(key, 0) - n
        if left > 0:
            self._by_key[key] = left
        else:
            self._by_key.pop(key, None)
        self.in_flight_bytes = max(0, self.in_flight_bytes - n)


# Every agent request asks (its body is held against its address until it verifies):
# parsing the address each time cost more than the rest of the guard. Bounded: addresses
# that rotate only evict one another.
@functools.lru_cache(maxsize=4096)
def address_key(remote: str | None) -> str:
    """The unit an address is throttled by: an IPv4 address, an IPv6 /64 (one host's
    usual allocation: rotating within it buys nothing), or ``local`` (a Unix socket)."""
    if not remote:
        return "local"
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return remote[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class CredentialThrottle:
    """At most ``max_failures`` failed admin-token attempts per address and window."""

    def __init__(self, clock: Clock, *, max_failures: int = CREDENTIAL_FAILURES,
                 window_s: float = CREDENTIAL_WINDOW_S,
                 max_addresses: int = CREDENTIAL_ADDRESSES) -> None:
        self.clock = clock
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after_s(self, remote: str | None) -> int | None:
        """Whole seconds until this address may try again; None when it may now."""
        times = self._failures.get(address_key(remote))
        if times is None or len(times) < self.max_failures:
            return None
        wait = times[0] + self.window_s - self.clock()
        return max(1, math.ceil(wait)) if wait > 0 else None

    def attempt(self, remote: str | None) -> int | None:
        """Count an attempt as failed now, before anything is awaited (a dashboard login,
        whose body is read later): None when admitted, else the seconds to wait. Checked
        and counted in one step on the event loop, so parallel attempts from one address
        can never pass the limit together; ``succeeded`` forgets them again."""
        wait = self.retry_after_s(remote)
        if wait is None:
            self.failed(remote)
        return wait

    def refund(self, remote: str | None) -> None:
        """Take back one attempt counted by ``attempt``: its body held no token to compare
        (not JSON, no ``token``), so it guessed nothing."""
        times = self._failures.get(address_key(remote))
        if times:
            times.pop()

    def failed(self, remote: str | None) -> None:
        key = address_key(remote)
        now = self.clock()
        times = self._failures.pop(key, None) or deque(maxlen=self.max_failures)
        while times and times[0] + self.window_s <= now:
            times.popleft()
        times.append(now)
        self._failures[key] = times  # newest last: the oldest address is forgotten first
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)

    def succeeded(self, remote: str | None) -> None:
        self._failures.pop(address_key(remote), None)

    def __len__(self) -> int:
        return len(self._failures)


@dataclass(slots=True)
class Counters:
    """What ``/metrics`` shows of the traffic the coordinator refused."""

    refused: Counter[str] = field(default_factory=Counter)  # by error code (docs/protocol.md)
    malformed: Counter[str] = field(default_factory=Counter)  # by kind of parse error
    suppressed_log_lines: int = 0


class QuietLog:
    """Counted, rate-limited log lines: per kind, the first within an interval is written
    (with how many were left out since the last one), the rest only counted."""

    def __init__(self, logger: logging.Logger, clock: Clock, counters: Counters, *,
                 interval_s: float = QUIET_LOG_INTERVAL_S) -> None:
        self.logger = logger
        self.clock = clock
        self.counters = counters
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def report(self, kind: str, message: str, *, level: int = logging.WARNING,
               exc_info: Any = None) -> bool:
        """Write ``message`` unless ``kind`` was written within the interval; True if
        written. ``message`` may quote request bytes: it is neutralised and cut."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._held[kind] += 1
            self.counters.suppressed_log_lines += 1
            return False
        if len(self._last) > 256:  # kinds come from exception classes: a bounded set,
            self._last.clear()    # but never let a table grow on what others send
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        more = f" ({held} more like it since the last line)" if held else ""
        self.logger.log(level, "%s%s", clean(message)[:300], more, exc_info=exc_info)
        return True


class _ServerLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger for one app: its parse errors (a line and a traceback
    per malformed request) become a counted kind and a quiet line."""

    def __init__(self, guard: Guard) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.guard = guard

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, tuple):
            exc = exc[1]
        if isinstance(exc, HttpProcessingError):
            # Counted at any level (aiohttp logs a first request that is not HTTP at all,
            # e.g. a TLS hello, at debug), written once an interval at most.
            kind = type(exc).__name__
            self.guard.counters.malformed[kind] += 1
            if level >= logging.WARNING:
                text = str(msg) % args if args else str(msg)
                self.guard.quiet.report(f"malformed:{kind}",
                                        f"malformed request refused: {text}: {kind}: {exc}")
            return
        if level < logging.WARNING:
            super().log(level, msg, *args, **kwargs)
            return
        # Not the client's fault: a bug, written with its traceback, once an interval.
        text = str(msg) % args if args else str(msg)
        self.guard.quiet.report("server-error", text, level=logging.ERROR,
                                exc_info=kwargs.get("exc_info"))


@dataclass(slots=True)
class Guard:
    """One application's defences against strangers (see the module docstring)."""

    clock: Clock
    credential_failures: int = CREDENTIAL_FAILURES
    budget: BodyBudget = field(default_factory=BodyBudget)
    counters: Counters = field(default_factory=Counters)
    credentials: CredentialThrottle = field(init=False)
    quiet: QuietLog = field(init=False)

    def __post_init__(self) -> None:
        self.credentials = CredentialThrottle(self.clock, max_failures=self.credential_failures)
        self.quiet = QuietLog(logging.getLogger("vast_manager.coordinator.web.guard"), self.clock,
                              self.counters)

    def refused(self, code: str) -> None:
        self.counters.refused[code] += 1

    def server_logger(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """The ``logger`` for ``web.AppRunner(app, logger=...)`` (aiohttp's server)."""
        return _ServerLogger(self)
