"""The coordinator's log lines: secrets redacted, host text neutralised, text or JSON."""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

from vast_manager.coordinator.settings import Settings, check_admin_token
from vast_manager.coordinator.textsafe import json_safe, neutralise

_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_KEYED = re.compile(r"(?i)((?:agent_key|admin_token|fleet_secret|x-vm-signature)"
                    r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;]+")
REDACTED = "[redacted]"


class RedactingFormatter(logging.Formatter):
    """Formats a record, then blanks every secret it knows and anything shaped like one."""

    def __init__(self, secrets: Sequence[str], fmt: str | None = None) -> None:
        super().__init__(fmt)
        # Longest first, so a secret that contains another is blanked whole.
        self.secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
        return _KEYED.sub(lambda m: m.group(1) + REDACTED, text)

    def formatMessage(self, record: logging.LogRecord) -> str:
        # A message may quote what a stranger sent: it must not forge lines or escapes.
        return neutralise(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


class JsonFormatter(RedactingFormatter):
    """One JSON object per line: ts, time, level, logger, message (and exc)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": self.redact(record.getMessage()),
        }
        if record.exc_info:
            payload["exc"] = self.redact(self.formatException(record.exc_info))
        # Blanked before encoding too: JSON escaping would hide a key's quotes from the pattern.
        return json_safe(self.redact(orjson.dumps(payload).decode()))


def log_secrets(settings: Settings) -> list[str]:
    """Every secret the coordinator holds, as it could appear in text."""
    return [settings.admin_token, *(s.hex() for s in settings.fleet_secrets)]


def configure_logging(settings: Settings, stream: object = None) -> logging.Handler:
    """Root logging for ``serve``: text or JSON lines on stderr, secrets blanked."""
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(log_secrets(settings)))
    else:
        handler.setFormatter(RedactingFormatter(
            log_secrets(settings), "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def token_path(settings: Settings) -> Path:
    """Where a generated admin token is kept: beside the database, as ``<db>.admin-token``,
    so each database keeps its own and a restart finds it (docs/operations.md)."""
    return Path(settings.db_path + ".admin-token")


def stored_token(settings: Settings) -> Settings | None:
    """With no VM_ADMIN_TOKEN: the settings holding the token stored beside the database
    by an earlier start (None when there is none yet). ValueError when the file holds no
    usable token."""
    path = token_path(settings)
    if not path.exists():
        return None
    try:
        token = path.read_text().strip()
        check_admin_token(token)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path} holds no usable admin token ({err}); delete it to "
                         "generate a new one, or set VM_ADMIN_TOKEN") from None
    return settings.with_values(admin_token=token, admin_token_generated=False)


def store_token(settings: Settings) -> Path:
    """Keep a generated admin token beside the database (0600, created exclusively), for
    the next start; written once the coordinator is up, so a start refused writes nothing."""
    path = token_path(settings)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(settings.admin_token + "\n")
    return path
