"""A real Prometheus server scrapes a coordinator carrying a simulated fleet, every query
of docs/grafana-dashboard.json returns data, and docs/prometheus-alerts.yml passes
``promtool check rules`` and loads, every rule evaluating without error.

Debian's ``prometheus`` package provides the server (``.ci/run`` installs it); where
it is missing the test skips and says so (under CI it fails). The fleet is the local
provider's simulated machines, so every number scraped is simulated.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from vast_manager.coordinator.providers.local.catalog import local_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider
from vast_manager.coordinator.web.server import start_server

from support.coord_support import ADMIN, ADMIN_TOKEN, make_settings
from support.paths import REPO_ROOT
from support.tools import require_tool

pytestmark = pytest.mark.slow

REPO = REPO_ROOT
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
ALERTS = REPO / "docs" / "prometheus-alerts.yml"
PROMETHEUS = shutil.which("prometheus")
#: Series only a vast.ai account gives (docs/operations.md, "The account"): the simulated
#: fleet here has none, so their panels have no data, by design.
ACCOUNT_ONLY = frozenset({"vm_vast_funds_dollars"})
# Two machines: a multi-GPU box (per-GPU series for several GPUs) and a single GPU.
MACHINES = ("41007", "41001")


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every target, with the dashboard's variables filled
    in the way Grafana sends them for "All" (``allValue``: ``.*``)."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v.get("allValue", ".*") for v in board["templating"]["list"]
                 if v.get("type") == "query"}
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                expr = target["expr"]
                for name, value in variables.items():
                    expr = expr.replace(f"${name}", value)
                out.append((panel.get("title", "?"), expr))

    walk(board["panels"])
    # The variable's own query (label_values) reads the series it names.
    for v in board["templating"]["list"]:
        if v.get("type") == "query":
            definition = v["definition"]
            assert definition.startswith("label_values(")
            metric = definition[len("label_values("):].split(",")[0].strip()
            out.append((f"variable {v['name']}", metric))
    return out


def test_dashboard_queries_are_read() -> None:
    # The parser above must find the dashboard's panels, or the live test proves nothing.
    queries = dashboard_queries()
    assert len(queries) >= 15
    assert all("$" not in expr for _, expr in queries)


def test_alert_rules_pass_promtool() -> None:
    require_tool("promtool", "apt-get install prometheus; .ci/run does it")
    checked = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_every_alert_has_a_panel() -> None:
    """Each signal the alert rules watch has a panel on the dashboard."""
    import yaml

    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    exprs = " ".join(expr for _, expr in dashboard_queries())
    for rule in rules:
        found = re.search(r"\bvm_\w+", rule["expr"])
        if found is None:  # up{job=...}: the scrape itself, Prometheus's own target page
            assert rule["expr"].startswith("up{"), rule
            continue
        assert found.group(0) in exprs, (rule["alert"], found.group(0))
        assert rule["annotations"]["fix"], rule["alert"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """A real ``prometheus`` process on loopback scraping one target every second."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        token_file = tmp_path / "token"
        token_file.write_text(ADMIN_TOKEN)
        config = tmp_path / "prometheus.yml"
        rules = tmp_path / "prometheus-alerts.yml"
        rules.write_text(ALERTS.read_text())
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files:\n  - {rules}\n"
            "scrape_configs:\n"
            "  - job_name: vast-manager\n"
            f"    authorization:\n      credentials_file: {token_file}\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = tmp_path / "prometheus.log"
        self.args = [
            str(PROMETHEUS), f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


async def query(http: aiohttp.ClientSession, prom: PrometheusServer, expr: str) -> list[Any]:
    async with http.get(f"{prom.url}/api/v1/query", params={"query": expr}) as resp:
        body = await resp.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


async def targets_up(http: aiohttp.ClientSession, prom: PrometheusServer) -> list[Any]:
    try:
        async with http.get(f"{prom.url}/api/v1/targets") as resp:
            body = await resp.json()
    except aiohttp.ClientError:
        return []
    return [t for t in body["data"]["activeTargets"] if t["health"] == "up"]


async def test_real_prometheus_answers_every_dashboard_query(tmp_path: Path) -> None:
    require_tool("prometheus", "apt-get install prometheus; .ci/run does it")
    offers = [o for o in local_offers() if str(o["machine_id"]) in MACHINES]
    assert len(offers) == len(MACHINES)
    provider = LocalProvider(tmp_path / "instances", time_scale=240.0, offers=offers)
    settings = make_settings(tmp_path, port=0, next_heartbeat_s=1, monitor_interval_s=1.0,
                             max_usd_per_proof=1.0)
    server = await start_server(settings, provider)
    queries = [q for q in dashboard_queries() if q[1] not in ACCOUNT_ONLY]
    missing: list[tuple[str, str]] = queries
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            for offer in offers:
                async with http.post(f"{server.url}/api/deploy",
                                     json={"offer_id": offer["id"], "min_rate_per_hour": 0.1},
                                     ) as resp:
                    assert resp.status == 200, await resp.text()
            target = server.url.removeprefix("http://")
            with PrometheusServer(tmp_path, target) as prom:
                async with aiohttp.ClientSession() as plain:
                    deadline = time.monotonic() + 240
                    while time.monotonic() < deadline:
                        if await targets_up(plain, prom):
                            answers = {q: await query(plain, prom, q[1]) for q in missing}
                            missing = [q for q, rows in answers.items() if not rows]
                            if not missing:
                                break
                        await asyncio.sleep(1.0)
                    assert not missing, (
                        "dashboard queries with no data from a real Prometheus: "
                        f"{missing}\nprometheus log:\n{prom.tail()}"
                    )
                    # The alert rules loaded, and each evaluated without an error.
                    async with plain.get(f"{prom.url}/api/v1/rules") as resp:
                        groups = (await resp.json())["data"]["groups"]
                    loaded = [r for g in groups for r in g["rules"]]
                    assert len(loaded) >= 8, groups
                    assert all(r["health"] == "ok" for r in loaded), loaded
    finally:
        await provider.close()
        await server.stop()
