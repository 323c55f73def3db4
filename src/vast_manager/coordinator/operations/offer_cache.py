"""The one offer cache: every search of the autopilot, the operator's ``offers`` and
``plan``, the dashboard and a deploy's re-check goes through it.

vast.ai meters searches by the day (HTTP 429 ``search_quota_exceeded``, "only resets at
UTC midnight"; its size is not published: docs/vast.md, "Searches: the daily quota, and
the one offer cache"), so a provider
that says ``searches_metered`` is searched at most ``VM_VAST_SEARCHES_PER_DAY`` times a UTC
day, and an answer younger than a day's share of that budget (``fresh_for_s``) is served
again instead of a new search. Once vast.ai answers ``search_quota_exceeded`` nothing is
searched until its ``X-RateLimit-Reset`` (else the next UTC midnight): one warning is
logged, ``/metrics`` and the dashboard show it, and every answer comes from the cache,
labelled stale. Every answer carries its age ("offers as of 4 min ago").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vast_manager.coordinator.offers import Offer
from vast_manager.coordinator.operations.production import duration
from vast_manager.coordinator.providers.base import (
    Provider,
    ProviderError,
    RateLimited,
    SearchQuotaExceeded,
)
from vast_manager.coordinator.settings import Settings

log = logging.getLogger(__name__)

DAY_S = 86_400.0
#: Search outcomes ``/metrics`` counts (``vm_vast_searches_total``).
OUTCOMES = ("answered", "quota_exceeded", "rate_limited", "failed")


def age_text(age_s: float) -> str:
    """``4 min ago``: an age an operator reads at a glance."""
    return f"{duration(max(0.0, age_s))} ago"


@dataclass(frozen=True, slots=True)
class OfferAnswer:
    """Offers and how old they are: ``stale`` when a newer answer was wanted but not
    searched for (``why``: the quota, the day's budget, a failed search)."""

    offers: list[Offer]
    as_of: float | None
    age_s: float
    stale: bool = False
    why: str | None = None

    def label(self) -> str:
        """``offers as of 4 min ago``, and why they are stale when they are."""
        said = ("no offers yet" if self.as_of is None
                else f"offers as of {age_text(self.age_s)}")
        return f"{said} (stale: {self.why})" if self.stale and self.why else said

    def fields(self) -> dict[str, Any]:
        """What every answer adds to its JSON (added fields; nothing renamed)."""
        return {"offers_as_of": self.as_of, "offers_age_s": round(self.age_s, 1),
                "offers_stale": self.stale, "offers_label": self.label()}


@dataclass(slots=True)
class _Entry:
    at: float
    offers: list[Offer] = field(default_factory=list)


class OfferCache:
    """Searches ``provider`` on the day's budget and answers from what it last found."""

    def __init__(self, provider: Provider, settings: Settings, clock: Callable[[], float]) -> None:
        self.provider = provider
        self.settings = settings
        self.clock = clock
        self.metered = bool(getattr(provider, "searches_metered", False))
        self._entries: dict[str | None, _Entry] = {}
        self._lock = asyncio.Lock()
        self._day = -1
        self.searches_today = 0
        self.counts: Counter[str] = Counter({o: 0 for o in OUTCOMES})
        #: Until when vast.ai's quota stops every search (epoch seconds), None while open.
        self.quota_until: float | None = None

    @property
    def budget(self) -> int:
        return self.settings.vast_searches_per_day

    @property
    def fresh_for_s(self) -> float:
        """How long an answer is served again: a day's share of the budget (0 unmetered)."""
        return DAY_S / self.budget if self.metered else 0.0

    def alert(self) -> str | None:
        """The one alert while searches are stopped (log, /metrics, dashboard banner)."""
        if self.quota_until is None:
            return None
        return (f"vast.ai's daily search quota is spent: no search until "
                f"{_utc(self.quota_until)} UTC; offers answer from the cache, labelled stale")

    def view(self) -> dict[str, Any]:
        now = self.clock()
        self._roll(now)
        ages = [now - e.at for e in self._entries.values()]
        return {"searches_today": self.searches_today, "searches_per_day": self.budget,
                "metered": self.metered, "quota_until": self.quota_until,
                "alert": self.alert(), "counts": dict(self.counts),
                "oldest_answer_age_s": round(max(ages), 1) if ages else None}

    async def search(self, filter_text: str | None = None) -> OfferAnswer:
        """Offers for ``filter_text``: the cached answer while it is fresh, or while no
        search may be sent (quota, budget); else a new search. A failed search answers the
        cached offers, stale, when there are any, and raises otherwise."""
        async with self._lock:
            now = self.clock()
            entry = self._entries.get(filter_text)
            why = self._no_search(now)
            if entry is not None and now - entry.at < self.fresh_for_s:
                # Young enough to serve; still labelled stale while the quota stops searches.
                return self._answer(entry, now, why if self.quota_until is not None else None)
            if why is None:
                try:
                    offers = await self._send(lambda: self.provider.search_offers(filter_text))
                except SearchQuotaExceeded:
                    why = self._no_search(self.clock())  # the quota's own words, stale
                except ProviderError as err:
                    if entry is None:
                        raise
                    why = f"the last search failed: {err}"
                else:
                    entry = self._entries[filter_text] = _Entry(self.clock(), offers)
                    return self._answer(entry, self.clock())
            if entry is None:
                return OfferAnswer([], None, 0.0, stale=True, why=why)
            return self._answer(entry, now, why)

    async def offer(self, offer_id: int) -> tuple[Offer | None, OfferAnswer | None]:
        """One offer re-read for a deploy. vast.ai has no endpoint for one offer (the
        OpenAPI description lists only the search, docs/vast.md), so this is a search for
        its id, counted on the budget; when no search may be sent, the newest cached copy
        of the offer is answered with its age (the create itself refuses a sold offer)."""
        async with self._lock:
            now = self.clock()
            why = self._no_search(now)
            if why is None:
                found = await self._send(lambda: self.provider.get_offer(offer_id))
                return found, None
            best: tuple[_Entry, Offer] | None = None
            for entry in self._entries.values():
                for o in entry.offers:
                    if o.id == offer_id and (best is None or entry.at > best[0].at):
                        best = (entry, o)
            if best is None:
                raise RateLimited(f"offer {offer_id} cannot be re-read now ({why}) and is not "
                                  "in the offer cache")
            return best[1], self._answer(best[0], now, why)

    # --- inside ---------------------------------------------------------------------------

    def _answer(self, entry: _Entry, now: float, why: str | None = None) -> OfferAnswer:
        return OfferAnswer(list(entry.offers), entry.at, max(0.0, now - entry.at),
                           stale=why is not None, why=why)

    def _roll(self, now: float) -> None:
        day = int(now // DAY_S)
        if day != self._day:
            self._day, self.searches_today = day, 0
        if self.quota_until is not None and now >= self.quota_until:
            log.warning("vast.ai's search quota has reset: searching again")
            self.quota_until = None

    def _no_search(self, now: float) -> str | None:
        """Why no search may be sent now, or None."""
        self._roll(now)
        if not self.metered:
            return None
        if self.quota_until is not None:
            return f"vast.ai's daily search quota is spent until {_utc(self.quota_until)} UTC"
        if self.searches_today >= self.budget:
            return (f"the day's search budget ({self.budget}, VM_VAST_SEARCHES_PER_DAY) is "
                    "spent until UTC midnight")
        return None

    async def _send(self, call: Callable[[], Any]) -> Any:
        self.searches_today += 1
        try:
            found = await call()
        except SearchQuotaExceeded as err:
            self.counts["quota_exceeded"] += 1
            now = self.clock()
            midnight = (int(now // DAY_S) + 1) * DAY_S
            self.quota_until = err.reset_at if err.reset_at and err.reset_at > now else midnight
            log.warning("%s", self.alert())
            raise
        except RateLimited:
            self.counts["rate_limited"] += 1
            raise
        except ProviderError:
            self.counts["failed"] += 1
            raise
        self.counts["answered"] += 1
        return found


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M")
