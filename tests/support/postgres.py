"""A throwaway PostgreSQL server for the tests that read Curio's HarmonyDB: Debian's
``postgresql`` package (``apt-get install -y postgresql``; ``.ci/run`` installs it), a
cluster made by ``initdb`` in a temporary directory and run by ``pg_ctl`` on a loopback port,
with Curio's tables made by Curio's own migration SQL
(``tests/fixtures/curio_harmony_e0294b0f.sql`` says which files, at which commit) and the
read-only role docs/operations.md asks the operator to create.

``initdb`` refuses to run as root: as root the server runs as the ``postgres`` user the
package creates (``runuser``), its directory under /tmp, which that user can reach.
Missing binaries skip the test here and fail it under CI (``support.tools``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg

from support.tools import skip_or_fail

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "curio_harmony_e0294b0f.sql"
INSTALL = "apt-get update && apt-get install -y postgresql"
READER = "vm_reader"
READER_PASSWORD = "reader-pass-1"
DATABASE = "yugabyte"  # Curio's default database name (cmd/curio/main.go, --db-name)

# What docs/operations.md tells the operator to run for the coordinator's role (kept the
# same: the tests read through it, so a grant missing there fails here).
READER_SQL = f"""
CREATE ROLE {READER} LOGIN PASSWORD '{READER_PASSWORD}';
GRANT USAGE ON SCHEMA curio TO {READER};
GRANT SELECT ON curio.harmony_task_history, curio.harmony_machines,
                curio.harmony_machine_details TO {READER};
ALTER ROLE {READER} SET default_transaction_read_only = on;
"""


def find_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding initdb and pg_ctl."""
    found = []
    for initdb in Path("/usr/lib/postgresql").glob("*/bin/initdb"):
        with contextlib.suppress(ValueError):
            found.append((int(initdb.parent.parent.name), initdb.parent))
    return max(found)[1] if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One cluster: ``start``/``stop`` (the data stays, so a stopped server starts again
    with its rows), URLs for the superuser and the reader."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="vm-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, user="postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        # Waits (-w) until the server accepts connections; fsync off: a test cluster.
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} "
                  f"-k {self.root} -c fsync=off -c synchronous_commit=off", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, user: str = "postgres", password: str | None = None,
            database: str = DATABASE) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    @property
    def reader_url(self) -> str:
        return self.url(READER, READER_PASSWORD)

    async def prepare(self) -> None:
        """Curio's database and schema, its tables by its migrations, the reader role."""
        conn = await asyncpg.connect(self.url(database="postgres"))
        try:
            await conn.execute(f"CREATE DATABASE {DATABASE}")
        finally:
            await conn.close()
        conn = await asyncpg.connect(self.url(), server_settings={"search_path": "curio"})
        try:
            await conn.execute("CREATE SCHEMA curio")
            await conn.execute(FIXTURE.read_text())
            await conn.execute(READER_SQL)
        finally:
            await conn.close()

    async def admin(self) -> asyncpg.Connection:
        """A superuser connection in Curio's schema (the tests write Curio's rows with it)."""
        return await asyncpg.connect(self.url(), server_settings={"search_path": "curio"})

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A started server (skipped, or failed under CI, without the package)."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail(f"postgresql is not installed ({INSTALL})")
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.remove()


# --- Curio's writes, as Curio makes them ------------------------------------------------

async def register_node(conn: asyncpg.Connection, name: str | None, host_and_port: str) -> int:
    """What a starting Curio node writes: its ``harmony_machines`` row (resources.Register's
    insert: host_and_port, cpu, ram, gpu, last_contact) and its ``harmony_machine_details``
    (cmd/curio/tasks/tasks.go ``machineDetails``: tasks, layers, startup_time, miners,
    machine_id, machine_name, version). A second node on one address gets a row of its own
    here, as two nodes racing the upsert can (host_and_port is not unique)."""
    machine_id = await conn.fetchval(
        "INSERT INTO harmony_machines (host_and_port, cpu, ram, gpu, last_contact) "
        "VALUES ($1, 64, 549755813888, 1, CURRENT_TIMESTAMP) RETURNING id", host_and_port)
    await conn.execute(
        "INSERT INTO harmony_machine_details (tasks, layers, startup_time, miners, machine_id, "
        "machine_name, version) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        ",PSProve,PoRep,", "base,snark-provider", None, "", machine_id, name, "1.27.2")
    return int(machine_id)


async def record_tasks(conn: asyncpg.Connection, host_and_port: str, work_ends: list[float],
                       *, name: str = "PSProve", result: bool = True,
                       err: str = "") -> None:
    """Rows as ``recordCompletion`` inserts them (task_type_handler.go: task_id, name, posted,
    work_start, work_end, result, completed_by_host_and_port, err), one per ``work_ends``
    (Unix seconds); a proof takes two minutes here."""
    await conn.executemany(
        "INSERT INTO harmony_task_history (task_id, name, posted, work_start, work_end, "
        "result, completed_by_host_and_port, err) VALUES ($1, $2, to_timestamp($3), "
        "to_timestamp($4), to_timestamp($5), $6, $7, $8)",
        [(1000 + i, name, end - 300, end - 120, end, result, host_and_port, err)
         for i, end in enumerate(work_ends)])
