"""vast.ai as it is in 2026 (docs/vast.md, "Changes of 2026"), against the fake vast.ai on
loopback: the daily search quota and the one offer cache, price increases judged, outbid
trials, the signed webhook. The clock is injected; the monitor and the autopilot are driven
round by round."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
from typing import Any

import orjson
import pytest

from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.operations.offer_cache import DAY_S, OfferCache
from vast_manager.coordinator.providers.base import RateLimited, SearchQuotaExceeded
from vast_manager.coordinator.providers.vast.client import VastClient

from support.bill_support import MONITOR_INTERVAL_S, BillEnv, bill_env
from support.fakevast import FAKE_API_KEY, FakeVast

CAPS: dict[str, Any] = {
    "autopilot": True, "autopilot_target_rate_per_hour": 200.0,
    "autopilot_max_dph_total": 1.3, "autopilot_max_instances": 2,
    "autopilot_max_explore_share": 0.15, "autopilot_max_concurrent_trials": 1,
    "autopilot_explore_interval_s": 3600.0, "max_deploy_dph_total": 2.0,
}
SECRET = "whsec-test-0123456789"


async def no_sleep(_seconds: float) -> None:
    return None


def bundles(fake: FakeVast) -> list[Any]:
    return fake.calls("POST", "/api/v0/bundles/")


# --- the search quota and the offer cache ------------------------------------------------


async def test_after_the_quota_everything_answers_from_the_cache_and_nothing_is_searched(
        tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False, vast_searches_per_day=48, **CAPS) as env:
        for i in range(4):
            env.fake.add_offer(9700 + i, 87000 + i, dph_total=0.30 + 0.05 * i)
        env.fake.search_quota_per_day = 6
        h = env.h
        hits: list[tuple[float, float, int]] = []  # (when, reset, searches sent by then)
        seen_by_day: dict[int, int] = {}
        # A day and a half of autopilot decisions every 10 minutes, the operator's offers
        # and plan and the dashboard's fleet page every half hour.
        for step in range(int(1.5 * DAY_S / 600)):
            before = len(bundles(env.fake))
            was_open = h.core.offers.quota_until is None
            await h.core.autopilot.tick()
            if step % 3 == 0:
                for path in ("/api/offers", "/api/plan", "/api/fleet"):
                    status, _ = await h.admin("GET", path)
                    assert status == 200, path
            day = int(env.clock.now // DAY_S)
            seen_by_day[day] = seen_by_day.get(day, 0) + len(bundles(env.fake)) - before
            if was_open and h.core.offers.quota_until is not None:
                reset = h.core.offers.quota_until
                assert reset == (day + 1) * DAY_S  # X-RateLimit-Reset: the next UTC midnight
                hits.append((env.clock.now, reset, len(bundles(env.fake))))
                if len(hits) == 1:
                    await see_everything_stale(env)
            for _when, until, sent in hits:
                if env.clock.now < until:
                    assert len(bundles(env.fake)) == sent  # nothing until the reset
            env.clock.advance(600)
        # One 429 a day the quota was met, never retried; searching again after each reset;
        # every day within the budget.
        assert len(hits) == 2 == h.core.offers.counts["quota_exceeded"]
        assert len(bundles(env.fake)) > hits[0][2]
        assert all(n <= 48 for n in seen_by_day.values()), seen_by_day


async def see_everything_stale(env: BillEnv) -> None:
    """The autopilot, offers, plan, dashboard and /metrics, once the quota is met."""
    h = env.h
    status, offers = await h.admin("GET", "/api/offers")
    assert status == 200 and offers, offers
    assert offers[0]["offers_stale"] is True
    assert offers[0]["offers_label"].startswith("offers as of ")
    assert "quota" in offers[0]["offers_label"]
    _, plan = await h.admin("GET", "/api/plan")
    assert plan["offers_stale"] is True and "quota" in plan["offers_label"]
    _, fleet = await h.admin("GET", "/api/fleet")
    assert "search quota is spent" in fleet["offer_cache"]["alert"]
    tick = await h.core.autopilot.tick()
    assert tick is not None and any("stale" in n for n in tick.notes), tick
    metrics = await (await h.client.get(
        "/metrics", headers={"Authorization": "Bearer " + h.core.settings.admin_token})).text()
    assert "vm_vast_search_quota_exceeded 1.0" in metrics
    assert 'vm_vast_searches_total{outcome="quota_exceeded"} 1.0' in metrics


class CountingProvider:
    """Counts searches; answers one offer."""

    searches_metered = True

    def __init__(self) -> None:
        self.searches = 0

    async def search_offers(self, filter_text: str | None = None) -> list[Any]:
        self.searches += 1
        return []

    async def get_offer(self, offer_id: int) -> Any:
        self.searches += 1
        return None


@pytest.mark.parametrize("budget", [24, 480])
async def test_searches_a_day_stay_within_the_budget_whoever_asks(budget: int,
                                                                    tmp_path: Any) -> None:
    from support.coord_support import make_settings

    now = [1_800_000_000.0]
    provider = CountingProvider()
    cache = OfferCache(provider, make_settings(tmp_path, vast_searches_per_day=budget),  # type: ignore[arg-type]
                       lambda: now[0])
    per_day: dict[int, int] = {}
    for step in range(3 * 24 * 60):  # three days, a caller a minute with three filters
        before = provider.searches
        answer = await cache.search([None, "num_gpus>=2", "gpu_name=RTX_4090"][step % 3])
        assert answer.label().startswith(("offers as of", "no offers yet"))
        if step % 7 == 0:
            sent = provider.searches
            try:
                await cache.offer(9001)
            except RateLimited:
                assert provider.searches == sent  # refused, not sent
        day = int(now[0] // DAY_S)
        per_day[day] = per_day.get(day, 0) + provider.searches - before
        now[0] += 60
    assert max(per_day.values()) <= budget
    assert sum(per_day.values()) >= budget  # the budget is used, not starved


async def test_the_client_never_retries_the_quota_and_honours_retry_after(
        tmp_path: Any) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with FakeVast() as fake:
        fake.add_offer(9801, 88001)
        client = VastClient(FAKE_API_KEY, fake.url, sleep=sleep, rng=lambda: 0.0)
        try:
            fake.search_quota_per_day = 0
            with pytest.raises(SearchQuotaExceeded) as caught:
                await client.search_offers({"limit": 5})
            assert caught.value.reset_at is not None and caught.value.reset_at % DAY_S == 0
            assert len(bundles(fake)) == 1 and waits == []
            fake.search_quota_per_day = None
            fake.fail_next, fake.retry_after_s = 2, 7.0
            assert await client.list_instances() == []
            assert waits == [7.0, 7.0]  # the server's wait, not the backoff's 0.25 s
            fake.fail_next, fake.retry_after_s = 1, 120.0
            with pytest.raises(Exception, match="longer than 60"):
                await client.list_instances()
        finally:
            await client.close()


# --- price increases ---------------------------------------------------------------------


async def proving(env: BillEnv, offer_id: int, rate: float) -> tuple[int, int]:
    data = await env.deploy(offer_id)
    iid, vid = int(data["instance_id"]), int(data["provider_instance_id"])
    now = env.clock.now
    await env.h.store.write(lambda tx: tx.instances.update(
        iid, state=State.PROVING, rate_per_hour=rate, hello_at=now, state_since=now))
    return iid, vid


async def test_a_price_increase_is_accepted_while_worth_it_and_rejected_when_not(
        tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False, max_usd_per_proof=0.02) as env:
        env.fake.add_offer(9601, 86001, dph_total=0.40)
        env.fake.add_offer(9602, 86002, dph_total=0.40)
        kept, kept_vid = await proving(env, 9601, rate=40.0)  # break-even $0.80/h
        dear, dear_vid = await proving(env, 9602, rate=40.0)
        small = env.fake.raise_price(kept_vid, 0.60)  # whole bill about $0.65/h: worth it
        big = env.fake.raise_price(dear_vid, 1.20)  # about $1.25/h: $0.031/proof
        await env.tick()
        assert env.fake.pending_increases == {}  # both answered
        accept = [e for e in env.h.store.events(kept) if e["kind"] == "price_increase"]
        reject = [e for e in env.h.store.events(dear) if e["kind"] == "price_increase"]
        assert len(accept) == 1 and "accepted" in accept[0]["reason"]
        assert "$0.6000/h" in accept[0]["reason"] and "40.0 proofs/h" in accept[0]["reason"]
        data = orjson.loads(accept[0]["data_json"])
        assert data["verdict"] == "accept"
        assert data["pending_price_increase_id"] == small["pending_price_increase_id"]
        assert data["usd_per_proof"] == pytest.approx(0.0163, abs=1e-3)
        assert len(reject) == 1 and "rejected" in reject[0]["reason"]
        assert "above the break-even" in reject[0]["reason"]
        assert orjson.loads(reject[0]["data_json"])["usd_per_proof"] > 0.02
        assert big["pending_price_increase_id"] in {
            c.body["pending_price_increase_id"]
            for c in env.fake.calls("PUT", "/api/v0/instances/reject-price-increase/")}
        # At the contract's end: the accepted one bills its new price; the rejected one is
        # stopped by its host, then destroyed by the usual rule, with no strike.
        env.clock.advance(env.fake.contract_end_s + 1)
        for _ in range(3):
            env.clock.advance(MONITOR_INTERVAL_S)
            await env.tick()
        assert env.fake.instances[kept_vid]["rent_per_hour"] == pytest.approx(0.60)
        assert dear_vid not in env.fake.instances
        assert env.h.store.get_instance(dear)["state"] in ("destroyed", "terminating")
        assert env.h.store.strikes("86002") == []


async def test_a_trial_without_a_rate_waits_and_is_shown_pending(tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        env.fake.add_offer(9611, 86011, dph_total=0.40)
        data = await env.deploy(9611)
        env.fake.raise_price(int(data["provider_instance_id"]), 0.90)
        await env.tick()
        await env.tick()
        assert len(env.fake.pending_increases) == 1  # not answered
        pending = env.h.core.monitor.price_increases.pending
        assert pending[int(data["instance_id"])]["verdict"] == "wait"
        events = [e for e in env.h.store.events(int(data["instance_id"]))
                  if e["kind"] == "price_increase"]
        assert len(events) == 1 and "no rate measured yet" in events[0]["reason"]
        _, fleet = await env.h.admin("GET", "/api/fleet")
        assert fleet["pending_price_increases"][0]["verdict"] == "wait"


# --- an outbid trial ---------------------------------------------------------------------


async def test_a_trial_outbid_mid_benchmark_leaves_no_strike_and_no_measurement(
        tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False, interruptible_trials=True) as env:
        env.fake.add_offer(9951, 83001, dph_total=0.40, min_bid=0.10)
        data = await env.h.core.deployer.deploy(9951, interruptible=True)
        vid = data.provider_instance_id
        agent = env.h.agent(data.agent_id)
        await agent.hello()
        await env.heartbeat(agent, "benchmarking")
        env.fake.outbid(vid)  # for good, mid-benchmark: the agent falls silent
        for _ in range(int(30 * 3600 / MONITOR_INTERVAL_S)):
            env.clock.advance(MONITOR_INTERVAL_S)
            await env.tick()
            if vid not in env.fake.instances:
                break
        assert vid not in env.fake.instances
        assert env.h.store.strikes("83001") == []
        assert env.h.store.measurements() == []
        assert env.h.store.bad_host("83001", env.clock.now) is None
        ended = [e for e in env.h.store.events(data.instance_id) if e["kind"] == "requeued"]
        assert ended and "no strike, no measurement" in ended[0]["reason"]
        # Re-queued: the plan proposes the machine again.
        _, plan = await env.h.admin("GET", "/api/plan")
        assert any(p["machine_id"] == "83001" for p in plan["proposals"]), plan


# --- the webhook -------------------------------------------------------------------------


def signed(body: bytes, stamp: int, secret: str = SECRET) -> str:
    mac = hmac.new(secret.encode(), str(stamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


async def test_a_signed_offline_webhook_moves_the_vast_state_and_bad_ones_change_nothing(
        tmp_path: Any) -> None:
    # The monitor's own loop runs, a round every 60 s: a state that moves within seconds
    # moved because the webhook asked for a round.
    async with bill_env(tmp_path, loading=False, vast_webhook_secret=SECRET) as env:
        env.fake.add_offer(9501, 85001)
        data = await env.deploy(9501)
        vid = int(data["provider_instance_id"])
        monitor = env.h.core.monitor
        loop = asyncio.create_task(monitor.run())
        try:
            await until(lambda: vid in monitor.vast_seen)
            assert monitor.vast_seen[vid]["actual_status"] == "running"
            env.fake.host_trouble(vid, "offline", 600)
            body = orjson.dumps({"event_id": "ev-1", "user_id": 1,
                                 "notif_type": "instance_offline", "subject": "offline",
                                 "message": "m", "timestamp": 1.0})
            stamp = int(env.clock.now)

            async def post(headers: dict[str, str], raw: bytes = body) -> int:
                resp = await env.h.client.post("/v1/vast/webhook", data=raw, headers=headers)
                return resp.status

            good = {"X-Vast-Event-Id": "ev-1", "X-Vast-Timestamp": str(stamp),
                    "X-Vast-Signature-256": signed(body, stamp), "X-Vast-Delivery-Attempt": "1"}
            refused = [
                await post({**good, "X-Vast-Signature-256": signed(body, stamp, "wrong")}),
                await post({**good, "X-Vast-Timestamp": str(stamp - 301),
                            "X-Vast-Signature-256": signed(body, stamp - 301)}),
                await post(good, body + b" "),  # the body changed after signing
            ]
            assert refused == [401, 400, 401]
            await asyncio.sleep(1.0)
            assert monitor.vast_seen[vid]["actual_status"] == "running"  # no round ran
            assert await post(good) == 204
            await until(lambda: monitor.vast_seen[vid]["actual_status"] == "offline")
            env.fake.set_status(vid, "running")
            assert await post(good) == 409  # the same event again: a replay
            await asyncio.sleep(1.0)
            assert monitor.vast_seen[vid]["actual_status"] == "offline"  # no round ran
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


async def until(ok: Any, timeout_s: float = 10.0) -> None:
    """Wait for ``ok()``, far below the monitor's 60 s interval."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not ok():
        assert asyncio.get_running_loop().time() < deadline, "no round within 10 s"
        await asyncio.sleep(0.05)


async def test_an_outbid_kept_instance_is_raised_within_its_cap_or_waits_then_goes(
        tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False, interruptible_trials=True,
                        max_usd_per_proof=0.02) as env:
        env.fake.add_offer(9961, 83101, dph_total=0.40, min_bid=0.10)
        env.fake.add_offer(9962, 83102, dph_total=0.40, min_bid=0.10)
        raised = await env.h.core.deployer.deploy(9961, interruptible=True)
        capped = await env.h.core.deployer.deploy(9962, interruptible=True)
        for data, rate in ((raised, 40.0), (capped, 8.0)):  # caps ~$0.75/h and ~$0.11/h
            await env.h.store.write(
                lambda tx, i=data.instance_id, r=rate, t=env.clock.now: tx.instances.update(
                    i, state=State.PROVING, rate_per_hour=r, hello_at=t, state_since=t))
        bid = float(env.h.store.get_instance(raised.instance_id)["bid_per_hour"])
        env.fake.outbid(raised.provider_instance_id, winning_bid=bid * 1.4)
        env.fake.outbid(capped.provider_instance_id, winning_bid=bid * 1.4)
        await env.tick()
        await env.tick()
        # Raised twice (a quarter each round) until its bid beats the winner's: running.
        bids = [c.body["price"] for c in env.fake.calls("PUT", "/api/v0/instances/bid_price/")
                if c.path.endswith(f"/{raised.provider_instance_id}/")]
        assert bids == [pytest.approx(bid * 1.25, rel=1e-4), pytest.approx(bid * 1.5625,
                                                                            rel=1e-4)]
        assert env.fake.instances[raised.provider_instance_id]["actual_status"] == "running"
        kept = [e["reason"] for e in env.h.store.events(raised.instance_id)
                if e["kind"] == "kept"]
        assert kept and "bid raised" in kept[0] and "40.0 proofs/h" in kept[0]
        # At 8 proofs/h the cap is below its bid: no raise; it waits, then goes, no strike.
        assert not [c for c in env.fake.calls("PUT", "/api/v0/instances/bid_price/")
                    if c.path.endswith(f"/{capped.provider_instance_id}/")]
        told = [e["reason"] for e in env.h.store.events(capped.instance_id)
                if e["kind"] == "kept"]
        assert told and "at its cap" in told[0] and "kept up to" in told[0]
        for _ in range(int(30 * 3600 / MONITOR_INTERVAL_S)):
            env.clock.advance(MONITOR_INTERVAL_S)
            await env.tick()
            if capped.provider_instance_id not in env.fake.instances:
                break
        assert capped.provider_instance_id not in env.fake.instances
        assert env.h.store.strikes("83102") == []


async def test_a_blocked_machine_shows_its_renter_reports(tmp_path: Any) -> None:
    async with bill_env(tmp_path, loading=False) as env:
        env.fake.add_report(86501, "gpu_error", "GPU fell off the bus")
        status, _ = await env.h.admin("POST", "/api/bad-hosts",
                                      {"machine_id": "86501", "reason": "12/h, too slow"})
        assert status == 200
        await env.tick()
        await env.tick()  # read once, not again within the re-read interval
        assert len(env.fake.calls("GET", "/api/v0/machines/86501/reports/")) == 1
        _, rows = await env.h.admin("GET", "/api/bad-hosts")
        assert rows[0]["renter_reports"][0]["problem"] == "gpu_error"
        events = [e for e in env.h.store.events() if e["kind"] == "machine_reports"]
        assert len(events) == 1 and "GPU" not in events[0]["reason"]
        assert "gpu_error" in events[0]["reason"]
