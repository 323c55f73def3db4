"""The agent's on-disk spool: durable, ordered, bounded, never drops a result."""

from __future__ import annotations

from pathlib import Path

import orjson

from vast_manager.agent.spool import Spool
from vast_manager.protocol import LogLine, Result


def _result(rid: str) -> Result:
    return Result(
        result_id=rid,
        kind="benchmark",
        proof_type="porep-c2-32g",
        started_at=1.0,
        finished_at=2.0,
        gpus_used=[0],
        proofs_completed=1,
        proofs_failed=0,
        wall_seconds=1.0,
        rate_per_hour=3600.0,
        proof_seconds=[1.0],
        telemetry=None,
    )


def _lines(n: int, text: str = "x" * 100) -> list[LogLine]:
    return [LogLine(ts=float(i), source="agent", text=text) for i in range(n)]


def test_entries_survive_a_restart_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.put_logs(_lines(2))
    spool.put_result(_result("res_a"))
    spool.put_logs(_lines(1))
    # A crash mid-write leaves only a temporary file, which is not an entry.
    (tmp_path / "spool" / "000000000099-logs.json.tmp").write_bytes(b"{")
    again = Spool(tmp_path / "spool")
    kinds = [e.kind for e in again.pending()]
    assert kinds == ["logs", "result", "logs"]
    assert [e.result_id for e in again.pending("result")] == ["res_a"]
    body = orjson.loads(again.pending("result")[0].read())
    assert body["result_id"] == "res_a" and body["kind"] == "benchmark"
    assert not list((tmp_path / "spool").glob("*.tmp"))
    # New entries continue the sequence after the old ones.
    entry = again.put_logs(_lines(1))
    assert entry is not None and entry.seq > max(e.seq for e in again.pending()[:-1])


def test_same_result_id_is_spooled_once(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = spool.put_result(_result("res_1"))
    second = spool.put_result(_result("res_1"))
    assert first.path == second.path
    assert len(spool.pending("result")) == 1


def test_remove_after_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    entry = spool.put_result(_result("res_1"))
    spool.remove(entry)
    assert spool.pending() == []
    assert Spool(tmp_path).pending() == []


def test_bound_drops_oldest_logs_never_results(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=20_000)
    spool.put_result(_result("res_old"))
    for _ in range(10):
        spool.put_logs(_lines(30))  # about 4 KB each
    assert spool.size_bytes() <= 20_000
    assert spool.dropped_log_batches > 0
    assert spool.find_result("res_old") is not None
    # The newest log batches are the ones kept.
    logs = spool.pending("logs")
    assert logs[-1].seq == max(e.seq for e in spool.pending())
    # Results alone beyond the bound are all kept.
    for i in range(100):
        spool.put_result(_result(f"res_{i}"))
    assert len(spool.pending("result")) == 101
    assert spool.pending("logs") == []


def test_result_id_must_be_a_safe_file_name(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    try:
        spool.put_result(_result("../evil"))
    except ValueError:
        pass
    else:
        raise AssertionError("a result_id with a path was accepted")


class _Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_acknowledged_entries_are_kept_for_the_retention_then_go(tmp_path: Path) -> None:
    clock = _Clock()
    spool = Spool(tmp_path / "spool", retention_s=600.0, clock=clock)
    first = spool.put_logs(_lines(2))
    assert first is not None
    # A fresh spool numbers from the clock (milliseconds), so a spool made again on the
    # same instance never reuses a number the coordinator stored.
    assert first.seq == 1_800_000_000_000 + 1
    result = spool.put_result(_result("res_a"))
    assert orjson.loads(result.read())["spool_seq"] == result.seq
    assert orjson.loads(first.read())["spool_seq"] == first.seq
    spool.acknowledged(first)
    spool.acknowledged(result, b'{"kept": "with its receipt"}')
    assert spool.pending() == []
    assert [e.seq for e in spool.acked()] == [first.seq, result.seq]
    assert spool.acked("result")[0].read() == b'{"kept": "with its receipt"}'
    assert spool.acked_seq() == result.seq
    # Across a restart the numbers go on from what is kept.
    again = Spool(tmp_path / "spool", retention_s=600.0, clock=clock)
    assert again.acked_seq() == result.seq
    assert again.put_logs(_lines(1)).seq == result.seq + 1  # type: ignore[union-attr]
    clock.now += 601
    again.prune_acked()
    assert again.acked() == [] and again.acked_seq() is None


def test_acknowledged_entries_are_bounded_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1_048_576, retention_s=3600.0)
    for _ in range(30):
        entry = spool.put_logs(_lines(500))  # about 60 kB a batch
        assert entry is not None
        spool.acknowledged(entry)
    kept = spool.acked()
    assert sum(e.size_bytes for e in kept) <= 1_048_576
    assert kept[-1].seq == spool.acked_seq() and len(kept) < 30
