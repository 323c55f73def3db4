"""A child process's output read line by line on a thread, waited on with a deadline."""

from __future__ import annotations

import queue
import threading
import time
from typing import IO


def lines_of(stream: IO[bytes]) -> queue.Queue[str]:
    """Read a child's stream on a thread, so the test can wait with a deadline."""
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for raw in iter(stream.readline, b""):
            out.put(raw.decode(errors="replace").rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return out


def wait_for_line(lines: queue.Queue[str], needle: str, seen: list[str],
                  timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no line with {needle!r} in {timeout_s} s; saw {seen}")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        seen.append(line)
        if needle in line:
            return line
