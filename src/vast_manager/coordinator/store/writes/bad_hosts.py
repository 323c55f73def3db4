"""Writes of ``bad_hosts``, ``machine_strikes`` and ``fleet_faults``: machines refused,
failed trials judged (``decisions.blame``) and counted against the host only when they
are its fault, and the faults beyond one machine that pause deploys."""

from __future__ import annotations

import logging

from vast_manager.coordinator.decisions import blame
from vast_manager.coordinator.store.migrations import dumps, loads
from vast_manager.coordinator.store.writes.events import EventWrites
from vast_manager.coordinator.store.writes.tx_base import TxBase

log = logging.getLogger(__name__)


class BadHostWrites:
    """A machine listed or unlisted, a failure judged and perhaps counted (each with its
    event)."""

    def __init__(self, tx: TxBase, events: EventWrites) -> None:
        self._tx = tx
        self._events = events
        self._exec = tx._exec

    def add(
        self,
        machine_id: str,
        *,
        reason: str,
        source: str,
        now: float,
        expires_at: float,
        instance_id: int | None = None,
    ) -> None:
        """Block a machine until ``expires_at``: every block ends (docs/policy.md)."""
        self._exec(
            "insert into bad_hosts (machine_id, reason, added_at, source, instance_id, "
            "expires_at) values (?, ?, ?, ?, ?, ?) on conflict (machine_id) do update set "
            "reason = excluded.reason, source = excluded.source, "
            "instance_id = coalesce(excluded.instance_id, instance_id), "
            "added_at = excluded.added_at, expires_at = excluded.expires_at",
            (machine_id, reason, now, source, instance_id, expires_at),
        )

    def strike(self, machine_id: str, reason: str, *, now: float, instance_id: int | None,
                   limit: int, window_s: float, block_s: float, kind: str = blame.TIMEOUT,
                   state: str = "") -> str | None:
        """Judge a failed trial (once per instance). The host's count against its machine:
        with ``limit`` of them within ``window_s`` it is blocked for ``block_s`` with their
        reasons. Anyone else's strike no one; one beyond a single machine opens (or joins)
        a fleet fault. Returns the block's reason when this strike made one."""
        # Failures the operator said were fixed (a fault cleared since) are not seen again.
        (cleared,) = self._exec("select max(cleared_at) from fleet_faults where signature = ?",
                                (blame.signature(reason),)).fetchone()
        since = now - blame.FLEET_WINDOW_S
        if cleared is not None:
            since = max(since, float(cleared))
        recent = [blame.Failure(str(r[0]), str(r[1]), kind, "", float(r[2])) for r in self._exec(
            "select machine_id, reason, at from machine_strikes where at > ? and "
            "coalesce(fault, 'host') != 'forgiven'", (since,)).fetchall()]
        judged = blame.judge(blame.Failure(machine_id, reason, kind, state, now), recent)
        cur = self._exec(
            "insert or ignore into machine_strikes (machine_id, instance_id, reason, at, fault, "
            "signature) values (?, ?, ?, ?, ?, ?)",
            (machine_id, instance_id, reason, now, judged.fault.value, judged.signature))
        if cur.rowcount == 0:
            return None
        if judged.fault is not blame.Fault.HOST:
            self._not_the_hosts(judged, machine_id, instance_id, now, limit, window_s)
            return None
        counted = [str(r[0]) for r in self._exec(
            "select reason from machine_strikes where machine_id = ? and at > ? and "
            "fault = 'host' order by at, id", (machine_id, now - window_s)).fetchall()]
        self._events.add(now, "strike", f"{machine_id}: {reason} ({len(counted)} of {limit} "
                         f"within {window_s / 3600:.0f} h)", instance_id=instance_id,
                         machine_id=machine_id)
        if len(counted) < limit:
            return None
        why = f"{len(counted)} failed trials: " + "; ".join(counted)
        self.add(machine_id, reason=why[:1000], source="strikes", now=now,
                          instance_id=instance_id, expires_at=now + block_s)
        self._events.add(now, "bad_host", f"{machine_id}: blocked for {block_s / 3600:.0f} h "
                         f"after {len(counted)} failed trials", instance_id=instance_id,
                         machine_id=machine_id)
        return why

    def _not_the_hosts(self, judged: blame.Blame, machine_id: str, instance_id: int | None,
                       now: float, limit: int, window_s: float) -> None:
        """A failure that is not its host's: no strike; the same failure earlier on other
        machines is taken back from them too; beyond one machine, a fleet fault."""
        self._events.add(now, "blame", f"{machine_id}: not counted against the host, "
                         f"{judged.fault.value}'s fault: {judged.cause}",
                         instance_id=instance_id, machine_id=machine_id,
                         data={"fault": judged.fault.value, "fix": judged.fix})
        if not judged.fleet_wide:
            return
        self._exec("update machine_strikes set fault = ? where signature = ? and at > ? and "
                   "fault = 'host'", (judged.fault.value, judged.signature,
                                      now - blame.FLEET_WINDOW_S))
        for other in judged.machines:
            self._unblock_if_cleared(other, now, limit, window_s)
        self._open_fault(judged, now)

    def _unblock_if_cleared(self, machine_id: str, now: float, limit: int,
                            window_s: float) -> None:
        """A strikes block whose strikes were taken back below the limit ends."""
        block = self._exec("select source from bad_hosts where machine_id = ?",
                           (machine_id,)).fetchone()
        if block is None or block[0] != "strikes":
            return
        (left,) = self._exec("select count(*) from machine_strikes where machine_id = ? and "
                             "at > ? and fault = 'host'", (machine_id, now - window_s)).fetchone()
        if int(left) < limit:
            self.remove(machine_id)
            self._events.add(now, "unblocked", f"{machine_id}: its strikes were the setup's, "
                             "not the host's", machine_id=machine_id)

    def _open_fault(self, judged: blame.Blame, now: float) -> None:
        """Open a fleet fault with one alert, or add this failure to the open one."""
        row = self._exec("select id, failures, machines_json from fleet_faults where "
                         "signature = ? and cleared_at is null", (judged.signature,)).fetchone()
        if row is not None:
            machines = sorted(set(loads(row[2]) or []) | set(judged.machines))
            self._exec("update fleet_faults set failures = ?, machines_json = ?, last_at = ? "
                       "where id = ?", (int(row[1]) + 1, dumps(machines), now, int(row[0])))
            return
        fault_id = self._tx._insert("fleet_faults", {
            "signature": judged.signature, "fault": judged.fault.value, "cause": judged.cause,
            "fix": judged.fix, "opened_at": now, "last_at": now,
            "failures": len(judged.machines), "machines_json": dumps(list(judged.machines)),
        })
        fix = judged.fix.replace("faults clear ID", f"faults clear {fault_id}")
        self._exec("update fleet_faults set fix = ? where id = ?", (fix, fault_id))
        alert = f"deploys and the autopilot paused: {judged.cause}. Fix: {fix}"
        self._events.add(now, "fault", alert, data={"fault_id": fault_id,
                                                     "fault": judged.fault.value})
        log.error("fault %d (%s's): %s", fault_id, judged.fault.value, alert)

    def clear_fault(self, fault_id: int, note: str, now: float) -> bool:
        """The operator says a fleet fault is fixed: deploys resume (unless another holds)."""
        cur = self._exec("update fleet_faults set cleared_at = ?, cleared_note = ? where id = ? "
                         "and cleared_at is null", (now, note, fault_id))
        if cur.rowcount == 0:
            return False
        self._events.add(now, "fault_cleared", f"fault {fault_id} cleared: {note}",
                         data={"fault_id": fault_id})
        return True

    def forgive(self, machine_id: str, now: float) -> bool:
        """Lift a machine's block and take back its strikes. False: nothing to forgive."""
        blocked = self.remove(machine_id)
        struck = self._exec("update machine_strikes set fault = 'forgiven' where machine_id = ? "
                            "and fault = 'host'", (machine_id,)).rowcount
        if not blocked and not struck:
            return False
        self._events.add(now, "forgiven", f"{machine_id}: forgiven by the operator (block "
                         f"{'lifted' if blocked else 'none'}, {struck} strike(s) taken back)",
                         machine_id=machine_id)
        return True

    def remove(self, machine_id: str) -> bool:
        return self._exec("delete from bad_hosts where machine_id = ?", (machine_id,)).rowcount > 0
