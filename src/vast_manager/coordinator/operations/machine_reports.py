"""Renters' reports on machines in trouble: evidence beside a block.

``GET /api/v0/machines/{id}/reports/`` lists what other renters reported against a machine
(``problem``, ``message``, ``created_at``; OpenAPI ``showReports``, docs/vast.md "Machine
reports"). Each monitor round reads them for the machines that are blocked or were struck
lately (a few a round, each at most every ``REREAD_S``, a machine just blocked at once),
keeps them for ``bad-hosts`` and the dashboard, and events a machine's reports once when
they change.
"""

from __future__ import annotations

import logging
from typing import Any

from vast_manager.coordinator.providers.base import Provider, ProviderError
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.coordinator.textsafe import neutralise

log = logging.getLogger(__name__)

#: Seconds before a machine's reports are read again.
REREAD_S = 6 * 3600.0
#: Machines read a round (each is one request).
PER_ROUND = 5
#: Reports kept a machine, and characters kept of each text.
KEPT = 20
TEXT_CHARS = 300
#: Strikes this recent make a machine "in trouble".
RECENT_STRIKE_S = 24 * 3600.0


class MachineReports:
    def __init__(self, store: Store, provider: Provider) -> None:
        self.store = store
        self.provider = provider
        #: machine id -> its reports, newest read.
        self.by_machine: dict[str, list[dict[str, Any]]] = {}
        self._read_at: dict[str, float] = {}
        self._blocked: set[str] = set()

    async def round(self, now: float) -> None:
        fetch = getattr(self.provider, "machine_reports", None)
        if fetch is None:
            return

        def troubled(reads: Any) -> tuple[list[str], list[str]]:
            blocked = [str(r["machine_id"]) for r in reads.bad_hosts(now)]
            struck = [str(r["machine_id"]) for r in reads.strikes()
                      if float(r["at"]) >= now - RECENT_STRIKE_S]
            return blocked, struck

        blocked, struck = await self.store.read(troubled)
        # A machine just blocked is read at once: its block's evidence.
        fresh = [m for m in blocked if m not in self._blocked]
        self._blocked = set(blocked)
        due = [m for m in dict.fromkeys(fresh + blocked + struck) if m.isdigit() and (
            m in fresh or now - self._read_at.get(m, -REREAD_S) >= REREAD_S)]
        for machine_id in due[:PER_ROUND]:
            self._read_at[machine_id] = now
            try:
                rows = await fetch(int(machine_id))
            except ProviderError as err:
                log.warning("could not read vast.ai's reports on machine %s: %s", machine_id, err)
                continue
            reports = [_clean(r) for r in rows[:KEPT]]
            if reports == self.by_machine.get(machine_id, []):
                continue
            self.by_machine[machine_id] = reports
            await self.store.write(_event(now, machine_id, reports))


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {k: neutralise(str(row.get(k) or ""))[:TEXT_CHARS]
            for k in ("problem", "message", "created_at")}


def _event(now: float, machine_id: str, reports: list[dict[str, Any]]) -> Any:
    shown = "; ".join(f"{r['problem']} ({r['created_at']})" for r in reports[:3]) or "none"
    message = f"{len(reports)} renter report(s) on machine {machine_id} at vast.ai: {shown}"

    def note(tx: Tx) -> None:
        tx.audit.add(now, "machine_reports", message, machine_id=machine_id,
                        data={"reports": reports})

    return note
