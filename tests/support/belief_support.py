"""Replaying hostile hosts' benchmarks against the real app: deploy an offer, run a
benchmark watched heartbeat by heartbeat, send its result, and read what must not move
(``host_perf`` and every offer's prediction). Every rate here is simulated."""

from __future__ import annotations

from typing import Any

import orjson

from support.coord_support import Agent, Harness, result_msg

PACE_S = 15


async def deploy(h: Harness, offer_id: int, *, min_rate: float | None = None,
                 gpus: int = 1) -> Agent:
    body: dict[str, Any] = {"offer_id": offer_id}
    if min_rate is not None:
        body["min_rate_per_hour"] = min_rate
    status, data = await h.admin("POST", "/api/deploy", body)
    assert status == 200, data
    agent = h.agent(data["agent_id"])
    status, directive = await agent.hello(gpus=gpus)
    assert status == 200, directive
    # The first benchmark is one the coordinator asks for: its id rides every directive.
    assert directive["benchmark_id"].startswith("bm_")
    agent.benchmark_id = directive["benchmark_id"]  # type: ignore[attr-defined]
    return agent


def bench_hb(agent: Agent, *, done: int, total: int, recent: list[float],
             completed: int) -> dict[str, Any]:
    agent.seq += 1
    return {
        "seq": agent.seq, "phase": "benchmarking", "phase_started_at": 1_800_000_000.0,
        "progress": {"done": done, "total": total, "unit": "proofs", "concurrency": 2},
        "proofs_completed_total": completed, "proof_seconds_recent": recent,
        "telemetry": None,
    }


async def run_watched(h: Harness, agent: Agent, proofs: int, proof_s: float) -> float:
    """A benchmark of ``proofs`` proofs on 2 slots, each ``proof_s`` long, with a
    heartbeat every minute saying so (what the agent really sends): returns its wall."""
    wall = proofs * proof_s / 2
    status, _ = await agent.post("/v1/heartbeat", bench_hb(agent, done=0, total=proofs,
                                                           recent=[], completed=0))
    assert status == 200
    done = 0
    elapsed = 0.0
    while elapsed < wall:
        h.clock.advance(60)
        elapsed += 60
        now_done = min(proofs, int(elapsed * 2 / proof_s))
        recent = [proof_s] * (now_done - done)
        done = now_done
        status, directive = await agent.post(
            "/v1/heartbeat", bench_hb(agent, done=done, total=proofs, recent=recent,
                                      completed=done))
        assert status == 200 and directive["action"] == "continue", directive
    return wall


async def send_result(h: Harness, agent: Agent, result_id: str, *, rate: float,
                      wall: float, benchmark_id: str | None = None,
                      **kw: Any) -> dict[str, Any]:
    proofs = round(rate * wall / 3600.0)
    extra: dict[str, Any] = {"benchmark_id": benchmark_id} if benchmark_id is not None else {}
    kw.setdefault("proof_seconds", [2 * wall / proofs] * proofs)
    status, data = await agent.post("/v1/result", result_msg(
        result_id, proofs=proofs, wall_seconds=wall, finished_at=h.clock(), **extra, **kw))
    assert status == 200, data
    return data


class Standing:
    """What a held result must not move: host_perf and every offer's prediction."""

    def __init__(self, perf: list[dict[str, Any]], offers: list[dict[str, Any]]) -> None:
        self.perf = perf
        self.predictions = {o["id"]: (o["predicted_rate_per_hour"], o["predicted_rate_high"])
                            for o in offers}


async def standing(h: Harness) -> Standing:
    await h.core.models.refresh()
    _, perf = await h.admin("GET", "/api/host-perf")
    _, offers = await h.admin("GET", "/api/offers")
    return Standing(perf, offers)


def stored(h: Harness, agent: Agent, result_id: str) -> dict[str, Any]:
    row = h.store.find_result(agent.agent_id, result_id)
    assert row is not None
    return row


def reasons(row: dict[str, Any]) -> list[str]:
    return list(orjson.loads(row["flag_reasons_json"]))


