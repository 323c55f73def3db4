"""The simulated cuzk and the agent's command lines against the real surface (the pinned fixture).

tests/fixtures/cuzk_e0294b0f.json transcribes cuzk-daemon's and cuzk-bench's
clap declarations, batch format strings, /status fields and cuzk.toml
defaults at Curio e0294b0f; `cuzk_surface` derives clap's behaviour from the
declarations. The simulator must accept and refuse exactly what they do.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vast_manager.agent.cuzk import batch_argv, daemon_argv, preload_argv, render_config
from vast_manager.sim import clap
from vast_manager.sim.cuzk_cli import CUZK_BENCH, CUZK_DAEMON, FEATURE_GATED, SOURCE_COMMIT
from vast_manager.sim.daemon import (
    DEFAULT_LISTEN,
    ConfigError,
    SimDaemon,
    grpc_listen_address,
    load_settings,
    parse_size,
)
from vast_manager.sim.hardware import load_profile

from support.cuzk_surface import COMMIT, SURFACE, bench_command, check, daemon_command
from support.paths import REPO_ROOT

BENCH = "/usr/local/bin/cuzk-bench"
CUZK = "/usr/local/bin/cuzk"
BATCH_USAGE = "Usage: cuzk-bench batch [OPTIONS] --type <PROOF_TYPE>"


def agent_batch(**over: Any) -> list[str]:
    kw: dict[str, Any] = dict(c1_path=Path("/data/zk/c1.json"), count=12, concurrency=2,
                              sector_num=7, miner_id=1234)
    kw.update(over)
    return batch_argv(BENCH, "http://127.0.0.1:40000", **kw)


def refused(argv: list[str]) -> clap.ClapError:
    with pytest.raises(clap.ClapError) as info:
        check(argv)
    return info.value


def test_the_fixture_and_the_simulator_name_the_same_commit() -> None:
    assert COMMIT == SOURCE_COMMIT == "e0294b0f948132d41e8f42f59fa949495d5fd3af"
    assert SURFACE["source"]["repository"] == "filecoin-project/curio"


def test_the_simulators_command_lines_are_the_declared_ones() -> None:
    assert CUZK_BENCH.to_spec() == bench_command().to_spec()
    assert CUZK_DAEMON.to_spec() == daemon_command().to_spec()
    assert SURFACE["cuzk-bench"]["feature_gated"] == FEATURE_GATED


def test_every_command_line_the_agent_builds_is_accepted() -> None:
    m = check(agent_batch())
    assert m.path() == ["batch"]
    v = m.leaf().values
    assert (v["proof_type"], v["count"], v["concurrency"]) == ("porep", 12, 2)
    assert (v["sector_num"], v["miner_id"], v["c1"]) == (7, 1234, "/data/zk/c1.json")
    assert m.values["addr"] == "http://127.0.0.1:40000"
    pre = check(preload_argv(BENCH, "http://127.0.0.1:40000"))
    assert pre.path() == ["preload"] and pre.leaf().values["circuit_id"] == "porep-32g"
    d = check(daemon_argv(CUZK, Path("/var/lib/vast-agent/cuzk.toml")))
    assert d.values == {"config": "/var/lib/vast-agent/cuzk.toml", "listen": None,
                        "log_level": None}


def test_dash_n_is_refused_as_clap_refuses_it() -> None:
    argv = agent_batch()
    i = argv.index("--count")
    argv[i] = "-n"
    err = refused(argv)
    assert err.code == 2 and not err.to_stdout
    assert err.text == (
        "error: unexpected argument '-n' found\n\n"
        f"{BATCH_USAGE}\n\nFor more information, try '--help'.\n"
    )
    # -c is --count in batch (and --circuit-id in preload).
    assert check([BENCH, "batch", "-t", "porep", "-c", "5"]).leaf().values["count"] == 5


def test_clap_errors_and_defaults() -> None:
    err = refused([BENCH, "batch", "-t", "porep", "--cout", "3"])
    assert "unexpected argument '--cout' found" in err.text
    assert "tip: a similar argument exists: '--count'" in err.text
    err = refused([BENCH, "batch", "--c1", "x"])
    assert err.text.startswith("error: the following required arguments were not provided:\n"
                               "  --type <PROOF_TYPE>\n")
    err = refused([BENCH, "batch", "-t", "porep", "-c", "many"])
    assert err.text == ("error: invalid value 'many' for '--count <COUNT>': invalid digit found "
                        "in string\n\nFor more information, try '--help'.\n")
    assert "number too large" in refused([BENCH, "batch", "-t", "p", "-j", "4294967296"]).text
    assert "unrecognized subcommand 'bench'" in refused([BENCH, "bench"]).text
    # Global options go before the subcommand: clap has no `global = true` here.
    assert "unexpected argument '--addr' found" in refused([BENCH, "batch", "-t", "porep",
                                                           "--addr", "x"]).text
    assert "unexpected argument '-V' found" in refused([BENCH, "-V"]).text
    assert "requires a subcommand" in refused([BENCH, "--addr", "http://x:1"]).text
    assert "cannot be used multiple times" in refused([BENCH, "batch", "-t", "p", "-t", "q"]).text
    helped = refused([BENCH, "batch", "--help"])
    assert helped.code == 0 and helped.to_stdout and "--count <COUNT>" in helped.text
    assert refused([BENCH]).code == 2  # no arguments: help on stderr
    v = check([BENCH, "batch", "-t", "porep"]).leaf().values
    assert (v["count"], v["concurrency"], v["sector_num"], v["miner_id"]) == (3, 1, 1, 1000)
    assert check([CUZK]).values["config"] == "/data/zk/cuzk.toml"
    assert "unexpected argument '--port' found" in refused([CUZK, "--port", "1"]).text
    assert "a value is required for '--listen <LISTEN>'" in refused([CUZK, "--listen"]).text


@pytest.mark.parametrize(
    ("module", "argv", "needle"),
    [
        ("vast_manager.sim.bench", ["batch", "-t", "porep", "--c1", "x", "-n", "3"],
         "error: unexpected argument '-n' found"),
        ("vast_manager.sim.bench", ["batch", "--addr", "http://127.0.0.1:1", "-t", "porep"],
         "error: unexpected argument '--addr' found"),
        ("vast_manager.sim.daemon", ["--config"],
         "error: a value is required for '--config <CONFIG>'"),
        ("vast_manager.sim.daemon", ["-n", "1"], "error: unexpected argument '-n' found"),
    ],
)
def test_the_simulated_programs_refuse_like_clap(module: str, argv: list[str],
                                                 needle: str) -> None:
    res = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.startswith(needle)
    assert res.stderr.endswith("For more information, try '--help'.\n")


def test_feature_gated_subcommands_fail_as_the_release_build_does() -> None:
    res = subprocess.run([sys.executable, "-m", "vast_manager.sim.bench",
                          "pce-bench", "--c1", "x"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert res.stderr == "Error: pce-bench subcommand requires the 'pce-bench' feature.\n"


def test_batch_lines_follow_the_format_strings() -> None:
    from vast_manager.agent.benchparse import STATUS_LABELS, parse_proof_line
    from vast_manager.sim.bench import _proof_line, format_summary, status_label

    out = SURFACE["batch_output"]
    fmt = out["proof_line"]
    resp = {"status": 1, "gpu_compute_ms": 25243, "queue_wait_ms": 3}
    line = _proof_line(2, 12, resp, 388.74)
    pattern = re.escape(fmt).replace(re.escape("{:.1}"), r"\d+\.\d").replace(re.escape("{}"),
                                                                            r"\S+")
    assert re.fullmatch(pattern, line), line
    assert line == "  [2/12] COMPLETED \u2014 388.7s (prove=25243 ms, queue=3 ms)"
    labels = out["status_label"]
    assert [status_label(int(k)) for k in ("1", "2", "3", "4")] == [labels[k] for k in "1234"]
    assert status_label(0) == status_label(7) == labels["other"]
    assert set(STATUS_LABELS) == set(labels.values())
    for label in labels.values():
        parsed = parse_proof_line(f"  [1/1] {label} \u2014 1.0s (prove=0 ms, queue=0 ms)")
        assert parsed is not None and parsed.completed == (label == "COMPLETED")
    summary = format_summary(60.0, [(resp, 30.0), (resp, 40.0)], 1)
    heads = [s.split("{")[0] for s in out["summary"] + out["summary_if_completed"]]
    assert [line[: len(h)] for line, h in zip(summary, heads, strict=True)] == heads
    assert format_summary(60.0, [], 3)[-1] == "failed:        3"  # no wall/prove/throughput


def _shape(value: Any, spec: Any) -> None:
    if isinstance(spec, dict):
        assert isinstance(value, dict) and set(value) == set(spec), (value, spec)
        for k, sub in spec.items():
            _shape(value[k], sub)
    elif isinstance(spec, list):
        assert isinstance(value, list)
        for item in value:
            _shape(item, spec[0])
    elif spec.startswith("Option<"):
        if value is not None:
            _shape(value, spec[len("Option<") : -1])
    elif spec in ("f64",):
        assert isinstance(value, int | float) and not isinstance(value, bool)
    elif spec in ("u64", "u32", "usize"):
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif spec == "bool":
        assert isinstance(value, bool)
    elif spec.startswith("HashMap"):
        assert isinstance(value, dict) and all(isinstance(n, int) for n in value.values())
    else:
        assert isinstance(value, str)


async def test_status_json_has_the_real_fields_and_meanings(tmp_path: Path) -> None:
    profile = load_profile({"VM_SIM_PROFILE": '{"num_gpus": 2, "cpu_ram": 257000}'})
    settings = load_settings(str(tmp_path / "none.toml"), "127.0.0.1:1", None, profile)
    d = SimDaemon(settings, profile, 1.0, None)
    d.sim_now = lambda: d.sim.t  # type: ignore[method-assign]  # the test drives the clock
    d.sim.submit(input_error=None)
    d.sim.submit(input_error=None)
    d.sim.advance_to(200.0)  # SRS loaded, partitions synthesising and on the GPUs
    st = d.status_json()
    spec = SURFACE["status"]
    _shape(st, spec["fields"])
    assert st["pipelines"][0]["proof_kind"] == spec["proof_kind_porep"]
    assert st["synthesis"]["max_concurrent"] == st["memory"]["total_bytes"] // (9 << 30)
    for w in st["gpu_workers"]:
        assert w["state"] in spec["worker_states"]
        assert (w["busy_secs"] is None) == (w["state"] == "idle")
    for p in st["pipelines"][0]["partitions"]:
        assert p["state"] in spec["partition_states"]
        assert (p["synth_ms"] is None) == (p["state"] == "pending")
    await asyncio.sleep(0)


def test_config_defaults_and_types_are_the_real_ones(tmp_path: Path) -> None:
    profile = load_profile({})
    defaults = SURFACE["config"]["defaults"]
    s = load_settings(str(tmp_path / "missing.toml"), None, None, profile)
    assert s.listen == DEFAULT_LISTEN == defaults["daemon.listen"]
    assert s.status_listen == defaults["daemon.status_listen"] == ""  # /status off
    assert str(s.param_cache) == defaults["srs.param_cache"]
    assert s.sim.max_parallel_synthesis == defaults["pipeline.max_parallel_synthesis"]
    assert s.sim.total_budget_bytes is None  # auto
    assert s.sim.workers_per_device == defaults["gpus.gpu_workers_per_device"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[memory]\ntotal_budget = 256\n")
    with pytest.raises(ConfigError, match="invalid type: integer `256`, expected a string"):
        load_settings(str(bad), None, None, profile)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[daemon]\nnot_a_key = 1\n[nosuch]\nx = 2\n")
    assert load_settings(str(unknown), None, None, profile).listen == DEFAULT_LISTEN
    units = SURFACE["config"]["size_units"]
    assert parse_size("200GiB") == 200 * units["GiB"] and parse_size("7MiB") == 7 * units["MiB"]
    assert parse_size("3GB") == 3 * units["GB"] and parse_size("12345") == 12345
    assert parse_size("1.5GiB") == 50 * units["GiB"]  # parse_size's silent fallback
    with pytest.raises(ConfigError, match="invalid listen address: localhost:9820"):
        grpc_listen_address("localhost:9820")
    # What the agent writes is what the daemon reads: the budget in whole MiB.
    toml = tmp_path / "agent.toml"
    toml.write_text(render_config(listen="127.0.0.1:5", status_listen="127.0.0.1:6",
                                  param_cache=tmp_path, total_budget="204800MiB"))
    got = load_settings(str(toml), None, None, profile)
    assert got.sim.total_budget_bytes == 200 * units["GiB"]
    assert (got.listen, got.status_listen) == ("127.0.0.1:5", "127.0.0.1:6")


def test_docs_cite_the_commit_and_every_source_file_of_the_fixture() -> None:
    doc = (REPO_ROOT / "docs" / "cuzk.md").read_text()
    assert COMMIT in doc
    assert SURFACE["source"]["extern_cuzk_last_changed"][:8] in doc
    paths = {
        str(section["path"]).split(" ")[0].removeprefix("extern/cuzk/")
        for section in SURFACE.values() if isinstance(section, dict) and "path" in section
    }
    assert paths, "the fixture names its source files"
    for path in paths:
        assert path in doc, f"docs/cuzk.md does not cite {path}"
    # The image builds the commit the facts were read at.
    dockerfile = (REPO_ROOT / "image" / "Dockerfile").read_text()
    assert f"ARG CURIO_REF={COMMIT}" in dockerfile
