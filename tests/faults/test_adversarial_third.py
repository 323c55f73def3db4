"""Hostile hosts, third round: no lie under the line ratchets it, spreads, or outlives
what the host delivers.

Each attack of the third probe is replayed against the real app (``create_app`` under
aiohttp's test client, an injected clock) by agents holding their own, legitimately
issued keys, beside an honest control that is counted at once. docs/reliability.md
lists each attack with its rule and numbers. Every rate here is simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from vast_manager.common.hardware_facts import gpu_spec
from vast_manager.coordinator.decisions import belief
from vast_manager.coordinator.discovery.autopilot_rules import Ledger, decide
from vast_manager.coordinator.discovery.plan import Plan
from vast_manager.coordinator.operations.autopilot_loop import fleet_instances

from support.belief_support import deploy, reasons, run_watched, send_result, standing, stored
from support.coord_support import ADMIN, Agent, Harness, start
from support.discovery_support import measurements
from support.fakes_provider import FakeProvider, offer

HONEST_5060 = 12.3  # the probe's honest 1x RTX 5060 Ti (its minimum: 13.75/h at $0.11)
#: The probe's chain: each liar claimed 97% of the line the previous one left (the old
#: rule: twice the best of every earlier measurement), up to the 5060 Ti's ceiling.
CHAIN = (23.9, 46.3, 67.8, 89.6, 112.1, 118.8, 118.8, 118.8)


def fivesixty(offer_id: int, machine_id: int, **fields: Any) -> dict[str, Any]:
    return {**offer(offer_id, machine_id, gpu_name="RTX 5060 Ti", dph_total=0.11), **fields}


OFFERS = [
    offer(9001, 4242, dph_total=0.40),  # a 1x RTX 4090, measured honestly at 60/h
    offer(9003, 4244, num_gpus=2, dph_total=0.80),  # the 2x RTX 4090 whose prediction is read
    fivesixty(9100, 5100),  # the honest 5060 Ti
    *(fivesixty(9101 + i, 5101 + i) for i in range(len(CHAIN))),  # the chain's liars
    fivesixty(9120, 5120),  # the honest control beside the chain
    # A CPU family the fleet never measured (no confident basis): the four liars and
    # their honest control.
    *(fivesixty(9130 + i, 5130 + i, cpu_name="Xeon Phi 7290") for i in range(5)),
    offer(9140, 5140, dph_total=0.40),  # the host kept at 431/h that delivers 1%
]


async def benchmark(h: Harness, agent: Agent, rate: float, result_id: str,
                    proofs: int = 8, gpus: int = 1) -> dict[str, Any]:
    """One watched benchmark at ``rate`` on ``gpus`` GPUs answering the open directed
    benchmark."""
    wall = await run_watched(h, agent, proofs, 2 * 3600 / rate)
    data = await send_result(h, agent, result_id, rate=rate, wall=wall,
                             benchmark_id=agent.benchmark_id,  # type: ignore[attr-defined]
                             gpus_used=list(range(gpus)))
    agent.benchmark_id = data["directive"].get("benchmark_id")  # type: ignore[attr-defined]
    await agent.heartbeat("proving")
    return data


async def fleet(aiohttp_client: Any, tmp_path: Path, **settings: Any) -> Harness:
    """An honest fleet's record: 40 simulated measurements of other machines and six
    5060 Ti hosts like the attackers' (imported, so the model's interval is a fleet's,
    not three points'), a 1x RTX 4090 at 60/h and a 5060 Ti at 12.3/h measured by the
    fleet itself."""
    # Production watching on (the default's hour), as a deployment has it.
    h = await start(aiohttp_client, tmp_path, provider=FakeProvider(OFFERS),
                    idle_after_s=3600.0, **settings)
    now = h.clock()
    body = b"".join(orjson.dumps({"machine_id": m.machine_id, "offer": dict(m.offer.raw),
                                  "rate_per_hour": m.rate_per_hour,
                                  "measured_at": now - 86400 + i}) + b"\n"
                    for i, m in enumerate(measurements(40, seed=3)))
    # The fleet has measured 5060 Ti hosts like these before (as the probe's had): their
    # rates, imported, teach the model the hardware (imports are no one's twin).
    like = fivesixty(0, 0)
    body += b"".join(orjson.dumps({"machine_id": str(6000 + i),
                                   "offer": {**like, "id": 6000 + i, "machine_id": 6000 + i},
                                   "rate_per_hour": rate, "measured_at": now - 7200 + i})
                     + b"\n" for i, rate in enumerate((11.4, 12.0, 12.3, 12.6, 13.1, 11.8)))
    resp = await h.client.post("/api/hosts/import", data=body, headers={
        **ADMIN, "Content-Type": "application/x-ndjson"})
    assert resp.status == 200, await resp.text()
    agent = await deploy(h, 9001, min_rate=10.0)
    assert (await benchmark(h, agent, 60.0, "honest-4090", 24))["directive"]["action"] \
        == "continue"
    honest = await deploy(h, 9100, min_rate=10.0)
    await benchmark(h, honest, HONEST_5060, "honest-5060")
    assert stored(h, honest, "honest-5060")["counts_for_host_perf"] == 1
    await h.core.models.refresh()
    return h


@pytest.fixture
async def h(aiohttp_client: Any, tmp_path: Path) -> Harness:
    return await fleet(aiohttp_client, tmp_path)


def counted(h: Harness, agent: Agent, result_id: str) -> bool:
    return bool(stored(h, agent, result_id)["counts_for_host_perf"])


# --- 1: a lie under the line needs confirmation and never ratchets ------------------------


def measurement_of(h: Harness, agent: Agent) -> dict[str, Any]:
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    (row,) = [m for m in h.store.measurements() if m["instance_id"] == inst["id"]]
    return row


def high_of(offers: list[dict[str, Any]], offer_id: int) -> float:
    return float(next(o for o in offers if o["id"] == offer_id)["predicted_rate_high"])


async def honest_chain_highs(aiohttp_client: Any, tmp_path: Path) -> list[float]:
    """The control for the chains below: the same eight hosts benchmarked honestly on a
    fleet of their own, and the 90th percentile for a new 5060 Ti host after each refit.
    The percentile moves with every refit even so (its conformal bound reads
    out-of-fold residuals of machines, and each new machine reshuffles the folds: here
    by up to a third), so a chain is judged against what honest hosts do to it."""
    h = await fleet(aiohttp_client, tmp_path / "honest")
    _, offers = await h.admin("GET", "/api/offers")
    highs = [high_of(offers, 9120)]
    for i in range(len(CHAIN)):
        host = await deploy(h, 9101 + i, min_rate=10.0)
        await benchmark(h, host, HONEST_5060 * (0.96 + 0.01 * i), f"honest-{i}", proofs=12)
        await h.core.models.refresh()
        _, offers = await h.admin("GET", "/api/offers")
        highs.append(high_of(offers, 9120))
    return highs


# Eight refits of the served model and eight honest hosts beside: about a minute on an
# idle machine, so it runs with the heavy set.
@pytest.mark.slow
async def test_a_ratchet_chain_of_eight_is_held_and_the_honest_control_counted(
    h: Harness, aiohttp_client: Any, tmp_path: Path,
) -> None:
    """The probe's chain: each liar claimed 97% of the line the previous one left. The
    line is 1.75x the model's 90th percentile for a new 5060 Ti host (17.3/h here, the
    interval of a fleet of 48 machines: 30.3/h). The claims under it (the first, 23.9/h;
    on some fleets' models the second, 46.3/h, too) are counted for their hosts
    (delivery judges them: ``test_six_hours...``), but the model and other machines'
    twins learn them at most at the honest twin's median, 12.3/h, until their delivery
    agrees; every claim over it is held, and the line they meet never rises past where
    honest hosts in their place would have put it (the old rule's chain doubled it at
    each step)."""
    before = await standing(h)
    _, offers = await h.admin("GET", "/api/offers")
    line = belief.MODEL_FACTOR * high_of(offers, 9101)
    counted_claims, lines = [], []
    for i, claim in enumerate(CHAIN):
        liar = await deploy(h, 9101 + i, min_rate=10.0)
        await benchmark(h, liar, claim, f"chain-{i}")
        row = stored(h, liar, f"chain-{i}")
        if row["counts_for_host_perf"]:
            counted_claims.append(claim)
            # Counted for its host; learned bounded by what was believed before it.
            assert measurement_of(h, liar)["model_cap_per_hour"] == pytest.approx(
                belief.TWIN_FACTOR * HONEST_5060)
        else:
            assert row["flags"] == "unconfirmed", (claim, row)
            (why,) = [r for r in reasons(row) if "rate model's 90th percentile" in r]
            lines.append(float(why.rsplit(": ", 1)[1].removesuffix("/h")))
        await h.core.models.refresh()
    # Counted: exactly the claims under the line as it stood before them (no claimant
    # set it); the chain straddles it, its first claim under it and most of it over.
    assert counted_claims == [c for c in CHAIN if c <= line], (line, counted_claims)
    assert counted_claims[:1] == [CHAIN[0]] and len(counted_claims) <= 2, (line, counted_claims)
    # No ratchet: the line every held claim met is no higher than the one eight honest
    # hosts in the liars' place leave.
    honest = await honest_chain_highs(aiohttp_client, tmp_path)
    print(f"ratchet chain: line {line:.1f}/h before, held at {sorted(set(lines))}; eight "
          f"honest hosts move the 90th percentile over {[round(x, 1) for x in honest]}")
    assert max(lines) <= belief.MODEL_FACTOR * max(honest) * 1.02, (line, lines, honest)
    after = await standing(h)
    # host_perf gained at most the counted claims' machines; no held claim moved it.
    assert len(after.perf) <= len(before.perf) + len(counted_claims)
    chain = {str(5101 + i) for i in range(len(CHAIN))}
    assert all(p["best_rate_per_hour"] <= max(counted_claims) * 1.05 for p in after.perf
               if p["machine_id"] in chain)
    # The honest control beside the chain: counted at once.
    control = await deploy(h, 9120, min_rate=10.0)
    await benchmark(h, control, 12.9, "control")
    assert counted(h, control, "control")
    assert stored(h, control, "control")["flags"] == ""


# Eight refits of the served model and eight honest hosts beside: about a minute on an
# idle machine, so it runs with the heavy set.
@pytest.mark.slow
async def test_an_adaptive_chain_under_the_line_does_not_raise_it(
    h: Harness, aiohttp_client: Any, tmp_path: Path,
) -> None:
    """Liars that each claim 97% of the line the previous ones left (1.75x the model's
    90th percentile as it then stands) are counted for their hosts (none of them is
    beyond belief), but each is learned at most at what was believed before it: eight of
    them leave the 90th percentile, and so the line, within 10% of the highest eight
    honest hosts in their place leave it (before bounded learning: each counted claim
    raised the next one's line by ~1.7x), and none counted above that line; their
    delivery then demotes them
    (``test_six_hours...``)."""
    _, offers = await h.admin("GET", "/api/offers")
    first = high_of(offers, 9120)
    counted_rates = []
    for i in range(len(CHAIN)):
        _, offers = await h.admin("GET", "/api/offers")
        claim = 0.97 * belief.MODEL_FACTOR * high_of(offers, 9120)
        liar = await deploy(h, 9101 + i, min_rate=10.0)
        await benchmark(h, liar, claim, f"adaptive-{i}", proofs=12)
        row = stored(h, liar, f"adaptive-{i}")
        assert row["counts_for_host_perf"], reasons(row)
        counted_rates.append(float(row["recomputed_rate_per_hour"]))
        await h.core.models.refresh()
    _, offers = await h.admin("GET", "/api/offers")
    last = high_of(offers, 9120)
    honest = await honest_chain_highs(aiohttp_client, tmp_path)
    print(f"adaptive chain: 90th percentile {first:.1f}/h before, {last:.1f}/h after; "
          f"counted {[round(r, 1) for r in counted_rates]}; eight honest hosts move it over "
          f"{[round(x, 1) for x in honest]}")
    assert last < 1.1 * max(honest), (first, last, honest)
    assert max(counted_rates) <= belief.MODEL_FACTOR * max(honest) * 1.1, (counted_rates,
                                                                           honest)


async def test_a_machine_drifting_over_five_rebenchmarks_is_held_at_its_first_rate(
    h: Harness,
) -> None:
    """The probe's drift: x1.4 a re-benchmark (12.3 -> 65.6/h over 5). Its own samples
    never raise its own line: past 1.5x its first counted rate each claim is held."""
    drifter = await deploy(h, 9120, min_rate=10.0)
    await benchmark(h, drifter, HONEST_5060, "drift-0")
    assert counted(h, drifter, "drift-0")  # an honest first benchmark: counted at once
    claim = HONEST_5060
    sent = 0
    for step in range(1, 6):
        claim *= 1.4
        inst = h.store.instance_by_agent(drifter.agent_id)
        assert inst is not None
        if inst["state"] == "terminating":
            break  # held claims that no re-benchmark confirmed end it (bad_hosts)
        if drifter.benchmark_id is None:  # type: ignore[attr-defined]
            await h.rebenchmark(drifter)
            _, directive = await drifter.heartbeat("proving")
            drifter.benchmark_id = directive["benchmark_id"]  # type: ignore[attr-defined]
        await benchmark(h, drifter, claim, f"drift-{step}")
        sent = step
        row = stored(h, drifter, f"drift-{step}")
        if claim > belief.OWN_FACTOR * HONEST_5060 * 1.05:
            assert not row["counts_for_host_perf"], (step, claim, row)
            assert any("this machine's first counted rate" in r for r in reasons(row)), \
                reasons(row)
    assert sent < 5  # terminated before its fifth: two held claims went unconfirmed
    _, perf = await h.admin("GET", "/api/host-perf")
    mine = [p for p in perf if p["machine_id"] == "5120"]
    assert mine and all(p["best_rate_per_hour"] <= belief.OWN_FACTOR * HONEST_5060 * 1.05
                        for p in mine), mine


# --- 2: a lie cannot spread -----------------------------------------------------------------


def prediction_of(offers: list[dict[str, Any]], offer_id: int) -> float:
    return float(next(o for o in offers if o["id"] == offer_id)["predicted_rate_per_hour"])


async def four_on_phi(h: Harness, claim: float, confirm: float | None) -> float:
    """Four 5060 Ti hosts on the CPU family the fleet never measured, each claiming
    ``claim`` (and confirming at ``confirm`` when held); the 2x RTX 4090's prediction
    after them."""
    control = await deploy(h, 9134, min_rate=10.0)  # honest, same unmeasured family
    await benchmark(h, control, HONEST_5060, "phi-control")
    assert counted(h, control, "phi-control")
    for i in range(4):
        host = await deploy(h, 9130 + i, min_rate=10.0)
        version = h.store.measurements_version()
        await benchmark(h, host, claim, f"phi-{i}")
        if confirm is None:
            assert counted(h, host, f"phi-{i}")
            continue
        row = stored(h, host, f"phi-{i}")
        assert row["flags"] == "unconfirmed" and not row["counts_for_host_perf"], row
        assert h.store.measurements_version() == version  # held: nothing reached the model
        # They forge the watched confirmation too (what cannot be closed without the
        # cluster's record): counted now, read by the model at most at the line.
        await benchmark(h, host, confirm, f"phi-confirm-{i}")
        assert counted(h, host, f"phi-confirm-{i}"), reasons(stored(h, host, f"phi-confirm-{i}"))
    await h.core.models.refresh()
    _, offers = await h.admin("GET", "/api/offers")
    return prediction_of(offers, 9003)


async def test_four_liars_on_a_cpu_family_never_measured_move_no_other_offer(
    aiohttp_client: Any, tmp_path: Path,
) -> None:
    """The probe: four 5060 Ti hosts on an unmeasured CPU family claiming ~118/h moved the
    2x RTX 4090's prediction from 60 to 202/h. Each claim is held (above 1.25x what a
    5060 Ti's bandwidth allows, 75/h, and twice the 90th percentile of a model that never
    measured the family); confirmed by a watched re-benchmark, each reaches the model at
    most at what it believed before (the honest control's 12.3/h, a twin). Against the
    same fleet with four honest hosts there, the 2x RTX 4090 moves less than 25%."""
    (tmp_path / "honest").mkdir()
    (tmp_path / "liars").mkdir()
    honest = await four_on_phi(await fleet(aiohttp_client, tmp_path / "honest"),
                               HONEST_5060, None)
    lied = await four_on_phi(await fleet(aiohttp_client, tmp_path / "liars"), 118.0, 116.0)
    print(f"four liars: 2x RTX 4090 {honest:.1f}/h beside honest hosts, {lied:.1f}/h beside "
          "the liars")
    # The issue asks < 25%: 0.0% here (64.6/h both; learned whole, -9.1% in an earlier
    # run; +22.5% in a fleet without the six earlier 5060 Ti measurements).
    assert abs(lied / honest - 1) < 0.15, (honest, lied)


async def test_a_claim_with_no_twin_is_held_above_the_models_interval(h: Harness) -> None:
    """The probe: a 2x RTX 4090 (no twin: only a 1x was measured) kept at 199/h with its
    prediction at 60/h. Above 1.75x the model's 90th percentile (95.9/h: 167.8/h) it is
    held; the honest control at its predicted rate is counted at once."""
    _, offers = await h.admin("GET", "/api/offers")
    predicted = prediction_of(offers, 9003)
    high = next(o for o in offers if o["id"] == 9003)["predicted_rate_high"]
    print(f"no twin: 2x RTX 4090 predicted {predicted:.1f}/h, 90th percentile {high:.1f}/h")
    liar = await deploy(h, 9003, min_rate=10.0, gpus=2)
    await benchmark(h, liar, 199.0, "no-twin", proofs=24, gpus=2)
    row = stored(h, liar, "no-twin")
    assert row["flags"] == "unconfirmed" and not row["counts_for_host_perf"], row
    assert any("rate model's 90th percentile" in r for r in reasons(row)), reasons(row)
    h.provider.offers[9004] = offer(9004, 4250, num_gpus=2, dph_total=0.80)
    honest = await deploy(h, 9004, min_rate=10.0, gpus=2)
    await benchmark(h, honest, predicted, "no-twin-control", proofs=24, gpus=2)
    assert counted(h, honest, "no-twin-control"), reasons(stored(h, honest, "no-twin-control"))


# --- 3: delivered beats claimed -------------------------------------------------------------


async def prove(h: Harness, agents: dict[str, tuple[Agent, float]], minutes: int,
                totals: dict[str, float]) -> None:
    """``minutes`` of proving, a heartbeat a minute each, cuzk's counter growing at each
    agent's true rate; the monitor runs every minute."""
    for _ in range(minutes):
        h.clock.advance(60)
        for name, (agent, true_rate) in agents.items():
            totals[name] += true_rate / 60
            agent.seq += 1
            status, _ = await agent.post("/v1/heartbeat", {
                "seq": agent.seq, "phase": "proving", "phase_started_at": 1_800_000_000.0,
                "progress": None, "proofs_completed_total": int(totals[name]),
                "proof_seconds_recent": [], "telemetry": None})
            assert status in (200, 401)  # 401: its instance was ended and its key revoked
        await h.core.monitor.tick()


async def test_six_hours_of_one_percent_production_is_demoted_struck_and_ended(
    h: Harness,
) -> None:
    """The probe: a host kept at 431/h whose cuzk counter grew by one proof every 14
    minutes for 6 hours, still in host_perf at 431/h and never idle. Now found short
    within minutes beside an honest host delivering its rate: its measurement leaves
    host_perf and the model, it is re-judged at what it delivers (below its minimum:
    terminated), its machine gets a strike with the numbers; the honest one is untouched,
    and the autopilot counts each at what it delivers."""
    liar = await deploy(h, 9140, min_rate=10.0)
    await benchmark(h, liar, 60.0, "kept", proofs=24)
    inst = h.store.instance_by_agent(liar.agent_id)
    assert inst is not None
    # Kept at 431/h, as the probe's host was (a forged confirmation this test does not
    # replay): its instance's rate and its measurement say so.
    await h.store.write(lambda tx: (tx.instances.update(inst["id"], rate_per_hour=431.0),
                                    tx._exec("update measurements set rate_per_hour = 431.0 "
                                             "where instance_id = ?", (inst["id"],))))
    honest = await deploy(h, 9120, min_rate=10.0)
    await benchmark(h, honest, HONEST_5060, "honest-kept")
    honest_inst = h.store.instance_by_agent(honest.agent_id)
    assert honest_inst is not None
    totals = {"liar": 0.0, "honest": 0.0}
    agents = {"liar": (liar, 60 / 14), "honest": (honest, HONEST_5060)}
    await prove(h, agents, 45, totals)  # the honest one's rate settles (half an hour)
    settled = h.core.monitor.production.settled_rates()
    assert settled[honest_inst["id"]] == pytest.approx(HONEST_5060, rel=0.15)
    ended = h.store.instance_by_agent(liar.agent_id)
    assert ended is not None and ended["state"] in ("terminating", "destroyed"), ended["state"]
    assert "below its minimum of 10.0/h" in ended["terminate_reason"]
    demoted = h.store.events_of_kind("demoted")
    assert [e["instance_id"] for e in demoted] == [inst["id"]]
    assert "of the 431.0/h it was kept on" in demoted[0]["reason"]
    _, perf = await h.admin("GET", "/api/host-perf")
    assert not any(p["machine_id"] == "5140" for p in perf)  # out of host_perf
    assert any(p["machine_id"] == "5120" for p in perf)  # the honest one stays
    row = stored(h, liar, "kept")
    assert "demoted" in row["flags"] and not row["counts_for_host_perf"]
    strikes = h.store.strikes("5140")
    assert strikes and "delivered short" in strikes[0]["reason"]
    assert h.store.strikes("5120") == []
    kept = h.store.instance_by_agent(honest.agent_id)
    assert kept is not None and kept["state"] == "proving" and not kept["terminate_reason"]
    assert kept["rate_per_hour"] == pytest.approx(HONEST_5060, rel=0.05)


async def test_a_bounded_rate_is_learned_once_its_delivery_agrees(h: Harness) -> None:
    """Two 5060 Ti hosts counted at 23.9/h (under the line, above what the model
    believed: learned at the honest twin's 12.3/h). The one that delivers it is learned
    whole once its delivery test agrees (an event ``learned``; the model refits); the
    one delivering 30% of it is not (its delivery test drifts to "short" instead)."""
    fast = await deploy(h, 9101, min_rate=10.0)
    await benchmark(h, fast, 23.9, "fast")
    liar = await deploy(h, 9102, min_rate=10.0)
    await benchmark(h, liar, 23.9, "liar")
    for agent in (fast, liar):
        assert measurement_of(h, agent)["model_cap_per_hour"] == pytest.approx(HONEST_5060)
    fast_inst = h.store.instance_by_agent(fast.agent_id)
    liar_inst = h.store.instance_by_agent(liar.agent_id)
    assert fast_inst is not None and liar_inst is not None
    version = h.store.measurements_version()
    totals = {"fast": 0.0, "liar": 0.0}
    await prove(h, {"fast": (fast, 23.9), "liar": (liar, 0.3 * 23.9)}, 120, totals)
    assert measurement_of(h, fast)["model_cap_per_hour"] is None
    learned = h.store.events_of_kind("learned")
    assert [e["instance_id"] for e in learned] == [fast_inst["id"]], learned
    assert "agreeing with the 23.9/h it was kept on" in learned[0]["reason"]
    assert h.store.measurements_version() != version  # the model keeper refits
    assert measurement_of(h, liar)["model_cap_per_hour"] == pytest.approx(HONEST_5060)


async def test_a_lone_instance_short_of_work_is_idle_not_struck(h: Harness) -> None:
    """With no instance delivering its rate the shortfall is the work's (no work command,
    a dry queue): idle, nothing demoted, no strike."""
    agent = await deploy(h, 9120, min_rate=10.0)
    await benchmark(h, agent, HONEST_5060, "starved")
    totals = {"a": 0.0}
    await prove(h, {"a": (agent, 0.0)}, 240, totals)  # short after about 3.7 h
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    # Idle: reported, and stopped by the idle rule (VM_IDLE_DESTROY_AFTER_S), never as
    # a host's shortfall.
    assert any(e["instance_id"] == inst["id"] for e in h.store.events_of_kind("idle"))
    assert inst["state"] == "proving" or "idle" in str(inst["terminate_reason"])
    assert h.store.events_of_kind("demoted") == [] and h.store.strikes("5120") == []
    assert counted(h, agent, "starved")


# --- 7: bounded metrics ---------------------------------------------------------------------


async def test_telemetry_cannot_mint_prometheus_series(h: Harness) -> None:
    """The probe: per-GPU gauges labelled with any telemetry index and any cuzk worker
    ordinal, and ``gpu_name`` the hello's text: 20 heartbeats exposed 19,219 series for
    one host. Now a GPU label is an index the hello listed, a name is the spec table's (or
    ``other``), and an instance has at most 16 GPU series a gauge; the honest control's
    series are all there."""
    from prometheus_client.parser import text_string_to_metric_families

    from support.coord_support import hello_msg, telemetry_msg

    agent = await h.issue("churn", gpus=16)
    honest = await h.issue("honest-telemetry")
    for i in range(20):
        hello = hello_msg(f"boot-{i}", gpus=2)
        hello["host"]["gpus"][0]["name"] = f"RTX 4090 rev{i}"  # a new name each hello
        assert (await agent.post("/v1/hello", hello))[0] == 200
        tele = telemetry_msg()
        tele["gpus"] = [{**tele["gpus"][0], "index": 1000 * i + g} for g in range(64)]
        tele["cuzk"] = {"samples": 1, "workers": [{"gpu_ordinal": 1000 * i + w,
                                                   "busy_pct": 50.0} for w in range(256)],
                        "synthesis_active_mean": 1.0, "synthesis_max": 1,
                        "queue_depth_mean": 1.0, "memory_used_bytes_max": 1,
                        "memory_total_bytes": 2}
        agent.seq += 1
        msg = {"seq": agent.seq, "phase": "proving", "phase_started_at": 1_800_000_000.0,
               "progress": None, "proofs_completed_total": 0, "proof_seconds_recent": [],
               "telemetry": tele}
        assert (await agent.post("/v1/heartbeat", msg))[0] == 200
        assert (await honest.hello())[0] == 200
        assert (await honest.heartbeat("proving", telemetry=True))[0] == 200
        resp = await h.client.get("/metrics", headers=ADMIN)
        text = await resp.text()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("machine_id") == "churn"]
    gpu_series = {(s.name, s.labels.get("gpu")) for s in samples if "gpu" in s.labels}
    assert len({g for _, g in gpu_series}) <= 2  # the hello's two GPUs, nothing else
    assert {s.labels.get("gpu_name") for s in samples if "gpu_name" in s.labels} <= {
        "RTX 4090", "other"}
    assert len(samples) < 60, len(samples)
    theirs = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.labels.get("machine_id") == "honest-telemetry" and "gpu" in s.labels]
    assert {s.labels["gpu"] for s in theirs} == {"0"}


# --- 9: the smaller ones ----------------------------------------------------------------


async def test_a_concurrency_above_the_cap_is_judged_as_the_cap(h: Harness) -> None:
    """The probe: a benchmark announcing 64 proofs in flight on one GPU (the cap is 8)
    switched the early verdict off. Now read as 8: a run that completes nothing is
    stopped by the stall test; an honest run's early pass is unchanged (the suite's
    early-verdict tests)."""
    agent = await deploy(h, 9120, min_rate=13.75)
    inst = h.store.instance_by_agent(agent.agent_id)
    assert inst is not None
    for _ in range(300):
        h.clock.advance(60)
        agent.seq += 1
        status, directive = await agent.post("/v1/heartbeat", {
            "seq": agent.seq, "phase": "benchmarking", "phase_started_at": 1_800_000_000.0,
            "progress": {"done": 0, "total": 64, "unit": "proofs", "concurrency": 64},
            "proofs_completed_total": 0, "proof_seconds_recent": [], "telemetry": None})
        assert status == 200
        if directive["action"] == "terminate":
            break
    ended = h.store.get_instance(inst["id"])
    assert ended is not None and ended["state"] == "terminating", ended
    assert "early verdict" in ended["terminate_reason"]


# --- 4: ceilings for every GPU ------------------------------------------------------------


def a5000(offer_id: int, machine_id: int) -> dict[str, Any]:
    """An 8x RTX A5000 (a model the spec table lacked before: its row says 768 GB/s a
    card, which bounds it whatever the offer's own ``gpu_mem_bw`` reads)."""
    return {**offer(offer_id, machine_id, gpu_name="RTX A5000", num_gpus=8, dph_total=1.60),
            "gpu_mem_bw": 690.0}


async def test_an_a5000_at_2320_is_refused_and_an_honest_one_counted(h: Harness) -> None:
    """The probe: an 8x RTX A5000 confirmed at 2,320/h under the global 300/h a GPU. Its
    row bounds it at 2 x 120 x 768 / 896 = 206/h a GPU (1,646/h for eight): refused as
    implausible, never counted nor kept. The honest 8x A5000 beside it, at its predicted
    rate, is counted at once."""
    per_gpu = belief.ceiling_per_gpu("RTX A5000", 300.0)
    assert per_gpu == pytest.approx(2 * 120 * 768 / 896)
    h.provider.offers[9200] = a5000(9200, 5200)
    h.provider.offers[9201] = a5000(9201, 5201)
    await h.core.models.refresh()
    _, offers = await h.admin("GET", "/api/offers")
    predicted = prediction_of(offers, 9201)
    print(f"8x RTX A5000: predicted {predicted:.1f}/h, ceiling {8 * per_gpu:.0f}/h")
    liar = await deploy(h, 9200, min_rate=10.0, gpus=8)
    await benchmark(h, liar, 2320.0, "a5000-2320", proofs=48, gpus=8)
    row = stored(h, liar, "a5000-2320")
    assert "implausible" in row["flags"] and not row["counts_for_host_perf"], row
    assert any(f"beyond the ceiling of {8 * per_gpu:.0f}/h" in r for r in reasons(row)), \
        reasons(row)
    inst = h.store.instance_by_agent(liar.agent_id)
    assert inst is not None and inst["state"] == "terminating", inst["state"]
    assert inst["rate_per_hour"] is None or inst["rate_per_hour"] < 8 * per_gpu
    _, perf = await h.admin("GET", "/api/host-perf")
    assert not any(p["machine_id"] == "5200" for p in perf)
    honest = await deploy(h, 9201, min_rate=10.0, gpus=8)
    await benchmark(h, honest, predicted, "a5000-control", proofs=48, gpus=8)
    assert counted(h, honest, "a5000-control"), reasons(stored(h, honest, "a5000-control"))
    assert stored(h, honest, "a5000-control")["flags"] == ""


def unlisted(offer_id: int, machine_id: int, mem_bw_gbps: float) -> dict[str, Any]:
    """A 1x GPU model no spec row matches, its offer reporting ``gpu_mem_bw``."""
    return {**offer(offer_id, machine_id, gpu_name="RTX 4070 SUPER Ti X", dph_total=0.20),
            "gpu_mem_bw": mem_bw_gbps}


async def test_a_model_the_table_lacks_is_bounded_by_its_offers_bandwidth(h: Harness) -> None:
    """A GPU model missing from the table is bounded by its offer's ``gpu_mem_bw`` through
    the same formula, never by the global 300/h a GPU: at 400 GB/s 2 x 120 x 400 / 896 =
    107/h. A claim of 200/h on it is refused; the same claim on the same model whose
    offer reports 900 GB/s (241/h) is under its ceiling (held as beyond belief instead:
    above twice the 90th percentile of a model that never measured that GPU)."""
    assert gpu_spec("RTX 4070 SUPER Ti X") is None
    slow = belief.ceiling_per_gpu("RTX 4070 SUPER Ti X", 300.0, 400.0)
    fast = belief.ceiling_per_gpu("RTX 4070 SUPER Ti X", 300.0, 900.0)
    assert slow == pytest.approx(2 * 120 * 400 / 896) and fast < 300.0
    # Without gpu_mem_bw: the slowest card the table knows (the L4's 300 GB/s), not 300/h
    # (VM_MAX_RATE_PER_GPU_PER_HOUR is unset by default).
    assert belief.ceiling_per_gpu("RTX 4070 SUPER Ti X", None) == pytest.approx(
        2 * 120 * belief.MIN_KNOWN_MEM_BW_GBPS / 896)
    h.provider.offers[9210] = unlisted(9210, 5210, 400.0)
    h.provider.offers[9211] = unlisted(9211, 5211, 900.0)
    await h.core.models.refresh()
    _, offers = await h.admin("GET", "/api/offers")
    print(f"unlisted GPU at 900 GB/s: 90th percentile {high_of(offers, 9211):.1f}/h")
    assert belief.NOVEL_FACTOR * high_of(offers, 9211) < 200.0 < fast
    low = await deploy(h, 9210, min_rate=10.0)
    await benchmark(h, low, 200.0, "unlisted-400")
    row = stored(h, low, "unlisted-400")
    assert "implausible" in row["flags"] and not row["counts_for_host_perf"], row
    assert any(f"beyond the ceiling of {slow:.0f}/h" in r for r in reasons(row)), reasons(row)
    high = await deploy(h, 9211, min_rate=10.0)
    await benchmark(h, high, 200.0, "unlisted-900")
    row = stored(h, high, "unlisted-900")
    assert "implausible" not in row["flags"], reasons(row)
    assert row["flags"] == "unconfirmed" and not row["counts_for_host_perf"], reasons(row)


# --- 3: the autopilot trusts the fleet over the lie --------------------------------------

#: The autopilot's caps for the displacement replay: a target the honest fleet makes
#: (4090 60 + 5060 Ti 12.3 + 2x 4080 Super 138.5 = 210.8/h), met without the 2x 4080
#: Super only if a lie fills its place.
PILOT: dict[str, Any] = {
    "autopilot": True, "autopilot_target_rate_per_hour": 180.0, "autopilot_max_dph_total": 3.0,
    "autopilot_max_instances": 6, "max_deploy_dph_total": 2.0}
HONEST_4080S = 138.5  # the probe's honest 2x RTX 4080 Super
LIAR_TRUE = 12.4  # the probe's liar's true rate ($0.11/h, claiming 118/h)


def terminated_by_pilot(h: Harness, instance_id: int) -> bool:
    inst = h.store.get_instance(instance_id)
    assert inst is not None
    return str(inst["terminate_reason"] or "").startswith("autopilot:")


async def test_one_cheap_liar_does_not_make_the_autopilot_end_an_honest_host(
    aiohttp_client: Any, tmp_path: Path,
) -> None:
    """The probe: one $0.11/h host confirmed at 118/h (true 12.4) made the autopilot
    terminate an honest 2x RTX 4080 Super (138.5/h): the fleet ran at 194.8/h while every
    view said 300.3/h. Now its claim is held (no rate: the autopilot counts it at
    nothing), and kept at 118/h on a forged confirmation it is read at what it delivers
    once that spans half an hour, and before that ends no other host (a trim counts only
    delivered rates): the 2x 4080 Super stays, and the autopilot's fleet rate is the
    delivered one. The control: the same rows with the 118/h truly delivered do
    end the 2x 4080 Super (the dearest per proof), so the replay can see a displacement."""
    h = await fleet(aiohttp_client, tmp_path, **PILOT)
    h.provider.offers[9300] = offer(9300, 5300, gpu_name="RTX 4080 Super", num_gpus=2,
                                    dph_total=1.40)
    await h.core.models.refresh()
    _, offers = await h.admin("GET", "/api/offers")
    fourtyeighty = next(o for o in offers if o["id"] == 9300)
    print(f"2x RTX 4080 Super: predicted {fourtyeighty['predicted_rate_per_hour']:.1f}/h, "
          f"90th percentile {fourtyeighty['predicted_rate_high']:.1f}/h")
    honest = await deploy(h, 9300, min_rate=10.0, gpus=2)
    await benchmark(h, honest, HONEST_4080S, "honest-4080s", proofs=24, gpus=2)
    if not counted(h, honest, "honest-4080s"):
        # Above what this small fleet's model believes of a GPU model it never measured:
        # its watched re-benchmark confirms it.
        await benchmark(h, honest, HONEST_4080S, "honest-4080s-confirm", proofs=24, gpus=2)
    honest_inst = h.store.instance_by_agent(honest.agent_id)
    assert honest_inst is not None
    assert honest_inst["rate_per_hour"] == pytest.approx(HONEST_4080S, rel=0.05), \
        reasons(stored(h, honest, "honest-4080s-confirm"))
    liar = await deploy(h, 9120, min_rate=10.0)
    await benchmark(h, liar, 118.0, "displace")
    liar_inst = h.store.instance_by_agent(liar.agent_id)
    assert liar_inst is not None
    # Held: no rate of its own, so the autopilot counts it at nothing.
    assert stored(h, liar, "displace")["flags"] == "unconfirmed"
    assert liar_inst["rate_per_hour"] is None
    tick = await h.core.autopilot.tick()
    assert tick is not None and not any("paused" in n for n in tick.notes), tick.notes
    assert not terminated_by_pilot(h, honest_inst["id"]), tick.actions
    assert tick.fleet_rate_per_hour < 60.0 + HONEST_5060 + HONEST_4080S * 1.05

    # Kept at 118/h on a forged confirmation (what cannot be closed without the
    # cluster's record; this test does not replay it): its instance's rate says so.
    await h.store.write(lambda tx: tx.instances.update(liar_inst["id"], rate_per_hour=118.0))
    # Before its delivery is known (the probe's autopilot acted within 21 minutes) its
    # 118/h fills the fleet's rate but ends no other host: a trim counts delivered rates.
    tick = await h.core.autopilot.tick()
    assert tick is not None and not any("paused" in n for n in tick.notes), tick.notes
    assert not terminated_by_pilot(h, honest_inst["id"]), tick.actions
    proving = {"honest": (honest, HONEST_4080S), "liar": (liar, LIAR_TRUE)}
    for offer_id, rate in ((9001, 60.0), (9100, HONEST_5060)):  # the fixture's two hosts
        row = next(r for r in h.store.active_instances() if r["offer_id"] == offer_id)
        proving[str(offer_id)] = (h.agent(row["agent_id"]), rate)
        proving[str(offer_id)][0].seq = 10_000  # past the sequence their benchmark used
    totals = dict.fromkeys(proving, 0.0)
    await prove(h, proving, 35, totals)
    settled = h.core.monitor.production.settled_rates()
    assert settled[liar_inst["id"]] < 2 * LIAR_TRUE, settled
    tick = await h.core.autopilot.tick()
    assert tick is not None and not any("paused" in n for n in tick.notes), tick.notes
    assert not terminated_by_pilot(h, honest_inst["id"]), tick.actions
    # The fleet rate reads what the liar delivers, not its 118/h.
    assert tick.fleet_rate_per_hour < 60.0 + HONEST_5060 + HONEST_4080S * 1.1 + 2 * LIAR_TRUE, \
        tick.fleet_rate_per_hour

    # The control: the same store's rows with the 118/h truly delivered end the 2x 4080
    # Super in the pure rules (it is the dearest per proof, and the rest make the target).
    fitted = await h.core.models.current()
    rows = h.store.active_instances()
    delivered = {**settled, liar_inst["id"]: 118.0}
    live = [r for r in rows if not terminated_by_pilot(h, int(r["id"]))]
    caps = h.core.autopilot.caps
    assert caps is not None
    decision = decide(fleet_instances(live, fitted.model, frozenset(), delivered,
                                      delivery_watched=True),
                      Plan((), 0, 0, 0.008, "control"), caps, Ledger(), now=h.clock())
    ended = {a.instance_id for a in decision.actions if a.kind == "terminate"}
    assert str(honest_inst["id"]) in ended, decision
