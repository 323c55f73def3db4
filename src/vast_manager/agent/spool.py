"""On-disk spool of results and log batches until the coordinator verifiably took them.

Each entry is one file holding the exact request body, written to a temporary
name, fsynced, renamed and the directory fsynced, so it survives a crash or a
power cut once ``put_*`` returns. Entries are removed only after a verified
``200``. The spool is bounded: when it grows past ``max_bytes`` the oldest
log batches are dropped; a result is never dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vast_manager.protocol import LogBatch, LogLine, Result
from vast_manager.protocol.codec import encode

log = logging.getLogger(__name__)

Kind = Literal["result", "logs"]
_NAME_RE = re.compile(
    r"(?P<seq>[0-9]{12})-(?P<kind>result|logs)(?:-(?P<rid>[A-Za-z0-9_.-]+))?\.json"
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


class Spool:
    """The spool directory. Not thread-safe; the agent uses it from one event loop."""

    def __init__(self, directory: Path, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.dropped_log_batches = 0
        directory.mkdir(parents=True, exist_ok=True)
        # A crash between write and rename leaves a temporary file: never an entry.
        for leftover in directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        self._next_seq = max((e.seq for e in self.pending()), default=0) + 1

    # -- reading --------------------------------------------------------------

    def pending(self, kind: Kind | None = None) -> list[SpoolEntry]:
        """Entries still to send, oldest first."""
        entries = []
        for path in self.directory.iterdir():
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

    def size_bytes(self) -> int:
        return sum(e.size_bytes for e in self.pending())

    def find_result(self, result_id: str) -> SpoolEntry | None:
        for entry in self.pending("result"):
            if entry.result_id == result_id:
                return entry
        return None

    # -- writing --------------------------------------------------------------

    def _write(self, name: str, data: bytes) -> Path:
        final = self.directory / name
        tmp = self.directory / (name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        return final

    def put_result(self, result: Result) -> SpoolEntry:
        """Spool a result; spooling the same ``result_id`` again returns the first entry."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", result.result_id):
            raise ValueError("result_id must use letters, digits, '_', '.' and '-' only")
        existing = self.find_result(result.result_id)
        if existing is not None:
            return existing
        data = encode(result)
        seq = self._take_seq()
        path = self._write(f"{seq:012d}-result-{result.result_id}.json", data)
        entry = SpoolEntry("result", seq, path, len(data), result.result_id)
        self._enforce_bound()
        return entry

    def put_logs(self, lines: list[LogLine]) -> SpoolEntry | None:
        if not lines:
            return None
        data = encode(LogBatch(lines=lines))
        seq = self._take_seq()
        path = self._write(f"{seq:012d}-logs.json", data)
        entry = SpoolEntry("logs", seq, path, len(data))
        self._enforce_bound()
        return entry if path.exists() else None

    def remove(self, entry: SpoolEntry) -> None:
        entry.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            _fsync_dir(self.directory)

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
