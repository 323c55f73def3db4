"""bench/discovery.py keeps working: its quick mode runs and prints every figure.

Behaviour only (it runs, it reports both acceptances, the figures are sane); the
full run's numbers are in docs/discovery.md.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from support.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.slow  # two minutes of model fits on 2 cores
def test_discovery_bench_quick(tmp_path: Path) -> None:
    out_file = tmp_path / "discovery.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "discovery.py"), "--quick",
         "--json-out", str(out_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "simulated" in text
    assert "A1 at 500 measurements" in text and "A2, every seed" in text
    for policy in ("oracle", "planner", "medians", "cheapest", "variety"):
        assert f"  {policy} " in text
    figures = orjson.loads(out_file.read_bytes())
    assert figures["simulated"] is True
    for rows in figures["a1"]["500"]:
        for row in rows.values():
            assert 0 < row["floor"] < 1 and 0 < row["model"] < 1
            assert 0 <= row["coverage"] <= 1
    a2 = figures["a2"]
    oracle = a2["oracle"]["usd_per_proof"][0]
    for name, runs in a2.items():
        assert runs["trials"][0] > 0, name
        assert math.isfinite(runs["usd_per_proof"][0]) and runs["usd_per_proof"][0] > 0
        # Nobody beats the oracle by more than noise: it knows every true rate.
        assert runs["usd_per_proof"][0] >= 0.97 * oracle, name
        assert 0 <= runs["trial_share"][0] <= 1
