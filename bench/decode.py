"""Heartbeat decode cost: msgspec's typed decode, the parse alone, and the decoder it replaced.

Run: ``python bench/decode.py`` (about 20 s; ``--quick`` for a second or so).

Builds ~1,000 realistic heartbeat bodies (1 to 8 GPUs, 16 CPU cores per GPU up
to 128, as the agent sends them; the same shapes as ``bench/ingest.py``) and
times, per heartbeat, best of several rounds over all of them:

- ``orjson.loads`` alone and msgspec's untyped parse alone: the floors;
- ``vast_manager.protocol.codec.decode``: msgspec parsing straight into the message
  Structs, with every check their annotations carry;
- ``from_obj`` after ``orjson.loads`` (msgspec checking a parsed value: the store's path);
- the hand-written decoder it replaced (``orjson.loads``, then a generated fast path
  with a reference converter behind it), read from git at ``--against`` (the last
  commit that had it) when this is a git checkout that holds that commit.

Each is printed in microseconds and as a ratio to the orjson floor. Before timing,
every body is decoded by each and the results compared, so the figures are for
equal work.

Then the way back, which the coordinator pays for every heartbeat (its telemetry
column): ``codec.encode`` (orjson) of the decoded message's telemetry against the same
content as plain dicts and lists (the floor), and msgspec's encoder of the same.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import gpus_of, heartbeat_body, telemetry  # noqa: E402 (the ingest bench's shapes)

from vast_manager.protocol.codec import decode, encode, from_obj  # noqa: E402
from vast_manager.protocol.messages import Heartbeat  # noqa: E402

#: The last commit with the hand-written decoder (protocol/schema.py's generated fast path).
PREVIOUS = "e95b03e"

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


# --- the decoder before msgspec, from git -------------------------------------------------


def previous_decoder(rev: str) -> tuple[Callable[[bytes], Any] | None, str]:
    """``orjson.loads`` + the hand-written decoder of ``rev``'s protocol/, or None and why."""
    sources = {}
    for name in ("messages", "schema"):
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:protocol/{name}.py"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"git cannot show {rev}:protocol/{name}.py here"
        sources[name] = done.stdout
    if "def fast_builder" not in sources["schema"]:
        return None, f"{rev} has no hand-written decoder"
    loaded = {}
    for name, text in sources.items():
        module = types.ModuleType(f"_previous_{name}")
        sys.modules[module.__name__] = module  # dataclasses resolve their hints through it
        exec(compile(text, f"{rev}:protocol/{name}.py", "exec"), module.__dict__)
        loaded[name] = module
    build = loaded["schema"].decoder(loaded["messages"].Heartbeat)
    loads = orjson.loads
    return (lambda body: build(loads(body))), ""


def same_reading(old: Any, new: Any) -> bool:
    """The same message, allowing the newer decoder's optional additions (absent from the
    bodies, so null) that an older dataclass does not have."""
    a, b = orjson.loads(encode(old)), orjson.loads(encode(new))
    return _same(a, b)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        extra = b.keys() - a.keys()
        return (a.keys() <= b.keys() and all(b[k] is None for k in extra)
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- timing ----------------------------------------------------------------------------


def per_item_us(fn: Callable[[Any], Any], items: list[Any], seconds: float) -> float:
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
    ap.add_argument("--against", default=PREVIOUS, metavar="REV",
                    help=f"the commit whose hand-written decoder to time (default {PREVIOUS})")
    args = ap.parse_args()
    count = args.count or (200 if args.quick else 1000)
    seconds = 0.2 if args.quick else 3.0

    items = bodies(count)
    loads = orjson.loads
    parse = msgspec.json.Decoder().decode

    def new_decode(body: bytes) -> Heartbeat:
        return decode(Heartbeat, body)

    def converted(body: bytes) -> Heartbeat:
        return from_obj(Heartbeat, loads(body))

    previous, why_not = previous_decoder(args.against)
    same = [(converted, "from_obj")] + ([(previous, "the previous decoder")] if previous else [])
    for fn, name in same:
        differ = sum(not same_reading(fn(b), new_decode(b)) for b in items)
        if differ:
            raise SystemExit(f"{differ} bodies decode differently with {name}; not timing")

    sizes = sorted(map(len, items))
    print(f"{count} heartbeat bodies, {sizes[0]}-{sizes[-1]} bytes "
          f"(median {sizes[len(sizes) // 2]}), best round of ~{seconds:g} s each")
    floor = per_item_us(loads, items, seconds)
    rows = [("orjson.loads alone (floor)", floor),
            ("msgspec parse alone, untyped", per_item_us(parse, items, seconds)),
            ("decode (msgspec, typed)", per_item_us(new_decode, items, seconds)),
            ("orjson.loads + from_obj", per_item_us(converted, items, seconds))]
    if previous is not None:
        rows.append((f"previous decoder ({args.against})", per_item_us(previous, items, seconds)))
    for name, us in rows:
        print(f"  {name:36} {us:7.2f} us  {us / floor:4.2f}x")
    if previous is not None:
        print(f"decode is {rows[-1][1] / rows[2][1]:.1f}x faster than the previous decoder")
    else:
        print(f"previous decoder not timed: {why_not}")

    decoded = [new_decode(b).telemetry for b in items]
    # The same content as plain dicts (defaults filled in, as stored).
    plain = [loads(encode(t)) for t in decoded]
    dumps = orjson.dumps
    floor_enc = per_item_us(dumps, plain, seconds)
    enc = per_item_us(encode, decoded, seconds)
    ms_enc = per_item_us(msgspec.json.Encoder().encode, decoded, seconds)
    print(f"  {'orjson.dumps of plain dicts (floor)':36} {floor_enc:7.2f} us  1.00x")
    print(f"  {'encode (orjson) of the telemetry':36} {enc:7.2f} us  {enc / floor_enc:4.2f}x")
    print(f"  {'msgspec encode of the telemetry':36} {ms_enc:7.2f} us  "
          f"{ms_enc / floor_enc:4.2f}x")


if __name__ == "__main__":
    main()
