"""Synthetic offers and measurements for the discovery tests (every rate simulated).

Offers are the local catalog's hosts (coordinator/providers/local/catalog.py) re-drawn with other
GPU counts, CPU shares and RAM; their true rates come from the simulated cuzk's
hardware model (sim/physics.py ``capacities``), never from the rate model
under test, times a hidden per-machine factor.
"""

from __future__ import annotations

import gzip
import math
import random
from collections.abc import Sequence
from typing import Any

import orjson

from vast_manager.coordinator.discovery.features import offer_features
from vast_manager.coordinator.discovery.measurements import Measurement
from vast_manager.coordinator.offers import Offer, parse_offer
from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.sim.hardware import Profile
from vast_manager.sim.physics import capacities

from support.paths import REPO_ROOT

MARKETS = REPO_ROOT / "bench" / "markets"
#: A market line's fields that are not the offer's (docs/discovery.md, "Market files").
NOT_OFFER = ("true_rate_per_hour", "measured_rate_per_hour", "oracle_rate_per_hour",
             "oracle_median_rate_per_hour", "true_binding")


def market(name: str) -> list[dict[str, Any]]:
    """A shipped market file's lines (bench/markets/NAME.jsonl.gz)."""
    with gzip.open(MARKETS / f"{name}.jsonl.gz") as fh:
        return [orjson.loads(line) for line in fh]


def market_offer(row: dict[str, Any]) -> Offer:
    """A market line's offer, parsed as the providers parse vast.ai's."""
    return parse_offer({k: v for k, v in row.items() if k not in NOT_OFFER})


def market_measurements(rows: Sequence[dict[str, Any]], copies: int = 1) -> list[Measurement]:
    """Each line's one benchmark as an imported measurement (``copies`` times)."""
    return [Measurement(str(r["machine_id"]), market_offer(r), r["measured_rate_per_hour"],
                        0.0, "imported") for r in rows for _ in range(copies)]


def synthetic_offer(rng: random.Random, machine_id: int) -> dict[str, Any]:
    """A catalog host with another slice, host size and RAM (vast.ai's shape)."""
    base = dict(rng.choice(local_offers()))
    host_gpus = rng.choice((1, 2, 4, 8))
    k = rng.choice([n for n in (1, 2, 4, 8) if n <= host_gpus])
    cores = rng.choice((32, 64, 128))
    base.update({
        "id": machine_id * 10 + k,
        "machine_id": machine_id,
        "num_gpus": k,
        "cpu_cores": cores,
        "cpu_cores_effective": cores * k / host_gpus,
        "cpu_ram": rng.choice((256_000, 512_000, 1_024_000)),
        "dph_total": round(base["dph_total"] / base["num_gpus"] * k * rng.uniform(0.8, 1.2), 4),
    })
    base.pop("sim", None)
    return base


def true_rate(offer: dict[str, Any] | Offer, hidden: float = 1.0) -> float:
    """The simulated hardware model's rate for the instance's share, times ``hidden``."""
    parsed = parse_offer(offer)
    f = offer_features(parsed)
    profile = Profile.from_offer({**parsed.raw, "cpu_cores_effective": round(f.cpu_cores_effective),
                                  "cpu_ram": f.ram_share_gib * (1 << 30) / 1e6})
    return capacities(profile).rate_per_hour * hidden


def measurements(n: int, seed: int = 1, runs: int = 1) -> list[Measurement]:
    """n measurements of distinct random machines (``runs`` each), 5% noise, 10% hosts."""
    rng = random.Random(seed)
    out: list[Measurement] = []
    machine = 70_000
    while len(out) < n:
        offer = synthetic_offer(rng, machine)
        hidden = math.exp(rng.gauss(0.0, 0.10))
        for _ in range(min(runs, n - len(out))):
            rate = true_rate(offer, hidden) * math.exp(rng.gauss(0.0, 0.05))
            out.append(Measurement(str(machine), parse_offer(offer), rate, 0.0, "fleet"))
        machine += 1
    return out


def parsed(offers: list[dict[str, Any]]) -> list[Offer]:
    """Offers as a provider hands them out: vast.ai's JSON parsed (coordinator.offers)."""
    return [parse_offer(o) for o in offers]
