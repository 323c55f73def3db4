"""Parser of ``cuzk-bench batch`` output (format strings in docs/cuzk.md).

``BenchLineParser`` takes the output a line at a time; ``finish()`` returns
the run's ``BenchRun``; ``parse_bench_output`` does both for a whole text.
Output that stops before the summary (the process died) raises
``TruncatedBenchOutput``. With ``-j`` above 1 the tool prints its proof
lines in submission order, each after the proofs submitted before it have
returned: a line's arrival is not when its proof finished (the agent takes
that from the daemon, `vast_manager.agent.benchwatch`), but its wall seconds are the
proof's own. Every status but ``COMPLETED`` (``FAILED``, ``CANCELLED``,
``TIMEOUT``, ``UNKNOWN``) is a proof that did not complete.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# "  [7/12] FAILED — 12.0s (prove=0 ms, queue=0 ms)". The real tool prints an
# em dash (U+2014); an ASCII dash is accepted too, in case a terminal or a
# log pipeline replaced it. The labels are main.rs status_label's.
STATUS_LABELS = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN")
_PROOF_RE = re.compile(
    r"^\s*\[(?P<index>\d+)/(?P<count>\d+)\]\s+(?P<status>" + "|".join(STATUS_LABELS)
    + r")\s*(?:\u2014|--?)\s*"
    r"(?P<wall>\d+(?:\.\d+)?)\s*s"
    r"(?:\s*\(prove=(?P<prove>\d+(?:\.\d+)?)\s*ms,\s*queue=(?P<queue>\d+(?:\.\d+)?)\s*ms\))?"
)
_KV_RE = re.compile(r"^\s*(?P<key>[a-z][a-z ]*[a-z]):\s+(?P<value>.*?)\s*$")
_THROUGHPUT_RE = re.compile(r"^(?P<ppm>\d+(?:\.\d+)?)\s*proofs/min")
_SECONDS_RE = re.compile(r"^(?P<s>\d+(?:\.\d+)?)\s*s$")

HEADER = "=== Batch Benchmark ==="
SUMMARY = "=== Batch Summary ==="


class BenchOutputError(ValueError):
    """The output of ``cuzk-bench batch`` could not be understood."""


class TruncatedBenchOutput(BenchOutputError):
    """The output stopped before its summary was complete: the process died or was killed."""


@dataclass(frozen=True, slots=True)
class ProofLine:
    """One ``[i/n] STATUS`` line."""

    index: int
    count: int
    status: str
    wall_seconds: float
    prove_ms: float | None
    queue_ms: float | None

    @property
    def completed(self) -> bool:
        return self.status == "COMPLETED"


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One ``cuzk-bench batch`` run, as its output told it."""

    proof_type: str | None
    count: int | None
    concurrency: int | None
    proofs: list[ProofLine]  # in printed (submission) order
    completed: int
    failed: int
    total_seconds: float
    proofs_per_min: float
    warnings: list[str] = field(default_factory=list)

    @property
    def rate_per_hour(self) -> float:
        """Proofs per hour: 60 x the printed proofs/min (it is not printed directly)."""
        return 60.0 * self.proofs_per_min

    @property
    def proof_seconds(self) -> list[float]:
        """Wall seconds of each completed proof, in printed order."""
        return [p.wall_seconds for p in self.proofs if p.completed]


def parse_proof_line(line: str) -> ProofLine | None:
    m = _PROOF_RE.match(line)
    if m is None:
        return None
    return ProofLine(
        index=int(m["index"]),
        count=int(m["count"]),
        status=m["status"],
        wall_seconds=float(m["wall"]),
        prove_ms=float(m["prove"]) if m["prove"] is not None else None,
        queue_ms=float(m["queue"]) if m["queue"] is not None else None,
    )


class BenchLineParser:
    """Incremental parser: ``feed`` each line, ``finish`` at end of output."""

    def __init__(self) -> None:
        self.proofs: list[ProofLine] = []
        self._header: dict[str, str] = {}
        self._summary: dict[str, str] = {}
        self._section: str | None = None
        self._lines = 0

    def feed(self, line: str) -> ProofLine | None:
        """Take one line; returns the proof it reports, if it is a proof line."""
        self._lines += 1
        text = line.rstrip("\r\n")
        stripped = text.strip()
        if stripped == HEADER:
            self._section = "header"
            return None
        if stripped == SUMMARY:
            self._section = "summary"
            return None
        proof = parse_proof_line(text)
        if proof is not None:
            self.proofs.append(proof)
            return proof
        m = _KV_RE.match(text)
        if m is not None and self._section is not None:
            target = self._summary if self._section == "summary" else self._header
            target.setdefault(m["key"], m["value"])
        # Anything else (log noise on stdout) is not ours to judge.
        return None

    def _summary_int(self, key: str) -> int:
        value = self._summary[key]
        try:
            return int(value)
        except ValueError:
            raise BenchOutputError(f"summary line {key!r} is not an integer: {value!r}") from None

    def finish(self) -> BenchRun:
        """The run's figures. Raises ``TruncatedBenchOutput`` when the summary is incomplete."""
        done = sum(1 for p in self.proofs if p.completed)
        failed_lines = len(self.proofs) - done
        if self._section != "summary":
            raise TruncatedBenchOutput(
                f"cuzk-bench output ended before its summary ({self._lines} lines read, "
                f"{done} proofs completed and {failed_lines} failed so far)"
            )
        missing = [k for k in ("total time", "completed", "failed") if k not in self._summary]
        if missing:
            raise TruncatedBenchOutput(
                "cuzk-bench summary is incomplete: missing " + ", ".join(repr(k) for k in missing)
            )
        m = _SECONDS_RE.match(self._summary["total time"])
        if m is None:
            raise BenchOutputError(
                f"summary 'total time' is not seconds: {self._summary['total time']!r}"
            )
        total_seconds = float(m["s"])
        completed = self._summary_int("completed")
        failed = self._summary_int("failed")
        warnings: list[str] = []
        if (completed, failed) != (done, failed_lines):
            warnings.append(
                f"summary says {completed} completed and {failed} failed, proof lines say "
                f"{done} and {failed_lines}"
            )
        throughput = self._summary.get("throughput")
        tm = _THROUGHPUT_RE.match(throughput) if throughput else None
        if tm is not None:
            proofs_per_min = float(tm["ppm"])
        elif throughput is not None:
            raise BenchOutputError(f"summary 'throughput' not understood: {throughput!r}")
        elif completed == 0:
            # Nothing completed: the wall/prove lines are missing by design.
            proofs_per_min = 0.0
        else:
            # With proofs completed the throughput line closes the summary:
            # without it the output was cut short.
            raise TruncatedBenchOutput("cuzk-bench summary ends before its throughput line")
        count = self._header.get("count")
        concurrency = self._header.get("concurrency")
        return BenchRun(
            proof_type=self._header.get("proof type"),
            count=int(count) if count and count.isdigit() else None,
            concurrency=int(concurrency) if concurrency and concurrency.isdigit() else None,
            proofs=list(self.proofs),
            completed=completed,
            failed=failed,
            total_seconds=total_seconds,
            proofs_per_min=proofs_per_min,
            warnings=warnings,
        )


def parse_bench_output(text: str | Iterable[str]) -> BenchRun:
    """Parse a whole ``cuzk-bench batch`` output."""
    parser = BenchLineParser()
    lines = text.splitlines() if isinstance(text, str) else text
    for line in lines:
        parser.feed(line)
    return parser.finish()
