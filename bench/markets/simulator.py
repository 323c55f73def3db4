"""The simulator's market: ``bench/discovery.py``'s hosts, one offer a machine.

Its true rates come from the project's simulated cuzk (``sim/physics.py``), the same
physics the structural rate model encodes, times the bench's hidden host effects; the
oracle's rate is the point with the least expected percentage error over draws of those
effects for each host's hardware (the bench's noise floor). Run from the repository root:
``python bench/markets/simulator.py`` writes ``bench/markets/simulator.jsonl.gz``.
Simulated.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from discovery import FLOOR_DRAWS, Hidden, ape_point, machines
from market_file import KEEP, MIN_RAM_SHARE_GB, ram_share_gb, write_market

HOSTS = 1700
SEED = 20261203


def main() -> int:
    rng = random.Random(SEED)
    floor_rng = random.Random(SEED + 1)
    lines: list[dict[str, object]] = []
    next_id = 50_000
    while len(lines) < HOSTS:
        (m,) = machines(1, rng, first_id=next_id)
        next_id += 1
        k = rng.choice(m.slices())
        offer = m.offer(k, m.machine_id * 10 + k, 1.0)
        if ram_share_gb(offer) < MIN_RAM_SHARE_GB:
            continue
        draws = [m.true_rate(k, Hidden.draw(floor_rng)) for _ in range(FLOOR_DRAWS)]
        row = {key: offer[key] for key in KEEP if key in offer}
        row["true_rate_per_hour"] = round(m.true_rate(k), 3)
        row["true_binding"] = m.binding(k)
        row["measured_rate_per_hour"] = round(m.measure(k, rng), 3)
        row["oracle_rate_per_hour"] = round(ape_point(draws), 3)
        row["oracle_median_rate_per_hour"] = round(statistics.median(draws), 3)
        lines.append(row)
    n = write_market(Path(__file__).with_name("simulator.jsonl.gz"), lines)
    print(f"simulator market: {n} hosts (simulated)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
