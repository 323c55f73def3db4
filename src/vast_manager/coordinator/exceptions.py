"""The coordinator core's named exceptions, and the one place they map to HTTP statuses.

The core (store, policy, deploy, monitor) raises these; ``app.py`` turns any
of them into an error body (docs/protocol.md, Errors) with ``http_status(exc)``, and the CLI
can turn them into exit codes the same way. Messages are safe to show: they
never hold a key, a token or a stack trace.
"""

from __future__ import annotations

from typing import Any

from vast_manager.coordinator.providers.base import AuthError as ProviderAuthError
from vast_manager.coordinator.providers.base import BadRequest as ProviderBadRequest
from vast_manager.coordinator.providers.base import OfferGone as ProviderOfferGone
from vast_manager.coordinator.providers.base import ProviderError
from vast_manager.coordinator.providers.base import RateLimited as ProviderRateLimited


class CoordinatorError(Exception):
    """Base of the core's refusals: a snake_case ``code`` and a one-sentence message."""

    code = "error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


class Refusal(Exception):
    """A request refused at the HTTP layer with its own status, before any handler
    runs: a body too large, too slow or cut off; a missing login; a failed CSRF check;
    too many failed attempts (with the seconds to wait, sent as ``Retry-After``)."""

    def __init__(self, status: int, code: str, message: str, *,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s

    def to_body(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


class InvalidInput(CoordinatorError):
    """A request body or parameter that is not what the endpoint takes."""

    code = "invalid_field"


class NotFound(CoordinatorError):
    code = "not_found"


class UnknownAgent(CoordinatorError):
    code = "unknown_agent"


class HelloRequired(CoordinatorError):
    """An agent spoke before saying hello, so no instance row exists for it yet."""

    code = "hello_required"


class InstanceGone(CoordinatorError):
    """The instance is already destroyed; the operation no longer applies."""

    code = "instance_gone"


class OfferGone(CoordinatorError):
    code = "offer_gone"


class BadHost(CoordinatorError):
    code = "bad_host"


class MachineBusy(CoordinatorError):
    code = "machine_busy"


class PriceChanged(CoordinatorError):
    code = "price_changed"


class TooSmall(CoordinatorError):
    """The offer's instance would get less RAM than cuzk needs (its share of the host)."""

    code = "too_small"


class AutopilotNotConfigured(CoordinatorError):
    """The autopilot cannot start: the coordinator runs without ``--autopilot`` and caps."""

    code = "autopilot_not_configured"


class InvalidMeasurement(CoordinatorError):
    """A ``hosts import`` line that cannot be a measurement: ``line`` is its number."""

    code = "invalid_measurement"

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None
                 ) -> None:
        super().__init__(message, field=field)
        self.line = line

    def to_body(self) -> dict[str, Any]:
        body = super().to_body()
        if self.line is not None:
            body["line"] = self.line
        return body


class AccountPaused(CoordinatorError):
    """Deploys wait: the vast.ai account's funds are below the pause floor, or its key is
    refused (docs/operations.md, "The account")."""

    code = "account_paused"


class FaultPaused(CoordinatorError):
    """Deploys wait: a failure seen beyond one machine is the setup's or vast.ai's, not a
    host's (docs/policy.md, "Blame"), until the operator clears it."""

    code = "fault_paused"


class PreflightFailed(CoordinatorError):
    """A check before the first deploy of a configuration failed: every instance would
    fail the same way (docs/operations.md, "Preflight")."""

    code = "preflight_failed"


class ProviderFailed(CoordinatorError):
    """The provider (vast.ai) failed; nothing of ours changed."""

    code = "provider_error"


# The one table from exception class to HTTP status (most specific first).
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidInput, 400),
    (NotFound, 404),
    (UnknownAgent, 401),
    (HelloRequired, 409),
    (InstanceGone, 409),
    (OfferGone, 409),
    (BadHost, 409),
    (MachineBusy, 409),
    (PriceChanged, 409),
    (TooSmall, 409),
    (AutopilotNotConfigured, 409),
    (InvalidMeasurement, 400),
    (AccountPaused, 409),
    (FaultPaused, 409),
    (PreflightFailed, 409),
    (ProviderFailed, 502),
    (ProviderOfferGone, 409),
    (ProviderRateLimited, 503),
    (ProviderAuthError, 502),
    (ProviderBadRequest, 502),
    (ProviderError, 502),
)


def http_status(exc: BaseException) -> int:
    """The HTTP status for a core or provider exception (500 for anything else)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(exc: BaseException) -> dict[str, Any]:
    """The error body (docs/protocol.md) for a core or provider exception; never a stack trace."""
    if isinstance(exc, CoordinatorError):
        return exc.to_body()
    if isinstance(exc, ProviderOfferGone):
        return {"error": "offer_gone", "message": str(exc) or "The offer is gone."}
    if isinstance(exc, ProviderRateLimited):
        return {"error": "provider_rate_limited", "message": str(exc) or "The provider is busy."}
    if isinstance(exc, ProviderError):
        return {"error": "provider_error", "message": str(exc) or "The provider call failed."}
    return {"error": "internal_error", "message": "The coordinator hit an internal error."}
