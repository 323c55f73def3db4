"""Pure policy: minimum rates, plausibility, verdicts, timeouts; and the settings table."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from vast_manager.coordinator.decisions import policy
from vast_manager.coordinator.settings import SETTINGS, Settings, settings_markdown
from vast_manager.protocol.codec import from_obj
from vast_manager.protocol.messages import Result

from support.paths import REPO_ROOT

LIMITS = policy.PolicyLimits()


def result(**kw: Any) -> Result:
    base: dict[str, Any] = {
        "result_id": "r",
        "kind": "benchmark",
        "proof_type": "porep-c2-32g",
        "started_at": 0.0,
        "finished_at": 1200.0,
        "gpus_used": [0],
        "proofs_completed": 12,
        "proofs_failed": 0,
        "wall_seconds": 1200.0,
        "rate_per_hour": 36.0,
        "proof_seconds": [200.0] * 12,
        "telemetry": None,
    }
    base.update(kw)
    return from_obj(Result, base)


def test_min_rate_from_price_unless_explicit() -> None:
    assert policy.min_rate_per_hour(0.40, 0.008) == pytest.approx(50.0)
    assert policy.min_rate_per_hour(0.40, 0.008, explicit=12.0) == 12.0
    assert policy.min_rate_per_hour(None, 0.008) is None


def test_recomputed_rate_and_cost() -> None:
    assert policy.recomputed_rate_per_hour(12, 1200.0) == pytest.approx(36.0)
    assert policy.recomputed_rate_per_hour(3, 0.0) is None
    assert policy.usd_per_proof(0.36, 36.0) == pytest.approx(0.01)
    assert policy.silence_ttl_s(15, 30) == 75


def watch(seen_s: float | None = 1250.0, **kw: Any) -> policy.Watch:
    """What the coordinator saw: ``seen_s`` of benchmarking up to now (1300)."""
    values: dict[str, Any] = {
        "now": 1300.0,
        "window_start": None if seen_s is None else 1300.0 - seen_s,
        "window_after_result": False,
        "benchmarking_seen": seen_s is not None,
        "reported_gpus": frozenset({0}),
    }
    values.update(kw)
    return policy.Watch(**values)


def test_honest_result_is_plausible() -> None:
    check = policy.check_result(result(started_at=90.0, finished_at=1290.0), watch=watch(),
                                limits=LIMITS)
    assert check.flags == []
    assert check.recomputed_rate_per_hour == pytest.approx(36.0)
    assert check.counts_for_host_perf
    assert check.gpus == 1


@pytest.mark.parametrize(
    ("changes", "observed", "words"),
    [
        ({"rate_per_hour": 72.0}, None, "does not match"),
        ({"proof_seconds": [200.0] * 11}, None, "11 durations for 12"),
        ({"proof_seconds": [200.0] * 11 + [5000.0]}, None, "longer than the whole run"),
        ({"proof_seconds": [1000.0] * 12, "wall_seconds": 1200.0}, None, "need at least"),
        ({}, 100.0, "saw at most"),
        (
            {
                "wall_seconds": 60.0,
                "rate_per_hour": 720.0,
                "finished_at": 60.0,
                "proof_seconds": [200.0] * 12,
            },
            60.0,
            "longer than the whole run",
        ),
        ({"wall_seconds": 0.0}, None, "12 proofs completed in wall_seconds 0"),
    ],
)
def test_forged_results_are_implausible(
    changes: dict[str, Any], observed: float | None, words: str
) -> None:
    seen = None if observed is None else watch(observed)
    check = policy.check_result(result(**changes), watch=seen, limits=LIMITS)
    assert check.implausible
    assert any(words in r for r in check.reasons), check.reasons
    assert not check.counts_for_host_perf


def test_sim_time_scale_stretches_observed_time() -> None:
    # 7 real seconds of a fleet at 200x are 1400 simulated ones; its timestamps are real.
    check = policy.check_result(result(started_at=1293.5, finished_at=1299.5),
                                watch=watch(7.0, time_scale=200.0), limits=LIMITS)
    assert check.flags == []
    # A real machine (scale 1) claiming the same is caught.
    real = policy.check_result(result(started_at=1293.5, finished_at=1299.5),
                               watch=watch(7.0), limits=LIMITS)
    assert real.implausible


def test_contended_and_partial_flags() -> None:
    check = policy.check_result(
        result(proofs_failed=2), watch=None, limits=LIMITS, contended_with=[4]
    )
    assert check.flags == ["partial", "contended"]
    assert not check.counts_for_host_perf
    assert "#4" in check.reasons[-1]


def test_verdicts_quote_numbers() -> None:
    ok = policy.check_result(result(), watch=None, limits=LIMITS)
    low = policy.benchmark_verdict(ok, 50.0)
    assert (low.action, low.bad_host) == ("terminate", True)
    assert "36.00" in low.reason and "50.00" in low.reason and "below" in low.reason
    keep = policy.benchmark_verdict(ok, 30.0)
    assert keep.action == "keep" and "36.00" in keep.reason
    assert policy.benchmark_verdict(ok, None).action == "keep"
    contended = policy.check_result(
        result(), watch=None, limits=LIMITS, contended_with=[2]
    )
    assert policy.benchmark_verdict(contended, 50.0).action == "keep"


def test_directive_for_states() -> None:
    d = policy.directive_for({"state": "proving"}, next_heartbeat_s=15, min_rate=5.0)
    assert (d.action, d.next_heartbeat_s, d.min_rate_per_hour) == ("continue", 15, 5.0)
    d = policy.directive_for(
        {"state": "terminating", "terminate_reason": "slow"}, next_heartbeat_s=15, min_rate=None
    )
    assert (d.action, d.reason) == ("terminate", "slow")
    d = policy.directive_for(
        {"state": "proving", "rebenchmark_pending": 1}, next_heartbeat_s=15, min_rate=None
    )
    assert d.action == "benchmark"


@pytest.mark.parametrize(
    ("state", "limit"),
    [
        ("deploying", 900),
        ("booting", 900),
        ("fetching_params", 5400),
        ("warming", 1200),
        ("benchmarking", 2700),
    ],
)
def test_phase_timeouts(state: str, limit: float) -> None:
    inst = {"state": state, "state_since": 1000.0}
    assert policy.timed_out(inst, 1000.0 + limit, LIMITS) is None
    reason = policy.timed_out(inst, 1000.0 + limit + 1, LIMITS)
    assert reason is not None and f"limit {limit}" in reason
    assert policy.timed_out({"state": "proving", "state_since": 0.0}, 1e9, LIMITS) is None


def test_flapping_between_phases_does_not_dodge_the_overall_budget() -> None:
    budget = 900 + 5400 + 1200 + 2 * 2700
    inst = {"state": "warming", "state_since": budget - 100.0, "created_at": 0.0,
            "rate_per_hour": None}
    # The current phase began just now, yet the first result is overdue.
    assert policy.timed_out(inst, budget, LIMITS) is None
    reason = policy.timed_out(inst, budget + 1, LIMITS)
    assert reason is not None and f"limit {budget}" in reason
    # Once a benchmark result is in, a later re-benchmark has only its own limit.
    assert policy.timed_out({**inst, "rate_per_hour": 60.0}, budget + 1, LIMITS) is None


# --- settings ------------------------------------------------------------------------------


def test_settings_defaults_and_env(tmp_path: Path) -> None:
    s = Settings.from_env(
        {"VM_PORT": "9000", "VM_ADMIN_TOKEN": "0123456789abcdef", "VM_MAX_USD_PER_PROOF": "0.01"},
        config_dir=str(tmp_path),
    )
    assert (s.db_path, s.host, s.port) == ("./vast-manager.db", "127.0.0.1", 9000)
    assert s.max_usd_per_proof == 0.01
    assert (s.next_heartbeat_s, s.max_next_heartbeat_s, s.max_heartbeats_per_second) == (
        15, 300, 1000.0)
    assert policy.silence_ttl_s(s.next_heartbeat_s, s.silence_grace_s) == 3 * 15 + 30
    assert s.coordinator_url == "http://127.0.0.1:9000"
    assert not s.admin_token_generated
    assert "0123456789abcdef" not in repr(s)


def test_fleet_secret_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    a = Settings.from_env({}, config_dir=str(tmp_path / "cfg"))
    path = tmp_path / "cfg" / "fleet-secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    b = Settings.from_env({}, config_dir=str(tmp_path / "cfg"))
    assert a.fleet_secrets == b.fleet_secrets and len(a.fleet_secrets[0]) == 32
    assert a.fleet_id == b.fleet_id and len(a.fleet_id) == 8
    assert a.admin_token_generated and len(a.admin_token) >= 16


def test_fleet_secret_from_env_lists_newest_first(tmp_path: Path) -> None:
    s = Settings.from_env(
        {"VM_FLEET_SECRET": "aa" * 32 + "," + "bb" * 32}, config_dir=str(tmp_path)
    )
    assert s.newest_secret == bytes.fromhex("aa" * 32)
    assert len(s.fleet_secrets) == 2
    assert not (tmp_path / "fleet-secret").exists()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"VM_ADMIN_TOKEN": "short"}, "VM_ADMIN_TOKEN"),
        ({"VM_PORT": "eighty"}, "VM_PORT"),
        ({"VM_FLEET_SECRET": "zz"}, "VM_FLEET_SECRET"),
        ({"VM_NEXT_HEARTBEAT_S": "0"}, "VM_NEXT_HEARTBEAT_S"),
    ],
)
def test_bad_settings_name_the_variable(tmp_path: Path, env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Settings.from_env(env, config_dir=str(tmp_path))


def test_every_setting_is_documented_in_operations_md() -> None:
    doc = (REPO_ROOT / "docs" / "operations.md").read_text()
    begin, end = "<!-- settings:begin -->\n", "\n<!-- settings:end -->"
    table = doc[doc.index(begin) + len(begin) : doc.index(end)]
    assert table == settings_markdown(), (
        "docs/operations.md's settings table is stale: python -m vast_manager.docs"
    )
    for s in SETTINGS:
        assert s.help, f"{s.env} has no help text"


def test_an_operator_given_minimum_blocks_only_below_the_machines_own_price() -> None:
    check = policy.check_result(result(), watch=None, limits=LIMITS)
    rate = check.recomputed_rate_per_hour
    assert rate is not None
    typo = policy.benchmark_verdict(check, 1000.0, own_min_rate=rate / 2)
    assert typo.action == "terminate" and not typo.bad_host
    assert "not blocked" in typo.reason
    slow = policy.benchmark_verdict(check, 1000.0, own_min_rate=rate * 2)
    assert slow.action == "terminate" and slow.bad_host
    assert policy.benchmark_verdict(check, 1000.0).bad_host  # its price's minimum: blocks
