"""The fleet-sized operator reads: ``GET /api/instances`` with its state filter and paging,
``GET /api/fleet``, bad parameters, and every such read on the store's reader thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from vast_manager.coordinator.cli import commands
from vast_manager.coordinator.cli.api_client import next_after_id
from vast_manager.coordinator.store.reads import Reads
from vast_manager.coordinator.store.writer import Store, Tx
from vast_manager.coordinator.web import operator_api
from vast_manager.coordinator.web.metrics import INSTANCE_STATES

from support.coord_support import ADMIN, ADMIN_TOKEN, Harness, ServerThread, start
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
#: The fleet every test here reads: (state, dph_total, rate_per_hour), one instance each.
FLEET = [
    ("proving", 0.5, 40.0), ("lost", 0.3, None), ("proving", 0.7, 60.0),
    ("destroyed", 0.9, 10.0), ("benchmarking", 0.4, None), ("proving", 0.2, 20.0),
    ("vanished", 0.1, None), ("lost", 0.6, None), ("deploying", None, None),
    ("proving", 0.8, 80.0),
]


def add_fleet(tx: Tx) -> list[int]:
    return [tx.instances.add({"label": f"rig-{i}", "kind": "byo", "state": state,
                             "dph_total": dph, "rate_per_hour": rate, "created_at": 1.0,
                             "machine_id": f"m{i}", "gpu_name": "RTX 4090", "num_gpus": 1})
            for i, (state, dph, rate) in enumerate(FLEET)]


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path) -> Harness:
    harness = await start(aiohttp_client, tmp_path)
    await harness.store.write(add_fleet)
    return harness


async def get(h: Harness, target: str) -> tuple[int, Any, str | None]:
    resp = await h.client.get(target, headers=ADMIN)
    return resp.status, orjson.loads(await resp.read()), resp.headers.get("Link")


async def walk(h: Harness, first: str) -> list[list[dict[str, Any]]]:
    """Every page from ``first`` on, following each answer's Link rel="next"."""
    pages: list[list[dict[str, Any]]] = []
    target: str | None = first
    while target is not None:
        status, rows, link = await get(h, target)
        assert status == 200, rows
        pages.append(rows)
        target = None
        if link is not None:
            assert link.endswith('>; rel="next"') and link.startswith("</api/instances?")
            target = link[1:link.index(">")]
    return pages


def ids_in(states: set[str] | None = None) -> list[int]:
    return [i + 1 for i, (state, _, _) in enumerate(FLEET) if states is None or state in states]


# --- filter and paging --------------------------------------------------------------------


async def test_without_parameters_every_instance_in_id_order(h: Harness) -> None:
    status, rows, link = await get(h, "/api/instances")
    assert status == 200 and link is None
    assert [r["id"] for r in rows] == ids_in()
    assert rows[0]["state"] == "proving" and rows[0]["usd_per_proof"] == 0.5 / 40.0


@pytest.mark.parametrize("limit", [1, 3, 5, 10, 11, 10_000])
async def test_pages_cover_the_fleet_once_in_order(h: Harness, limit: int) -> None:
    pages = await walk(h, f"/api/instances?limit={limit}")
    assert all(len(p) == limit for p in pages[:-1]) and 1 <= len(pages[-1]) <= limit
    # One row past the page tells whether another follows: no empty last page.
    assert len(pages) == -(-len(FLEET) // limit)
    assert [r["id"] for p in pages for r in p] == ids_in()


@pytest.mark.parametrize("query", ["state=proving,lost", "state=proving&state=lost",
                                   "state=lost,proving,lost", "state=%20proving%20,lost"])
async def test_the_state_filter(h: Harness, query: str) -> None:
    status, rows, link = await get(h, f"/api/instances?{query}")
    assert status == 200 and link is None
    assert [r["id"] for r in rows] == ids_in({"proving", "lost"})
    assert {r["state"] for r in rows} == {"proving", "lost"}


async def test_filtered_pages_carry_the_filter(h: Harness) -> None:
    pages = await walk(h, "/api/instances?state=proving&limit=3")
    assert [[r["id"] for r in p] for p in pages] == [ids_in({"proving"})[:3],
                                                     ids_in({"proving"})[3:]]
    _, _, link = await get(h, "/api/instances?state=proving&limit=3")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(link[1:link.index(">")]).query)
    assert query == {"state": ["proving"], "limit": ["3"], "after_id": ["6"]}
    assert next_after_id(link) == 6  # what the CLI follows


async def test_after_id_is_a_cursor_not_an_offset(h: Harness) -> None:
    _, rows, _ = await get(h, "/api/instances?after_id=4")
    assert [r["id"] for r in rows] == ids_in()[4:]
    # An instance added while someone pages appears at the end, never shifting a page.
    _, first, link = await get(h, "/api/instances?limit=4")
    await h.store.write(lambda tx: tx.instances.add(
        {"label": "late", "kind": "byo", "state": "deploying", "created_at": 2.0}))
    assert link is not None
    rest = [r["id"] for p in await walk(h, link[1:link.index(">")]) for r in p]
    assert [r["id"] for r in first] + rest == [*ids_in(), len(FLEET) + 1]
    assert (await get(h, "/api/instances?after_id=9223372036854775807"))[1] == []


async def test_fleet_summary(h: Harness) -> None:
    status, fleet, _ = await get(h, "/api/fleet")
    assert status == 200
    billing = [(s, d, r) for s, d, r in FLEET if s not in ("destroyed", "vanished")]
    proving = [r for s, _, r in FLEET if s == "proving"]
    # The account: nothing read (the fake provider has no account), nothing paused.
    assert fleet.pop("account") == {
        "balance_usd": None, "credit_usd": None, "funds_usd": None, "checked_at": None,
        "auth_ok": True, "auth_error": None, "warning": None, "paused": None}
    # No fault open, nothing paused.
    assert (fleet.pop("deploys_paused"), fleet.pop("faults")) == (None, [])
    # The offer cache's own view (docs/operations.md), no price increase pending.
    assert fleet.pop("offer_cache")["alert"] is None
    assert fleet.pop("pending_price_increases") == []
    assert fleet.pop("replica")["configured"] is False  # no VM_REPLICA_URL here
    # Nothing deployed here (bring-your-own rigs): nothing spent.
    assert {w: parts["total"] for w, parts in fleet.pop("spend").items()} == {
        "today": 0.0, "week": 0.0, "all_time": 0.0}
    # No cluster source, no proof price: nothing of theirs to show.
    assert fleet.pop("cluster") == {"configured": False, "alert": None, "alert_since": None,
                                    "reads_failed_total": 0, "read_since": None}
    assert fleet == {
        "revenue_per_hour": None, "cost_per_hour": None, "profit_per_hour": None,
        "unattributable_addresses": [],
        "instances": len(FLEET),
        "by_state": {"benchmarking": 1, "deploying": 1, "destroyed": 1, "lost": 2,
                     "proving": 4, "vanished": 1},
        "billing": len(billing), "proving": len(proving),
        "idle": 0, "completed_proofs_per_hour": None,  # no monitor round measured them
        "max_usd_per_proof": h.core.settings.max_usd_per_proof,
        "max_deploy_dph_total": h.core.settings.max_deploy_dph_total,
        "provider": h.core.provider.name,
        "proofs_per_hour": pytest.approx(sum(proving)),
        "dollars_per_hour": pytest.approx(sum(d or 0.0 for _, d, _ in billing)),
        "dollars_per_proof": pytest.approx(sum(d or 0.0 for _, d, _ in billing) / sum(proving)),
    }


# --- bad parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        ("state=bogus", "state", "'state' must be among deploying, booting"),
        ("state=proving,bogus", "state", "'bogus' is not."),
        ("state=", "state", "'state' must name one or more states"),
        ("state=proving,,lost", "state", "'state' must name one or more states"),
        ("limit=0", "limit", "'limit' must be between 1 and 10000."),
        ("limit=10001", "limit", "'limit' must be between 1 and 10000."),
        ("limit=ten", "limit", "'limit' must be an integer."),
        ("limit=1&limit=2", "limit", "'limit' is given more than once."),
        ("after_id=-1", "after_id", "'after_id' must be between 0 and"),
        ("after_id=1.5", "after_id", "'after_id' must be an integer."),
        ("after_id=9223372036854775808", "after_id", "'after_id' must be between 0 and"),
        ("limt=5", "limt", "Unknown parameter 'limt'; /api/instances takes state, limit,"),
    ],
)
async def test_bad_parameters_are_a_400_naming_them(
    h: Harness, query: str, field: str, says: str
) -> None:
    before = h.store.content_digest()
    status, body, link = await get(h, f"/api/instances?{query}")
    assert status == 400 and link is None
    assert body["error"] == "invalid_field" and body["field"] == field
    assert says in body["message"]
    # One sentence.
    assert body["message"].endswith(".") and body["message"].count(". ") == 0
    assert h.store.content_digest() == before
    assert (await get(h, "/api/instances?limit=2"))[0] == 200  # and it keeps serving


def test_the_filter_names_every_state_and_the_document_agrees() -> None:
    # Every state, and ``idle``: every state a table shows is a filter value.
    assert (*INSTANCE_STATES, "idle") == operator_api.KNOWN_STATES
    doc = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    params = {p["name"]: p for p in doc["paths"]["/api/instances"]["get"]["parameters"]}
    assert params["state"]["schema"]["items"]["enum"] == [*INSTANCE_STATES, "idle"]
    assert params["limit"]["schema"]["maximum"] == operator_api.MAX_INSTANCE_PAGE


# --- off the event loop --------------------------------------------------------------------

#: Each fleet-sized read and the Reads methods it makes.
OFF_LOOP = [
    ("/api/instances", ("instance_values",)),
    ("/api/instances?state=proving&limit=2", ("instance_values",)),
    ("/api/fleet", ("instances_by_state",)),
    ("/metrics", ("instances_by_state", "active_instances", "live_telemetry", "bad_host_count")),
    ("/api/host-perf", ("host_perf",)),
    ("/api/bad-hosts", ("bad_hosts",)),
    ("/api/scaling", ("scaling",)),
    ("/api/events?limit=5", ("events",)),
    ("/api/instances/1", ("get_instance", "results_page", "events",
                          "latest_telemetry")),
    ("/api/instances/1/logs", ("logs",)),
    ("/api/instances/1/telemetry-history", ("latest_telemetry",)),
]


def watch_reads(monkeypatch: pytest.MonkeyPatch, names: set[str]) -> list[tuple[str, str]]:
    """Record (method, thread name) of every call of these Reads methods."""
    calls: list[tuple[str, str]] = []

    def watched(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: Reads, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, threading.current_thread().name))
            return original(self, *args, **kwargs)
        return read

    for name in names:
        monkeypatch.setattr(Reads, name, watched(name, getattr(Reads, name)))
    return calls


@pytest.mark.parametrize(("target", "methods"), OFF_LOOP, ids=[t for t, _ in OFF_LOOP])
async def test_fleet_sized_reads_run_on_the_reader_thread(
    h: Harness, monkeypatch: pytest.MonkeyPatch, target: str, methods: tuple[str, ...]
) -> None:
    calls = watch_reads(monkeypatch, set(methods))
    resp = await h.client.get(target, headers=ADMIN)
    assert resp.status == 200, await resp.text()
    assert {name for name, _ in calls} == set(methods)
    loop_thread = threading.current_thread().name
    assert all(thread.startswith("store-reader") for _, thread in calls), calls
    assert all(thread != loop_thread for _, thread in calls)


async def test_one_scrape_reads_one_committed_state(h: Harness,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A write committed between two statements of one scrape is not half seen: the
    reader's statements share one read transaction."""
    original = Reads.active_instances
    committed: list[int] = []

    def meanwhile(self: Reads, *args: Any, **kwargs: Any) -> Any:
        # Another connection commits a new proving instance between the scrape's counts
        # and its per-instance rows.
        conn = sqlite3.connect(h.store.path, isolation_level=None)
        conn.execute("insert into instances (label, kind, state, created_at, rate_per_hour) "
                     "values ('late', 'byo', 'proving', 3.0, 5.0)")
        conn.close()
        committed.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Reads, "active_instances", meanwhile)
    resp = await h.client.get("/metrics", headers=ADMIN)
    text = await resp.text()
    assert committed
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counted = {s.labels["state"]: s.value for s in fams["vm_instances"].samples}["proving"]
    listed = [s for s in fams["vm_instance_proofs_per_hour"].samples
              if s.labels["state"] == "proving"]
    assert counted == len(listed) == 4  # the late instance is in neither


# --- the CLI pages through the fleet ---------------------------------------------------------


def test_status_pages_through_the_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "STATUS_PAGE", 3)
    # The fleet's benchmarking row began in 1970: the monitor's first pass (60 s after
    # start, which a loaded machine reaches mid-test) would time it out between two reads.
    with ServerThread(tmp_path, monitor_interval_s=3600.0) as server:
        server.server.store.write_blocking(add_fleet)
        env = {"VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN}

        def run(*args: str) -> Any:
            result = CliRunner().invoke(commands.cli, list(args), env=env,
                                        catch_exceptions=False)
            assert result.exit_code == 0, result.output
            return result

        # Piped: the pages joined into one compact array, exactly the unpaged list.
        joined = run("status", "--json", "--all").output
        assert joined.count("\n") == 1
        assert [r["id"] for r in orjson.loads(joined)] == ids_in()
        client = commands.OperatorClient(server.server.url, ADMIN_TOKEN)
        assert orjson.loads(joined) == client.get("/api/instances")
        # Without --all, instances gone more than a day ago are no longer listed.
        live = ids_in(set(INSTANCE_STATES) - {"destroyed", "vanished"})
        assert [r["id"] for r in orjson.loads(run("status", "--json").output)] == live
        table = run("status").output.splitlines()
        rows = [line for line in table[2:] if line[:1].isdigit()]  # not the legend below
        assert [line.split()[0] for line in rows] == [str(i) for i in live]
        lost = orjson.loads(run("status", "--json", "--state", "lost,proving").output)
        assert [r["id"] for r in lost] == ids_in({"lost", "proving"})
        again = orjson.loads(run("status", "--json", "--state", "lost", "--state",
                                 "proving").output)
        assert again == lost
        # Above it, the replica's line (none configured here).
        assert run("status", "--state", "failed").output.splitlines()[-1] == \
            "No instances in failed."
        bad = CliRunner().invoke(commands.cli, ["status", "--state", "sleeping"], env=env)
        assert bad.exit_code == 1 and "'sleeping' is not." in bad.output


@pytest.mark.parametrize(
    ("link", "after"),
    [(None, None), ("", None), ('</api/instances?limit=3&after_id=7>; rel="next"', 7),
     ('<https://x/api/instances?state=lost&after_id=12&limit=3>; rel=next', 12),
     ('</api/instances?after_id=3>; rel="prev"', None)],
)
def test_next_after_id(link: str | None, after: int | None) -> None:
    assert next_after_id(link) == after


async def test_a_long_read_leaves_the_other_reads_moving(tmp_path: Path) -> None:
    """A read that takes its time (a scrape of a large fleet) holds one reader thread:
    another read, and the monitor's scans, run on the others meanwhile."""
    store = Store(tmp_path / "coord.db")
    started, release = threading.Event(), threading.Event()

    def long(reads: Reads) -> int:
        started.set()
        assert release.wait(30)
        return reads.bad_host_count()

    try:
        slow = asyncio.ensure_future(store.read(long))
        assert await asyncio.to_thread(started.wait, 30)
        assert await store.read(lambda reads: reads.instances_by_state()) == {}
        assert not slow.done()
        release.set()
        assert await slow == 0
    finally:
        release.set()
        store.close()
