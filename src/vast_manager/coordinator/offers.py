"""An offer as the coordinator reads it: vast.ai's fields, typed, parsed once.

Providers hand out ``Offer``; the pure core (decisions/, discovery/) reads its
attributes and never a JSON key. vast.ai's offer JSON is lenient: numbers may
come as strings, ``null`` or not at all, and booleans are not numbers (a
``true`` must never count as 1). ``parse_offer`` applies those rules once, at
the provider boundary (and wherever an offer arrives as JSON: the operator's
posted offers, a measurement's stored offer, a bench's market file), and names
the field it refuses.

Each attribute keeps vast.ai's name; what it means and its unit are below, with
docs/vast.md for the sources (its "Offers" and "Billing and the account"
sections). ``raw`` is the offer's JSON exactly as it came (after the provider's
own additions, ``allocated_storage`` and ``reliability``): it is what goes back
out in the operator's JSON views and into an instance's stored ``offer_json``,
so their shape does not depend on which fields are typed here.

Pure: no I/O, no provider import; the core may import it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import orjson

log = logging.getLogger(__name__)


class OfferError(ValueError):
    """An offer field that cannot be read: ``field`` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """One vast.ai offer (a rentable "ask"); None where vast.ai omits or nulls a field."""

    # --- identity ---------------------------------------------------------------
    #: ``id``: the ask's id, what a create rents (``PUT /api/v0/asks/{id}/``).
    id: int | None = None
    #: ``machine_id``: the physical host, as text (ids compare as text everywhere; a
    #: bring-your-own agent's host is named, not numbered).
    machine_id: str | None = None
    #: ``host_id``: the hosting account.
    host_id: int | None = None
    # --- GPUs ---------------------------------------------------------------------
    #: ``gpu_name``: the model in vast.ai's spelling ("RTX 4090").
    gpu_name: str | None = None
    #: ``num_gpus``: GPUs the instance gets (a whole number).
    num_gpus: int | None = None
    #: ``gpu_ram``: memory per GPU, MB.
    gpu_ram: float | None = None
    #: ``gpu_mem_bw``: measured GPU memory bandwidth, GB/s per GPU.
    gpu_mem_bw: float | None = None
    #: ``dlperf``: vast.ai's deep-learning score of the whole offer.
    dlperf: float | None = None
    #: ``total_flops``: measured single-precision TFLOPS of the offer's GPUs.
    total_flops: float | None = None
    #: ``compute_cap``: CUDA compute capability x 100 (890 for 8.9).
    compute_cap: float | None = None
    #: ``gpu_frac``: "ratio of GPUs in the offer to GPUs in the system".
    gpu_frac: float | None = None
    # --- the host, and the instance's share of it (docs/vast.md "Offers") -----------
    #: ``cpu_name``: the host's CPU model.
    cpu_name: str | None = None
    #: ``cpu_cores``: the whole host's vCPUs.
    cpu_cores: float | None = None
    #: ``cpu_cores_effective``: the vCPUs the instance gets.
    cpu_cores_effective: float | None = None
    #: ``cpu_ghz``: the CPU's clock, GHz.
    cpu_ghz: float | None = None
    #: ``cpu_ram``: the whole host's RAM, MB (the CLI's GB are ``cpu_ram / 1000``).
    cpu_ram: float | None = None
    #: ``pci_gen``: the PCIe generation of the GPUs' link.
    pci_gen: float | None = None
    #: ``gpu_lanes``: PCIe lanes per GPU.
    gpu_lanes: float | None = None
    #: ``pcie_bw``: measured host-to-GPU bandwidth, GB/s.
    pcie_bw: float | None = None
    #: ``disk_bw``: measured disk bandwidth, MB/s.
    disk_bw: float | None = None
    #: ``disk_space``: disk available to the instance, GB.
    disk_space: float | None = None
    #: ``inet_down`` / ``inet_up``: measured bandwidth, Mb/s.
    inet_down: float | None = None
    inet_up: float | None = None
    #: ``reliability`` (offers) or ``reliability2`` (instances): 0..1.
    reliability: float | None = None
    #: ``duration``: how long the host lists the machine for, seconds.
    duration: float | None = None
    #: ``geolocation``: "Texas, US".
    geolocation: str | None = None
    # --- prices (docs/vast.md "Billing and the account") -----------------------------
    #: ``dph_total``: $/h while running, rent and the storage of ``allocated_storage``.
    dph_total: float | None = None
    #: ``dph_base``: the rent alone, $/h.
    dph_base: float | None = None
    #: ``min_bid``: the lowest interruptible bid, $/h.
    min_bid: float | None = None
    #: ``storage_cost``: $/GB/month of allocated disk.
    storage_cost: float | None = None
    #: ``storage_total_cost``: the storage inside ``dph_total``, $/h.
    storage_total_cost: float | None = None
    #: ``allocated_storage``: the disk ``dph_total`` was priced with, GB (the search's).
    allocated_storage: float | None = None
    #: ``inet_down_cost`` / ``inet_up_cost``: bandwidth, $/GB.
    inet_down_cost: float | None = None
    inet_up_cost: float | None = None
    # --- availability ---------------------------------------------------------------
    #: ``rentable``, ``rented``, ``verified``: vast.ai's booleans (None when absent).
    rentable: bool | None = None
    rented: bool | None = None
    verified: bool | None = None
    #: The offer's JSON as it came: what goes back out (views, the stored offer).
    raw: dict[str, object] = msgspec.field(default_factory=dict)


#: The typed number fields: vast.ai's name -> whether it must be a whole number.
_NUMBERS: dict[str, bool] = {
    "host_id": True, "num_gpus": True,
    **dict.fromkeys((
        "gpu_ram", "gpu_mem_bw", "total_flops", "dlperf", "compute_cap", "gpu_frac", "cpu_cores",
        "cpu_cores_effective", "cpu_ghz", "cpu_ram", "pci_gen", "gpu_lanes", "pcie_bw",
        "disk_bw", "disk_space", "inet_down", "inet_up", "reliability", "dph_total",
        "dph_base", "min_bid", "storage_cost", "storage_total_cost", "allocated_storage",
        "inet_down_cost", "inet_up_cost", "duration"), False),
}
_TEXTS = ("gpu_name", "cpu_name", "geolocation")
_BOOLS = ("rentable", "rented", "verified")


def number(raw: Mapping[str, object], name: str) -> float | None:
    """``raw[name]`` as a finite number; None when absent, null or empty; OfferError when
    it is anything else (a bool is never a number: vast.ai's ``true`` is not 1)."""
    value = raw.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise OfferError(name, f"{name} must be a number, not {value!r}.")
    try:
        out = float(value)
    except ValueError:
        raise OfferError(name, f"{name} must be a number, not {value!r}.") from None
    if not math.isfinite(out):
        raise OfferError(name, f"{name} must be a finite number, not {value!r}.")
    return out


def positive(value: float | None) -> float | None:
    """A parsed figure above zero, else None (prices, rates: zero means not given)."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def as_float(value: object) -> float | None:
    """Lenient: a number of vast.ai's JSON (an instance's, the account's) or None when it is
    absent, null, a bool or not a number; what ``parse_offer`` refuses, this ignores."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def as_int(value: object) -> int | None:
    """Lenient, as ``as_float``: a whole number (an id) or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except (ValueError, OverflowError):
        return None


def _whole(raw: Mapping[str, object], name: str) -> int | None:
    value = number(raw, name)
    if value is None:
        return None
    if not value.is_integer():
        raise OfferError(name, f"{name} must be a whole number, not {raw.get(name)!r}.")
    return int(value)


def _text(raw: Mapping[str, object], name: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise OfferError(name, f"{name} must be text, not {value!r}.")
    return value


def _flag(raw: Mapping[str, object], name: str) -> bool | None:
    value = raw.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise OfferError(name, f"{name} must be true or false, not {value!r}.")


def _machine(raw: Mapping[str, object]) -> str | None:
    value = raw.get("machine_id")
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise OfferError("machine_id", f"machine_id must be an id, not {value!r}.")
    return str(value)


def parse_offer(raw: Mapping[str, object] | Offer) -> Offer:
    """One offer from vast.ai's JSON (or JSON in its shape); OfferError names the field
    that is malformed. ``reliability`` is read from ``reliability2`` when only that is
    given (instances carry the latter). An ``Offer`` is already parsed: it comes back."""
    if isinstance(raw, Offer):
        return raw
    if not isinstance(raw, Mapping):
        raise OfferError("offer", "the offer must be a JSON object of vast.ai offer fields.")
    fields: dict[str, Any] = {name: _whole(raw, name) if whole else number(raw, name)
                              for name, whole in _NUMBERS.items()}
    if fields["reliability"] is None:
        fields["reliability"] = number(raw, "reliability2")
    fields.update({name: _text(raw, name) for name in _TEXTS})
    fields.update({name: _flag(raw, name) for name in _BOOLS})
    return Offer(id=_whole(raw, "id"), machine_id=_machine(raw), raw=dict(raw), **fields)


def parse_offers(raws: Iterable[Mapping[str, object]], *, source: str,
                 require_id: bool = True) -> list[Offer]:
    """The well-formed offers of ``raws``; each malformed one is skipped with a logged
    reason naming ``source``, the offer and the field (one bad listing hides nothing else)."""
    out: list[Offer] = []
    for raw in raws:
        try:
            offer = parse_offer(raw)
            if require_id and offer.id is None:
                raise OfferError("id", "the offer has no id, so it cannot be rented.")
        except OfferError as exc:
            ident = raw.get("id") if isinstance(raw, Mapping) else None
            log.warning("%s: offer %s skipped: %s", source, ident, exc.message)
            continue
        out.append(offer)
    return out


def stored_offer(offer_json: object) -> Offer | None:
    """The offer an instance was deployed from, from its stored ``offer_json``; None when
    there is none or it does not read as an offer (a malformed one is logged)."""
    if not isinstance(offer_json, str | bytes) or not offer_json:
        return None
    try:
        raw = orjson.loads(offer_json)
    except orjson.JSONDecodeError:
        log.warning("a stored offer is not JSON: ignored")
        return None
    if not isinstance(raw, dict):
        return None
    try:
        return parse_offer(raw)
    except OfferError as exc:
        log.warning("stored offer %s ignored: %s", raw.get("id"), exc.message)
        return None
