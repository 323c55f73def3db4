"""The daemon-crash rule on its own clock: what counts, what is forgotten, what a restart
that fails adds (docs/reliability.md, "When the cuzk daemon dies"). The lifecycle tests
kill the fake daemon in each phase (tests/agent/test_agent_lifecycle.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vast_manager.agent.cuzk import BenchFailed, DaemonExited
from vast_manager.agent.phases import crashes
from vast_manager.agent.phases.crashes import DaemonCrashes
from vast_manager.agent.phases.shared import AgentFailure


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Daemon:
    """What the rule asks of the daemon: its exit status, once it has exited."""

    def __init__(self) -> None:
        self.status: int | None = -9

    async def exit_status(self, within_s: float) -> int | None:
        assert within_s == crashes.EXIT_SEEN_WITHIN_S
        return self.status


def rule(clock: Clock, daemon: Daemon | None = None) -> DaemonCrashes:
    stub: Any = daemon or Daemon()
    return DaemonCrashes(stub, clock)


def test_the_rule_is_three_failures_in_thirty_minutes() -> None:
    assert (crashes.LIMIT, crashes.WINDOW_S) == (3, 1800.0)


async def test_the_third_failure_in_the_window_fails_the_agent_naming_the_last() -> None:
    clock = Clock()
    crashes_ = rule(clock)
    await crashes_.failed("warming up", DaemonExited("gone"))
    clock.t += 600
    await crashes_.failed("benchmarking", BenchFailed("cuzk-bench batch exited with status 1"))
    clock.t += 600
    with pytest.raises(AgentFailure) as info:
        await crashes_.failed("proving", DaemonExited("the cuzk daemon exited while proving"))
    assert str(info.value) == (
        "the cuzk daemon failed 3 times in 30 minutes, the last while proving: the cuzk "
        "daemon exited while proving (the daemon exited with status -9)")


async def test_failures_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    crashes_ = rule(clock)
    for _ in range(10):  # one failure every 20 minutes, for ever: never two in the window
        await crashes_.failed("proving", DaemonExited("gone"))
        clock.t += 1200
    assert len(crashes_.times) == 2
    clock.t += 1800  # both now older than the window
    await crashes_.failed("proving", DaemonExited("gone"))
    assert len(crashes_.times) == 1


async def test_a_failed_run_beside_a_live_daemon_counts_and_says_no_exit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    daemon = Daemon()
    daemon.status = None  # still running: cuzk-bench failed against it
    crashes_ = rule(Clock(), daemon)
    await crashes_.failed("benchmarking", BenchFailed("cuzk-bench batch exited with status 1"))
    assert caplog.messages == [
        "the cuzk daemon failed while benchmarking (failure 1 of the 2 allowed in 30 "
        "minutes): cuzk-bench batch exited with status 1; restarting it"]


async def test_run_restarts_and_repeats_the_step_and_a_failed_restart_counts() -> None:
    crashes_ = rule(Clock())
    calls: list[str] = []
    restarts = iter([DaemonExited("exited during start-up"), None])

    async def step() -> str:
        calls.append("step")
        if len(calls) == 1:
            raise DaemonExited("killed")
        return "measured"

    async def restart() -> None:
        calls.append("restart")
        failure = next(restarts)
        if failure is not None:
            raise failure

    assert await crashes_.run("benchmarking", step, restart) == "measured"
    assert calls == ["step", "restart", "restart", "step"]
    assert len(crashes_.times) == 2  # the step's failure and the restart's


async def test_what_is_not_cuzks_failure_passes_through_uncounted() -> None:
    crashes_ = rule(Clock())

    async def step() -> None:
        raise AgentFailure("the warm-up proof failed: cuzk cannot prove C1 file ...")

    async def restart() -> None:
        raise AssertionError("no restart for an agent failure")

    with pytest.raises(AgentFailure, match="cannot prove C1"):
        await crashes_.run("warming up", step, restart)
    assert len(crashes_.times) == 0
