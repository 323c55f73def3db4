"""The server's log lines (text or JSON, secrets blanked) and `vast-manager logs --follow`,
against real processes on loopback."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.web.logs import REDACTED, configure_logging

from support.child_lines import lines_of, wait_for_line
from support.coord_support import ADMIN_TOKEN, SECRET_HEX, ServerThread, make_settings
from support.paths import REPO_ROOT

ROOT = REPO_ROOT


# --- formatting ---------------------------------------------------------------------------


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_log_lines_never_carry_secrets(
    tmp_path: Path, root_logging: None, log_format: str
) -> None:
    settings = make_settings(tmp_path, log_format=log_format)
    stream = io.StringIO()
    configure_logging(settings, stream)
    log = logging.getLogger("coordinator.test")
    log.info("token %s in a message", ADMIN_TOKEN)
    log.warning("secret %s and header Authorization: Bearer abc.def-123", SECRET_HEX)
    log.info('body {"agent_key": "%s"}', "ab" * 32)
    try:
        raise RuntimeError(f"failing with {ADMIN_TOKEN}")
    except RuntimeError:
        log.exception("it failed")
    text = stream.getvalue()
    for secret in (ADMIN_TOKEN, SECRET_HEX, "abc.def-123", "ab" * 32):
        assert secret not in text
    assert text.count(REDACTED) >= 5
    if log_format == "json":
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert len(records) == 4
        assert {r["level"] for r in records} == {"info", "warning", "error"}
        assert records[0]["logger"] == "coordinator.test"
        assert "exc" in records[3] and "RuntimeError" in records[3]["exc"]
        # Every line of the stream is one JSON object (the traceback is inside one).
        assert all(line.startswith("{") for line in text.splitlines())


def test_serve_log_json_writes_json_lines_and_keeps_a_generated_token_out(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VM_")}
    env.update({"VM_FLEET_SECRET": SECRET_HEX, "VM_CONFIG_DIR": str(tmp_path / "config"),
                "PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "vast_manager.coordinator.cli",
         "serve", "--db", str(tmp_path / "fleet.db"),
         "--port", "0", "--log-json"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        lines = lines_of(proc.stderr)
        wait_for_line(lines, "coordinator on http://127.0.0.1:", seen)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    records = [json.loads(line) for line in seen]  # every line is JSON
    token_file = tmp_path / "fleet.db.admin-token"  # beside the database, for restarts
    assert any(str(token_file) in r["message"] for r in records)
    token = token_file.read_text().strip()
    assert len(token) >= 16
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert all(token not in line for line in seen)
    assert proc.returncode == 0


# --- logs --follow --------------------------------------------------------------------------


def follow_process(url: str, *args: str) -> subprocess.Popen[bytes]:
    """``vast-manager logs ... --follow`` as a terminal's foreground job runs it: with
    SIGINT at its default, so Ctrl-C (the SIGINT sent here) reaches it. A suite started
    in the background by a shell without job control inherits SIGINT ignored, and so
    would every child (Python keeps an inherited ignore: the child would never see the
    signal); the disposition is reset for the exec, then restored."""
    env = {**os.environ, "VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "vast_manager.coordinator.cli", "logs", *args, "--follow"]
    with sigint_handled():
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def sigint_handled() -> Iterator[None]:
    """SIGINT handled (not ignored) here, so a child started meanwhile gets the default."""
    saved = signal.getsignal(signal.SIGINT)
    if saved == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if saved == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(proc: subprocess.Popen[bytes]) -> int:
    """Ctrl-C, and the exit status (or a kill after 30 s)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError("`logs --follow` did not end within 30 s of Ctrl-C") from None


def test_logs_follow_prints_new_lines_once(tmp_path: Path) -> None:
    with ServerThread(tmp_path) as s:
        store = s.server.store
        now = time.time()

        def setup(tx: Any) -> int:
            instance_id: int = tx.instances.add(
                {"id": 700001, "kind": "deployed", "state": "proving", "created_at": now})
            tx.audit.add_logs(700001, "ag_x", now, [(now, "agent", "first line")], keep_lines=100)
            return instance_id

        instance_id = store.write_blocking(setup)
        proc = follow_process(s.server.url, str(instance_id), "--interval", "0.1")
        seen: list[str] = []
        try:
            assert proc.stdout is not None
            lines = lines_of(proc.stdout)
            wait_for_line(lines, "agent: first line", seen)
            # Two lines sharing the last printed line's timestamp, then a later one
            # with a hostile control sequence.
            store.write_blocking(lambda tx: tx.audit.add_logs(
                700001, "ag_x", now,
                [(now, "cuzk", "same second"), (now + 1, "work", "later \x1b[2Jline")],
                keep_lines=100))
            wait_for_line(lines, "work: later", seen)
            store.write_blocking(lambda tx: tx.audit.add_logs(
                700001, "ag_x", now, [(now + 2, "agent", "last line")], keep_lines=100))
            wait_for_line(lines, "agent: last line", seen)
        finally:
            code = interrupted(proc)
    # Each line once, in order; the escape character never reaches the terminal (it is
    # shown as its escape).
    assert [line.split(" ", 1)[1] for line in seen] == [
        "agent: first line", "cuzk: same second", "work: later \\u001b[2Jline",
        "agent: last line",
    ]
    assert code == 0  # Ctrl-C ends a follow quietly


def test_ctrl_c_during_the_first_fetch_ends_a_follow_quietly() -> None:
    """A coordinator that takes the connection and never answers: Ctrl-C while the first
    request waits still ends ``--follow`` at once, with no "Aborted!"."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(30)
        proc = follow_process(f"http://127.0.0.1:{listener.getsockname()[1]}", "700001")
        try:
            conn, _ = listener.accept()  # the first request is in flight
        except TimeoutError:
            proc.kill()
            raise
        with conn:
            code = interrupted(proc)
    assert proc.stdout is not None
    assert (code, proc.stdout.read()) == (0, b"")
