"""One measured rate with the hardware it ran on: what the rate model learns from.

The JSON shape is the one ``hosts import`` and ``hosts export`` carry, one a
line: ``{"machine_id", "offer": {vast.ai offer fields}, "rate_per_hour",
"measured_at", "source"}``. ``parse_measurement`` checks a decoded object and
raises ``MeasurementError`` naming the first field that is wrong (dotted, e.g.
``offer.num_gpus``), so an importer can report "line 7, field offer.num_gpus".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vast_manager.coordinator.discovery.features import FeatureError, OfferFeatures, offer_features

SOURCES = ("fleet", "imported")


class MeasurementError(ValueError):
    """A measurement that cannot be used; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Measurement:
    """A plausible, uncontended benchmark rate of one machine, with its offer as deployed."""

    machine_id: str
    offer: Mapping[str, Any]
    rate_per_hour: float
    measured_at: float  # unix seconds
    source: str = "fleet"

    def features(self) -> OfferFeatures:
        return offer_features({**self.offer, "machine_id": self.machine_id})

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine_id": self.machine_id,
            "offer": dict(self.offer),
            "rate_per_hour": self.rate_per_hour,
            "measured_at": self.measured_at,
            "source": self.source,
        }


def _finite(obj: Mapping[str, Any], field: str) -> float:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MeasurementError(field, f"{field} must be a number, not {value!r}.")
    return float(value)


def parse_measurement(obj: Any, *, default_source: str = "imported") -> Measurement:
    """A Measurement from a decoded JSON object; MeasurementError names the bad field."""
    if not isinstance(obj, Mapping):
        raise MeasurementError("", "a measurement must be a JSON object.")
    machine = obj.get("machine_id")
    if isinstance(machine, bool) or not isinstance(machine, int | str) or str(machine) == "":
        raise MeasurementError("machine_id", "machine_id must be a machine's id or label.")
    offer = obj.get("offer")
    if not isinstance(offer, Mapping):
        raise MeasurementError("offer", "offer must be an object of vast.ai offer fields.")
    try:
        offer_features(offer)
    except FeatureError as exc:
        raise MeasurementError(f"offer.{exc.field}", exc.message) from None
    rate = _finite(obj, "rate_per_hour")
    if rate <= 0:
        raise MeasurementError("rate_per_hour", f"rate_per_hour must be above 0, not {rate:g}.")
    measured_at = _finite(obj, "measured_at")
    if measured_at < 0:
        raise MeasurementError("measured_at", "measured_at must be unix seconds, not negative.")
    source = obj.get("source", default_source)
    if source not in SOURCES:
        raise MeasurementError("source", f"source must be one of {', '.join(SOURCES)}, "
                               f"not {source!r}.")
    return Measurement(str(machine), dict(offer), rate, measured_at, str(source))
