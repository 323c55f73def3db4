"""An instance on the simulated cuzk (the local provider, or the fake vast.ai of
``serve --provider fake``) has its rate labelled simulated in ``status`` and
``instance``, and the fake's dollars too; a vast.ai instance's are not."""

from __future__ import annotations

import time
from typing import Any

import pytest

from vast_manager.coordinator.cli.commands import STATUS_HEADERS, _account_line, status_row
from vast_manager.coordinator.cli.text_views import render_instance


def _row(provider: str) -> dict[str, Any]:
    return {"id": 1, "state": "proving", "phase": "proving", "num_gpus": 1,
            "gpu_name": "RTX 4090", "rate_per_hour": 61.0, "min_rate_per_hour": 40.0,
            "usd_per_proof": 0.004, "billing_now_per_hour": 0.25, "dph_total": 0.25,
            "provider": provider, "provider_instance_id": 7001, "provider_status": "running"}


@pytest.mark.parametrize(("provider", "source"), [("local", "local provider"),
                                                  ("fake", "fake vast.ai"), ("vast", None)])
def test_the_rate_says_simulated_where_it_is(provider: str, source: str | None) -> None:
    row = dict(zip(STATUS_HEADERS, status_row(_row(provider), time.time()), strict=True))
    shown = render_instance(_row(provider))
    assert row["RATE/H"].endswith(" (sim)") is (source is not None)
    assert (f"(SIMULATED: {source})" in shown) if source else "SIMULATED" not in shown
    assert ("(simulated dollars)" in shown) is (provider == "fake")
    assert row["VAST.AI"].startswith("fake ") is (provider == "fake")


class _Fleet:
    """What ``status`` reads of /api/fleet for its account line."""

    def __init__(self, provider: str) -> None:
        self.fleet = {"provider": provider, "account": {"funds_usd": 12.5, "auth_ok": True}}

    def get(self, path: str) -> dict[str, Any]:
        assert path == "/api/fleet"
        return self.fleet


@pytest.mark.parametrize(("provider", "line"), [
    ("fake", "fake vast.ai funds $12.50 (simulated)"), ("vast", "vast.ai funds $12.50")])
def test_the_fake_vast_ai_funds_are_said_simulated(
    provider: str, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _account_line(_Fleet(provider))  # type: ignore[arg-type]
    assert capsys.readouterr().out.strip() == line
