"""Each monitor round: read vast.ai's pending price increases on our instances, judge each
(``decisions.price_increase``), answer vast.ai, and say it as an event with the numbers.

Accepted, the new price bills from the contract's end date; rejected, the host may stop the
instance then (docs/vast.md, "Price increases"): the usual rules follow (a ``stopped``
instance is destroyed, without a strike against its machine, and the autopilot replaces
what the fleet lacks). ``pending`` is what ``status`` and the dashboard show.
"""

from __future__ import annotations

import logging
from typing import Any

from vast_manager.coordinator.decisions import cost
from vast_manager.coordinator.decisions.earnings import break_even_usd_per_proof
from vast_manager.coordinator.decisions.price_increase import Increase, judge
from vast_manager.coordinator.offers import stored_offer
from vast_manager.coordinator.operations.production import ProductionTracker
from vast_manager.coordinator.providers.base import Provider, ProviderError
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)


class PriceIncreases:
    """The judge of pending increases, one round at a time."""

    def __init__(self, settings: Settings, store: Store, provider: Provider,
                 production: ProductionTracker) -> None:
        self.settings = settings
        self.store = store
        self.provider = provider
        self.production = production
        #: Our instance id -> the pending increase and its verdict (``status``, dashboard).
        self.pending: dict[int, dict[str, Any]] = {}
        #: Provider instance ids whose increase we rejected: their stop is no host's fault.
        self.rejected: set[int] = set()
        self._told: dict[int, str] = {}  # pending id -> the verdict already evented

    async def round(self, now: float) -> None:
        read = getattr(self.provider, "pending_price_increases", None)
        if read is None:
            return
        try:
            rows = await read()
        except ProviderError as err:
            log.warning("could not read vast.ai's pending price increases: %s", err)
            return
        found = [i for i in (Increase.of(r) for r in rows) if i is not None]
        instances = await self.store.read(lambda r: r.active_instances()) if found else []
        by_pid = {int(r["provider_instance_id"]): r for r in instances
                  if r["provider_instance_id"] is not None and r["kind"] == "deployed"}
        fleet_dph = sum(float(r["dph_total"] or 0.0) for r in by_pid.values())
        pending: dict[int, dict[str, Any]] = {}
        for inc in found:
            row = by_pid.get(inc.contract_id)
            if row is not None:
                pending[int(row["id"])] = await self._one(inc, row, fleet_dph, now)
        self.pending = pending
        live = {int(p["pending_price_increase_id"]) for p in pending.values()}
        self._told = {k: v for k, v in self._told.items() if k in live}

    async def _one(self, inc: Increase, row: Row, fleet_dph: float, now: float
                   ) -> dict[str, Any]:
        offer = stored_offer(row["offer_json"])
        prices = cost.prices_of(offer, row["disk_gb"], row["bid_per_hour"]) if offer else None
        view: dict[str, Any] = {"pending_price_increase_id": inc.pending_id,
                                "instance_id": row["id"], "vast_id": inc.contract_id,
                                "new_rent_per_hour": inc.new_rent_per_hour,
                                "contract_end_date": inc.contract_end_date}
        if prices is None:
            view.update(verdict="wait", reason="the instance's offer has no price to compare")
            return view
        rate, basis = row["rate_per_hour"], "measured"
        if rate is None:
            rate, basis = self.production.view(int(row["id"])).get(
                "completed_rate_per_hour"), "delivered"
        hours = max(now - float(row["hello_at"] or now), 0.0) / 3600.0
        settings = self.settings
        # The steady traffic: the one-off setup download (VM_SETUP_DOWNLOAD_GB) is not an
        # hourly cost of keeping the instance.
        setup = settings.setup_download_gb * cost.BYTES_PER_GB
        rx = max(0.0, float(row["net_rx_bytes"] or 0) - setup)
        verdict = judge(
            inc, prices, rate_per_hour=rate, basis=basis,
            # The break-even of a proof's price when one is set (decisions.earnings).
            max_usd_per_proof=break_even_usd_per_proof(settings),
            down_bytes_per_hour=rx / hours if hours > 0 else 0.0,
            up_bytes_per_hour=float(row["net_tx_bytes"] or 0) / hours if hours > 0 else 0.0,
            max_deploy_dph_total=settings.max_deploy_dph_total, fleet_dph_total=fleet_dph,
            max_fleet_dph_total=settings.autopilot_max_dph_total if settings.autopilot else None)
        view.update(reason=verdict.reason, **verdict.data())
        if verdict.verdict != "wait":
            answer = getattr(self.provider, "answer_price_increase", None)
            if answer is None:
                return view
            try:
                await answer(inc.pending_id, accept=verdict.verdict == "accept")
            except ProviderError as err:
                log.warning("could not %s price increase %s: %s", verdict.verdict,
                            inc.pending_id, err)
                view["reason"] += f" (vast.ai refused the answer: {err}; tried again next round)"
                return view
            if verdict.verdict == "reject":
                self.rejected.add(inc.contract_id)
        if self._told.get(inc.pending_id) != verdict.verdict:
            self._told[inc.pending_id] = verdict.verdict
            word = {"accept": "accepted", "reject": "rejected", "wait": "pending"}[verdict.verdict]
            message = f"price increase {inc.pending_id} {word}: {verdict.reason}"

            def note(tx: Tx) -> None:
                tx.audit.add(now, "price_increase", message, instance_id=row["id"],
                                agent_id=row["agent_id"], machine_id=row["machine_id"],
                                data={"pending_price_increase_id": inc.pending_id,
                                      **verdict.data()})

            await self.store.write(note)
            log.info("instance %s: %s", row["id"], message)
        return view
