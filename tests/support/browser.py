"""Headless Chromium for the dashboard's tests: where it is, how it starts, and Playwright's
entry point (or a skip naming what to install, a failure under CI)."""

from __future__ import annotations

import os
from typing import Any

from support.tools import skip_or_fail

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def async_playwright_or_skip() -> Any:
    """Playwright's ``async_playwright``, once the package and Chromium are both there."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        skip_or_fail("playwright (the Python package) is not installed: pip install -e '.[test]'")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        skip_or_fail(f"{CHROMIUM} is not installed (apt-get install chromium; .ci/run does it)")
    return async_playwright
