"""Pooled statistics: one number, with its error, from all the windows of a kind.

    stats = pooled([fold_a_val_periods, fold_b_val_periods, ...], cost, periods_per_year)
    stats["sharpe"], stats["sharpe_se"], stats["psr"], stats["break_even_cost"]

A window of a few days holds 3-5 daily returns: its Sharpe has a standard error of
~7 (annualised), and one lucky trade scores sqrt(252/n) whatever it earned. So
whatever selects (epochs, trials) or is reported pools the net returns of ALL the
windows of its kind -- the folds' val windows, or their test windows -- at the
period of fxray.data.calendar (an hour: ~120 per 5-day window), annualised by the
instrument's calendar. Per-window numbers (fxray.eval.metrics) are for tables.

Every statistic here (formulas and references in docs/metrics.md):
- sharpe      mean / std (ddof=1) of the period returns x sqrt(periods per year)
- sharpe_se   Lo (2002) with the skewness/kurtosis terms of Mertens (2002):
              Var(SR) = (1 - g3 SR + (g4 - 1)/4 SR^2) / (T - 1), SR per period
- psr         PSR(0) = Phi(SR / se) (Bailey & Lopez de Prado 2012)
- break_even_cost  the cost per unit of position change at which the pooled net
              return is 0 (so is the Sharpe): gross return / units traded
- sharpe_2x, sharpe_3x  the same positions re-priced at 2x and 3x the cost
- oracle_share, oracle_share_se  a policy's pooled Sharpe as a share of the oracle's on
              the same windows, and the delta-method standard error of that ratio from the
              two Sharpes' joint distribution (Ledoit & Wolf 2008)
- n_windows, flat_windows  the windows pooled, and those in which the policy never held a
              position (no period with a return): a policy that sits out most windows
              (a val choice that kept a flat epoch) shows it here, not only in its Sharpe
- evidence    "none" (no trade, or no period with a return), "thin" (fewer than
              MIN_ACTIVE periods with a return: the Sharpe of a handful of
              observations says little, and `score` shrinks it), "ok"
Undefined is not zero: with no evidence sharpe is 0.0 (flat's value) and the
ratios that need a dispersion (sharpe_se, psr, break_even_cost) are None.
"""

from __future__ import annotations

import math

import numpy as np

MIN_ACTIVE = 20  # periods with a non-zero return below which a Sharpe is thin evidence
COST_MULTIPLES = (2, 3)


def concat(windows: list[dict], key: str) -> np.ndarray:
    parts = [np.asarray(w[key], dtype=np.float64) for w in windows]
    return np.concatenate(parts) if parts else np.zeros(0)


def sharpe_per_period(returns: np.ndarray) -> float:
    """mean / std(ddof=1), 0.0 when undefined (fewer than 2 returns, no dispersion)."""
    if returns.size < 2:
        return 0.0
    std = float(returns.std(ddof=1))
    # A constant series gives std ~ 1e-19, not 0, when its mean is not exact in binary:
    # dispersion below 1e-12 of the level is none.
    return float(returns.mean() / std) if std > 1e-12 * max(abs(float(returns.mean())), 1e-300) else 0.0


def sharpe_se_per_period(returns: np.ndarray, sr: float) -> float | None:
    """Lo/Mertens standard error of the per-period Sharpe `sr` of `returns` (None if undefined)."""
    n = returns.size
    if n < 3:
        return None
    centred = returns - returns.mean()
    m2 = float(np.mean(centred**2))
    if m2 <= 0:
        return None
    skew = float(np.mean(centred**3)) / m2**1.5
    kurt = float(np.mean(centred**4)) / m2**2
    # g4 >= 1 + g3^2 for any sample: the variance term is >= (1 - g3 SR / 2)^2 >= 0
    var = max(1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr * sr, 0.0) / (n - 1)
    return math.sqrt(var)


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def pooled(windows: list[dict], cost: float, periods_per_year: float) -> dict:
    """The pooled statistics of `windows` (PeriodReturns.as_dict() each) at `cost`."""
    net, units = concat(windows, "net"), concat(windows, "units")
    n_trades = int(sum(w["n_trades"] for w in windows))
    n_bars = int(sum(w["n_bars"] for w in windows))
    ann = math.sqrt(periods_per_year)
    active = int(np.count_nonzero(net))
    evidence = "none" if n_trades == 0 or active == 0 else ("thin" if active < MIN_ACTIVE else "ok")
    out = {
        "sharpe": 0.0,
        "sharpe_se": None,
        "psr": None,
        "n_periods": int(net.size),
        "n_days": int(sum(w["n_days"] for w in windows)),
        "n_trades": n_trades,
        "turnover": float(units.sum() / n_bars) if n_bars else 0.0,
        "hit_rate": float(np.mean(net[net != 0] > 0)) if active else None,
        "total_return": float(net.sum()),
        "break_even_cost": None,
        "n_active": active,
        "n_windows": len(windows),
        "flat_windows": sum(1 for w in windows if not np.any(np.asarray(w["net"], dtype=np.float64))),
        "evidence": evidence,
        "cost": cost,
        "periods_per_year": periods_per_year,
    }
    out.update({f"sharpe_{k}x": 0.0 for k in COST_MULTIPLES})
    if evidence == "none":
        return out
    sr = sharpe_per_period(net)
    se = sharpe_se_per_period(net, sr)
    gross = net + cost * units
    out.update(
        sharpe=sr * ann,
        sharpe_se=se * ann if se is not None else None,
        psr=normal_cdf(sr / se) if se else None,
        break_even_cost=float(gross.sum() / units.sum()) if units.sum() > 0 else None,
    )
    for k in COST_MULTIPLES:
        out[f"sharpe_{k}x"] = sharpe_per_period(gross - k * cost * units) * ann
    return out


def score(stats: dict) -> float:
    """What selects (epochs, trials): the pooled Sharpe, shrunk toward flat's 0 in proportion
    to how far the evidence falls short of MIN_ACTIVE active periods (0 with none).

    One lucky trade makes one active period: its Sharpe (sqrt(ppy / n) annualised,
    whatever it earned) is scaled by 1/MIN_ACTIVE, so it cannot outrank a policy
    that trades through the windows with an edge. No evidence: `pooled` set the Sharpe to 0."""
    return stats["sharpe"] * min(1.0, stats["n_active"] / MIN_ACTIVE)


def oracle_share(policy: dict, oracle: dict) -> float | None:
    """The policy's pooled Sharpe as a share of the oracle's on the same windows (None
    when the oracle has no positive Sharpe to share)."""
    if oracle is None or oracle["evidence"] == "none" or oracle["sharpe"] <= 0:
        return None
    return policy["sharpe"] / oracle["sharpe"]


def oracle_share_se(policy_windows: list[dict], oracle_windows: list[dict]) -> float | None:
    """Standard error of oracle_share (policy Sharpe / oracle Sharpe) on the same windows.

    Both Sharpes come from the same periods, so their errors are correlated. The delta method
    of Ledoit & Wolf (2008, sec. 3.1, i.i.d. periods): with u = (mean p, mean o, mean p^2,
    mean o^2) of the policy's and the oracle's period returns, Psi the sample covariance of
    (p, o, p^2, o^2), and g(u) = S_p / S_o the ratio of the two Sharpes (S = m / sqrt(q - m^2)),
        Var(share) = grad g' Psi grad g / T,   grad g = (grad S_p - share grad S_o) / S_o,
        dS/dm = q / (q - m^2)^(3/2),   dS/dq = -m / (2 (q - m^2)^(3/2)).
    A policy that is the oracle has an error of 0; a flat policy (a share of exactly 0) too.
    None when the share is undefined (no oracle Sharpe > 0) or the windows do not line up.
    The ratio's tails are heavier than a normal's when the oracle's Sharpe is only 2-3
    standard errors from 0 (as on 12 test windows of 5 days); there the error matches the
    half-width of the central 68 % of the share over draws (docs/metrics.md)."""
    p, o = concat(policy_windows, "net"), concat(oracle_windows, "net")
    if p.size != o.size or o.size < 3:
        return None
    s_o = sharpe_per_period(o)
    if s_o <= 0:
        return None
    share = sharpe_per_period(p) / s_o
    return _delta_se(p, o, share, s_o)


def _delta_se(a: np.ndarray, b: np.ndarray, weight: float = 1.0, scale: float = 1.0) -> float:
    """The delta-method standard error of (S_a - weight S_b) / scale, S the Sharpe ratios (per
    observation) of two paired series (Ledoit & Wolf 2008, sec. 3.1, i.i.d.): with
    u = (mean a, mean b, mean a^2, mean b^2) and Psi the sample covariance of (a, b, a^2, b^2),
    Var = grad' Psi grad / T, grad = (dS/dm_a, -weight dS/dm_b, dS/dq_a, -weight dS/dq_b) / scale,
    dS/dm = q / (q - m^2)^(3/2), dS/dq = -m / (2 (q - m^2)^(3/2)). A series with no dispersion
    (a flat policy) has a constant Sharpe of 0: its terms are 0."""
    Y = np.stack((a, b, a * a, b * b), axis=1)
    m, q = Y[:, :2].mean(0), Y[:, 2:].mean(0)
    var = q - m * m
    live = var > 1e-300 * np.maximum(q, 1e-300)
    v = np.where(live, var, 1.0)
    d_m = np.where(live, q / v**1.5, 0.0)
    d_q = np.where(live, -m / (2.0 * v**1.5), 0.0)
    grad = np.array((d_m[0], -weight * d_m[1], d_q[0], -weight * d_q[1])) / scale
    return math.sqrt(max(float(grad @ np.cov(Y, rowvar=False) @ grad) / a.size, 0.0))


# --- how long a record must be, and what the learner adds over the supervised rule ---------

Z_95 = 1.6448536269514722  # Phi^-1(0.95): the one-sided 95 % critical value


def min_track_record(sharpe: float, sharpe_se: float | None, n_periods: int, sr_benchmark: float = 0.0, z=Z_95):
    """Minimum track record length (Bailey & Lopez de Prado 2012, "The Sharpe Ratio Efficient
    Frontier"): the periods T* at which the observed Sharpe, with the same skewness and kurtosis,
    would exceed `sr_benchmark` at confidence Phi(z):
        T* = 1 + (1 - g3 SR + (g4 - 1)/4 SR^2) (z / (SR - SR*))^2,   SR, SR* per period.
    The bracket is (T - 1) Var(SR), the Lo/Mertens variance behind `sharpe_se` (T = n_periods),
    so T* = 1 + (T - 1) (z se / (SR - SR*))^2 in any units that SR, SR* and se share (annualised
    here). math.inf when SR <= SR* (no record at this Sharpe is long enough); None when the
    Sharpe has no error (no evidence)."""
    if sharpe_se is None or n_periods < 3:
        return None
    if sharpe <= sr_benchmark:
        return math.inf
    return 1.0 + (n_periods - 1) * (z * sharpe_se / (sharpe - sr_benchmark)) ** 2


# fxray.eval.baselines' supervised rules: ridge (linear, every input), screened (its inputs and products)
SUPERVISED_RULES = ("ridge", "screened")


def daily_sums(windows: list[dict]) -> np.ndarray:
    """(D,) the windows' period returns summed by session day (fxray.data.calendar: the day
    starts where trading resumes after the weekly close, read off the periods' own times)."""
    from fxray.data.calendar import HOUR_NS, session_offset

    hours = concat(windows, "hours").astype(np.int64)
    if hours.size == 0:
        return np.zeros(0)
    offset_h = session_offset(hours * HOUR_NS + 1) // HOUR_NS  # the hour of day trading resumes
    _, day = np.unique((hours - offset_h) // 24, return_inverse=True)
    return np.bincount(day, weights=concat(windows, "net"))


def sharpe_difference_se(a: np.ndarray, b: np.ndarray) -> float | None:
    """Standard error of S_a - S_b, the Sharpe ratios (per observation) of two paired series
    (a_t, b_t on the same days), by the delta method (`_delta_se`). None with fewer than 3 days."""
    if a.size < 3 or b.size != a.size:
        return None
    return _delta_se(a, b)


def minus_linear(policy: dict, policy_windows: list[dict], references: dict, cost: float, periods_per_year: float):
    """What the learner adds over the supervised rule, on the same test days:

    - linear_reference: the better by pooled val Sharpe of the SUPERVISED_RULES present
      (`references` {name: {"val": [windows], "test": [windows]}}), named;
    - minus_linear: the policy's pooled test Sharpe (`policy`, pooled()) minus that rule's,
      annualised, as both are shown;
    - minus_linear_se: its standard error from the paired daily returns (the two series summed
      by session day: days absorb the hours' autocorrelation within a day), Ledoit & Wolf's delta
      method, annualised by the days a year holds (periods_per_year x days / periods).
    None in each where there is no such rule."""
    out = {"minus_linear": None, "minus_linear_se": None, "linear_reference": None}
    ok = [n for n in SUPERVISED_RULES if n in references and len(references[n]["test"]) == len(policy_windows)]
    if not ok:
        return out
    val = {  # a rule without every val window (a record that kept only test) cannot win by val
        n: pooled(references[n]["val"], cost, periods_per_year)["sharpe"]
        if len(references[n].get("val") or []) == len(policy_windows)
        else -math.inf
        for n in ok
    }
    name = max(ok, key=lambda n: val[n])  # ties: ridge, the first
    ref = pooled(references[name]["test"], cost, periods_per_year)
    a, b = daily_sums(policy_windows), daily_sums(references[name]["test"])
    se = sharpe_difference_se(a, b)
    n_periods = concat(policy_windows, "net").size
    days_per_year = periods_per_year * a.size / n_periods if n_periods else 0.0
    out.update(
        minus_linear=policy["sharpe"] - ref["sharpe"],
        minus_linear_se=se * math.sqrt(days_per_year) if se is not None else None,
        linear_reference=name,
    )
    return out
