"""The fault simulation of bench/billing.py: instances ending in every status that never
runs, and failed creates that made an instance, on the fake vast.ai with an injected
clock. What they bill past the second monitor round after going dead is 0."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from support.paths import REPO_ROOT

ROOT = REPO_ROOT
sys.path.insert(0, str(ROOT / "bench"))

import billing  # noqa: E402


async def test_nothing_bills_past_the_second_round_after_a_dead_status(tmp_path: Path) -> None:
    current = await billing.simulate("current", 2, 2, tmp_path)
    previous = await billing.simulate("previous", 2, 2, tmp_path)
    print()
    print(billing.report(current, previous))
    # 2 each of exited, unknown, offline, stopped, created with a start failure; 2 failed
    # creates that made an instance.
    assert current.instances == previous.instances == 12
    assert current.destroyed == current.instances
    assert current.past_second_round_min == 0.0
    assert set(current.by_group) == {"exited", "unknown", "offline", "stopped",
                                     "created (OCI failure)", "failed create"}
    # A dead instance bills for at most the two rounds it takes to be sure.
    assert current.longest_after_dead_min <= 2 * billing.MONITOR_INTERVAL_S / 60.0
    # The baseline is measured, not assumed: the previous rules left most of them billing.
    assert previous.past_second_round_min > 10.0
    for group in ("unknown", "stopped", "created (OCI failure)", "failed create"):
        assert previous.by_group[group] > 0, group


@pytest.mark.slow  # a simulated day of monitor rounds: minutes on 2 cores
async def test_a_simulated_day_bills_nothing_unwatched_and_keeps_what_lives(
        tmp_path: Path) -> None:
    """bench/billing.py --week, one day of it: dollars by part as the fake billed them, the
    ledger within 5%, $0 on instances unwatched past the grace or destroyed alive."""
    import billing_week

    week = await billing_week.simulate_week(tmp_path, days=1.0)
    print()
    print(billing_week.week_report(week))
    assert week.unwatched_usd == 0.0
    assert week.destroyed_alive_usd == 0.0 and week.destroyed_alive == []
    assert week.kept_offline
    assert week.kept_at_zero >= 4 and week.resumed == week.kept_at_zero
    assert week.strikes == 3  # never loads, dies, exits
    for part in billing_week.PARTS:
        assert week.billed[part] > 0
        assert abs(week.ledger[part] - week.billed[part]) <= 0.05 * week.billed[part], part
    assert billing_week.week_ok(week)


async def test_interruptible_trials_cost_less_and_an_outbid_one_is_kept(tmp_path: Path) -> None:
    """bench/billing.py --interruptible: the same trials on demand and at a bid."""
    import billing_week

    on_demand = await billing_week.simulate_trials(tmp_path / "a", interruptible=False)
    bid = await billing_week.simulate_trials(tmp_path / "b", interruptible=True)
    print()
    print(billing_week.trials_report(on_demand, bid))
    assert on_demand.destroyed_early == bid.destroyed_early == 0
    assert bid.outbid_kept == 2 and on_demand.outbid_kept == 0
    assert bid.billed["rent"] < 0.7 * on_demand.billed["rent"]
    assert bid.billed["storage"] > on_demand.billed["storage"]  # the wait bills storage
    assert sum(bid.billed.values()) < sum(on_demand.billed.values())
