"""The Probability of Backtest Overfitting by combinatorially symmetric cross-validation
(CSCV; Bailey, Borwein, Lopez de Prado & Zhu, "The Probability of Backtest Overfitting",
Journal of Computational Finance 20(4), 2017).

    r = pbo(returns, n_blocks=16, periods_per_year=ppy)   # returns (T, N): hour x trial (val windows)
    r["pbo"], r["logits"], r["degradation"]

The T hours are cut into S equal blocks in time order (the first T mod S hours are
dropped so that the blocks are equal). For each of the C(S, S/2) ways to pick half of the
blocks as "in sample" (the rest out of sample): the trial with the best in-sample Sharpe
is the one a search would pick; w = the rank of its out-of-sample Sharpe among the N
trials' / (N + 1) (ranks 1..N from worst, ties averaged); its logit l = ln(w / (1 - w)).
PBO = the share of splits with l <= 0: the pick lands at or below the median out of
sample. Performance degradation: the least-squares line of the pick's out-of-sample
Sharpe on its in-sample Sharpe over the splits (a slope well below 1, or negative, is
overfitting), and the share of splits where the pick loses out of sample.

The Sharpe of a block set is mean / std (ddof 1) of its hourly returns (0 without
dispersion, as fxray.eval.pooled), annualised by periods_per_year for reading.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

N_BLOCKS = 16  # S: the paper's suggestion; C(16, 8) = 12,870 splits


def splits(n_blocks: int) -> np.ndarray:
    """(C(S, S/2), S) bool: row c marks the in-sample blocks of split c (lexicographic order)."""
    combos = np.array(list(itertools.combinations(range(n_blocks), n_blocks // 2)))
    out = np.zeros((len(combos), n_blocks), dtype=bool)
    np.put_along_axis(out, combos, True, axis=1)
    return out


def blocks_for(n_periods: int, n_blocks: int = N_BLOCKS) -> int | None:
    """S for T hours: n_blocks, or the largest even number of blocks of at least 2 hours
    that T holds; None below 4 hours."""
    s = min(n_blocks, n_periods // 2)
    s -= s % 2
    return s if s >= 2 else None


def _sharpe(total: np.ndarray, total_sq: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per-period Sharpe from sums: mean / std(ddof=1); 0 where the std vanishes."""
    mean = total / count
    var = np.maximum(total_sq - count * mean**2, 0.0) / (count - 1)
    std = np.sqrt(var)
    tiny = std <= 1e-12 * np.maximum(np.abs(mean), 1e-300)
    return np.where(tiny, 0.0, mean / np.where(tiny, 1.0, std))


def pbo(returns: np.ndarray, n_blocks: int = N_BLOCKS, periods_per_year: float = 1.0) -> dict | None:
    """PBO of the N trials (columns) of `returns` (T, N) by CSCV with S = blocks_for(T,
    n_blocks) blocks; None with fewer than 2 trials or 4 hours, or when every trial's returns
    are the same (no search to overfit: ties averaged, each split's pick would sit at the
    median, logit 0, and PBO would read 1; seen when every trial of a sweep stayed flat)."""
    from scipy.stats import rankdata  # here: the sweep driver's start-up imports this module

    returns = np.asarray(returns, dtype=np.float64)
    t, n = returns.shape
    s = blocks_for(t, n_blocks)
    if n < 2 or s is None or bool((returns == returns[:, :1]).all()):
        return None
    size = t // s
    x = returns[t - size * s :].reshape(s, size, n)  # (S, size, N): drop the first T mod S hours
    block_sum, block_sq = x.sum(axis=1), (x**2).sum(axis=1)  # (S, N)
    ins = splits(s).astype(np.float64)  # (C, S)
    outs = 1.0 - ins
    count = size * s / 2.0
    is_sr = _sharpe(ins @ block_sum, ins @ block_sq, count)  # (C, N)
    oos_sr = _sharpe(outs @ block_sum, outs @ block_sq, count)
    pick = np.argmax(is_sr, axis=1)  # (C,) the in-sample best (first on ties)
    rows = np.arange(len(pick))
    w = rankdata(oos_sr, axis=1)[rows, pick] / (n + 1)  # its rank out of sample: 1 = worst, ties averaged
    logits = np.log(w / (1.0 - w))
    ann = math.sqrt(periods_per_year)
    is_best, oos_best = is_sr[rows, pick] * ann, oos_sr[rows, pick] * ann
    slope = intercept = r2 = None  # the line is undefined when every split's pick has one in-sample Sharpe
    if np.ptp(is_best) > 0:
        slope, intercept = (float(v) for v in np.polyfit(is_best, oos_best, 1))
        r2 = float(np.corrcoef(is_best, oos_best)[0, 1] ** 2)
    return {
        "pbo": float(np.mean(logits <= 0)),
        "n_trials": n,
        "n_periods": t,
        "n_blocks": s,
        "n_splits": len(pick),
        "logits": logits,
        "degradation": {
            "slope": slope,
            "intercept": intercept,
            "r2": r2,
            "is_sharpe_mean": float(is_best.mean()),
            "oos_sharpe_mean": float(oos_best.mean()),
        },
        "prob_oos_loss": float(np.mean(oos_best < 0)),
        "is_sharpe": is_best,
        "oos_sharpe": oos_best,
    }


def json_safe(result: dict) -> dict:
    """The result without its per-split arrays (12,870 values each): what results.json keeps."""
    return {k: v for k, v in result.items() if k not in ("logits", "is_sharpe", "oos_sharpe")}
