"""Heartbeat decode cost: orjson's parse alone, the reference converter, and ``decode``.

Run: ``python bench/decode.py`` (about 10 s; ``--quick`` for a second or so).

Builds ~1,000 realistic heartbeat bodies (1 to 8 GPUs, 16 CPU cores per GPU up
to 128, as the agent sends them; the same shapes as ``bench/ingest.py``) and
times, per heartbeat, best of several rounds over all of them:

- ``orjson.loads`` alone: the floor, measured in the same run;
- ``orjson.loads`` + the reference converter (``vast_manager.protocol.schema.converter``);
- ``vast_manager.protocol.codec.decode`` (the generated fast path, reference on a miss).

Each is printed in microseconds and as a ratio to the floor, with the check's
own share (the time beyond the parse). Before timing, every body is decoded
both ways and the results compared, so the figures are for equal work.

Then the way back, which the coordinator pays for every heartbeat (its telemetry
column): ``orjson.dumps`` of the decoded message's telemetry against the same
content as plain dicts and lists (the floor).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import gpus_of, heartbeat_body, telemetry  # noqa: E402 (the ingest bench's shapes)

from vast_manager.protocol.codec import decode  # noqa: E402
from vast_manager.protocol.messages import Heartbeat  # noqa: E402
from vast_manager.protocol.schema import converter  # noqa: E402

# --- bodies -----------------------------------------------------------------------------


def bodies(count: int, seed: int = 20240605) -> list[bytes]:
    rng = random.Random(seed)
    return [
        orjson.dumps(heartbeat_body(
            i, 1.7e9 + i, i * 3, telemetry(gpus_of(i), rng),
            [round(rng.uniform(80, 130), 1) for _ in range(rng.randint(0, 10))],
        ))
        for i in range(count)
    ]


# --- timing ----------------------------------------------------------------------------


def per_item_us(fn: Callable[[bytes], Any], items: list[bytes], seconds: float) -> float:
    """Best round's microseconds per item; rounds repeat for about ``seconds``."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
        rounds += 1
    return best / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of about a second")
    ap.add_argument("--count", type=int, default=None, help="heartbeat bodies (default 1000)")
    args = ap.parse_args()
    count = args.count or (200 if args.quick else 1000)
    seconds = 0.2 if args.quick else 3.0

    items = bodies(count)
    reference = converter(Heartbeat)
    loads = orjson.loads

    def ref_decode(body: bytes) -> Heartbeat:
        return reference(loads(body), "")

    def new_decode(body: bytes) -> Heartbeat:
        return decode(Heartbeat, body)

    mismatched = sum(new_decode(b) != ref_decode(b) for b in items)
    if mismatched:
        raise SystemExit(f"{mismatched} bodies decode differently; not timing")

    sizes = sorted(map(len, items))
    print(f"{count} heartbeat bodies, {sizes[0]}-{sizes[-1]} bytes "
          f"(median {sizes[len(sizes) // 2]}), best round of ~{seconds:g} s each")
    floor = per_item_us(loads, items, seconds)
    ref = per_item_us(ref_decode, items, seconds)
    new = per_item_us(new_decode, items, seconds)
    print(f"  {'orjson.loads alone (floor)':34} {floor:7.2f} us  1.00x")
    for name, us in (("orjson.loads + reference converter", ref),
                     ("decode (fast path)", new)):
        print(f"  {name:34} {us:7.2f} us  {us / floor:4.2f}x   "
              f"check alone {us - floor:6.2f} us")
    if new > floor:
        print(f"check speed-up: {(ref - floor) / (new - floor):.1f}x "
              f"(decode {ref / new:.1f}x faster overall)")

    decoded = [new_decode(b).telemetry for b in items]
    # The same content as plain dicts (defaults filled in, as stored).
    plain = [loads(orjson.dumps(t)) for t in decoded]
    dumps = orjson.dumps
    floor_enc = per_item_us(dumps, plain, seconds)  # type: ignore[arg-type]
    enc = per_item_us(dumps, decoded, seconds)  # type: ignore[arg-type]
    print(f"  {'orjson.dumps of plain dicts (floor)':34} {floor_enc:7.2f} us  1.00x")
    print(f"  {'orjson.dumps of the telemetry':34} {enc:7.2f} us  {enc / floor_enc:4.2f}x")


if __name__ == "__main__":
    main()
