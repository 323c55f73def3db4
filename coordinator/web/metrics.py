"""``GET /metrics``: the fleet and its GPUs in the Prometheus text exposition format.

Per-GPU gauges are named after their dcgm-exporter counterparts so a Grafana
user finds them by analogy (``vm_gpu_utilization_percent`` ~
``DCGM_FI_DEV_GPU_UTIL``) and carry ``instance_id``, ``machine_id``, ``gpu``
and ``gpu_name``. Values come from each live instance's latest telemetry;
a number the host could not measure is left out rather than faked. Every
label value is host-sent text and is escaped per the exposition format.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vast_manager.coordinator.decisions import policy, states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.schema import Row, loads
from vast_manager.coordinator.textsafe import neutralise
from vast_manager.coordinator.web.guard import Guard

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_LABEL_CHARS = 256
INSTANCE_STATES: tuple[str, ...] = tuple(State)
# Instances whose telemetry describes a machine working now.
LIVE_STATES = states.ACTIVE_PHASES

Labels = tuple[tuple[str, str], ...]


def escape_label_value(value: Any) -> str:
    """Host text neutralised (``render.neutralise``: control and bidi characters read as
    escapes), cut to ``MAX_LABEL_CHARS``, then backslash, double quote and newline
    escaped as the exposition format says."""
    text = "" if value is None else neutralise(str(value))[:MAX_LABEL_CHARS]
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


@dataclass(slots=True)
class Family:
    name: str
    help: str
    kind: str = "gauge"
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, value: Any, labels: Labels = ()) -> None:
        if value is None or isinstance(value, bool):
            return
        try:
            number = float(value)
        except (TypeError, ValueError):
            return
        self.samples.append((labels, number))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        for labels, value in self.samples:
            if labels:
                inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
                lines.append(f"{self.name}{{{inner}}} {format_value(value)}")
            else:
                lines.append(f"{self.name} {format_value(value)}")
        return "\n".join(lines)


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


def _gpu_names(inst: Row) -> dict[int, str]:
    host = loads(inst.get("host_json")) or {}
    names: dict[int, str] = {}
    for gpu in host.get("gpus") or []:
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
            names[gpu["index"]] = str(gpu.get("name") or "")
    return names


def _scale(value: Any, factor: float) -> Any:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value * factor


def collect(reads: Reads, now: float) -> list[Family]:
    """Every metric family, from the store's current state."""
    instances = reads.list_instances()
    by_state = Family("vm_instances", "Instances by state.")
    counts = dict.fromkeys(INSTANCE_STATES, 0)
    for inst in instances:
        state = str(inst.get("state") or "unknown")
        counts[state] = counts.get(state, 0) + 1
    for state, n in counts.items():
        by_state.add(n, (("state", state),))

    billing = [i for i in instances if i.get("state") not in states.GONE]
    proving = [i for i in billing if i.get("state") == "proving"]
    dollars_per_hour = sum(float(i.get("dph_total") or 0.0) for i in billing)
    proofs_per_hour = sum(float(i.get("rate_per_hour") or 0.0) for i in proving)
    fleet = [
        Family("vm_fleet_proofs_per_hour",
               "Proofs per hour of the proving instances (their measured rates)."),
        Family("vm_fleet_dollars_per_hour", "Price per hour of every instance that bills."),
        Family("vm_fleet_dollars_per_proof",
               "Fleet price per hour over proofs per hour (absent while nothing proves)."),
        Family("vm_bad_hosts", "Machines on the blocklist."),
    ]
    fleet[0].add(proofs_per_hour)
    fleet[1].add(dollars_per_hour)
    if proofs_per_hour > 0:
        fleet[2].add(dollars_per_hour / proofs_per_hour)
    fleet[3].add(len(reads.bad_hosts()))

    inst_fams = {
        "rate": Family("vm_instance_proofs_per_hour", "Measured proofs per hour of an instance."),
        "dph": Family("vm_instance_dollars_per_hour", "Price per hour of an instance."),
        "usd": Family("vm_instance_dollars_per_proof", "Price per proof of an instance."),
        "proofs": Family("vm_instance_proofs_completed",
                         "Proofs the instance's cuzk daemon completed (resets on reboot)."),
        "seen": Family("vm_instance_last_seen_timestamp_seconds",
                       "Unix time of the instance's last heartbeat."),
        "gpus": Family("vm_instance_gpus", "GPUs of an instance."),
    }
    gpu_fams = [Family(name, help_text) for name, help_text, _, _ in GPU_GAUGES]
    host_fams = {
        "cpu": Family("vm_host_cpu_utilization_percent", "Host CPU busy, mean, percent."),
        "load1": Family("vm_host_load1", "Host one-minute load average."),
        "ram": Family("vm_host_ram_used_bytes", "Host RAM used, bytes."),
        "tele_ts": Family("vm_instance_telemetry_timestamp_seconds",
                          "Unix time the latest telemetry arrived."),
    }
    cuzk_fams = {
        "queue": Family("vm_cuzk_queue_depth", "cuzk queue depth, mean over the window."),
        "synth": Family("vm_cuzk_synthesis_active", "cuzk synthesis tasks active, mean."),
        "mem": Family("vm_cuzk_memory_used_bytes", "cuzk memory used, highest of the window."),
        "busy": Family("vm_cuzk_worker_busy_percent", "cuzk GPU worker busy, percent."),
    }
    for inst in billing:
        base: Labels = (
            ("instance_id", str(inst["id"])),
            ("machine_id", str(inst.get("machine_id") or "")),
            ("gpu_name", str(inst.get("gpu_name") or "")),
            ("state", str(inst.get("state") or "")),
        )
        inst_fams["rate"].add(inst.get("rate_per_hour"), base)
        inst_fams["dph"].add(inst.get("dph_total"), base)
        inst_fams["usd"].add(policy.usd_per_proof(inst.get("dph_total"),
                                                  inst.get("rate_per_hour")), base)
        inst_fams["proofs"].add(inst.get("proofs_completed_total"), base)
        inst_fams["seen"].add(inst.get("last_seen"), base)
        inst_fams["gpus"].add(inst.get("num_gpus"), base)
        if inst.get("state") not in LIVE_STATES:
            continue
        tele_row = reads.latest_telemetry(int(inst["id"]))
        tele = loads(tele_row["telemetry_json"]) if tele_row else None
        if not isinstance(tele, dict):
            continue
        host_labels: Labels = (
            ("instance_id", str(inst["id"])),
            ("machine_id", str(inst.get("machine_id") or "")),
        )
        assert tele_row is not None
        host_fams["tele_ts"].add(tele_row.get("received_at"), host_labels)
        cpu = tele.get("cpu") or {}
        host_fams["cpu"].add(cpu.get("util_pct_mean"), host_labels)
        host_fams["load1"].add(cpu.get("load1"), host_labels)
        host_fams["ram"].add((tele.get("ram") or {}).get("used_bytes"), host_labels)
        names = _gpu_names(inst)
        for gpu in tele.get("gpus") or []:
            if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
                continue
            index = gpu["index"]
            labels: Labels = (
                ("instance_id", str(inst["id"])),
                ("machine_id", str(inst.get("machine_id") or "")),
                ("gpu", str(index)),
                ("gpu_name", names.get(index) or str(inst.get("gpu_name") or "")),
            )
            for fam, (_, _, key, factor) in zip(gpu_fams, GPU_GAUGES, strict=True):
                fam.add(_scale(gpu.get(key), factor), labels)
        cuzk = tele.get("cuzk")
        if isinstance(cuzk, dict):
            cuzk_fams["queue"].add(cuzk.get("queue_depth_mean"), host_labels)
            cuzk_fams["synth"].add(cuzk.get("synthesis_active_mean"), host_labels)
            cuzk_fams["mem"].add(cuzk.get("memory_used_bytes_max"), host_labels)
            for worker in cuzk.get("workers") or []:
                if isinstance(worker, dict) and isinstance(worker.get("gpu_ordinal"), int):
                    cuzk_fams["busy"].add(
                        worker.get("busy_pct"),
                        (*host_labels, ("gpu", str(worker["gpu_ordinal"]))),
                    )
    scrape = Family("vm_scrape_timestamp_seconds", "Unix time of this scrape.")
    scrape.add(now)
    return [by_state, *fleet, *inst_fams.values(), *gpu_fams, *host_fams.values(),
            *cuzk_fams.values(), scrape]


def guard_families(guard: Guard) -> list[Family]:
    """What the coordinator refused since it started (``vast_manager.coordinator.web.guard``)."""
    refused = Family("vm_refused_requests_total",
                     "Requests refused before their body was used, by error code.", "counter")
    for code, n in sorted(guard.counters.refused.items()):
        refused.add(n, (("code", code),))
    malformed = Family("vm_malformed_requests_total",
                       "Requests the HTTP parser refused, by kind.", "counter")
    for kind, n in sorted(guard.counters.malformed.items()):
        malformed.add(n, (("kind", kind),))
    suppressed = Family("vm_log_lines_suppressed_total",
                        "Log lines about refused traffic left out by the rate limit "
                        "(counted here instead).", "counter")
    suppressed.add(guard.counters.suppressed_log_lines)
    in_flight = Family("vm_request_body_bytes_in_flight",
                       "Request-body bytes held in memory now (bounded in total).")
    in_flight.add(guard.budget.in_flight_bytes)
    return [refused, malformed, suppressed, in_flight]


def render(families: Iterable[Family]) -> str:
    return "\n".join(f.render() for f in families) + "\n"


def render_metrics(reads: Reads, clock: Callable[[], float], guard: Guard | None = None) -> str:
    """The whole exposition text for one scrape."""
    families = collect(reads, clock())
    if guard is not None:
        families += guard_families(guard)
    return render(families)
