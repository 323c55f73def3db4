"""What a kept instance actually proves, measured from its heartbeats.

A proving instance reports cuzk's completed proofs (``proofs_completed_total``, read
from the daemon's ``/status`` by the agent) with every heartbeat. The benchmark says
what the host *can* do; this says what it *does*: the completed rate over the last
half to whole ``WINDOW_S`` (simulated seconds on the local fleet), and ``idle`` when no proof has
completed for ``idle_after_s`` of proving: no work command (``VM_WORK_CMD``) feeds the
daemon, or the work dried up. An idle instance bills without producing, so it is not
counted as fleet output (``/api/fleet``, ``/metrics``, the autopilot) and is reported,
or destroyed after ``idle_destroy_after_s`` (docs/operations.md, "The work command and
idle instances").

Idle also means delivering far below the rate it was kept on: each round's count feeds
the sequential test of ``decisions.delivered`` (one proof every 14 minutes from a host
kept at 431/h is short, not busy); a host found short is demoted by the monitor
(docs/reliability.md, "Judged by what it delivers"). Where the cluster's record covers an
instance, its per-read increments feed the test instead (``fold_cluster``), and
``decisions.cluster_verdict`` ends an instance below its minimum on it.

Derived on the coordinator from the heartbeats it already receives: no wire change.
Kept in memory and rebuilt after a restart: until ``idle_after_s`` has passed since
this coordinator first saw an instance proving, it is not called idle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vast_manager.coordinator.decisions import delivered
from vast_manager.coordinator.decisions.cluster_verdict import CUZK, Delivered
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.cluster import NOT_DELIVERED
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.store.migrations import Row

#: The completed rate is taken over this much of the latest proving (simulated seconds).
WINDOW_S = 3600.0

#: The columns ``observe`` reads of each active instance.
COLUMNS = ("id", "kind", "state", "proofs_completed_total", "rate_per_hour", "dph_total")


@dataclass(slots=True)
class _Track:
    """Two readings of the counter, so the rate spans between half the window and the
    whole of it: O(1) memory an instance, however long it proves (a fleet is 50,000)."""

    since: float  # when this coordinator first saw it proving (its clock)
    total: int  # proofs_completed_total at the last observation
    changed_at: float | None = None  # when that total last grew
    anchor: tuple[float, int] = (0.0, 0)  # the older reading the rate is taken from
    middle: tuple[float, int] = (0.0, 0)  # the next anchor, half a window on
    checked: tuple[float, int] = (0.0, 0)  # the reading the delivery test last took
    test: delivered.DeliveryTest = field(default_factory=delivered.DeliveryTest)
    short: str | None = None  # why the delivery test found it short (None: it has not)
    short_rate: float | None = None  # the delivered rate it was found short on
    kept: float | None = None  # the rate it was kept on, as of the last round


@dataclass(frozen=True, slots=True)
class Production:
    """One proving instance's measured output (``view`` gives it to the JSON views)."""

    completed_rate_per_hour: float | None
    idle: bool
    idle_since: float | None
    idle_reason: str | None
    rate_per_hour: float | None  # the benchmark's, to take out of the fleet's sum when idle
    dph_total: float | None
    short: str | None = None  # delivering far below its rate (``decisions.delivered``)
    short_rate_per_hour: float | None = None  # the delivered rate it was found short on
    settled: bool = False  # the completed rate spans at least half a window
    idle_stop_at: float | None = None  # when the monitor destroys it, idle (None: never)

    def view(self) -> dict[str, Any]:
        return {"completed_rate_per_hour": self.completed_rate_per_hour, "idle": self.idle,
                "idle_since": self.idle_since, "idle_reason": self.idle_reason,
                "idle_stop_at": self.idle_stop_at}


#: What an instance that is not proving shows (nothing measured, not idle).
NOT_PROVING: dict[str, Any] = {"completed_rate_per_hour": None, "idle": False,
                               "idle_since": None, "idle_reason": None, "idle_stop_at": None,
                               **NOT_DELIVERED}


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def idle_warning(p: Production, now: float) -> str:
    """The idle event's text: why, and when the instance will be destroyed (the warning
    before it happens) unless a proof completes first."""
    if p.idle_stop_at is None:
        return f"{p.idle_reason}; reported only (VM_IDLE_DESTROY_AFTER_S)"
    return (f"{p.idle_reason}; it will be destroyed in {duration(max(p.idle_stop_at - now, 0))}"
            " unless a proof completes first (VM_IDLE_DESTROY_AFTER_S)")


class ProductionTracker:
    """Fed by the monitor each round; read by the views from any thread (``current`` is
    replaced whole each round, never changed in place)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._tracks: dict[int, _Track] = {}
        self.current: dict[int, Production] = {}
        # What the cluster says each proving instance delivered and earned
        # (``operations.cluster``), and the fleet's; replaced whole each round.
        self.delivered: dict[int, dict[str, Any]] = {}
        self.fleet_delivered: dict[str, Any] = {}
        #: Instances whose delivery test the cluster's record feeds (``fold_cluster``).
        self._cluster_fed: set[int] = set()
        #: Instance id -> the delivered rate its delivery test last agreed on, not yet
        #: taken by the monitor (``take_agreed``).
        self._agreed: dict[int, float] = {}

    def scale(self, row: Row) -> float:
        # The local fleet's heartbeats are in simulated time (directives.time_scale's rule).
        return self.settings.sim_time_scale if row.get("kind") == "deployed" else 1.0

    def observe(self, rows: Iterable[Row], now: float) -> list[int]:
        """Take one round of active instances; return the ids that turned idle now."""
        tracks: dict[int, _Track] = {}
        current: dict[int, Production] = {}
        turned: list[int] = []
        idle_after = self.settings.idle_after_s
        for row in rows:
            if row.get("state") != State.PROVING:
                continue
            ident = int(row["id"])
            total = int(row.get("proofs_completed_total") or 0)
            track = self._tracks.get(ident)
            if track is None or total < track.total:  # first seen, or the agent restarted
                track = _Track(since=now, total=total, anchor=(now, total),
                               middle=(now, total), checked=(now, total),
                               test=track.test if track else delivered.DeliveryTest(),
                               short=track.short if track else None)
            elif total > track.total:
                track.total, track.changed_at = total, now
            scale = self.scale(row)
            if (now - track.middle[0]) * scale >= WINDOW_S / 2:
                track.anchor, track.middle = track.middle, (now, total)
            tracks[ident] = track
            self._check_delivery(ident, track, row, now, scale)
            quiet_s = (now - (track.changed_at or track.since)) * scale
            idle = (idle_after > 0 and quiet_s >= idle_after) or track.short is not None
            before = self.current.get(ident)
            if idle and not (before and before.idle):
                turned.append(ident)
            since = (before.idle_since if before and before.idle else now) if idle else None
            current[ident] = Production(
                completed_rate_per_hour=self._rate(track, now, scale),
                idle=idle,
                idle_since=since,
                idle_reason=(f"no proof completed in {duration(quiet_s)} of proving: no "
                             "work command (VM_WORK_CMD) feeds cuzk, or its work ran out")
                if idle and quiet_s >= idle_after > 0 else track.short,
                rate_per_hour=row.get("rate_per_hour"),
                dph_total=row.get("dph_total"),
                short=track.short,
                short_rate_per_hour=track.short_rate,
                settled=(now - track.anchor[0]) * scale >= WINDOW_S / 2,
                idle_stop_at=self._stop_at(since, row, scale),
            )
        self._tracks = tracks
        self.current = current
        return turned

    def _check_delivery(self, ident: int, track: _Track, row: Row, now: float,
                        scale: float) -> None:
        """Fold what cuzk's counter says the instance delivered since the last round into
        its delivery test (not for an instance the cluster's record covers: ``fold_cluster``
        folds that instead, the outside truth taking precedence)."""
        kept = row.get("rate_per_hour")
        track.kept = float(kept) if kept else None
        if ident in self._cluster_fed:
            track.checked = (now, track.total)
            return
        if self.settings.idle_after_s <= 0:
            return  # production watching is off (VM_IDLE_AFTER_S = 0), this test with it
        t0, n0 = track.checked
        track.checked = (now, track.total)
        if not kept or track.short is not None:
            return
        obs = Delivered(track.total - n0, 0, (now - t0) * scale, CUZK)
        track.test, verdict = delivered.step(track.test, obs, float(kept))
        self._note_agreed(ident, verdict)
        if verdict.short:
            track.short, track.short_rate = verdict.reason, verdict.delivered_rate_per_hour

    def fold_cluster(self, increments: dict[int, Delivered]) -> None:
        """Fold what the cluster recorded each instance delivered since its previous read
        (``operations.cluster.Assessment.increments``) into its delivery test; from then on
        cuzk's counter is not folded for it."""
        self._cluster_fed = set(increments) | self._cluster_fed & set(self._tracks)
        for ident, obs in increments.items():
            track = self._tracks.get(ident)
            if track is None or not track.kept or track.short is not None \
                    or self.settings.idle_after_s <= 0:
                continue
            track.test, verdict = delivered.step(track.test, obs, track.kept)
            self._note_agreed(ident, verdict)
            if verdict.short:
                track.short, track.short_rate = verdict.reason, verdict.delivered_rate_per_hour
                current = self.current.get(ident)
                if current is not None:
                    self.current[ident] = dataclasses.replace(
                        current, short=track.short, short_rate_per_hour=track.short_rate,
                        idle=True, idle_reason=current.idle_reason or track.short)

    def _note_agreed(self, ident: int, verdict: delivered.Verdict) -> None:
        if verdict.agrees and verdict.delivered_rate_per_hour is not None:
            self._agreed[ident] = verdict.delivered_rate_per_hour

    def take_agreed(self) -> dict[int, float]:
        """Instance id -> the delivered rate its delivery test agreed on since the last
        call: what the rate model may now learn of its measurements (the monitor lifts
        their ``model_cap_per_hour`` to it: docs/reliability.md, "Judged by what it
        delivers")."""
        agreed, self._agreed = self._agreed, {}
        return agreed

    def short_ids(self) -> list[int]:
        """Instances the delivery test found short, not yet re-judged (the monitor demotes
        them once another instance shows the work flows)."""
        return [i for i, p in self.current.items() if p.short is not None]

    def rejudged(self, instance_id: int) -> None:
        """The instance was re-judged on what it delivers (its rate is now that): its
        delivery test starts afresh against the new rate."""
        track = self._tracks.get(int(instance_id))
        if track is not None:
            track.short, track.short_rate, track.test = None, None, delivered.DeliveryTest()

    def settled_rates(self) -> dict[int, float]:
        """Instance id -> the completed rate of those measured over at least half a window
        (what the autopilot counts a proving instance at: docs/reliability.md); none with
        production watching off (``VM_IDLE_AFTER_S`` = 0)."""
        if self.settings.idle_after_s <= 0:
            return {}
        return {i: p.completed_rate_per_hour for i, p in self.current.items()
                if p.settled and p.completed_rate_per_hour is not None}

    def _stop_at(self, idle_since: float | None, row: Row, scale: float) -> float | None:
        """When an idle instance we rented is destroyed (its clock; a bring-your-own machine
        never is, nor anything while ``idle_destroy_after_s`` is 0)."""
        limit = self.settings.idle_destroy_after_s
        if idle_since is None or limit <= 0 or row.get("kind") != "deployed":
            return None
        return idle_since + limit / scale

    def _rate(self, track: _Track, now: float, scale: float) -> float | None:
        """Proofs per (simulated) hour since the anchor (half a window to a window ago);
        None until the readings span a monitor round."""
        t0, n0 = track.anchor
        span_s = (now - t0) * scale
        if now - t0 < self.settings.monitor_interval_s or span_s <= 0:
            return None
        return (track.total - n0) * 3600.0 / span_s

    def view(self, instance_id: int) -> dict[str, Any]:
        found = self.current.get(int(instance_id))
        out = found.view() if found is not None else dict(NOT_PROVING)
        out.update(self.delivered.get(int(instance_id), NOT_DELIVERED))
        return out

    def idle_ids(self) -> set[int]:
        return {i for i, p in self.current.items() if p.idle}

    def idle_totals(self) -> tuple[int, float, float]:
        """(idle instances, their benchmark rates' sum, their $/h's sum)."""
        idle = [p for p in self.current.values() if p.idle]
        return (len(idle), sum(float(p.rate_per_hour or 0.0) for p in idle),
                sum(float(p.dph_total or 0.0) for p in idle))

    def completed_total_per_hour(self) -> float | None:
        """The fleet's completed rate: the sum over proving instances measured so far."""
        rates = [p.completed_rate_per_hour for p in self.current.values()
                 if p.completed_rate_per_hour is not None]
        return sum(rates) if rates else None
