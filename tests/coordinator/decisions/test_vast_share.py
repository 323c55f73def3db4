"""decisions.share: what an offer's instance gets of its host, with missing, zero and odd
fields answered honestly (unknown, never guessed). Fields and units as vast.ai lists them
(docs/vast.md): cpu_ram in MB for the whole host, cpu_cores the host's, cpu_cores_effective
the instance's, gpu_frac the offer's GPUs over the host's."""

from __future__ import annotations

from typing import Any

import pytest

from vast_manager.coordinator.decisions.share import instance_share, ram_class, shortfall
from vast_manager.coordinator.offers import OfferError, parse_offer


@pytest.mark.parametrize(
    ("offer", "ram_gb", "cores", "formula"),
    [
        # 1 of 8 GPUs of a 512 GB, 256-thread host.
        ({"cpu_ram": 515000, "cpu_cores": 256, "cpu_cores_effective": 32.0},
         64.4, 32.0, "515 GB x 32/256 cores = 64.4 GB"),
        # A whole 2-GPU 256 GB host.
        ({"cpu_ram": 257000, "cpu_cores": 64, "cpu_cores_effective": 64},
         257.0, 64.0, "257 GB x 64/64 cores = 257.0 GB"),
        # Fractional effective cores, as vast.ai lists them.
        ({"cpu_ram": 257000, "cpu_cores": 48, "cpu_cores_effective": 10.7},
         57.3, 10.7, "257 GB x 10.7/48 cores = 57.3 GB"),
        # Numbers as strings.
        ({"cpu_ram": "515000", "cpu_cores": "96", "cpu_cores_effective": "24"},
         128.8, 24.0, "515 GB x 24/96 cores = 128.8 GB"),
        # More effective cores than the host has: never more than the whole host.
        ({"cpu_ram": 128000, "cpu_cores": 16, "cpu_cores_effective": 32},
         128.0, 16.0, "128 GB x 32/16 cores = 128.0 GB"),
        # No cores: gpu_frac.
        ({"cpu_ram": 515000, "cpu_cores": None, "cpu_cores_effective": None, "gpu_frac": 0.25},
         128.8, None, "515 GB x gpu_frac 0.25 = 128.8 GB"),
        ({"cpu_ram": 515000, "cpu_cores": 96, "gpu_frac": 0.25},
         128.8, 24.0, "515 GB x gpu_frac 0.25 = 128.8 GB"),
    ],
)
def test_share(offer: dict[str, Any], ram_gb: float, cores: float | None, formula: str) -> None:
    share = instance_share(parse_offer(offer))
    assert (share.ram_gb, share.cpu_cores, share.formula) == (ram_gb, cores, formula)


@pytest.mark.parametrize(
    ("offer", "field"),
    [
        ({"cpu_ram": 515000, "cpu_cores": True, "cpu_cores_effective": 12}, "cpu_cores"),
        ({"cpu_ram": "lots", "cpu_cores": 96, "cpu_cores_effective": 12}, "cpu_ram"),
        ({"cpu_ram": float("nan"), "cpu_cores": 96, "cpu_cores_effective": 12}, "cpu_ram"),
    ],
)
def test_a_malformed_field_is_refused_before_any_share(offer: dict[str, Any], field: str) -> None:
    # A bool is never a number (vast.ai's true is not 1); text and NaN are no figures.
    with pytest.raises(OfferError) as err:
        parse_offer(offer)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("offer", "says"),
    [
        ({"cpu_ram": 515000, "cpu_cores": 0, "cpu_cores_effective": 32}, "no cpu_cores"),
        ({"cpu_ram": 515000, "cpu_cores": 96}, "no cpu_cores_effective"),
        ({"cpu_ram": 515000, "cpu_cores": 96, "cpu_cores_effective": 0}, "cpu_cores_effective"),
        ({"cpu_ram": 0, "cpu_cores": 96, "cpu_cores_effective": 12}, "no cpu_ram"),
        ({"cpu_cores": 96, "cpu_cores_effective": 12}, "no cpu_ram"),
    ],
)
def test_missing_or_zero_fields_make_the_share_unknown(offer: dict[str, Any], says: str) -> None:
    share = instance_share(parse_offer(offer))
    assert share.ram_gb is None
    assert share.formula.startswith("unknown (") and says in share.formula
    assert shortfall(share, 128) is not None and "cannot be promised" in str(shortfall(share, 128))
    assert shortfall(share, 0) is None


def test_shortfall_against_the_minimum() -> None:
    share = instance_share(parse_offer({"cpu_ram": 515000, "cpu_cores": 256,
                                        "cpu_cores_effective": 32}))
    assert shortfall(share, 128) == (
        "its instance would get about 64 GB of RAM (515 GB x 32/256 cores = 64.4 GB), below "
        "the 128 GB cuzk needs")
    assert shortfall(share, 64) is None
    host_128 = instance_share(parse_offer({"cpu_ram": 128000, "cpu_cores": 16,
                                           "cpu_cores_effective": 16}))
    assert shortfall(host_128, 128) is None  # a whole 128 GB host is enough


def test_ram_classes() -> None:
    assert [ram_class(x) for x in (None, 64.0, 239.9, 240.0, 359.0, 360.0, 2000.0)] == [
        None, 0, 0, 1, 1, 2, 2]
