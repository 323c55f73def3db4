"""A benchmark result's belief (docs/reliability.md): samples count only when the
coordinator asked for them, and a rate beyond belief for the hardware is held until a
directed re-benchmark confirms it."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vast_manager.common.hardware_facts import canonical_gpu_name
from vast_manager.coordinator.decisions import belief, policy
from vast_manager.coordinator.discovery.measurements import instance_offer
from vast_manager.coordinator.offers import Offer, OfferError, parse_offer, stored_offer
from vast_manager.coordinator.operations.directives import (
    CONFIRM,
    MAX_CONFIRM_TRIES,
    directed,
    new_benchmark_id,
    watched_whole,
)
from vast_manager.coordinator.rows import InstanceRow, instance_row
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import loads
from vast_manager.coordinator.store.writer import Tx
from vast_manager.protocol.messages import Result

log = logging.getLogger(__name__)

#: The model's view of an offer's hardware as a new host's (its 90th percentile and what
#: it never measured; None: no model, or it cannot read the offer); passed in by the HTTP
#: layer, which holds the fitted model.
Expectation = Callable[[Offer], belief.Expected | None]


def _references(tx: Tx, inst: InstanceRow, offer: Offer | None, gpus: int,
                expected: belief.Expected | None) -> belief.References:
    """What a claim is compared with (docs/reliability.md, "No rate on a host's word
    alone"): its card's GPU-bound rate, the model's view, the median rate per GPU of
    *other* machines' measurements the model reads whole (none bounded by
    ``belief.learn_bound``: no lie under the line is anyone's twin) on the same hardware
    (the same GPU model and count, the same CPU, within a quarter of the RAM), and this
    machine's own first counted rate (as counted: what bounds its own later claims)."""
    machine = str(inst["machine_id"] or inst["label"] or "")
    model = canonical_gpu_name(str((offer and offer.gpu_name) or inst.get("gpu_name") or ""))
    cpu = offer.cpu_name if offer else None
    ram = offer.cpu_ram if offer else None
    others: list[float] = []
    own_first: float | None = None
    for row in tx.fleet_measurements_of(gpus):  # oldest first
        per_gpu = float(row["rate_per_hour"]) / gpus
        if str(row["machine_id"]) == machine:
            own_first = per_gpu if own_first is None else own_first
            continue
        if row["model_cap_per_hour"] is not None or row["host_reported"]:
            continue  # learned bounded (its delivery unknown), or hardware it named: no twin
        other = stored_offer(row["offer_json"]) or Offer()
        if canonical_gpu_name(other.gpu_name or "") != model:
            continue
        if cpu and other.cpu_name and other.cpu_name != cpu:
            continue
        their_ram = other.cpu_ram
        if ram is not None and their_ram is not None and ram > 0 \
                and not 0.8 <= their_ram / ram <= 1.25:
            continue
        others.append(per_gpu)
    return belief.References(
        expected_high=expected.high if expected is not None else None,
        novel=expected.novel if expected is not None else (),
        twin_median_per_gpu=statistics.median(others) if others else None,
        own_first_per_gpu=own_first,
        gpu_bound_per_gpu=belief.known_gpu_bound_per_gpu(
            (offer and offer.gpu_name) or inst.get("gpu_name"),
            offer.gpu_mem_bw if offer else None))


def _readable(raw: dict[str, object]) -> Offer | None:
    """The instance's offer JSON as an ``Offer``; None (logged) when it is malformed."""
    try:
        return parse_offer(raw)
    except OfferError as exc:
        log.warning("offer of machine %s unreadable: %s", raw.get("machine_id"), exc.message)
        return None


def _cap(rate: float, gpus: int, refs: belief.References) -> float | None:
    """The bound a counted ``rate`` is learned at (``belief.learn_bound``), None when it
    is under it."""
    bound = belief.learn_bound(gpus, refs)
    return bound if bound is not None and bound < rate else None


@dataclass(frozen=True, slots=True)
class Belief:
    counts: bool  # the result may enter host_perf, the model, the ranking and a verdict
    terminate: str | None = None  # a held claim that could not be confirmed
    counted_rate: float | None = None  # a confirmation's: the lower of it and the claim
    model_cap: float | None = None  # the most the rate model reads of it until delivery agrees


def judge_belief(
    tx: Tx, inst: InstanceRow, result: Result, check: policy.Plausibility, rate: float,
    settings: Settings, now: float, expect: Expectation | None, updates: dict[str, Any],
    events: list[tuple[str, str]],
) -> Belief:
    """Samples only when asked, beyond belief held (docs/reliability.md): flags
    ``check``, fills ``updates`` (the directed benchmark consumed, a confirmation
    opened) and ``events``. Reads (the fleet's measurements) but writes nothing."""
    confirming = inst["directed_benchmark_kind"] == CONFIRM and inst["directed_benchmark_id"]
    claimed = inst["unconfirmed_rate_per_hour"]
    asked, why = directed(result, inst)
    failed: str | None = None
    if asked:
        # The result of the benchmark asked for: it is answered, and asked for no more
        # (a confirmation below asks again).
        updates.update(directed_benchmark_id=None, directed_benchmark_kind=None,
                       rebenchmark_pending=0)
        if confirming:
            failed = watched_whole(result, inst, settings, now)
    elif not confirming:
        check.flag(policy.UNDIRECTED, why)
        return Belief(False)
    else:
        failed = why
    offer = _readable(instance_offer(
        loads(inst.get("offer_json")),
        loads(inst.get("host_json")) if inst["kind"] == "byo" else None,
        instance_row({**inst, "machine_id": inst["machine_id"] or inst["label"]})))
    held: str | None = None
    if failed is None:
        expected: belief.Expected | None = None
        if expect is not None and offer is not None:
            try:
                expected = expect(offer)
            except Exception:  # a model bug must not lose the agent's result
                log.exception("rate expectation failed for instance %s", inst["id"])
        refs = _references(tx, inst, offer, check.gpus, expected)
        if confirming and claimed is not None and belief.agrees(rate, float(claimed)):
            updates.update(unconfirmed_rate_per_hour=None, confirm_tries=0)
            counted = belief.counted_rate(rate, float(claimed))
            # Believed for this instance; its influence on the model (and on other
            # machines' twins) stays bounded by what was believed before it.
            cap = _cap(counted, check.gpus, refs)
            events.append(("confirmed", f"a directed re-benchmark measured {rate:.2f} "
                           f"proofs/h, agreeing with the held {float(claimed):.2f}/h "
                           f"(counted: {counted:.2f}/h, the lower" + (
                               f"; the rate model reads at most {cap:.2f}/h)" if cap
                               else ")")))
            return Belief(True, counted_rate=counted, model_cap=cap)
        held = belief.beyond_belief(rate, check.gpus, refs)
        if held is None:
            if confirming:  # an ordinary rate after all: counted, the claim dropped
                updates.update(unconfirmed_rate_per_hour=None, confirm_tries=0)
            # Counted for this host; the model learns it no higher than what it believed
            # of the hardware until the work the host delivers agrees.
            return Belief(True, model_cap=_cap(rate, check.gpus, refs))
    else:
        held = f"the re-benchmark does not confirm the held claim: {failed}"
    tries = int(inst["confirm_tries"] or 0) + (1 if confirming else 0)
    check.flag(policy.UNCONFIRMED, held)
    if tries >= MAX_CONFIRM_TRIES:
        updates.update(directed_benchmark_id=None, directed_benchmark_kind=None)
        return Belief(False, f"{tries} directed re-benchmarks did not confirm a rate beyond "
                              f"belief ({held})")
    updates.update(unconfirmed_rate_per_hour=float(claimed) if confirming and claimed
                   else rate, confirm_tries=tries)
    confirm_id = new_benchmark_id()
    updates.update(directed_benchmark_id=confirm_id, directed_benchmark_at=now,
                   directed_benchmark_kind=CONFIRM, confirm_watch_at=now,
                   confirm_watch_gap_s=0.0, rebenchmark_pending=1)
    events.append(("held", f"unconfirmed: {held}; a directed re-benchmark was asked for"))
    return Belief(False)
