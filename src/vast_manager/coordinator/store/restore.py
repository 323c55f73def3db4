"""``vast-manager restore``: the database back from its replica, checked, never over a live one.

Litestream's own restore (``litestream restore -o PATH [-timestamp T] URL``) writes the
newest state, or the state at a point in time, into a new file beside the target; the
file is then checked as Litestream's testing guide checks a restore (``PRAGMA
integrity_check`` must say ``ok``, docs/TESTING_GUIDE.md) and only then renamed onto the
target, so a failed or corrupt restore leaves the target as it was.

A target is *live*, and never overwritten, while either holds:

- a coordinator serves it: ``serve`` holds an exclusive ``flock`` on ``<db>.lock``
  (``dbfile.DbLock``) for as long as it runs, and the kernel drops it when it ends; or
- its ``-wal`` file holds frames: committed transactions not yet folded into the main
  file (a coordinator running without the lock, or one that crashed). Replacing the
  main file would orphan them, and SQLite would replay them onto the wrong database.

A target that exists but is not live is replaced only with ``force``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from vast_manager.coordinator.store.dbfile import DatabaseFileError, DbLock
from vast_manager.coordinator.store.replica import ReplicaError, litestream_binary, replica_url

#: Seconds Litestream may take to restore (a million results restore in seconds:
#: docs/performance.md).
RESTORE_TIMEOUT_S = 3600


#: What Litestream says when the replica has nothing for the request (``restore.go``).
_NO_BACKUP = ("no matching backup", "no backups", "timestamp does not exist")


class RestoreError(Exception):
    """The restore was refused or failed; the message is one sentence."""


@dataclass(frozen=True, slots=True)
class Restored:
    db_path: str
    size_bytes: int
    seconds: float
    instances: int
    results: int


def live_reason(db_path: str) -> str | None:
    """Why ``db_path`` is live (see the module docstring), or None."""
    db = Path(db_path)
    if db.exists() or Path(db_path + ".lock").exists():
        try:
            lock = DbLock(db_path)
        except DatabaseFileError as err:
            return str(err)
        lock.release(remove=True)
    wal = Path(db_path + "-wal")
    with contextlib.suppress(FileNotFoundError):
        if wal.stat().st_size > 0:
            return (f"{wal} holds writes not yet in {db_path} (a coordinator running on it, "
                    "or one that crashed: serve it once to fold them in, or move the files "
                    "away)")
    return None


def _litestream_said(output: str) -> str:
    """The last error line Litestream printed, in one line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "ERROR" in ln]
    last = (errors or lines or ["no output"])[-1]
    last = re.sub(r"^(time=\S+\s+level=\S+\s+|Error:\s*)", "", last)
    return " ".join(last.split())[:300]


def _check(path: Path, source: str) -> tuple[int, int]:
    """``PRAGMA integrity_check`` and the coordinator's tables; (instances, results)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            verdict = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
            if verdict != ["ok"]:
                raise RestoreError(f"the replica at {source} is corrupt: integrity_check says "
                                   f"{'; '.join(str(v) for v in verdict[:3])}")
            tables = {r[0] for r in db.execute("select name from sqlite_master")}
            if not {"instances", "results"} <= tables:
                raise RestoreError(f"the replica at {source} is not a vast-manager database "
                                   "(no instances or results table)")
            instances = int(db.execute("select count(*) from instances").fetchone()[0])
            results = int(db.execute("select count(*) from results").fetchone()[0])
    except sqlite3.DatabaseError as err:
        raise RestoreError(f"the replica at {source} is corrupt: {err}") from None
    return instances, results


def restore(source: str, db_path: str, *, at: datetime | None = None,
            force: bool = False) -> Restored:
    """Restore ``source`` (a replica URL or folder) into ``db_path``; ``at``: the state at
    that time (UTC) instead of the newest."""
    why = live_reason(db_path)
    if why is not None:
        raise RestoreError(f"refusing to overwrite a live database: {why}")
    target = Path(db_path)
    if not target.parent.is_dir():
        raise RestoreError(f"--db {db_path}: the folder {target.parent} does not exist")
    if target.exists() and not force:
        raise RestoreError(f"--db {db_path} exists; pass --force to replace it, or restore to "
                           "a new path")
    try:
        binary = litestream_binary()
    except ReplicaError as err:
        raise RestoreError(str(err)) from None
    tmp = target.with_name(f".{target.name}.restoring-{os.getpid()}")
    args = [binary, "restore", "-o", str(tmp)]
    if at is not None:
        args += ["-timestamp", at.strftime("%Y-%m-%dT%H:%M:%SZ")]
    args.append(replica_url(source))
    started = time.monotonic()
    try:
        try:
            done = subprocess.run(args, capture_output=True, text=True,
                                  timeout=RESTORE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise RestoreError(f"litestream did not finish restoring {source} in "
                               f"{RESTORE_TIMEOUT_S} s") from None
        if done.returncode != 0 or not tmp.exists():
            said = _litestream_said(done.stdout + "\n" + done.stderr)
            if any(m in said.lower() for m in _NO_BACKUP):
                raise RestoreError(f"the replica at {source} holds no backup"
                                   + (" at that time" if at is not None else "")
                                   + f" ({said})")
            raise RestoreError(f"the replica at {source} is corrupt or unreadable: {said}")
        instances, results = _check(tmp, source)
        for suffix in ("-wal", "-shm"):
            Path(str(target) + suffix).unlink(missing_ok=True)
        os.replace(tmp, target)
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)
    return Restored(str(target), target.stat().st_size, time.monotonic() - started,
                    instances, results)
