"""fxray.compare, `fxray.train --from-run` and `fxray.export RUN_ID` on a real MLflow store (sqlite,
temp dir), no mocks.

Two experiments share one store:
  "t"  a real sweep: `python -m fxray.tune` on a tiny config (3 trials x 2 folds, ~25 s here),
       run once for the tests of this file (conftest.py keeps them in one xdist process);
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
folds: {train: 4d, val: 2d, test: 2d, max_folds: 2, holdout: 1d}  # epochs chosen on the last day of train
dqn: {num_envs: 16, batch_size: 64, hidden: 16, buffer_steps: 32, episode_len: 32,
      epochs: 2, steps_per_epoch: 20, patience: 2}
search:
  lr: {type: loguniform, low: 1.0e-4, high: 3.0e-3}
  gamma: {type: uniform, low: 0.8, high: 0.99}
sweep: {trials: 3, seed: 0, grace_folds: 2, reduction_factor: 2, cpu_per_trial: 0.25}
"""
FOLDS_B = [[k, [0, 10], [12, 14], [16, 18]] for k in range(3)]  # index ranges: only their count matters here
HOURS_B = 100  # test (and val) hours per fold
PPY_B = 6000.0  # the periods per year the "b" sweep logged
STARTED_B = 6  # trials the "b" sweep started (two never finished a fold)
COST_B = 4e-5


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
    (d / "b.yaml").write_text("name: b\nsearch:\n  lr: {type: loguniform, low: 1.0e-5, high: 1.0e-3}\n")
    tracker = Tracker(uri, "b", sweep_tags=tags, run_name="sweep b", experiment_file=d / "b.yaml")
    for tid, trial in expected_b()["trials"].items():
        for k, fold in enumerate(trial["folds"]):
            params = {"lr": trial["lr"], "gamma": 0.9, "cost": COST_B}
            tracker.log_fold(tid, f"trial-{tid}", params, FoldRecord.from_flat({"fold": k, **fold}))
        tracker.client.set_terminated(tracker.children[tid], "FINISHED")
    tracker.end_sweep("FINISHED", {"periods_per_year": PPY_B, "n_trials_counted": STARTED_B})
    env = {**os.environ, "FXRAY_CACHE_DIR": str(d / "cache"), "MLFLOW_TRACKING_URI": uri, "PYTHONWARNINGS": "ignore"}
    env.pop("RAY_ADDRESS", None)
    return d, uri, env


def periods(rng, drift, hours=HOURS_B):
    net = drift + 1e-3 * rng.standard_normal(hours)
    units = (rng.random(hours) < 0.3).astype(float)
    return {
        "net": list(net),
        "units": list(units),
        "hours": list(range(hours)),
        "n_bars": 60 * hours,
        "n_trades": int(units.sum()),
        "n_days": hours // 24,
    }


def expected_b() -> dict:
    """Four trials; "late" has the best score but ran 1 of 3 folds (stopped by ASHA), so the
    best is "good" (as fxray.track.results.best_trial picks). Each fold: hourly val and test
    returns, the references' on the test window, the running score."""
    rng = np.random.default_rng(7)
    spec = {
        "good": (2e-4, [1.5, 2.0, 2.5]),
        "meh": (1e-4, [0.5, 1.0, 0.0]),
        "bad": (0.0, [-1.0, 0.2, 0.1]),
        "late": (5e-5, [9.0]),
    }  # hourly drift, the running score after each fold
    trials = {}
    for i, (tid, (drift, scores)) in enumerate(spec.items()):
        folds = []
        for k, score in enumerate(scores):
            refs = {
                "oracle": {"test": periods(rng, 3e-4)},
                "ridge": {"test": periods(rng, 1e-4)},
                "buy_and_hold": {"test": periods(rng, 0.0)},
            }
            folds.append(
                {
                    "val_sharpe": 1.0 + i,
                    "test_sharpe": 0.3 * i,
                    "bh_test_sharpe": -0.5 + k,
                    "test_turnover": 0.01 * (k + 1),
                    "score": score,
                    "val_periods": periods(rng, drift),
                    "test_periods": periods(rng, drift),
                    "baseline_periods": refs,
                }
            )
        trials[tid] = {"lr": 1e-4 * (i + 1), "folds": folds}
    return {"trials": trials}


def pooled_ref(windows, ppy=PPY_B):
    """Sharpe, SE (Lo/Mertens with scipy's moments) and PSR(0) of concatenated hourly nets."""
    r = np.concatenate([w["net"] for w in windows])
    sr = np.mean(r) / np.std(r, ddof=1)
    g3, g4 = stats.skew(r), stats.kurtosis(r, fisher=False)
    se = math.sqrt((1 - g3 * sr + (g4 - 1) / 4 * sr**2) / (len(r) - 1))
    return sr * math.sqrt(ppy), se * math.sqrt(ppy), stats.norm.cdf(sr / se)


def ref_dsr(best_windows, all_windows, n_trials):
    """DSR on SE-normalised trial Sharpes, from the formulas (Bailey & Lopez de Prado 2014)."""
    g = 0.5772156649015329
    z = [s / se for s, se, _ in (pooled_ref(w) for w in all_windows)]
    z0 = math.sqrt(np.var(z, ddof=1)) * (
        (1 - g) * stats.norm.ppf(1 - 1 / n_trials) + g * stats.norm.ppf(1 - 1 / (n_trials * math.e))
    )
    sr, se, _ = pooled_ref(best_windows)
    return stats.norm.cdf(sr / se - z0)


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

    # "b": every number against an independent computation on what was logged
    b, trials = got["b"], expected_b()["trials"]
    assert b["n_trials"] == 4 and b["n_folds"] == 3 and b["n_trials_counted"] == STARTED_B
    assert b["best"]["run_name"] == "trial-good"  # "late" scored higher on 1 fold of 3
    assert b["best_score"] == 2.5 and b["median_score"] == pytest.approx(np.median([2.5, 0.0, 0.1, 9.0]))
    for row, fold in zip(b["best"]["folds"], trials["good"]["folds"], strict=True):
        for key in ("val_sharpe", "test_sharpe", "bh_test_sharpe", "test_turnover"):
            # a window Sharpe of exactly 0.0 is "undefined" (fxray.eval.metrics): not logged, n/a here
            assert row[key] == (None if key.endswith("sharpe") and fold[key] == 0.0 else fold[key]), key
        assert row["flat_test_sharpe"] == 0.0
    good = trials["good"]["folds"]
    for window in ("val", "test"):
        sr, se, psr = pooled_ref([f[f"{window}_periods"] for f in good])
        s = b["best"][window]
        assert s["sharpe"] == pytest.approx(sr, rel=1e-12) and s["sharpe_se"] == pytest.approx(se, rel=1e-9)
        assert s["psr"] == pytest.approx(psr, abs=1e-9) and s["n_periods"] == 3 * HOURS_B
    test = b["best"]["test"]
    net = np.concatenate([f["test_periods"]["net"] for f in good])
    units = np.concatenate([f["test_periods"]["units"] for f in good])
    gross = net + COST_B * units
    assert test["break_even_cost"] == pytest.approx(gross.sum() / units.sum(), rel=1e-12)
    for k in (2, 3):
        r = gross - k * COST_B * units
        assert test[f"sharpe_{k}x"] == pytest.approx(r.mean() / r.std(ddof=1) * math.sqrt(PPY_B), rel=1e-12)
    oracle, _, _ = pooled_ref([f["baseline_periods"]["oracle"]["test"] for f in good])
    assert b["best"]["baselines"]["oracle"]["sharpe"] == pytest.approx(oracle, rel=1e-12)
    assert test["oracle_share"] == pytest.approx(test["sharpe"] / oracle, rel=1e-12)
    dsr = ref_dsr(
        [f["test_periods"] for f in good], [[f["test_periods"] for f in t["folds"]] for t in trials.values()], STARTED_B
    )
    assert b["best"]["dsr"] == pytest.approx(dsr, abs=1e-9) and 0.01 < dsr < 0.99  # deflation bites, no saturation

    # "t": the real sweep, against the results.json it wrote
    t = got["t"]
    best = sweep_t["best"]
    assert t["n_trials"] == sweep_t["n_trials"] == 3
    assert t["best"]["run_name"] == f"trial-{best['trial_id']}"
    assert t["best_score"] == pytest.approx(best["score"], abs=1e-12)
    for window in ("val", "test"):
        for key in ("sharpe", "sharpe_se", "psr", "n_periods", "n_trades", "break_even_cost"):
            assert t["best"][window][key] == pytest.approx(best[window][key], rel=1e-12), (window, key)
    assert t["best"]["dsr"] == pytest.approx(best["dsr"], abs=1e-12)
    assert t["best"]["n_trials_counted"] == best["n_trials_counted"] == 3
    folds = next(x for x in sweep_t["trials"] if x["trial_id"] == best["trial_id"])["folds"]
    for row, fold in zip(t["best"]["folds"], folds, strict=True):
        assert row["test_sharpe"] == fold["test"]["sharpe"] and row["bh_test_sharpe"] == fold["bh_test_sharpe"]
        assert row["test_turnover"] == fold["test"]["turnover"]

    # the report says it in words; the PNGs, and the PNGs on each sweep's parent run
    assert "== b: sweep run" in out.stdout and "chosen trial-good" in out.stdout
    assert "best" not in out.stdout.lower()  # one word for one thing: the chosen trial (as fxray tune says)
    assert f"DSR {b['best']['dsr']:.3f}" in out.stdout and "verdict: " in out.stdout
    assert "at 2x cost" in out.stdout and "break-even cost" in out.stdout and "share of the oracle" in out.stdout
    client = MlflowClient(uri)
    for e in got.values():
        logged = {a.path for a in client.list_artifacts(e["parent_run_id"], "compare")}
        assert logged == {f"compare/{p}" for p in compare.PLOTS}
    for p in compare.PLOTS:
        assert (d / "cmp" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_reads_the_search_space_from_the_parent_runs_experiment_yaml(store):
    """The run directory's experiment file, logged when the parent run was created: the space
    of importance.png."""
    _, uri, _ = store
    exp = compare.load_experiment(MlflowClient(uri), "b", uri)
    assert list(exp["space"]) == ["lr"] and set(compare.importance(exp)) == {"lr"}


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
    # the sweep chose its epochs on holdout windows: --from-run must read them back from the
    # fxray.folds tag (else it trains on all of train and chooses on val: other numbers)
    assert all(f["holdout"][1] <= f["val"][0] for f in sweep_t["folds"])
    run = client.search_runs([exp.experiment_id], f"tags.`fxray.trial_id` = '{trial['trial_id']}'")[0]
    out = run_cli("fxray.train", ["--from-run", run.info.run_id, "--device", "cpu", "--json", d / "again.json"], env, d)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    again = json.loads((d / "again.json").read_text())
    assert again["from_run"]["reproduced"] and again["from_run"]["max_abs_diff"] == 0.0
    assert [f["fold"] for f in again["folds"]] == sweep_t["folds"]  # the same windows, holdouts too
    assert again["content_hash"] == sweep_t["data"]["content_hash"]
    for fold, logged in zip(again["folds"], trial["folds"], strict=True):
        assert fold["val"]["sharpe"] == logged["val"]["sharpe"]  # bitwise: ==, not approx
        assert fold["test"]["sharpe"] == logged["test"]["sharpe"]
        assert fold["test_periods"] == logged["test_periods"]
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


# --- fxray.export RUN_ID --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")  # mlflow's own
def test_export_a_sweeps_run_and_reproduce_its_last_folds_test_metrics(store, sweep_t, tmp_path):
    """`fxray.export RUN_ID` of a trial of the real sweep, then `fxray.backtest --window test`:
    the metrics MLflow logged for the last fold's test window, every one of them, bit for bit
    (CPU)."""
    from fxray.track.records import MLFLOW_NAMES, UNDEFINED_AT_ZERO, WINDOW_METRICS

    _, uri, env = store
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    trial = next(x for x in runs if "mlflow.parentRunId" in x.data.tags)
    run_id = trial.info.run_id
    export = [run_id, "--out", tmp_path / "policy", "--json", tmp_path / "manifest.json"]
    r = run_cli("fxray.export", export, env, tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["model"]["source"]["run_id"] == run_id and [m["name"] for m in manifest["members"]] == ["fold1"]
    logged_score = client.get_metric_history(run_id, "val_score")
    assert manifest["members"][0]["val_score"] == next(m.value for m in logged_score if m.step == 1)
    backtest = ["--policy", tmp_path / "policy", "--data", manifest["data"]["path"], "--window", "test"]
    r = run_cli("fxray.backtest", [*backtest, "--device", "cpu", "--json", tmp_path / "bt.json"], env, tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "bt.json").read_text())["policy"]["metrics"]
    logged = {
        k: [m.value for m in client.get_metric_history(run_id, f"test_{MLFLOW_NAMES.get(k, k)}") if m.step == 1]
        for k in WINDOW_METRICS
    }
    for k in WINDOW_METRICS:  # every metric MLflow holds, the backtest gives; an undefined ratio is not logged
        if k in UNDEFINED_AT_ZERO and got[k] == 0.0:
            assert logged[k] == [], k
        else:
            assert logged[k] == [float(got[k])], k
    r = run_cli("fxray.export", ["f" * 32, "--out", tmp_path / "p2"], env, tmp_path)
    assert r.returncode == 2 and "no such run" in r.stderr and not (tmp_path / "p2").exists()


def test_config_round_trips_through_mlflow_params():
    """What the sweep logs (str of each value) comes back with the same values AND types."""
    cfg = DQNConfig(
        lr=0.0006471234567891234, gamma=0.9361, reward_scale=10000, cost=0, graphs=False, matmul="fp32", hidden=24
    )
    params = {k: str(v) for k, v in cfg.as_dict().items()}
    back = train.config_from_params(params, "r")
    assert back == cfg
    assert {k: type(v) for k, v in back.as_dict().items()} == {k: type(v) for k, v in cfg.as_dict().items()}
    with pytest.raises(ValueError, match="param hidden='wide' is not a valid int"):
        train.config_from_params({**params, "hidden": "wide"}, "r")


@pytest.mark.slow
def test_the_sweep_reports_the_vote_of_its_full_trials(store, sweep_t, one_torch_thread):
    """results.json's "ensemble": all the trials that ran every fold, best val first, voting;
    pooled over the chosen trial's test windows with the oracle's share; on the last screen, in
    the parent run and in fxray compare. The sweep's worker votes on both workers' threads; the
    same vote here on one thread gives the same numbers."""
    d, uri, env = store
    n_folds = len(sweep_t["folds"])
    full = sorted(
        (t for t in sweep_t["trials"] if t["status"] == "ok" and t["folds_done"] >= n_folds),
        key=lambda t: t["val"]["sharpe"],
        reverse=True,
    )
    vote = sweep_t["ensemble"]
    assert vote["combine"] == "vote" and "skipped" not in vote
    assert vote["members"] == [t["trial_id"] for t in full] and vote["n_members"] == len(full) == 3
    best = sweep_t["best"]
    assert (
        vote["test"]["n_periods"] == best["test"]["n_periods"] and vote["val"]["n_periods"] == best["val"]["n_periods"]
    )
    oracle = best["baselines"]["oracle"]["sharpe"]
    assert vote["test"]["oracle_share"] == pytest.approx(vote["test"]["sharpe"] / oracle)
    from fxray.data import cache
    from fxray.rl.device import DeviceData
    from fxray.sweep.vote import vote_of_full_trials

    again = vote_of_full_trials(sweep_t, DeviceData(cache.open(sweep_t["data"]["path"])))
    assert {w: again[w] for w in ("val", "test")} == {w: vote[w] for w in ("val", "test")}
    # deflated by the same trials and N as the best trial (whose DSR is recomputed here too)
    from fxray.eval import selection

    tests, n = [t["test"] for t in sweep_t["trials"]], best["n_trials_counted"]
    assert best["dsr"] == pytest.approx(selection.deflated(best["test"], tests, n)["dsr"])
    assert vote["dsr"] == pytest.approx(selection.deflated(vote["test"], tests, n)["dsr"]) and 0 < vote["dsr"] < 1
    assert vote["n_trials_counted"] == n and vote["dsr"] < vote["test"]["psr"]
    screen = (d / "runs/t/summary.md").read_text()
    assert (
        f"vote of the 3 trials that ran every fold (members chosen on val only): {vote['test']['sharpe']:+.2f}"
        in screen
    )
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t")
    (parent,) = client.search_runs([exp.experiment_id], "metrics.best_test_sharpe > -1e9")  # the sweep's run
    assert parent.data.metrics["ensemble_test_sharpe"] == pytest.approx(vote["test"]["sharpe"])
    assert parent.data.metrics["ensemble_members"] == 3
    assert parent.data.metrics["ensemble_test_dsr"] == pytest.approx(vote["dsr"])
    out = run_cli("fxray.compare", ["t", "--tracking-uri", uri, "--no-log", "--json", d / "cv.json"], env, d)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"vote of the 3 trials that ran every fold (the sweep's record): {vote['test']['sharpe']:+.2f}" in out.stdout
    (got,) = json.loads((d / "cv.json").read_text())["experiments"]
    assert got["ensemble"]["test_sharpe"] == pytest.approx(vote["test"]["sharpe"])
    assert got["ensemble"]["dsr"] == pytest.approx(vote["dsr"]) and f"; DSR {vote['dsr']:.3f}" in out.stdout


def test_a_vote_is_the_majority_of_the_members_greedy_actions():
    """fxray.sweep.vote.votes against a plain count: ties go to the lower action, as argmax."""
    import numpy as np
    import torch

    from fxray.sweep.vote import votes

    rng = np.random.default_rng(0)
    members = rng.integers(0, 3, size=(4, 50, 3, 3)).astype(np.float32)  # small integers: many ties
    combined = torch.stack([votes(torch.from_numpy(q)) for q in members]).mean(0).argmax(-1).numpy()
    want = np.zeros((50, 3), dtype=int)
    for t in range(50):
        for p in range(3):
            counts = [0, 0, 0]
            for q in members:
                row = list(q[t, p])
                counts[row.index(max(row))] += 1
            want[t, p] = counts.index(max(counts))
    assert (combined == want).all()
    assert len({tuple(c) for c in combined.reshape(-1, 3)}) > 1  # not one action everywhere


def test_a_vote_that_cannot_run_says_why_and_the_results_are_written_anyway(tmp_path):
    """Fewer than 3 full trials, or a missing checkpoint (seeds > 1 writes none): "skipped" with
    the reason, on the last screen too; an error inside the vote is recorded, not raised."""
    from fxray.sweep.vote import vote_of_full_trials
    from fxray.track.report import vote_line
    from fxray.track.results import run_ensemble

    def trial(tid, sharpe, folds_done=2):
        return {"trial_id": tid, "status": "ok", "folds_done": folds_done, "val": {"sharpe": sharpe}}

    results = {
        "folds": [{"k": 0}, {"k": 1}],
        "storage": str(tmp_path),
        "trials": [trial("a", 1.0), trial("b", 3.0), trial("c", 9.0, folds_done=1)],
    }
    two = vote_of_full_trials(results, data=None)  # skipped before the data is read
    assert two["members"] == ["b", "a"] and two["skipped"] == "2 trial(s) ran every fold; a vote needs 3"
    assert vote_line(two).endswith("not run: 2 trial(s) ran every fold; a vote needs 3")
    results["trials"].append(trial("d", 2.0))
    (tmp_path / "checkpoints" / "b").mkdir(parents=True)
    for k in (0, 1):
        (tmp_path / "checkpoints" / "b" / f"fold{k}.safetensors").write_bytes(b"")
    three = vote_of_full_trials(results, data=None)
    assert three["n_members"] == 3 and three["skipped"].startswith("4 checkpoint(s) missing, e.g. ")
    assert str(tmp_path / "checkpoints" / "d" / "fold0.safetensors") in three["skipped"]

    def broken(_results):
        raise KeyError("periods_per_year")

    failed = run_ensemble(broken, results)
    assert failed["skipped"] == "failed: KeyError: 'periods_per_year'" and failed["wall_s"] >= 0


def test_a_thin_vote_shows_no_psr():
    """The shuffled twin's vote went nearly flat (8 trades, 5 active hours): its PSR of 0.98 is
    not evidence, so the line names the thin evidence and leaves the PSR out."""
    from fxray.track.report import vote_line

    def stats(evidence, n_active):
        return {"sharpe": 6.76, "sharpe_se": 3.42, "psr": 0.976, "evidence": evidence, "n_active": n_active,
                "n_trades": 8, "oracle_share": None}  # fmt: skip

    thin = vote_line({"n_members": 13, "test": stats("thin", 5)})
    assert "(thin: 5 active hours)" in thin and "0.976" not in thin and thin.endswith("too few active hours for a PSR")
    assert vote_line({"n_members": 13, "test": stats("ok", 40)}).endswith("8 trades; PSR 0.976")
    # deflated as the best trial is (fxray.track.results.run_ensemble), when the sweep says so
    deflated = {"n_members": 13, "test": stats("ok", 40), "dsr": 0.039, "n_trials_counted": 64}
    assert vote_line(deflated).endswith("PSR 0.976, DSR 0.039 (deflated for the 64 trials its members came from)")
    assert "DSR" not in vote_line({**deflated, "test": stats("thin", 5)})
