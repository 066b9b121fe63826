"""What choosing does to a number: what a fold may keep, walk-forward selection, the Deflated
Sharpe Ratio with every trial's Sharpe on a common footing, and whether val ranked the trials
as test did.

    keeps(result, score)                            # a fold's policy beat flat behind enough evidence
    wf = walk_forward(trials, n_folds, cost, ppy)   # the returns of choosing in real time
    d = deflated(best_test_stats, [trial test stats...], n_trials_started)
    rho = spearman(val_scores, test_sharpes)        # did the val windows rank the trials as test did

`trials`: [{"trial_id", "folds": {k: {"val": periods, "test": periods}}}], the windows'
hourly returns (fxray.eval.backtest.PeriodReturns.as_dict()) of each fold a trial ran.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fxray.eval import pooled
from fxray.eval.metrics import expected_max_sharpe

if TYPE_CHECKING:  # no torch for the readers of results (fxray.track)
    from fxray.eval.backtest import BacktestResult

# The score's standard error counts a window's hours as independent draws, but the hours of
# one position share the decision that opened it: a window won with one or two positions (up
# to 4 position changes) or on one day is a coin or two, whatever its hours say. The lowest
# counts that refuse those, since higher ones flatten real low-turnover edges (docs/metrics.md,
# "What a fold keeps").
MIN_TRADES = 5  # position changes (>= 3 positions) below which a window's score is no evidence
MIN_DAYS = 2  # session days with a return below which it is one day's draw


def keeps(result: BacktestResult, score: float) -> bool:
    """Whether a fold keeps a policy (an epoch's weights, a seed ensemble) that scored `score`
    (fxray.eval.pooled.score) on the fold's chooser window, `result` its backtest there: it beat
    the flat policy (score > 0, flat's score) behind at least MIN_TRADES position changes on at
    least MIN_DAYS session days with a return. A fold that keeps nothing is flat."""
    return score > 0.0 and result.metrics.n_trades >= MIN_TRADES and np.count_nonzero(result.daily_returns) >= MIN_DAYS


def walk_forward(trials: list[dict], n_folds: int, cost: float, periods_per_year: float) -> dict | None:
    """For each fold's test window, the trial with the best score on the val windows of
    folds 0..k (all of which end before test window k begins, when the folds' step is at
    least val + test); its test returns there; pooled over k. What choosing among these
    trials in real time would have earned. The configs themselves were proposed by a
    searcher that saw every val window: this removes the selection's look-ahead, not the
    search's. None when no trial ran a fold."""
    windows, choices = [], []
    for k in range(n_folds):
        ran = [t for t in trials if all(j in t["folds"] for j in range(k + 1))]
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
        return {"dsr": None, "sr0": None, "n_trials_counted": n_trials}
    mean = sum(zs) / len(zs)
    var_z = sum((z - mean) ** 2 for z in zs) / (len(zs) - 1)
    z0 = expected_max_sharpe(max(n_trials, 1), var_z)
    z_best = best["sharpe"] / best["sharpe_se"]
    return {
        "dsr": pooled.normal_cdf(z_best - z0),
        "sr0": z0 * best["sharpe_se"],
        "n_trials_counted": n_trials,
        "z": z_best,
        "z0": z0,
        "significant": pooled.normal_cdf(z_best - z0) >= 0.95 if math.isfinite(z0) else None,
    }


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation of two paired lists (ties: average ranks), what
    scipy.stats.spearmanr computes; None with fewer than 3 pairs or a list of equal values."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} values against {len(y)}")
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)
