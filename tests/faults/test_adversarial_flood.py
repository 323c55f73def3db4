"""Hostile hosts, third round: one key cannot fill the disk, one click cannot fill memory.

The probe: one bring-your-own key wrote 1,998 results of ~1 MB (2.0 GB) in 90 s; then
``GET /api/instances/3`` took 44 s and the coordinator's memory to 5.3 GB, and
``vast-manager instance 3`` peaked at 10.7 GB in the CLI. Replayed here against a real
coordinator on a loopback port (``start_server`` in a thread), the CLI as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from vast_manager.coordinator.decisions import policy

from support.coord_support import ADMIN_TOKEN, ServerThread, hello_msg
from support.fakes_provider import FakeProvider
from support.fault_support import admin_call, http, signed_headers
from support.paths import REPO_ROOT

MB = 1_000_000


def big_result(i: int) -> bytes:
    """A ~1 MB result: 65,000 proof times of 15 bytes each (under the 1 MiB body bound)."""
    n = 65_000
    now = time.time()
    return json.dumps({
        "result_id": f"res_flood_{i}", "kind": "benchmark", "proof_type": "porep-32g",
        "started_at": now - 3600, "finished_at": now, "gpus_used": [0],
        "proofs_completed": n, "proofs_failed": 0, "wall_seconds": 3600.0,
        "rate_per_hour": float(n), "proof_seconds": [123.456789012] * n, "telemetry": None,
    }).encode()


def post(url: str, agent_id: str, key: bytes, path: str, body: bytes) -> int:
    return http(url + path, "POST", body, {
        **signed_headers(agent_id, key, "POST", path, body),
        "Content-Type": "application/json"}, timeout_s=60)[0]


def stored_bytes(db_rows: list[dict[str, Any]]) -> int:
    return sum(len(str(v)) for row in db_rows for v in row.values() if v is not None)


def test_a_result_flood_is_summarised_throttled_revoked_and_its_views_stay_small(
    tmp_path: Path,
) -> None:
    # The first result strikes the host, so the instance is terminating: the monitor's
    # pass (60 s after start, which a loaded machine reaches mid-flood) would destroy it,
    # and the 401s would then be the destroyed instance's, not the flood's revocation.
    with ServerThread(tmp_path, FakeProvider([]), monitor_interval_s=3600.0) as thread:
        url = thread.server.url
        issued = admin_call(url, "POST", "/api/agents", {"label": "flood"})
        agent_id, key = issued["agent_id"], bytes.fromhex(issued["agent_key"])
        # Timestamps at or before the second the coordinator started are refused.
        time.sleep(1.1)
        assert post(url, agent_id, key, "/v1/hello",
                    json.dumps(hello_msg("boot-flood")).encode()) == 200
        statuses = []
        started = time.monotonic()
        for i in range(80):  # 80 MB offered
            statuses.append(post(url, agent_id, key, "/v1/result", big_result(i)))
        flood_s = time.monotonic() - started
        # Throttled from the 10th result nobody asked for, revoked at the 50th: one
        # event each; every later request is refused before its body is read.
        assert statuses.count(429) > 0 and statuses[-1] == 401
        first_401 = statuses.index(401)
        assert all(s == 401 for s in statuses[first_401:])
        store = thread.server.store
        inst = store.instance_by_agent(agent_id)
        assert inst is not None and inst["state"] in ("terminating", "destroyed")
        assert [e["kind"] for e in store.events(inst["id"])].count("revoked") == 1
        assert [e["kind"] for e in store.events(inst["id"])].count("throttled") == 1
        rows = store.results_for_instance(inst["id"])
        assert len(rows) <= policy.FLOOD_REVOKE_AT + 1
        stored = stored_bytes(rows) + stored_bytes(store.events(inst["id"]))
        print(f"flood: {len(statuses)} results of ~1 MB in {flood_s:.1f} s; "
              f"{statuses.count(200)} x 200, {statuses.count(429)} x 429, "
              f"{statuses.count(401)} x 401; stored {stored / MB:.2f} MB")
        assert stored < 10 * MB
        summarised = [r for r in rows if r["proof_seconds_json"] is None]
        assert len(summarised) >= len(rows) - 1  # all but the one the first benchmark was

        # The instance view: one page, in bounded memory.
        tracemalloc.start()
        started = time.monotonic()
        status, raw, _ = http(url + f"/api/instances/{inst['id']}", "GET", None,
                              {"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout_s=60)
        view_s = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert status == 200
        view = json.loads(raw)
        assert len(view["results"]) == 20 and view["results_total"] == len(rows)
        assert view["results_next"] is not None
        older = json.loads(http(url + f"/api/instances/{inst['id']}?results_before="
                                f"{view['results_next']}&results_limit=200", "GET", None,
                                {"Authorization": f"Bearer {ADMIN_TOKEN}"})[1])
        assert len(older["results"]) == len(rows) - 20 and older["results_next"] is None
        assert peak < 200 * MB

        # The CLI in its own process: its peak resident memory, measured by a parent
        # that runs nothing else.
        env = {**os.environ, "VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN,
               "PYTHONPATH": str(REPO_ROOT / "src")}
        probe = ("import resource, subprocess, sys, time; t = time.monotonic(); "
                 "p = subprocess.run([sys.executable, '-m', 'vast_manager.coordinator.cli', "
                 f"'instance', '{inst['id']}'], capture_output=True, text=True); "
                 "print(p.returncode, time.monotonic() - t, "
                 "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
                 "print(p.stdout[:20000]); print(p.stderr[-2000:])")
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, timeout=120).stdout
        code, cli_s, rss_kib = out.splitlines()[0].split()
        print(f"views: GET {view_s:.2f} s, {peak / MB:.1f} MB traced at peak; CLI "
              f"{float(cli_s):.2f} s, {int(rss_kib) / 1024:.0f} MiB resident at peak")
        assert code == "0", out
        assert f"Results (20 of {len(rows)}, newest; older ones: --before" in out
        assert int(rss_kib) * 1024 < 200 * MB
