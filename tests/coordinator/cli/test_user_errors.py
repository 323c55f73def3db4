"""Everyday mistakes, as an operator makes them at a shell: each is one line on stderr
naming the cause and the fix, with the documented exit code, no traceback, and nothing
written (the CLI's module docstring lists the codes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.canned_http import canned as _canned
from support.child_lines import lines_of, wait_for_line
from support.coord_support import ADMIN_TOKEN, SECRET_HEX, ServerThread
from support.fakes_provider import FakeProvider, offer

USAGE, REFUSED, UNREACHABLE = 2, 1, 3
CLI = [sys.executable, "-m", "vast_manager.coordinator.cli"]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(cwd / "home"),
        "VM_FLEET_SECRET": SECRET_HEX, "VM_CONFIG_DIR": str(cwd / "config"), **env,
    }
    return subprocess.run([*CLI, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=60)


def _one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    err = result.stderr
    assert "Traceback" not in err and "Traceback" not in result.stdout, err
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert result.returncode == code, (result.returncode, err)
    for word in words:
        assert word in err, (word, err)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something else holds."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.mark.slow  # a CLI process per mistake: minutes on 2 cores
def test_each_everyday_mistake_is_one_line_and_writes_nothing(
    tmp_path: Path, listening: int
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("not a database\n")
    (work / "earlier").mkdir()
    (work / "earlier" / "demo.db").write_bytes(b"")
    before = _files(work)
    db = str(work / "fleet.db")
    cases: list[tuple[list[str], dict[str, str], int, tuple[str, ...]]] = [
        (["serve", "--db", db, "--port", str(listening)], {}, USAGE,
         (f"port {listening}", "in use", "--port")),
        (["serve", "--db", "/proc/vast-manager-test/fleet.db"], {}, USAGE, ("--db",)),
        (["serve", "--db", "/proc/fleet.db", "--port", "0"], {}, USAGE, ("writable",)),
        (["serve", "--db", str(work / "no-such-mount" / "fleet.db")], {}, USAGE,
         ("does not exist", "mkdir -p")),
        (["serve", "--db", str(work)], {}, USAGE, ("is a directory",)),
        (["serve", "--db", str(work / "notes.txt")], {}, USAGE, ("not a SQLite database",)),
        (["serve", "--db", db, "--host", "8.8.8.8", "--port", "0"], {}, USAGE,
         ("8.8.8.8 is not an address of this machine", "--host")),
        (["serve", "--db", db, "--autopilot"], {}, USAGE, ("--target-rate",)),
        (["serve", "--db", db, "--port", "70000"], {}, USAGE, ("--port",)),
        (["demo", "--keep", "/proc/x"], {}, USAGE, ("--keep /proc/x",)),
        (["demo", "--time-scale", "-5"], {}, USAGE, ("--time-scale",)),
        (["demo", "--keep", str(work / "earlier")], {}, USAGE, ("earlier demo", "fresh")),
        (["hosts", "import", str(work / "no-such-file.jsonl")],
         {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_URL": "http://127.0.0.1:9"}, USAGE,
         ("cannot read", "no-such-file.jsonl")),
        (["hosts", "export", "-o", "/nonexistent/d/x.jsonl"],
         {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_URL": "http://127.0.0.1:9"}, USAGE,
         ("/nonexistent/d does not exist",)),
    ]
    for args, env, code, words in cases:
        _one_line(_run(args, work, **env), code, *words)
    assert _files(work) == before  # no database, lock, token file or folder made

    # A --url that reaches some other HTTP server: said so, not "HTTP 404".
    for status, body in ((404, b"<html>Not Found</html>"), (501, b"Unsupported method")):
        with _canned(status, body) as url:
            result = _run(["status", "--url", url], work, VM_ADMIN_TOKEN=ADMIN_TOKEN)
        _one_line(result, UNREACHABLE, "not a vast-manager coordinator", "--url")
    assert _files(work) == before


def test_refusals_of_a_running_coordinator_are_one_line(tmp_path: Path) -> None:
    with ServerThread(tmp_path, FakeProvider([offer(9001, 41001)])) as server:
        env = {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_URL": server.server.url}
        work = tmp_path / "shell"
        work.mkdir()
        _one_line(_run(["offers", "--filter", "num_gpus>=abc"], work, **env), REFUSED,
                  "num_gpus needs a number")
        _one_line(_run(["autopilot", "stop"], work, **env), REFUSED, "runs no autopilot")
        # One coordinator per database: a second serve on the live one's file is refused.
        db = server.settings.db_path
        second = _run(["serve", "--db", db, "--port", "0"], work, VM_ADMIN_TOKEN=ADMIN_TOKEN)
        _one_line(second, USAGE, "another coordinator", f"pid {os.getpid()}", db)
        assert _files(work) == set()


def test_a_generated_admin_token_is_kept_beside_the_database(tmp_path: Path) -> None:
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.web.logs import store_token, stored_token, token_path

    first = Settings.from_env({"VM_FLEET_SECRET": SECRET_HEX},
                              db_path=str(tmp_path / "fleet.db"), config_dir=str(tmp_path))
    assert first.admin_token_generated and stored_token(first) is None
    path = store_token(first)
    assert path == token_path(first) == tmp_path / "fleet.db.admin-token"
    assert path.stat().st_mode & 0o777 == 0o600
    again = Settings.from_env({"VM_FLEET_SECRET": SECRET_HEX},
                              db_path=str(tmp_path / "fleet.db"), config_dir=str(tmp_path))
    assert again.admin_token != first.admin_token  # generated anew, then replaced by the file
    restored = stored_token(again)
    assert restored is not None and restored.admin_token == first.admin_token
    path.write_text("short\n")
    with pytest.raises(ValueError, match="delete it"):
        stored_token(again)


def _serve(db: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Any, list[str]]:

    env = {k: v for k, v in os.environ.items() if not k.startswith("VM_")}
    env.update({"VM_FLEET_SECRET": SECRET_HEX, "VM_CONFIG_DIR": str(tmp_path / "config"),
                "PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen([*CLI, "serve", "--db", str(db), "--port", "0"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stderr is not None
    return proc, lines_of(proc.stderr), []


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_serve_says_what_keeps_billing_and_keeps_its_token(tmp_path: Path) -> None:
    """Start-up names the instances still rented; shutdown says they keep billing; a
    generated admin token is written once and read back at the next start."""

    from vast_manager.coordinator.store.writer import Store

    db = tmp_path / "fleet.db"
    store = Store(db)
    store.write_blocking(lambda tx: tx.instances.add(
        {"label": "rig", "kind": "byo", "state": "proving", "created_at": 1.0}))
    store.close()

    proc, lines, seen = _serve(db, tmp_path)
    try:
        token_line = wait_for_line(lines, "VM_ADMIN_TOKEN=", seen)
        wait_for_line(lines, "1 instance(s) from before are still rented (1)", seen)
    finally:
        _stop(proc)
    wait_for_line(lines, "stopping: 1 instance(s) stay rented and keep billing (1)", seen)
    token_file = tmp_path / "fleet.db.admin-token"
    token = token_file.read_text().strip()
    assert token_line.startswith(f"VM_ADMIN_TOKEN={token} ")
    assert token_file.stat().st_mode & 0o777 == 0o600

    proc, lines, seen = _serve(db, tmp_path)
    try:
        wait_for_line(lines, f"admin token read from {token_file}", seen)
        started = wait_for_line(lines, "coordinator on", seen)
        # The CLI, with no VM_ADMIN_TOKEN, reads the token kept beside the database.
        url = started.split("coordinator on ", 1)[1].split()[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VM_")}
        env.update({"VM_URL": url, "VM_DB_PATH": str(db)})
        shown = subprocess.run([*CLI, "status", "--json"], env=env, capture_output=True,
                               timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr
        env["VM_DB_PATH"] = str(tmp_path / "other.db")  # no token kept there
        refused = subprocess.run([*CLI, "status"], env=env, capture_output=True, timeout=60,
                                 check=False)
        assert refused.returncode == 3 and b"admin-token" in refused.stderr
    finally:
        _stop(proc)
    assert not any("VM_ADMIN_TOKEN=" in line for line in seen)  # not printed again
    assert token_file.read_text().strip() == token
