"""Production as the cluster records it: the read of Curio's HarmonyDB, and what a round
makes of it (docs/operations.md, "Production as the cluster records it").

``ClusterWatch.run`` reads the cluster in its own task, each monitor interval, within
``VM_CURIO_READ_TIMEOUT_S``; heartbeats never wait on it. A failed read raises one alert
(logged once, ``alert`` for ``/metrics`` and the dashboard's banner) and is retried on the
one backoff policy (``common.retry.Backoff``); meanwhile the decisions fall back to the
agents' cuzk counters and nothing is destroyed for it. ``POST /api/production`` brings any
other cluster's counts (``report``). ``assess`` is the monitor's round: per proving
instance, the delivered observation (``decisions.cluster_verdict.Delivered``) beside the
claimed rates, its attribution, its earnings, and the verdict.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vast_manager.common.retry import Backoff
from vast_manager.coordinator.curio_db import ClusterRows, ClusterUnavailable, CurioDb
from vast_manager.coordinator.decisions import cost, earnings, policy
from vast_manager.coordinator.decisions.attribution import (
    NODE_NAME_PREFIX,
    Attribution,
    Claim,
    Matched,
    Unattributable,
    attribute,
    node_name,
)
from vast_manager.coordinator.decisions.cluster_verdict import (
    CLUSTER,
    CUZK,
    Delivered,
    Judgement,
    judge,
)
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.offers import parse_offer, stored_offer
from vast_manager.coordinator.settings import Settings, curio_tasks
from vast_manager.coordinator.store.migrations import Row

log = logging.getLogger(__name__)

#: The columns ``assess`` reads of each active instance; with a proof price, the bill's too.
COLUMNS = ("id", "kind", "state", "state_since", "rate_per_hour", "min_rate_per_hour",
           "dph_total")
COST_COLUMNS = ("offer_json", "disk_gb", "bid_per_hour", "net_rx_bytes")

#: What an instance shows with no delivered observation (and before any round).
NOT_DELIVERED: dict[str, Any] = {
    "cluster_status": None, "delivered_rate_per_hour": None, "delivered_source": None,
    "delivered_window_s": None, "tasks_completed": None, "tasks_failed": None,
    "last_task_error": None, "cluster_flags": {}, **earnings.NO_EARNINGS.view()}


#: What the fleet shows before the first round.
NO_FLEET_DELIVERED: dict[str, Any] = {
    "revenue_per_hour": None, "cost_per_hour": None, "profit_per_hour": None,
    "unattributable_addresses": []}


@dataclass(frozen=True, slots=True)
class Report:
    """A cluster's own counts for one instance (``POST /api/production``)."""

    delivered: Delivered
    received_at: float


@dataclass(slots=True)
class Assessment:
    """One round's outcome: the views' fields by instance and the fleet's, the flags and
    the instances that fall below their minimum."""

    views: dict[int, dict[str, Any]] = field(default_factory=dict)
    fleet: dict[str, Any] = field(default_factory=dict)
    judgements: dict[int, Judgement] = field(default_factory=dict)
    # What each matched instance delivered since the previous read, once per read: the
    # observation a sequential delivered-beats-claimed test folds round by round.
    increments: dict[int, Delivered] = field(default_factory=dict)


class ClusterWatch:
    """The cluster source: its reads, its alert, the reports posted to the API."""

    def __init__(self, settings: Settings, clock: policy.Clock, db: CurioDb | None = None,
                 backoff: Backoff | None = None) -> None:
        self.settings = settings
        self.clock = clock
        url = settings.curio_db_url
        self.db = db if db is not None else (
            CurioDb(url, settings.curio_db_schema, settings.curio_read_timeout_s)
            if url else None)
        self.backoff = backoff or Backoff(base_s=settings.monitor_interval_s, cap_s=600.0)
        self.latest: ClusterRows | None = None
        self.failures = 0
        self.next_read_at = 0.0
        self.alert: str | None = None
        self.alert_since: float | None = None
        self.reads_failed_total = 0
        self.addresses: dict[int, str] = {}  # instance id -> public IP:port (provider list)
        self.reports: dict[int, Report] = {}
        self.read_upto: float | None = None  # the clock at the last good read
        self._seq = 0  # good reads so far
        self._handed_seq = 0  # the read whose increments a round last handed out
        self._bills: dict[int, tuple[tuple[Any, ...], float | None]] = {}
        self._pairs_seen: dict[tuple[str | None, str], float] = {}

    @property
    def configured(self) -> bool:
        return self.db is not None

    # --- the read --------------------------------------------------------------------

    async def run(self) -> None:
        """Read every monitor interval (or when the backoff allows) until cancelled."""
        while True:
            try:
                await self.refresh()
            except Exception as err:  # a fault of ours must not end the reads for good
                log.exception("cluster read failed")
                self._failed(self.clock(), f"{type(err).__name__} in the read")
            await asyncio.sleep(self.settings.monitor_interval_s)

    async def refresh(self) -> None:
        """One read, unless the backoff says wait: its rows, or the alert."""
        now = self.clock()
        if self.db is None or now < self.next_read_at:
            return
        since = now - self.settings.curio_window_s
        since_new = since if self.read_upto is None else max(since, self.read_upto)
        try:
            rows = await self.db.read(since, curio_tasks(self.settings), NODE_NAME_PREFIX,
                                      since_new)
        except ClusterUnavailable as err:
            self._failed(now, str(err))
            return
        if self.alert is not None:
            log.warning("cluster database readable again after %d failed reads",
                        self.failures)
        self._seq += 1
        self.latest = replace(rows, machines=self._remember(rows.machines, now),
                              seq=self._seq, read_at=now)
        self.read_upto, self.failures, self.next_read_at = now, 0, 0.0
        self.alert, self.alert_since = None, None

    def _remember(self, machines: tuple[tuple[str | None, str], ...],
                  now: float) -> tuple[tuple[str | None, str], ...]:
        """The (name, address) pairs seen within the window, this read's and earlier ones.
        Curio keeps one ``harmony_machines`` row per ``host_and_port`` and one details row
        per machine (resources.go's upsert; tasks.go's ``ON CONFLICT (machine_id)``), so a
        second node on an address overwrites the first's name: only names remembered
        across reads show that two nodes share it."""
        horizon = now - self.settings.curio_window_s
        seen = {pair: at for pair, at in self._pairs_seen.items() if at >= horizon}
        seen.update(dict.fromkeys(machines, now))
        self._pairs_seen = seen
        return tuple(seen)

    def _failed(self, now: float, reason: str) -> None:
        """The alert (logged once until a read succeeds), and the next try on the backoff."""
        self.failures += 1
        self.reads_failed_total += 1
        self.next_read_at = now + self.backoff.after(self.failures)
        if self.alert is None:
            self.alert_since = now
            log.warning("cluster database (VM_CURIO_DB_URL) unavailable: %s; decisions "
                        "use the agents' counters, nothing is destroyed for it", reason)
        self.alert = f"cluster database unavailable: {reason}"

    async def close(self) -> None:
        if self.db is not None:
            await self.db.close()

    def view(self) -> dict[str, Any]:
        """The source's state, for the fleet view, /metrics and the dashboard's banner."""
        return {"configured": self.configured, "alert": self.alert,
                "alert_since": self.alert_since, "reads_failed_total": self.reads_failed_total,
                "read_since": self.latest.since if self.latest else None}

    # --- reports from any other cluster ---------------------------------------------

    def report(self, counts: Mapping[int, Delivered], now: float) -> None:
        """Take a cluster's counts (``POST /api/production``), replacing earlier ones (on
        the loop; the whole map is replaced, so a round reading it sees one or the other)."""
        self.reports = {**self.reports,
                        **{int(i): Report(d, now) for i, d in counts.items()}}

    def expire_reports(self, now: float) -> None:
        """Forget the reports older than their own window (on the loop, before a round)."""
        self.reports = {i: r for i, r in self.reports.items()
                        if now - r.received_at < r.delivered.window_s}

    # --- the monitor's round ---------------------------------------------------------

    def attribution(self, claims: Iterable[Claim]) -> Attribution | None:
        """The latest good read matched to ``claims``; None while the source is down."""
        if self.latest is None or self.alert is not None:
            return None
        return attribute(claims, self.latest.machines, self.latest.tallies)

    @property
    def active(self) -> bool:
        """Whether a round has anything to assess: a source, a report, or a price."""
        return (self.configured or bool(self.reports)
                or earnings.proof_price_usd(self.settings) is not None)

    def columns(self) -> tuple[str, ...]:
        """The instance columns ``assess`` reads: the bill's only with a price (a fleet of
        50,000 parses no offers a round for nothing)."""
        priced = earnings.proof_price_usd(self.settings) is not None
        return COLUMNS + COST_COLUMNS if priced else COLUMNS

    def assess(self, rows: Iterable[Row], cuzk_rates: Mapping[int, float | None],
               now: float) -> Assessment:
        """Every active instance's delivered rate beside its claimed ones, its earnings,
        and (proving ones) the verdict; ``cuzk_rates`` are the agents' completed rates.
        Runs on a worker thread: it reads the source's state, never changes what the loop
        writes (``report``, ``expire_reports``)."""
        out = Assessment()
        if not self.active:
            out.fleet = self._fleet(None, [], None)
            return out
        rows = list(rows)
        claims = [Claim(int(r["id"]), node_name(int(r["id"])), self.addresses.get(int(r["id"])))
                  for r in rows if r.get("state") == State.PROVING]
        found = self.attribution(claims)
        price = earnings.proof_price_usd(self.settings)
        parts: list[earnings.Earnings] = []
        bills: dict[int, tuple[tuple[Any, ...], float | None]] = {}
        for row in rows:
            hourly = self._bill(row, bills) if price is not None else None
            if row.get("state") != State.PROVING:
                parts.append(earnings.earnings(price, 0.0, None, hourly))
                continue
            made = self._proving(row, found, cuzk_rates.get(int(row["id"])), hourly, now, out)
            parts.append(made)
        self._increments(found, out)
        if not any(v.get("tasks_completed") for v in out.views.values()):
            # Nothing of ours delivered anything: a drought in the cluster's work (or its
            # rows not reaching us) is no host's doing; flags stand, nobody ends for it.
            out.judgements = {i: replace(j, terminate=None) for i, j in out.judgements.items()}
        self._bills = bills
        out.fleet = self._fleet(price, parts, found)
        return out

    def _increments(self, found: Attribution | None, out: Assessment) -> None:
        """The tasks since the previous read of each matched instance, the first round
        after each read only (a test folding them must see each task once)."""
        latest = self.latest
        if found is None or latest is None or latest.seq == self._handed_seq:
            return
        self._handed_seq = latest.seq
        span = latest.read_at - latest.since_new
        for ident, got in found.instances.items():
            if isinstance(got, Matched) and span > 0:
                t = got.tally
                out.increments[ident] = Delivered(t.new_completed, t.new_failed, span,
                                                  CLUSTER, t.last_error)

    def _bill(self, row: Row, bills: dict[int, tuple[tuple[Any, ...], float | None]]
              ) -> float | None:
        """``full_hourly_cost``, computed again only when what it reads changed (an
        instance's offer, disk and bid are fixed at deploy: a fleet parses no offers
        round after round)."""
        key = (*(row.get(c) for c in COST_COLUMNS), row.get("dph_total"))
        ident = int(row["id"])
        known = self._bills.get(ident)
        hourly = known[1] if known is not None and known[0] == key else full_hourly_cost(
            row, self.settings)
        bills[ident] = (key, hourly)
        return hourly

    def _fleet(self, price: float | None, parts: list[earnings.Earnings],
               found: Attribution | None) -> dict[str, Any]:
        fleet = earnings.fleet_earnings(price, parts).view()
        fleet.pop("revenue_basis")
        return {**fleet, "cluster": self.view(), "unattributable_addresses": _unclaimed(found)}

    def _proving(self, row: Row, found: Attribution | None, cuzk: float | None,
                 hourly: float | None, now: float, out: Assessment) -> earnings.Earnings:
        """One proving instance's view and verdict, into ``out``; its earnings."""
        ident = int(row["id"])
        window = self.settings.curio_window_s
        since = row.get("state_since")
        proving_s = max(0.0, now - float(now if since is None else since))
        seen, status = self._delivered(ident, found, min(window, proving_s))
        view: dict[str, Any] = {**NOT_DELIVERED, "cluster_status": status}
        if seen is not None:
            view.update(seen.view())
        elif cuzk is not None:
            view["delivered_source"] = CUZK  # the agent's counter is all there is
        rate, basis = earnings.earned_rate(seen.rate_per_hour if seen else None, cuzk,
                                           row.get("rate_per_hour"))
        made = earnings.earnings(earnings.proof_price_usd(self.settings), rate, basis, hourly)
        view.update(made.view())
        verdict = judge(seen, proving_s=proving_s, window_s=window,
                        min_rate=row.get("min_rate_per_hour"),
                        benchmark_rate=row.get("rate_per_hour"),
                        tolerance=self.settings.rate_tolerance,
                        failures_flag=self.settings.curio_failures_flag)
        view["cluster_flags"] = dict(verdict.flags)
        out.views[ident] = view
        out.judgements[ident] = verdict
        return made

    def _delivered(self, ident: int, found: Attribution | None,
                   window_s: float) -> tuple[Delivered | None, str]:
        """The cluster's observation of one proving instance, and a word on where it came
        from (or why there is none)."""
        if found is not None:
            got = found.instances.get(ident)
            if isinstance(got, Unattributable):
                return None, f"unattributable: {got.reason}"
            if isinstance(got, Matched) and window_s > 0:
                t = got.tally
                return Delivered(t.completed, t.failed, window_s, CLUSTER, t.last_error), (
                    f"matched: {', '.join(got.addresses) or 'no address yet'}")
        report = self.reports.get(ident)
        if report is not None:
            return report.delivered, "reported to POST /api/production"
        if self.alert is not None:
            return None, "cluster source unavailable: the agent's counter stands"
        if self.configured:
            return None, f"no Curio node named {node_name(ident)} in the cluster"
        return None, "no cluster source set"


def _unclaimed(found: Attribution | None) -> list[dict[str, Any]]:
    if found is None:
        return []
    return [{"host_and_port": a, "tasks_completed": t.completed, "tasks_failed": t.failed}
            for a, t in sorted(found.unclaimed.items())]


def full_hourly_cost(row: Row, settings: Settings) -> float | None:
    """An instance's full bill per hour (rent, storage, its setup download over a kept
    life: ``cost.kept_per_hour``, as the views' ``cost.per_hour.total``)."""
    offer = stored_offer(row.get("offer_json")) or parse_offer({"dph_total": row.get("dph_total")})
    prices = cost.prices_of(offer, row.get("disk_gb"), row.get("bid_per_hour"))
    if prices is None:
        return None
    setup = cost.setup_download_bytes(row.get("net_rx_bytes"), settings.setup_download_gb)
    total = cost.kept_per_hour(prices, setup_down_bytes=setup,
                               kept_hours=settings.plan_horizon_hours).total
    return total if math.isfinite(total) else None
