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


def test_a_pipeline_done_before_its_proof_is_counted_keeps_its_seconds() -> None:
    # Every partition is done, but the daemon is still assembling and self-checking
    # the proof: the counters take it a poll later, and its seconds with it.
    w = BenchWatch(status(100.0, 0, 0, []))
    assert w.update(status(102.0, 0, 0, [("a", 40.0, DONE)])) == []
    assert w.update(status(104.0, 1, 0, [("a", 42.0, DONE)])) == [Finished(True, 39.0)]
    assert w.update(status(106.0, 1, 0, [("a", 44.0, DONE)])) == []


def test_a_self_check_failure_never_lends_its_seconds_to_a_later_proof() -> None:
    # "a" had every partition done and then failed its self-check: its seconds are
    # dropped with the failure, and "b", counted later, gets its own.
    w = BenchWatch(status(100.0, 0, 0, []))
    assert w.update(status(102.0, 0, 0, [("a", 50.0, DONE)])) == []
    assert w.update(status(104.0, 0, 1, [("a", 52.0, DONE)])) == [Finished(False, None)]
    got = w.update(status(106.0, 1, 1, [("a", 54.0, DONE), ("b", 20.0, DONE)]))
    assert got == [Finished(True, 19.0)]
    # A failure whose pipeline shows a failed partition takes no one else's seconds.
    assert w.update(status(108.0, 1, 1, [("c", 8.0, DONE)])) == []
    got = w.update(status(110.0, 2, 2, [("c", 10.0, DONE), ("d", 9.0, ["failed", *DONE[1:]])]))
    assert got == [Finished(True, 7.0), Finished(False, None)]


def test_the_batch_begins_with_a_new_pipeline_a_longer_queue_or_a_counter() -> None:
    before = status(100.0, 1, 0, [("warm", 80.0, DONE)])
    # The warm-up's pipeline, still listed, is not the batch.
    w = BenchWatch(before)
    assert not w.saw_batch_begin(status(101.0, 1, 0, [("warm", 81.0, DONE)]))
    assert not w.saw_batch_begin({"counters": "garbage", "pipelines": [None]})
    assert w.saw_batch_begin(status(102.0, 1, 0, [("warm", 82.0, DONE), ("a", 0.5, RUNNING)]))
    # Once begun, it stays begun.
    assert w.saw_batch_begin(status(103.0, 1, 0, []))
    queued = status(101.0, 1, 0, [])
    queued["counters"]["queue_depth"] = 2
    assert BenchWatch(before).saw_batch_begin(queued)
    # A proof finished since the first answer (pipelines already dropped).
    assert BenchWatch(before).saw_batch_begin(status(140.0, 2, 0, []))
    assert BenchWatch(before).saw_batch_begin(status(140.0, 1, 1, []))
