"""Delivered beats claimed (docs/reliability.md, "Judged by what it delivers"), each
monitor round: an instance whose delivery test found it short is demoted, re-judged on
what it delivers and its machine struck; one whose delivery agreed with the rate it was
kept on has its bounded measurements learned up to what it delivered."""

from __future__ import annotations

import logging

from vast_manager.coordinator.decisions import blame, delivered, policy
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.production import ProductionTracker
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.writer import Store, Tx

log = logging.getLogger(__name__)


class DeliveryVerdicts:
    """The delivery test's consequences, written through the store's one writer."""

    def __init__(self, settings: Settings, store: Store, production: ProductionTracker
                 ) -> None:
        self.settings = settings
        self.store = store
        self.production = production
        self.strike_rule = policy.StrikeRule.from_settings(settings)

    async def learn_agreed(self, now: float) -> None:
        """Delivered beats claimed, the other way (docs/reliability.md): an instance whose
        delivery test agreed with the rate it was kept on has its measurements learned
        bounded (above what the model believed of its hardware) read by the model up to
        what it delivered."""
        agreed = self.production.take_agreed()
        if not agreed:
            return

        def learn(tx: Tx) -> None:
            for instance_id, rate in agreed.items():
                inst = tx.get_instance(instance_id)
                taken = tx.results.learn_delivered(instance_id, rate)
                if inst is None or not taken:
                    continue
                tx.audit.add(now, "learned", f"delivered {rate:.1f}/h, agreeing with the "
                             f"{float(inst['rate_per_hour'] or 0.0):.1f}/h it was kept on: "
                             f"the rate model reads {taken} measurement(s) up to it",
                             data={"delivered_rate_per_hour": rate},
                             instance_id=instance_id, agent_id=inst["agent_id"],
                             machine_id=inst["machine_id"])

        # The measurements' version changes: the model keeper refits on its next look.
        await self.store.write(learn)

    async def demote_short(self, now: float) -> list[int]:
        """Delivered beats claimed (docs/reliability.md): an instance whose delivery test
        found it short, while another instance delivers its rate (the work flows), has its
        measurements demoted from host_perf and the model, is re-judged on what it
        delivers (its rate; terminated below its minimum) and its machine gets a strike
        with the numbers. With no instance delivering its rate the shortfall may be the
        work's, not the host's: idle (its event says why), nothing demoted yet."""
        current = self.production.current
        short = self.production.short_ids()
        # Evidence the work flows: another instance delivering its rate now (before the
        # idle stop, VM_IDLE_DESTROY_AFTER_S, ends a short one unjudged).
        flowing = any(
            p.short is None and p.rate_per_hour
            and (p.completed_rate_per_hour or 0.0)
            >= delivered.HONEST_SHARE * float(p.rate_per_hour)
            for i, p in current.items() if i not in short)
        if not flowing:
            return []
        strike = self.strike_rule
        grace = self.settings.terminate_grace_s

        def demote(tx: Tx) -> list[int]:
            done = []
            for instance_id in short:
                inst = tx.get_instance(instance_id)
                p = current[instance_id]
                if inst is None or inst["state"] != State.PROVING or inst["terminate_reason"] \
                        or p.short is None:
                    continue
                ids = {"instance_id": instance_id, "agent_id": inst["agent_id"],
                       "machine_id": inst["machine_id"]}
                rate = float(p.short_rate_per_hour or 0.0)
                taken = tx.results.demote(instance_id, p.short)
                tx.instances.update(instance_id, rate_per_hour=rate, updated_at=now)
                tx.audit.add(now, "demoted", f"{p.short}; {taken} measurement(s) taken out "
                                f"of host_perf and the model, re-judged at {rate:.1f}/h",
                                data={"delivered_rate_per_hour": rate,
                                      "kept_rate_per_hour": inst["rate_per_hour"],
                                      "measurements_demoted": taken}, **ids)
                if inst["kind"] == "deployed" and inst["machine_id"]:
                    tx.blocklist.strike(str(inst["machine_id"]), f"delivered short: {p.short}",
                                  now=now, instance_id=instance_id, limit=strike.limit,
                                  window_s=strike.window_s, block_s=strike.block_s,
                                  kind=blame.HOST_EVIDENCE, state=str(inst["state"]))
                minimum = inst["min_rate_per_hour"]
                if minimum is not None and rate < float(minimum):
                    tx.instances.begin_terminating(
                        instance_id, f"delivers {rate:.1f}/h, below its minimum of "
                        f"{float(minimum):.1f}/h: {p.short}", kind="verdict", now=now,
                        destroy_due_at=now + grace)
                done.append(instance_id)
            return done

        done = await self.store.write(demote)
        for instance_id in done:
            self.production.rejudged(instance_id)
            log.warning("instance %s demoted: %s", instance_id, current[instance_id].short)
        return done
