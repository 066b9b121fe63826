"""fxray.eval.metrics against independent references.

The references are re-derived here the way empyrical / quantstats write them
(pandas, simple returns and wealth for drawdowns, scipy.stats for moments) so
that a shared mistake in units or conventions would show up as a mismatch.
"""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fxray.eval import metrics

ANN = 252


def _daily(seed, n=300, mu=4e-4, sigma=1e-2, fat=False):
    rng = np.random.default_rng(seed)
    if fat:  # skewed, fat-tailed: exercises the moment terms of PSR
        return mu + sigma * (rng.standard_t(4, n) - 0.5 * rng.exponential(1.0, n))
    return rng.normal(mu, sigma, n)


# --- empyrical / quantstats-style references -----------------------------------


def ref_sharpe(r):
    s = pd.Series(r)
    return s.mean() / s.std() * np.sqrt(ANN)  # pandas std: ddof=1


def ref_sortino(r):
    s = pd.Series(r)
    downside = np.sqrt((s[s < 0] ** 2).sum() / len(s))  # quantstats
    return s.mean() / downside * np.sqrt(ANN)


def ref_max_drawdown_fraction(log_r):
    """empyrical: wealth from SIMPLE returns, starting value prepended."""
    simple = pd.Series(np.expm1(log_r))
    wealth = pd.concat([pd.Series([1.0]), (1 + simple).cumprod()], ignore_index=True)
    return ((wealth - wealth.cummax()) / wealth.cummax()).min()


def ref_calmar(log_r):
    simple = np.expm1(log_r)
    ending = np.prod(1 + simple)
    annual = ending ** (ANN / len(simple)) - 1  # empyrical annual_return
    return annual / abs(ref_max_drawdown_fraction(log_r))


def ref_psr(r, sr_star):
    sr = np.mean(r) / np.std(r, ddof=1)
    g3 = stats.skew(r)
    g4 = stats.kurtosis(r, fisher=False)
    z = (sr - sr_star) * np.sqrt(len(r) - 1) / np.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr**2)
    return stats.norm.cdf(z)


def psr_from_stats(sr: float, skew: float, kurtosis: float, n_obs: int, sr_benchmark: float = 0.0) -> float:
    """PSR from the moments (Bailey & Lopez de Prado 2012), the reference of fxray's PSR and MinTRL:
    Phi((SR - SR*) sqrt(T - 1) / sqrt(1 - g3 SR + (g4 - 1)/4 SR^2)); SR, SR* per period, g4 raw
    (normal = 3); 0.0 when T < 2 (no evidence)."""
    if n_obs < 2:
        return 0.0
    var = max(1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr * sr, 1e-300)
    return float(stats.norm.cdf((sr - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(var)))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fat", [False, True])
def test_ratios_match_reference(seed, fat):
    r = _daily(seed, fat=fat)
    assert metrics.sharpe(r) == pytest.approx(ref_sharpe(r), rel=1e-12)
    assert metrics.sortino(r) == pytest.approx(ref_sortino(r), rel=1e-12)
    assert math.expm1(metrics.max_drawdown(r)) == pytest.approx(ref_max_drawdown_fraction(r), rel=1e-10)
    assert metrics.calmar(r) == pytest.approx(ref_calmar(r), rel=1e-10)
    sr, g3, g4 = np.mean(r) / np.std(r, ddof=1), stats.skew(r), stats.kurtosis(r, fisher=False)
    for sr_star in (0.0, 0.02, -0.01):
        assert psr_from_stats(sr, g3, g4, len(r), sr_star) == pytest.approx(ref_psr(r, sr_star), abs=1e-12)


def test_max_drawdown_by_hand():
    # log equity 0 -> .1 -> -.1 -> .05 -> -.15 -> .3: deepest fall .1 -> -.15 = -.25
    r = [0.1, -0.2, 0.15, -0.2, 0.45]
    assert metrics.max_drawdown(r) == pytest.approx(-0.25)
    assert metrics.max_drawdown([-0.1, 0.05]) == pytest.approx(-0.1)  # day-one loss counts
    assert metrics.max_drawdown([0.1, 0.2]) == 0.0
    assert metrics.max_drawdown([]) == 0.0


def test_edge_cases_are_zero_not_nan():
    for f in (metrics.sharpe, metrics.sortino, metrics.calmar):
        assert f([]) == 0.0
        assert f([0.01]) == 0.0
        assert f([0.0] * 10) == 0.0
    assert metrics.sharpe([0.001] * 10) == 0.0  # std is rounding noise -> treated as 0
    assert metrics.sortino([0.01, 0.02]) == 0.0  # no downside (empyrical: inf)
    assert psr_from_stats(0.1, 0.0, 3.0, 1) == 0.0


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="NaN or Inf"):
        metrics.sharpe([0.1, float("nan")])
    with pytest.raises(ValueError, match="1-D"):
        metrics.summarize(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="n_trials"):
        metrics.expected_max_sharpe(0, 1.0)


def test_psr_normal_case_is_lo_standard_error():
    # Normal returns (g3 = 0, g4 = 3): PSR = Phi(SR sqrt(T-1) / sqrt(1 + SR^2/2)) (Lo 2002).
    sr, t = 0.08, 500
    expected = stats.norm.cdf(sr * math.sqrt(t - 1) / math.sqrt(1 + sr**2 / 2))
    assert psr_from_stats(sr, 0.0, 3.0, t) == pytest.approx(expected, abs=1e-15)


def test_dsr_numerical_example():
    # The pieces of the one DSR (fxray.eval.selection.deflated, checked whole in test_pooled.py)
    # against the DSR paper's (Bailey & Lopez de Prado 2014) numerical example, re-derived by hand:
    # 100 trials, annualised Sharpe variance 1/2, best annualised SR 2.5, T = 1250 daily
    # returns, skew -3, kurtosis 10, 250 days a year -> SR0 = 0.1132 per day, DSR = 0.9004.
    sr0 = metrics.expected_max_sharpe(100, 0.5 / 250)
    assert sr0 == pytest.approx(0.1132, abs=5e-5)
    dsr = psr_from_stats(2.5 / math.sqrt(250), -3.0, 10.0, 1250, sr0)
    assert dsr == pytest.approx(0.9004, abs=5e-5)


@pytest.mark.parametrize("n_trials", [10, 100, 1000])
def test_expected_max_sharpe_monte_carlo(n_trials):
    # E[max of N iid N(0, V)]: the formula is an approximation, within ~2% for N >= 10.
    var = 0.04
    rng = np.random.default_rng(n_trials)
    mc = rng.normal(0.0, math.sqrt(var), (4000, n_trials)).max(axis=1).mean()
    assert metrics.expected_max_sharpe(n_trials, var) == pytest.approx(mc, rel=0.03)
    assert metrics.expected_max_sharpe(1, var) == 0.0


def test_summarize_bundles():
    r = _daily(3)
    m = metrics.summarize(r, turnover=0.25, n_trades=12, hit_rate=0.5)
    assert m.sharpe == metrics.sharpe(r) and m.sortino == metrics.sortino(r)
    assert m.max_drawdown == metrics.max_drawdown(r) and m.calmar == metrics.calmar(r)
    assert m.total_return == pytest.approx(r.sum()) and m.n_days == len(r)
    assert (m.turnover, m.n_trades, m.hit_rate) == (0.25, 12, 0.5)
