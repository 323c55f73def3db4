"""Measurements in and out (``hosts import`` / ``hosts export``), the plan and the model,
through the real app and the CLI. Every rate here is simulated."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.discovery.measurements import MAX_IMPORT_BYTES
from vast_manager.coordinator.providers.local.catalog import catalog_offers

from support.coord_support import (
    ADMIN,
    ADMIN_TOKEN,
    Harness,
    ServerThread,
    database_before_migration,
    result_msg,
    start,
)
from support.discovery_support import measurements
from support.fakes_provider import FakeProvider
from support.paths import REPO_ROOT


def lines_of(n: int, seed: int = 1, since: float = 1_799_000_000.0) -> list[dict[str, Any]]:
    """n measurements in the issue's shape (no source), oldest first, from ``since`` (the
    fake clock starts later)."""
    out = []
    for i, m in enumerate(measurements(n, seed=seed, runs=2)):
        out.append({"machine_id": m.machine_id, "offer": dict(m.offer.raw),
                    "rate_per_hour": round(m.rate_per_hour, 3),
                    "measured_at": since + 60 * i})
    return out


def jsonl(rows: list[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


async def post_import(h: Harness, body: bytes) -> tuple[int, Any]:
    resp = await h.client.post("/api/hosts/import", data=body,
                               headers={**ADMIN, "Content-Type": "application/x-ndjson"})
    return resp.status, orjson.loads(await resp.read())


async def export(h: Harness, query: str = "") -> list[dict[str, Any]]:
    resp = await h.client.get("/api/hosts/export" + query, headers=ADMIN)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/x-ndjson")
    return [orjson.loads(line) for line in (await resp.read()).splitlines()]


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path) -> Harness:
    return await start(aiohttp_client, tmp_path, provider=FakeProvider(catalog_offers()))


async def test_import_then_export_gives_back_the_same_measurements(h: Harness) -> None:
    rows = lines_of(30)
    status, answer = await post_import(h, jsonl(rows))
    assert status == 200, answer
    assert answer["imported"] == 30 and answer["duplicates"] == 0
    assert await export(h) == [{**r, "source": "imported"} for r in rows]
    # They count in host_perf like the fleet's own, marked imported ...
    perf = h.store.host_perf()
    assert sum(p["samples"] for p in perf) == 30
    assert all(p["imported_samples"] == p["samples"] for p in perf)
    # ... and in the rate model.
    fitted = await h.core.models.refresh()
    assert fitted.model.n_measurements == 30 and fitted.imported == 30
    assert (await h.core.models.current()) is fitted


async def test_the_binding_resource_seen_is_kept_exported_and_read_by_the_model(
        h: Harness) -> None:
    rows = lines_of(6)
    for r, seen in zip(rows, ("cpu", "pcie", "gpu", "memory", None), strict=False):
        if seen is not None:
            r["bottleneck"] = seen
    assert (await post_import(h, jsonl(rows)))[0] == 200
    assert await export(h) == [{**r, "source": "imported"} for r in rows]
    assert [r.get("bottleneck") for r in await export(h)] == [
        "cpu", "pcie", "gpu", "memory", None, None]
    # The fit reads the CPU's and the link's (docs/discovery.md, section 2).
    fitted = await h.core.models.refresh()
    assert fitted.summary()["bindings_seen"] == 2


async def test_the_same_file_twice_adds_nothing(h: Harness) -> None:
    body = jsonl(lines_of(10))
    assert (await post_import(h, body))[0] == 200
    perf = h.store.host_perf()
    status, answer = await post_import(h, body)
    assert status == 200 and answer["imported"] == 0 and answer["duplicates"] == 10
    assert h.store.host_perf() == perf
    assert len(h.store.measurements()) == 10


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda r: r["offer"].update(num_gpus=0), "offer.num_gpus", "positive number, not 0"),
    (lambda r: r.pop("rate_per_hour"), "rate_per_hour", "must be a number"),
    (lambda r: r.update(rate_per_hour=-4.0), "rate_per_hour", "above 0"),
    (lambda r: r.update(rate_per_hour=5000.0), "rate_per_hour", "plausibility limit"),
    (lambda r: r.update(measured_at=4_000_000_000.0), "measured_at", "in the future"),
    (lambda r: r.update(machine_id="rig\x1b[2J"), "machine_id", "plain text"),
    (lambda r: r.update(offer="RTX 4090"), "offer", "vast.ai offer fields"),
    (lambda r: r.update(source="mine"), "source", "fleet, imported"),
    (lambda r: r.update(bottleneck="disk"), "bottleneck", "gpu, cpu, pcie, memory or null"),
])
async def test_a_malformed_line_names_its_number_and_field_and_writes_nothing(
    h: Harness, change: Any, field: str, words: str
) -> None:
    rows = lines_of(5)
    change(rows[2])
    before = h.store.count_rows(), h.store.content_digest()
    status, answer = await post_import(h, jsonl(rows))
    assert status == 400, answer
    assert answer["error"] == "invalid_measurement"
    assert answer["line"] == 3 and answer["field"] == field
    assert answer["message"].startswith(f"Line 3, field {field}: ") and words in answer["message"]
    assert (h.store.count_rows(), h.store.content_digest()) == before


async def test_lines_that_are_not_measurements(h: Harness) -> None:
    before = h.store.count_rows(), h.store.content_digest()
    good = jsonl(lines_of(2))
    for body, line in ((good + b"{not json\n", 3), (b"\n\n[1, 2]\n", 3)):
        status, answer = await post_import(h, body)
        assert status == 400 and answer["line"] == line, answer
    status, answer = await post_import(h, b"\n \n")
    assert status == 400 and answer["field"] == "body"
    resp = await h.client.post("/api/hosts/import", data=b"x" * (MAX_IMPORT_BYTES + 1),
                               headers=ADMIN)
    assert resp.status == 413
    assert (h.store.count_rows(), h.store.content_digest()) == before
    assert (await h.client.post("/api/hosts/import", data=good)).status == 401


async def test_export_by_source(h: Harness) -> None:
    await post_import(h, jsonl(lines_of(4)))
    assert len(await export(h, "?source=imported")) == 4
    assert await export(h, "?source=fleet") == []
    resp = await h.client.get("/api/hosts/export?source=other", headers=ADMIN)
    assert resp.status == 400


async def test_the_plan_proposes_trials_with_their_numbers_and_stops_when_none_pays(
    h: Harness,
) -> None:
    await post_import(h, jsonl(lines_of(40)))
    await h.core.models.refresh()
    status, plan = await h.admin("GET", "/api/plan?trials=3")
    assert status == 200, plan
    assert 1 <= len(plan["proposals"]) <= 3
    assert plan["model"]["measurements"] == 40
    for p in plan["proposals"]:
        assert p["predicted_rate_low"] < p["predicted_rate_per_hour"] < p["predicted_rate_high"]
        assert p["break_even_rate_per_hour"] == pytest.approx(p["dph_total"] / 0.008, rel=1e-3)
        assert 0 <= p["probability_passes"] <= 1 and p["expected_value_usd"] > 0
        assert p["trial_cost_usd"] > 0
        hypothesis = p["hypothesis"]
        assert f"{p['num_gpus']}x {p['gpu_name']}" in hypothesis
        assert f"break-even {p['break_even_rate_per_hour']:.0f}/h" in hypothesis
        assert (f"predicted {p['predicted_rate_low']:.0f}-{p['predicted_rate_high']:.0f}/h"
                in hypothesis)
    # Too small a budget for any trial: nothing proposed, and why.
    status, broke = await h.admin("GET", "/api/plan?budget_usd=0.001")
    assert status == 200 and broke["proposals"] == []
    assert "budget" in broke["stop_reason"]
    for bad in ("trials=0", "trials=x", "budget_usd=-1"):
        assert (await h.admin("GET", "/api/plan?" + bad))[0] == 400


async def test_from_nothing_proving_the_plan_judges_against_the_best_fleet_on_offer(
    aiohttp_client: Any, tmp_path: Path,
) -> None:
    """With no fleet and no autopilot the reference is what renting the best hosts on
    offer would cost per proof (the last of them; the local catalog is small, so a fleet
    of 3), by the model's predictions: not the verdict's cap, which is several times any
    good host's and favours big machines."""
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(catalog_offers()),
                    plan_fleet_hosts=3)
    await post_import(h, jsonl(lines_of(40)))
    await h.core.models.refresh()
    status, plan = await h.admin("GET", "/api/plan?trials=3")
    assert status == 200, plan
    status, offers = await h.admin("GET", "/api/offers")
    assert status == 200
    per_machine: dict[str, float] = {}
    for o in offers:
        if o.get("predicted_rate_per_hour") and not o.get("bad_host") and not o.get("too_small"):
            usd = o["dph_total"] / o["predicted_rate_per_hour"]
            key = str(o["machine_id"])
            per_machine[key] = min(usd, per_machine.get(key, usd))
    third = sorted(per_machine.values())[2]
    assert plan["reference_usd_per_proof"] == pytest.approx(third, rel=1e-4)  # rates rounded
    assert plan["reference_usd_per_proof"] < 0.008
    assert plan["reference_source"].startswith("the last host of the best 3-host fleet")


async def test_nothing_worth_its_cost_proposes_nothing(aiohttp_client: Any,
                                                        tmp_path: Path) -> None:
    dear = [{**o, "dph_total": 4.5} for o in catalog_offers()]
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(dear))
    await post_import(h, jsonl(lines_of(60)))  # enough to be sure no offer makes 560/h
    await h.core.models.refresh()
    status, plan = await h.admin("GET", "/api/plan")
    assert status == 200 and plan["proposals"] == []
    assert plan["stop_reason"].startswith("nothing is worth its cost")


async def test_the_model_endpoint_says_what_it_learned(h: Harness) -> None:
    await post_import(h, jsonl(lines_of(20)))
    await h.core.models.refresh()
    status, summary = await h.admin("GET", "/api/model")
    assert status == 200
    assert summary["measurements"] == 20 and summary["imported"] == 20
    assert summary["skipped"] == 0 and summary["machines"] == 10
    assert "rtx 4090" in summary["gpu_models"] or summary["gpu_models"]
    # A new host's interval scale, for all and for the hosts each capacity binds.
    assert summary["interval_scales"]
    assert set(summary["interval_scales"]) <= {"gpu", "cpu", "pcie", "memory"}


# --- the CLI -----------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path, FakeProvider(catalog_offers())) as s:
        yield s


def run_cli(server: ServerThread, *args: str) -> Any:
    env = {"VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_cli_hosts_import_export_plan(server: ServerThread, tmp_path: Path) -> None:
    rows = lines_of(12, since=time.time() - 86400)
    source = tmp_path / "earlier.jsonl"
    source.write_bytes(jsonl(rows))
    done = run_cli(server, "hosts", "import", str(source))
    assert done.exit_code == 0, done.output
    assert "Imported 12 measurement(s)" in done.output
    out = tmp_path / "out.jsonl"
    done = run_cli(server, "hosts", "export", "-o", str(out))
    assert done.exit_code == 0, done.output
    assert [orjson.loads(x) for x in out.read_bytes().splitlines()] == [
        {**r, "source": "imported"} for r in rows]
    listing = run_cli(server, "hosts")
    assert listing.exit_code == 0 and "IMPORTED" in listing.output
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(rows[:1]) + b'{"machine_id": 1}\n')
    done = run_cli(server, "hosts", "import", str(bad))
    assert done.exit_code == 1
    assert done.output.strip() == ("Error: Line 2, field offer: offer must be an object of "
                                   "vast.ai offer fields.")
    plan = run_cli(server, "plan", "--trials", "2")
    assert plan.exit_code == 0, plan.output
    assert "PRED/H (80%)" in plan.output and "break-even" in plan.output
    assert "-host fleet on offer" in " ".join(plan.output.split())
    offers = run_cli(server, "offers")
    assert offers.exit_code == 0 and "PRED/H (80%)" in offers.output
    data = orjson.loads(run_cli(server, "offers", "--json").output)
    assert all("predicted_rate_low" in o and "predicted_rate_high" in o for o in data)
    status = run_cli(server, "autopilot", "status")
    assert status.exit_code == 0 and "not configured" in status.output
    started = run_cli(server, "autopilot", "start")
    assert started.exit_code == 1 and "not configured" in started.output
    stopped = run_cli(server, "autopilot", "stop", "--reason", "not today")
    # No autopilot runs here: a stop that claimed success would claim what did not happen.
    assert stopped.exit_code == 1 and "runs no autopilot" in stopped.output


def test_cli_hosts_import_dry_run_shows_the_moves_and_writes_nothing(
    server: ServerThread, tmp_path: Path,
) -> None:
    rows = lines_of(12, since=time.time() - 86400)
    source = tmp_path / "earlier.jsonl"
    source.write_bytes(jsonl(rows))
    done = run_cli(server, "hosts", "import", "--dry-run", str(source))
    assert done.exit_code == 0, done.output
    assert done.output.startswith("Dry run: 12 measurement(s) read; nothing was written.")
    assert "RANK AFTER" in done.output and "RATE/H AFTER" in done.output
    data = orjson.loads(run_cli(server, "hosts", "import", "--dry-run", "--json",
                                str(source)).output)
    assert data["dry_run"] is True and data["imported"] == 0 and data["moves"]
    assert all(set(m) >= {"offer_id", "rank_before", "rank_after", "rate_before",
                          "rate_after"} for m in data["moves"])
    listing = run_cli(server, "hosts")
    assert listing.exit_code == 0 and "No host measured yet." in listing.output


# --- the fleet's own measurements --------------------------------------------------------


def test_migration_6_keeps_earlier_results_as_measurements_with_their_hardware(
    tmp_path: Path,
) -> None:
    """A database from before measurements: every counted benchmark becomes a fleet
    measurement, its offer rebuilt from its instance (a deployed one's columns, a
    bring-your-own agent's hello)."""
    from vast_manager.coordinator.store.writer import Store

    path = tmp_path / "old.sqlite"
    db = database_before_migration(path, 6)
    host = {"hostname": "rig", "cpu_model": "AMD Ryzen 9 7950X 16-Core Processor",
            "cpu_cores_logical": 32, "cpu_cores_physical": 16, "ram_total_bytes": 192e9,
            "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "pcie_gen_max": 4,
                      "pcie_width_max": 16, "pcie_width_current": 16}]}
    db["instances"].insert_all([
        {"id": 1, "agent_id": "ag_" + "1" * 20, "kind": "deployed", "state": "proving",
         "machine_id": "41001", "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.42,
         "cpu_name": "AMD EPYC 7543", "cpu_cores": 64, "cpu_cores_effective": 32.0,
         "cpu_ram": 515000, "pcie_bw": 24.0, "created_at": 1.0},
        {"id": 2, "agent_id": "ag_" + "2" * 20, "kind": "byo", "state": "proving",
         "machine_id": "rig", "gpu_name": "NVIDIA GeForce RTX 4090", "num_gpus": 1,
         "host_json": orjson.dumps(host).decode(), "created_at": 1.0},
    ])
    for rid, iid, machine, gpu, rate, counts in ((1, 1, "41001", "RTX 4090", 61.4, 1),
                                                 (2, 2, "rig", "NVIDIA GeForce RTX 4090",
                                                  55.0, 1),
                                                 (3, 1, "41001", "RTX 4090", 99.0, 0)):
        db["results"].insert({
            "id": rid, "agent_id": "ag_" + "1" * 20, "result_id": f"r{rid}",
            "instance_id": iid, "kind": "benchmark", "recomputed_rate_per_hour": rate,
            "counts_for_host_perf": counts, "machine_id": machine, "gpu_name": gpu,
            "num_gpus": 1, "received_at": 100.0 + rid, "directive_json": "{}"})
    db.conn.close()
    store = Store(path)
    try:
        deployed, byo = store.measurements()
        assert (deployed["machine_id"], deployed["rate_per_hour"]) == ("41001", 61.4)
        offer = orjson.loads(deployed["offer_json"])
        assert (offer["cpu_cores"], offer["cpu_cores_effective"], offer["cpu_ram"]) == (
            64, 32.0, 515000)
        assert byo["source"] == "fleet" and byo["measured_at"] == 102.0
        rig = orjson.loads(byo["offer_json"])
        assert (rig["gpu_name"], rig["cpu_cores_effective"], rig["machine_id"]) == (
            "RTX 4090", 32, "rig")
    finally:
        store.close()


async def test_a_bring_your_own_result_is_kept_with_its_hosts_hardware_out_of_the_model(
    h: Harness,
) -> None:
    agent = await h.issue("garage-rig", min_rate=1.0)
    assert (await agent.hello())[0] == 200
    await agent.heartbeat("benchmarking")
    h.clock.advance(1300)
    status, data = await agent.post("/v1/result", result_msg("r-1", proofs=20,
                                                             wall_seconds=1200.0,
                                                             finished_at=h.clock()))
    assert status == 200, data
    (m,) = h.store.measurements()
    offer = orjson.loads(m["offer_json"])
    assert (m["machine_id"], m["source"], m["rate_per_hour"]) == ("garage-rig", "fleet", 60.0)
    assert (offer["gpu_name"], offer["num_gpus"], offer["cpu_cores_effective"],
            offer["cpu_ram"]) == ("RTX 4090", 1, 96, 257000.0)
    # Its CPU and RAM are its hello's word: host_perf shows it, the rate model leaves it
    # out (docs/reliability.md, "Bring-your-own hardware").
    assert m["host_reported"] == 1
    assert [p["machine_id"] for p in h.store.host_perf()] == ["garage-rig"]
    fitted = await h.core.models.refresh()
    assert fitted.model.n_measurements == 0 and "garage-rig" not in fitted.model.machines


async def test_numbers_given_as_text_are_read_as_the_model_reads_them(h: Harness) -> None:
    (row,) = lines_of(1)
    row["offer"] = {**row["offer"], "num_gpus": "1.0", "gpu_name": "NVIDIA GeForce RTX 4090"}
    status, answer = await post_import(h, jsonl([row]))
    assert status == 200 and answer["imported"] == 1, answer
    (perf,) = h.store.host_perf()
    assert (perf["gpu_name"], perf["num_gpus"]) == ("RTX 4090", 1)
    assert await export(h) == [{**row, "source": "imported"}]


def test_hosts_export_to_a_terminal_shows_host_text_escaped(server: ServerThread,
                                                            tmp_path: Path) -> None:
    """A terminal gets JSON escapes for every unsafe character (tags, bidi, ESC); a file
    or a pipe gets the exact bytes the coordinator sent."""
    rows = lines_of(2, since=time.time() - 86400)
    hostile = "RTX 4090\x1b[2J\x1b[H[OK] fake line\u202e" + "".join(
        chr(0xE0000 + ord(c)) for c in "hi")
    rows[0]["offer"]["cpu_name"] = hostile
    source = tmp_path / "hostile.jsonl"
    source.write_bytes(jsonl(rows))
    assert run_cli(server, "hosts", "import", str(source)).exit_code == 0
    exact = tmp_path / "exact.jsonl"
    assert run_cli(server, "hosts", "export", "-o", str(exact)).exit_code == 0
    exact_bytes = exact.read_bytes()
    assert "\u202e".encode() in exact_bytes  # as the coordinator sent it (orjson: raw)
    assert hostile in {orjson.loads(line)["offer"].get("cpu_name")
                       for line in exact_bytes.splitlines()}
    leader, follower = pty.openpty()
    env = {**os.environ, "VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN,
           "PYTHONPATH": str(REPO_ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "vast_manager.coordinator.cli", "hosts",
                           "export"], stdout=follower, stderr=subprocess.PIPE, env=env,
                          timeout=120)
    os.close(follower)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the pty is drained
        while chunk := os.read(leader, 65536):
            shown += chunk
    os.close(leader)
    assert proc.returncode == 0, proc.stderr
    assert shown.isascii() and b"\x1b" not in shown
    assert b"\\u001b[2J" in shown and b"\\u202e" in shown and b"\\udb40\\udc68" in shown
    # The same data for a program that reads it.
    assert hostile in {orjson.loads(line)["offer"].get("cpu_name")
                       for line in shown.replace(b"\r\n", b"\n").splitlines() if line}
