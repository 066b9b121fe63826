"""Placebo copies of a market and `fxray.tune --placebo N` end to end: a planted market whose
real sweep ranks above every placebo sweep, and its shuffled twin, which does not.

The sweeps run through the real CLI (local Ray, Optuna, MLflow in a temporary sqlite store)
on one CPU worker with one trial in flight, so that they are deterministic."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from fxray.data import cache
from fxray.data.placebo import placebo_targets, write_placebo
from fxray.data.synth import oracle_columns

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


# --- the copy ---------------------------------------------------------------------------------


def test_a_placebo_copy_keeps_the_features_and_sizes_and_loses_the_direction(strong_cache, tmp_path):
    market = cache.open(strong_cache)
    out = tmp_path / "placebo.fxcache"
    write_placebo(market, out, index=1, seed=0)
    copy = cache.open(out)  # a valid fxcache
    for col in ("ts", "features", "ofi"):
        assert np.array_equal(getattr(copy, col), getattr(market, col)), col  # bitwise: untouched
    o, h, l, c = market.targets.T
    o2, h2, l2, c2 = copy.targets.T
    r, r2 = np.diff(np.log(c)), np.diff(np.log(c2))
    mu = r.mean()
    _, s = placebo_targets(np.asarray(market.targets), 0, 1)
    np.testing.assert_allclose(r2 - mu, s[1:] * (r - mu), atol=1e-12)  # r' = mu + s (r - mu)
    assert 0.48 < np.mean(s[1:] < 0) < 0.52
    gap, gap2 = np.log(o[1:] / c[:-1]), np.log(o2[1:] / c2[:-1])
    np.testing.assert_allclose(gap2, s[1:] * gap, atol=1e-12)  # the open's gap flips with the bar
    assert np.all(h2 >= np.maximum(o2, c2)) and np.all(l2 <= np.minimum(o2, c2)) and np.all(l2 > 0)
    assert np.array_equal(copy.targets[0], market.targets[0])
    # the planted market's metadata is gone: no oracle is claimed on a placebo
    assert "oracle" in market.meta and oracle_columns(market.meta, 42) is not None
    assert "oracle" not in copy.meta and "synth" not in copy.meta and oracle_columns(copy.meta, 42) is None
    assert copy.meta["placebo"] == {
        "method": "sign-randomised around the mean bar return",
        "index": 1,
        "seed": 0,
        "of": market.content_hash,
        "of_path": str(strong_cache),
    }
    # the signal: ofi[:, 0] at bar t's close predicts the return from t to t+1, and no longer does
    flow = market.ofi[:-1, 0]
    assert np.corrcoef(flow, r)[0, 1] > 0.05
    assert abs(np.corrcoef(flow, r2)[0, 1]) < 0.01
    # deterministic in (seed, index); another index is another copy
    assert np.array_equal(placebo_targets(np.asarray(market.targets), 0, 1)[0], copy.targets)
    assert not np.array_equal(placebo_targets(np.asarray(market.targets), 0, 2)[1], s)


def test_a_placebo_sweep_is_made_resumed_extended_or_kept(tmp_path):
    import argparse

    from fxray.sweep.placebo import placebo_args
    from fxray.sweep.rundir import UsageError, write_sweep

    def record(rounds):  # what a driver writes of a placebo sweep, as far as its resume reads it
        return {"rounds": rounds, "data": {"path": "m.fxcache", "content_hash": "0" * 32}, "mlflow": {"uri": "x"}}

    storage, pdir = tmp_path / "real", tmp_path / "real/placebo-1"
    pdir.mkdir(parents=True)
    real = {"profile": "cpu", "experiment": "x", "rounds": [{"trials": 4, "seed": 3}, {"trials": 2, "seed": 5}]}
    args = argparse.Namespace(placebo=2, same_trials=None, json="o.json", storage=str(storage), data=None, trials=6)
    args.__dict__.update(experiment="x.yaml", resume=False, seed=None, profile="auto", name=None)
    new = placebo_args(args, storage, real, pdir)
    assert (new.trials, new.seed, new.resume, new.json, new.placebo) == (6, 3, False, None, None)
    assert new.experiment == str(storage / "experiment.yaml") and new.data == str(pdir / "market.fxcache")
    assert (new.profile, new.name, new.storage) == ("cpu", "x", str(pdir))
    write_sweep(pdir, record([{"trials": 6, "done": False}]))
    resumed = placebo_args(args, storage, real, pdir)
    assert resumed.resume and resumed.trials is None and resumed.experiment is None
    write_sweep(pdir, record([{"trials": 6, "done": True}]))
    assert placebo_args(args, storage, real, pdir) is None  # finished with the same budget: kept
    write_sweep(pdir, record([{"trials": 4, "done": True}]))
    extended = placebo_args(args, storage, real, pdir)
    assert (extended.trials, extended.seed, extended.resume) == (2, 5, False)
    write_sweep(pdir, record([{"trials": 8, "done": True}]))
    with pytest.raises(UsageError, match="ran 8 trials, more than the 6 of the sweep it is a placebo of"):
        placebo_args(args, storage, real, pdir)


def test_placebo_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    from fxray.tune import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    (tmp_path / "same.json").write_text("{}")
    assert main(["--same-trials", "same.json", "--placebo", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fxray.tune: error: --placebo: a --same-trials replay has no search to account for; drop one of them"
    ]
    with pytest.raises(SystemExit, match="2"):
        main(["--placebo", "0"])
    assert "argument --placebo: '0' is not an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


# --- the sweeps -------------------------------------------------------------------------------

# A strong planted market (the DQN learns it in seconds) in 3 folds of 3-day test windows: each
# sweep is 2 trials, one in flight, ~20 s on the 2-core box. N = 3 placebos: the smallest
# p-value there is 1 / 4 (the GPU measurement runs 8: docs/benchmarks.md).
PLANTED = """\
name: {name}
data: {{synth: {{n_bars: 30000, seed: 0, shuffle: {shuffle}, beta: 0.20, persistence: 0.95, ofi_noise: 0.0,
         ofi_span: 1}}}}
folds: {{train: 6d, val: 2d, test: 3d, max_folds: 3}}
dqn: {{num_envs: 128, batch_size: 512, hidden: 64, epochs: 3, steps_per_epoch: 80, patience: 2, cost: 1.0e-5}}
search:
  lr: {{type: loguniform, low: 3.0e-4, high: 3.0e-3}}
  gamma: {{type: uniform, low: 0.8, high: 0.95}}
sweep: {{trials: 2, seed: 0, grace_folds: 1, reduction_factor: 2, cpu_per_trial: 0.25, trials_per_worker: 1}}
"""
N_PLACEBO = 3


def placebo_sweep(tmp_path, name: str, shuffle: bool, compare: bool = True) -> dict:
    """`fxray.tune --placebo 3` on PLANTED, its run directories and MLflow runs checked, then (with
    `compare`) `fxray.compare` on it: the same code on either market, so one test runs it."""
    (tmp_path / "exp.yaml").write_text(PLANTED.format(name=name, shuffle=str(shuffle).lower()))
    env = {
        **os.environ,
        "FXRAY_CACHE_DIR": str(tmp_path / "cache"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONWARNINGS": "ignore",
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "fxray.tune", "--experiment", "exp.yaml", "--num-cpus", "2", "--cpu-workers", "1"]
    out = subprocess.run(
        [*cmd, "--placebo", str(N_PLACEBO), "--json", "out.json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"== {name}: the real sweep against {N_PLACEBO} placebo sweep(s)" in out.stdout
    # a line per placebo sweep, with an estimate of the time the ones left take (the first: the real sweep's)
    heads = [line for line in out.stdout.splitlines() if line.startswith("== placebo ")]
    eta = [re.fullmatch(rf"== placebo (\d)/{N_PLACEBO}: .*; ETA ~\d+m\d\ds for the (\d) left", h) for h in heads]
    assert [m and m.groups() for m in eta] == [(str(i), str(N_PLACEBO + 1 - i)) for i in range(1, N_PLACEBO + 1)], heads
    results = json.loads((tmp_path / f"runs/{name}/results.json").read_text())
    assert json.loads((tmp_path / "out.json").read_text()) == results
    placebo = results["verdict"]["placebo"]
    sweeps = placebo["sweeps"]
    assert [s["index"] for s in sweeps] == list(range(1, N_PLACEBO + 1)) and placebo["n"] == N_PLACEBO
    for s in sweeps:  # each placebo: its own run directory and data, the same trials, no oracle
        res = json.loads((tmp_path / f"runs/{name}/placebo-{s['index']}/results.json").read_text())
        assert res["best"]["test"]["sharpe"] == s["best_test_sharpe"] and res["n_trials"] == results["n_trials"]
        assert (
            res["data"]["content_hash"] != results["data"]["content_hash"] and "oracle" not in res["best"]["baselines"]
        )
        assert res["folds"] == results["folds"] and res["rounds"][0]["seed"] == results["rounds"][0]["seed"]
    # MLflow: one parent per sweep, the placebos tagged and named, each with its own children
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = {r.info.run_id: r for r in runs if "mlflow.parentRunId" not in r.data.tags}
    real = json.loads((tmp_path / f"runs/{name}/sweep.json").read_text())["mlflow"]["parent_run_id"]
    placebos = [r for r in parents.values() if "fxray.placebo" in r.data.tags]
    assert len(parents) == N_PLACEBO + 1 and len(placebos) == N_PLACEBO
    for r in placebos:
        i = r.data.tags["fxray.placebo"]
        assert r.data.tags["fxray.placebo_of"] == real and r.info.run_name == f"placebo {i} of {name}"
        assert r.info.run_id == next(s["parent_run_id"] for s in sweeps if str(s["index"]) == i)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == real]
    assert len(children) == results["n_trials"]
    assert parents[real].data.metrics["placebo_pvalue"] == pytest.approx(placebo["pvalue"])
    assert "verdict/verdict.png" in {a.path for a in client.list_artifacts(real, "verdict")}
    if not compare:
        return results
    # fxray.compare: the real sweep is the experiment's sweep, and it finds its placebos by tag
    cmp = subprocess.run(
        [sys.executable, "-m", "fxray.compare", name, "--json", "cmp.json", "--out", "cmp", "--no-log"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cmp.returncode == 0, cmp.stderr[-3000:]
    assert "is it real?" in cmp.stdout and "placebo p" in cmp.stdout
    s = json.loads((tmp_path / "cmp.json").read_text())["experiments"][0]
    assert s["parent_run_id"] == real and s["n_sweeps"] == 1
    assert s["placebo_pvalue"] == pytest.approx(placebo["pvalue"])
    v = results["verdict"]
    for key in ("spa_pvalue", "reality_check_pvalue", "stepm_kept", "pbo"):
        assert s[key] == (pytest.approx(v[key]) if isinstance(v[key], float) else v[key]), key
    assert (tmp_path / "cmp/verdict.png").stat().st_size > 10_000
    return results


@pytest.mark.slow
def test_a_planted_market_beats_every_placebo_sweep(tmp_path):
    v = placebo_sweep(tmp_path, "planted", shuffle=False)["verdict"]
    placebo = v["placebo"]
    assert placebo["pvalue"] == pytest.approx(1 / (N_PLACEBO + 1)) and placebo["rank"] == 1
    assert placebo["z"] > 3, placebo
    assert v["spa_pvalue"] < 0.05 and v["stepm_kept"]


@pytest.mark.slow
def test_its_shuffled_twin_does_not(tmp_path):
    results = placebo_sweep(tmp_path, "shuffled", shuffle=True, compare=False)  # compare: the planted test
    v, best = results["verdict"], results["best"]
    # issue 17's control: the shuffled twin's chosen trial shows no edge out of sample. Its 9
    # test days (140 hours) give a Sharpe error of ~7, so "< 1" (the GPU measurement's bar, on
    # 60 days) cannot be asked of it here: not significant is what can, and the DSR agrees
    test = best["test"]
    assert test["psr"] < 0.95 and test["sharpe"] < 2 * test["sharpe_se"], test
    assert best["dsr"] is None or best["dsr"] < 0.95, best
    placebo = v["placebo"]
    # Under the null the real sweep's rank is uniform over 1..N+1: rank 1 comes one time in four
    # with N = 3, so the rank cannot tell here. The distance can: the planted market stands more
    # than 3 placebo deviations above their mean; its shuffled twin does not.
    assert placebo["z"] < 3, placebo
    assert v["spa_pvalue"] is None or v["spa_pvalue"] > 0.05


def test_a_placebo_copy_is_made_once_and_one_of_another_sweep_is_refused(strong_cache, tmp_path):
    """Re-running `--placebo N` finds its copies made (fxray.sweep.placebo.ensure_data): kept as
    they are; a copy made for another index, seed or market is refused in one line."""
    from fxray.sweep.placebo import ensure_data
    from fxray.sweep.rundir import UsageError

    market = cache.open(strong_cache)
    real = {"data": {"path": str(strong_cache), "content_hash": market.content_hash}, "rounds": [{"seed": 0}]}
    path = tmp_path / "placebo-1" / "market.fxcache"
    ensure_data(path, real, 1)
    made = path.stat().st_mtime_ns
    ensure_data(path, real, 1)  # the re-run: the copy is there, and is this one
    assert path.stat().st_mtime_ns == made and cache.open(path).meta["placebo"]["index"] == 1
    with pytest.raises(UsageError, match=r"not placebo 2 \(seed 0\) of .*; delete .*placebo-1 to make it again"):
        ensure_data(path, real, 2)
