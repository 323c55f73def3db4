"""The database file before it is opened: a path that can work, and one coordinator on it.

``check_db_path`` refuses, in one sentence naming the fix, what SQLite would turn into a
traceback or, worse, into an empty fleet (a mistyped folder silently created, a
directory, a file that is not SQLite, a read-only mount). ``DbLock`` is an exclusive
``flock`` on ``<db>.lock`` held while a coordinator serves the file: a second ``serve``
on the same database is refused (two coordinators would deploy and destroy twice). The
kernel drops the lock when the process ends, however it ends (docs/operations.md,
"One coordinator per database").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

SQLITE_HEADER = b"SQLite format 3\x00"


class DatabaseFileError(ValueError):
    """A database path that cannot work, or one another coordinator holds."""


def check_db_path(path: str) -> None:
    """Refuse a database path ``serve`` cannot use; creates nothing."""
    db = Path(path)
    if db.is_dir():
        raise DatabaseFileError(
            f"--db {path} is a directory; name a file in it, e.g. --db {db / 'vast-manager.db'}")
    parent = db.parent
    if not parent.exists():
        raise DatabaseFileError(
            f"--db {path}: the folder {parent} does not exist (a typo, or a mount that is not "
            f"there?); create it first (mkdir -p {parent}) or pick another path")
    if not parent.is_dir():
        raise DatabaseFileError(f"--db {path}: {parent} is not a folder; pick another path")
    if db.exists():
        try:
            with open(db, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as err:
            raise DatabaseFileError(
                f"--db {path} cannot be read ({err.strerror}); fix its permissions or pick "
                "another path") from None
        if head and head != SQLITE_HEADER:  # an empty file is a new database to SQLite
            raise DatabaseFileError(
                f"--db {path} is not a SQLite database; point --db at the coordinator's "
                "database or at a new file name")
        if not os.access(db, os.W_OK):
            raise DatabaseFileError(
                f"--db {path} is read-only; make it writable or copy it to a writable place")
    # SQLite writes its journal (-wal, -shm) beside the file, so the folder must be writable.
    if not os.access(parent, os.W_OK):
        raise DatabaseFileError(
            f"--db {path}: the folder {parent} is not writable (a read-only mount?); pick a "
            "writable folder")


def lock_path(db_path: str) -> Path:
    return Path(db_path + ".lock")


class DbLock:
    """An exclusive lock on ``<db>.lock`` for as long as this object holds it."""

    def __init__(self, db_path: str) -> None:
        self.path = lock_path(db_path)
        self._fd: int | None = None
        self._created = not self.path.exists()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise DatabaseFileError(
                f"cannot create the lock file {self.path} ({err.strerror}); the database's "
                "folder must be writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_pid(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DatabaseFileError(f"cannot lock {self.path}: {err.strerror}") from None
            who = f" (pid {holder})" if holder else ""
            raise DatabaseFileError(
                f"another coordinator{who} is serving {db_path}; stop it first, or give this "
                "one a database of its own (--db)") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self, *, remove: bool = False) -> None:
        """Let go; ``remove``: also delete the lock file if this lock created it (a start
        that failed leaves nothing behind)."""
        if self._fd is None:
            return
        if remove and self._created:
            with contextlib.suppress(OSError):
                self.path.unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text.isdigit() else None
    except (OSError, UnicodeDecodeError):
        return None
