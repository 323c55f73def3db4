"""A loopback HTTP/1.1 fault proxy for tests: sits between agents and the coordinator.

Each request read from a client gets one fate, drawn from a seeded RNG:

- ``pass``: forwarded as is, the answer returned as is;
- ``drop``: the client connection is closed and nothing goes upstream;
- ``delay``: forwarded after a random delay (up to ``max_delay_s``);
- ``reset_request``: part of the request goes upstream, then both sides are
  reset (the coordinator sees a truncated request, the client a reset);
- ``reset_response``: forwarded whole, the coordinator answers (and commits),
  then the client gets part of the answer and a reset;
- ``duplicate``: the exact same bytes are sent upstream twice, one after the
  other (same nonce: the second is a replay); the client gets one of the two
  answers, chosen by the RNG.

Upstream connections are one per request (``Connection: close``), so an
answer is simply everything upstream sends before closing. Every fate is
counted in ``counts``; with ``record=True`` every request that went upstream
whole is kept in ``exchanges`` with the answer its client got (the wire as the
coordinator saw it, for tests that check what an agent sent). Loopback only;
everything is bounded by timeouts, and ``close()`` ends every connection it
holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass

FATES = ("drop", "delay", "reset_request", "reset_response", "duplicate")
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
IO_TIMEOUT_S = 30.0


@dataclass
class FaultRates:
    """Probability of each fate per request; the rest pass untouched."""

    drop: float = 0.0
    delay: float = 0.0
    reset_request: float = 0.0
    reset_response: float = 0.0
    duplicate: float = 0.0
    max_delay_s: float = 0.5

    def total(self) -> float:
        return self.drop + self.delay + self.reset_request + self.reset_response + self.duplicate


@dataclass(frozen=True)
class Exchange:
    """One request forwarded whole and the answer its client received."""

    request: bytes
    answer: bytes

    @property
    def path(self) -> str:
        return self.request.split(b" ", 2)[1].decode()

    @property
    def body(self) -> bytes:
        return self.request.partition(b"\r\n\r\n")[2]

    @property
    def status(self) -> int:
        return int(self.answer.split(b" ", 2)[1])


class _BadRequest(Exception):
    pass


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head and Content-Length body), or None at a clean end of stream."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT_S)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise _BadRequest("truncated head") from None
        return None
    except asyncio.LimitOverrunError:
        raise _BadRequest("head too large") from None
    length = 0
    lines = head.split(b"\r\n")
    kept = [lines[0]]
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise _BadRequest("bad content-length") from None
        if lname == b"transfer-encoding":
            raise _BadRequest("chunked requests are not supported by the proxy")
        if lname in (b"connection", b"keep-alive"):
            continue
        kept.append(line)
    if length > MAX_BODY_BYTES:
        raise _BadRequest("body too large")
    body = await asyncio.wait_for(reader.readexactly(length), IO_TIMEOUT_S) if length else b""
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n" + body


class FaultProxy:
    """``await FaultProxy(rates, seed=1).start(upstream_port)``; ``url`` is what agents use."""

    def __init__(
        self, rates: FaultRates | None = None, *, seed: int = 0, record: bool = False
    ) -> None:
        self.rates = rates or FaultRates()
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.record = record
        self.exchanges: list[Exchange] = []
        self.upstream: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, upstream_port: int | None = None) -> FaultProxy:
        """Listen on a free loopback port; the upstream may be set later (``set_upstream``)."""
        if upstream_port is not None:
            self.set_upstream(upstream_port)
        self._server = await asyncio.start_server(
            self._serve_client, "127.0.0.1", 0, limit=MAX_HEADER_BYTES
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set_upstream(self, port: int, host: str = "127.0.0.1") -> None:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the fault proxy forwards to loopback only")
        self.upstream = (host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    def _fate(self) -> str:
        r = self.rng.random()
        edge = 0.0
        for name in FATES:
            edge += getattr(self.rates, name)
            if r < edge:
                return name
        return "pass"

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except (_BadRequest, TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                    self.counts["bad_client_request"] += 1
                    return
                if request is None:
                    return
                self.counts["requests"] += 1
                fate = self._fate()
                self.counts[fate] += 1
                if not await self._handle(fate, request, writer):
                    return
        except (ConnectionError, TimeoutError, OSError):
            self.counts["client_gone"] += 1
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
            self._tasks.discard(task)

    async def _handle(self, fate: str, request: bytes, writer: asyncio.StreamWriter) -> bool:
        """Apply one fate; True when the client connection may carry on (it never does:
        the upstream answered ``Connection: close``, so the client opens a new one)."""
        if fate == "drop":
            writer.transport.abort()
            return False
        if fate == "delay":
            await asyncio.sleep(self.rng.uniform(0.0, self.rates.max_delay_s))
        if fate == "reset_request":
            cut = self.rng.randint(1, max(1, len(request) - 1))
            await self._exchange(request[:cut], truncated=True)
            _reset(writer)
            return False
        if fate == "duplicate":
            first = await self._exchange(request)
            second = await self._exchange(request)
            answer = first if self.rng.random() < 0.5 else second
        else:
            answer = await self._exchange(request)
        if answer is None:
            self.counts["upstream_unreachable"] += 1
            writer.transport.abort()
            return False
        if fate == "reset_response":
            cut = self.rng.randint(0, max(0, len(answer) - 1))
            writer.write(answer[:cut])
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(writer.drain(), IO_TIMEOUT_S)
            _reset(writer)
            return False
        writer.write(answer)
        await asyncio.wait_for(writer.drain(), IO_TIMEOUT_S)
        if self.record:
            self.exchanges.append(Exchange(request, answer))
        return False

    async def _exchange(self, data: bytes, *, truncated: bool = False) -> bytes | None:
        """Send ``data`` upstream on a fresh connection; the whole answer, or None."""
        if self.upstream is None:
            return None
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), IO_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            return None
        try:
            up_writer.write(data)
            await asyncio.wait_for(up_writer.drain(), IO_TIMEOUT_S)
            if truncated:
                _reset(up_writer)
                return None
            chunks: list[bytes] = []
            size = 0
            while True:
                chunk = await asyncio.wait_for(up_reader.read(65536), IO_TIMEOUT_S)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return None
                chunks.append(chunk)
            return b"".join(chunks) or None
        except (OSError, TimeoutError):
            return None
        finally:
            up_writer.transport.abort()
