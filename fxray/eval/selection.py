"""What choosing among trials does to a number: walk-forward selection, and the Deflated
Sharpe Ratio with every trial's Sharpe on a common footing.

    wf = walk_forward(trials, n_folds, cost, ppy)   # the returns of choosing in real time
    d = deflated(best_test_stats, [trial test stats...], n_trials_started)

`trials`: [{"trial_id", "folds": {k: {"val": periods, "test": periods}}}], the windows'
hourly returns (fxray.eval.backtest.PeriodReturns.as_dict()) of each fold a trial ran.
"""

from __future__ import annotations

import math

from fxray.eval import pooled
from fxray.eval.metrics import expected_max_sharpe


def walk_forward(trials: list[dict], n_folds: int, cost: float, periods_per_year: float) -> dict | None:
    """For each fold's test window, the trial with the best score on the val windows of
    folds 0..k (all of which end before test window k begins, when the folds' step is at
    least val + test); its test returns there; pooled over k. What choosing among these
    trials in real time would have earned. The configs themselves were proposed by a
    searcher that saw every val window: this removes the selection's look-ahead, not the
    search's. None when no trial ran a fold."""
    windows, choices = [], []
    for k in range(n_folds):
        ran = [t for t in trials if k in t["folds"] and all(j in t["folds"] for j in range(k + 1))]
        if not ran:
            continue

        def val_score(t, k=k):
            return pooled.score(pooled.pooled([t["folds"][j]["val"] for j in range(k + 1)], cost, periods_per_year))

        chosen = max(ran, key=val_score)  # ties: the first in the list (the sweep's order)
        windows.append(chosen["folds"][k]["test"])
        choices.append({"fold": k, "trial_id": chosen["trial_id"]})
    if not windows:
        return None
    return {**pooled.pooled(windows, cost, periods_per_year), "choices": choices}


def deflated(best: dict, trials: list[dict], n_trials: int) -> dict:
    """The Deflated Sharpe Ratio of the best trial's pooled Sharpe (Bailey & Lopez de Prado
    2014), with the trials' Sharpe ratios on a common footing.

    Trials ran different numbers of folds (ASHA stops some after one): their Sharpe
    estimates have different errors, and a raw variance across them mixes those errors
    with skill. So each trial enters as z = Sharpe / its standard error, which is a
    standard normal under no skill whatever its length; V = the variance of z across
    the trials; the best of N zero-skill trials reaches z0 = sqrt(V) E[max of N] by luck
    (expected_max_sharpe), and DSR = Phi(z_best - z0) = PSR(SR0) with SR0 = z0 x the best
    trial's standard error. N = every trial started (n_trials), not only those scored."""
    zs = [t["sharpe"] / t["sharpe_se"] for t in trials if t.get("sharpe_se")]
    if not best.get("sharpe_se") or len(zs) < 2:
        return {"dsr": None, "sr0": None, "var_z": None, "n_trials_counted": n_trials, "n_trials_in_variance": len(zs)}
    mean = sum(zs) / len(zs)
    var_z = sum((z - mean) ** 2 for z in zs) / (len(zs) - 1)
    z0 = expected_max_sharpe(max(n_trials, 1), var_z)
    z_best = best["sharpe"] / best["sharpe_se"]
    return {
        "dsr": pooled.normal_cdf(z_best - z0),
        "sr0": z0 * best["sharpe_se"],
        "var_z": var_z,
        "n_trials_counted": n_trials,
        "n_trials_in_variance": len(zs),
        "z": z_best,
        "z0": z0,
        "significant": pooled.normal_cdf(z_best - z0) >= 0.95 if math.isfinite(z0) else None,
    }
