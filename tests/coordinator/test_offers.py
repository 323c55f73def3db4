"""Offers parsed once (coordinator/offers.py): vast.ai's lenient JSON in, typed fields out,
the malformed field named; the JSON that goes back out is the JSON that came in."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest

from vast_manager.coordinator.offers import (
    Offer,
    OfferError,
    as_float,
    as_int,
    parse_offer,
    parse_offers,
    stored_offer,
)
from vast_manager.coordinator.providers.local.catalog import catalog_offers


def test_every_catalog_offer_parses_and_keeps_its_json() -> None:
    for raw in catalog_offers():
        offer = parse_offer(raw)
        assert offer.raw == raw and offer.raw is not raw  # a copy: the caller's is its own
        assert offer.id == raw["id"] and offer.machine_id == str(raw["machine_id"])
        assert offer.num_gpus == raw["num_gpus"] and offer.dph_total == raw["dph_total"]
        assert offer.rentable is True and offer.gpu_name == raw["gpu_name"]


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ({"dph_total": "0.42"}, "dph_total", 0.42),  # vast.ai sends some numbers as text
        ({"dph_total": None}, "dph_total", None),
        ({"dph_total": ""}, "dph_total", None),
        ({"num_gpus": "2"}, "num_gpus", 2),
        ({"num_gpus": 2.0}, "num_gpus", 2),
        ({"machine_id": 41001.0}, "machine_id", "41001"),
        ({"machine_id": "rig-7"}, "machine_id", "rig-7"),
        ({"reliability2": 0.97}, "reliability", 0.97),  # instances carry reliability2
        ({"reliability": 0.9, "reliability2": 0.5}, "reliability", 0.9),
        ({"rented": False}, "rented", False),
    ],
)
def test_lenient_where_vast_ai_is(raw: dict[str, Any], field: str, value: object) -> None:
    assert getattr(parse_offer(raw), field) == value


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"num_gpus": True}, "num_gpus"),  # a bool is never a number
        ({"cpu_cores": False}, "cpu_cores"),
        ({"dph_total": "cheap"}, "dph_total"),
        ({"cpu_ram": float("nan")}, "cpu_ram"),
        ({"cpu_ram": float("inf")}, "cpu_ram"),
        ({"num_gpus": 1.5}, "num_gpus"),
        ({"dph_total": [0.4]}, "dph_total"),
        ({"gpu_name": 4090}, "gpu_name"),
        ({"rentable": "yes"}, "rentable"),
        ({"machine_id": True}, "machine_id"),
        ({"id": "nine"}, "id"),
    ],
)
def test_a_malformed_field_is_named(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(OfferError) as err:
        parse_offer(raw)
    assert err.value.field == field and field in err.value.message


def test_an_offer_is_frozen_and_parsing_one_gives_it_back() -> None:
    offer = parse_offer(catalog_offers()[0])
    assert parse_offer(offer) is offer
    with pytest.raises(AttributeError):
        offer.dph_total = 0.0  # type: ignore[misc]
    assert msgspec.structs.replace(offer, machine_id=None).machine_id is None


def test_a_listing_keeps_the_good_offers_and_logs_each_bad_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = catalog_offers()[:2]
    listing = [good[0], {**good[1], "cpu_ram": "lots"}, {"gpu_name": "RTX 4090"}, good[1]]
    with caplog.at_level(logging.WARNING, logger="vast_manager.coordinator.offers"):
        offers = parse_offers(listing, source="test listing")
    assert [o.id for o in offers] == [good[0]["id"], good[1]["id"]]
    assert f"test listing: offer {good[1]['id']} skipped: cpu_ram must be a number" in caplog.text
    assert "offer None skipped: the offer has no id, so it cannot be rented." in caplog.text
    # Without an id (an operator's posted offer, a measurement's): kept.
    assert len(parse_offers([{"gpu_name": "RTX 4090"}], source="x", require_id=False)) == 1


def test_a_stored_offer_reads_back_or_is_none() -> None:
    raw = catalog_offers()[0]
    assert stored_offer(msgspec.json.encode(raw).decode()) == parse_offer(raw)
    for bad in (None, "", "not json", "[1, 2]", '{"num_gpus": true}'):
        assert stored_offer(bad) is None


def test_the_lenient_numbers_of_instances_and_the_account() -> None:
    assert (as_float("1.5"), as_float(True), as_float(None), as_float("x")) == (1.5, None,
                                                                                None, None)
    assert (as_int(7), as_int("7"), as_int(False), as_int(float("inf"))) == (7, 7, None, None)


def test_every_field_is_documented_with_its_vast_ai_name() -> None:
    """One place says what each field is: a ``#:`` comment naming it, in the module."""
    import inspect

    from vast_manager.coordinator import offers as module

    text = inspect.getsource(module.Offer)
    for name in Offer.__struct_fields__:
        if name != "raw":
            assert f"``{name}``" in text, name
