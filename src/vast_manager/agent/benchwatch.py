"""When benchmark proofs really finish, read from the daemon's ``GET /status``.

``cuzk-bench batch -j N`` (N > 1) prints nothing until it has submitted its
last proof, then prints the lines in submission order, each after the proofs
submitted before it (docs/cuzk.md): a line's arrival says little about when
its proof finished. The daemon's /status does: ``counters.total_completed``
and ``total_failed`` count proofs as they finish, and each proof's pipeline
(``pipelines[]``, kept about 30 s after it finished) shows its partitions
reaching ``done`` and how long ago it was dispatched (``started_secs_ago``).
`BenchWatch` turns successive /status answers into finished proofs with
their seconds, for the heartbeats' ``proof_seconds_recent`` and the
steady-state telemetry window; the printed lines stay the result's figures.

The watch also tells when the batch has really begun: a proof the daemon
dispatched or queued that was not there before, or a counter that moved.
The agent announces the run's concurrency only from then on, because the
coordinator's early verdict times the batch from its first sight of that
announcement (docs/policy.md, the elapsed time), and starting ``cuzk-bench``
takes time that is not the host's proving.

A pipeline's partitions all reach ``done`` before the proof is counted: the
daemon assembles the proof and verifies it against the request's sector and
miner in between (docs/cuzk.md, the C1 input). A poll can fall in that gap,
so a finished pipeline's seconds wait until the counters take it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POREP_KIND = "porep-c2"  # /status proof_kind of a PoRep C2 proof (cuzk-core/src/types.rs)
_TERMINAL = {"done", "failed"}


@dataclass(frozen=True, slots=True)
class Finished:
    """One proof the daemon finished: whether it completed, and its seconds if known."""

    completed: bool
    wall_seconds: float | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


class BenchWatch:
    """Successive /status answers in, finished proofs out (in the order they finished)."""

    def __init__(self, first: Mapping[str, Any]) -> None:
        counters = first.get("counters")
        c = counters if isinstance(counters, dict) else {}
        self._completed = _int(c.get("total_completed")) or 0
        self._failed = _int(c.get("total_failed")) or 0
        self._uptime = _num(first.get("uptime_secs"))
        # Pipelines already finished before the benchmark are not its proofs.
        self._seen_done: set[str] = {j for j, _, _ in self._finished_pipelines(first)}
        # Seconds of pipelines seen finished whose proofs the counters have not taken yet.
        self._unclaimed: list[float | None] = []
        self._failed_unclaimed = 0  # pipelines seen with a failed partition, not yet counted
        self._jobs_before = self._porep_jobs(first)
        self._queue_before = _int(c.get("queue_depth")) or 0
        self.began = False
        """Whether an answer has shown the batch under way (see ``saw_batch_begin``)."""

    @staticmethod
    def _porep_jobs(status: Mapping[str, Any]) -> set[str]:
        pipelines = status.get("pipelines")
        return {p["job_id"] for p in (pipelines if isinstance(pipelines, list) else [])
                if isinstance(p, dict) and p.get("proof_kind") == POREP_KIND
                and isinstance(p.get("job_id"), str)}

    def saw_batch_begin(self, status: Mapping[str, Any]) -> bool:
        """True from the first answer showing a proof of the batch dispatched or queued
        (a new PoRep pipeline, a longer queue, or a proof finished since the first)."""
        if not self.began:
            counters = status.get("counters")
            c = counters if isinstance(counters, dict) else {}
            self.began = (
                bool(self._porep_jobs(status) - self._jobs_before)
                or (_int(c.get("queue_depth")) or 0) > self._queue_before
                or (_int(c.get("total_completed")) or 0) > self._completed
                or (_int(c.get("total_failed")) or 0) > self._failed
            )
        return self.began

    @staticmethod
    def _finished_pipelines(
        status: Mapping[str, Any],
    ) -> list[tuple[str, float | None, bool]]:
        """(job id, seconds since dispatch, whether a partition failed) of finished ones."""
        out: list[tuple[str, float | None, bool]] = []
        pipelines = status.get("pipelines")
        for p in pipelines if isinstance(pipelines, list) else []:
            if not isinstance(p, dict) or p.get("proof_kind") != POREP_KIND:
                continue
            parts = p.get("partitions")
            job = p.get("job_id")
            if not isinstance(job, str) or not isinstance(parts, list) or not parts:
                continue
            if all(isinstance(q, dict) and q.get("state") in _TERMINAL for q in parts):
                failed = any(q.get("state") == "failed" for q in parts)
                out.append((job, _num(p.get("started_secs_ago")), failed))
        return out

    def update(self, status: Mapping[str, Any]) -> list[Finished]:
        """Proofs finished since the previous answer (empty when it says nothing new)."""
        counters = status.get("counters")
        if not isinstance(counters, dict):
            return []
        completed = _int(counters.get("total_completed"))
        failed = _int(counters.get("total_failed"))
        if completed is None or failed is None:
            return []
        new_ok = max(0, completed - self._completed)
        new_failed = max(0, failed - self._failed)
        self._completed, self._failed = max(completed, self._completed), max(failed, self._failed)
        uptime = _num(status.get("uptime_secs"))
        # A proof that finished since the last poll did so, on average, half a poll ago.
        half_poll = (
            (uptime - self._uptime) / 2.0
            if uptime is not None and self._uptime is not None and uptime >= self._uptime
            else 0.0
        )
        self._uptime = uptime
        for job, ago, partition_failed in self._finished_pipelines(status):
            if job in self._seen_done:
                continue
            self._seen_done.add(job)
            if partition_failed:
                self._failed_unclaimed += 1
            else:
                self._unclaimed.append(max(0.0, ago - half_poll) if ago is not None else None)
        walls = self._unclaimed[:new_ok]
        del self._unclaimed[:new_ok]
        walls += [None] * (new_ok - len(walls))
        # A proof failed by its self-check has every partition done too: which of the
        # finished pipelines it was cannot always be told. Failures not explained by a
        # failed partition take the oldest unclaimed seconds with them, so those are
        # never given to a later completed proof.
        explained = min(new_failed, self._failed_unclaimed)
        self._failed_unclaimed -= explained
        del self._unclaimed[: new_failed - explained]
        return [Finished(True, w) for w in walls] + [Finished(False, None)] * new_failed
