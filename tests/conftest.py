"""Fixtures the whole suite shares: the coordinator's settings, the fakes and the harness.

Support code lives in the ``support`` package (tests/support, on ``sys.path`` through
pyproject's ``pythonpath``); a test module asks for these by name instead of building
them itself. A module's own fixture of the same name takes precedence.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.settings import Settings

from support.coord_support import Harness, make_settings, start
from support.fakes_provider import FakeClock, FakeProvider
from support.tools import in_ci


def pytest_report_header() -> str:
    return ("CI=true: a test missing a tool fails (support.tools.require_tool)" if in_ci()
            else "not CI: a test missing a tool skips and says why (-rs)")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist's controller: hand each worker the terminal variables it was run with."""
    node.workerinput["terminal_env"] = {n: os.environ.get(n) for n in ("COLUMNS", "LINES")}


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker starts with COLUMNS=80 that the command line did not have; the CLI
    # fits its tables to COLUMNS (coordinator/cli/render.py), so the worker takes the
    # controller's value (or none) and a test sees what a one-process run sees.
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    for name, value in workerinput.get("terminal_env", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def fake_clock() -> FakeClock:
    """Unix seconds that move only when the test advances them."""
    return FakeClock()


@pytest.fixture
def fake_provider() -> FakeProvider:
    """An in-memory provider with no offers; the test adds what it needs."""
    return FakeProvider()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The coordinator's test settings, its database and files under ``tmp_path``."""
    return make_settings(tmp_path)


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path, fake_clock: FakeClock,
            fake_provider: FakeProvider) -> Harness:
    """The coordinator's app under aiohttp's test client, with ``fake_clock`` and
    ``fake_provider``, its monitor not running (the test drives it)."""
    return await start(aiohttp_client, tmp_path, provider=fake_provider, clock=fake_clock)
