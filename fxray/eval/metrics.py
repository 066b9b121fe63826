"""Performance metrics: one definition shared by training, sweeps and reports.

Units and conventions (every function here follows them):

- Inputs are DAILY returns: the UTC-day sums of net per-bar LOG returns
  (`position * r - cost * |Δposition|`, r = log(close[t+1] / close[t])). Log
  returns add, so a day's sum is that day's log growth and equity = exp(cumsum).
- Annualisation uses PERIODS_PER_YEAR = 252 trading days a year.
- Every metric is a finite float. Where a ratio is undefined (fewer than 2 days,
  zero dispersion, no downside, never in the market) it is 0.0 -- "no evidence" --
  never inf or NaN, so trackers, optimisers and early stopping can compare it.
- `total_return` and `max_drawdown` are in log units; `math.expm1(x)` gives the
  fraction of equity (e.g. max_drawdown = -0.105 -> equity fell 10.0%).
- The sweep's one DSR is fxray.eval.selection.deflated (trials on a common footing, per-period
  Sharpe ratios as in Bailey & Lopez de Prado), built on `expected_max_sharpe` here.

Arrays here are tiny (one value per day): plain numpy, float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fxray.eval.pooled import sharpe_per_period

PERIODS_PER_YEAR = 252


def _as_returns(returns) -> np.ndarray:
    """1-D float64 copy of `returns`; a clear error for anything we cannot score."""
    arr = np.asarray(returns, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"daily_returns must be 1-D, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"daily_returns contains NaN or Inf ({int((~np.isfinite(arr)).sum())} values)")
    return arr


# --- per-day ratios ----------------------------------------------------------


def sharpe(daily_returns) -> float:
    """Annualised Sharpe: mean / std(ddof=1) x sqrt(PERIODS_PER_YEAR); 0.0 if < 2 days or std 0
    (fxray.eval.pooled.sharpe_per_period: the one definition).

    No risk-free rate: the returns are already those of a self-financed
    long/short position (empyrical / quantstats with rf = 0).
    """
    return sharpe_per_period(_as_returns(daily_returns)) * math.sqrt(PERIODS_PER_YEAR)


def sortino(daily_returns) -> float:
    """Annualised Sortino: mean(r) / sqrt(mean(min(r, 0)^2)) x sqrt(PERIODS_PER_YEAR) (required return 0).

    The downside deviation averages over ALL days (empyrical / quantstats), not
    only the losing ones. 0.0 if < 2 days or there is no downside (empyrical
    would return inf).
    """
    arr = _as_returns(daily_returns)
    if arr.size < 2:
        return 0.0
    downside = math.sqrt(float(np.mean(np.minimum(arr, 0.0) ** 2)))
    return float(arr.mean() / downside * math.sqrt(PERIODS_PER_YEAR)) if downside > 0 else 0.0


def max_drawdown(daily_returns) -> float:
    """Deepest fall of log equity from its running peak: min_t (cum_t - max_{s<=t} cum_s) <= 0.

    cum = cumsum of the log returns, starting from 0 (equity 1) BEFORE the first
    day, so a loss on day one is a drawdown. Log units: the equity drawdown as a
    fraction (empyrical's number) is expm1 of this. 0.0 for an empty series.
    """
    arr = _as_returns(daily_returns)
    cum = np.concatenate(([0.0], np.cumsum(arr)))
    return float(np.min(cum - np.maximum.accumulate(cum)))


def calmar(daily_returns) -> float:
    """CAGR / |max drawdown as a fraction of equity| (empyrical); 0.0 without a drawdown."""
    arr = _as_returns(daily_returns)
    mdd = -math.expm1(max_drawdown(arr))  # fraction in [0, 1)
    if arr.size == 0 or mdd <= 0:
        return 0.0
    cagr = math.expm1(float(arr.sum()) * PERIODS_PER_YEAR / arr.size)  # exp(log growth per year) - 1
    return cagr / mdd


# --- the Deflated Sharpe's benchmark (Bailey & Lopez de Prado) ---------------


def expected_max_sharpe(n_trials: int, var_sharpe: float) -> float:
    """E[max Sharpe] of `n_trials` independent zero-skill trials (Bailey & Lopez de Prado 2014).

    SR0 = sqrt(V) ((1 - gamma) Phi^-1(1 - 1/N) + gamma Phi^-1(1 - 1/(N e))).
    var_sharpe V: variance of the trials' Sharpe ratios, in the units of the
    result (per-period in, per-period out). One trial (N = 1): 0.0, the mean.
    """
    if n_trials < 1 or var_sharpe < 0:
        raise ValueError(f"need n_trials >= 1 and var_sharpe >= 0, got {n_trials}, {var_sharpe}")
    if n_trials == 1:
        return 0.0
    from scipy.stats import norm

    z = (1 - np.euler_gamma) * norm.ppf(1 - 1 / n_trials) + np.euler_gamma * norm.ppf(1 - 1 / (n_trials * math.e))
    return float(math.sqrt(var_sharpe) * z)


# --- the bundle of a window's numbers ----------------------------------------


@dataclass(frozen=True)
class Metrics:
    """The numbers reported per window (val / test / baseline). See the module doc for units."""

    sharpe: float  # annualised, daily returns
    sortino: float  # annualised, daily returns
    max_drawdown: float  # log units, <= 0
    calmar: float  # CAGR / |fractional max drawdown|
    total_return: float  # log units: sum of net log returns
    turnover: float  # mean |Δposition| per bar
    n_trades: int  # bars where the position changes
    hit_rate: float  # share of in-market bars with net return > 0
    n_days: int  # UTC days with at least one bar


def summarize(daily_returns, turnover: float = 0.0, n_trades: int = 0, hit_rate: float = 0.0) -> Metrics:
    """Bundle the day-level metrics of `daily_returns` with the bar-level ones (turnover, n_trades,
    hit_rate: fxray.eval.backtest computes them on device)."""
    arr = _as_returns(daily_returns)
    return Metrics(
        sharpe=sharpe(arr),
        sortino=sortino(arr),
        max_drawdown=max_drawdown(arr),
        calmar=calmar(arr),
        total_return=float(arr.sum()),
        turnover=float(turnover),
        n_trades=int(n_trades),
        hit_rate=float(hit_rate),
        n_days=int(arr.size),
    )
