"""The agent's log lines for /v1/logs: its own records and its children's output,
secrets redacted before a line is kept."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable

from vast_manager.protocol import LogLine
from vast_manager.protocol.messages import MAX_LOG_LINES, MAX_LOG_TEXT_CHARS

child_log = logging.getLogger("vast_agent_child")  # outside "vast_manager.agent": not shipped twice


class LogBuffer(logging.Handler):
    """Collects the agent's own log records and its children's output for /v1/logs.

    Known secrets are redacted before a line is stored, so they never reach
    the spool or the coordinator. Bounded: the oldest lines go first.
    """

    def __init__(
        self, secrets_to_hide: list[str], clock: Callable[[], float], max_lines: int = 20000
    ) -> None:
        super().__init__(level=logging.DEBUG)
        self._secrets = [s for s in secrets_to_hide if s]
        self._clock = clock
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=max_lines)
        self.batch_ready = asyncio.Event()

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        return text

    def add(self, source: str, text: str) -> None:
        text = self.redact(text)[:MAX_LOG_TEXT_CHARS]
        self._lines.append(LogLine(ts=self._clock(), source=source[:64], text=text))
        if len(self._lines) >= MAX_LOG_LINES:
            self.batch_ready.set()

    def child_line(self, source: str, text: str) -> None:
        child_log.debug("[%s] %s", source, self.redact(text))
        self.add(source, text)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname} {record.name}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            self.add("agent", text)
        except Exception:
            self.handleError(record)

    def take(self, limit: int = MAX_LOG_LINES) -> list[LogLine]:
        out: list[LogLine] = []
        while self._lines and len(out) < limit:
            out.append(self._lines.popleft())
        if len(self._lines) < MAX_LOG_LINES:
            self.batch_ready.clear()
        return out

    def __len__(self) -> int:
        return len(self._lines)
