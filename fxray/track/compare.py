"""Sweeps as MLflow holds them, read back and judged with the same pooled statistics as the
sweep's own results.json (fxray.compare is the command; this is its reading and its numbers).

    client, uri = open_store(uri)
    exp = load_experiment(client, "default", uri)     # the latest sweep: parent, trials, folds
    s = summarize(exp)                                # best trial, pooled val/test, DSR, ...

Each child run holds, per fold, the artifact fold_returns/fold<k>.json (fxray.track.runs:
the hourly returns of the val and test windows and of the reference rules) and the
metric `score` (the sweep's objective; its last point is the trial's). So the numbers
here are recomputed from what was logged, not copied from results.json.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from fxray.eval import snooping
from fxray.track.results import chosen, judge, trial_label
from fxray.track.runs import RETURNS_DIR
from fxray.track.verdict import KEYS, add_placebo

DEFAULT_PPY = 6261.0  # periods per year of a 24x5 market, for sweeps that did not log theirs


class CompareError(ValueError):
    """Bad input (unknown experiment, no runs, no store): one line, exit code 2."""


def open_store(uri: str | None):
    """An MlflowClient on the existing store `uri` (fxray.track.runs.open_store), the fluent
    API pointed at it too."""
    import mlflow

    from fxray.track.runs import open_store as open_client

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one per small download
    try:
        client, uri = open_client(uri)
    except ValueError as e:
        raise CompareError(str(e)) from None
    mlflow.set_tracking_uri(uri)
    return client, uri


def sweep_experiments(client) -> list[str]:
    """Names of the experiments holding at least one fxray sweep (a run tagged with its folds)."""
    import mlflow

    exps = client.search_experiments()
    runs = mlflow.search_runs([e.experiment_id for e in exps], "tags.`fxray.folds` != ''", output_format="list")
    ids = {r.info.experiment_id for r in runs}
    return [e.name for e in exps if e.experiment_id in ids]


def read_folds(client, run_id: str, dst: Path) -> list[dict]:
    """A child run's folds as FoldRecord flat dicts (enough for fxray.track.results.pooled_stats)."""
    if not client.list_artifacts(run_id, RETURNS_DIR):
        return []
    dst.mkdir(parents=True)
    local = Path(client.download_artifacts(run_id, RETURNS_DIR, str(dst)))
    # fold_returns' keys (fxray.track.runs) -> FoldRecord's
    names = {"val": "val_periods", "test": "test_periods", "baselines": "baseline_periods"}
    folds = []
    for path in local.glob("fold*.json"):
        r = {names.get(k, k): v for k, v in json.loads(path.read_text()).items()}
        folds.append({"test_daily_returns": [], **r})
    return sorted(folds, key=lambda f: f["fold"])


def load_experiment(client, name: str, uri: str) -> dict:
    """The latest sweep of experiment `name`: its parent run, folds and trials (child runs)."""
    import mlflow

    exp = client.get_experiment_by_name(name)
    if exp is None:
        known = ", ".join(sweep_experiments(client)) or "none"
        raise CompareError(f"experiment {name!r} not found in {uri} (fxray sweeps there: {known})")
    runs = mlflow.search_runs([exp.experiment_id], output_format="list")
    sweeps = [r for r in runs if "fxray.folds" in r.data.tags and "mlflow.parentRunId" not in r.data.tags]
    parents = [r for r in sweeps if "fxray.placebo" not in r.data.tags]  # a placebo sweep is not the experiment's
    if not parents:
        raise CompareError(f"experiment {name!r} has no fxray sweep run in {uri} (run python -m fxray.tune)")
    parent = max(parents, key=lambda r: r.info.start_time)
    # the placebo sweeps of this one (fxray.tune --placebo): their best trial's pooled test Sharpe, as
    # each logged it in its parent's summary (recomputing it would download every placebo trial's folds)
    placebos = [
        r.data.metrics["best_test_sharpe"]
        for r in sweeps
        if r.data.tags.get("fxray.placebo_of") == parent.info.run_id
        and r.info.status == "FINISHED"
        and "best_test_sharpe" in r.data.metrics
    ]
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            if r.data.tags.get("mlflow.parentRunId") != parent.info.run_id:
                continue
            folds = read_folds(client, r.info.run_id, Path(tmp) / r.info.run_id)
            if not folds:  # a trial with no finished fold has nothing to compare
                continue
            score = client.get_metric_history(r.info.run_id, "score")
            per_fold = {
                k: {m.step: m.value for m in client.get_metric_history(r.info.run_id, k)}
                for k in ("val_sharpe", "test_sharpe", "bh_test_sharpe", "test_turnover")
            }
            trials.append(
                {
                    "trial_id": r.data.tags.get("fxray.trial_id", r.info.run_id),
                    "run_id": r.info.run_id,
                    "name": r.info.run_name,
                    "params": dict(r.data.params),
                    "folds": folds,
                    "folds_done": len(folds),
                    # no score logged (a diverged trial's): undefined, never 0
                    "score": max(score, key=lambda m: m.step).value if score else None,
                    "status": r.data.tags.get("fxray.status")
                    or ("ok" if all(f["status"] == "ok" for f in folds) else "diverged"),
                    "per_fold": per_fold,
                }
            )
    if not trials:
        raise CompareError(f"experiment {name!r}: sweep run {parent.info.run_id} has no trial with a finished fold")
    return {
        "name": name,
        "experiment_id": exp.experiment_id,
        "parent": parent,
        "n_sweeps": len(parents),
        "n_folds": len(json.loads(parent.data.tags["fxray.folds"])),
        "trials": trials,
        "placebo_best_test_sharpe": placebos,
    }


def summarize(exp: dict) -> dict:
    """The comparison numbers of one loaded experiment: the best trial's pooled val and test
    statistics beside the references', its share of the oracle, DSR with N = every trial the
    sweep started, walk-forward selection, and the per-fold rows for tables."""
    trials, parent = exp["trials"], exp["parent"]
    metrics = parent.data.metrics
    cost = float(trials[0]["params"].get("cost", 0.0))
    ppy = float(metrics.get("periods_per_year", DEFAULT_PPY))
    n_started = int(metrics.get("n_trials_counted", len(trials)))
    best = chosen(trials, exp["n_folds"])
    if best is None:
        raise CompareError(
            f"experiment {exp['name']!r}: all {len(trials)} trials of sweep run {parent.info.run_id} diverged: "
            "no chosen trial to judge"
        )
    stats, deflated, walk, verdict = judge(trials, best, exp["n_folds"], cost, ppy, max(n_started, len(trials)))
    b = stats[best["trial_id"]]
    if exp.get("placebo_best_test_sharpe"):
        add_placebo(verdict, snooping.placebo_pvalue(b["test"]["sharpe"], exp["placebo_best_test_sharpe"]))
    pf = best["per_fold"]
    rows = [
        {"fold": f["fold"], **{k: pf[k].get(f["fold"]) for k in pf}, "flat_test_sharpe": 0.0} for f in best["folds"]
    ]
    scores = [t["score"] for t in trials if t["status"] == "ok"]
    return {
        "experiment": exp["name"],
        "experiment_id": exp["experiment_id"],
        "parent_run_id": parent.info.run_id,
        "n_sweeps": exp["n_sweeps"],
        "n_folds": exp["n_folds"],
        "n_trials": len(trials),
        "n_trials_counted": deflated["n_trials_counted"],
        "cost": cost,
        "periods_per_year": ppy,
        **{k: verdict[k] for k in KEYS},  # the "is it real" numbers; the details under "verdict"
        "verdict": verdict,
        "best_score": best["score"],
        "median_score": float(np.median(scores)) if scores else None,
        "best": {
            "run_id": best["run_id"],
            "run_name": best["name"] or trial_label(best["trial_id"]),
            "trial_id": best["trial_id"],
            "folds_done": best["folds_done"],
            "score": best["score"],
            **b,  # val, test and the references' (baselines) pooled statistics
            **deflated,
            "walk_forward": walk,
            "folds": rows,
        },
        # the vote of the full trials needs their checkpoints: the sweep's own record of it
        "ensemble": (
            {
                "n_members": int(metrics["ensemble_members"]),
                "test_sharpe": metrics["ensemble_test_sharpe"],
                "test_sharpe_se": metrics.get("ensemble_test_sharpe_se"),
                "oracle_share": metrics.get("ensemble_test_oracle_share"),
                "dsr": metrics.get("ensemble_test_dsr"),
            }
            if "ensemble_test_sharpe" in metrics
            else None
        ),
    }
