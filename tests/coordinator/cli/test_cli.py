"""The operator CLI against a real coordinator on loopback, and its generated docs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from vast_manager.coordinator.cli import clidoc
from vast_manager.coordinator.cli.commands import cli

from support.canned_http import canned as _canned
from support.coord_support import ADMIN_TOKEN, ServerThread
from support.fakes_provider import FakeProvider, offer
from support.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    offers = [offer(9001, 41001), offer(9002, 41002, dph_total=0.9)]
    with ServerThread(tmp_path, FakeProvider(offers)) as s:
        yield s


def run(server: ServerThread, *args: str, token: str | None = ADMIN_TOKEN) -> Any:
    env = {"VM_URL": server.server.url}
    if token is not None:
        env["VM_ADMIN_TOKEN"] = token
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_agents_issue_prints_env_lines(server: ServerThread) -> None:
    result = run(server, "agents", "issue", "--label", "rig-01", "--min-rate", "40")
    assert result.exit_code == 0, result.output
    lines = dict(line.split("=", 1) for line in result.output.strip().splitlines())
    assert set(lines) == {"VM_COORDINATOR_URL", "VM_AGENT_ID", "VM_AGENT_KEY"}
    assert lines["VM_AGENT_ID"].startswith("ag_") and len(lines["VM_AGENT_ID"]) == 23
    assert len(bytes.fromhex(lines["VM_AGENT_KEY"])) == 32
    assert lines["VM_COORDINATOR_URL"].startswith("http://")


def test_agents_issue_json_and_revoke(server: ServerThread) -> None:
    result = run(server, "agents", "issue", "--json")
    assert result.exit_code == 0, result.output
    env = orjson.loads(result.output)
    assert set(env) == {"VM_COORDINATOR_URL", "VM_AGENT_ID", "VM_AGENT_KEY"}
    revoked = run(server, "agents", "revoke", env["VM_AGENT_ID"])
    assert revoked.exit_code == 0, revoked.output
    assert "revoked" in revoked.output


def test_deploy_status_destroy(server: ServerThread) -> None:
    deployed = run(server, "deploy", "9001")
    assert deployed.exit_code == 0, deployed.output
    assert "Instance" in deployed.output
    status = run(server, "status", "--json")
    rows = orjson.loads(status.output)
    assert len(rows) == 1 and rows[0]["state"] == "deploying"
    # Piped (not a terminal): the API's own JSON, passed on unparsed, so compact.
    assert status.output.count("\n") == 1 and status.output.startswith("[{")
    table = run(server, "status")
    assert "RTX 4090" in table.output and "STATE" in table.output
    again = run(server, "deploy", "9001")  # the same machine is now busy with ours
    assert again.exit_code == 1
    assert "machine" in again.output.lower()
    gone = run(server, "destroy", str(rows[0]["id"]))
    assert gone.exit_code == 0, gone.output
    assert server.provider.destroyed


def test_bad_hosts_round_trip(server: ServerThread) -> None:
    assert run(server, "bad-hosts", "add", "41002", "--reason", "slow: 12/h").exit_code == 0
    listed = run(server, "bad-hosts", "list", "--json")
    assert [b["machine_id"] for b in orjson.loads(listed.output)] in (["41002"], [41002])
    refused = run(server, "deploy", "9002")
    assert refused.exit_code == 1 and "bad" in refused.output.lower()
    assert run(server, "bad-hosts", "remove", "41002").exit_code == 0
    assert "No bad hosts" in run(server, "bad-hosts", "list").output


def test_errors_are_one_line_with_exit_codes(server: ServerThread) -> None:
    missing = run(server, "destroy", "424242")
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: ") and missing.output.count("\n") == 1
    no_token = run(server, "status", token=None)
    assert no_token.exit_code == 3 and "VM_ADMIN_TOKEN" in no_token.output
    wrong = run(server, "status", token="x" * 32)
    assert wrong.exit_code == 1


def test_unreachable_coordinator_exit_3() -> None:
    result = CliRunner().invoke(
        cli, ["status", "--url", "http://127.0.0.1:9"], env={"VM_ADMIN_TOKEN": ADMIN_TOKEN}
    )
    assert result.exit_code == 3
    assert "Cannot reach the coordinator" in result.output


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:21", "http://127.0.0.1:port", "127.0.0.1"])
def test_a_url_that_is_not_http_is_named(url: str) -> None:
    result = CliRunner().invoke(
        cli, ["status", "--url", url], env={"VM_ADMIN_TOKEN": ADMIN_TOKEN}
    )
    assert result.exit_code == 3
    assert f"The coordinator URL '{url}' is not an http(s) URL." in result.output


def test_control_characters_refused_in_operator_input(server: ServerThread) -> None:
    refused = run(server, "bad-hosts", "add", "41001", "--reason", "evil \x1b[2J reason")
    assert refused.exit_code == 1 and "control or bidi characters" in refused.output
    assert "No bad hosts" in run(server, "bad-hosts", "list").output


    from vast_manager.coordinator import textsafe
    from vast_manager.coordinator.cli import render

    hostile = "rig\x1b[2J\x1b[H\x07-01\r\nfake line\x9b31m"
    cleaned = textsafe.clean(hostile)
    assert all(ord(c) >= 32 and not 0x7F <= ord(c) <= 0x9F for c in cleaned)
    assert cleaned == "rig\\u001b[2J\\u001b[H\\u0007-01  fake line\\u009b31m"
    table = render.table([[hostile, 1]], ["HOST", "N"])
    assert "\x1b" not in table and "\n" not in table.splitlines()[2]


def test_every_command_has_help_with_an_example() -> None:
    for path, command in clidoc.walk(cli, ["vast-manager"]):
        text = clidoc.help_text(command, path)
        assert command.help, f"{' '.join(path)} has no help"
        if not hasattr(command, "commands"):
            assert "Example" in text, f"{' '.join(path)} --help shows no example"


def test_a_non_json_answer_is_named() -> None:
    """Something between the CLI and the coordinator (a proxy's error page) answers 200."""
    with _canned(200, b"<html>bad gateway</html>") as url:
        for args in (["status", "--json"], ["status"]):
            result = CliRunner().invoke(cli, [*args, "--url", url],
                                        env={"VM_ADMIN_TOKEN": ADMIN_TOKEN})
            assert result.exit_code != 0
            assert "sent a non-JSON answer" in result.output, args


def test_a_redirect_is_named_not_followed() -> None:
    with _canned(301, b"", {"Location": "https://fleet.example/api/instances"}) as url:
        result = CliRunner().invoke(cli, ["status", "--url", url],
                                    env={"VM_ADMIN_TOKEN": ADMIN_TOKEN})
    assert result.exit_code != 0
    assert f"{url} redirects to https://fleet.example/api/instances" in result.output


def test_offers_and_plan_fit_a_100_column_terminal(server: ServerThread) -> None:
    env = {"VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "100"}
    for args in (["offers"], ["plan", "--trials", "3"]):
        result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert len(lines) >= 3 and max(map(len, lines)) <= 100, (args, result.output)
    narrow = CliRunner().invoke(cli, ["offers"], env=env, catch_exceptions=False).output
    assert "BASIS" not in narrow and "--wide" in narrow
    wide = CliRunner().invoke(cli, ["offers", "--wide"], env=env, catch_exceptions=False)
    assert "BASIS" in wide.output and max(map(len, wide.output.splitlines())) > 100


def test_hosts_shows_early_verdicts_flagged(server: ServerThread) -> None:
    """A benchmark an early verdict cut short is kept out of host_perf: `hosts` lists it
    apart, flagged, instead of leaving it unseen."""
    import asyncio

    reason = ("terminate: early verdict: no proof completed in 303 s with 2 running: the rate "
              "is at most 39.6/h with 95% confidence, below the minimum 86.2/h")

    def job(tx: Any) -> None:
        tx.audit.add(1_800_000_000.0, "verdict", reason, instance_id=7, machine_id="41006")
        tx.audit.add(1_800_000_001.0, "verdict", "keep: measured 70.0 proofs/h",
                     instance_id=8, machine_id="41004")

    asyncio.run_coroutine_threadsafe(server.server.store.write(job), server.loop).result(10)
    shown = run(server, "hosts").output
    assert "No host measured yet." in shown and "Cut short by an early verdict" in shown
    (line,) = [x for x in shown.splitlines() if x.startswith("41006 ")]
    assert "EARLY" in line and "at most 39.6/h" in line
    assert "41004" not in shown  # a full benchmark's verdict is not listed there


def test_at_80_columns_no_gpu_cell_is_cut(server: ServerThread) -> None:
    """Every table's columns give way by priority, the GPU column last: at 80 columns
    `offers`, `plan` and `status` fit and show each GPU cell whole."""
    import asyncio

    env = {"VM_URL": server.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "80"}
    offers = CliRunner().invoke(cli, ["offers", "--json"], env=env, catch_exceptions=False)
    gpus = {f"{o['num_gpus']}x {o['gpu_name']}" for o in orjson.loads(offers.output)}

    def job(tx: Any) -> None:
        for i, gpu in enumerate(sorted(gpus)):
            n, name = gpu.split("x ", 1)
            tx.instances.add({"label": f"a-long-label-for-rig-{i:02d}", "kind": "byo",
                             "state": "proving", "created_at": 1.0, "num_gpus": int(n),
                             "gpu_name": name, "dph_total": 0.4, "rate_per_hour": 61.5,
                             "machine_id": f"4100{i}", "last_seen": 1.0})

    asyncio.run_coroutine_threadsafe(server.server.store.write(job), server.loop).result(10)
    for args in (["offers"], ["plan", "--trials", "3"], ["status"]):
        result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert max(map(len, lines)) <= 80, (args, result.output)
        # A cut GPU cell ends in "~" before the next column (a price, "$...").
        assert not re.search(r"\dx [A-Za-z0-9 ]*~", result.output), (args, result.output)
        shown = [g for g in gpus if g in result.output]
        assert shown, (args, result.output)
        if args[0] != "plan":  # the plan proposes some of them, each shown whole
            assert sorted(shown) == sorted(gpus), (args, result.output)
