"""On-disk spool of results and log batches until the coordinator verifiably took them,
and kept for a while after.

Each entry is one file holding the exact request body, written to a temporary
name, fsynced, renamed and the directory fsynced, so it survives a crash or a
power cut once ``put_*`` returns. An entry leaves the spool only after a verified
``200``: it then moves to ``acked/``, where it stays ``retention_s`` (the coordinator
replicates its database asynchronously, so a coordinator restored from its replica may
lack it and ask for it again: docs/protocol.md, "Replay"). The spool is bounded: when
it grows past ``max_bytes`` the oldest log batches are dropped, a result never;
``acked/`` is bounded by the same figure, its oldest entries going first.

Every entry has a sequence number, never reused: a new spool starts at the current
Unix time in milliseconds, and ``acked/`` keeps the latest numbers across restarts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from vast_manager.protocol import LogBatch, LogLine, Result
from vast_manager.protocol.codec import encode

log = logging.getLogger(__name__)

Kind = Literal["result", "logs"]
_NAME_RE = re.compile(
    r"(?P<seq>[0-9]{12,19})-(?P<kind>result|logs)(?:-(?P<rid>[A-Za-z0-9_.-]+))?\.json"
)


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    kind: Kind
    seq: int
    path: Path
    size_bytes: int
    result_id: str | None = None

    def read(self) -> bytes:
        return self.path.read_bytes()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entries(directory: Path, kind: Kind | None) -> list[SpoolEntry]:
    """The entries in ``directory`` (of ``kind``, or all), oldest first."""
    entries = []
    for path in directory.iterdir():
        m = _NAME_RE.fullmatch(path.name)
        if m is None:
            continue
        entry_kind: Kind = "result" if m["kind"] == "result" else "logs"
        if kind is not None and entry_kind != kind:
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        entries.append(SpoolEntry(entry_kind, int(m["seq"]), path, size, m["rid"]))
    entries.sort(key=lambda e: e.seq)
    return entries


class Spool:
    """The spool directory. Not thread-safe; the agent uses it from one event loop."""

    def __init__(self, directory: Path, max_bytes: int = 64 * 1024 * 1024, *,
                 retention_s: float = 7200.0, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.acked_dir = directory / "acked"
        self.max_bytes = max_bytes
        self.retention_s = retention_s
        self._clock = clock
        self.dropped_log_batches = 0
        self.acked_dir.mkdir(parents=True, exist_ok=True)
        # A crash between write and rename leaves a temporary file: never an entry.
        for leftover in [*directory.glob("*.tmp"), *self.acked_dir.glob("*.tmp")]:
            leftover.unlink(missing_ok=True)
        kept = self.acked()
        self._acked_seq = kept[-1].seq if kept else None
        seen = [e.seq for e in self.pending()] + [e.seq for e in kept]
        self._next_seq = max(seen, default=int(clock() * 1000)) + 1

    # -- reading --------------------------------------------------------------

    def pending(self, kind: Kind | None = None) -> list[SpoolEntry]:
        """Entries still to send, oldest first."""
        return _entries(self.directory, kind)

    def acked(self, kind: Kind | None = None) -> list[SpoolEntry]:
        """Entries the coordinator acknowledged within the retention, oldest first."""
        return _entries(self.acked_dir, kind)

    def acked_seq(self) -> int | None:
        """The highest sequence number acknowledged and kept (None: none kept)."""
        return self._acked_seq

    def size_bytes(self) -> int:
        return sum(e.size_bytes for e in self.pending())

    def find_result(self, result_id: str) -> SpoolEntry | None:
        for entry in self.pending("result"):
            if entry.result_id == result_id:
                return entry
        return None

    # -- writing --------------------------------------------------------------

    def _write(self, name: str, data: bytes, directory: Path | None = None) -> Path:
        directory = directory or self.directory
        final = directory / name
        tmp = directory / (name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
        return final

    def put_result(self, result: Result) -> SpoolEntry:
        """Spool a result; spooling the same ``result_id`` again returns the first entry.
        The body carries its sequence number (``spool_seq``)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", result.result_id):
            raise ValueError("result_id must use letters, digits, '_', '.' and '-' only")
        existing = self.find_result(result.result_id)
        if existing is not None:
            return existing
        seq = self._take_seq()
        data = encode(msgspec.structs.replace(result, spool_seq=seq))
        path = self._write(f"{seq:012d}-result-{result.result_id}.json", data)
        entry = SpoolEntry("result", seq, path, len(data), result.result_id)
        self._enforce_bound()
        return entry

    def put_logs(self, lines: list[LogLine]) -> SpoolEntry | None:
        if not lines:
            return None
        seq = self._take_seq()
        data = encode(LogBatch(lines=lines, spool_seq=seq))
        path = self._write(f"{seq:012d}-logs.json", data)
        entry = SpoolEntry("logs", seq, path, len(data))
        self._enforce_bound()
        return entry if path.exists() else None

    def remove(self, entry: SpoolEntry) -> None:
        """Drop an entry the coordinator will never take."""
        entry.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            _fsync_dir(self.directory)

    def acknowledged(self, entry: SpoolEntry, body: bytes | None = None) -> None:
        """The coordinator verifiably took ``entry``: keep it ``retention_s`` in ``acked/``
        (its modification time says when; ``body``: what to keep instead, a result with
        the coordinator's receipt), then let it go."""
        if entry.path.parent == self.acked_dir:
            return  # a replayed entry: kept from its first acknowledgement
        target = self.acked_dir / entry.path.name
        try:
            if body is None:
                os.replace(entry.path, target)
            else:
                self._write(entry.path.name, body, self.acked_dir)
                entry.path.unlink()
        except FileNotFoundError:
            return
        now = self._clock()
        with contextlib.suppress(OSError):
            os.utime(target, (now, now))
            _fsync_dir(self.directory)
        self._acked_seq = max(self._acked_seq or 0, entry.seq)
        self.prune_acked()

    def prune_acked(self) -> None:
        """Forget acknowledged entries past the retention, and the oldest beyond the
        bound."""
        entries = self.acked()
        cutoff = self._clock() - self.retention_s
        total = sum(e.size_bytes for e in entries)
        for entry in entries:
            try:
                old = entry.path.stat().st_mtime < cutoff
            except FileNotFoundError:
                continue
            if old or total > self.max_bytes:
                entry.path.unlink(missing_ok=True)
                total -= entry.size_bytes
                if entry.seq == self._acked_seq:
                    self._acked_seq = None  # the newest went: every one went

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _enforce_bound(self) -> None:
        entries = self.pending()
        total = sum(e.size_bytes for e in entries)
        if total <= self.max_bytes:
            return
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry.kind != "logs":
                continue
            entry.path.unlink(missing_ok=True)
            total -= entry.size_bytes
            self.dropped_log_batches += 1
        if total > self.max_bytes:
            # Only results are left: they are kept whatever the bound says.
            log.warning("spool holds %d bytes of results, above its %d byte bound",
                        total, self.max_bytes)
        else:
            log.warning("spool over its bound: dropped old log batches (%d so far)",
                        self.dropped_log_batches)
