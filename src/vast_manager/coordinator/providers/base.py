"""The provider interface the coordinator talks to, and its named errors.

Offers are ``Offer`` structs parsed from vast.ai's JSON at this boundary
(``coordinator.offers``: its fields and their vast.ai names); instances are
dicts in vast.ai's shape (docs/vast.md). Whichever provider produced them,
ranking, deploy checks and reconciliation never care where they came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from vast_manager.coordinator.offers import Offer

ProviderInstance = dict[str, Any]


class ProviderError(Exception):
    """A provider call failed; the message is safe to show (no secrets)."""


class OfferGone(ProviderError):
    """The offer no longer exists or is no longer rentable (vast.ai ``no_such_ask``)."""


class RateLimited(ProviderError):
    """The provider kept answering 429 after bounded retries."""


class SearchQuotaExceeded(RateLimited):
    """vast.ai's daily search quota is spent (HTTP 429 ``search_quota_exceeded``): never
    retried, it "only resets at UTC midnight" (``vastai`` 1.9.1, docs/vast.md).
    ``reset_at`` is ``X-RateLimit-Reset`` (epoch seconds), None when it was not sent."""

    def __init__(self, message: str, reset_at: float | None) -> None:
        super().__init__(message)
        self.reset_at = reset_at


class AuthError(ProviderError):
    """The provider refused our credentials."""


class BadRequest(ProviderError):
    """The provider refused the request as malformed."""


class CreateFailed(ProviderError):
    """A create was refused, yet it made an instance (vast.ai: ``success: false`` with a
    ``new_contract``). The instance bills until destroyed: whoever catches this owns it."""

    def __init__(self, message: str, instance_id: int) -> None:
        super().__init__(message)
        self.instance_id = instance_id


class DestroyUnconfirmed(ProviderError):
    """The destroy was accepted, but the instance is still there when looked up."""


@dataclass(frozen=True, slots=True)
class CreatedInstance:
    instance_id: int
    message: str = ""


class Provider(Protocol):
    name: str  # "local" or "vast"

    async def search_offers(self, filter_text: str | None = None) -> list[Offer]:
        """Offers matching a filter in the official CLI's syntax (None: the default filter)."""
        ...

    async def get_offer(self, offer_id: int) -> Offer | None:
        """Re-read one offer right now; None when it is gone or no longer rentable."""
        ...

    async def create_instance(
        self, offer: Offer, *, label: str, env: dict[str, str], disk_gb: int
    ) -> CreatedInstance:
        """Rent the offer. Raises OfferGone when it was sold meanwhile, CreateFailed when
        the create failed but left an instance behind."""
        ...

    async def destroy_instance(self, instance_id: int) -> None:
        """Destroy and confirm it is gone; idempotent (an instance already gone is success).
        Raises ProviderError (DestroyUnconfirmed when it is still listed afterwards)."""
        ...

    async def list_instances(self) -> list[ProviderInstance]:
        """Every instance of the account (each with at least id, label, machine_id,
        actual_status)."""
        ...

    async def close(self) -> None: ...
