"""Curio's HarmonyDB, read: the one module that talks to the cluster's database (asyncpg).

One query a round (``READ_SQL``) over tables created by Curio's own migrations
(harmony/harmonydb/sql/ in filecoin-project/curio at e0294b0f: ``20230719-harmony.sql``,
``20231113-harmony_taskhistory_oops.sql``, ``20240404-machine_detail.sql``,
``20240522-ts-to-timestampz.sql``, ``20240527-machine_name.sql``): the proving tasks each
address finished since the window's start, on the index ``harmony_task_history_work_index``
``(work_end DESC, completed_by_host_and_port, name, result)`` (``20240420-web-task-indexes.sql``),
and the addresses our node names hold. Curio's own UI joins the same tables
(web/api/webrpc/harmony_stats.go). The session is read-only
(``default_transaction_read_only``) on a read-only role (docs/operations.md).

Every failure is a ``ClusterUnavailable`` with a one-line reason that never holds the URL
(it may carry a password). docs/operations.md says why asyncpg.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from vast_manager.coordinator.decisions.attribution import Tally

#: Longest error text kept of a failed task (Curio's ``err`` is an unbounded varchar).
MAX_ERROR_CHARS = 500

# A failure is a row with result false that was not preempted: recordCompletion writes
# err 'preempted' for a task handed back, not failed (task_type_handler.go).
READ_SQL = f"""
WITH hist AS (
    SELECT completed_by_host_and_port AS address,
           count(*) FILTER (WHERE result) AS completed,
           count(*) FILTER (WHERE NOT result AND err IS DISTINCT FROM 'preempted') AS failed,
           (array_agg(left(err, {MAX_ERROR_CHARS}) ORDER BY work_end DESC)
               FILTER (WHERE NOT result AND err IS DISTINCT FROM 'preempted'))[1] AS last_error,
           extract(epoch FROM max(work_end)
               FILTER (WHERE NOT result AND err IS DISTINCT FROM 'preempted')) AS last_error_at,
           count(*) FILTER (WHERE result AND work_end > to_timestamp($4::float8))
               AS completed_new,
           count(*) FILTER (WHERE NOT result AND err IS DISTINCT FROM 'preempted'
                            AND work_end > to_timestamp($4::float8)) AS failed_new
    FROM harmony_task_history
    WHERE work_end > to_timestamp($1::float8) AND name = ANY($2::text[])
    GROUP BY completed_by_host_and_port
)
SELECT md.machine_name AS machine_name, hm.host_and_port AS address,
       0::bigint AS completed, 0::bigint AS failed, NULL::text AS last_error,
       NULL::float8 AS last_error_at, 0::bigint AS completed_new, 0::bigint AS failed_new
FROM harmony_machine_details md JOIN harmony_machines hm ON hm.id = md.machine_id
WHERE md.machine_name LIKE $3
UNION ALL
SELECT NULL, address, completed, failed, last_error, last_error_at::float8, completed_new,
       failed_new
FROM hist
"""


class ClusterUnavailable(Exception):
    """The cluster's database could not be read: unreachable, slow, refused, or not the
    schema expected. The message is one line, without the URL."""


@dataclass(frozen=True, slots=True)
class ClusterRows:
    """One read: the (machine_name, host_and_port) of our nodes, and each address's tally
    of proving tasks since ``since`` (the window), those since ``since_new`` (the previous
    read) counted apart; ``seq`` tells one read from the next, ``read_at`` is its time (the
    coordinator's clock; both set by the caller)."""

    since: float
    machines: tuple[tuple[str | None, str], ...]
    tallies: dict[str, Tally]
    since_new: float = 0.0
    seq: int = 0
    read_at: float = 0.0


class CurioDb:
    """A read-only connection to HarmonyDB, opened on first use and again after a failure."""

    def __init__(self, url: str, schema: str, timeout_s: float) -> None:
        self._url = url
        self._schema = schema
        self._timeout_s = timeout_s
        self._conn: asyncpg.Connection | None = None

    async def read(self, since: float, tasks: Sequence[str], name_prefix: str,
                   since_new: float | None = None) -> ClusterRows:
        """The round's one query, connect included, within the timeout: proving tasks of
        ``tasks`` since ``since`` (Unix seconds; those since ``since_new`` also apart), and
        the nodes named ``name_prefix``..."""
        try:
            return await asyncio.wait_for(
                self._read(since, tasks, name_prefix, since if since_new is None else since_new),
                                          self._timeout_s)
        except TimeoutError:
            await self.close()
            raise ClusterUnavailable(
                f"no answer within {self._timeout_s:g} s (VM_CURIO_READ_TIMEOUT_S)") from None
        except ClusterUnavailable:
            await self.close()
            raise
        except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError,
                asyncpg.UndefinedFunctionError, asyncpg.DatatypeMismatchError) as err:
            await self.close()
            raise ClusterUnavailable(f"unexpected schema in {self._schema!r}: "
                                     f"{_one_line(err)}") from None
        except asyncpg.InvalidAuthorizationSpecificationError as err:
            await self.close()
            raise ClusterUnavailable(f"login refused: {_one_line(err)}") from None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
            await self.close()
            raise ClusterUnavailable(f"{type(err).__name__}: {_one_line(err)}") from None
        except ValueError:
            # The URL did not parse; its text may hold a password, so it is not repeated.
            await self.close()
            raise ClusterUnavailable("VM_CURIO_DB_URL is not a URL asyncpg can use") from None

    async def _read(self, since: float, tasks: Sequence[str], name_prefix: str,
                    since_new: float) -> ClusterRows:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(
                self._url, timeout=self._timeout_s,
                # Read-only whatever the role may do; Curio's tables live in its schema.
                server_settings={"search_path": self._schema,
                                 "default_transaction_read_only": "on",
                                 "application_name": "vast-manager"},
            )
        pattern = name_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await self._conn.fetch(READ_SQL, since, list(tasks), pattern + "%", since_new)
        machines: list[tuple[str | None, str]] = []
        tallies: dict[str, Tally] = {}
        for row in rows:
            if row["machine_name"] is not None:
                machines.append((row["machine_name"], row["address"]))
            else:
                tallies[row["address"]] = Tally(
                    int(row["completed"]), int(row["failed"]), row["last_error"],
                    None if row["last_error_at"] is None else float(row["last_error_at"]),
                    int(row["completed_new"]), int(row["failed_new"]))
        return ClusterRows(since, tuple(machines), tallies, since_new)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()  # never waits on a peer that stopped answering


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] or type(err).__name__
