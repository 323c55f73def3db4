"""The dashboard, in headless Chromium, on a coordinator reading a real PostgreSQL with
Curio's tables and a proof price: the earnings tiles while the database answers, the
cluster's banner once it is stopped."""

from __future__ import annotations

from pathlib import Path

from vast_manager.coordinator.providers.local.provider import LocalProvider
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web.server import start_server

from support.browser import CHROMIUM, CHROMIUM_ARGS, async_playwright_or_skip
from support.coord_support import ADMIN_TOKEN, SECRET_HEX
from support.postgres import postgres_server


async def test_the_banner_and_the_earnings_tiles(tmp_path: Path) -> None:
    async_playwright = async_playwright_or_skip()
    with postgres_server() as pg:
        await pg.prepare()
        settings = Settings.from_env(
            {"VM_ADMIN_TOKEN": ADMIN_TOKEN, "VM_FLEET_SECRET": SECRET_HEX},
            db_path=str(tmp_path / "coord.db"), config_dir=str(tmp_path / "config"),
            host="127.0.0.1", port=0, monitor_interval_s=1.0, curio_db_url=pg.reader_url,
            curio_read_timeout_s=3.0, proof_price_usd=0.02)
        provider = LocalProvider(tmp_path / "instances", time_scale=1.0, offers=[])
        server = await start_server(settings, provider)
        try:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = await browser.new_page()
                    await page.goto(server.url + "/")
                    await page.wait_for_selector("#login-view:not([hidden])")
                    await page.fill("#token", ADMIN_TOKEN)
                    await page.click("#login-button")
                    await page.wait_for_selector("#fleet-view:not([hidden])")
                    await page.wait_for_selector("#fleet-tiles :text('profit / hour')")
                    assert await page.locator("#cluster-alert").is_hidden()
                    pg.stop()
                    await page.wait_for_selector("#cluster-alert:not([hidden])", timeout=30_000)
                    text = await page.locator("#cluster-alert").text_content() or ""
                    assert text.startswith("cluster database unavailable")
                    assert "nothing is destroyed" in text
                    assert "reader-pass" not in text
                finally:
                    await browser.close()
        finally:
            await provider.close()
            await server.stop()
