"""GET /metrics: Prometheus text that prometheus_client parses,
per-GPU series named after dcgm-exporter's, escaped labels, and the token rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import parser  # a test dependency: never skip these silently

from vast_manager.coordinator.store.writer import Store
from vast_manager.coordinator.web.metrics import MAX_LABEL_CHARS, exposition, label_text

from support.coord_support import ADMIN, ADMIN_TOKEN, Harness, hello_msg, start, telemetry_msg
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
HOSTILE_GPU = 'RTX "4090" \\ {evil="1"}\nnext line'
GPU_METRICS = (
    "vm_gpu_utilization_percent", "vm_gpu_pcie_tx_bytes_per_second",
    "vm_gpu_pcie_rx_bytes_per_second", "vm_gpu_power_watts", "vm_gpu_temperature_celsius",
    "vm_gpu_sm_clock_mhz", "vm_gpu_fb_used_bytes", "vm_gpu_clocks_event_reasons",
)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


async def scrape(h: Harness, headers: dict[str, str] | None = ADMIN) -> tuple[int, str, Any]:
    resp = await h.client.get("/metrics", headers=headers or {})
    return resp.status, await resp.text(), resp


def two_gpu_telemetry() -> dict[str, Any]:
    tele = telemetry_msg()
    first = tele["gpus"][0]
    tele["gpus"] = [
        {**first, "index": 0, "util_pct_mean": 91.5, "pcie_tx_kbps_mean": 2_000_000.0,
         "pcie_rx_kbps_mean": 6_000_000.0, "throttle_reasons": 4},
        {**first, "index": 1, "util_pct_mean": 12.0, "power_w_mean": None},
    ]
    tele["cuzk"] = {"samples": 3, "workers": [{"gpu_ordinal": 0, "busy_pct": 88.0}],
                    "synthesis_active_mean": 4.0, "synthesis_max": 8, "queue_depth_mean": 2.5,
                    "memory_used_bytes_max": 10**11, "memory_total_bytes": 2 * 10**11}
    return tele


async def running_fleet(h: Harness) -> dict[str, Any]:
    """A signed agent, through the real app: hello with two GPUs (one with a hostile
    name), then a proving heartbeat with telemetry; the instance gets a price and rate."""
    agent = await h.issue("rig-metrics", gpus=2)
    hello = hello_msg(gpus=2)
    hello["host"]["gpus"][1]["name"] = HOSTILE_GPU
    assert (await agent.post("/v1/hello", hello))[0] == 200
    agent.seq += 1
    beat = {"seq": agent.seq, "phase": "proving", "phase_started_at": h.clock() - 10,
            "progress": None, "proofs_completed_total": 7, "proof_seconds_recent": [],
            "telemetry": two_gpu_telemetry()}
    status, answer = await agent.post("/v1/heartbeat", beat)
    assert status == 200, answer
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None

    def job(tx: Any) -> None:
        tx.instances.update(inst["id"], state="proving", dph_total=0.5, rate_per_hour=50.0)

    await h.store.write(job)
    return inst


async def test_metrics_parse_and_carry_per_gpu_series(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    h = await start(aiohttp_client, tmp_path)
    inst = await running_fleet(h)
    status, text, resp = await scrape(h)
    assert status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    fams = families(text)
    for name in GPU_METRICS:
        assert name in fams and fams[name].type == "gauge", name
    util = {s.labels["gpu"]: s for s in fams["vm_gpu_utilization_percent"].samples}
    assert set(util) == {"0", "1"}
    assert util["0"].value == 91.5 and util["1"].value == 12.0
    assert util["0"].labels == {"instance_id": str(inst["id"]), "machine_id": "rig-metrics",
                                "gpu": "0", "gpu_name": "RTX 4090"}
    # The hostile name round-trips through the escaping (its line break shown as a space,
    # as everywhere host text is shown), and forges no label.
    assert util["1"].labels["gpu_name"] == "other"  # a host's own name makes no series
    assert set(util["1"].labels) == {"instance_id", "machine_id", "gpu", "gpu_name"}
    tx = {s.labels["gpu"]: s.value for s in fams["vm_gpu_pcie_tx_bytes_per_second"].samples}
    rx = {s.labels["gpu"]: s.value for s in fams["vm_gpu_pcie_rx_bytes_per_second"].samples}
    assert tx["0"] == 2e9 and rx["0"] == 6e9  # NVML KB/s -> bytes/s
    power = {s.labels["gpu"]: s.value for s in fams["vm_gpu_power_watts"].samples}
    assert power == {"0": 400.0}  # GPU 1 did not say: no sample rather than a made-up 0
    reasons = {s.labels["gpu"]: s.value for s in fams["vm_gpu_clocks_event_reasons"].samples}
    assert reasons["0"] == 4
    # Fleet gauges.
    states = {s.labels["state"]: s.value for s in fams["vm_instances"].samples}
    assert states["proving"] == 1 and states["destroyed"] == 0
    assert fams["vm_fleet_proofs_per_hour"].samples[0].value == 50.0
    assert fams["vm_fleet_dollars_per_hour"].samples[0].value == 0.5
    assert fams["vm_fleet_dollars_per_proof"].samples[0].value == pytest.approx(0.01)
    assert fams["vm_cuzk_queue_depth"].samples[0].value == 2.5
    busy = fams["vm_cuzk_worker_busy_percent"].samples[0]
    assert busy.labels["gpu"] == "0" and busy.value == 88.0


async def test_gone_instances_drop_their_gpu_series(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    inst = await running_fleet(h)

    def job(tx: Any) -> None:
        tx.instances.update(inst["id"], state="destroyed")

    await h.store.write(job)
    fams = families((await scrape(h))[1])
    assert fams["vm_gpu_utilization_percent"].samples == []
    assert fams["vm_fleet_dollars_per_hour"].samples[0].value == 0
    assert fams["vm_fleet_dollars_per_proof"].samples == []  # undefined while nothing proves


async def test_metrics_need_the_token_unless_public(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    assert (await scrape(h, headers=None))[0] == 401
    assert (await scrape(h, headers={"Authorization": "Bearer wrong-token-0123456789"}))[0] == 401
    assert (await scrape(h))[0] == 200
    resp = await h.client.post("/auth/login", json={"token": ADMIN_TOKEN})
    assert resp.status == 200
    assert (await scrape(h, headers=None))[0] == 200  # the dashboard session counts too


async def test_metrics_public(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path / "public", metrics_public=True)
    status, text, _ = await scrape(h, headers=None)
    assert status == 200 and "vm_instances" in families(text)
    # Only /metrics opens up; the operator API still needs the token.
    assert (await h.client.get("/api/instances")).status == 401


@pytest.mark.parametrize(
    ("raw", "shown"),
    [('a"b', 'a"b'), ("a\\b", "a\\b"), ("a\nb", "a b"), ("a\x00\rb", "a\\u0000 b"),
     ("rig\u202egnp", "rig\\u202egnp"), ("x\u009b31m", "x\\u009b31m"), (None, ""), (7, "7"),
     ("g" * 300, "g" * MAX_LABEL_CHARS)],
)
def test_label_text(raw: Any, shown: str) -> None:
    assert label_text(raw) == shown


HOSTILE_LABELS = ('RTX "4090"', "back\\slash", "line\nbreak", 'x} vm_bad_hosts 1e9 #{y="',
                  "rig\u202egnp\x1b[2J", "trailing\\")


@pytest.mark.parametrize("raw", HOSTILE_LABELS)
def test_label_values_round_trip_through_the_exposition(tmp_path: Path, raw: str) -> None:
    """What the library writes, its parser reads back as the neutralised text: no label
    forged, no sample added, whatever the host named its GPU."""
    store = Store(tmp_path / "coord.db")
    try:
        store.write_blocking(lambda tx: tx.instances.add({
            "agent_id": "ag_" + "1" * 20, "label": "rig", "kind": "byo", "state": "proving",
            "machine_id": raw, "gpu_name": raw, "num_gpus": 1, "dph_total": 0.5,
            "rate_per_hour": 10.0, "created_at": 1.0}))
        fams = families(exposition(store, 2.0).decode())
    finally:
        store.close()
    (sample,) = fams["vm_instance_proofs_per_hour"].samples
    assert sample.labels == {"instance_id": "1", "machine_id": label_text(raw),
                             "gpu_name": "other", "state": "proving"}  # not the host's text
    assert sample.value == 10.0
    assert fams["vm_bad_hosts"].samples[0].value == 0


def test_grafana_dashboard_uses_our_metrics() -> None:
    from vast_manager.coordinator.web.metrics import GPU_GAUGES

    board = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = " ".join(
        target.get("expr", "")
        for panel in board["panels"]
        for target in panel.get("targets", [])
    )
    for name in ("vm_gpu_utilization_percent", "vm_gpu_pcie_tx_bytes_per_second",
                 "vm_gpu_pcie_rx_bytes_per_second", "vm_gpu_power_watts",
                 "vm_gpu_temperature_celsius", "vm_fleet_proofs_per_hour",
                 "vm_fleet_dollars_per_hour", "vm_fleet_dollars_per_proof", "vm_instances"):
        assert name in exprs, name
    known = {name for name, *_ in GPU_GAUGES}
    for word in exprs.replace("(", " ").replace(")", " ").replace("{", " ").split():
        if word.startswith("vm_gpu_"):
            assert word in known, word


async def test_the_exposition_is_the_libraries_on_a_registry_of_its_own(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """prometheus_client writes it: the guard's counters as counters, the coordinator
    process's own series beside the fleet's, and nothing on the library's global
    registry (whatever else in the process registers there stays out of our scrape)."""
    from prometheus_client import REGISTRY

    h = await start(aiohttp_client, tmp_path)
    assert (await scrape(h, headers={"Authorization": "Bearer wrong-token-0123456789"}))[0] == 401
    fams = families((await scrape(h))[1])
    refused = {s.labels["code"]: s.value for s in fams["vm_refused_requests"].samples}
    assert fams["vm_refused_requests"].type == "counter" and refused["unauthorized"] == 1
    assert fams["vm_malformed_requests"].type == "counter"
    assert fams["vm_log_lines_suppressed"].samples[0].name == "vm_log_lines_suppressed_total"
    assert fams["vm_request_body_bytes_in_flight"].samples[0].value == 0
    assert fams["process_resident_memory_bytes"].samples[0].value > 0
    assert "python_info" in fams
    assert fams["vm_scrape_timestamp_seconds"].samples[0].value == h.clock()
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("vm_")]
