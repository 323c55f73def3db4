"""`vast-manager demo`: the whole lifecycle on a local simulated fleet, in about a minute.

A real coordinator (aiohttp + SQLite) on a fresh database, the LocalProvider
spawning real ``vast-agent`` processes on the simulated cuzk, and the operator
API driving it all: exactly the paths production uses, with simulated
hardware. Every rate shown is simulated and labelled so.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from vast_manager.coordinator.cli import render
from vast_manager.coordinator.cli.text_views import predicted_interval, render_plan, render_scaling
from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider

DEFAULT_TIME_SCALE = 240.0
REFRESH_S = 0.5
#: An instance's fate is decided once it is ending (``states.ENDING``) or silent.
FINAL_STATES = states.ENDING | {State.LOST}
EXIT_OK = 0
EXIT_UNEXPECTED = 4


class _Api:
    """The operator API, over HTTP, as an operator's script would use it."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str) -> None:
        self.session = session
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        async with self.session.request(
            method, self.url + path, json=body, headers=self.headers
        ) as resp:
            data = await resp.json(content_type=None)
            if resp.status >= 400:
                raise RuntimeError(f"{method} {path}: {data.get('message')}")
            return data


def _settled(inst: dict[str, Any], scaling_ids: set[int]) -> bool:
    """An instance is settled once its fate is decided: gone, or proving after a verdict."""
    if inst.get("state") in FINAL_STATES:
        return True
    if inst.get("phase") != "proving" or inst.get("rate_per_hour") is None:
        return False
    return (inst.get("num_gpus") or 1) <= 1 or inst.get("id") in scaling_ids


def _gpu_utils(detail: dict[str, Any] | None) -> str:
    if not detail:
        return ""
    tele = detail.get("telemetry") or {}
    gpus = tele.get("gpus") or []
    if len(gpus) < 2:
        return ""
    return " ".join(render.num(g.get("util_pct_mean"), 0) for g in gpus) + " %"


def _live_table(rows: list[dict[str, Any]], details: dict[int, Any], elapsed_s: float) -> str:
    lines = [
        f"vast-manager demo — local simulated fleet (rates are SIMULATED)   t={elapsed_s:5.1f}s",
        render.table(
            (
                (
                    r.get("id"),
                    f"{r.get('num_gpus')}x {r.get('gpu_name')}",
                    r.get("state"),
                    r.get("phase"),
                    _progress(r.get("progress")),
                    render.num(r.get("rate_per_hour")),
                    render.num(r.get("min_rate_per_hour")),
                    _gpu_utils(details.get(int(r["id"]))),
                )
                for r in rows
            ),
            ["ID", "GPUS", "STATE", "PHASE", "PROGRESS", "RATE/H", "MIN/H", "GPU UTIL"],
            width=render.terminal_width(),
        ),
    ]
    return "\n".join(lines)


def _progress(p: Any) -> str:
    if not p:
        return "-"
    done, total, unit = p.get("done") or 0, p.get("total") or 0, p.get("unit")
    if unit == "bytes":
        return f"params {100.0 * done / total:.0f}%" if total else "params"
    bar_len = 12
    filled = int(bar_len * done / total) if total else 0
    return f"[{'#' * filled}{'.' * (bar_len - filled)}] {done}/{total}"


class _Screen:
    """Refresh in place on a terminal; print only changes otherwise (logs, CI)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last_lines = 0
        self.last_phases: dict[Any, tuple[Any, Any]] = {}

    def show(self, rows: list[dict[str, Any]], details: dict[int, Any], elapsed_s: float) -> None:
        if self.tty:
            text = _live_table(rows, details, elapsed_s)
            if self.last_lines:
                sys.stdout.write(f"\x1b[{self.last_lines}F\x1b[J")
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            self.last_lines = text.count("\n") + 1
            return
        for r in rows:
            key = (r.get("state"), r.get("phase"))
            if self.last_phases.get(r["id"]) != key:
                self.last_phases[r["id"]] = key
                print(
                    f"[{elapsed_s:5.1f}s] instance {r['id']} ({r.get('num_gpus')}x "
                    f"{render.clean(r.get('gpu_name'))}): state {render.clean(r.get('state'))}, "
                    f"phase {render.clean(r.get('phase') or 'none yet')}",
                    flush=True,
                )


def _outcome(detail: dict[str, Any]) -> tuple[str, str]:
    """(outcome, reason): the instance's fate and the decision that sealed it.

    The benchmark verdict is the decisive event when there is one; later
    events (the destroy that follows a terminate) only carry it out.
    """
    events = detail.get("events") or []
    verdicts = [e for e in events if e.get("kind") == "verdict"]
    decisive = verdicts or [e for e in events if e.get("kind") in {"timeout", "lost", "failed"}]
    reason = render.clean(decisive[-1].get("reason")) if decisive else "-"
    state = detail.get("state")
    if state in states.ENDING and state != State.FAILED:
        return "TERMINATED", reason
    if state in FINAL_STATES:  # lost, failed: said as they are
        return str(state).upper(), reason
    return "KEPT", reason


async def _demo(
    time_scale: float,
    workdir: Path,
    timeout_s: float,
    admin_token: str | None = None,
    fleet_secret: str | None = None,
) -> int:
    from vast_manager.coordinator.settings import Settings
    from vast_manager.coordinator.web.server import start_server

    token = admin_token or secrets.token_hex(24)
    settings = Settings.from_env(
        {
            "VM_ADMIN_TOKEN": token,
            "VM_FLEET_SECRET": fleet_secret or secrets.token_hex(32),
        },
        db_path=str(workdir / "demo.db"),
        host="127.0.0.1",
        port=0,
        next_heartbeat_s=1,
        monitor_interval_s=1.0,
        model_refit_interval_s=1.0,
        terminate_grace_s=3.0,
        config_dir=str(workdir / "config"),
        sim_time_scale=time_scale,
        # No work command runs in the demo: its kept instances turn idle once proving, and
        # are reported, not stopped, so the outcomes it shows are the verdicts' own.
        idle_destroy_after_s=0.0,
    )
    provider = LocalProvider(workdir / "instances", time_scale=time_scale)
    atexit.register(provider.kill_all_now)
    # SIGTERM (e.g. from `timeout`) and SIGHUP end the demo as Ctrl-C does: through
    # the finally below, so no simulated instance outlives it.
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if main_task is not None:
            loop.add_signal_handler(signum, main_task.cancel)
    server = await start_server(settings, provider)
    started = time.monotonic()
    print(render.wrap(f"Coordinator on {server.url} (database {workdir / 'demo.db'}); "
                      f"simulated time runs {time_scale:g}x faster.", render.terminal_width(),
                      "  "), flush=True)
    try:
        async with aiohttp.ClientSession() as session:
            api = _Api(session, server.url, token)
            await _deploy_catalog(api)
            rows = await _watch(api, started, timeout_s)
            return await _report(api, rows)
    finally:
        await provider.close()
        await server.stop()


async def _deploy_catalog(api: _Api) -> None:
    """Deploy every catalog offer; then try the too-small ones, which deploy refuses."""
    for offer in local_offers():
        answer = await api.call("POST", "/api/deploy", {"offer_id": offer["id"]})
        print(
            f"deployed offer {offer['id']} ({offer['num_gpus']}x "
            f"{render.clean(offer['gpu_name'])}, {render.clean(offer['geolocation'])}, "
            f"${offer['dph_total']}/h) -> instance "
            f"{answer['instance_id']}",
            flush=True,
        )
    # A slice of a bigger host whose instance would get too little RAM: flagged
    # in the offers, and refused at deploy with the reason.
    for o in await api.call("GET", "/api/offers"):
        if o.get("too_small"):
            try:
                await api.call("POST", "/api/deploy", {"offer_id": o["id"]})
            except RuntimeError as err:
                print(render.wrap(
                    f"refused offer {o['id']} ({o['num_gpus']}x "
                    f"{render.clean(o['gpu_name'])}): {render.clean(err)}",
                    render.terminal_width(), "  "), flush=True)


async def _watch(api: _Api, started: float, timeout_s: float) -> list[dict[str, Any]]:
    """Show the fleet until every instance has settled (or the time is up)."""
    screen = _Screen()
    deadline = started + timeout_s
    while True:
        rows = await api.call("GET", "/api/instances")
        scaling = await api.call("GET", "/api/scaling")
        scaling_ids = {int(s["instance_id"]) for s in scaling if s.get("instance_id")}
        details = {}
        for r in rows:
            if (r.get("num_gpus") or 1) > 1 and r.get("state") not in FINAL_STATES:
                details[int(r["id"])] = await api.call("GET", f"/api/instances/{r['id']}")
        screen.show(rows, details, time.monotonic() - started)
        if rows and all(_settled(r, scaling_ids) for r in rows):
            break
        if time.monotonic() > deadline:
            print(f"Demo timed out after {timeout_s:.0f}s.", flush=True)
            break
        await asyncio.sleep(REFRESH_S)
    return rows


async def _report(api: _Api, rows: list[dict[str, Any]]) -> int:
    width = render.terminal_width()
    kept, terminated_for_rate = await _outcomes(api, rows, width)

    print("\n== host_perf (simulated)")
    perf = await api.call("GET", "/api/host-perf")
    print(render.table(
        ((p["machine_id"], p["gpu_name"], p["num_gpus"], render.num(p["median_rate_per_hour"]),
          render.num(p["best_rate_per_hour"]), p["samples"], render.usd(p.get("usd_per_proof")))
         for p in perf),
        ["MACHINE", "GPU", "N", "MEDIAN/H", "BEST/H", "SAMPLES", "$/PROOF"], width=width,
    ))

    print("\n== Bad hosts")
    bad = await api.call("GET", "/api/bad-hosts")
    print(render.table(((b["machine_id"], b.get("reason")) for b in bad), ["MACHINE", "REASON"],
                       width=width) if bad else "none")

    print("\n== Multi-GPU scaling (simulated)")
    print(render_scaling(await api.call("GET", "/api/scaling"), width))

    await _model_and_plan(api, perf, width)

    # The demo is over: destroy what is still running, as an operator would,
    # so every catalog offer is rentable again for the ranking below.
    for r in rows:
        if r.get("state") not in FINAL_STATES:
            await api.call("POST", f"/api/instances/{r['id']}/destroy")

    print("\n== Offers ranked by predicted $/proof (the rate model's rate and 80% interval,")
    print("   from the simulated measurements)")
    offers = await api.call("GET", "/api/offers")
    print(render.table(
        ((o["id"], f"{o['num_gpus']}x {o['gpu_name']}", render.usd(o["dph_total"], 2),
          predicted_interval(o), render.usd(o.get("predicted_usd_per_proof")),
          "BAD-HOST" if o.get("bad_host") else "TOO-SMALL" if o.get("too_small") else "-")
         for o in offers),
        ["OFFER", "GPUS", "$/H", "PRED/H (80%)", "$/PROOF", "FLAGS"], width=width,
    ))
    print("(each prediction's basis: `vast-manager offers --wide` on a running coordinator)")
    ok = kept >= 1 and terminated_for_rate >= 1
    print(f"\n{kept} kept, {terminated_for_rate} terminated below their minimum rate.")
    return EXIT_OK if ok else EXIT_UNEXPECTED


async def _outcomes(api: _Api, rows: list[dict[str, Any]], width: int | None) -> tuple[int, int]:
    """Each instance's outcome and reason; (how many kept, how many ended below their
    minimum rate)."""
    details = {int(r["id"]): await api.call("GET", f"/api/instances/{r['id']}") for r in rows}
    print("\n== Outcomes (simulated rates, proofs/hour)")
    outcome_rows = []
    kept = terminated_for_rate = 0
    for r in rows:
        outcome, reason = _outcome(details[int(r["id"])])
        kept += outcome == "KEPT"
        terminated_for_rate += outcome == "TERMINATED" and "below" in reason
        outcome_rows.append(
            (
                r["id"],
                f"{r.get('num_gpus')}x {r.get('gpu_name')}",
                render.usd(r.get("dph_total"), 2),
                render.num(r.get("rate_per_hour")),
                render.num(r.get("min_rate_per_hour")),
                render.usd(r.get("usd_per_proof")),
                outcome,
                reason,
            )
        )
    print(render.table(outcome_rows, ["ID", "GPUS", "$/H", "RATE/H", "MIN/H", "$/PROOF",
                                      "OUTCOME", "REASON"], width=width))
    print(render.wrap("RATE/H: the benchmark's steady-state rate, the one each verdict "
                      "judged; MIN/H: the least worth keeping, the instance's $/h over "
                      "VM_MAX_USD_PER_PROOF. No work command runs in the demo, so kept "
                      "instances turn idle once proving (docs/operations.md).", width))
    return kept, terminated_for_rate


async def _model_and_plan(api: _Api, perf: list[dict[str, Any]], width: int | None) -> None:
    """What the rate model learnt from the demo's benchmarks, and the plan it makes."""
    # The rate model learns from every counted benchmark, refitted off the event loop as
    # results arrive: wait for the fit that has them all.
    counted = sum(int(p.get("samples") or 0) for p in perf)
    for _ in range(40):
        model = await api.call("GET", "/api/model")
        if model.get("measurements", 0) >= counted:
            break
        await asyncio.sleep(0.25)
    print(f"\n== The rate model: fitted on {model.get('measurements')} simulated "
          f"measurement(s) of {model.get('machines')} machine(s)")
    gpus = model.get("gpu_models") or {}
    print(render.wrap(
        "  GPU models' factors: " + (", ".join(f"{render.clean(k)} x{float(v):.2f}"
                                               for k, v in sorted(gpus.items())) or "none yet")
        + "; `vast-manager model` shows the rest", width, "    "))

    print("\n== Plan: which offers to benchmark next while the kept hosts prove (simulated)")
    print(render_plan(await api.call("GET", "/api/plan?trials=3"), width))


class DemoSetupError(ValueError):
    """A --keep folder the demo cannot use; nothing was written."""


def prepare_keep_dir(workdir: Path) -> None:
    """A folder for the demo's files: created when missing, refused when it cannot be
    written or already holds a demo's database (the demo starts on a fresh one)."""
    db = workdir / "demo.db"
    if db.exists() or (workdir / "instances").exists():
        raise DemoSetupError(
            f"--keep {workdir} holds an earlier demo ({db}); the demo starts on a fresh "
            "database: remove that folder or pick a new one")
    if workdir.exists() and not workdir.is_dir():
        raise DemoSetupError(f"--keep {workdir} is a file; pick a folder")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DemoSetupError(f"--keep {workdir} cannot be created ({err.strerror}); pick a "
                             "folder you can write") from None
    if not os.access(workdir, os.W_OK):
        raise DemoSetupError(f"--keep {workdir} is not writable; pick a folder you can write")


def run_demo(
    *,
    time_scale: float | None = None,
    keep_dir: str | None = None,
    timeout_s: float = 150.0,
    admin_token: str | None = None,
    fleet_secret: str | None = None,
) -> int:
    workdir = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="vast-manager-demo-"))
    if keep_dir:
        prepare_keep_dir(workdir)
    try:
        # Secrets are generated unless given (tests pass known ones to grep for them).
        return asyncio.run(_demo(time_scale or DEFAULT_TIME_SCALE, workdir, timeout_s,
                                 admin_token, fleet_secret))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\nInterrupted; every simulated instance was stopped.", file=sys.stderr)
        return 130
    finally:
        if keep_dir is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
