"""What an instance costs, as vast.ai bills it: rent, storage and bandwidth (docs/vast.md).

Pure: an offer (or the offer an instance was deployed from) in, dollars out.
vast.ai bills three things (its billing reference, docs/vast.md "Billing"):

- **rent** (``dph_total`` less its storage part) for every second the instance
  is running;
- **storage**, ``storage_cost`` in $/GB/month for the *allocated* disk, for every
  second the instance exists in any state but ``offline``;
- **bandwidth**, ``inet_down_cost`` and ``inet_up_cost`` in $/GB for every byte
  in or out, in every state; not in ``dph_total``.

An offer's ``dph_total`` already holds the storage of the ``allocated_storage``
it was searched with, so the rent is what is left once that storage is taken
out; a deploy with another disk size is priced with its own (``prices_of``).
Every figure the coordinator shows or decides on ($/proof, the minimum rate,
the plan's trial cost, the autopilot's ledger, ``/metrics``) comes from here,
with its parts beside the total. docs/operations.md ("What an instance costs")
says how the one-off setup is spread over a kept instance's life.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vast_manager.coordinator.offers import Offer

#: vast.ai's bandwidth prices are $/GB (OpenAPI ``inet_down_cost``); read as 10^9 bytes.
BYTES_PER_GB = 1e9
#: ``storage_cost`` is $/GB/month (vast-cli ``search offers`` help); a month of 30 days.
HOURS_PER_MONTH = 30 * 24.0
#: The disk the CLI prices offers with when no ``allocated_storage`` is given (GB).
DEFAULT_ALLOCATED_GB = 10.0
#: vast.ai statuses in which an instance's rent is billed ("active/connected").
RENT_STATUSES = frozenset({"running"})
#: The one status in which storage is not billed.
NO_STORAGE_STATUSES = frozenset({"offline"})


def _money(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) and value > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Cost:
    """Dollars by what vast.ai bills for (an amount, or a rate per hour or per proof)."""

    rent: float = 0.0
    storage: float = 0.0
    bandwidth: float = 0.0

    @property
    def total(self) -> float:
        return self.rent + self.storage + self.bandwidth

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.rent + other.rent, self.storage + other.storage,
                    self.bandwidth + other.bandwidth)

    def scaled(self, k: float) -> Cost:
        return Cost(self.rent * k, self.storage * k, self.bandwidth * k)

    def as_dict(self, digits: int = 6) -> dict[str, float]:
        """``rent``, ``storage``, ``bandwidth`` and ``total``, rounded (JSON views)."""
        return {"rent": round(self.rent, digits), "storage": round(self.storage, digits),
                "bandwidth": round(self.bandwidth, digits), "total": round(self.total, digits)}


@dataclass(frozen=True, slots=True)
class Prices:
    """One instance's prices: rent per hour, storage per GB-month of its disk, bandwidth
    per GB each way."""

    rent_per_hour: float
    storage_per_gb_month: float = 0.0
    disk_gb: float = 0.0
    inet_down_per_gb: float = 0.0
    inet_up_per_gb: float = 0.0

    @property
    def storage_per_hour(self) -> float:
        return self.storage_per_gb_month * self.disk_gb / HOURS_PER_MONTH

    def bandwidth_usd(self, down_bytes: float, up_bytes: float) -> float:
        """What moving these bytes costs."""
        return (max(0.0, down_bytes) * self.inet_down_per_gb
                + max(0.0, up_bytes) * self.inet_up_per_gb) / BYTES_PER_GB

    def per_hour(self, down_bytes_per_hour: float = 0.0, up_bytes_per_hour: float = 0.0,
                 status: str = "running") -> Cost:
        """An hour in ``status`` (vast.ai's ``actual_status``) moving these bytes."""
        return Cost(
            rent=self.rent_per_hour if status in RENT_STATUSES else 0.0,
            storage=0.0 if status in NO_STORAGE_STATUSES else self.storage_per_hour,
            bandwidth=self.bandwidth_usd(down_bytes_per_hour, up_bytes_per_hour),
        )

    @property
    def hourly_total(self) -> float:
        """Rent and storage per hour while running: what ``dph_total`` means at this disk."""
        return self.rent_per_hour + self.storage_per_hour


def prices_of(offer: Offer, disk_gb: float | None = None,
              bid_per_hour: float | None = None) -> Prices | None:
    """The prices of renting ``offer`` with a ``disk_gb`` disk (None: the disk the offer
    was priced with), interruptibly at ``bid_per_hour`` when given (the bid is the rent);
    None when the offer has no price.

    ``dph_total`` holds the storage of the offer's ``allocated_storage``
    (``storage_total_cost`` $/h when vast.ai gives it), so that part comes out
    of the rent and the storage of ``disk_gb`` is priced on its own.
    """
    dph = offer.dph_total
    if dph is None or not math.isfinite(dph) or dph <= 0:
        return None
    per_gb_month = _money(offer.storage_cost)
    priced_gb = _money(offer.allocated_storage) or DEFAULT_ALLOCATED_GB
    in_dph = offer.storage_total_cost
    if in_dph is None or not math.isfinite(in_dph) or in_dph < 0:
        in_dph = per_gb_month * priced_gb / HOURS_PER_MONTH
    rent = max(0.0, dph - in_dph)
    if bid_per_hour is not None and math.isfinite(bid_per_hour) and bid_per_hour > 0:
        rent = float(bid_per_hour)
    disk = priced_gb if disk_gb is None or disk_gb <= 0 else float(disk_gb)
    return Prices(
        rent_per_hour=rent,
        storage_per_gb_month=per_gb_month,
        disk_gb=disk,
        inet_down_per_gb=_money(offer.inet_down_cost),
        inet_up_per_gb=_money(offer.inet_up_cost),
    )


def accrued(prices: Prices, *, running_s: float, existing_s: float, offline_s: float = 0.0,
            down_bytes: float = 0.0, up_bytes: float = 0.0) -> Cost:
    """What an instance has been billed: rent for its running seconds, storage for the
    seconds it existed less those offline, and its bytes."""
    storage_s = max(0.0, existing_s - max(0.0, offline_s))
    return Cost(
        rent=prices.rent_per_hour * max(0.0, running_s) / 3600.0,
        storage=prices.storage_per_hour * storage_s / 3600.0,
        bandwidth=prices.bandwidth_usd(down_bytes, up_bytes),
    )


def setup_download_bytes(net_rx_bytes: float | None, setup_download_gb: float) -> float:
    """An instance's setup download: the bytes its agent reported receiving, else the
    setting's estimate (VM_SETUP_DOWNLOAD_GB)."""
    rx = float(net_rx_bytes or 0)
    return rx if rx > 0 else setup_download_gb * BYTES_PER_GB


def setup_bytes(params_bytes: float, image_bytes: float = 0.0) -> float:
    """Bytes a fresh instance downloads before it proves: its image and the parameters."""
    return max(0.0, params_bytes) + max(0.0, image_bytes)


def kept_per_hour(prices: Prices, *, setup_down_bytes: float, kept_hours: float,
                  down_bytes_per_hour: float = 0.0, up_bytes_per_hour: float = 0.0) -> Cost:
    """The hourly cost of a kept instance, with its one-off setup download spread over
    ``kept_hours`` (docs/operations.md, "What an instance costs")."""
    hours = max(kept_hours, 1.0)
    running = prices.per_hour(down_bytes_per_hour, up_bytes_per_hour)
    return running + Cost(bandwidth=prices.bandwidth_usd(setup_down_bytes, 0.0) / hours)


def resume_budget_s(prices: Prices, *, setup_down_bytes: float, setup_s: float,
                    cap_s: float) -> float:
    """How long a stopped (outbid) trial may wait, billing storage only, before waiting
    has cost what a fresh trial's setup would (its download, and rent for ``setup_s`` of
    boot, fetch and warm-up); at most ``cap_s``."""
    fresh = prices.bandwidth_usd(setup_down_bytes, 0.0) + prices.rent_per_hour * setup_s / 3600
    if prices.storage_per_hour <= 0:
        return cap_s
    return min(cap_s, fresh / prices.storage_per_hour * 3600.0)


def per_proof(hourly: Cost, rate_per_hour: float | None) -> Cost | None:
    """An hourly cost as dollars per proof at ``rate_per_hour``; None without a rate."""
    if rate_per_hour is None or not math.isfinite(rate_per_hour) or rate_per_hour <= 0:
        return None
    return hourly.scaled(1.0 / rate_per_hour)


def offer_figure(offer: Offer, *, setup_down_bytes: float, kept_hours: float,
                 disk_gb: float | None = None) -> Cost | None:
    """The full hourly figure of an offer (rent, storage, the setup's bandwidth spread over a
    kept life): what ``offers`` ranks by and the minimum rate divides."""
    prices = prices_of(offer, disk_gb)
    if prices is None:
        return None
    return kept_per_hour(prices, setup_down_bytes=setup_down_bytes, kept_hours=kept_hours)
