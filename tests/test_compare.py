"""fxray.compare and `fxray.train --from-run` on a real MLflow store (sqlite, temp dir), no mocks.

Two experiments share one store:
  "t"  a real sweep: `python -m fxray.tune` on a tiny config (3 trials x 2 folds, ~25 s here);
  "b"  logged directly through fxray.mlruns.Tracker with hand-chosen numbers (milliseconds),
       so the table's numbers can be checked against values we know exactly.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats

from fxray import compare, train
from fxray.rl.config import DQNConfig

TINY = """\
name: t
data: {synth: {n_bars: 20000, seed: 0}}
folds: {train: 6d, val: 2d, test: 2d, max_folds: 2}
dqn: {num_envs: 16, batch_size: 64, hidden: 16, buffer_steps: 32, episode_len: 32,
      epochs: 2, steps_per_epoch: 20, patience: 2}
search:
  lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}
  gamma: {type: uniform, low: 0.8, high: 0.99}
sweep: {trials: 3, seed: 0, grace_folds: 2, reduction_factor: 2, cpu_per_trial: 0.25}
"""
FOLDS_B = [[k, [0, 10], [12, 14], [16, 18]] for k in range(3)]  # index ranges: only their count matters here
DAYS_B = 20  # test days per fold


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(dir, uri, env): the store holding experiment "b" (hand-made numbers, see expected_b)."""
    from fxray.track.records import FoldRecord
    from fxray.track.runs import Tracker

    d = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    tags = {
        "fxray.experiment": "b",
        "fxray.dataset_hash": "0" * 32,
        "fxray.profile": "cpu",
        "fxray.folds": json.dumps(FOLDS_B),
    }
    tracker = Tracker(uri, "b", sweep_tags=tags, run_name="sweep b")
    for tid, trial in expected_b()["trials"].items():
        for k, fold in enumerate(trial["folds"]):
            tracker.log_fold(
                tid, f"trial-{tid}", {"lr": trial["lr"], "gamma": 0.9}, FoldRecord.from_flat({"fold": k, **fold})
            )
        tracker.client.set_terminated(tracker.children[tid], "FINISHED")
    tracker.client.set_terminated(tracker.parent_run_id, "FINISHED")
    env = {**os.environ, "FXRAY_CACHE_DIR": str(d / "cache"), "MLFLOW_TRACKING_URI": uri, "PYTHONWARNINGS": "ignore"}
    env.pop("RAY_ADDRESS", None)
    return d, uri, env


def expected_b() -> dict:
    """Four trials; "late" has the best mean val Sharpe but ran 1 of 3 folds (stopped by ASHA),
    so the best is "good" (as fxray.tracking.best_trial picks)."""
    rng = np.random.default_rng(7)
    spec = {
        "good": (0.004, [1.5, 2.0, 2.5]),
        "meh": (0.002, [0.5, 1.0, 0.0]),
        "bad": (0.001, [-1.0, 0.2, 0.1]),
        "late": (0.0015, [9.0]),
    }  # daily drift, val Sharpe per fold
    trials = {}
    for i, (tid, (drift, vals)) in enumerate(spec.items()):
        folds = [
            {
                "val_sharpe": v,
                "test_sharpe": 0.3 * v + i,
                "bh_test_sharpe": -0.5 + k,
                "test_turnover": 0.01 * (k + 1),
                "test_daily_returns": list(drift + 0.01 * rng.standard_normal(DAYS_B)),
            }
            for k, v in enumerate(vals)
        ]
        trials[tid] = {"lr": 1e-4 * (i + 1), "folds": folds}
    return {"trials": trials}


def ref_sharpe(r):
    return np.mean(r) / np.std(r, ddof=1)


def ref_dsr(r, trial_returns):
    """Bailey & Lopez de Prado (2014) from the formulas, with scipy's moments: (PSR(0), DSR)."""
    n, g = len(trial_returns), 0.5772156649015329
    v = np.var([ref_sharpe(x) for x in trial_returns], ddof=1)
    sr0 = math.sqrt(v) * ((1 - g) * stats.norm.ppf(1 - 1 / n) + g * stats.norm.ppf(1 - 1 / (n * math.e)))
    sr, g3, g4 = ref_sharpe(r), stats.skew(r), stats.kurtosis(r, fisher=False)

    def psr(bench):
        return stats.norm.cdf((sr - bench) * math.sqrt(len(r) - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr**2))

    return psr(0.0), psr(sr0), sr0


@pytest.fixture(scope="module")
def sweep_t(store):
    """A real tiny sweep into the same store: experiment "t"."""
    d, uri, env = store
    (d / "tiny.yaml").write_text(TINY)
    out = subprocess.run(
        [sys.executable, "-m", "fxray.tune", "--experiment", "tiny.yaml", "--num-cpus", "2"],
        env=env,
        cwd=d,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((d / "runs/t/results.json").read_text())


def run_cli(module, args, env, cwd):
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


# --- compare ----------------------------------------------------------------------------


@pytest.mark.slow
def test_compare_table_matches_the_runs(store, sweep_t):
    d, uri, env = store
    out = run_cli(
        "fxray.compare", ["t", "b", "--tracking-uri", uri, "--out", d / "cmp", "--json", d / "cmp.json"], env, d
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = {e["experiment"]: e for e in json.loads((d / "cmp.json").read_text())["experiments"]}

    # "b": every number against what was logged
    b, trials = got["b"], expected_b()["trials"]
    means = {tid: np.mean([f["val_sharpe"] for f in t["folds"]]) for tid, t in trials.items()}
    assert b["n_trials"] == 4 and b["n_folds"] == 3
    assert b["best"]["run_name"] == "trial-good"  # "late" scored higher on 1 fold of 3
    assert b["best_mean_val_sharpe"] == pytest.approx(means["good"], abs=1e-12)
    assert b["median_mean_val_sharpe"] == pytest.approx(np.median(list(means.values())), abs=1e-12)
    for row, fold in zip(b["best"]["folds"], trials["good"]["folds"], strict=True):
        for key in ("val_sharpe", "test_sharpe", "bh_test_sharpe", "test_turnover"):
            assert row[key] == fold[key], key
        assert row["flat_test_sharpe"] == 0.0
    oos = b["best"]["out_of_sample"]
    returns = {tid: np.concatenate([f["test_daily_returns"] for f in t["folds"]]) for tid, t in trials.items()}
    psr, dsr, sr0 = ref_dsr(returns["good"], list(returns.values()))
    assert oos["n_days"] == 3 * DAYS_B and oos["n_trials"] == 4 == oos["n_trials_in_variance"]
    assert oos["sharpe"] == pytest.approx(ref_sharpe(returns["good"]) * math.sqrt(252), rel=1e-12)
    assert oos["psr"] == pytest.approx(psr, abs=1e-12) and oos["dsr"] == pytest.approx(dsr, abs=1e-12)
    assert oos["sr0_annualised"] == pytest.approx(sr0 * math.sqrt(252), rel=1e-12)
    assert 0.05 < dsr < psr < 0.999  # the numbers test something: deflation bites, neither saturates

    # "t": the real sweep, against the results.json it wrote
    t = got["t"]
    best = sweep_t["best"]
    assert t["n_trials"] == sweep_t["n_trials"] == 3
    assert t["best"]["run_name"] == f"trial-{best['trial_id']}"
    assert t["best_mean_val_sharpe"] == pytest.approx(best["mean_val_sharpe"], abs=1e-12)
    assert t["median_mean_val_sharpe"] == pytest.approx(
        np.median([x["mean_val_sharpe"] for x in sweep_t["trials"]]), abs=1e-12
    )
    folds = next(x for x in sweep_t["trials"] if x["trial_id"] == best["trial_id"])["folds"]
    for row, fold in zip(t["best"]["folds"], folds, strict=True):
        assert row["test_sharpe"] == fold["test"]["sharpe"] and row["bh_test_sharpe"] == fold["bh_test_sharpe"]
        assert row["test_turnover"] == fold["test"]["turnover"]
    days = np.concatenate([f["test_daily_returns"] for f in folds])
    all_days = [np.concatenate([f["test_daily_returns"] for f in x["folds"]]) for x in sweep_t["trials"]]
    psr, dsr, _ = ref_dsr(days, all_days)
    assert t["best"]["out_of_sample"]["n_days"] == len(days)
    assert t["best"]["out_of_sample"]["psr"] == pytest.approx(psr, abs=1e-12)
    assert t["best"]["out_of_sample"]["dsr"] == pytest.approx(dsr, abs=1e-12)

    # the report, the PNGs, and the PNGs on each sweep's parent run
    assert "== b: sweep run" in out.stdout and "best trial-good" in out.stdout
    assert f"DSR {b['best']['out_of_sample']['dsr']:.3f}" in out.stdout
    client = MlflowClient(uri)
    for e in got.values():
        logged = {a.path for a in client.list_artifacts(e["parent_run_id"], "compare")}
        assert logged == {f"compare/{p}" for p in compare.PLOTS}
    for p in compare.PLOTS:
        assert (d / "cmp" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dsr_inputs_are_per_period():
    """V is the variance of PER-DAY Sharpes: an annualised one's variance / 252."""
    rng = np.random.default_rng(1)
    trial_returns = [0.001 * i + 0.01 * rng.standard_normal(50) for i in range(5)]
    per_day = [ref_sharpe(r) for r in trial_returns]
    assert compare.per_period_sharpe(trial_returns[0]) == pytest.approx(per_day[0], rel=1e-12)
    assert compare.trial_sharpe_variance(trial_returns) == pytest.approx(np.var(per_day, ddof=1), rel=1e-12)
    annual = [compare.metrics.sharpe(r) for r in trial_returns]
    assert compare.trial_sharpe_variance(trial_returns) == pytest.approx(np.var(annual, ddof=1) / 252, rel=1e-12)
    assert compare.trial_sharpe_variance(trial_returns[:1]) == 0.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "experiment 'nope' not found in"),
        (["empty"], "experiment 'empty' has no fxray sweep run"),
        (["--tracking-uri", "sqlite:////no/such/mlflow.db"], "sqlite:////no/such/mlflow.db: no such sqlite file"),
    ],
)
def test_compare_bad_input_is_one_line(store, capsys, args, message):
    d, uri, _ = store
    client = MlflowClient(uri)
    if client.get_experiment_by_name("empty") is None:
        client.create_experiment("empty")
    rc = compare.main(["--tracking-uri", uri, "--out", str(d / "bad"), "--no-log", *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not (d / "bad").exists()  # nothing written


# --- train --from-run -------------------------------------------------------------------


@pytest.mark.slow
def test_from_run_reproduces_per_fold_sharpe_bitwise(store, sweep_t):
    d, uri, env = store
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t")
    trial = sweep_t["trials"][0]
    run = client.search_runs([exp.experiment_id], f"tags.`fxray.trial_id` = '{trial['trial_id']}'")[0]
    out = run_cli("fxray.train", ["--from-run", run.info.run_id, "--device", "cpu", "--json", d / "again.json"], env, d)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    again = json.loads((d / "again.json").read_text())
    assert again["from_run"]["reproduced"] and again["from_run"]["max_abs_diff"] == 0.0
    assert again["content_hash"] == sweep_t["data"]["content_hash"]
    for fold, logged in zip(again["folds"], trial["folds"], strict=True):
        assert fold["val"]["sharpe"] == logged["val"]["sharpe"]  # bitwise: ==, not approx
        assert fold["test"]["sharpe"] == logged["test"]["sharpe"]
        assert fold["test_daily_returns"] == logged["test_daily_returns"]
    assert any(f["test"]["sharpe"] != 0.0 for f in again["folds"])  # a trial that traded
    assert "reproduced bitwise" in out.stdout


@pytest.mark.slow
def test_from_run_bad_input_is_one_line(store, sweep_t, capsys, tmp_path):
    from fxray.data.synth import SynthSpec, to_cache

    d, uri, _ = store
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    trial = next(r.info.run_id for r in runs if "mlflow.parentRunId" in r.data.tags)
    parent = next(r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags)
    other = tmp_path / "other.fxcache"
    to_cache(SynthSpec(n_bars=20000, seed=1), other)
    cases = [
        (["--from-run", "0123abcd"], "--from-run 0123abcd: no such run in"),
        (["--from-run", parent], f"--from-run {parent}: not an fxray sweep trial"),
        (["--from-run", trial, "--data", str(other)], "differs from the data run"),
        (["--from-run", trial, "--set", "lr=1e-3"], "--from-run takes its config from the run"),
    ]
    for args, message in cases:
        rc = train.main(["--tracking-uri", uri, "--device", "cpu", *args])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and err.count("\n") == 1, (args, err)


def test_config_round_trips_through_mlflow_params():
    """What the sweep logs (str of each value) comes back with the same values AND types."""
    cfg = DQNConfig(
        lr=0.0006471234567891234, gamma=0.9361, reward_scale=10000, cost=0, dueling=False, matmul="fp32", hidden=24
    )
    params = {k: str(v) for k, v in cfg.as_dict().items()}
    back = train.config_from_params(params, "r")
    assert back == cfg
    assert {k: type(v) for k, v in back.as_dict().items()} == {k: type(v) for k, v in cfg.as_dict().items()}
    with pytest.raises(ValueError, match="param hidden='wide' is not a valid int"):
        train.config_from_params({**params, "hidden": "wide"}, "r")
