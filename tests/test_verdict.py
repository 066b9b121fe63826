"""The one verdict: its decision table row by row (pure functions, in-process), the days that
would decide an inconclusive one against the minimum track record length computed by hand
from the paper's formula, and the sentence carried through snooping_verdict and add_placebo."""

import math

import numpy as np
import pytest
from scipy import stats
from test_metrics import psr_from_stats

from fxray.eval import pooled
from fxray.track import verdict


def chosen(sharpe=4.0, se=1.5, dsr=0.97, z0=1.0, evidence="ok", n_days=60, n_periods=1440, trial_id="t1"):
    return {
        "trial_id": trial_id,
        "sharpe": sharpe,
        "sharpe_se": se,
        "evidence": evidence,
        "n_days": n_days,
        "n_periods": n_periods,
        "dsr": dsr,
        "z": sharpe / se if se else None,
        "z0": z0,
        "n_trials_counted": 64,
    }


def spa(p=0.01, kept=("t1",)):
    return {"spa_pvalue": p, "stepm_kept": list(kept), "n_trials": 8}


def placebo(p, n=4):
    return {"pvalue": p, "n": n, "rank": round(p * (n + 1))}


# --- the table, one row at a time ----------------------------------------------------------------


def test_no_chosen_trial_has_no_answer():
    d = verdict.decide(None, None, None, None)
    assert d["answer"] is None and d["days_needed"] is None


def test_row1_no_trade_is_no_edge_whatever_else_says():
    d = verdict.decide(chosen(sharpe=0.0, se=None, dsr=None, evidence="none"), spa(), 0.1, None)
    assert d["answer"] == "no_edge" and d["sentence"] == "no edge: the chosen trial made no trade in its 60 test days"


def test_row2_a_loss_after_costs_is_no_edge():
    d = verdict.decide(chosen(sharpe=-1.2, dsr=0.0), spa(p=1.0, kept=()), 0.6, None)
    assert d["answer"] == "no_edge" and d["sentence"].startswith("no edge: the chosen trial lost after costs")
    assert "-1.20 ± 1.50 over 60 test days" in d["sentence"]


def test_row3_placebos_that_reach_it_say_no_edge_even_against_a_high_dsr():
    d = verdict.decide(chosen(), spa(), 0.1, placebo(0.8))
    assert d["answer"] == "no_edge" and "3 of 4 sweeps on signal-free copies" in d["sentence"]


def test_row4b_dsr_or_stepm_is_an_edge():
    d = verdict.decide(chosen(dsr=0.97), spa(kept=()), 0.2, None)
    assert d["answer"] == "edge" and d["sentence"].startswith("edge: the chosen trial earns +4.00 ± 1.50")
    assert "DSR 0.970" in d["sentence"] and "StepM" not in d["sentence"] and d["days_needed"] is None
    # the GPU run of issue 53: SPA p 0.000, StepM keeps the chosen trial, DSR 0.554: an edge, said why
    d = verdict.decide(chosen(dsr=0.554), spa(p=0.0, kept=("t0", "t1")), 0.846, placebo(0.2))
    assert d["answer"] == "edge" and "StepM keeps it" in d["sentence"] and "DSR" not in d["sentence"]
    assert "the val windows did not pick the better trials (PBO >= 0.5)" in d["sentence"]  # PBO: a caveat


def test_row4a_an_edge_the_placebos_do_not_confirm_is_inconclusive():
    d = verdict.decide(chosen(), spa(), 0.1, placebo(0.4))  # rank 2 of 5: one placebo came as high
    assert d["answer"] == "inconclusive" and "more placebo sweeps" in d["sentence"] and d["days_needed"] is None
    # with 4 placebos the smallest p is 0.2: rank 1 confirms; with 19 the level is 0.05
    assert verdict.decide(chosen(), spa(), 0.1, placebo(0.2))["answer"] == "edge"
    assert verdict.decide(chosen(), spa(), 0.1, placebo(0.1, n=19))["answer"] == "inconclusive"


def test_row5a_close_to_deciding_is_inconclusive_with_the_days():
    # z = 3, z0 = 2: DSR = Phi(1) = 0.84; the bar is z >= 2 + 1.645, reached at T' = T (3.645 / 3)^2
    c = chosen(sharpe=3.0, se=1.0, dsr=stats.norm.cdf(1.0), z0=2.0)
    d = verdict.decide(c, spa(p=0.2, kept=()), 0.3, None)
    t_star = 1 + 1439 * (3.645 / 3.0) ** 2  # hours, from the formula by hand (z_0.95 rounded)
    days = math.ceil(t_star * 60 / 1440) - 60
    assert d["answer"] == "inconclusive" and d["days_needed"] in (days - 1, days, days + 1)
    assert d["sentence"] == (
        f"inconclusive: about {d['days_needed']} more test days would decide it "
        "(the chosen trial's +3.00 ± 1.00 over 60 test days; DSR 0.841 < 0.95)"
    )


def test_row5b_stepm_keeping_other_trials_is_inconclusive():
    c = chosen(sharpe=1.0, se=1.0, dsr=stats.norm.cdf(-1.5), z0=2.5)
    d = verdict.decide(c, spa(p=0.01, kept=("t7",)), 0.3, None)
    assert d["answer"] == "inconclusive" and "StepM finds 1 trial(s) that beat flat" in d["sentence"]


def test_row5c_far_from_deciding_is_no_edge():
    c = chosen(sharpe=1.0, se=1.0, dsr=stats.norm.cdf(-1.5), z0=2.5)
    d = verdict.decide(c, spa(p=0.6, kept=()), 0.5, placebo(0.4))
    assert d["answer"] == "no_edge" and d["days_needed"] is None
    assert d["sentence"].startswith("no edge: the chosen trial's +1.00 ± 1.00 over 60 test days is within what")
    assert "at this Sharpe about" in d["sentence"]  # a finite record would tell: said, not decided


def test_without_a_dsr_the_bar_is_psr():
    c = chosen(sharpe=3.0, se=2.5, dsr=None, z0=None)  # one trial: nothing to deflate by
    assert verdict.days_to_decide(c) == math.ceil((1 + 1439 * (pooled.Z_95 / 1.2) ** 2) * 60 / 1440) - 60 == 53
    assert verdict.days_to_decide(chosen(sharpe=3.0, se=1.0, dsr=None, z0=None)) == 0  # z 3 > 1.645: decided
    assert verdict.days_to_decide(chosen(sharpe=-1.0)) == math.inf


# --- MinTRL against the paper's formula ------------------------------------------------------------


def test_min_track_record_is_where_psr_reaches_the_confidence():
    """Bailey & Lopez de Prado (2012): at T* = MinTRL the PSR against SR* is exactly 1 - alpha,
    with the skewness and kurtosis of the returns (psr_from_stats: the raw-moment formula)."""
    rng = np.random.default_rng(3)
    r = 0.05 + rng.standard_t(5, 2000) * 0.8  # fat tails, per-period Sharpe ~0.05
    sr = pooled.sharpe_per_period(r)
    se = pooled.sharpe_se_per_period(r, sr)
    g3, g4 = stats.skew(r), stats.kurtosis(r, fisher=False)
    for bench in (0.0, 0.01):
        t_star = pooled.min_track_record(sr, se, r.size, bench)
        assert t_star == pytest.approx(1 + (1 - g3 * sr + (g4 - 1) / 4 * sr**2) * (1.6448536 / (sr - bench)) ** 2)
        assert psr_from_stats(sr, g3, g4, t_star, bench) == pytest.approx(0.95, abs=1e-6)
    assert pooled.min_track_record(sr, se, r.size, sr + 0.01) == math.inf
    assert pooled.min_track_record(0.0, None, 10) is None


# --- through the verdict's own entry points ----------------------------------------------------


def test_snooping_verdict_and_add_placebo_carry_one_answer():
    v = verdict.snooping_verdict([], 3, 6261.0, {"trial_id": "t1", "test": {**chosen(), "n_days": 60}, **chosen()})
    assert v["answer"] == "edge" and verdict.sentence(v) == "verdict: " + v["sentence"]
    assert v["sentence"] in verdict.text(v) and "is it real?" in verdict.text(v)
    verdict.add_placebo(v, {"pvalue": 0.8, "n": 4, "rank": 4, "real": 4.0, "mean": 5.0, "std": 1.0, "z": -1.0})
    assert v["answer"] == "no_edge" and v["sentence"] in verdict.text(v)
    assert verdict.snooping_verdict([], 3, 6261.0, None)["answer"] is None
