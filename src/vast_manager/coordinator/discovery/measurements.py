"""One measured rate with the hardware it ran on: what the rate model learns from.

The JSON shape is the one ``hosts import`` and ``hosts export`` carry, one a
line: ``{"machine_id", "offer": {vast.ai offer fields}, "rate_per_hour",
"measured_at", "source"}``, and optionally ``"bottleneck"``: the resource seen binding
while the rate was measured (one of ``RESOURCES``). ``parse_measurement`` checks a
decoded object and raises ``MeasurementError`` naming the first field that is wrong (dotted, e.g.
``offer.num_gpus``); ``parse_lines`` reads a whole file and says "line 7, field
offer.num_gpus".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import orjson

from vast_manager.coordinator.decisions.belief import ceiling_per_gpu as belief_ceiling
from vast_manager.coordinator.discovery.features import (
    FeatureError,
    OfferFeatures,
    offer_features,
    offer_from_host_info,
)
from vast_manager.coordinator.offers import Offer, parse_offer
from vast_manager.coordinator.rows import InstanceRow

SOURCES = ("fleet", "imported")
#: The resources a rate may be bound by, as a prediction names them and as a measurement
#: may say which one was seen binding (``Measurement.bottleneck``).
RESOURCES = ("gpu", "cpu", "pcie", "memory")
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


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """A plausible, uncontended benchmark rate of one machine, with its offer as deployed."""

    machine_id: str
    offer: Offer
    rate_per_hour: float
    measured_at: float  # unix seconds
    source: str = "fleet"
    # The resource seen binding while it was measured (``RESOURCES``; None: not seen).
    bottleneck: str | None = None

    def features(self) -> OfferFeatures:
        return offer_features(msgspec.structs.replace(self.offer, machine_id=self.machine_id))

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "machine_id": self.machine_id,
            "offer": dict(self.offer.raw),
            "rate_per_hour": self.rate_per_hour,
            "measured_at": self.measured_at,
            "source": self.source,
        }
        if self.bottleneck is not None:
            out["bottleneck"] = self.bottleneck
        return out


def instance_offer(
    deployed: Mapping[str, object] | None,
    host: Mapping[str, Any] | None,
    columns: InstanceRow,
) -> dict[str, object]:
    """The hardware an instance ran on, as vast.ai's offer JSON (what a measurement row
    keeps; ``parse_offer`` reads it): the offer it was
    deployed from, else (a bring-your-own agent) its hello's host info, else what the
    instance row kept of its offer (``INSTANCE_OFFER_COLUMNS``); ``machine_id`` is the
    instance's where the offer has none."""
    machine = columns.get("machine_id")
    offer: dict[str, object]
    if deployed:
        offer = {k: v for k, v in deployed.items() if k not in NOT_OFFER_FIELDS}
    else:
        offer = {}
        if host:
            try:
                offer = dict(offer_from_host_info(host, machine_id=str(machine or "")).raw)
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
#: The oldest measurement an import takes: two years (hardware, drivers and cuzk move on;
#: a rate older than that says little of a host today).
MAX_AGE_S = 2 * 365 * 86400.0
#: The most GPUs a measured machine may have: vast.ai buckets machines at 1, 2, 4 and 8
#: GPUs (vast-cli ``vastai/api/metrics.py``, docs/reliability.md), twice the largest.
MAX_GPUS = 16
#: A line of a measurements file: an offer of vast.ai's is about 3 KB.
MAX_LINE_BYTES = 64 * 1024
#: Any string in a line (an offer field, the machine id).
MAX_FIELD_CHARS = 1024
#: Nesting of a line's objects and lists (the line's object, its offer, a list in it).
MAX_DEPTH = 4
#: An imported rate this far from the fleet's own median rate of the same machine and GPU
#: count (either way) disagrees with it: the model then leaves it out (``weigh_sources``).
DISAGREEMENT_FACTOR = 1.5


def _shape_error(obj: Any) -> tuple[str, str] | None:
    """(field, message) for the first string over ``MAX_FIELD_CHARS`` or nesting deeper
    than ``MAX_DEPTH`` in a decoded line, else None (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_FIELD_CHARS:
                return path, f"a string longer than {MAX_FIELD_CHARS} characters"
            continue
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return path, f"nesting deeper than {MAX_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and len(key) > MAX_FIELD_CHARS:
                    return path, f"a key longer than {MAX_FIELD_CHARS} characters"
                stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))
    return None


def weigh_sources(measurements: list[Measurement]) -> list[Measurement]:
    """The fleet's own measurements weigh more than imported ones: an imported rate of a
    machine (and GPU count) the fleet measured itself is left out where it disagrees with
    the fleet's median by more than ``DISAGREEMENT_FACTOR``; where they agree, or the
    fleet never measured the machine, it counts (docs/reliability.md, "Imports")."""
    fleet: dict[tuple[str, int], list[float]] = {}
    for m in measurements:
        if m.source == "fleet":
            fleet.setdefault((m.machine_id, _gpus_of(m)), []).append(m.rate_per_hour)
    out = []
    for m in measurements:
        own = fleet.get((m.machine_id, _gpus_of(m))) if m.source == "imported" else None
        if own:
            median = sorted(own)[len(own) // 2]
            if not median / DISAGREEMENT_FACTOR <= m.rate_per_hour <= median * DISAGREEMENT_FACTOR:
                continue
        out.append(m)
    return out


def _gpus_of(m: Measurement) -> int:
    return m.offer.num_gpus if m.offer.num_gpus is not None else 1


def parse_lines(
    raw: bytes,
    *,
    now: float,
    max_rate_per_gpu_per_hour: float | None,
    is_unsafe_text: Callable[[str], bool],
    ceiling_per_gpu: Callable[[str | None, float | None], float] | None = None,
) -> list[Measurement]:
    """Every measurement of a JSON Lines file (``hosts import``), marked imported.

    Blank lines are skipped. The first line that is not a measurement raises
    ``LineError`` naming its number (from 1) and its field: a file is taken whole or
    not at all. A rate above what the fleet's own plausibility check allows (the GPU
    model's ``ceiling_per_gpu``, by default ``coordinator/decisions/belief.py``'s, x
    GPUs), more GPUs
    than ``MAX_GPUS``, a time outside the last ``MAX_AGE_S`` (or in the future), a line
    over ``MAX_LINE_BYTES``, a string over ``MAX_FIELD_CHARS``, nesting over
    ``MAX_DEPTH``, or a machine id that is not plain text is refused like a malformed
    field.
    """
    out: list[Measurement] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise LineError(number, "", f"the line is longer than {MAX_LINE_BYTES} bytes")
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise LineError(number, "", f"not valid JSON ({exc})") from None
        shape = _shape_error(obj)
        if shape is not None:
            raise LineError(number, shape[0], f"{shape[1]} is more than a measurement holds")
        try:
            m = parse_measurement(obj, default_source="imported")
        except MeasurementError as exc:
            raise LineError(number, exc.field, exc.message) from None
        if len(m.machine_id) > MAX_MACHINE_ID_CHARS or is_unsafe_text(m.machine_id):
            raise LineError(number, "machine_id", f"machine_id must be plain text of at most "
                            f"{MAX_MACHINE_ID_CHARS} characters.")
        features = offer_features(m.offer)
        gpus = int(features.num_gpus)
        if gpus > MAX_GPUS:
            raise LineError(number, "offer.num_gpus", f"num_gpus {gpus} is more than the "
                            f"{MAX_GPUS} GPUs of any machine vast.ai lists.")
        per_gpu = (ceiling_per_gpu or belief_ceiling)(features.gpu_name,
                                                      max_rate_per_gpu_per_hour)
        ceiling = per_gpu * gpus
        if m.rate_per_hour > ceiling:
            raise LineError(number, "rate_per_hour", f"{m.rate_per_hour:g}/h is more than "
                            f"{gpus} GPU(s) can make ({ceiling:g}/h, the fleet's own "
                            "plausibility limit)")
        if m.measured_at > now + FUTURE_SLACK_S:
            raise LineError(number, "measured_at", "measured_at is in the future.")
        if m.measured_at < now - MAX_AGE_S:
            raise LineError(number, "measured_at", f"measured_at is more than "
                            f"{MAX_AGE_S / 86400:.0f} days ago.")
        out.append(dataclasses.replace(m, source="imported"))
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
        parsed = parse_offer(offer)
        offer_features(parsed)
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
    bottleneck = obj.get("bottleneck")
    if bottleneck is not None and bottleneck not in RESOURCES:
        raise MeasurementError("bottleneck", f"bottleneck must be one of "
                               f"{', '.join(RESOURCES)} or null, not {bottleneck!r}.")
    return Measurement(str(machine), parsed, rate, measured_at, str(source), bottleneck)
