"""The served rate model: candidates scored by cross-validation grouped by machine, the
blend never worse than the best of them on the folds, conformal intervals, and the market
files the bench reads. Every rate here is simulated."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.linear_model import RidgeCV
from sklearn.preprocessing import TargetEncoder

from vast_manager.coordinator.discovery.served import (
    BOTTLENECKS,
    CANDIDATES,
    MIN_CV_MACHINES,
    MIN_GROUP_ROWS,
    PLAIN_FIELDS,
    RESIDUAL_CATEGORICAL,
    RESIDUAL_COLUMNS,
    _conformal,
    _residual_learner,
    benchmark_noise_sd,
    choose_blend,
    fit_served_model,
    machine_slices,
    mdape_log,
    residual_matrix,
)
from vast_manager.coordinator.discovery.structural_model import Prediction

from support.discovery_support import MARKETS, market, market_measurements, market_offer
from support.paths import REPO_ROOT

ROOT = REPO_ROOT
offer = market_offer
measured = market_measurements


@pytest.fixture(scope="module")
def contended() -> list[dict[str, Any]]:
    return market("contended")


def test_the_blend_is_chosen_by_grouped_cross_validation(contended: list[dict[str, Any]]
                                                         ) -> None:
    served = fit_served_model(measured(contended[:200]), now=0.0)
    names = [s.name for s in served.scores]
    assert names == list(CANDIDATES)
    assert abs(sum(served.weights) - 1.0) < 1e-9
    # The single candidates are corners of the blend's grid: on the folds the served
    # point is never worse than the best of them, by the error the blend is chosen by.
    assert served.served_cv_mdape is not None and served.served_cv_trimmed_abs_log is not None
    best = min(s.cv_trimmed_abs_log for s in served.scores)
    assert served.served_cv_trimmed_abs_log <= best + 1e-12
    assert "all" in served.conformal
    lo, hi = served.conformal["all"]
    assert lo < 0 < hi
    summary = served.summary()
    assert summary["candidates"] and summary["served_cv_mdape"] == served.served_cv_mdape
    # A new host: the blend answers, and says so with its cross-validated error.
    (new,) = served.predict_offers([offer(contended[1500])])
    assert isinstance(new, Prediction)
    assert "CV error" in new.basis and "conformal" in new.basis
    assert new.rate_low < new.rate_per_hour < new.rate_high
    # Its basis quotes the interval served, not the structural model's.
    assert f"] {new.rate_low:.0f}-{new.rate_high:.0f}/h (80%), " in new.basis
    # A measured machine: the structural model, which reads its runs.
    (own,) = served.predict_offers([offer(contended[0])])
    assert isinstance(own, Prediction) and own.machine_runs == 1
    assert "this machine's runs" in own.basis


def test_the_blend_is_chosen_by_the_machines_it_errs_least_on() -> None:
    """Of 100 machines: a candidate exact on 60 and 0.5 off on the rest has the least
    median error; one 0.05 off on 75 and 1 off on 25, the least error over the three
    quarters each errs least on; one 0.15 off on all, the least mean. The blend is the
    second's: its weights follow most machines' errors, neither the middle few's nor
    the worst few's."""
    log_true = np.zeros(100)
    rows = np.arange(100)
    oof = np.empty((100, len(CANDIDATES)))
    oof[:, 0] = np.where(rows < 60, 0.0, 0.5)
    oof[:, 1] = np.where(rows < 75, 0.05, 1.0)
    oof[:, 2] = 0.15
    oof[:, 3] = 0.3
    assert mdape_log(oof[:, 0], log_true) < mdape_log(oof[:, 1], log_true)
    assert np.mean(np.abs(oof[:, 2])) < np.mean(np.abs(oof[:, 1]))
    assert choose_blend(oof, log_true) == (0.0, 1.0, 0.0, 0.0)
    # Where blending pays, a blend: errors of opposite signs cancel.
    oof[:, 1], oof[:, 2] = 0.1, -0.1
    assert choose_blend(oof, log_true) == (0.0, 0.5, 0.5, 0.0)


def test_a_binding_resource_few_machines_back_only_widens_its_interval(
        contended: list[dict[str, Any]]) -> None:
    """Five PCIe-bound machines whose scores run high: too few for percentiles of their
    own, so a PCIe-bound offer gets its GPU count's, widened to reach their range; an
    offer of a well-backed resource is untouched, and a resource whose few scores sit
    inside the wider group's keeps that group's interval."""
    rng = np.random.default_rng(0)
    n = 3 * MIN_GROUP_ROWS
    scores = np.concatenate([rng.normal(0.0, 1.0, n), [3.0, 4.0, 6.0, 5.0, -0.5],
                             [0.1, -0.2, 0.3]])
    groups = [("gpu", 1)] * n + [("pcie", 1)] * 5 + [("memory", 1)] * 3
    conformal, _, few = _conformal(scores, groups)
    assert "pcie" not in conformal and "pcie/1" not in conformal and "gpu" in conformal
    assert few["pcie"] == (-0.5, 6.0) and "gpu" not in few
    served = fit_served_model(measured(contended[:60]), now=0.0)
    served.conformal, served.conformal_few = conformal, few
    served.conformal_mid, served.noise_sd = {}, 0.0
    host = offer(next(r for r in contended if r["num_gpus"] == 1))
    lo, hi = served.conformal["gpus 1"]
    assert served.interval(host, "pcie", 1.0) == (min(lo, -0.5), 6.0)
    assert served.interval(host, "memory", 1.0) == (lo, hi)
    assert served.interval(host, "gpu", 1.0) == served.conformal["gpu/1"]


def test_a_machine_benchmarked_often_weighs_as_one_machine(
        contended: list[dict[str, Any]]) -> None:
    """The fleet's kept machines are benchmarked again and again, the rest once: the
    learners and the folds read one row a machine, so the repeats change nothing the
    plain learner (whose target is the rate alone) sees. By runs, the kept machines
    would weigh five times in its fit and in the blend's choice, and in folds not
    grouped by machine their held-out runs would sit among the training rows."""
    once = measured(contended[:120])
    often = measured(contended[:40], copies=5) + once[40:]
    a, b = fit_served_model(once, now=0.0), fit_served_model(often, now=0.0)
    assert b.n_measurements == 40 * 5 + 80
    plain = CANDIDATES.index("plain")
    assert b.scores[plain].cv_mdape == a.scores[plain].cv_mdape
    new = [offer(r) for r in contended[1500:1520]]
    assert np.array_equal(a.candidate_points(new)[1][:, plain],
                          b.candidate_points(new)[1][:, plain])
    # The slice is a row's key, not the machine: its runs on each slice are averaged.
    offers, log_rate, machines = machine_slices(often)
    assert len(offers) == len(machines) == 120 == len(set(machines))
    assert log_rate[0] == pytest.approx(math.log(contended[0]["measured_rate_per_hour"]))


def test_the_benchmark_noise_is_the_repeats_shrunk_to_the_prior(
        contended: list[dict[str, Any]]) -> None:
    """One run a machine shows no noise apart from the host: the prior's stands. Many
    repeats of each machine show theirs, and it takes over; a few pull part of the way."""
    once = measured(contended[:100])
    assert benchmark_noise_sd(once, 0.06) == pytest.approx(0.06)
    rng = random.Random(1)

    def repeated(machines: int, copies: int) -> list[Any]:
        return [dataclasses.replace(m, rate_per_hour=m.rate_per_hour
                                    * math.exp(rng.gauss(0.0, 0.02)))
                for m in measured(contended[:machines], copies=copies)]

    many = benchmark_noise_sd(repeated(100, 10), 0.06)
    assert 0.019 < many < 0.025
    few = benchmark_noise_sd(repeated(10, 2), 0.06)
    assert many < few < 0.06
    # The served model takes it out of the intervals: with one run a machine, the prior's.
    served = fit_served_model(once, now=0.0)
    assert served.noise_sd == pytest.approx(served.structural.priors.noise_sd)


def test_with_few_machines_the_structural_model_answers_alone(
        contended: list[dict[str, Any]]) -> None:
    served = fit_served_model(measured(contended[:MIN_CV_MACHINES - 1]), now=0.0)
    assert served.scores == () and served.learners is None
    (p,) = served.predict_offers([offer(contended[1600])])
    assert isinstance(p, Prediction)
    assert f"cross-validation needs {MIN_CV_MACHINES} measured machines" in p.basis


def test_a_bad_market_line_is_named(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from market_bench import MarketError, load_market

    rows = [offer(r).raw | {"true_rate_per_hour": 10.0, "measured_rate_per_hour": 9.0}
            for r in market("simulator")[:60]]
    rows[41]["measured_rate_per_hour"] = -1
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(MarketError, match="line 42: measured_rate_per_hour must be a positive"):
        load_market(path)
    del rows[41]["machine_id"]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(MarketError, match="line 42 has no machine_id"):
        load_market(path)


def test_market_files_are_reproducible(tmp_path: Path) -> None:
    """The shipped files are what their generators write (gzip's time fixed)."""
    for name in ("pipeline", "contended"):
        before = (MARKETS / f"{name}.jsonl.gz").read_bytes()
        done = subprocess.run([sys.executable, str(MARKETS / f"{name}.py")], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert (MARKETS / f"{name}.jsonl.gz").read_bytes() == before, name


@pytest.mark.slow
@pytest.mark.timeout(900)  # 160 s alone on two cores; in the slow set it shares them
def test_market_bench_on_every_market(tmp_path: Path) -> None:
    """The figures docs/discovery.md quotes, one seed: the acceptance lines print."""
    out = tmp_path / "m.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "discovery.py"), "--markets",
                           "--quick", "--json-out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("simulator", "pipeline", "contended"):
        assert f"Market {name}" in done.stdout
    assert done.stdout.count("acceptance at 240 measured") == 3
    figures = orjson.loads(out.read_bytes())
    for name, m in figures["markets"].items():
        for row in m["accuracy"]["240"]:
            # Never far from the best single candidate on held-out hosts.
            assert row["served"] <= 1.1 * min(row["candidates"].values()), name


def test_a_bad_prior_or_share_is_named_and_runs_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import discovery as bench

    for args, said in ((["--prior", "bogus=1"], "NAME a field of Priors"),
                       (["--prior", "host_sd=x"], "host_sd takes a float"),
                       (["--belief-test-share", "2"], "between 0 and 1"),
                       (["--plan-runs", "0,x"], "--plan-runs takes run numbers"),
                       (["--seed-list", "31,x"], "--seed-list takes seeds"),
                       (["--kept-reruns", "-1"], "--kept-reruns takes a number of runs")):
        assert bench.main(["--markets", "--plan-only", *args]) == 2
        err = capsys.readouterr()
        assert said in err.err and "Market " not in err.out


def test_the_kept_machines_are_benchmarked_again(monkeypatch: pytest.MonkeyPatch,
                                                 contended: list[dict[str, Any]]) -> None:
    """``--kept-reruns``: the cheapest 30% per measured proof run again, each run the true
    rate times one of the market's own benchmark errors."""
    sys.path.insert(0, str(ROOT / "bench"))
    import market_bench

    train = contended[:100]
    assert market_bench.kept_reruns(train, 1) == []
    monkeypatch.setattr(market_bench, "KEPT_RERUNS", 2)
    runs = market_bench.kept_reruns(train, 1)
    cheapest = sorted(train, key=lambda r: r["dph_total"] / r["measured_rate_per_hour"])[:30]
    assert [m.machine_id for m in runs] == [str(r["machine_id"]) for r in cheapest
                                            for _ in range(2)]
    errors = {r["measured_rate_per_hour"] / r["true_rate_per_hour"] for r in train}
    true = {str(r["machine_id"]): r["true_rate_per_hour"] for r in train}
    assert all(any(m.rate_per_hour == pytest.approx(true[m.machine_id] * e) for e in errors)
               for m in runs)
    assert runs == market_bench.kept_reruns(train, 1)  # seeded


def test_an_oracle_planning_run_predicts_untried_hosts_from_the_oracle(
        contended: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """``--plan-oracle-error F``: within ``oracle_predictions`` an untried host's point is
    the oracle's rate times the market's mean host effect, its log sd F times the host
    effect's; a measured machine keeps the model's reading of its runs; after it the
    served model predicts as before; with ``min_gpus`` an offer of fewer GPUs keeps the
    model's. Below 1 the option is refused before any run."""
    sys.path.insert(0, str(ROOT / "bench"))
    import discovery as bench
    import market_bench

    rows = contended[:300]
    model = fit_served_model(measured(rows[:20]), now=0.0)
    offers = [offer(r) for r in (rows[0], rows[200])]

    def points(preds: list[Any]) -> list[tuple[float, float, float]]:
        return [(p.rate_per_hour, p.rate_low, p.rate_high) for p in preds]

    before = model.predict_offers(offers, explain=False)
    assert isinstance(before[0], Prediction) and before[0].machine_runs > 0
    effect = [math.log(r["true_rate_per_hour"] / r["oracle_rate_per_hour"]) for r in rows]
    host_sd = float(np.std(effect))
    for error in (1.0, 2.0):
        with market_bench.oracle_predictions(rows, error):
            seen, new = model.predict_offers(offers, explain=False)
        assert points([seen]) == points(before[:1]) and isinstance(new, Prediction)
        assert new.log_rate_sd == pytest.approx(error * host_sd)
        if error == 1.0:
            assert new.log_rate_mean == pytest.approx(
                math.log(rows[200]["oracle_rate_per_hour"]) + float(np.mean(effect)))
    with market_bench.oracle_predictions(rows, 1.0, min_gpus=rows[200]["num_gpus"] + 1):
        assert points(model.predict_offers(offers, explain=False)) == points(before)
    assert points(model.predict_offers(offers, explain=False)) == points(before)
    blind = [{k: v for k, v in r.items() if k != "oracle_rate_per_hour"} for r in rows]
    with (pytest.raises(market_bench.MarketError, match="oracle_rate_per_hour on every"),
          market_bench.oracle_predictions(blind, 1.0)):
        pass
    assert bench.main(["--markets", "--plan-only", "--plan-oracle-error", "0.5"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert bench.main(["--markets", "--plan-only", "--plan-oracle-min-gpus", "2"]) == 2
    assert "needs --plan-oracle-error" in capsys.readouterr().err


def test_one_planning_run_traces_its_trials_against_the_truth(
        tmp_path: Path, contended: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--plan-runs 0 --plan-trace``: that run alone, each trial with the plan's
    prediction beside the market's true rate for the host it proposed."""
    sys.path.insert(0, str(ROOT / "bench"))
    import discovery as bench

    small = tmp_path / "small.jsonl"
    small.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in contended[:300]))
    by_rate = {round(r["true_rate_per_hour"]) for r in contended[:300]}
    assert bench.main(["--market", str(small), "--plan-only", "--plan-runs", "0",
                       "--plan-trace"]) == 0
    out = capsys.readouterr().out
    assert out.count("    seed ") == 1
    trials = [line for line in out.splitlines() if line.lstrip().startswith("trial ")]
    assert len(trials) == 20
    for line in trials:
        true = int(line.split(", true ")[1].split("/h")[0])
        assert true in by_rate, line
        assert "predicted " in line and "/proof" in line


def test_a_replaced_prior_reaches_every_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import discovery as bench

    from vast_manager.coordinator.discovery import served

    monkeypatch.setattr(served, "fit_rate_model", served.fit_rate_model)
    bench.use_priors(["host_sd=0.08", "host_tail_dof=30"])
    model = fit_served_model([], now=0.0)
    assert model.structural.priors.host_sd == 0.08
    assert model.structural.priors.host_tail_dof == 30.0


def test_the_residual_learner_reads_missing_fields_and_categories(
        contended: list[dict[str, Any]]) -> None:
    """vast.ai leaves fields out: the residual candidates' learners fit and predict with
    a field some offers lack, one no offer reports, and a GPU model it never saw; its
    categorical columns (the GPU model's code, the binding resource) are the ones it
    target-encodes."""
    rng = random.Random(3)
    rows = []
    for r in contended[:120]:
        row = {k: v for k, v in r.items() if k != "dlperf"}
        if rng.random() < 0.3:
            row.pop("gpu_mem_bw", None)
            row.pop("total_flops", None)
        rows.append(row)
    served = fit_served_model(measured(rows), now=0.0)
    assert served.learners is not None
    assert isinstance(served.learners.residual[-1], ExtraTreesRegressor)
    encode = served.learners.residual[0]
    assert tuple(encode.transformers_[0][2]) == RESIDUAL_CATEGORICAL
    assert isinstance(encode.transformers_[0][1], TargetEncoder)
    offers = [offer(r) for r in rows[:40]]
    preds = served.structural.predict_offers(offers, explain=False)
    x = residual_matrix(offers, preds, served.gpu_codes)  # type: ignore[arg-type]
    gpu, binding = (x[:, c] for c in RESIDUAL_CATEGORICAL)
    assert set(gpu) <= set(served.gpu_codes.values())
    assert set(binding) <= set(range(len(BOTTLENECKS)))
    assert np.isnan(x[:, PLAIN_FIELDS.index("dlperf")]).all()
    # A new host of a model no training row has, missing the fields the fit saw.
    unseen = {k: v for k, v in contended[1500].items() if k not in ("gpu_mem_bw", "dlperf")}
    unseen["gpu_name"] = "RTX 9999"
    (p,) = served.predict_offers([offer(unseen)])
    assert isinstance(p, Prediction) and math.isfinite(p.rate_per_hour)
    assert p.rate_low < p.rate_per_hour < p.rate_high
    # Every candidate reads it, whatever the blend weighs: the linear residual one-hots
    # the same categorical columns (an unseen model reads none) and imputes the fields.
    assert isinstance(served.learners.linear[-1], RidgeCV)
    assert tuple(served.learners.linear[0].transformers_[0][2]) == RESIDUAL_CATEGORICAL
    _, logs = served.candidate_points([offer(unseen)])
    assert np.isfinite(logs).all() and logs.shape == (1, len(CANDIDATES))


def test_the_residual_forest_stays_small_as_the_fleet_grows() -> None:
    """A leaf holds at least 5 rows or 2% of them: at 3,000 rows no tree of the forest
    passes 50 leaves, where 5 a leaf would let it reach 600."""
    rng = np.random.default_rng(0)
    rows = 3000
    x = rng.normal(size=(rows, RESIDUAL_COLUMNS))
    for c in RESIDUAL_CATEGORICAL:
        x[:, c] = rng.integers(0, 4, rows)
    x[rng.random(x.shape) < 0.1] = np.nan
    y = 0.1 * np.tanh(np.nan_to_num(x[:, 0])) + rng.normal(0.0, 0.05, rows)
    forest = _residual_learner(rows).fit(x, y)[-1]
    assert max(tree.get_n_leaves() for tree in forest.estimators_) <= 50
    assert _residual_learner(240)[-1].min_samples_leaf == 5
