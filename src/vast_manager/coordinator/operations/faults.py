"""Whether deploys and the autopilot must wait, and why: the vast.ai account
(``account.Account``) or an open fleet fault (``decisions.blame``: a failure that is not
one host's, docs/policy.md "Blame"). One answer for the deployer, the autopilot, the
status line, the dashboard and ``/metrics``."""

from __future__ import annotations

from typing import Protocol

from vast_manager.coordinator.exceptions import AccountPaused, CoordinatorError, FaultPaused
from vast_manager.coordinator.operations.account import Account
from vast_manager.coordinator.store.migrations import Row


class FaultReads(Protocol):
    def fleet_faults(self, open_only: bool = False) -> list[Row]: ...


def fault_text(row: Row) -> str:
    """One open fault as the alert says it: the cause, then the fix."""
    return (f"fault {row['id']} ({row['fault']}'s, {row['failures']} failure(s)): "
            f"{row['cause']}. Fix: {row['fix']}")


def pause_error(account: Account | None, store: FaultReads) -> CoordinatorError | None:
    """The refusal a deploy gets now, or None when deploys may go ahead."""
    paused = account.pause_reason() if account is not None else None
    if paused is not None:
        return AccountPaused(f"Deploys are paused: {paused}.")
    faults = store.fleet_faults(open_only=True)
    if faults:
        return FaultPaused(f"Deploys are paused: {fault_text(faults[-1])}")
    return None


def pause_reason(account: Account | None, store: FaultReads) -> str | None:
    err = pause_error(account, store)
    return None if err is None else str(err).removeprefix("Deploys are paused: ")
