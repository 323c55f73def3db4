"""The benchmarks keep working: each runs in its quick mode and prints its figures.

Behaviour only (they run, they report, nothing is lost); never wall-clock speed. Each
bench is a process of its own running for seconds: all but the decoder's are in the slow
set (``-m slow``, which CI runs too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from support.paths import REPO_ROOT

ROOT = REPO_ROOT
#: The commit whose hand-written decoder bench/decode.py times against the new one.
PREVIOUS_DECODER = "e95b03e"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_ingest_quick(tmp_path: Path) -> None:
    out_file = tmp_path / "ingest.json"
    text = _run("ingest.py", "--json-out", str(out_file))
    assert "bare aiohttp" in text and "coordinator" in text
    assert "ratio: coordinator CPU per heartbeat" in text
    figures = orjson.loads(out_file.read_bytes())
    # The verdict printed is the one the rungs' figures give.
    met = [r["fleet"] for r in figures["rungs"] if r["met"]]
    assert figures["largest_fleet_met"] == max(met, default=0)
    if met:
        assert f"largest fleet that met the bar here: {max(met)} agents" in text
    else:
        assert "no rung met the bar here" in text
    for side in ("bare", "coordinator"):
        assert figures[side]["accepted"] > 0
        # Unpinned, the processes run where the machine lets them.
        assert figures[side]["server_cpus"] == sorted(os.sched_getaffinity(0))
        # A server that answered heartbeats spent CPU on them, and the bench measured it.
        assert figures[side]["server_cpu_s"] > 0
    # Every heartbeat sent was answered 200 and signed by the coordinator.
    assert figures["lost"] == 0
    assert figures["refused"] == 0
    assert figures["bad_signatures"] == 0
    assert figures["rungs"] and figures["rungs"][0]["counts"]["offered"] > 0
    assert figures["http_agents"] == 2


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--pin needs 2 CPUs")
def test_ingest_quick_pinned(tmp_path: Path) -> None:
    """``--pin`` holds every server thread to the first CPU the run may use and the
    generators to the others, in every part of the run (the servers measured against each
    other are held alike)."""
    out_file = tmp_path / "ingest.json"
    text = _run("ingest.py", "--pin", "--json-out", str(out_file))
    assert "ratio: coordinator CPU per heartbeat" in text
    figures = orjson.loads(out_file.read_bytes())
    allowed = sorted(os.sched_getaffinity(0))
    for part in (figures["bare"], figures["coordinator"], *figures["rungs"]):
        assert part["server_cpus"] == allowed[:1]
        assert part["generator_cpus"] == allowed[1:]
        assert part["accepted"] > 0
    assert figures["lost"] == 0 and figures["bad_signatures"] == 0


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_writer_quick() -> None:
    text = _run("writer.py")
    assert "rows as written" in text and "rows dropped (floor)" in text
    assert "the rows cost" in text


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_writer_side_table_quick() -> None:
    text = _run("writer.py", "--side-table")
    assert "instance row (as now)" in text and "side table" in text
    assert "the side table saves" in text


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_writer_update_from_quick() -> None:
    text = _run("writer.py", "--update-from")
    assert "views (as now)" in text and "UPDATE ... FROM" in text
    assert "the views save" in text


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_agent_path_quick() -> None:
    # Every heartbeat both ways was answered 200 (the bench exits non-zero otherwise).
    text = _run("agent_path.py")
    assert "agents' path" in text and "through the app" in text
    assert "the application's layers, median:" in text


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_status_quick(tmp_path: Path) -> None:
    out_file = tmp_path / "status.json"
    text = _run("status.py", "--json-out", str(out_file))
    for name in ("GET /api/instances", "GET /api/host-perf", "rank_offers",
                 "vast-manager status --json", "GET /metrics", "GET /api/fleet",
                 "baseline /openapi.json during GET /metrics"):
        assert name in text
    figures = orjson.loads(out_file.read_bytes())
    assert figures["instances"] == 50
    assert "50 rows" in figures["vast-manager status --json"]["note"]
    assert figures["every page of 1000"]["pages"] == 1
    assert "25 rows" in figures["GET /api/instances?state=proving&limit=1000"]["note"]


@pytest.mark.slow  # a bench process of its own (15-50 s on 2 cores)
def test_storage_quick() -> None:
    text = _run("storage.py")
    assert "row counts identical" in text
    assert "bound from the retention settings" in text


def test_fleet_gain_quick() -> None:
    text = _run("fleet_gain.py")
    assert "both give the same figure on every one" in text
    assert re.search(r"vectorised \(now\): +[\d,]+ calls/s +\([\d.]+x\)", text), text


def test_decode_quick() -> None:
    text = _run("decode.py", "--against", PREVIOUS_DECODER)
    for name in ("orjson.loads alone", "decode (msgspec, typed)", "orjson.loads + from_obj",
                 "encode (orjson) of the telemetry", "msgspec encode of the telemetry"):
        assert name in text
    # Against the decoder it replaced, read from git: timed where this checkout has that
    # commit, and said so where it has not.
    has_previous = subprocess.run(
        ["git", "cat-file", "-e", f"{PREVIOUS_DECODER}^{{commit}}"], cwd=ROOT,
        capture_output=True, check=False).returncode == 0
    if has_previous:
        assert "faster than the previous decoder" in text
    else:
        assert "previous decoder not timed" in text


@pytest.mark.slow  # a PostgreSQL server and a bench process of their own (~10 s)
def test_cluster_read_quick() -> None:
    from support.postgres import find_bin_dir
    from support.tools import skip_or_fail

    if find_bin_dir() is None:
        skip_or_fail("postgresql is not installed (apt-get install -y postgresql)")
    text = _run("cluster_read.py")
    assert "100 instances matched" in text
    assert "one round: 1,800 proving tasks in the window" in text
    assert "baseline: SELECT 1" in text and "bar: one round's read under 200 ms" in text


@pytest.mark.slow  # a PostgreSQL server and three coordinators in turn (~30 s)
def test_cluster_heartbeats_quick() -> None:
    from support.postgres import find_bin_dir
    from support.tools import skip_or_fail

    if find_bin_dir() is None:
        skip_or_fail("postgresql is not installed (apt-get install -y postgresql)")
    text = _run("cluster_heartbeats.py")
    for variant in ("none", "reading", "slow"):
        assert re.search(rf"^{variant} +\d+ heartbeats +p50 .* p99/baseline", text, re.M), text


@pytest.mark.slow  # a bench process of its own (about 40 s on 2 cores)
def test_replica_quick(tmp_path: Path) -> None:
    out_file = tmp_path / "replica.json"
    text = _run("replica.py", "--json-out", str(out_file))
    assert "replication off" in text and "replication on" in text
    assert "ratio on/off: CPU per heartbeat" in text
    figures = orjson.loads(out_file.read_bytes())
    for side in ("off", "on"):
        run = figures["saturation"][side]
        assert run["accepted"] > 0 and run["counts"].get("lost", 0) == 0
    # Litestream ran beside the coordinator with replication on, and only then.
    assert figures["saturation"]["on"]["litestream_cpu_s"] > 0
    assert figures["saturation"]["off"]["litestream_cpu_s"] == 0
    restored = figures["restore"]
    assert restored["results"] == 20_000 and restored["restore_s"] > 0
