"""Deploy an offer through the provider, after the checks that keep rent from being wasted.

One asyncio lock serializes deploys, so two deploys can never both pass the
"machine busy" check for one machine. Every refusal happens before
``create_instance`` is called, including an offer whose instance would get
less RAM than cuzk needs (its share of the host, ``vast_manager.coordinator.decisions.share``). The
agent row and the instance row are written before the provider creates
anything, so an instance that boots is always one we know of (the monitor and
reconciliation watch it), even if the coordinator dies before the provider
answers; with a replica (``VM_REPLICA_URL``) they are in the replica too before the
provider is asked (``durable``), so a coordinator restored from it knows the new
agent's key and never takes its instance for a leak. A create that failed but left an
instance (vast.ai answers ``success: false`` with a ``new_contract``) gets that instance
recorded and destroyed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from vast_manager.coordinator.decisions import cost, earnings, policy
from vast_manager.coordinator.decisions.attribution import CURIO_NODE_NAME, node_name
from vast_manager.coordinator.decisions.share import instance_share, shortfall
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.measurements import NOT_OFFER_FIELDS
from vast_manager.coordinator.exceptions import (
    BadHost,
    InvalidInput,
    MachineBusy,
    OfferGone,
    PreflightFailed,
    PriceChanged,
    ProviderFailed,
    TooSmall,
)
from vast_manager.coordinator.operations import faults, preflight
from vast_manager.coordinator.operations.account import Account
from vast_manager.coordinator.operations.offer_cache import OfferCache
from vast_manager.coordinator.providers.base import (
    CreatedInstance,
    CreateFailed,
    Offer,
    Provider,
    ProviderError,
)
from vast_manager.coordinator.providers.base import OfferGone as ProviderOfferGone
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import dumps
from vast_manager.coordinator.store.replica import ReplicaError
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.protocol import signing

log = logging.getLogger(__name__)

# Offer fields copied onto the instance row (vast.ai names).
OFFER_FIELDS = (
    "machine_id", "gpu_name", "num_gpus", "dph_total", "geolocation",
    "cpu_name", "cpu_cores", "cpu_cores_effective", "cpu_ram", "pcie_bw",
)
#: Destroys one of our instances now (``Monitor.destroy``): instance row id, reason.
Destroy = Callable[..., Awaitable[bool]]
# A price may move by this much (relative) before the caller must look again.
PRICE_EPSILON = 1e-6
# ...and by this much in dollars an hour: a price read from a search and the same price
# recomputed from its parts (dph_total less a storage_total_cost rounded to six decimals,
# plus the storage of the disk) differ by rounding alone.
PRICE_ROUNDING_USD = 1e-5


def mint_agent_id() -> str:
    """``ag_`` + 20 lowercase hex characters (docs/protocol.md)."""
    return "ag_" + secrets.token_hex(10)


def agent_label(fleet_id: str, agent_id: str) -> str:
    return f"vm:{fleet_id}:{agent_id}"


def agent_env(coordinator_url: str, agent_id: str, agent_key: bytes,
              instance_id: int | None = None) -> dict[str, str]:
    """The agent's environment; with ``instance_id``, also the Curio node name its work
    command runs under (``CURIO_NODE_NAME``: the cluster's rows are matched by it,
    docs/operations.md "Production as the cluster records it")."""
    env = {
        "VM_COORDINATOR_URL": coordinator_url,
        "VM_AGENT_ID": agent_id,
        "VM_AGENT_KEY": agent_key.hex(),
    }
    if instance_id is not None:
        env[CURIO_NODE_NAME] = node_name(instance_id)
    return env


@dataclass(frozen=True, slots=True)
class Deployed:
    instance_id: int
    provider_instance_id: int
    agent_id: str
    message: str


@dataclass(frozen=True, slots=True)
class _Checked:
    """An offer re-read and checked for a deploy, priced with the deploy's own disk."""

    offer_id: int
    offer: Offer
    machine_id: str
    ram_gb: float | None
    disk_gb: int
    prices: cost.Prices


@dataclass(frozen=True, slots=True)
class _Terms:
    """What a deploy gives its instance: the agent's identity, the minimum rate, a bid."""

    agent_id: str
    label: str
    key: bytes
    min_rate: float | None
    bid: float | None
    setup_bandwidth: float  # $/h of the setup download over a kept life
    now: float
    price_min_rate: float | None  # with an operator-given minimum: the one its price sets


class Deployer:
    """``deploy`` of the operator API (docs/protocol.md), with its checks; one deploy at a time."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        provider: Provider,
        clock: policy.Clock,
        *,
        destroy: Destroy | None = None,
        account: Account | None = None,
        offers: OfferCache | None = None,
    ) -> None:
        """``destroy``: the monitor's (``Monitor.destroy``), for an instance a failed create
        left behind; without it the monitor's next round destroys it (it is due at once)."""
        self.settings = settings
        self.store = store
        self.provider = provider
        self.clock = clock
        self._destroy = destroy
        self.account = account
        #: Returns once committed writes are in the replica (the runtime sets it).
        self.durable: Callable[[], Awaitable[None]] | None = None
        # The runtime's shared cache: a re-check is a search on vast.ai's daily budget.
        self.offers = offers if offers is not None else OfferCache(provider, settings, clock)
        self._lock = asyncio.Lock()
        # The configurations (``preflight.fingerprint``) whose preflight passed.
        self._preflighted: set[str] = set()

    async def _preflight(self) -> None:
        """Before the first deploy of a configuration: its preflight (the C1, the parameter
        source, the image); a failure refuses the deploy with one line, renting nothing."""
        key = preflight.fingerprint(self.settings)
        if key in self._preflighted:
            return
        refused = preflight.refusal(await preflight.run(self.settings))
        if refused is not None:
            raise PreflightFailed(refused)
        self._preflighted.add(key)

    async def deploy(
        self,
        offer_id: int,
        *,
        min_rate_per_hour: float | None = None,
        disk_gb: int | None = None,
        max_dph_total: float | None = None,
        interruptible: bool = False,
    ) -> Deployed:
        """Check, then rent (``interruptible``: at a bid, docs/operations.md).

        Raises OfferGone, BadHost, MachineBusy, TooSmall, PriceChanged or ProviderFailed.
        """
        async with self._lock:
            return await self._deploy(offer_id, min_rate_per_hour, disk_gb, max_dph_total,
                                      interruptible)

    async def _deploy(
        self,
        offer_id: int,
        explicit_min_rate: float | None,
        disk_gb: int | None,
        max_dph_total: float | None,
        interruptible: bool = False,
    ) -> Deployed:
        checked = await self._checked(offer_id, disk_gb, max_dph_total, interruptible)
        terms = self._terms(checked, explicit_min_rate, interruptible)
        instance_id = await self.store.write(lambda tx: self._record(tx, checked, terms))
        # Cancelled or crashed mid-create, we cannot know whether it exists: the rows
        # stay in `deploying`, so reconciliation (label) and the no-hello timeout finish it.
        created = await self._create(checked, terms, instance_id)

        def created_ok(tx: Tx) -> None:
            tx.instances.update(
                instance_id, provider_instance_id=created.instance_id, updated_at=self.clock()
            )
            tx.audit.add(
                self.clock(), "deployed",
                f"{self.provider.name} instance {created.instance_id} created",
                instance_id=instance_id, agent_id=terms.agent_id, machine_id=checked.machine_id,
            )

        await self.store.write(created_ok)
        message = created.message or f"instance {created.instance_id} created"
        return Deployed(instance_id, created.instance_id, terms.agent_id, message)

    async def _checked(self, offer_id: int, disk_gb: int | None, max_dph_total: float | None,
                       interruptible: bool) -> _Checked:
        """The offer as it is now, after every check that keeps rent from being wasted."""
        if interruptible and not getattr(self.provider, "supports_bids", False):
            raise InvalidInput(f"{self.provider.name} rents no interruptible instances.",
                               field="interruptible")
        paused = faults.pause_error(self.account, self.store)
        if paused is not None:
            raise paused
        await self._preflight()
        try:
            offer, cached = await self.offers.offer(offer_id)
        except ProviderError as err:
            raise ProviderFailed(f"Could not re-read offer {offer_id}: {err}") from None
        if offer is None:
            raise OfferGone(f"Offer {offer_id} is gone or no longer rentable.")
        if cached is not None:
            log.warning("deploy of offer %s re-checked from the cache (%s)", offer_id,
                        cached.label())
        machine_id = str(offer.machine_id)
        bad = self.store.bad_host(machine_id, self.clock())
        if bad is not None:
            raise BadHost(f"Machine {machine_id} is on bad_hosts: {bad['reason']}")
        busy = self.store.active_instances_on_machine(machine_id)
        if busy:
            ids = ", ".join(str(row["id"]) for row in busy)
            raise MachineBusy(f"Machine {machine_id} already runs instance(s) {ids} of ours.")
        share = instance_share(offer)
        short = shortfall(share, self.settings.min_instance_ram_gb)
        if short is not None:
            raise TooSmall(f"Offer {offer_id} is refused: {short} (VM_MIN_INSTANCE_RAM_GB).")
        disk = disk_gb if disk_gb is not None else self.settings.deploy_disk_gb
        # Priced with this deploy's own disk: the offer's dph_total holds the storage of
        # the disk it was searched with (docs/operations.md, "What an instance costs").
        prices = cost.prices_of(offer, disk)
        if prices is None or offer.dph_total is None:
            raise PriceChanged(f"Offer {offer_id} has no price.")
        dph_total = prices.hourly_total
        ceiling = self.settings.max_deploy_dph_total
        if dph_total > ceiling * (1 + PRICE_EPSILON):
            raise PriceChanged(
                f"Offer {offer_id} costs ${dph_total:.4f}/h, above the ceiling ${ceiling:.4f}/h."
            )
        if max_dph_total is not None and \
                dph_total > max_dph_total * (1 + PRICE_EPSILON) + PRICE_ROUNDING_USD:
            raise PriceChanged(
                f"Offer {offer_id} now costs ${dph_total:.4f}/h with a {disk:g} GB disk, above "
                f"the ${max_dph_total:.4f}/h you saw (--max-price)."
            )
        return _Checked(offer_id, offer, machine_id, share.ram_gb, disk, prices)

    def _terms(self, checked: _Checked, explicit_min_rate: float | None,
               interruptible: bool) -> _Terms:
        """The new agent's identity, the minimum rate and the bid."""
        agent_id = mint_agent_id()
        prices = checked.prices
        # The minimum rate divides the full figure: rent, storage and the setup's download
        # spread over a kept instance's life.
        figure = cost.kept_per_hour(
            prices, setup_down_bytes=self.settings.setup_download_gb * cost.BYTES_PER_GB,
            kept_hours=self.settings.plan_horizon_hours,
        )
        # The break-even rate of the full bill when a proof's price is set (decisions.earnings).
        price_min_rate = policy.min_rate_per_hour(
            figure.total, earnings.break_even_usd_per_proof(self.settings))
        min_rate = price_min_rate if explicit_min_rate is None else float(explicit_min_rate)
        # An interruptible trial bids a share of the on-demand rent, at least vast.ai's
        # minimum bid; it is judged against the on-demand figure all the same.
        bid = None
        if interruptible:
            bid = max(prices.rent_per_hour * self.settings.interruptible_bid_share,
                      checked.offer.min_bid or 0.0)
        return _Terms(agent_id, agent_label(self.settings.fleet_id, agent_id),
                      signing.derive_agent_key(self.settings.newest_secret, agent_id),
                      min_rate, bid, figure.bandwidth, self.clock(),
                      None if explicit_min_rate is None else price_min_rate)

    def _record(self, tx: Tx, checked: _Checked, terms: _Terms) -> int:
        """The agent and the instance, in `deploying`, before anything is rented."""
        offer, prices, now = checked.offer, checked.prices, terms.now
        # Stored as vast.ai sent them (the offer's JSON), as before offers were typed.
        meta = {name: offer.raw.get(name) for name in OFFER_FIELDS}
        meta["machine_id"] = checked.machine_id
        meta["dph_total"] = prices.hourly_total
        meta["instance_ram_gb"] = checked.ram_gb
        # The whole offer as deployed: the hardware its results ran on, for the rate model.
        meta["offer_json"] = dumps({k: v for k, v in offer.raw.items()
                                    if k not in NOT_OFFER_FIELDS})
        tx.agents.add(
            terms.agent_id, label=terms.label, kind="deployed",
            min_rate_per_hour=terms.min_rate, issued_at=now,
        )
        instance_id = tx.instances.add(
            {
                **meta,
                "agent_id": terms.agent_id,
                "label": terms.label,
                "kind": "deployed",
                "provider": self.provider.name,
                "offer_id": checked.offer_id,
                "state": State.DEPLOYING,
                "state_since": now,
                "disk_gb": checked.disk_gb,
                "bid_per_hour": terms.bid,
                "min_rate_per_hour": terms.min_rate,
                # An operator-given minimum judges this deploy only; a block needs a rate
                # below this one, the minimum its own price sets (docs/policy.md, "Blame").
                "price_min_rate_per_hour": terms.price_min_rate,
                "created_at": now,
                "updated_at": now,
            }
        )
        rate_text = "none" if terms.min_rate is None else f"{terms.min_rate:.2f} proofs/h"
        tx.audit.add(
            now, "deploy",
            f"deploying offer {checked.offer_id} at ${prices.hourly_total:.4f}/h with a "
            f"{checked.disk_gb} GB disk (rent ${prices.rent_per_hour:.4f}, storage "
            f"${prices.storage_per_hour:.4f}, setup download ${terms.setup_bandwidth:.4f}/h "
            f"over a kept life), minimum rate {rate_text}"
            + ("" if terms.bid is None else f"; interruptible at a bid of ${terms.bid:.4f}/h"),
            instance_id=instance_id, agent_id=terms.agent_id, machine_id=checked.machine_id,
        )
        return instance_id

    async def _create(self, checked: _Checked, terms: _Terms, instance_id: int) -> CreatedInstance:
        """Rent it; a failure is recorded on the instance and raised as the core's error."""
        offer_id = checked.offer_id
        if self.durable is not None:
            try:
                await self.durable()
            except ReplicaError as err:
                reason = f"the replica did not confirm the new agent's key ({err})"
                await self.store.write(
                    lambda tx: self._abandon(tx, instance_id, terms.agent_id, reason))
                raise ProviderFailed(f"Not deploying offer {offer_id}: {reason}.") from None
        try:
            return await self.provider.create_instance(
                checked.offer, label=terms.label,
                env=agent_env(self.settings.coordinator_url, terms.agent_id, terms.key,
                              instance_id),
                disk_gb=checked.disk_gb,
                **({} if terms.bid is None else {"bid_per_hour": terms.bid}),
            )
        except CreateFailed as err:
            await self._created_anyway(instance_id, err)
            raise ProviderFailed(
                f"Creating an instance from offer {offer_id} failed ({err}), yet "
                f"{self.provider.name} made instance {err.instance_id}, which is being destroyed."
            ) from None
        except ProviderError as err:
            gone = isinstance(err, ProviderOfferGone)
            reason = (
                f"offer {offer_id} was taken before it could be rented" if gone
                else f"the provider refused to create the instance: {err}"
            )
            await self.store.write(
                lambda tx: self._abandon(tx, instance_id, terms.agent_id, reason))
            if gone:
                raise OfferGone(f"Offer {offer_id} is gone: it was rented meanwhile.") from None
            raise ProviderFailed(
                f"Creating an instance from offer {offer_id} failed: {err}"
            ) from None

    async def _created_anyway(self, instance_id: int, err: CreateFailed) -> None:
        """Record the instance a failed create left, due for destruction now, and destroy it."""
        now = self.clock()
        pid = err.instance_id
        reason = f"the create failed ({err}) but left {self.provider.name} instance {pid}"

        def record(tx: Tx) -> None:
            tx.instances.begin_terminating(instance_id, reason, kind="deploy_failed", now=now,
                                           destroy_due_at=now, data={"provider_instance_id": pid},
                                           provider_instance_id=pid)

        await self.store.write(record)
        log.warning("deploy: %s; destroying it", reason)
        if self._destroy is None:
            return
        try:
            await self._destroy(instance_id, reason, source="failed create")
        except ProviderError as exc:  # recorded by destroy; the monitor retries it
            log.warning("destroy of instance %s left by a failed create: %s", pid, exc)

    def _abandon(self, tx: Tx, instance_id: int, agent_id: str, reason: str) -> None:
        now = self.clock()
        tx.instances.update(
            instance_id, state=State.DESTROYED, state_since=now, destroyed_at=now,
            terminate_reason=reason, updated_at=now,
        )
        tx.agents.revoke(agent_id, now=now, reason=reason)
        tx.audit.add(now, "deploy_failed", reason, instance_id=instance_id, agent_id=agent_id)
