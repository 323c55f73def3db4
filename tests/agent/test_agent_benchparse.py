"""The `cuzk-bench batch` output parser (the format of docs/cuzk.md)."""

from __future__ import annotations

import pytest

from vast_manager.agent.benchparse import (
    BenchLineParser,
    BenchOutputError,
    TruncatedBenchOutput,
    parse_bench_output,
    parse_proof_line,
)

EM = "\u2014"

FULL = f"""=== Batch Benchmark ===
proof type:  porep
count:       12
concurrency: 2

  [1/12] COMPLETED {EM} 41.3s (prove=23012 ms, queue=0 ms)
  [2/12] COMPLETED {EM} 39.8s (prove=22871 ms, queue=1204 ms)
  [4/12] COMPLETED {EM} 40.0s (prove=22900 ms, queue=0 ms)
  [3/12] COMPLETED {EM} 44.0s (prove=23600 ms, queue=10 ms)
  [5/12] COMPLETED {EM} 38.2s (prove=22500 ms, queue=0 ms)
  [6/12] COMPLETED {EM} 40.1s (prove=22900 ms, queue=0 ms)
  [7/12] FAILED {EM} 12.0s (prove=0 ms, queue=0 ms)
  [8/12] COMPLETED {EM} 40.0s (prove=22900 ms, queue=0 ms)
  [10/12] COMPLETED {EM} 40.0s (prove=22900 ms, queue=0 ms)
  [9/12] COMPLETED {EM} 39.0s (prove=22900 ms, queue=0 ms)
  [11/12] COMPLETED {EM} 40.5s (prove=22900 ms, queue=0 ms)
  [12/12] COMPLETED {EM} 40.0s (prove=22900 ms, queue=0 ms)

=== Batch Summary ===
total time:    512.4s
completed:     11
failed:        1
wall time:     avg=40.1s min=38.2s max=44.0s
prove time:    avg=22.9s min=22.5s max=23.6s
throughput:    1.288 proofs/min (46.6s/proof)
"""


def test_full_output_with_failed_line_and_completion_order() -> None:
    run = parse_bench_output(FULL)
    assert run.proof_type == "porep"
    assert (run.count, run.concurrency) == (12, 2)
    assert (run.completed, run.failed) == (11, 1)
    assert run.total_seconds == pytest.approx(512.4)
    assert run.proofs_per_min == pytest.approx(1.288)
    assert run.rate_per_hour == pytest.approx(60 * 1.288)
    # Completion order is kept, not re-sorted by index.
    assert [p.index for p in run.proofs] == [1, 2, 4, 3, 5, 6, 7, 8, 10, 9, 11, 12]
    assert run.proof_seconds[:4] == [41.3, 39.8, 40.0, 44.0]
    assert len(run.proof_seconds) == 11  # the FAILED proof has no proof seconds
    failed = [p for p in run.proofs if not p.completed]
    assert [(p.index, p.wall_seconds, p.prove_ms) for p in failed] == [(7, 12.0, 0.0)]
    assert run.warnings == []


def test_incremental_parser_reports_each_proof_as_it_comes() -> None:
    parser = BenchLineParser()
    seen = []
    for line in FULL.splitlines(keepends=True):
        proof = parser.feed(line)
        if proof is not None:
            seen.append(proof.index)
    assert seen[:3] == [1, 2, 4]
    assert parser.finish().completed == 11


def test_nothing_completed() -> None:
    text = f"""=== Batch Benchmark ===
proof type:  porep
count:       2
concurrency: 2

  [1/2] FAILED {EM} 3.0s (prove=0 ms, queue=0 ms)
  [2/2] FAILED {EM} 3.1s (prove=0 ms, queue=0 ms)

=== Batch Summary ===
total time:    3.2s
completed:     0
failed:        2
"""
    run = parse_bench_output(text)
    assert (run.completed, run.failed) == (0, 2)
    assert run.rate_per_hour == 0.0
    assert run.proof_seconds == []


def test_nothing_completed_with_a_zero_throughput_line() -> None:
    text = (
        "=== Batch Summary ===\ntotal time:    1.0s\ncompleted:     0\nfailed:        1\n"
        "throughput:    0.000 proofs/min (inf s/proof)\n"
    )
    assert parse_bench_output(text).rate_per_hour == 0.0


@pytest.mark.parametrize(
    "cut_after",
    [
        "count:       12",
        "[6/12] COMPLETED",
        "=== Batch Summary ===",
        "completed:     11",
        "prove time:",
    ],
)
def test_truncated_output_raises_a_named_error(cut_after: str) -> None:
    text = FULL[: FULL.index(cut_after) + len(cut_after)]
    text = text[: text.rfind("\n") + 1] if cut_after.startswith("prove") else text
    with pytest.raises(TruncatedBenchOutput) as info:
        parse_bench_output(text)
    assert "cuzk-bench" in str(info.value)


def test_empty_output_is_truncated() -> None:
    with pytest.raises(TruncatedBenchOutput):
        parse_bench_output("")


def test_garbled_throughput_is_an_error() -> None:
    text = FULL.replace("1.288 proofs/min", "fast")
    with pytest.raises(BenchOutputError):
        parse_bench_output(text)


def test_summary_disagreeing_with_lines_is_a_warning() -> None:
    run = parse_bench_output(FULL.replace("completed:     11", "completed:     10"))
    assert run.completed == 10
    assert run.warnings


def test_noise_lines_are_ignored_and_ascii_dash_accepted() -> None:
    line = parse_proof_line("  [3/4] COMPLETED - 10.5s (prove=1 ms, queue=2 ms)")
    assert line is not None
    assert (line.index, line.count, line.completed) == (3, 4, True)
    assert (line.wall_seconds, line.prove_ms, line.queue_ms) == (10.5, 1.0, 2.0)
    ascii_full = FULL.replace(f"COMPLETED {EM}", "COMPLETED -").replace(f"FAILED {EM}", "FAILED -")
    assert EM not in ascii_full
    text = "INFO connecting to daemon\n" + ascii_full
    assert parse_bench_output(text).completed == 11
    assert parse_proof_line("  [x/4] COMPLETED") is None
