"""One measured rate with the hardware it ran on: what the rate model learns from.

The JSON shape is the one ``hosts import`` and ``hosts export`` carry, one a
line: ``{"machine_id", "offer": {vast.ai offer fields}, "rate_per_hour",
"measured_at", "source"}``. ``parse_measurement`` checks a decoded object and
raises ``MeasurementError`` naming the first field that is wrong (dotted, e.g.
``offer.num_gpus``); ``parse_lines`` reads a whole file and says "line 7, field
offer.num_gpus".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from vast_manager.coordinator.discovery.features import (
    FeatureError,
    OfferFeatures,
    offer_features,
    offer_from_host_info,
)

SOURCES = ("fleet", "imported")
#: The offer fields an instance row keeps in columns of its own (before the whole offer
#: was kept as deployed, they were all there was).
INSTANCE_OFFER_COLUMNS = ("machine_id", "gpu_name", "num_gpus", "dph_total", "geolocation",
                          "cpu_name", "cpu_cores", "cpu_cores_effective", "cpu_ram", "pcie_bw")
#: Offer keys that are no vast.ai field (the local catalog's simulation knobs): never kept.
NOT_OFFER_FIELDS = frozenset({"sim", "note"})


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


def instance_offer(
    deployed: Mapping[str, Any] | None,
    host: Mapping[str, Any] | None,
    columns: Mapping[str, Any],
) -> dict[str, Any]:
    """The hardware an instance ran on, in vast.ai's offer shape: the offer it was
    deployed from, else (a bring-your-own agent) its hello's host info, else what the
    instance row kept of its offer (``INSTANCE_OFFER_COLUMNS``); ``machine_id`` is the
    instance's where the offer has none."""
    machine = columns.get("machine_id")
    if deployed:
        offer = {k: v for k, v in deployed.items() if k not in NOT_OFFER_FIELDS}
    else:
        offer = {}
        if host:
            try:
                offer = offer_from_host_info(host, machine_id=str(machine or ""))
            except (FeatureError, AttributeError, TypeError, ValueError):
                offer = {}  # mixed GPU models, no GPU listed: the columns below
        if not offer:
            offer = {k: columns.get(k) for k in INSTANCE_OFFER_COLUMNS
                     if columns.get(k) is not None}
    if machine is not None and offer.get("machine_id") in (None, ""):
        offer["machine_id"] = machine
    return offer


def _finite(obj: Mapping[str, Any], field: str) -> float:
    value = obj.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MeasurementError(field, f"{field} must be a number, not {value!r}.")
    return float(value)


class LineError(MeasurementError):
    """A line of a measurements file that cannot be imported: ``line`` is its number."""

    def __init__(self, line: int, field: str, message: str) -> None:
        where = f"line {line}" + (f", field {field}" if field else "")
        super().__init__(field, f"{where}: {message}")
        self.line = line
        self.reason = message


#: Largest ``hosts import`` file: about 10,000 measurements of vast.ai offers. A larger
#: history is imported in parts, each whole or not at all.
MAX_IMPORT_BYTES = 16 * 1024 * 1024
NDJSON = "application/x-ndjson"
#: Clock slack allowed to a measurement's time (it may come from another machine).
FUTURE_SLACK_S = 300.0
MAX_MACHINE_ID_CHARS = 200


def parse_lines(
    raw: bytes,
    *,
    now: float,
    max_rate_per_gpu_per_hour: float,
    is_unsafe_text: Callable[[str], bool],
) -> list[Measurement]:
    """Every measurement of a JSON Lines file (``hosts import``), marked imported.

    Blank lines are skipped. The first line that is not a measurement raises
    ``LineError`` naming its number (from 1) and its field: a file is taken whole or
    not at all. A rate above what the fleet's own plausibility check allows
    (``max_rate_per_gpu_per_hour`` x GPUs), a time in the future, or a machine id that
    is not plain text is refused like a malformed field.
    """
    out: list[Measurement] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LineError(number, "", f"not valid JSON ({exc})") from None
        try:
            m = parse_measurement(obj, default_source="imported")
        except MeasurementError as exc:
            raise LineError(number, exc.field, exc.message) from None
        if len(m.machine_id) > MAX_MACHINE_ID_CHARS or is_unsafe_text(m.machine_id):
            raise LineError(number, "machine_id", f"machine_id must be plain text of at most "
                            f"{MAX_MACHINE_ID_CHARS} characters.")
        gpus = int(offer_features(m.offer).num_gpus)
        ceiling = max_rate_per_gpu_per_hour * gpus
        if m.rate_per_hour > ceiling:
            raise LineError(number, "rate_per_hour", f"{m.rate_per_hour:g}/h is more than "
                            f"{gpus} GPU(s) can make ({ceiling:g}/h, the fleet's own "
                            "plausibility limit)")
        if m.measured_at > now + FUTURE_SLACK_S:
            raise LineError(number, "measured_at", "measured_at is in the future.")
        out.append(Measurement(m.machine_id, m.offer, m.rate_per_hour, m.measured_at,
                               "imported"))
    return out


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
