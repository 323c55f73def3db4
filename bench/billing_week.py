"""A simulated week of a small fleet on the fake vast.ai, in dollars: ``bench/billing.py --week``.

The real coordinator (``create_app``, ``VastProvider``, ``VastClient``) against the
fake vast.ai of ``tests/support/fakevast.py``, which bills as vast.ai does (docs/vast.md,
"Billing and the account"): rent while running, storage for the allocated disk in
every status but offline, bandwidth per byte, drawn from a credit; at zero every
instance is stopped. Its clock moves only when told; the monitor runs every
``MONITOR_S`` and the agents (played here, signed) heartbeat every ``HEARTBEAT_S``
with their NIC byte counts. All figures are simulated.

The week, its events placed at fractions of ``days``:

- ``healthy`` x3: deployed at the start, download the setup, prove all week;
- ``flaky``: its host goes ``offline`` three times for 30 minutes while its agent
  keeps heartbeating (it must be kept);
- ``never-loads``: its host never finishes loading the image (no hello);
- ``dies``: its agent falls silent on day 2, vast.ai still says running;
- ``exits``: its container exits on day 3;
- the credit runs out on day 5 and is topped up two hours later; the account's key is
  refused for an hour on day 6.

Figures: dollars by part (what the fake billed), by instance; dollars billed on
instances *unwatched past the grace* (after the moment the coordinator's own rules
say they must be gone: silence TTL plus ``VM_LOST_TIMEOUT_S``, the no-hello
timeout, or two rounds of a dead status, plus one round); dollars of instances
*destroyed while their agent was alive*; the autopilot's ledger against the fake's
bill, by part.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from vast_manager.coordinator.decisions import policy  # noqa: E402
from vast_manager.coordinator.discovery.autopilot_rules import ledger_of, rental_of  # noqa: E402

from support.bill_support import BillEnv, bill_env  # noqa: E402
from support.coord_support import Agent  # noqa: E402
from support.fakevast import FAKE_API_KEY  # noqa: E402

MONITOR_S = 300.0
HEARTBEAT_S = 60.0
SETUP_BYTES = 50e9
PARTS = ("rent", "storage", "bandwidth")


@dataclass
class Member:
    name: str
    offer_id: int
    machine_id: int
    vid: int = 0
    record_id: int = 0
    agent: Agent | None = None
    rx: int = 0
    tx: int = 0
    alive: bool = True  # its agent heartbeats while its instance runs
    must_go_at: float | None = None  # when the rules say it must be gone by
    destroyed_alive: bool = False


@dataclass
class Week:
    days: float
    billed: dict[str, float] = field(default_factory=dict)
    by_member: dict[str, float] = field(default_factory=dict)
    unwatched_usd: float = 0.0
    destroyed_alive_usd: float = 0.0
    destroyed_alive: list[str] = field(default_factory=list)
    ledger: dict[str, float] = field(default_factory=dict)
    kept_offline: bool = False
    strikes: int = 0
    kept_at_zero: int = 0  # instances vast.ai stopped at zero funds, kept (events)
    resumed: int = 0  # started again once funds were back (events)


async def simulate_week(workdir: Path, days: float = 7.0) -> Week:
    out = Week(days)
    async with bill_env(workdir, loading=True, credit=500.0, monitor_interval_s=MONITOR_S,
                        next_heartbeat_s=int(HEARTBEAT_S)) as env:
        await _run(env, out, days)
    return out


async def _run(env: BillEnv, out: Week, days: float) -> None:
    fake, clock, settings = env.fake, env.clock, env.h.core.settings
    members = [Member(f"healthy-{i}", 9100 + i, 61_000 + i) for i in range(3)]
    members += [Member("flaky", 9110, 61_010), Member("never-loads", 9111, 61_011),
                Member("dies", 9112, 61_012), Member("exits", 9113, 61_013)]
    fake.never_loads.add(61_011)
    for m in members:
        fake.add_offer(m.offer_id, m.machine_id, dph_total=0.40, inet_down_cost=0.01,
                       inet_up_cost=0.01, storage_cost=0.15, inet_down=1000.0)
    for m in members:
        data = await env.deploy(m.offer_id)
        m.vid, m.record_id = int(data["provider_instance_id"]), int(data["instance_id"])
        m.agent = env.h.agent(data["agent_id"])
    start = clock.now
    day = 86400.0
    ttl = policy.silence_ttl_s(HEARTBEAT_S, settings.silence_grace_s)
    flaky = next(m for m in members if m.name == "flaky")
    offline_windows = [(start + f * days * day, 1800.0) for f in (0.2, 0.45, 0.7)]
    dies_at = start + 2 / 7 * days * day
    exits_at = start + 3 / 7 * days * day
    broke_at = start + 5 / 7 * days * day
    revoke_at = start + 6 / 7 * days * day
    said_hello: set[str] = set()
    next_tick = start + MONITOR_S
    never = next(m for m in members if m.name == "never-loads")
    never.must_go_at = start + settings.no_hello_timeout_s + 3 * MONITOR_S
    never.alive = False  # its container never starts: no agent
    while clock.now - start < days * day:
        clock.advance(HEARTBEAT_S)
        now = clock.now
        for at, length in offline_windows:
            if at <= now < at + HEARTBEAT_S and flaky.vid in fake.instances:
                fake.host_trouble(flaky.vid, "offline", length)
        for m in members:
            if m.name == "dies" and m.alive and now >= dies_at:
                m.alive = False
                m.must_go_at = now + ttl + settings.lost_timeout_s + 2 * MONITOR_S
            if m.name == "exits" and m.alive and now >= exits_at and m.vid in fake.instances:
                fake.set_status(m.vid, "exited")
                m.alive = False
                m.must_go_at = now + 3 * MONITOR_S
        if broke_at <= now < broke_at + HEARTBEAT_S:
            fake.credit = min(fake.credit, 0.05)
        if broke_at + 2 * 3600 <= now < broke_at + 2 * 3600 + HEARTBEAT_S:
            fake.add_credit(500.0)
        if revoke_at <= now < revoke_at + HEARTBEAT_S:
            fake.revoke_account_key()
        if revoke_at + 3600 <= now < revoke_at + 3600 + HEARTBEAT_S:
            fake.api_key = FAKE_API_KEY
        fake.accrue()
        for m in members:
            row = fake.instances.get(m.vid)
            if row is None or not m.alive or m.agent is None:
                continue
            if row.get("actual_status") not in ("running", "offline"):
                continue  # loading, stopped: no agent runs
            if m.name not in said_hello:
                if (await m.agent.hello())[0] != 200:
                    continue
                said_hello.add(m.name)
            # The setup download over its first ten minutes, then a trickle.
            want_rx = int(min(SETUP_BYTES, m.rx + SETUP_BYTES * HEARTBEAT_S / 600)) \
                if m.rx < SETUP_BYTES else m.rx + 200_000
            fake.add_traffic(m.vid, want_rx - m.rx, 100_000)
            m.rx, m.tx = want_rx, m.tx + 100_000
            phase = "fetching_params" if m.rx < SETUP_BYTES else "proving"
            await env.heartbeat(m.agent, phase, rx=m.rx, tx=m.tx)
        if now >= next_tick:
            before = set(fake.instances)
            await env.tick()
            next_tick = now + MONITOR_S
            for m in members:
                if m.vid in before and m.vid not in fake.instances and m.alive:
                    m.destroyed_alive = True
    await _figures(env, out, members)


async def _figures(env: BillEnv, out: Week, members: list[Member]) -> None:
    fake, clock = env.fake, env.clock
    out.billed = fake.billed_dollars()
    for m in members:
        parts = fake.dollars.get(m.vid, {})
        out.by_member[m.name] = sum(parts.values())
        if m.destroyed_alive:
            out.destroyed_alive.append(m.name)
            out.destroyed_alive_usd += out.by_member[m.name]
        billing = fake.billing[m.vid]
        if m.must_go_at is not None:
            end = billing.destroyed_at if billing.destroyed_at is not None else clock.now
            if end > m.must_go_at:
                # Dollars billed past the moment it had to be gone: its rate times the time.
                life = max(end - billing.created_at, 1e-9)
                out.unwatched_usd += out.by_member[m.name] * (end - m.must_go_at) / life
    flaky = next(m for m in members if m.name == "flaky")
    out.kept_offline = flaky.vid in fake.instances
    out.strikes = len(env.h.store.strikes())
    events = env.h.store.events(None, 10_000)
    out.kept_at_zero = len({e["instance_id"] for e in events
                            if e["kind"] == "kept" and "zero funds" in e["reason"]})
    out.resumed = sum(1 for e in events if e["kind"] == "resumed")
    rows = env.h.store.spend_rows(0.0)
    ledger = ledger_of([rental_of(r) for r in rows], now=clock.now, since=0.0,
                       last_exploration_at=None)
    out.ledger = {"rent": ledger.rent_usd, "storage": ledger.storage_usd,
                  "bandwidth": ledger.bandwidth_usd}


def week_report(w: Week) -> str:
    lines = [f"simulated week ({w.days:g} days) on the fake vast.ai: dollars billed "
             "(simulated)", ""]
    lines.append(f"{'part':<12} {'fake billed':>12} {'ledger':>10} {'diff':>7}")
    for part in PARTS:
        billed, mine = w.billed.get(part, 0.0), w.ledger.get(part, 0.0)
        diff = (mine - billed) / billed * 100 if billed else 0.0
        lines.append(f"{part:<12} ${billed:>11.2f} ${mine:>9.2f} {diff:>6.1f}%")
    lines.append(f"{'total':<12} ${sum(w.billed.values()):>11.2f} "
                 f"${sum(w.ledger.values()):>9.2f}")
    lines.append("")
    lines.append("by instance: " + ", ".join(f"{k} ${v:.2f}" for k, v in w.by_member.items()))
    lines.append(f"kept through 3 offline spells with its agent alive: {w.kept_offline}")
    lines.append(f"strikes recorded: {w.strikes}")
    lines.append(f"stopped by vast.ai at zero funds and kept: {w.kept_at_zero}, started "
                 f"again: {w.resumed}")
    lines.append(f"$ on instances unwatched past the grace: ${w.unwatched_usd:.2f}")
    lines.append(f"$ on instances destroyed while their agent was alive: "
                 f"${w.destroyed_alive_usd:.2f} ({', '.join(w.destroyed_alive) or 'none'})")
    return "\n".join(lines)


def week_ok(w: Week) -> bool:
    return (w.unwatched_usd == 0.0 and w.destroyed_alive_usd == 0.0 and w.kept_offline
            and w.kept_at_zero > 0 and w.resumed == w.kept_at_zero
            and all(abs(w.ledger[p] - w.billed[p]) <= 0.05 * w.billed[p] for p in PARTS))


@dataclass
class Trials:
    interruptible: bool
    billed: dict[str, float] = field(default_factory=dict)
    outbid_kept: int = 0
    destroyed_early: int = 0


async def simulate_trials(workdir: Path, *, interruptible: bool, trials: int = 4,
                          trial_h: float = 0.6) -> Trials:
    """``trials`` trials of ``trial_h`` hours of running each, on demand or interruptible
    (``VM_INTERRUPTIBLE_TRIALS``); every other interruptible one is outbid for 20 minutes
    half-way. Dollars by part as the fake billed them (simulated)."""
    out = Trials(interruptible)
    async with bill_env(workdir, loading=False, interruptible_trials=interruptible) as env:
        fake, clock = env.fake, env.clock
        running: list[tuple[Any, Any, float]] = []  # (deployed, agent, seconds run)
        for i in range(trials):
            fake.add_offer(9700 + i, 62_000 + i, dph_total=0.40, min_bid=0.12,
                           inet_down_cost=0.01, storage_cost=0.15)
            deployed = await env.h.core.deployer.deploy(9700 + i, interruptible=interruptible)
            agent = env.h.agent(deployed.agent_id)
            await agent.hello()
            running.append((deployed, agent, 0.0))
        outbid = {d.provider_instance_id for n, (d, _, _) in enumerate(running)
                  if interruptible and n % 2 == 0}
        done: set[int] = set()
        rx: dict[int, int] = {}
        while len(done) < trials:
            clock.advance(HEARTBEAT_S)
            fake.accrue()
            for n, (d, agent, ran) in enumerate(running):
                vid = d.provider_instance_id
                if vid in done or vid not in fake.instances:
                    done.add(vid)
                    continue
                if fake.instances[vid]["actual_status"] != "running":
                    continue
                if vid in outbid and ran >= trial_h * 1800:
                    outbid.discard(vid)
                    fake.outbid(vid, for_s=1200)
                    continue
                ran += HEARTBEAT_S
                running[n] = (d, agent, ran)
                want = int(min(SETUP_BYTES, SETUP_BYTES * ran / 600))
                fake.add_traffic(vid, want - rx.get(vid, 0))
                rx[vid] = want
                phase = "fetching_params" if want < SETUP_BYTES else "benchmarking"
                await env.heartbeat(agent, phase, rx=want, tx=0)
                if ran >= trial_h * 3600:  # the verdict: ended
                    await env.h.admin("POST", f"/api/instances/{d.instance_id}/destroy")
                    done.add(vid)
            if int(clock.now) % int(MONITOR_S) < HEARTBEAT_S:
                before = set(fake.instances)
                await env.tick()
                out.destroyed_early += sum(1 for v in before - set(fake.instances)
                                           if v not in done)
        out.billed = fake.billed_dollars()
        out.outbid_kept = sum(1 for e in env.h.store.events(None, 10_000)
                              if e["kind"] == "kept" and e["reason"].startswith("outbid"))
    return out


def trials_report(on_demand: Trials, bid: Trials) -> str:
    a, b = sum(on_demand.billed.values()), sum(bid.billed.values())
    lines = ["interruptible trials (simulated, fake vast.ai): 4 trials of 36 min running, "
             "every other interruptible one outbid for 20 min half-way", ""]
    for name, t in (("on-demand", on_demand), ("interruptible", bid)):
        parts = ", ".join(f"{p} ${t.billed.get(p, 0.0):.3f}" for p in PARTS)
        lines.append(f"{name:<14} ${sum(t.billed.values()):.3f} ({parts}); outbid and kept: "
                     f"{t.outbid_kept}; ended early: {t.destroyed_early}")
    lines.append(f"saving: ${a - b:.3f} ({(a - b) / a * 100 if a else 0:.0f}%)")
    return "\n".join(lines)
