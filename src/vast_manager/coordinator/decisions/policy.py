"""Lifecycle policy (docs/policy.md) and result plausibility (docs/reliability.md) as pure
functions.

Nothing here does I/O or reads a clock: callers pass ``now`` (from the
injected clock) and the rows they read, so every decision is reproducible in
a test and its reason quotes the numbers it was made on.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vast_manager.coordinator.decisions import belief, states
from vast_manager.coordinator.decisions.pace import silence_ttl_s as silence_ttl_s
from vast_manager.coordinator.decisions.states import State
from vast_manager.coordinator.rows import InstanceRow
from vast_manager.coordinator.settings import DEFAULTS, Settings
from vast_manager.protocol.messages import Directive, Result

Clock = Callable[[], float]
"""Unix seconds, as ``time.time``; injected everywhere so tests never sleep."""

# Flags a stored result can carry. A finished benchmark with a failed proof is
# "partial" and still feeds host_perf; an early verdict's measurement (the proofs
# seen before the coordinator stopped the benchmark) is "partial" and
# "early_verdict", and is kept out of it like implausible and contended ones.
IMPLAUSIBLE = "implausible"
CONTENDED = "contended"
PARTIAL = "partial"
EARLY_VERDICT = "early_verdict"
# A result that arrives after the instance was told to terminate (its host may be honest:
# the benchmark finished before it heard) changes nothing: no host_perf, no ranking.
AFTER_TERMINATE = "after_terminate"
# A benchmark no directive asked for (docs/reliability.md, "No rate on a host's word alone"):
# stored as evidence, not counted, no verdict.
UNDIRECTED = "undirected"
# A rate beyond belief for its hardware (docs/reliability.md, "No rate on a host's word
# alone"): held, not counted and no verdict, until a directed re-benchmark agrees.
UNCONFIRMED = "unconfirmed"
# A counted benchmark whose instance then delivered far below it (docs/reliability.md,
# "Judged by what it delivers"): taken back out of host_perf and the model.
DEMOTED = "demoted"
HOST_PERF_EXCLUDING_FLAGS = frozenset({IMPLAUSIBLE, CONTENDED, EARLY_VERDICT, AFTER_TERMINATE,
                                       UNDIRECTED, UNCONFIRMED, DEMOTED})
#: Results nobody asked for: kept as a small summary (docs/reliability.md, "Bounds"),
#: counted against their agent's flood allowance.
UNREQUESTED_FLAGS = frozenset({UNDIRECTED, AFTER_TERMINATE})
#: The flood allowance: results nobody asked for within ``FLOOD_WINDOW_S`` from one agent.
#: An honest agent sends one result per directed benchmark (and its scaling run); from
#: the ``FLOOD_THROTTLE_AT``-th the answer is ``429`` (the summary is stored; a retry of
#: the same result is a duplicate), at the ``FLOOD_REVOKE_AT``-th its key is revoked and
#: its instance ended, with one event each. Stored at most: 50 summaries of ~1 KB.
FLOOD_WINDOW_S = 3600.0
FLOOD_THROTTLE_AT = 10
FLOOD_REVOKE_AT = 50
THROTTLED, REVOKED = "throttled", "revoked"


def flood_action(unrequested_in_window: int) -> str | None:
    """What the ``n``-th result nobody asked for within the window brings its agent:
    ``REVOKED``, ``THROTTLED`` or None."""
    if unrequested_in_window >= FLOOD_REVOKE_AT:
        return REVOKED
    if unrequested_in_window >= FLOOD_THROTTLE_AT:
        return THROTTLED
    return None


#: Every flag a stored result can carry (docs/openapi.yaml's StoredResult lists them).
RESULT_FLAGS = (IMPLAUSIBLE, CONTENDED, PARTIAL, EARLY_VERDICT, AFTER_TERMINATE, UNDIRECTED,
                UNCONFIRMED, DEMOTED)


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """The settings the pure functions need (a subset of ``Settings``, defaults from its
    one declaration)."""

    max_usd_per_proof: float = DEFAULTS.max_usd_per_proof
    next_heartbeat_s: int = DEFAULTS.next_heartbeat_s
    no_hello_timeout_s: float = DEFAULTS.no_hello_timeout_s
    params_timeout_s: float = DEFAULTS.params_timeout_s
    warmup_timeout_s: float = DEFAULTS.warmup_timeout_s
    benchmark_timeout_s: float = DEFAULTS.benchmark_timeout_s
    silence_grace_s: float = DEFAULTS.silence_grace_s
    lost_timeout_s: float = DEFAULTS.lost_timeout_s
    max_concurrency_per_gpu: int = DEFAULTS.max_concurrency_per_gpu
    rate_tolerance: float = DEFAULTS.rate_tolerance
    max_rate_per_gpu_per_hour: float | None = DEFAULTS.max_rate_per_gpu_per_hour

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyLimits:
        return cls(**{f: getattr(settings, f) for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True)
class StrikeRule:
    """Failed trials that block a machine: ``limit`` within ``window_s`` block it for
    ``block_s`` (docs/policy.md, "Strikes")."""

    limit: int = DEFAULTS.strike_limit
    window_s: float = DEFAULTS.strike_window_s
    block_s: float = DEFAULTS.strike_block_s

    @classmethod
    def from_settings(cls, settings: Settings) -> StrikeRule:
        return cls(settings.strike_limit, settings.strike_window_s, settings.strike_block_s)


# --- rates -------------------------------------------------------------------


def min_rate_per_hour(
    dph_total: float | None, max_usd_per_proof: float, explicit: float | None = None
) -> float | None:
    """The minimum proofs/hour for a price: explicit if given, else dph_total / max $/proof."""
    if explicit is not None:
        return float(explicit)
    if dph_total is None or dph_total <= 0 or max_usd_per_proof <= 0:
        return None
    return dph_total / max_usd_per_proof


def recomputed_rate_per_hour(proofs_completed: int, wall_seconds: float) -> float | None:
    """Proofs per hour from the counts, never trusting the host's own division."""
    if wall_seconds <= 0:
        return None
    return proofs_completed * 3600.0 / wall_seconds


def usd_per_proof(dph_total: float | None, rate_per_hour: float | None) -> float | None:
    if dph_total is None or not rate_per_hour:
        return None
    return dph_total / rate_per_hour


# The silence TTL lives with the heartbeat tracker that times it (``decisions.pace``).


# --- plausibility ------------------------------------------------------------

#: Seconds a host's timestamps may sit beside the coordinator's clock: the agent corrects
#: its clock from ``X-VM-Server-Time`` (whole seconds) whenever it is a second off.
CLOCK_SKEW_S = 5.0
#: Seconds a non-benchmark heartbeat can arrive after the benchmark began, beyond the
#: heartbeat interval it is retried for (its phase was read when it was built).
PHASE_ENTRY_SLACK_S = 15.0
#: ``wall_seconds`` against ``finished_at - started_at``: cuzk-bench starts its batch
#: clock after it has loaded the C1 output and connected to the daemon.
STARTUP_SLACK_S = 30.0


@dataclass(frozen=True, slots=True)
class Watch:
    """What the coordinator itself knows of the run a result claims, in its own clock.

    The host's numbers are judged against these, never against one another alone.
    """

    now: float
    window_start: float | None
    """Start of the stretch of benchmarking this result may claim: the later of the last
    time the instance was seen in another phase (or said hello) and the arrival of its
    previous result, which used up what came before. None: never seen at all."""
    window_after_result: bool
    """The stretch starts at a previous result's arrival (exact), not at a phase change
    (as late as one retried heartbeat)."""
    benchmarking_seen: bool
    """A benchmarking heartbeat arrived since the instance was last seen in another phase."""
    reported_gpus: frozenset[int] | None
    """The GPU indexes the host's hello reported (None: no hello)."""
    max_gpus: int | None = None
    """The GPUs the provider rents with this instance (a deployed one's offer), if known."""
    time_scale: float = 1.0
    """Simulated seconds per real second of this instance (1 for real machines)."""
    terminated: str | None = None
    """The terminate verdict the instance already has, if any."""
    pace_s: float | None = None
    """The heartbeat pace the instance's agent was last given (None: the base pace)."""
    receipted: bool = False
    """The result carries this fleet's receipt: a coordinator judged it whole and
    acknowledged it, and is replaying it after a restore lost it (docs/protocol.md,
    "Replay"); the stretch that coordinator saw is not this one's to judge again."""
    watching_since: float | None = None
    """When this coordinator process started watching: a window that began before it
    could not have been watched whole, so no benchmarking heartbeat is required then
    (an agent keeps benchmarking while the coordinator restarts; the window still
    bounds what it may claim)."""
    measured_rates: Mapping[int, float] = field(default_factory=dict)
    """GPU count -> the recomputed rate of the instance's latest counted benchmark on that
    many GPUs: what a scaling result's runs must agree with."""
    gpu_name: str | None = None
    """The instance's GPU model: its ceiling and its proof-time floor (``belief``)."""
    gpu_mem_bw_gbps: float | None = None
    """The offer's ``gpu_mem_bw`` (vast.ai's per-host figure): the ceiling and floor of a
    GPU model the spec table lacks (``belief.bandwidth``)."""


@dataclass(slots=True)
class Plausibility:
    """Flags and one reason per flag (quoting numbers) for a result."""

    recomputed_rate_per_hour: float | None
    flags: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    gpus: int = 1
    """The GPUs the result can have used: distinct, reported by the host, rented."""

    def flag(self, name: str, reason: str) -> None:
        if name not in self.flags:
            self.flags.append(name)
        self.reasons.append(f"{name}: {reason}")

    @property
    def implausible(self) -> bool:
        return IMPLAUSIBLE in self.flags

    @property
    def counts_for_host_perf(self) -> bool:
        return not (set(self.flags) & HOST_PERF_EXCLUDING_FLAGS)


def _gpus_list(gpus: list[int]) -> str:
    return "[" + ", ".join(str(g) for g in gpus[:8]) + (", ..." if len(gpus) > 8 else "") + "]"


def check_gpus(gpus_used: list[int], watch: Watch | None, out: Plausibility,
               what: str = "gpus_used") -> int:
    """Flag GPUs that are repeated, never reported or beyond what is rented; return how
    many GPUs the run can really have used (at least 1), the base of every ceiling."""
    distinct = set(gpus_used)
    if len(distinct) != len(gpus_used):
        out.flag(IMPLAUSIBLE, f"{what} {_gpus_list(gpus_used)} names a GPU more than once")
    usable = distinct
    if watch is not None and watch.reported_gpus is not None:
        unknown = sorted(distinct - watch.reported_gpus)
        if unknown:
            out.flag(IMPLAUSIBLE, f"{what} names GPU(s) {_gpus_list(unknown)} the host never "
                     f"reported (its hello listed {_gpus_list(sorted(watch.reported_gpus))})")
        usable = distinct & watch.reported_gpus
    count = max(1, len(usable))
    if watch is not None and watch.max_gpus:
        count = min(count, watch.max_gpus)
    return count


def ceiling_per_gpu(watch: Watch | None, limits: PolicyLimits) -> float:
    """The rate ceiling of one GPU of the watched instance's model (``belief``)."""
    if watch is None:
        return belief.ceiling_per_gpu(None, limits.max_rate_per_gpu_per_hour)
    return belief.ceiling_per_gpu(watch.gpu_name, limits.max_rate_per_gpu_per_hour,
                                  watch.gpu_mem_bw_gbps)


def _check_arithmetic(result: Result, rate: float, gpus: int, limits: PolicyLimits,
                      out: Plausibility, watch: Watch | None = None) -> None:
    """The host's numbers against one another and against what its GPUs can do."""
    tol = limits.rate_tolerance
    wall = result.wall_seconds
    n = result.proofs_completed
    reported = result.rate_per_hour
    if abs(reported - rate) > max(tol * rate, 0.1):
        out.flag(
            IMPLAUSIBLE,
            f"reported rate {reported:.2f}/h does not match {n} proofs in {wall:.1f} s "
            f"({rate:.2f}/h)",
        )
    per_gpu = ceiling_per_gpu(watch, limits)
    ceiling = gpus * per_gpu
    if rate > ceiling * (1 + tol):
        model = f" of {watch.gpu_name}" if watch is not None and watch.gpu_name else ""
        out.flag(
            IMPLAUSIBLE,
            f"{rate:.1f} proofs/h on {gpus} GPU(s) is beyond the ceiling of {ceiling:.0f}/h "
            f"({per_gpu:.0f}/h a GPU{model})",
        )
    proof_seconds = result.proof_seconds
    floor = (belief.min_proof_seconds(watch.gpu_name, watch.gpu_mem_bw_gbps)
             if watch is not None else belief.min_proof_seconds(None))
    # proof_seconds count in the run's own (a simulation's simulated) seconds, as wall_seconds.
    if proof_seconds and min(proof_seconds) < floor:
        out.flag(
            IMPLAUSIBLE,
            f"a proof took {min(proof_seconds):.2f} s, below the {floor:.1f} s a proof needs "
            "on this GPU at the least",
        )
    if len(proof_seconds) != n:
        out.flag(
            IMPLAUSIBLE, f"proof_seconds lists {len(proof_seconds)} durations for {n} proofs"
        )
    concurrency = gpus * limits.max_concurrency_per_gpu
    if proof_seconds:
        longest = max(proof_seconds)
        if longest > wall * (1 + tol) + 1.0:
            out.flag(
                IMPLAUSIBLE,
                f"a proof took {longest:.1f} s, longer than the whole run ({wall:.1f} s)",
            )
        total = sum(proof_seconds)
        if total > wall * concurrency * (1 + tol) + 1.0:
            out.flag(
                IMPLAUSIBLE,
                f"proof seconds sum to {total:.1f} s, more than {wall:.1f} s x "
                f"{concurrency} concurrent proofs",
            )
        median = statistics.median(proof_seconds)
        if n * median > wall * concurrency * (1 + tol) + median:
            out.flag(
                IMPLAUSIBLE,
                f"{n} proofs of median {median:.1f} s need at least "
                f"{n * median / concurrency:.1f} s at {concurrency} in flight, "
                f"but wall_seconds is {wall:.1f}",
            )


def _check_timestamps(result: Result, watch: Watch, limits: PolicyLimits,
                      out: Plausibility) -> None:
    """started_at, finished_at and wall_seconds against one another and the window."""
    tol = limits.rate_tolerance
    wall = result.wall_seconds
    span = result.finished_at - result.started_at
    if not span > 0:
        out.flag(IMPLAUSIBLE, f"finished_at {result.finished_at:.0f} is not after started_at "
                 f"{result.started_at:.0f}")
        return
    # The agent stamps both ends with its (corrected) real clock; a simulated run counts
    # its wall_seconds in simulated seconds.
    span_s = span * watch.time_scale
    if abs(wall - span_s) > tol * max(wall, span_s) + STARTUP_SLACK_S * watch.time_scale:
        out.flag(IMPLAUSIBLE, f"wall_seconds {wall:.1f} does not match finished_at - "
                 f"started_at ({span_s:.1f} s)")
    if result.finished_at > watch.now + CLOCK_SKEW_S:
        out.flag(IMPLAUSIBLE, f"finished_at is {result.finished_at - watch.now:.0f} s in the "
                 "future of the coordinator's clock")
    if watch.window_start is not None and not watch.receipted:
        slack = _window_slack_s(watch, limits)
        if result.started_at < watch.window_start - slack:
            out.flag(IMPLAUSIBLE, f"started_at is {watch.window_start - result.started_at:.0f} "
                     "s before the benchmarking the coordinator saw began")


def _window_slack_s(watch: Watch, limits: PolicyLimits) -> float:
    """Real seconds the true start of a run may precede ``watch.window_start``."""
    if watch.window_after_result:
        return CLOCK_SKEW_S
    return max(limits.next_heartbeat_s, watch.pace_s or 0.0) + PHASE_ENTRY_SLACK_S


def _check_window(result: Result, watch: Watch, gpus: int, limits: PolicyLimits,
                  out: Plausibility) -> None:
    """The run against the stretch of benchmarking the coordinator saw (docs/reliability.md)."""
    if watch.receipted:
        return
    if watch.window_start is None:
        out.flag(IMPLAUSIBLE, "the coordinator never saw this instance before the result")
        return
    blind = watch.watching_since is not None and watch.window_start < watch.watching_since
    if not watch.benchmarking_seen and not blind:
        out.flag(IMPLAUSIBLE, "the coordinator never saw this instance benchmarking before "
                 "the result arrived")
        return
    tol = limits.rate_tolerance
    wall = result.wall_seconds
    n = result.proofs_completed
    scale = watch.time_scale
    observed = max(0.0, watch.now - watch.window_start) * scale
    slack = _window_slack_s(watch, limits) * scale
    since = "its previous result" if watch.window_after_result else "it began benchmarking"
    if wall > observed * (1 + tol) + slack:
        out.flag(
            IMPLAUSIBLE,
            f"claims {wall:.1f} s of benchmarking; the coordinator saw at most "
            f"{observed:.1f} s since {since}",
        )
    if result.proof_seconds and n > 0:
        fastest_possible = min(result.proof_seconds)
        if fastest_possible > 0:
            most = (observed + slack) * gpus * limits.max_concurrency_per_gpu / fastest_possible
            if n > most * (1 + tol) + 1:
                out.flag(
                    IMPLAUSIBLE,
                    f"{n} proofs of at least {fastest_possible:.1f} s each cannot fit in "
                    f"the {observed:.1f} s the coordinator saw since {since}",
                )


def _check_runs(result: Result, rate: float | None, watch: Watch | None,
                limits: PolicyLimits, out: Plausibility) -> None:
    """A scaling result's runs: their GPUs, and their rates against what the coordinator
    measured (the run on this result's own GPUs is this result; the others, the
    benchmark results before it)."""
    tol = limits.rate_tolerance
    own = set(result.gpus_used)
    for run in result.runs or []:
        gpus = check_gpus(list(run.gpus_used), watch, out, what="a scaling run's gpus_used")
        ceiling = gpus * ceiling_per_gpu(watch, limits)
        if run.rate_per_hour > ceiling * (1 + tol):
            out.flag(IMPLAUSIBLE, f"a scaling run claims {run.rate_per_hour:.1f} proofs/h on "
                     f"{gpus} GPU(s), beyond the ceiling of {ceiling:.0f}/h")
        measured = rate if set(run.gpus_used) == own else (
            watch.measured_rates.get(gpus) if watch is not None else None)
        if measured is not None and abs(run.rate_per_hour - measured) > max(tol * measured, 0.1):
            out.flag(IMPLAUSIBLE, f"a scaling run on {gpus} GPU(s) claims "
                     f"{run.rate_per_hour:.2f} proofs/h; the coordinator measured "
                     f"{measured:.2f}/h")


def check_result(
    result: Result,
    *,
    watch: Watch | None,
    limits: PolicyLimits,
    contended_with: list[int] | None = None,
) -> Plausibility:
    """The plausibility checks on one result (docs/reliability.md, Untrusted hosts).

    ``watch`` is what the coordinator saw of the instance (None: judge the host's
    numbers against one another only). ``contended_with`` lists our other instances
    active on the same machine meanwhile. The GPU count behind every ceiling is the
    GPUs named in ``gpus_used`` that the host reported, never the list's length.
    """
    wall = result.wall_seconds
    n = result.proofs_completed
    rate = recomputed_rate_per_hour(n, wall)
    out = Plausibility(rate)
    if watch is not None and watch.terminated is not None:
        out.flag(AFTER_TERMINATE, f"arrived after the terminate verdict ({watch.terminated})")
    out.gpus = check_gpus(list(result.gpus_used), watch, out)
    _check_runs(result, rate, watch, limits, out)
    if rate is None:
        if n > 0:
            out.flag(IMPLAUSIBLE, f"{n} proofs completed in wall_seconds {wall:g}")
        else:
            out.flag(IMPLAUSIBLE, "wall_seconds is 0")
        return out
    _check_arithmetic(result, rate, out.gpus, limits, out, watch)
    if watch is not None:
        _check_timestamps(result, watch, limits, out)
        _check_window(result, watch, out.gpus, limits, out)
    if result.proofs_failed > 0:
        out.flag(PARTIAL, f"{result.proofs_failed} of {n + result.proofs_failed} proofs failed")
    if contended_with:
        ids = ", ".join(f"#{i}" for i in contended_with)
        out.flag(CONTENDED, f"measured while instance(s) {ids} of ours shared the machine")
    return out


# --- verdicts ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str  # "keep" or "terminate"
    reason: str
    bad_host: bool  # whether the machine goes on bad_hosts


def benchmark_verdict(
    check: Plausibility,
    min_rate: float | None,
    *,
    steady_rate: float | None = None,
    concurrency: int | None = None,
    own_min_rate: float | None = None,
) -> Verdict:
    """Keep or terminate after a benchmark result, on its recomputed rate.

    ``steady_rate`` (with early verdicts on: ``verdict.steady_state_rate_per_hour``
    of the result's proof times at the ``concurrency`` the heartbeats announced)
    replaces the batch rate, which under-reads because the batch's last proofs
    run with a slot idle; the reason quotes both. ``own_min_rate``: the minimum the
    machine's own price sets, when an operator-given ``min_rate`` judges this deploy
    (only a rate below it blocks the machine).
    """
    rate = check.recomputed_rate_per_hour
    if steady_rate is not None and rate is not None and not check.implausible:
        batch = rate
        rate = steady_rate
        basis = f" in steady state ({concurrency} in flight; batch rate {batch:.2f})"
    else:
        basis = ""
    if check.implausible:
        detail = "; ".join(r for r in check.reasons if r.startswith(IMPLAUSIBLE))
        return Verdict("terminate", f"implausible benchmark result ({detail})", True)
    if CONTENDED in check.flags:
        return Verdict(
            "keep", "measured while another instance of ours shared the machine: not judged",
            False,
        )
    if min_rate is None:
        text = "?" if rate is None else f"{rate:.2f}"
        return Verdict("keep", f"measured {text} proofs/h; no minimum rate set", False)
    if rate is None or rate < min_rate:
        measured = 0.0 if rate is None else rate
        blocks = blocks_machine(rate, own_min_rate)
        return Verdict(
            "terminate",
            f"measured {measured:.2f} proofs/h{basis}, below the minimum {min_rate:.2f} "
            "proofs/h" + ("" if blocks else
                          f" given at deploy; at or above {own_min_rate:.2f} proofs/h, the "
                          "minimum its own price sets, so the machine is not blocked"),
            blocks,
        )
    return Verdict(
        "keep", f"measured {rate:.2f} proofs/h{basis}, at or above the minimum {min_rate:.2f}",
        False,
    )


def blocks_machine(rate_bound: float | None, own_min_rate: float | None) -> bool:
    """Whether a below-minimum verdict is evidence against the machine itself: a rate (or
    its upper bound) below the minimum its own price sets (docs/policy.md, "Blame"). A
    stricter minimum the operator gave (``--min-rate``) judges that deploy only.
    ``own_min_rate`` None: the instance was judged on its price's minimum already."""
    if own_min_rate is None:
        return True
    return rate_bound is None or rate_bound < own_min_rate


def directive_for(
    instance: InstanceRow | None,
    *,
    next_heartbeat_s: int,
    min_rate: float | None,
) -> Directive:
    """The standing directive for an instance row (no one-shot benchmark here)."""
    if instance is None:
        return Directive("continue", "no instance yet", next_heartbeat_s, min_rate)
    state = instance.get("state")
    if state in states.ENDING or instance.get("terminate_reason"):
        reason = instance.get("terminate_reason") or f"instance is {state}"
        return Directive("terminate", reason, next_heartbeat_s, min_rate)
    benchmark_id = instance.get("directed_benchmark_id")
    if instance.get("rebenchmark_pending"):
        return Directive("benchmark", "the coordinator asked for a new benchmark",
                         next_heartbeat_s, min_rate, benchmark_id)
    return Directive("continue", "", next_heartbeat_s, min_rate, benchmark_id)


# --- timeouts ------------------------------------------------------------------


#: The states with a time limit: the ``PolicyLimits`` field that holds it, and what the
#: timeout is called in its reason.
_TIMEOUTS: dict[str, tuple[str, str]] = {
    State.DEPLOYING: ("no_hello_timeout_s", "no hello"),
    # Booting only lasts until the agent starts its fetch; a host that keeps
    # heartbeating "booting" must not bill forever.
    State.BOOTING: ("no_hello_timeout_s", "boot"),
    State.FETCHING_PARAMS: ("params_timeout_s", "parameter fetch"),
    State.WARMING: ("warmup_timeout_s", "warm-up"),
    State.BENCHMARKING: ("benchmark_timeout_s", "benchmark"),
    State.LOST: ("lost_timeout_s", "silence"),
}


#: The states ``timed_out`` can find overstayed: those with a limit of their own, and those
#: on the way to the first benchmark. The monitor reads only these: a proving fleet, however
#: large, has nothing to read.
TIMED_STATES: frozenset[State] = frozenset(map(State, _TIMEOUTS)) | states.FIRST_BENCHMARK


def phase_timeout_s(state: str | None, limits: PolicyLimits) -> float | None:
    """How long an instance may stay in a state before it is terminated (None: no limit)."""
    timeout = _TIMEOUTS.get(state or "")
    return None if timeout is None else float(getattr(limits, timeout[0]))


def first_benchmark_budget_s(limits: PolicyLimits) -> float:
    """Deploy to first benchmark result: every phase's limit, two benchmark runs."""
    return (
        limits.no_hello_timeout_s
        + limits.params_timeout_s
        + limits.warmup_timeout_s
        + 2 * limits.benchmark_timeout_s
    )


def timed_out(instance: InstanceRow, now: float, limits: PolicyLimits) -> str | None:
    """The reason an instance overstayed its state, or None.

    Time in a state is measured by the coordinator's clock from when it saw the
    state begin (``state_since``), never from the host's ``phase_started_at``.
    """
    state = instance.get("state")
    created = instance.get("created_at")
    if (
        state in states.FIRST_BENCHMARK
        and instance.get("rate_per_hour") is None
        and created is not None
    ):
        # Each phase limit restarts when the phase changes; a host that flaps
        # between phases must still produce its first benchmark within the sum.
        budget = first_benchmark_budget_s(limits)
        total = now - float(created)
        if total > budget:
            return (
                f"timeout: no benchmark result {total:.0f} s after deploy, "
                f"limit {budget:.0f} s for all phases together"
            )
    limit = phase_timeout_s(state, limits)
    since = instance.get("state_since")
    if limit is None or since is None:
        return None
    spent = now - float(since)
    if spent <= limit:
        return None
    what = _TIMEOUTS[str(state)][1]
    return f"timeout: {what} took {spent:.0f} s, limit {limit:.0f} s"
