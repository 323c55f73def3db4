"""Benchmark proofs counted when the daemon's /status says they finished (agent/benchwatch.py)."""

from __future__ import annotations

from typing import Any

from vast_manager.agent.benchwatch import BenchWatch, Finished


def status(uptime: float, completed: int, failed: int,
           pipelines: list[tuple[str, float, list[str]]]) -> dict[str, Any]:
    return {
        "uptime_secs": uptime,
        "counters": {"total_completed": completed, "total_failed": failed, "queue_depth": 0},
        "pipelines": [
            {"job_id": job, "proof_kind": "porep-c2", "started_secs_ago": ago,
             "total_partitions": len(states), "partitions_done": states.count("done"),
             "partitions": [{"index": i, "state": st, "synth_ms": 1, "gpu_ms": 1}
                            for i, st in enumerate(states)]}
            for job, ago, states in pipelines
        ],
    }


DONE = ["done"] * 10
RUNNING = ["done"] * 4 + ["gpu", "synthesizing"] + ["pending"] * 4


def test_proofs_are_counted_when_they_finish_with_their_seconds() -> None:
    # The warm-up proof finished before: neither it nor its pipeline is the benchmark's.
    w = BenchWatch(status(100.0, 1, 0, [("warm", 80.0, DONE)]))
    assert w.update(status(101.0, 1, 0, [("warm", 81.0, DONE), ("a", 1.0, RUNNING)])) == []
    got = w.update(status(161.0, 2, 0, [("a", 61.0, DONE), ("b", 30.0, RUNNING)]))
    # Finished some time in the last minute between polls: half of it, on average.
    assert got == [Finished(True, 31.0)]
    assert w.update(status(162.0, 2, 0, [("a", 62.0, DONE), ("b", 31.0, RUNNING)])) == []
    got = w.update(status(164.0, 3, 1, [("b", 33.0, DONE), ("c", 3.0, ["failed", *DONE[1:]])]))
    assert got == [Finished(True, 32.0), Finished(False, None)]


def test_a_proof_whose_pipeline_was_not_seen_still_counts() -> None:
    w = BenchWatch(status(10.0, 0, 0, []))
    assert w.update(status(20.0, 2, 0, [("x", 9.0, DONE)])) == [
        Finished(True, 4.0), Finished(True, None)
    ]


def test_garbage_and_missing_counters_change_nothing() -> None:
    w = BenchWatch({})
    assert w.update({"counters": "no"}) == []
    assert w.update({"counters": {"total_completed": 1}}) == []
    assert w.update({"counters": {"total_completed": 1, "total_failed": 0},
                     "pipelines": [None, {"proof_kind": "porep-c2", "job_id": 3}]}) == [
        Finished(True, None)
    ]
    # A counter going backwards (another daemon) is no finished proof.
    assert w.update({"counters": {"total_completed": 0, "total_failed": 0}}) == []
