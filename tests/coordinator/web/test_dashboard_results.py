"""The dashboard's instance view pages through a flooded instance's results, in headless
Chromium: the newest page first, older pages on request, never every row at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support.browser import CHROMIUM, CHROMIUM_ARGS, async_playwright_or_skip
from support.coord_support import ADMIN_TOKEN, ServerThread, hello_msg
from support.fakes_provider import FakeProvider
from support.fault_support import admin_call, http, signed_headers

RESULTS = 45  # under the flood rule's revocation, past two pages of 20


def small_result(i: int) -> bytes:
    now = time.time()
    return json.dumps({
        "result_id": f"res_page_{i}", "kind": "benchmark", "proof_type": "porep-32g",
        "started_at": now - 600, "finished_at": now, "gpus_used": [0],
        "proofs_completed": 10 + i, "proofs_failed": 0, "wall_seconds": 600.0,
        "rate_per_hour": 60.0 + i, "proof_seconds": [60.0] * 3, "telemetry": None,
    }).encode()


async def test_the_instance_view_pages_its_results(tmp_path: Path) -> None:
    async_playwright = async_playwright_or_skip()
    with ServerThread(tmp_path, FakeProvider([])) as thread:
        url = thread.server.url
        issued = admin_call(url, "POST", "/api/agents", {"label": "pages"})
        agent_id, key = issued["agent_id"], bytes.fromhex(issued["agent_key"])
        time.sleep(1.1)  # timestamps at or before the coordinator's start are refused

        def post(path: str, body: bytes) -> int:
            return http(url + path, "POST", body, {
                **signed_headers(agent_id, key, "POST", path, body),
                "Content-Type": "application/json"})[0]

        assert post("/v1/hello", json.dumps(hello_msg("boot-pages")).encode()) == 200
        # Results nobody asked for are stored as summaries; past the throttle the answer
        # is 429 but the summary is kept.
        assert all(post("/v1/result", small_result(i)) in (200, 429) for i in range(RESULTS))
        inst = thread.server.store.instance_by_agent(agent_id)
        assert inst is not None
        assert len(thread.server.store.results_for_instance(inst["id"])) == RESULTS

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                await page.goto(url + "/")
                await page.wait_for_selector("#login-view:not([hidden])")
                await page.fill("#token", ADMIN_TOKEN)
                await page.click("#login-button")
                await page.wait_for_selector("#fleet-view:not([hidden])")
                await page.goto(url + f"/#/instance/{inst['id']}")
                rows = page.locator("#results-table tbody tr")
                await page.wait_for_selector(f"#results-range:text('1–20 of {RESULTS}')")
                assert await rows.count() == 20
                assert await page.locator("#results-newer").is_disabled()
                # The newest first: the last result sent (its proofs count) leads the page.
                proofs = rows.first.locator("td").nth(2)
                assert await proofs.text_content() == str(10 + RESULTS - 1)
                await page.click("#results-older")
                await page.wait_for_selector(f"#results-range:text('21–40 of {RESULTS}')")
                await page.click("#results-older")
                await page.wait_for_selector(f"#results-range:text('41–45 of {RESULTS}')")
                assert await rows.count() == 5
                assert await page.locator("#results-older").is_disabled()
                await page.click("#results-newer")
                await page.wait_for_selector(f"#results-range:text('21–40 of {RESULTS}')")
            finally:
                await browser.close()
