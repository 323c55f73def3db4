"""The link between front processes and the writer's process: frames over a Unix socket.

With ``vast-manager serve --fronts N`` the agents' heartbeats are answered by
N front processes (``coordinator.front``) while one process keeps the store,
the nonce memory and the monitor. A front sends each verified heartbeat here
and signs the answer that comes back; this module is the wire between them.

A frame is ``u32`` length of the rest, ``u16`` blob count, ``u32`` header
length, the header (an orjson array), then each blob as ``u32`` length and
bytes. Blobs carry a request body and JSON columns as they are, so nothing
is escaped into (or parsed out of) the header. Frames of one loop turn leave
in one write: at thousands of heartbeats a second, a send per frame would
cost more than the frames.

The socket lives in a 0700 folder of the coordinator's user: whoever can
connect to it could speak for any agent, and that user can read the fleet
secret anyway.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from coordinator.auth import MAX_BODY_BYTES

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_HEAD = struct.Struct(">HI")
#: The largest frame either side accepts: a body at the agents' limit and its columns.
MAX_FRAME_BYTES = 4 * MAX_BODY_BYTES

Frame = tuple[list[Any], list[bytes]]
#: The writer's side: called with a frame and a function that sends one answer frame.
FrameHandler = Callable[[list[Any], list[bytes], Callable[[list[Any], Sequence[bytes]], None]],
                        None]


class FrameError(ValueError):
    """A frame that does not parse: the link is closed (its peer is not one of ours)."""


def pack(header: list[Any], blobs: Sequence[bytes] = ()) -> bytes:
    head = orjson.dumps(header)
    parts = [b"", _HEAD.pack(len(blobs), len(head)), head]
    for blob in blobs:
        parts.append(_LENGTH.pack(len(blob)))
        parts.append(blob)
    rest = sum(len(p) for p in parts)
    parts[0] = _LENGTH.pack(rest)
    return b"".join(parts)


def unpack(frame: bytes | memoryview) -> Frame:
    """One frame without its length prefix."""
    view = memoryview(frame)
    try:
        count, head_len = _HEAD.unpack_from(view, 0)
        at = _HEAD.size + head_len
        header = orjson.loads(view[_HEAD.size:at])
        blobs = []
        for _ in range(count):
            (size,) = _LENGTH.unpack_from(view, at)
            at += _LENGTH.size
            if at + size > len(view):
                raise FrameError("a blob runs past its frame")
            blobs.append(bytes(view[at:at + size]))
            at += size
    except (struct.error, orjson.JSONDecodeError) as err:
        raise FrameError(f"malformed frame: {err}") from None
    if at != len(view) or not isinstance(header, list):
        raise FrameError("a frame's parts do not add up to its length")
    return header, blobs


class FrameBuffer:
    """Bytes in, whole frames out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        at = 0
        with memoryview(buf) as view:
            while len(buf) - at >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(view, at)
                if size > MAX_FRAME_BYTES:
                    raise FrameError(f"a frame of {size} bytes is over {MAX_FRAME_BYTES}")
                if len(buf) - at - _LENGTH.size < size:
                    break
                start = at + _LENGTH.size
                frames.append(unpack(view[start:start + size]))
                at = start + size
        del buf[:at]
        return frames


class _Link(asyncio.Protocol):
    """Frames both ways; what one loop turn sends leaves in one write."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._frames = FrameBuffer()
        self._out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, header: list[Any], blobs: Sequence[bytes] = ()) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(pack(header, blobs))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._frames.feed(data)
        except FrameError as err:
            log.error("relay link closed: %s", err)
            assert self.transport is not None
            self.transport.abort()
            return
        for header, blobs in frames:
            self.frame_received(header, blobs)

    def frame_received(self, header: list[Any], blobs: list[bytes]) -> None:
        raise NotImplementedError


class WriterSide(_Link):
    """The writer's process's end of one front's link: each frame goes to ``handler``."""

    def __init__(self, handler: FrameHandler, links: set[WriterSide]) -> None:
        super().__init__()
        self._handler = handler
        self._links = links

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._links.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._links.discard(self)

    def frame_received(self, header: list[Any], blobs: list[bytes]) -> None:
        try:
            self._handler(header, blobs, self.send)
        except Exception:
            # A bug for one frame answers that frame; the link and the others go on.
            log.exception("relay: a front's frame failed")
            if len(header) > 1 and isinstance(header[1], int):
                self.send([header[1], 500, False], [orjson.dumps(
                    {"error": "internal_error",
                     "message": "The coordinator hit an internal error."})])


class RelayServer:
    """Listens on ``path`` for fronts; ``links`` are the fronts connected now."""

    def __init__(self, handler: FrameHandler) -> None:
        self._handler = handler
        self.links: set[WriterSide] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: WriterSide(self._handler, self.links), path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for link in list(self.links):
                if link.transport is not None:
                    link.transport.close()
            await self._server.wait_closed()


class FrontSide(_Link):
    """A front's end: ``call`` sends a request frame and awaits its answer frame.

    A request's header starts with its kind; the id is put second. An answer's
    header starts with the id of the request it answers."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def call(self, kind: str, fields: list[Any], blobs: Sequence[bytes] = ()) -> Frame:
        if self.closed.done():
            raise ConnectionError("the link to the writer's process is closed")
        rid = next(self._ids)
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self.send([kind, rid, *fields], blobs)
        try:
            return await future
        finally:
            self._pending.pop(rid, None)

    def frame_received(self, header: list[Any], blobs: list[bytes]) -> None:
        future = self._pending.pop(header[0], None) if header else None
        if future is not None and not future.done():
            future.set_result((header, blobs))

    def connection_lost(self, exc: Exception | None) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the writer's process went away"))
        self._pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)


async def connect(path: str) -> FrontSide:
    loop = asyncio.get_running_loop()
    _, link = await loop.create_unix_connection(FrontSide, path)
    return link
