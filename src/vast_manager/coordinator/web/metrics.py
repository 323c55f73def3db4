"""``GET /metrics``: the fleet and its GPUs in the Prometheus text exposition format.

The exposition is ``prometheus_client``'s: collectors (``FleetCollector`` reads the
store, ``GuardCollector`` the refused traffic, ``PaceCollector`` the heartbeat pace,
plus the library's own process and
Python collectors) on a ``CollectorRegistry`` of one scrape, never the library's
global one, written by ``generate_latest`` on the store's reader thread (``exposition``
is what ``Store.read`` runs), so a fleet-sized scrape never holds the event loop.

Per-GPU gauges are named after their dcgm-exporter counterparts so a Grafana
user finds them by analogy (``vm_gpu_utilization_percent`` ~
``DCGM_FI_DEV_GPU_UTIL``) and carry ``instance_id``, ``machine_id``, ``gpu``
and ``gpu_name``: ``gpu`` only an index the instance's hello listed (at most 16),
``gpu_name`` the spec table's spelling or ``other``, so no host mints series. Values
come from each live instance's latest telemetry; a number the host could not measure
is left out rather than faked. Every label value is host-sent text: neutralised
(``textsafe.neutralise``) and cut here, escaped per the format by the library.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vast_manager.common.hardware_facts import GPU_SPECS, canonical_gpu_name
from vast_manager.coordinator.decisions import pace, policy, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.discovery.autopilot_rules import ledger_of, rental_of
from vast_manager.coordinator.operations.account import AccountView
from vast_manager.coordinator.operations.production import ProductionTracker
from vast_manager.coordinator.rows import instance_row
from vast_manager.coordinator.store.migrations import loads
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.replica import ReplicaHealth
from vast_manager.coordinator.textsafe import neutralise
from vast_manager.coordinator.web.guard import Guard
from vast_manager.coordinator.web.json_views import fleet_view

# The classic text format, which Prometheus 2 and 3 both read (every name here is a legacy
# one, so the text is the same under the format's version 1.0.0).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_LABEL_CHARS = 256
INSTANCE_STATES: tuple[str, ...] = tuple(State)
# Instances whose telemetry describes a machine working now.
LIVE_STATES = states.ACTIVE_PHASES


def label_text(value: Any) -> str:
    """A label value as shown: host text neutralised (control and bidi characters read as
    escapes, line breaks as spaces) and cut to ``MAX_LABEL_CHARS``; the exposition then
    escapes backslash and double quote as the format says."""
    return "" if value is None else neutralise(str(value))[:MAX_LABEL_CHARS]


def _number(value: Any) -> float | None:
    """A sample's value, or None for what is not a number (absent rather than faked)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _labels(*values: Any) -> list[str]:
    """Label values as shown (``label_text``), made once for every family that uses them."""
    return [label_text(v) for v in values]


class _Gauge(GaugeMetricFamily):
    """A gauge family whose samples skip what is not a number."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...] = ()) -> None:
        super().__init__(name, documentation, labels=labels)

    def sample(self, value: Any, labels: list[str] | None = None) -> None:
        number = _number(value)
        if number is not None:
            self.add_metric(labels or [], number)


# Per-GPU gauges: (metric, help, telemetry field, multiplier).
GPU_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("vm_gpu_utilization_percent",
     "GPU busy time, mean over the telemetry window, percent (~DCGM_FI_DEV_GPU_UTIL).",
     "util_pct_mean", 1.0),
    ("vm_gpu_utilization_max_percent",
     "GPU busy time, highest sample of the telemetry window, percent.",
     "util_pct_max", 1.0),
    ("vm_gpu_fb_used_bytes",
     "Framebuffer memory used, bytes (~DCGM_FI_DEV_FB_USED, which is in MiB).",
     "mem_used_bytes", 1.0),
    ("vm_gpu_pcie_tx_bytes_per_second",
     "PCIe transmit throughput, mean, bytes/s (~DCGM_FI_DEV_PCIE_TX_THROUGHPUT).",
     "pcie_tx_kbps_mean", 1000.0),
    ("vm_gpu_pcie_rx_bytes_per_second",
     "PCIe receive throughput, mean, bytes/s (~DCGM_FI_DEV_PCIE_RX_THROUGHPUT).",
     "pcie_rx_kbps_mean", 1000.0),
    ("vm_gpu_power_watts",
     "Power draw, mean, watts (~DCGM_FI_DEV_POWER_USAGE).",
     "power_w_mean", 1.0),
    ("vm_gpu_temperature_celsius",
     "GPU temperature, highest of the window, degrees C (~DCGM_FI_DEV_GPU_TEMP).",
     "temp_c_max", 1.0),
    ("vm_gpu_sm_clock_mhz",
     "SM clock, mean, MHz (~DCGM_FI_DEV_SM_CLOCK).",
     "sm_clock_mhz_mean", 1.0),
    ("vm_gpu_clocks_event_reasons",
     "Clock event (throttle) reasons bitmask OR-ed over the window "
     "(~DCGM_FI_DEV_CLOCKS_EVENT_REASONS).",
     "throttle_reasons", 1.0),
    ("vm_gpu_pcie_link_gen", "PCIe link generation under load.", "pcie_gen_current", 1.0),
    ("vm_gpu_pcie_link_width", "PCIe link width (lanes) under load.", "pcie_width_current", 1.0),
)

INSTANCE_LABELS = ("instance_id", "machine_id", "gpu_name", "state")
HOST_LABELS = ("instance_id", "machine_id")
GPU_LABELS = ("instance_id", "machine_id", "gpu", "gpu_name")
#: What the per-instance gauges read of each instance still on a machine.
_INSTANCE_COLUMNS = ("id", "machine_id", "gpu_name", "state", "rate_per_hour", "dph_total",
                     "proofs_completed_total", "last_seen", "num_gpus", "provider_instance_id",
                     "provider_status", "billing_per_hour")


#: GPU series one instance may expose per gauge: the most GPUs a vast.ai machine is
#: bucketed at (8) twice over, as a bring-your-own agent's legacy hello may list.
MAX_GPU_SERIES_PER_INSTANCE = 16
#: The ``gpu_name`` label of a model the spec table lacks: a host's own text would make
#: a new series at every hello that renames it.
OTHER_GPU = "other"


def gpu_label(name: Any) -> str:
    """A GPU name as a label: the spec table's spelling (``hardware_facts.GPU_SPECS``),
    else ``OTHER_GPU``: never the host's free text."""
    canonical = canonical_gpu_name(str(name or ""))
    return canonical if canonical in GPU_SPECS else OTHER_GPU


def _gpu_names(host_json: str | None) -> dict[int, str]:
    """Index -> label name of the GPUs the instance's hello listed (at most
    ``MAX_GPU_SERIES_PER_INSTANCE``): the only ``gpu`` labels its gauges carry."""
    host = loads(host_json)
    names: dict[int, str] = {}
    for gpu in (host.get("gpus") if isinstance(host, dict) else None) or []:
        if len(names) >= MAX_GPU_SERIES_PER_INSTANCE:
            break
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int) \
                and not isinstance(gpu.get("index"), bool):
            names[gpu["index"]] = gpu_label(gpu.get("name"))
    return names


def _scaled(value: Any, factor: float) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value * factor


#: Per instance, delivered beside claimed and its earnings (``operations.cluster``): the
#: view's field, the gauge, its help.
_DELIVERED = (
    ("delivered_rate_per_hour", "vm_instance_delivered_proofs_per_hour",
     "Proofs per hour the cluster recorded the instance delivered (Curio's "
     "harmony_task_history or POST /api/production; absent without it)."),
    ("tasks_completed", "vm_instance_tasks_completed",
     "Proving tasks the cluster recorded as succeeded within the window."),
    ("tasks_failed", "vm_instance_tasks_failed",
     "Proving tasks the cluster recorded as failed within the window."),
    ("revenue_per_hour", "vm_instance_revenue_dollars_per_hour",
     "What the instance earns per hour at VM_PROOF_PRICE_* (absent without a price)."),
    ("cost_per_hour", "vm_instance_cost_dollars_per_hour",
     "The instance's full bill per hour (absent without a price)."),
    ("profit_per_hour", "vm_instance_profit_dollars_per_hour",
     "Revenue less the full bill per hour (absent without a price)."),
)


class FleetCollector(Collector):
    """The fleet's gauges from the store as it is now: counts by state, the fleet's price
    and rate, each instance's, and each live instance's latest telemetry (hosts, GPUs,
    cuzk). Give it the reader thread's ``Reads``: a scrape reads every instance."""

    def __init__(self, reads: Reads, now: float,
                 production: ProductionTracker | None = None) -> None:
        self.reads = reads
        self.now = now
        self.production = production

    def collect(self) -> Iterator[Metric]:
        yield from self._fleet()
        yield from self._instances()
        yield from self._telemetry()
        scrape = _Gauge("vm_scrape_timestamp_seconds", "Unix time of this scrape.")
        scrape.sample(self.now)
        yield scrape

    def _fleet(self) -> Iterator[Metric]:
        made = self.production
        fleet = fleet_view(self.reads.instances_by_state(),
                           made.idle_totals() if made else (0, 0.0, 0.0),
                           made.completed_total_per_hour() if made else None)
        by_state = _Gauge("vm_instances", "Instances by state.", ("state",))
        for state, n in {**dict.fromkeys(INSTANCE_STATES, 0), **fleet["by_state"]}.items():
            by_state.sample(n, _labels(state))
        yield by_state
        families = (
            ("vm_fleet_proofs_per_hour",
             "Proofs per hour of the proving instances (their measured rates), idle ones "
             "left out.",
             fleet["proofs_per_hour"]),
            ("vm_fleet_completed_proofs_per_hour",
             "Proofs per hour cuzk completed on the proving instances, from their heartbeats "
             "(absent until measured).",
             fleet["completed_proofs_per_hour"]),
            ("vm_fleet_idle_instances",
             "Proving instances that completed no proof for VM_IDLE_AFTER_S: billing, idle.",
             fleet["idle"]),
            ("vm_fleet_dollars_per_hour",
             "What every instance that bills costs per hour now: by vast.ai's last listed "
             "status (rent while running, storage unless offline), else its price.",
             fleet["dollars_per_hour"]),
            ("vm_fleet_dollars_per_proof",
             "Fleet price per hour over proofs per hour (absent while nothing proves).",
             fleet["dollars_per_proof"]),
            ("vm_bad_hosts", "Machines on the blocklist.", self.reads.bad_host_count()),
            *self._delivered_fleet(),
        )
        for name, documentation, value in families:
            family = _Gauge(name, documentation)
            family.sample(value)
            yield family

    def _delivered_fleet(self) -> tuple[tuple[str, str, Any], ...]:
        """The fleet's earnings (with a proof price) and the cluster source's state."""
        made = self.production.fleet_delivered if self.production else {}
        cluster = made.get("cluster") or {}
        up = None if not cluster.get("configured") else (0 if cluster.get("alert") else 1)
        return (
            ("vm_fleet_revenue_dollars_per_hour",
             "What the proving instances earn per hour at VM_PROOF_PRICE_* (absent without "
             "a price).", made.get("revenue_per_hour")),
            ("vm_fleet_cost_dollars_per_hour",
             "The full bill per hour of every instance that bills (rent, storage, setup "
             "bandwidth over a kept life; absent without a price).", made.get("cost_per_hour")),
            ("vm_fleet_profit_dollars_per_hour",
             "Fleet revenue less its full bill per hour (absent without a price).",
             made.get("profit_per_hour")),
            ("vm_cluster_source_up",
             "1 when the last read of VM_CURIO_DB_URL succeeded, 0 while it is unavailable "
             "(absent when unset).", up),
            ("vm_cluster_unattributable_addresses",
             "Curio addresses with proving tasks that no instance holds, or two do.",
             len(made.get("unattributable_addresses") or []) if cluster.get("configured")
             else None),
        )

    def _instances(self) -> Iterator[Metric]:
        fams = {
            "rate": _Gauge("vm_instance_proofs_per_hour",
                           "Measured proofs per hour of an instance.", INSTANCE_LABELS),
            "dph": _Gauge("vm_instance_dollars_per_hour", "Price per hour of an instance.",
                          INSTANCE_LABELS),
            # dph_total over the rate: read from columns, so a fleet-sized scrape parses no
            # offers; the whole bill by part is vm_spend_dollars, per instance the API's cost.
            "usd": _Gauge("vm_instance_dollars_per_proof",
                          "dph_total per proof of an instance (rent and storage; bandwidth "
                          "is in vm_spend_dollars).", INSTANCE_LABELS),
            "proofs": _Gauge("vm_instance_proofs_completed",
                             "Proofs the instance's cuzk daemon completed (resets on reboot).",
                             INSTANCE_LABELS),
            "seen": _Gauge("vm_instance_last_seen_timestamp_seconds",
                           "Unix time of the instance's last heartbeat.", INSTANCE_LABELS),
            "gpus": _Gauge("vm_instance_gpus", "GPUs of an instance.", INSTANCE_LABELS),
            "completed": _Gauge("vm_instance_completed_proofs_per_hour",
                                "Proofs per hour cuzk completed on a proving instance, from "
                                "its heartbeats (absent until measured).", INSTANCE_LABELS),
            "idle": _Gauge("vm_instance_idle",
                           "1 when a proving instance completed no proof for "
                           "VM_IDLE_AFTER_S (billing, producing nothing), else 0.",
                           INSTANCE_LABELS),
            "billing": _Gauge("vm_instance_billing_dollars_per_hour",
                              "What vast.ai bills for an instance per hour now, by its last "
                              "listed status (0 rent while stopped; its price until listed).",
                              INSTANCE_LABELS),
            "vast": _Gauge("vm_instance_provider_status",
                           "1 for an instance's provider id and status as the provider last "
                           "listed them (vast.ai's actual_status).",
                           (*INSTANCE_LABELS, "provider_instance_id", "provider_status")),
            **{key: _Gauge(name, text, INSTANCE_LABELS) for key, name, text in _DELIVERED},
        }
        produced = self.production.view if self.production else None
        for inst in self.reads.active_instances(_INSTANCE_COLUMNS):
            labels = _labels(inst["id"], inst["machine_id"], gpu_label(inst["gpu_name"]),
                             inst["state"])
            made = produced(inst["id"]) if produced is not None else None
            # One reading (docs/operations.md): a lost or idle instance proves nothing now,
            # so it has no rate and no cost per proof here either.
            silent = inst["state"] == State.LOST or bool(made and made["idle"])
            rate = None if silent else inst["rate_per_hour"]
            fams["rate"].sample(rate, labels)
            fams["dph"].sample(inst["dph_total"], labels)
            fams["usd"].sample(policy.usd_per_proof(inst["dph_total"], rate), labels)
            fams["proofs"].sample(inst["proofs_completed_total"], labels)
            fams["seen"].sample(inst["last_seen"], labels)
            fams["gpus"].sample(inst["num_gpus"], labels)
            billing = inst["billing_per_hour"]
            fams["billing"].sample(inst["dph_total"] if billing is None else billing, labels)
            if inst["provider_status"] is not None:
                fams["vast"].sample(1, labels + _labels(inst["provider_instance_id"],
                                                        inst["provider_status"]))
            if made is not None:
                fams["completed"].sample(made["completed_rate_per_hour"], labels)
                fams["idle"].sample(1 if made["idle"] else 0, labels)
                for key, _name, _text in _DELIVERED:
                    fams[key].sample(made[key], labels)
        yield from fams.values()

    def _telemetry(self) -> Iterator[Metric]:
        gpu_fams = [_Gauge(name, help_text, GPU_LABELS) for name, help_text, _, _ in GPU_GAUGES]
        host = {
            "cpu": _Gauge("vm_host_cpu_utilization_percent", "Host CPU busy, mean, percent.",
                          HOST_LABELS),
            "load1": _Gauge("vm_host_load1", "Host one-minute load average.", HOST_LABELS),
            "ram": _Gauge("vm_host_ram_used_bytes", "Host RAM used, bytes.", HOST_LABELS),
            "tele_ts": _Gauge("vm_instance_telemetry_timestamp_seconds",
                              "Unix time the latest telemetry arrived.", HOST_LABELS),
        }
        cuzk_fams = {
            "queue": _Gauge("vm_cuzk_queue_depth", "cuzk queue depth, mean over the window.",
                            HOST_LABELS),
            "synth": _Gauge("vm_cuzk_synthesis_active", "cuzk synthesis tasks active, mean.",
                            HOST_LABELS),
            "mem": _Gauge("vm_cuzk_memory_used_bytes",
                          "cuzk memory used, highest of the window.", HOST_LABELS),
            "busy": _Gauge("vm_cuzk_worker_busy_percent", "cuzk GPU worker busy, percent.",
                           (*HOST_LABELS, "gpu")),
        }
        for inst_id, machine_id, _gpu_name, host_json, received_at, tele_json in (
            self.reads.live_telemetry(sorted(LIVE_STATES))
        ):
            tele = loads(tele_json)
            if not isinstance(tele, dict):
                continue
            at = _labels(inst_id, machine_id)
            host["tele_ts"].sample(received_at, at)
            cpu = tele.get("cpu") or {}
            host["cpu"].sample(cpu.get("util_pct_mean"), at)
            host["load1"].sample(cpu.get("load1"), at)
            host["ram"].sample((tele.get("ram") or {}).get("used_bytes"), at)
            names = _gpu_names(host_json)
            seen: set[int] = set()
            for gpu in tele.get("gpus") or []:
                index = gpu.get("index") if isinstance(gpu, dict) else None
                # Only GPUs the hello listed, each once: a host's telemetry cannot mint
                # series (docs/reliability.md, "Bounds").
                if not isinstance(index, int) or index not in names or index in seen:
                    continue
                seen.add(index)
                labels = [*at, label_text(index), names[index]]
                for fam, (_, _, key, factor) in zip(gpu_fams, GPU_GAUGES, strict=True):
                    fam.sample(_scaled(gpu.get(key), factor), labels)
            cuzk = tele.get("cuzk")
            if isinstance(cuzk, dict):
                cuzk_fams["queue"].sample(cuzk.get("queue_depth_mean"), at)
                cuzk_fams["synth"].sample(cuzk.get("synthesis_active_mean"), at)
                cuzk_fams["mem"].sample(cuzk.get("memory_used_bytes_max"), at)
                ordinals: set[int] = set()
                for worker in cuzk.get("workers") or []:
                    ordinal = worker.get("gpu_ordinal") if isinstance(worker, dict) else None
                    # cuzk numbers the listed GPUs from 0: an ordinal past them is no GPU.
                    if isinstance(ordinal, int) and 0 <= ordinal < len(names) \
                            and ordinal not in ordinals:
                        ordinals.add(ordinal)
                        cuzk_fams["busy"].sample(worker.get("busy_pct"),
                                                 [*at, label_text(ordinal)])
        yield from gpu_fams
        yield from host.values()
        yield from cuzk_fams.values()


@dataclass(frozen=True, slots=True)
class GuardCounts:
    """What the guard counted, copied on the event loop (whose requests change the
    counters) for a scrape that runs on another thread."""

    refused: Mapping[str, int]
    malformed: Mapping[str, int]
    suppressed_log_lines: int
    body_bytes_in_flight: int

    @classmethod
    def of(cls, guard: Guard) -> GuardCounts:
        counters = guard.counters
        return cls(dict(counters.refused), dict(counters.malformed),
                   counters.suppressed_log_lines, guard.budget.in_flight_bytes)


class GuardCollector(Collector):
    """What the coordinator refused since it started (``vast_manager.coordinator.web.guard``)."""

    def __init__(self, counts: GuardCounts) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "vm_refused_requests_total",
            "Requests refused before their body was used, by error code.", labels=("code",))
        for code, n in sorted(self.counts.refused.items()):
            refused.add_metric([label_text(code)], n)
        malformed = CounterMetricFamily(
            "vm_malformed_requests_total", "Requests the HTTP parser refused, by kind.",
            labels=("kind",))
        for kind, n in sorted(self.counts.malformed.items()):
            malformed.add_metric([label_text(kind)], n)
        yield refused
        yield malformed
        yield CounterMetricFamily(
            "vm_log_lines_suppressed_total",
            "Log lines about refused traffic left out by the rate limit (counted here instead).",
            value=self.counts.suppressed_log_lines)
        yield GaugeMetricFamily(
            "vm_request_body_bytes_in_flight",
            "Request-body bytes held in memory now (bounded in total).",
            value=self.counts.body_bytes_in_flight)


@dataclass(frozen=True, slots=True)
class PaceFigures:
    """What sets the heartbeat pace (docs/operations.md, "Heartbeat pace"): the tracker's
    counts copied on the event loop (whose requests change them) for a scrape on another
    thread, and the settings (frozen)."""

    fleet: pace.FleetLoad
    limits: pace.PaceSettings


class PaceCollector(Collector):
    """The pace the coordinator answers now, the agents it is set for, and the budget."""

    def __init__(self, figures: PaceFigures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        fleet, limits = self.figures.fleet, self.figures.limits
        paces = pace.paces(fleet, limits)
        seconds = GaugeMetricFamily(
            "vm_heartbeat_pace_seconds",
            "The next_heartbeat_s the coordinator answers now, before its jitter (up to a "
            "quarter more): quick for warming and benchmarking agents, steady for the "
            "others.", labels=("pace",))
        heard = GaugeMetricFamily(
            "vm_agents_heard", "Agents whose silence the coordinator times, by pace.",
            labels=("pace",))
        for name, pace_s, agents in (("quick", paces.quick_s, fleet.quick),
                                     ("steady", paces.steady_s, fleet.steady)):
            seconds.add_metric([name], pace_s)
            heard.add_metric([name], agents)
        yield seconds
        yield heard
        yield GaugeMetricFamily(
            "vm_heartbeats_per_second_paced",
            "Heartbeats a second the agents heard send at the paces answered now (at most: "
            "jitter only lengthens a pace).",
            value=pace.heartbeats_per_second(fleet, limits))
        yield GaugeMetricFamily(
            "vm_heartbeats_per_second_budget",
            "The budget the pace keeps the fleet under (VM_MAX_HEARTBEATS_PER_SECOND).",
            value=limits.max_heartbeats_per_second)


@dataclass(frozen=True, slots=True)
class BillFigures:
    """The account as last read and the spend window (docs/operations.md, "The account")."""

    account: AccountView
    spend_window_s: float
    #: The offer cache's ``view()`` (operations.offer_cache): searches and the quota.
    offer_cache: dict[str, Any] | None = None


class BillCollector(Collector):
    """The whole bill: what the fleet spent over the spend window by part (the autopilot's
    ledger, ``ledger_of``) and the vast.ai account (funds, a refused key, paused deploys)."""

    def __init__(self, reads: Reads, now: float, figures: BillFigures) -> None:
        self.reads = reads
        self.now = now
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        since = self.now - self.figures.spend_window_s
        ledger = ledger_of([rental_of(instance_row(r)) for r in self.reads.spend_rows(since)],
                           now=self.now, since=since, last_exploration_at=None)
        spent = GaugeMetricFamily(
            "vm_spend_dollars",
            "Dollars the deployed instances billed over the spend window "
            "(VM_AUTOPILOT_SPEND_WINDOW_H), by part: rent, storage, bandwidth.",
            labels=("part",))
        for part, value in (("rent", ledger.rent_usd), ("storage", ledger.storage_usd),
                            ("bandwidth", ledger.bandwidth_usd)):
            spent.add_metric([part], value)
        yield spent
        account = self.figures.account
        figures: tuple[tuple[str, str, float | None], ...] = (
            ("vm_vast_balance_dollars", "vast.ai account balance (users/current).",
             account.balance_usd),
            ("vm_vast_credit_dollars", "vast.ai account credit (users/current).",
             account.credit_usd),
            ("vm_vast_funds_dollars", "vast.ai funds the pause and warning floors compare.",
             account.funds_usd),
        )
        for name, doc, amount in figures:
            if amount is not None:
                yield GaugeMetricFamily(name, doc, value=amount)
        yield GaugeMetricFamily("vm_vast_auth_ok",
                                "1 while vast.ai accepts the API key, 0 once it refused it.",
                                value=1.0 if account.auth_ok else 0.0)
        yield GaugeMetricFamily("vm_vast_funds_low",
                                "1 while the funds are below VM_BALANCE_WARN_USD.",
                                value=1.0 if account.warning else 0.0)
        open_faults = len(self.reads.fleet_faults(open_only=True))
        yield GaugeMetricFamily("vm_fleet_faults_open",
                                "Open fleet faults: a failure that is not one host's (the "
                                "setup's, vast.ai's), pausing deploys until cleared.",
                                value=float(open_faults))
        yield GaugeMetricFamily("vm_deploys_paused",
                                "1 while deploys and the autopilot are paused (the account, "
                                "or an open fleet fault).",
                                value=1.0 if account.paused or open_faults else 0.0)
        yield from _search_metrics(self.figures.offer_cache)


def _search_metrics(view: dict[str, Any] | None) -> Iterator[Metric]:
    """vast.ai's offer searches by outcome, today's count and the quota's stop."""
    if view is None:
        return
    searches = CounterMetricFamily(
        "vm_vast_searches", "Offer searches sent to the provider since start, by outcome "
        "(answered, quota_exceeded, rate_limited, failed).", labels=("outcome",))
    for outcome, count in sorted(view["counts"].items()):
        searches.add_metric([outcome], float(count))
    yield searches
    yield GaugeMetricFamily("vm_vast_searches_today", "Offer searches sent this UTC day "
                            "(budget VM_VAST_SEARCHES_PER_DAY).",
                            value=float(view["searches_today"]))
    yield GaugeMetricFamily("vm_vast_search_quota_exceeded", "1 while vast.ai's daily search "
                            "quota is spent: no search until its reset, offers from the cache.",
                            value=1.0 if view["quota_until"] is not None else 0.0)
    if view.get("oldest_answer_age_s") is not None:
        yield GaugeMetricFamily("vm_vast_offer_cache_age_seconds",
                                "Age of the oldest answer in the offer cache.",
                                value=float(view["oldest_answer_age_s"]))


class ReplicaCollector(Collector):
    """The database's replication (``store.replica``): configured, running, its lag."""

    def __init__(self, health: ReplicaHealth, now: float) -> None:
        self.health, self.now = health, now

    def collect(self) -> Iterator[Metric]:
        health = self.health
        yield GaugeMetricFamily(
            "vm_replica_configured", "1 when VM_REPLICA_URL is set; 0: the state is on one disk.",
            value=1.0 if health.configured else 0.0)
        if not health.configured:
            return
        yield GaugeMetricFamily("vm_replica_up", "1 while Litestream runs and its last sync "
                                "request was confirmed.",
                                value=1.0 if health.running and health.error is None else 0.0)
        lag = health.lag_s(self.now)
        if lag is not None and health.last_sync_at is not None:
            yield GaugeMetricFamily(
                "vm_replica_lag_seconds", "Seconds since the replica last confirmed it held "
                "every write: what losing the disk now could cost.", value=lag)
            yield GaugeMetricFamily("vm_replica_last_sync_timestamp_seconds",
                                    "When the replica last confirmed a sync (Unix time).",
                                    value=health.last_sync_at)


def registry(reads: Reads, now: float, guard: GuardCounts | None = None,
             paced: PaceFigures | None = None,
             bill: BillFigures | None = None,
             production: ProductionTracker | None = None,
             replica: ReplicaHealth | None = None) -> CollectorRegistry:
    """One scrape's registry: the fleet, the guard's counts, the pace, and
    prometheus_client's own process (CPU, memory, file descriptors) and Python (version,
    garbage collector) collectors, on a registry of its own rather than the library's
    global one."""
    out = CollectorRegistry(auto_describe=False)
    out.register(FleetCollector(reads, now, production))
    if guard is not None:
        out.register(GuardCollector(guard))
    if paced is not None:
        out.register(PaceCollector(paced))
    if bill is not None:
        out.register(BillCollector(reads, now, bill))
    if replica is not None:
        out.register(ReplicaCollector(replica, now))
    ProcessCollector(registry=out)
    PlatformCollector(registry=out)
    GCCollector(registry=out)
    return out


def exposition(reads: Reads, now: float, guard: GuardCounts | None = None,
               paced: PaceFigures | None = None, bill: BillFigures | None = None,
               production: ProductionTracker | None = None,
               replica: ReplicaHealth | None = None) -> bytes:
    """The whole exposition text of one scrape (run it with ``Store.read``)."""
    return generate_latest(registry(reads, now, guard, paced, bill, production, replica))
