"""What instances that will never run bill, on a fake vast.ai with an injected clock.

Run: ``python bench/billing.py [--per-status 4] [--failed-creates 4] [--quick]``, or
``python bench/billing.py --week [--days 7]`` for a simulated week in dollars by part,
``python bench/billing.py --interruptible`` for trials at a bid against on demand
(``bench/billing_week.py``).

A real coordinator (``create_app``, the real ``VastProvider`` and ``VastClient``)
against the fake vast.ai of ``tests/support/fakevast.py`` (statuses and error bodies as
vast.ai documents them, docs/vast.md), its monitor driven round by round every
``VM_MONITOR_INTERVAL_S`` (60 s) of a clock that only moves when told, so
nothing sleeps. Deployed instances say hello and prove, heartbeating every
15 s. Then, for each status that never runs (``exited``, ``unknown``,
``offline``, ``stopped``, and ``created`` with an "OCI runtime create failed"
start), ``--per-status`` instances take it and their agents fall silent (a
``created`` one never said hello). ``--failed-creates`` deploys are answered
``success: false`` with a ``new_contract``: an instance exists and bills from
the start.

The figure is the instance-minutes the fake vast.ai billed *past the second
monitor round* after each instance went dead (a failed create is dead from its
create). The same run repeats under the previous rules as the baseline: only
``exited`` and ``offline`` destroyed, on first sight; a failed create's instance
id dropped (reconciliation finds it by its label once the unowned grace has
passed). Every figure printed is computed by this run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import billing_week  # noqa: E402
from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from vast_manager.coordinator.decisions import policy  # noqa: E402
from vast_manager.coordinator.decisions import reconcile as reconcile_module  # noqa: E402
from vast_manager.coordinator.operations import deploy as deploy_module  # noqa: E402
from vast_manager.coordinator.operations import reconciliation as monitor_module  # noqa: E402
from vast_manager.coordinator.providers.vast.client import VastClient  # noqa: E402
from vast_manager.coordinator.providers.vast.provider import DEFAULT_ONSTART, VastProvider  # noqa: E402
from vast_manager.coordinator.store.writer import Store  # noqa: E402
from vast_manager.coordinator.web.app import create_app  # noqa: E402

from support.coord_support import Harness, make_settings  # noqa: E402
from support.fakes_provider import FakeClock  # noqa: E402
from support.fakevast import FAKE_API_KEY, OCI_START_FAILURE, FakeVast  # noqa: E402

#: (status, status_msg) each dead group ends in.
DEAD = (
    ("exited", None),
    ("unknown", None),
    ("offline", None),
    ("stopped", None),
    ("created", OCI_START_FAILURE),
)
MONITOR_INTERVAL_S = 60.0
HEARTBEAT_S = 15.0
DEAD_AFTER_S = 600.0  # healthy for ten minutes, then the fault
HORIZON_S = 3 * 3600.0  # the longest the simulation runs


@dataclass
class Outcome:
    rules: str
    instances: int = 0
    destroyed: int = 0
    #: instance-minutes billed past the second monitor round after the dead status
    past_second_round_min: float = 0.0
    #: instance-minutes billed after the dead status, in all
    after_dead_min: float = 0.0
    by_group: dict[str, float] = field(default_factory=dict)
    longest_after_dead_min: float = 0.0


@contextlib.contextmanager
def previous_rules() -> Iterator[None]:
    """The coordinator before it read vast.ai as vast.ai means it (the baseline)."""

    def old_never_runs(inst: Any) -> str | None:
        status = inst.get("actual_status")
        return f"vast.ai status {status}" if status in ("exited", "offline") else None

    class NeverRaised(Exception):
        pass

    saved = (reconcile_module.never_runs, monitor_module.DEAD_AFTER_ROUNDS,
             deploy_module.CreateFailed)
    reconcile_module.never_runs = old_never_runs  # type: ignore[assignment]
    monitor_module.DEAD_AFTER_ROUNDS = 1
    deploy_module.CreateFailed = NeverRaised  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        (reconcile_module.never_runs, monitor_module.DEAD_AFTER_ROUNDS,
         deploy_module.CreateFailed) = saved  # type: ignore[assignment,misc]


async def no_sleep(_seconds: float) -> None:
    return None


async def simulate(rules: str, per_status: int, failed_creates: int, workdir: Path) -> Outcome:
    """One run; ``rules`` is ``current`` or ``previous``."""
    clock = FakeClock()
    out = Outcome(rules)
    with previous_rules() if rules == "previous" else contextlib.nullcontext():
        async with FakeVast(clock=clock) as fake:
            provider = VastProvider(
                VastClient(FAKE_API_KEY, fake.url, sleep=no_sleep, rng=lambda: 0.0),
                image="ghcr.io/example/vast-agent:bench", onstart=DEFAULT_ONSTART,
            )
            store = Store(workdir / f"{rules}.db")
            settings = make_settings(workdir / rules, monitor_interval_s=MONITOR_INTERVAL_S,
                                     next_heartbeat_s=int(HEARTBEAT_S))
            app = create_app(settings, store, provider, clock, run_monitor=False)
            client = TestClient(TestServer(app))
            await client.start_server()
            try:
                clock.advance(1)
                h = Harness(client, clock, provider)  # type: ignore[arg-type]
                await _run(h, fake, clock, per_status, failed_creates, out)
            finally:
                await client.close()
                store.close()
                await provider.close()
    return out


async def _run(h: Harness, fake: FakeVast, clock: FakeClock, per_status: int,
               failed_creates: int, out: Outcome) -> None:
    offer_id = 9300
    groups: dict[int, str] = {}  # vast.ai instance id -> group
    agents: dict[int, Any] = {}
    dead_at: dict[int, float] = {}
    for status, _msg in DEAD:
        for _ in range(per_status):
            offer_id += 1
            fake.add_offer(offer_id, 70_000 + offer_id, dph_total=0.40)
            status_code, data = await h.admin("POST", "/api/deploy", {"offer_id": offer_id})
            assert status_code == 200, data
            vid = int(data["provider_instance_id"])
            groups[vid] = status if status != "created" else "created (OCI failure)"
            if status != "created":  # a container that never started never says hello
                agent = h.agent(data["agent_id"])
                assert (await agent.hello())[0] == 200
                agents[vid] = agent
    fake.create_fails_with_instance = failed_creates
    for _ in range(failed_creates):
        offer_id += 1
        fake.add_offer(offer_id, 70_000 + offer_id, dph_total=0.40)
        status_code, data = await h.admin("POST", "/api/deploy", {"offer_id": offer_id})
        assert status_code == 502, data
    for iid, billing in fake.billing.items():  # destroyed at once or not, each billed
        if iid not in groups:
            groups[iid] = "failed create"
            dead_at[iid] = billing.created_at
    out.instances = len(groups)

    start = clock.now
    rounds: list[float] = []
    faulted = False
    while clock.now - start < HORIZON_S:
        for _ in range(int(MONITOR_INTERVAL_S / HEARTBEAT_S)):
            clock.advance(HEARTBEAT_S)
            if not faulted and clock.now - start >= DEAD_AFTER_S:
                faulted = True
                # offline and unknown are a host's trouble while its agent still speaks
                # (kept, docs/operations.md): such an instance is dead once its silence
                # timer runs out, not before.
                ttl = policy.silence_ttl_s(HEARTBEAT_S, h.core.settings.silence_grace_s)
                for (status, msg), vids in _by_status(groups):
                    for vid in vids:
                        fake.set_status(vid, status, msg)
                        trouble = status in monitor_module.HOST_TROUBLE_STATUSES
                        dead_at[vid] = clock.now + (ttl if trouble else 0.0)
                        agents.pop(vid, None)  # it runs nothing now: silent
            for vid, agent in agents.items():
                if vid in fake.instances:
                    await agent.heartbeat("proving")
        await h.core.monitor.tick()
        rounds.append(clock.now)
        if all(v not in fake.instances for v in groups):
            break

    end = clock.now
    for vid, group in groups.items():
        died = dead_at.get(vid)
        if died is None:
            continue
        second = [t for t in rounds if t >= died][1:2]
        past = fake.billing[vid].seconds(second[0], end) if second else 0.0
        after = fake.billing[vid].seconds(died, end)
        out.past_second_round_min += past / 60.0
        out.after_dead_min += after / 60.0
        out.by_group[group] = out.by_group.get(group, 0.0) + past / 60.0
        out.longest_after_dead_min = max(out.longest_after_dead_min, after / 60.0)
        out.destroyed += vid not in fake.instances


def _by_status(groups: dict[int, str]) -> list[tuple[tuple[str, str | None], list[int]]]:
    out = []
    for status, msg in DEAD:
        name = status if status != "created" else "created (OCI failure)"
        out.append(((status, msg), [v for v, g in groups.items() if g == name]))
    return out


def report(current: Outcome, previous: Outcome) -> str:
    lines = [
        "vast.ai fault simulation: fake vast.ai, injected clock, monitor every "
        f"{MONITOR_INTERVAL_S:.0f} s, agents heartbeating every {HEARTBEAT_S:.0f} s",
        f"{current.instances} instances: {', '.join(sorted(set(current.by_group)))}",
        "",
        f"{'rules':<10} {'billed past 2nd round':>24} {'billed after dead':>20} "
        f"{'longest':>10} {'destroyed':>10}",
    ]
    for o in (current, previous):
        lines.append(
            f"{o.rules:<10} {o.past_second_round_min:>17.1f} inst-min "
            f"{o.after_dead_min:>13.1f} inst-min {o.longest_after_dead_min:>6.1f} min "
            f"{o.destroyed:>5}/{o.instances}"
        )
    lines.append("")
    lines.append("billed past the second round, by group (instance-minutes): current / previous")
    for group in sorted(current.by_group):
        lines.append(f"  {group:<24} {current.by_group[group]:>8.1f} / "
                     f"{previous.by_group.get(group, 0.0):.1f}")
    ratio = (previous.after_dead_min / current.after_dead_min
             if current.after_dead_min else float("inf"))
    lines.append("")
    lines.append(f"ratio: previous / current instance-minutes billed after dead: {ratio:.1f}x")
    lines.append(
        f"instance-minutes billed past the second monitor round after a dead status: "
        f"{current.past_second_round_min:.1f}"
    )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    if args.interruptible:
        with tempfile.TemporaryDirectory(prefix="vm-billing-bid-") as tmp:
            on_demand = await billing_week.simulate_trials(Path(tmp) / "a", interruptible=False)
            bid = await billing_week.simulate_trials(Path(tmp) / "b", interruptible=True)
        print(billing_week.trials_report(on_demand, bid))
        return 0 if sum(bid.billed.values()) < sum(on_demand.billed.values()) else 1
    if args.week:
        with tempfile.TemporaryDirectory(prefix="vm-billing-week-") as tmp:
            week = await billing_week.simulate_week(Path(tmp), args.days)
        print(billing_week.week_report(week))
        return 0 if billing_week.week_ok(week) else 1
    with tempfile.TemporaryDirectory(prefix="vm-billing-") as tmp:
        current = await simulate("current", args.per_status, args.failed_creates, Path(tmp))
        previous = await simulate("previous", args.per_status, args.failed_creates, Path(tmp))
    print(report(current, previous))
    return 0 if current.past_second_round_min == 0 and current.destroyed == current.instances \
        else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-status", type=int, default=4,
                        help="instances ending in each status that never runs")
    parser.add_argument("--failed-creates", type=int, default=4,
                        help="creates answered success: false with an instance")
    parser.add_argument("--quick", action="store_true", help="one of each (smoke test)")
    parser.add_argument("--week", action="store_true",
                        help="a simulated week of a small fleet, in dollars by part "
                             "(bench/billing_week.py)")
    parser.add_argument("--days", type=float, default=7.0, help="the week's length in days")
    parser.add_argument("--interruptible", action="store_true",
                        help="trials on demand against interruptible trials at a bid")
    args = parser.parse_args()
    # The coordinator logs every destroy it makes; the figures are what this prints.
    logging.basicConfig(level=logging.ERROR)
    if args.quick:
        args.per_status, args.failed_creates = 1, 1
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
