"""The vast.ai account as the coordinator sees it: funds, a refused key, and whether to deploy.

Read once a monitor round (``refresh``) through the provider's ``account`` call
(``GET /api/v0/users/current``, docs/vast.md "The account"). What it decides:

- funds below ``balance_warn_usd``: a warning (log, status, dashboard, /metrics);
- funds below ``balance_pause_usd``: deploys and the autopilot pause until the
  funds are back above it;
- a refused key (401/403) on any call: an alert (ERROR log, ``vm_vast_auth_ok``
  0, a dashboard banner), deploys refused with that reason, and the read retried
  with a backoff that doubles up to ``MAX_BACKOFF_S``. Nothing is destroyed for
  it: the monitor destroys only on what vast.ai's instance list says.

A provider without an account (the local simulation) has nothing to read: the
state stays unknown and nothing pauses.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.offers import as_float
from vast_manager.coordinator.providers.base import AuthError, ProviderError

log = logging.getLogger(__name__)

#: The longest wait between two reads after failures.
MAX_BACKOFF_S = 900.0


@dataclass(frozen=True, slots=True)
class AccountView:
    """What ``status``, ``/metrics`` and the dashboard show of the account."""

    balance_usd: float | None
    credit_usd: float | None
    funds_usd: float | None
    checked_at: float | None
    auth_ok: bool
    auth_error: str | None
    warning: str | None
    paused: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "balance_usd": self.balance_usd,
            "credit_usd": self.credit_usd,
            "funds_usd": self.funds_usd,
            "checked_at": self.checked_at,
            "auth_ok": self.auth_ok,
            "auth_error": self.auth_error,
            "warning": self.warning,
            "paused": self.paused,
        }


def funds_of(user: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(balance, credit, funds) of a users/current answer: funds are the credit when
    vast.ai gives it (what its billing page calls the credit balance), else the balance."""
    balance = as_float(user.get("balance"))
    credit = as_float(user.get("credit"))
    balance = balance if balance is not None and math.isfinite(balance) else None
    credit = credit if credit is not None and math.isfinite(credit) else None
    return balance, credit, credit if credit is not None else balance


class Account:
    """The account's last known state and the rules on it (see the module's text)."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, Any]]] | None, *,
                 warn_usd: float, pause_usd: float, interval_s: float) -> None:
        self._read = read
        self.warn_usd = warn_usd
        self.pause_usd = pause_usd
        self.interval_s = interval_s
        self.balance: float | None = None
        self.credit: float | None = None
        self.funds: float | None = None
        self.checked_at: float | None = None
        self.auth_error: str | None = None
        self._failures = 0
        self._next_try_at = 0.0
        self._warned = False

    def refused(self, err: AuthError) -> None:
        """Any vast.ai call answered 401/403: the key is refused from now on."""
        if self.auth_error is None:
            log.error("%s: deploys stop, nothing is destroyed, the account is read again "
                      "with backoff", err)
        self.auth_error = str(err)

    async def refresh(self, now: float) -> None:
        """Read the account, unless a backoff after failures says wait."""
        if self._read is None or now < self._next_try_at:
            return
        try:
            user = await self._read()
        except AuthError as err:
            self.refused(err)
            self._back_off(now)
            return
        except ProviderError as err:
            log.warning("could not read the vast.ai account: %s", err)
            self._back_off(now)
            return
        if self.auth_error is not None:
            log.warning("vast.ai accepts the API key again; deploys resume")
        self.auth_error = None
        self._failures = 0
        self._next_try_at = 0.0
        self.balance, self.credit, self.funds = funds_of(user)
        self.checked_at = now
        low = self.funds is not None and self.funds < self.warn_usd
        if low and not self._warned:
            log.warning("vast.ai funds $%.2f are below the warning floor $%.2f",
                        self.funds, self.warn_usd)
        self._warned = low

    def _back_off(self, now: float) -> None:
        self._failures += 1
        wait = min(MAX_BACKOFF_S, self.interval_s * 2 ** (self._failures - 1))
        self._next_try_at = now + wait

    @property
    def at_or_below_zero(self) -> bool:
        """vast.ai stops every instance at zero funds (docs/vast.md "The account")."""
        return self.funds is not None and self.funds <= 0

    def pause_reason(self) -> str | None:
        """Why deploys and the autopilot must wait now, or None."""
        if self.auth_error is not None:
            return f"vast.ai refuses the API key ({self.auth_error})"
        if self.funds is not None and self.funds < self.pause_usd:
            return (f"vast.ai funds ${self.funds:.2f} are below VM_BALANCE_PAUSE_USD "
                    f"${self.pause_usd:.2f}; add credit")
        return None

    def view(self) -> AccountView:
        warning = None
        if self.funds is not None and self.funds < self.warn_usd:
            warning = (f"vast.ai funds ${self.funds:.2f} are below VM_BALANCE_WARN_USD "
                       f"${self.warn_usd:.2f}")
        return AccountView(
            balance_usd=self.balance, credit_usd=self.credit, funds_usd=self.funds,
            checked_at=self.checked_at, auth_ok=self.auth_error is None,
            auth_error=self.auth_error, warning=warning, paused=self.pause_reason(),
        )
