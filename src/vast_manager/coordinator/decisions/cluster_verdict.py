"""A kept instance judged on what the cluster recorded it delivered.

Pure. ``Delivered`` is one instance's observation: proofs completed and failed over a
window, where the count came from (``cluster``: Curio's HarmonyDB or a cluster's
``POST /api/production``; ``cuzk``: the agent's own counter), and the last error. ``judge``
reads only a cluster's observation (the agent's counter is the host's claim, judged by the
idle rule of ``operations.production``), once the instance has proved for half the window:

- ``below_claimed``: delivered below the benchmark's rate by more than the plausibility
  slack (``VM_RATE_TOLERANCE``): flagged, with both rates;
- ``task_failures``: at least ``VM_CURIO_FAILURES_FLAG`` failed proving tasks in the window:
  flagged, with the cluster's last error;
- delivered below the instance's minimum rate: terminated, the reason naming both.

docs/operations.md, "Production as the cluster records it", states the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLUSTER = "cluster"
CUZK = "cuzk"


@dataclass(frozen=True, slots=True)
class Delivered:
    """Proofs an instance delivered over ``window_s``, by ``source``."""

    completed: int
    failed: int
    window_s: float
    source: str
    last_error: str | None = None

    @property
    def rate_per_hour(self) -> float | None:
        return self.completed * 3600.0 / self.window_s if self.window_s > 0 else None

    def view(self) -> dict[str, Any]:
        rate = self.rate_per_hour
        return {"delivered_rate_per_hour": None if rate is None else round(rate, 3),
                "delivered_source": self.source, "delivered_window_s": round(self.window_s, 1),
                "tasks_completed": self.completed, "tasks_failed": self.failed,
                "last_task_error": self.last_error}


@dataclass(frozen=True, slots=True)
class Judgement:
    """Flags (name -> reason) and, when it falls below its minimum, why it ends."""

    flags: dict[str, str] = field(default_factory=dict)
    terminate: str | None = None


def judge(seen: Delivered | None, *, proving_s: float, window_s: float,
          min_rate: float | None, benchmark_rate: float | None, tolerance: float,
          failures_flag: int) -> Judgement:
    """The verdict on one proving instance's delivered proofs (the module's rules)."""
    if seen is None or seen.source != CLUSTER or proving_s < window_s / 2:
        return Judgement()
    rate = seen.rate_per_hour
    if rate is None:
        return Judgement()
    told = f"delivered {rate:.1f}/h ({seen.completed} proofs in {seen.window_s / 60:.0f} min)"
    flags: dict[str, str] = {}
    if benchmark_rate and rate < benchmark_rate * (1.0 - tolerance):
        flags["below_claimed"] = f"{told}, the benchmark claimed {benchmark_rate:.1f}/h"
    if seen.failed >= failures_flag:
        flags["task_failures"] = (f"{seen.failed} failed proving tasks in the cluster within "
                                  f"{seen.window_s / 60:.0f} min; last error: "
                                  f"{seen.last_error or 'none recorded'}")
    ending = None
    if min_rate is not None and rate < min_rate:
        ending = f"{told} as the cluster records it, below its minimum {min_rate:.1f}/h"
    return Judgement(flags, ending)
