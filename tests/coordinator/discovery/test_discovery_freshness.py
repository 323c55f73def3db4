"""Never silently stale: an import, then at once `offers --json`, answers from a fit that
used it; every prediction says which fit; the plan never proposes a measured machine.
Every rate here is simulated."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.providers.local.catalog import catalog_offers

from support.coord_support import ADMIN_TOKEN, Harness, ServerThread, start
from support.discovery_support import measurements
from support.fakes_provider import FakeProvider
from support.paths import REPO_ROOT


def catalog_lines(rate: float) -> list[dict[str, Any]]:
    """One measurement of every catalog machine (the offers `offers` lists), each at
    ``rate`` times its GPU count, plus 40 other machines (so cross-validation runs)."""
    out = []
    for offer in catalog_offers():
        o = {k: v for k, v in dict(offer).items() if k != "sim"}
        out.append({"machine_id": str(o["machine_id"]), "offer": o,
                    "rate_per_hour": rate * float(o["num_gpus"]),
                    "measured_at": time.time() - 3600})
    for m in measurements(40, seed=3):
        out.append({"machine_id": m.machine_id, "offer": dict(m.offer.raw),
                    "rate_per_hour": round(m.rate_per_hour, 3),
                    "measured_at": time.time() - 7200})
    return out


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path, FakeProvider(catalog_offers())) as s:
        yield s


def run_cli(server: ServerThread, *args: str) -> Any:
    env = {"VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_offers_right_after_an_import_use_it(server: ServerThread, tmp_path: Path) -> None:
    before = orjson.loads(run_cli(server, "offers", "--json").output)
    assert before and all(o["measurements_used"] == 0 for o in before)
    rows = catalog_lines(rate=7.0)  # far below any physics prior: only the data says 7/h
    source = tmp_path / "m.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    done = run_cli(server, "hosts", "import", str(source))
    assert done.exit_code == 0, done.output
    assert f"refitted on {len(rows)} measurement(s)" in done.output
    after = orjson.loads(run_cli(server, "offers", "--json").output)
    predicted = [o for o in after if o["predicted_rate_per_hour"] is not None]
    assert predicted
    for o in predicted:
        assert o["measurements_used"] == len(rows)
        assert o["model_fitted_at"] > before[0]["model_fitted_at"]
        assert o["model_stale"] is False and o["model_stale_reason"] is None
        # The machine's own measurement moved its prediction to it.
        per_gpu = o["predicted_rate_per_hour"] / o["num_gpus"]
        assert 5.0 < per_gpu < 10.0, o["prediction_basis"]
        assert "this machine's runs" in o["prediction_basis"]
    # The plan lists the measured machines apart and proposes none of them.
    plan = orjson.loads(run_cli(server, "plan", "--json", "--trials", "10").output)
    measured = {m["machine_id"] for m in plan["measured"]}
    assert measured and not measured & {p["machine_id"] for p in plan["proposals"]}
    assert plan["measurements_used"] == len(rows) and plan["model_stale"] is False
    text = run_cli(server, "plan").output
    assert "Already measured (not trials" in text
    model = run_cli(server, "model")
    assert model.exit_code == 0 and "CANDIDATE" in model.output and "CV ERROR" in model.output


async def test_answers_say_stale_while_a_slow_refit_runs(aiohttp_client: Any,
                                                         tmp_path: Path) -> None:
    """A refit that takes longer than a request waits: the answer comes from the previous
    fit, flagged stale with the reason, and the next answer after the refit is fresh."""
    h: Harness = await start(aiohttp_client, tmp_path, provider=FakeProvider(catalog_offers()))
    status, first = await h.admin("GET", "/api/offers")
    assert status == 200 and first[0]["model_stale"] is False
    keeper = h.core.models
    keeper.answer_wait_s = 0.05
    release = asyncio.Event()
    import vast_manager.coordinator.operations.model_keeper as rate_model

    real = rate_model.fit_rows

    def slow_fit(*args: Any) -> Any:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=30)
        return real(*args)

    loop = asyncio.get_running_loop()
    rate_model.fit_rows = slow_fit  # type: ignore[assignment]
    try:
        body = b"".join(orjson.dumps(r) + b"\n" for r in catalog_lines(rate=7.0)[:3])
        import_task = asyncio.create_task(h.client.post(
            "/api/hosts/import", data=body,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                     "Content-Type": "application/x-ndjson"}))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if keeper.refitting:
                break
        status, during = await h.admin("GET", "/api/offers")
        assert status == 200
        assert all(o["model_stale"] is True for o in during)
        assert "refit for 3 new measurement(s) is running" in during[0]["model_stale_reason"]
        assert during[0]["measurements_used"] == 0
        release.set()
        resp = await import_task
        assert resp.status == 200
    finally:
        rate_model.fit_rows = real  # type: ignore[assignment]
    status, later = await h.admin("GET", "/api/offers")
    assert all(o["model_stale"] is False and o["measurements_used"] == 3 for o in later)


async def test_a_large_fit_runs_in_a_worker_process(aiohttp_client: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """From PROCESS_FIT_MIN_MEASUREMENTS up the fit leaves the coordinator's process (its
    Python work would hold the interpreter); the fit that comes back serves like any."""
    import vast_manager.coordinator.operations.model_keeper as rate_model

    monkeypatch.setattr(rate_model, "PROCESS_FIT_MIN_MEASUREMENTS", 10)
    h: Harness = await start(aiohttp_client, tmp_path, provider=FakeProvider(catalog_offers()))
    body = b"".join(orjson.dumps(r) + b"\n" for r in catalog_lines(rate=7.0))
    resp = await h.client.post("/api/hosts/import", data=body, headers={
        "Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/x-ndjson"})
    answer = orjson.loads(await resp.read())
    assert resp.status == 200, answer
    keeper = h.core.models
    assert keeper._pool is not None  # the worker process made this fit
    assert answer["model"]["measurements_used"] == answer["imported"]
    status, offers = await h.admin("GET", "/api/offers")
    assert status == 200
    assert all(o["measurements_used"] == answer["imported"] for o in offers)
    status, model = await h.admin("GET", "/api/model")
    assert status == 200 and [c["name"] for c in model["candidates"]] == [
        "structural", "residual", "plain", "linear"]
    assert model["served_cv_mdape"] is not None and model["measurements_used"] == len(
        catalog_lines(rate=7.0))
    keeper.close()
    assert keeper._pool is None


@pytest.mark.slow
def test_refit_bench_runs(tmp_path: Path) -> None:
    """bench/refit.py, small: heartbeats while the worker process refits."""
    import subprocess
    import sys

    root = REPO_ROOT
    done = subprocess.run([sys.executable, str(root / "bench" / "refit.py"), "--measurements",
                           "800", "--import-measurements", "50", "--alone-s", "1",
                           "--agents", "40"], cwd=root, capture_output=True, text=True,
                          timeout=900)
    assert "refit at start on 800 stored measurements" in done.stdout, done.stderr
    assert "heartbeats at 30/s" in done.stdout and "failed or refused: 0" in done.stdout
