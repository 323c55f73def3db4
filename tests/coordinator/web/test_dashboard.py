"""The web dashboard: login sessions, CSRF, escaping, and a headless Chromium run against
a coordinator with the local simulated fleet, hostile host and offer text included
(docs/reliability.md)."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from vast_manager.coordinator.providers.local.catalog import local_offers, slice_offers
from vast_manager.coordinator.providers.local.provider import LocalProvider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web.dashboard import COOKIE_NAME, STATIC_DIR
from vast_manager.coordinator.web.server import start_server
from vast_manager.protocol import signing

from support.browser import CHROMIUM, CHROMIUM_ARGS, async_playwright_or_skip
from support.coord_support import ADMIN, ADMIN_TOKEN, SECRET_HEX, Harness, hello_msg, start
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
HOSTILE = "<img src=x onerror=alert(1)>"
#: Markup a host or an offer's listing may carry: none of it may become an element or run.
PAYLOADS = (
    HOSTILE,
    "<script>alert(2)</script>",
    "<svg onload=alert(3)>",
    '"><iframe src=javascript:alert(4)>',
    "javascript:alert(5)",
    "' onmouseover='alert(6)",
    '<a href="javascript:alert(7)">x</a>',
    "{{constructor.constructor('alert(8)')()}}",
    "<details open ontoggle=alert(9)>",
    "</td></tr><tr><td><img src=x onerror=alert(10)>",
)
# Bidi override and isolate, a C1 CSI, a line separator: shown as escapes, never acting.
SPOOF = "\u202egnp.exe\u2066\u009b\u2028"


async def login(h: Harness, token: str = ADMIN_TOKEN) -> tuple[Any, dict[str, Any]]:
    resp = await h.client.post("/auth/login", data=orjson.dumps({"token": token}),
                               headers={"Content-Type": "application/json"})
    return resp, orjson.loads(await resp.read())


# --- static files and headers ------------------------------------------------------------


async def test_index_is_served_with_security_headers(h: Harness) -> None:
    resp = await h.client.get("/")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/html")
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    js = await h.client.get("/static/app.js")
    assert js.status == 200 and js.headers["Content-Type"].startswith("text/javascript")
    assert js.headers["X-Content-Type-Options"] == "nosniff"


async def test_static_refuses_other_files(h: Harness) -> None:
    for path in ("/static/missing.js", "/static/..%2Fdashboard.py", "/static/.hidden",
                 "/static/%2e%2e%2fapp.py"):
        resp = await h.client.get(path)
        assert resp.status == 404, path


def test_no_inline_script_or_html_injection_in_the_page() -> None:
    html = (STATIC_DIR / "index.html").read_text()
    # Every script has a src; no inline handlers or styles (the CSP would block them).
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", html))
    assert not re.search(r"\son[a-z]+=", html)
    assert " style=" not in html
    js = (STATIC_DIR / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink


# --- login and sessions --------------------------------------------------------------------


async def test_login_sets_httponly_samesite_strict_cookie(h: Harness) -> None:
    resp, data = await login(h)
    assert resp.status == 200 and data["ok"] is True
    assert len(data["csrf_token"]) >= 32
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    attrs = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "path", "max-age"} <= attrs
    assert re.search(r"samesite=strict", cookie, re.IGNORECASE)
    session_id = cookie.split(";")[0].split("=", 1)[1]
    assert len(session_id) >= 32 and ADMIN_TOKEN not in cookie
    # The session reaches the operator API; the page can re-read its CSRF token.
    listing = await h.client.get("/api/instances")
    assert listing.status == 200
    again = await h.client.get("/auth/session")
    assert (await again.json())["csrf_token"] == data["csrf_token"]


async def test_wrong_token_is_refused_without_a_cookie(h: Harness) -> None:
    resp, data = await login(h, "not-the-admin-token-at-all")
    assert resp.status == 401 and data["error"] == "unauthorized"
    assert "Set-Cookie" not in resp.headers
    assert (await h.client.get("/api/instances")).status == 401
    assert (await h.client.get("/auth/session")).status == 401
    form = await h.client.post("/auth/login", data={"token": ADMIN_TOKEN})
    assert form.status == 415  # a cross-site form post cannot log anyone in
    assert "Set-Cookie" not in form.headers


async def test_state_change_without_csrf_is_refused_and_writes_nothing(h: Harness) -> None:
    _, data = await login(h)
    before = h.store.count_rows()
    body = orjson.dumps({"machine_id": "41006", "reason": "test"})
    for headers in ({}, {"X-CSRF-Token": "wrong" * 8}):
        resp = await h.client.post("/api/bad-hosts", data=body, headers=headers)
        assert resp.status == 403, headers
        assert (await resp.json())["error"] == "csrf_failed"
        resp = await h.client.delete("/api/bad-hosts/41006", headers=headers)
        assert resp.status == 403
        resp = await h.client.post("/api/deploy", data=orjson.dumps({"offer_id": 9001}),
                                   headers=headers)
        assert resp.status == 403
    assert h.store.count_rows() == before
    assert h.provider.created == []
    ok = await h.client.post("/api/bad-hosts", data=body,
                             headers={"X-CSRF-Token": data["csrf_token"]})
    assert ok.status == 200
    assert [b["machine_id"] for b in h.store.bad_hosts()] == ["41006"]


async def test_bearer_needs_no_csrf_and_a_bad_bearer_beats_a_cookie(h: Harness) -> None:
    status, _ = await h.admin("POST", "/api/bad-hosts", {"machine_id": "41001", "reason": "x"})
    assert status == 200
    await login(h)
    resp = await h.client.get("/api/instances", headers={"Authorization": "Bearer nope" * 3})
    assert resp.status == 401


async def test_logout_needs_csrf_and_ends_the_session(h: Harness) -> None:
    _, data = await login(h)
    refused = await h.client.post("/auth/logout")
    assert refused.status == 403
    assert (await h.client.get("/api/instances")).status == 200
    out = await h.client.post("/auth/logout", headers={"X-CSRF-Token": data["csrf_token"]})
    assert out.status == 200
    assert (await h.client.get("/api/instances")).status == 401


async def test_session_expires(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, session_ttl_s=60.0)
    await login(h)
    assert (await h.client.get("/api/instances")).status == 200
    h.clock.advance(61)
    assert (await h.client.get("/api/instances")).status == 401
    assert (await h.client.get("/auth/session")).status == 401


async def test_telemetry_history_and_events_endpoints(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path, heartbeat_history_interval_s=10.0)
    agent = await h.issue("rig-hist")
    assert (await agent.hello(gpus=1))[0] == 200
    for _ in range(4):
        status, _ = await agent.heartbeat("proving", telemetry=True)
        assert status == 200
        h.clock.advance(11)
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    status, data = await h.admin("GET", f"/api/instances/{inst['id']}/telemetry-history")
    assert status == 200
    points = data["points"]
    assert len(points) == 4
    assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    assert points[-1]["telemetry"]["gpus"][0]["util_pct_mean"] == 95.0
    status, few = await h.admin("GET",
                                f"/api/instances/{inst['id']}/telemetry-history?points=2")
    assert status == 200 and len(few["points"]) == 2
    assert few["points"][-1]["t"] == points[-1]["t"]
    status, _ = await h.admin("GET", f"/api/instances/{inst['id']}/telemetry-history?points=x")
    assert status == 400
    status, _ = await h.admin("GET", "/api/instances/999/telemetry-history")
    assert status == 404
    status, events = await h.admin("GET", "/api/events?limit=5")
    assert status == 200 and isinstance(events, list) and 1 <= len(events) <= 5
    unauthorized = await h.client.get(f"/api/instances/{inst['id']}/telemetry-history")
    assert unauthorized.status == 401


# --- headless Chromium against the local simulated fleet ------------------------------------


async def _hostile_byo_agent(url: str, start_second: int) -> None:
    """A bring-your-own agent whose host sends markup as its names and log lines."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/api/agents", headers=ADMIN,
                                json={"label": f"rig {HOSTILE}"}) as resp:
            assert resp.status == 200
            issued = await resp.json()
        agent_id = issued["agent_id"]
        key = signing.derive_agent_key(bytes.fromhex(SECRET_HEX), agent_id)

        async def post(path: str, payload: Any) -> None:
            body = orjson.dumps(payload)
            ts = max(int(time.time()), start_second + 1)
            headers = signing.request_headers(agent_id, key, ts, secrets.token_hex(16), "POST",
                                              path, body)
            async with session.post(url + path, data=body, headers=headers) as r:
                assert r.status == 200, await r.text()

        hello = hello_msg(gpus=1)
        hello["host"]["hostname"] = HOSTILE + SPOOF
        hello["host"]["gpus"][0]["name"] = HOSTILE
        await post("/v1/hello", hello)
        await post("/v1/logs", {"lines": [
            {"ts": time.time(), "source": "agent", "text": f"hello {HOSTILE} <script>alert(2)"},
            {"ts": time.time(), "source": "agent", "text": f"spoof{SPOOF}\nFAKE forged line"},
            {"ts": time.time(), "source": "agent", "text": " ".join(PAYLOADS)},
        ]})
        # A forged result (64 GPUs named on a one-GPU host): flagged, and the page says why.
        now = time.time()
        await post("/v1/result", {
            "result_id": "forged", "kind": "benchmark", "proof_type": "porep-c2-32g",
            "started_at": now - 85, "finished_at": now, "gpus_used": [0] * 64,
            "proofs_completed": 500, "proofs_failed": 0, "wall_seconds": 85.0,
            "rate_per_hour": 500 * 3600 / 85, "proof_seconds": [10.0] * 500, "telemetry": None,
        })


async def test_dashboard_in_headless_chromium(tmp_path: Path) -> None:
    async_playwright = async_playwright_or_skip()
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    offer = next(o for o in local_offers() if o["num_gpus"] == 2)
    settings = Settings.from_env(
        {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_FLEET_SECRET": SECRET_HEX},
        db_path=str(tmp_path / "coord.db"), config_dir=str(tmp_path / "config"),
        host="127.0.0.1", port=0, next_heartbeat_s=1, monitor_interval_s=1.0,
        heartbeat_history_interval_s=0.5, sim_time_scale=600.0,
        idle_destroy_after_s=0.0,  # no work command: kept idle, to be shown so
    )
    # An offer whose listing is hostile: markup and bidi characters in its text fields.
    hostile = {**offer, "id": offer["id"] + 1000, "machine_id": 990_001,
               "gpu_name": HOSTILE + SPOOF, "geolocation": " ".join(PAYLOADS) + SPOOF,
               "cpu_name": " ".join(PAYLOADS)}
    # A slice of a big host whose instance would get too little RAM: deploys refuse it.
    small = next(o for o in slice_offers() if o["id"] == 9010)
    provider = LocalProvider(tmp_path / "instances", time_scale=600.0,
                             offers=[offer, hostile, small])
    server = await start_server(settings, provider)
    start_second = int(time.time())
    problems: list[str] = []
    try:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
                args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000},
            )
            try:
                page = context.pages[0] if context.pages else await context.new_page()

                async def on_dialog(dialog: Any) -> None:
                    problems.append(f"dialog: {dialog.message}")
                    await dialog.dismiss()

                page.on("dialog", on_dialog)
                page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
                page.on("console", lambda msg: problems.append(f"console: {msg.text}")
                        if msg.type == "error" else None)
                await _drive(page, server.url, offer, start_second)
                await _fleet_pages(page, server.store)
            finally:
                await context.close()
    finally:
        await provider.close()
        await server.stop()
    # A CSP violation, a script error or an alert from injected markup shows up here
    # (401s are expected: the page asks for its session before login, a wrong token).
    unexpected = [p for p in problems if "status of 401" not in p]
    assert unexpected == [], problems


async def _metrics_carry_the_fleet(url: str, instance_id: str, offer: dict[str, Any]) -> None:
    """Acceptance 2 on the running simulated fleet: /metrics parses and has every GPU."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(url + "/metrics",
                                                                headers=ADMIN) as resp:
        assert resp.status == 200
        text = await resp.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("vm_gpu_utilization_percent", "vm_gpu_pcie_tx_bytes_per_second",
                 "vm_gpu_pcie_rx_bytes_per_second", "vm_gpu_power_watts",
                 "vm_gpu_temperature_celsius"):
        mine = [s for s in fams[name].samples if s.labels["instance_id"] == instance_id]
        assert sorted(s.labels["gpu"] for s in mine) == ["0", "1"], name
        assert all(s.labels["machine_id"] == str(offer["machine_id"]) for s in mine)
        assert all(s.labels["gpu_name"] for s in mine)


async def until(page: Any, expression: str, timeout_s: float = 15.0) -> None:
    """Poll a page expression until it is true, with a deadline.

    (Playwright's wait_for_function evaluates strings with eval inside the page,
    which the dashboard's CSP rightly forbids; evaluate() goes through the
    debugger protocol instead.)
    """
    deadline = time.monotonic() + timeout_s
    while not await page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {expression}")
        await asyncio.sleep(0.1)


async def _fits(page: Any, name: str) -> None:
    """No sideways scrolling at 1,400 px nor on a 390 px phone: not the page, not a table
    inside it. Screenshots of both widths are left in test-artifacts/dashboard/."""
    for width in (1400, 390):
        await page.set_viewport_size({"width": width, "height": 900})
        await asyncio.sleep(0.3)
        over = await page.evaluate(
            "() => ({page: document.documentElement.scrollWidth - window.innerWidth,"
            " tables: [...document.querySelectorAll('.table-wrap')]"
            ".filter((w) => w.offsetParent !== null && w.scrollWidth > w.clientWidth + 1)"
            ".map((w) => w.firstElementChild.id)})")
        await page.screenshot(path=str(ARTIFACTS / f"fit-{name}-{width}px.png"), full_page=True)
        assert over == {"page": 0, "tables": []}, (name, width, over)
    await page.set_viewport_size({"width": 1400, "height": 1000})


async def _idle_shown(page: Any, instance_id: str) -> None:
    """The local fleet runs no work command: once proving, its instance completes nothing
    and the fleet page says idle (state, warning, tile) instead of counting its rate."""
    await page.click("#nav a[data-route=fleet]")
    await until(page, f"(() => {{ const r = document.querySelector(\"tr[data-instance-id="
                      f"'{instance_id}']\"); return r && r.textContent.includes('idle'); }})()",
                timeout_s=120)
    await until(page, "!document.getElementById('fleet-idle').hidden")
    warning = await page.text_content("#fleet-idle") or ""
    assert f"#{instance_id} is idle" in warning and "VM_WORK_CMD" in warning
    await page.screenshot(path=str(ARTIFACTS / "09-fleet-idle.png"), full_page=True)
    await _fits(page, "fleet-idle")


async def _hosts_page(page: Any, offer: dict[str, Any]) -> None:
    """The measured host, its scaling verdict and the rate model, on a page that fits."""
    await page.click("#nav a[data-route=hosts]")
    await page.wait_for_selector("#hosts-view:not([hidden])")
    row = page.locator(f"#hosts-table tr[data-machine-id='{offer['machine_id']}']")
    await row.wait_for(timeout=30_000)
    await until(page, "document.querySelectorAll('#scaling-table tbody tr').length >= 1",
                timeout_s=30)
    facts = await page.text_content("#model-facts") or ""
    assert "measurements" in facts and "GPU models" in facts
    await page.screenshot(path=str(ARTIFACTS / "10-hosts.png"), full_page=True)
    await _fits(page, "hosts")


async def _autopilot_and_bad_hosts_pages(page: Any, url: str) -> None:
    """The Autopilot page (its plan table's hypotheses wrap) and the Bad hosts page (why
    and until when, Remove and Forgive) fit too."""
    await page.click("#nav a[data-route=autopilot]")
    await page.wait_for_selector("#autopilot-view:not([hidden])")
    await until(page, "document.getElementById('plan-summary').textContent !== ''",
                timeout_s=30)
    await page.screenshot(path=str(ARTIFACTS / "11-autopilot.png"), full_page=True)
    await _fits(page, "autopilot")
    async with aiohttp.ClientSession() as session, session.post(
            url + "/api/bad-hosts", headers=ADMIN,
            json={"machine_id": "41999", "reason": "a long reason " * 12, "hours": 48}) as resp:
        assert resp.status == 200
    await page.click("#nav a[data-route=bad-hosts]")
    row = page.locator("#bad-hosts-table tr[data-machine-id='41999']")
    await row.wait_for(timeout=15_000)
    assert await row.locator("button.forgive-bad-host").count() == 1
    await page.screenshot(path=str(ARTIFACTS / "12-bad-hosts.png"), full_page=True)
    await _fits(page, "bad-hosts")


async def _drive(page: Any, url: str, offer: dict[str, Any], start_second: int) -> None:
    await page.goto(url + "/")
    await page.wait_for_selector("#login-view:not([hidden])")
    await page.fill("#token", "wrong-token-wrong-token")
    await page.click("#login-button")
    await until(page, "document.querySelector('#login-error').textContent !== ''")
    await page.screenshot(path=str(ARTIFACTS / "01-login-refused.png"))
    await page.fill("#token", ADMIN_TOKEN)
    await page.click("#login-button")
    await page.wait_for_selector("#fleet-view:not([hidden])")
    await page.screenshot(path=str(ARTIFACTS / "02-fleet-empty.png"))

    # Offers, and a deploy through the local provider (two clicks: arm, confirm).
    await page.click("#nav a[data-route=offers]")
    deploy = page.locator(f"tr[data-offer-id='{offer['id']}'] button.deploy")
    await deploy.wait_for()
    await page.screenshot(path=str(ARTIFACTS / "03-offers.png"), full_page=True)
    await _fits(page, "offers")
    # Deploy is disabled where the coordinator would refuse, saying why.
    refused = page.locator("tr[data-offer-id='9010'] button.deploy")
    assert await refused.is_disabled()
    assert "RAM" in (await refused.get_attribute("title") or "")
    # The chart: every predicted offer a dot with its interval, the break-even line drawn.
    await until(page, "Number(document.getElementById('chart-offers').dataset.points || 0) >= 2")
    assert await page.locator("#chart-offers line.break-even").count() == 1
    assert await page.locator("#chart-offers circle.offer-dot").count() >= 2
    # Deploy sits beside the offer's id, inside a 1,400 px window.
    box = await deploy.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1400, box
    # The hostile offer's fields are text: every payload shown as written, no element
    # made from any, bidi and control characters as escapes.
    hostile_row = page.locator(f"tr[data-offer-id='{offer['id'] + 1000}']")
    shown = await hostile_row.text_content() or ""
    assert all(p in shown for p in PAYLOADS), shown
    assert "\\u202egnp.exe\\u2066\\u009b\\u2028" in shown
    assert not any(c in shown for c in SPOOF if not c.isalnum() and c not in ".")
    made = "#offers-table img, #offers-table script, #offers-table svg, #offers-table iframe, " \
           "#offers-table details, #offers-table a"
    assert await page.locator(made).count() == 0
    await deploy.click()
    await until(page, "document.querySelector('button.deploy.armed') !== null")
    await deploy.click()
    await until(page, "location.hash.startsWith('#/instance/')", timeout_s=30)
    instance_id = (await page.evaluate("location.hash")).rsplit("/", 1)[1]

    # The fleet sees it.
    await page.click("#nav a[data-route=fleet]")
    row = page.locator(f"#fleet-table tr[data-instance-id='{instance_id}']")
    await row.wait_for()
    cells = await row.locator("td").all_text_contents()
    assert cells[0] == instance_id and f"2 x {offer['gpu_name']}" in cells
    # The provider's own view beside ours: a local instance is never said to be vast.ai's.
    assert cells[-1].startswith("local "), cells
    # Wait until the agent said hello: its state leaves "deploying".
    await until(page,
        f"(() => {{ const r = document.querySelector(\"tr[data-instance-id='{instance_id}']\");"
        " return r && r.dataset.state !== 'deploying'; })()", timeout_s=60)
    await page.screenshot(path=str(ARTIFACTS / "04-fleet.png"), full_page=True)
    await _fits(page, "fleet")

    # The instance page with its charts: wait until both GPUs have several points.
    await row.locator("a.instance-link").click()
    await page.wait_for_selector("#instance-view:not([hidden])")
    for chart in ("chart-util", "chart-pcie"):
        await until(page,
            f"Number(document.getElementById('{chart}').dataset.points || 0) >= 6",
            timeout_s=90)
    # ... and the benchmark has made the GPUs busy.
    await until(page, "Number(document.getElementById('chart-util').dataset.max || 0) > 0",
                timeout_s=90)
    assert await page.locator("#chart-util polyline").count() == 2
    assert await page.locator("#chart-pcie polyline").count() == 4
    assert await page.locator("#gpu-table tbody tr").count() == 2
    await until(page, "document.querySelector('#logs').textContent.length > 0",
                                 timeout_s=30)
    await page.screenshot(path=str(ARTIFACTS / "05-instance.png"), full_page=True)
    await _metrics_carry_the_fleet(url, instance_id, offer)
    await _idle_shown(page, instance_id)
    await _hosts_page(page, offer)
    await _autopilot_and_bad_hosts_pages(page, url)

    # Host-sent markup stays text everywhere it is shown.
    await _hostile_byo_agent(url, start_second)
    await page.click("#nav a[data-route=fleet]")
    hostile_row = page.locator("#fleet-table tr", has_text="rig <img")
    await hostile_row.wait_for(timeout=15_000)
    await hostile_row.locator("a.instance-link").click()
    await until(page,
        "document.querySelector('#logs').textContent.includes('<script>alert(2)')",
        timeout_s=15)
    facts = await page.text_content("#host-facts") or ""
    assert HOSTILE in facts
    assert HOSTILE in (await page.text_content("#instance-title") or "")
    assert await page.locator("img").count() == 0
    assert await page.locator("#logs script").count() == 0
    # The batch's lines arrive together: every payload is shown as written, as text.
    shown_logs = await page.text_content("#logs") or ""
    assert all(p in shown_logs for p in PAYLOADS), shown_logs
    assert await page.locator("#logs *").count() == 0  # text only, no element
    # Bidi and control characters reach the page as escapes (textsafe.js).
    assert "\\u202egnp.exe\\u2066\\u009b\\u2028" in facts
    await until(page, "document.querySelector('#results-table').textContent"
                      ".includes('names a GPU more than once')", timeout_s=15)
    page_text = await page.evaluate("document.body.innerText")
    assert not any(c in page_text for c in SPOOF if not c.isalnum() and c not in ".")
    logs = await page.text_content("#logs") or ""
    assert "spoof\\u202egnp.exe" in logs and "\nFAKE" not in logs
    await page.screenshot(path=str(ARTIFACTS / "06-hostile-text.png"), full_page=True)

    # Bad hosts: add, then remove.
    await page.click("#nav a[data-route=bad-hosts]")
    await page.wait_for_selector("#bad-hosts-view:not([hidden])")
    await page.fill("#bad-host-machine", "41099")
    await page.fill("#bad-host-reason", "noisy neighbour")
    await page.click("#bad-host-form button[type=submit]")
    bad_row = page.locator("#bad-hosts-table tr[data-machine-id='41099']")
    await bad_row.wait_for()
    await page.screenshot(path=str(ARTIFACTS / "07-bad-hosts.png"), full_page=True)
    remove = bad_row.locator("button.remove-bad-host")
    await remove.click()
    await remove.click()
    await bad_row.wait_for(state="detached")


async def _fleet_pages(page: Any, store: Any) -> None:
    """A fleet larger than a page: the table shows it a page at a time, in id order, and
    filters it by state; the tiles still count the whole fleet."""
    now = time.time()
    await page.click("#nav a[data-route=fleet]")
    await page.wait_for_selector("#fleet-view:not([hidden])")
    before = int(await page.evaluate("document.querySelectorAll('#fleet-table tbody tr').length"))

    def gone(tx: Any) -> None:
        for i in range(150):
            tx.instances.add({"label": f"gone-{i}", "kind": "byo", "state": "destroyed",
                             "created_at": now, "destroyed_at": now})

    await store.write(gone)
    total = before + 150
    await until(page, "!document.getElementById('fleet-next').disabled")
    rows = "document.querySelectorAll('#fleet-table tbody tr')"
    assert await page.evaluate(f"{rows}.length") == 100
    first = await page.evaluate(f"[...{rows}].map((r) => Number(r.dataset.instanceId))")
    assert first == sorted(first)
    assert await page.text_content("#fleet-range") == f"1–100 of {total}"
    await page.click("#fleet-next")
    await until(page, "document.getElementById('fleet-range').textContent.startsWith('101')")
    second = await page.evaluate(f"[...{rows}].map((r) => Number(r.dataset.instanceId))")
    assert len(second) == total - 100 and min(second) > max(first)
    assert await page.is_disabled("#fleet-next")
    await page.screenshot(path=str(ARTIFACTS / "08-fleet-page-2.png"), full_page=True)
    await page.click("#fleet-prev")
    await until(page, "document.getElementById('fleet-range').textContent.startsWith('1–')")

    # The filter: its choices count each state; picking one starts again at its first page.
    options = await page.evaluate(
        "[...document.querySelectorAll('#fleet-state option')].map((o) => o.textContent)")
    assert f"all states ({total})" in options and "destroyed (150)" in options
    await page.select_option("#fleet-state", "destroyed")
    await until(page, "document.getElementById('fleet-range').textContent === '1–100 of 150'")
    states = await page.evaluate(f"[...{rows}].map((r) => r.dataset.state)")
    assert states == ["destroyed"] * 100
    await page.click("#fleet-next")
    await until(page, "document.getElementById('fleet-range').textContent === '101–150 of 150'")
    assert await page.is_disabled("#fleet-next")
    # The tiles count the whole fleet (the coordinator's sums), not the page shown.
    summary = await page.evaluate("fetch('/api/fleet').then((r) => r.json())")
    assert summary["instances"] == total and summary["by_state"]["destroyed"] == 150
    await until(page, "document.querySelector('#fleet-tiles .tile-value').textContent === "
                      f"'{summary['billing']}'")
    # A local fleet's rates and dollars are simulated, and the tiles say so.
    assert summary["provider"] == "local"
    await until(page, "document.querySelector('#fleet-tiles .tile:last-child .tile-value')"
                      ".textContent === 'simulated'")
    await page.select_option("#fleet-state", "")
    await until(page, f"document.getElementById('fleet-range').textContent === '1–100 of {total}'")

    # Logging out ends the session: the API refuses, the page shows the login again.
    await page.click("#logout")
    await page.wait_for_selector("#login-view:not([hidden])")
    status = await page.evaluate("fetch('/api/instances').then(r => r.status)")
    assert status == 401
