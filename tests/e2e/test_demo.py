"""`vast-manager demo` as a user runs it: a real process, interrupted, leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


def _demo_processes(workdir: Path) -> list[psutil.Process]:
    """Every process whose command line mentions the demo's folder (agents, simulators)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(workdir) in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _wait_for(cond, what: str, timeout_s: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_demo_leaves_no_process(tmp_path: Path, signum: int) -> None:
    workdir = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vast_manager.coordinator.cli", "demo", "--keep", str(workdir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        # A shell's background job ignores SIGINT; restore the default, as a terminal has it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,
    )
    try:
        # Interrupt mid-flight: once agents and their simulated cuzk daemons run.
        _wait_for(
            lambda: any("vm-sim-cuzk" in " ".join(p.cmdline()) for p in _demo_processes(workdir)),
            "a simulated cuzk daemon",
            120,
        )
        os.kill(proc.pid, signum)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    output = (tmp_path / "demo.log").read_text()
    assert code == 130, output[-2000:]
    assert "Interrupted" in output
    # Children may take a moment to be reaped; any still there after 10 s are leftovers.
    deadline = time.monotonic() + 10
    leftovers = _demo_processes(workdir)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = _demo_processes(workdir)
    assert not leftovers, [" ".join(p.info["cmdline"] or []) for p in leftovers]
