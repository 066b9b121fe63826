"""fxray.eval.pooled and fxray.eval.selection against independent computations (numpy, scipy,
the DSR paper's worked example), the degenerate cases, and the lucky trade."""

import math

import numpy as np
import pytest
from scipy import stats

from fxray.data.calendar import DAY_NS, HOUR_NS, Calendar
from fxray.eval import pooled, selection

PPY = 6261.0
COST = 4e-5


def window(net, units=None, n_bars=None, n_trades=None):
    net = np.asarray(net, dtype=np.float64)
    units = np.zeros_like(net) if units is None else np.asarray(units, dtype=np.float64)
    return {
        "net": net.tolist(),
        "units": units.tolist(),
        "hours": list(range(len(net))),
        "n_bars": n_bars or 60 * len(net),
        "n_trades": int((units > 0).sum()) if n_trades is None else n_trades,
        "n_days": max(1, len(net) // 24),
    }


def random_windows(seed, n=4, hours=120, drift=1e-5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        units = (rng.random(hours) < 0.2) * rng.integers(1, 3, hours)
        fat = rng.standard_t(4, hours) * 1e-4  # fat tails: the skew/kurtosis terms matter
        out.append(window(drift + fat, units))
    return out


def test_pooled_matches_an_independent_computation():
    ws = random_windows(0)
    s = pooled.pooled(ws, COST, PPY)
    r = np.concatenate([w["net"] for w in ws])
    u = np.concatenate([w["units"] for w in ws])
    sr = r.mean() / r.std(ddof=1)
    g3, g4 = stats.skew(r), stats.kurtosis(r, fisher=False)  # biased sample moments
    se = math.sqrt((1 - g3 * sr + (g4 - 1) / 4 * sr**2) / (len(r) - 1))  # Mertens (2002)
    assert s["sharpe"] == pytest.approx(sr * math.sqrt(PPY), rel=1e-12)
    assert s["sharpe_se"] == pytest.approx(se * math.sqrt(PPY), rel=1e-10)
    assert s["psr"] == pytest.approx(stats.norm.cdf(sr / se), abs=1e-12)
    assert (s["n_periods"], s["n_active"], s["evidence"]) == (480, 480, "ok")
    assert (s["n_windows"], s["flat_windows"]) == (4, 0)
    assert s["n_trades"] == int((u > 0).sum()) and s["turnover"] == pytest.approx(u.sum() / (60 * 480))
    assert s["hit_rate"] == pytest.approx(np.mean(r > 0)) and s["total_return"] == pytest.approx(r.sum())
    gross = r + COST * u
    assert s["break_even_cost"] == pytest.approx(gross.sum() / u.sum(), rel=1e-12)
    for k in (2, 3):
        x = gross - k * COST * u
        assert s[f"sharpe_{k}x"] == pytest.approx(x.mean() / x.std(ddof=1) * math.sqrt(PPY), rel=1e-12)


def test_psr_is_the_papers_formula():
    """PSR(0) here is Bailey & Lopez de Prado's PSR with the same moments (test_metrics' reference)."""
    from test_metrics import psr_from_stats

    ws = random_windows(3)
    s = pooled.pooled(ws, COST, PPY)
    r = np.concatenate([w["net"] for w in ws])
    sr = r.mean() / r.std(ddof=1)
    expected = psr_from_stats(sr, stats.skew(r), stats.kurtosis(r, fisher=False), len(r))
    assert s["psr"] == pytest.approx(expected, abs=1e-12)


def test_break_even_cost_zeroes_the_pooled_sharpe():
    ws = random_windows(5, drift=3e-5)
    s = pooled.pooled(ws, COST, PPY)
    again = pooled.pooled(
        [
            {
                **w,
                "net": (
                    np.asarray(w["net"]) + COST * np.asarray(w["units"]) - s["break_even_cost"] * np.asarray(w["units"])
                ).tolist(),
            }
            for w in ws
        ],
        s["break_even_cost"],
        PPY,
    )
    assert again["sharpe"] == pytest.approx(0.0, abs=1e-9)


def test_no_trades_is_no_evidence_not_a_value():
    flat = pooled.pooled([window(np.zeros(120))], COST, PPY)
    assert (flat["sharpe"], flat["evidence"], flat["n_trades"]) == (0.0, "none", 0)
    assert flat["sharpe_se"] is None and flat["psr"] is None and flat["break_even_cost"] is None
    assert pooled.score(flat) == 0.0
    assert pooled.pooled([], COST, PPY)["evidence"] == "none"


def test_one_trade_is_thin_evidence_and_scores_little():
    """One profitable trade among flat hours: its Sharpe is sqrt(ppy / n) whatever it earned."""
    for size in (1e-4, 1e-2):
        net = np.zeros(120)
        net[7] = size
        units = np.zeros(120)
        units[7] = 2.0
        s = pooled.pooled([window(net, units)], COST, PPY)
        assert s["evidence"] == "thin" and s["n_active"] == 1
        assert s["sharpe"] == pytest.approx(math.sqrt(PPY / 120), rel=1e-9)  # the size does not matter
        assert pooled.score(s) == pytest.approx(s["sharpe"] / pooled.MIN_ACTIVE, rel=1e-12)


def test_one_active_day_carries_its_error():
    """24 active hours of one day: defined, but its standard error says how little it shows."""
    rng = np.random.default_rng(2)
    net = np.zeros(240)
    net[:24] = 2e-5 + 1e-4 * rng.standard_normal(24)
    s = pooled.pooled([window(net, (net != 0).astype(float))], COST, PPY)
    assert s["evidence"] == "ok" and s["n_active"] == 24
    assert s["sharpe_se"] > abs(s["sharpe"]) / 2 and 0.0 < s["psr"] < 1.0


def test_a_lucky_trade_cannot_outscore_an_active_edge():
    """Under the sweep's objective: a policy with a real edge (pooled Sharpe 3, trading through
    every hour of 12 five-day val windows) against one flat but for one lucky trade, however
    big; and per fold, at ASHA's first rung. The old objective (a window's daily Sharpe) gave
    the lucky trade sqrt(252) / 2 = 7.94 on its fold."""
    rng = np.random.default_rng(11)
    hours = 12 * 120
    noise = rng.standard_normal(hours)
    noise = (noise - noise.mean()) / noise.std(ddof=1)
    edge = 1e-4 * (noise + 3.0 / math.sqrt(PPY))  # pooled Sharpe exactly 3 (annualised)
    active = [window(edge[i * 120 : (i + 1) * 120], np.ones(120)) for i in range(12)]
    assert pooled.pooled(active, COST, PPY)["sharpe"] == pytest.approx(3.0, rel=1e-9)
    for size in (1e-4, 1e-2, 1.0):
        lucky = [window(np.zeros(120)) for _ in range(12)]
        net = np.zeros(120)
        net[40] = size
        lucky[5] = window(net, np.eye(120)[40] * 2)
        assert pooled.score(pooled.pooled(active, COST, PPY)) > 5 * pooled.score(pooled.pooled(lucky, COST, PPY))
        # one fold each (ASHA's first rung): the lucky fold against an ordinary fold of the edge
        one = pooled.score(pooled.pooled([lucky[5]], COST, PPY))
        assert one < 0.5 and one < max(pooled.score(pooled.pooled([w], COST, PPY)) for w in active)
    from fxray.eval import metrics

    assert metrics.sharpe([0, 0, 1e-3, 0]) == pytest.approx(7.94, abs=0.01)  # what the old objective saw (4 days)


def test_oracle_share():
    assert pooled.oracle_share({"sharpe": 2.0}, {"sharpe": 4.0, "evidence": "ok"}) == 0.5
    assert pooled.oracle_share({"sharpe": 2.0}, {"sharpe": -1.0, "evidence": "ok"}) is None
    assert pooled.oracle_share({"sharpe": 2.0}, None) is None


@pytest.mark.parametrize("rho, sparse", [(0.0, False), (0.7, False), (0.5, True)])
def test_oracle_share_se_matches_the_spread_of_the_share_over_draws(rho, sparse):
    """The delta-method error against the share's own spread over 3,000 simulated samples of
    the two return series (correlated; in the sparse case the policy is flat 60 % of the
    periods and the returns fat-tailed, as a trading policy's are)."""
    rng = np.random.default_rng(7)
    T, n = 2000, 3000
    L = np.linalg.cholesky([[1.0, rho], [rho, 1.0]])
    shares, ses = [], []
    for i in range(n):
        z = rng.standard_normal((T, 2)) @ L.T
        if sparse:
            z = z * rng.standard_t(5, size=(T, 1)) / np.sqrt(5 / 3)
        policy, oracle = z[:, 0] + 0.07, z[:, 1] + 0.15  # the oracle ~7 standard errors from 0
        if sparse:
            policy = policy * (rng.random(T) < 0.4)
        shares.append(pooled.sharpe_per_period(policy) / pooled.sharpe_per_period(oracle))
        if i < 300:
            ses.append(pooled.oracle_share_se([window(policy[:700]), window(policy[700:])], [window(oracle)]))
    assert np.mean(ses) == pytest.approx(np.std(shares), rel=0.1)


def test_oracle_share_se_near_a_weak_oracle_is_the_central_spread():
    """With the oracle only ~2.2 standard errors from 0 (12 test windows of 5 days) the share's
    tails are heavy; its error then matches the half-width of the share's central 68 %."""
    rng = np.random.default_rng(3)
    T = 2000
    L = np.linalg.cholesky([[1.0, 0.5], [0.5, 1.0]])
    shares, ses = [], []
    for i in range(3000):
        z = rng.standard_normal((T, 2)) @ L.T
        policy, oracle = z[:, 0] + 0.025, z[:, 1] + 0.05
        shares.append(pooled.sharpe_per_period(policy) / pooled.sharpe_per_period(oracle))
        if i < 400:
            ses.append(pooled.oracle_share_se([window(policy)], [window(oracle)]))
    lo, hi = np.percentile(shares, [16, 84])
    assert np.median([s for s in ses if s is not None]) == pytest.approx((hi - lo) / 2, rel=0.15)


def test_oracle_share_se_degenerate_cases():
    rng = np.random.default_rng(0)
    oracle = [window(rng.standard_normal(500) + 0.1)]
    assert pooled.oracle_share_se([window(np.zeros(500))], oracle) == 0.0  # flat: a share of exactly 0
    assert pooled.oracle_share_se([window(rng.standard_normal(400))], oracle) is None  # windows do not line up
    assert pooled.oracle_share_se(oracle, [window(rng.standard_normal(500) - 1.0)]) is None  # oracle < 0: no share
    # the oracle against itself: a share of 1 whatever the draw (the error of a ratio of one estimate)
    assert pooled.oracle_share_se(oracle, oracle) == pytest.approx(0.0, abs=0.02)


# --- DSR on a common footing -------------------------------------------------------------------


def test_deflated_reproduces_the_papers_worked_example():
    """Bailey & Lopez de Prado (2014): 100 trials, variance of the (annualised) trial Sharpes
    1/2, best SR 2.5 over T = 1250 days, skew -3, kurtosis 10 -> DSR = 0.9004. When every
    trial has the same standard error, the SE-normalised DSR is the paper's."""
    sr, t, g3, g4 = 2.5 / math.sqrt(250), 1250, -3.0, 10.0
    se = math.sqrt((1 - g3 * sr + (g4 - 1) / 4 * sr**2) / (t - 1))
    n, v = 100, 0.5 / 250  # per-day variance of the trials' Sharpes
    a = math.sqrt(v * (n - 1) / n)  # 50 at +a, 50 at -a: sample variance v
    trials = [{"sharpe": s, "sharpe_se": se} for s in [a] * 50 + [-a] * 50]
    d = selection.deflated({"sharpe": sr, "sharpe_se": se}, trials, n)
    assert d["dsr"] == pytest.approx(0.9004, abs=5e-4) and d["n_trials_counted"] == 100
    assert d["sr0"] == pytest.approx(0.1132, abs=5e-4)


def test_deflated_counts_every_trial_started_and_normalises_by_error():
    rng = np.random.default_rng(0)
    trials = [{"sharpe": z * se, "sharpe_se": se} for z, se in zip(rng.standard_normal(30), rng.uniform(1, 8, 30))]
    best = {"sharpe": 8.0, "sharpe_se": 2.0}
    few, many = (selection.deflated(best, trials, n)["dsr"] for n in (30, 300))
    assert many < few  # more chances to be lucky: a higher bar
    # long and short trials alike: scaling a trial's Sharpe and its error together changes nothing
    scaled = [{"sharpe": 3 * t["sharpe"], "sharpe_se": 3 * t["sharpe_se"]} for t in trials]
    assert selection.deflated(best, scaled, 30)["dsr"] == pytest.approx(few, abs=1e-12)
    assert selection.deflated({"sharpe": 0.0, "sharpe_se": None}, trials, 30)["dsr"] is None


# --- walk-forward selection ----------------------------------------------------------------------


def test_walk_forward_picks_on_val_windows_that_end_before_each_test_window():
    up, down = (
        window(np.full(120, 1e-5) + 1e-6 * np.sin(np.arange(120)), np.ones(120)),
        window(np.full(120, -1e-5) + 1e-6 * np.sin(np.arange(120)), np.ones(120)),
    )
    test_a, test_b = (
        window(np.full(120, 2e-5) + 1e-6 * np.cos(np.arange(120)), np.ones(120)),
        window(np.full(120, -3e-5) + 1e-6 * np.cos(np.arange(120)), np.ones(120)),
    )
    up3 = window(np.full(120, 3e-5) + 1e-6 * np.sin(np.arange(120)), np.ones(120))
    trials = [
        # A is best on fold 0's val, B becomes best once folds 0..1 are pooled
        {
            "trial_id": "A",
            "folds": {
                0: {"val": up, "test": test_a},
                1: {"val": down, "test": test_a},
                2: {"val": down, "test": test_a},
            },
        },
        {
            "trial_id": "B",
            "folds": {
                0: {"val": down, "test": test_b},
                1: {"val": up3, "test": test_b},
                2: {"val": up3, "test": test_b},
            },
        },
        {"trial_id": "C", "folds": {0: {"val": up, "test": test_b}}},  # stopped after fold 0
    ]
    wf = selection.walk_forward(trials, 3, COST, PPY)
    assert [c["trial_id"] for c in wf["choices"]] == ["A", "B", "B"]  # ties on fold 0: the first
    expected = pooled.pooled([test_a, test_b, test_b], COST, PPY)
    assert wf["sharpe"] == pytest.approx(expected["sharpe"], rel=1e-12) and wf["n_periods"] == 360
    assert selection.walk_forward([], 3, COST, PPY) is None


# --- the calendar ------------------------------------------------------------------------------


def test_calendar_of_a_24x5_market_and_a_24x7_one():
    from fxray.data.synth import session_timestamps

    fx = session_timestamps(5 * 1440 * 8)  # eight weeks, Sunday 22:00 to Friday 22:00 UTC
    cal = Calendar.of(fx)
    assert cal.session_offset_ns == 22 * HOUR_NS
    days = cal.session_day(fx)
    assert len(np.unique(days)) == 5 * 8  # five whole sessions a week, no Sunday stub
    assert cal.periods_per_year == pytest.approx(365.25 * 24 * 5 / 7, rel=0.01)
    crypto = np.arange(1, 14 * 1440 + 1, dtype=np.int64) * 60 * 10**9 + 1_700_000_000 * 10**9
    cal7 = Calendar.of(crypto)
    assert cal7.session_offset_ns == 0 and cal7.periods_per_year == pytest.approx(365.25 * 24, rel=0.01)
    assert (cal7.session_day(crypto) == crypto // DAY_NS).all()


def test_flat_windows_counts_the_windows_without_a_position():
    """A window whose every hour returns 0 is flat (the policy held nothing); one hour with a
    return (even a loss, even a cost alone) is not; the report says so in one clause."""
    from fxray.track.report import flat_text

    ws = random_windows(1, n=5)
    ws[1] = window(np.zeros(120))
    ws[3] = window(np.zeros(120))
    tiny = np.zeros(120)
    tiny[7] = -COST  # one hour that paid a cost: it traded
    ws[4] = window(tiny, units=(np.arange(120) == 7).astype(float))
    s = pooled.pooled(ws, COST, PPY)
    reference = sum(1 for w in ws if all(x == 0 for x in w["net"]))
    assert (s["n_windows"], s["flat_windows"]) == (5, reference) == (5, 2)
    assert flat_text(s) == "; no position in 2 of 5 test windows"
    assert flat_text(pooled.pooled(ws[:1], COST, PPY)) == "" and flat_text({"sharpe": 1.0}) == ""
    none = pooled.pooled([window(np.zeros(24))], COST, PPY)
    assert none["evidence"] == "none" and (none["n_windows"], none["flat_windows"]) == (1, 1)


# --- what the learner adds over the linear rule ----------------------------------------------------


def hours_window(net, start_hour, units=None):
    """A window of hourly returns from `start_hour` on, its hours contiguous (no weekend gap)."""
    w = window(net, units if units is not None else np.ones(len(net)))
    w["hours"] = list(range(start_hour, start_hour + len(net)))
    return w


def test_minus_linear_matches_a_hand_computed_paired_reference():
    """The chosen trial's pooled test Sharpe minus the linear rule's (the better by val of ridge
    and screened), and its standard error from the paired daily returns by the delta method:
    here the days' sums by a plain loop, Psi by a plain loop, the gradient by finite
    differences of S_a - S_b (S = m / sqrt(q - m^2)), annualised by the days of a year."""
    rng = np.random.default_rng(11)
    starts = (24 * 10, 24 * 40, 24 * 70)  # three test windows of five whole UTC days
    common = [rng.standard_normal(120) * 1e-4 for _ in starts]  # the market both trade
    policy = [hours_window(2e-6 + 0.8 * c + 0.6e-4 * rng.standard_normal(120), s) for c, s in zip(common, starts)]
    ridge = [hours_window(0.5e-6 + 0.8 * c + 0.6e-4 * rng.standard_normal(120), s) for c, s in zip(common, starts)]
    screened = [hours_window(rng.standard_normal(120) * 1e-4, s) for s in starts]
    refs = {
        "ridge": {"val": [window(1e-5 + rng.standard_normal(120) * 1e-4, np.ones(120))], "test": ridge},
        "screened": {"val": [window(-1e-5 + rng.standard_normal(120) * 1e-4, np.ones(120))], "test": screened},
    }
    val = {n: pooled.pooled(r["val"], COST, PPY)["sharpe"] for n, r in refs.items()}
    assert val["ridge"] > val["screened"]  # the reference is the better by val: ridge here
    p = pooled.pooled(policy, COST, PPY)
    got = pooled.minus_linear(p, policy, refs, COST, PPY)
    assert got["linear_reference"] == "ridge"
    assert got["minus_linear"] == pytest.approx(p["sharpe"] - pooled.pooled(ridge, COST, PPY)["sharpe"], rel=1e-12)

    def by_day(ws):
        sums: dict = {}
        for w in ws:
            for h, r in zip(w["hours"], w["net"]):
                sums[h // 24] = sums.get(h // 24, 0.0) + r
        return np.array([sums[d] for d in sorted(sums)])

    a, b = by_day(policy), by_day(ridge)
    assert a.size == 15
    rows = [(x, y, x * x, y * y) for x, y in zip(a, b)]
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(4)]
    psi = [
        [sum((r[i] - mean[i]) * (r[j] - mean[j]) for r in rows) / (len(rows) - 1) for j in range(4)] for i in range(4)
    ]

    def g(u):
        return u[0] / math.sqrt(u[2] - u[0] ** 2) - u[1] / math.sqrt(u[3] - u[1] ** 2)

    grad = []
    for i in range(4):
        h = 1e-6 * abs(mean[i])
        up, dn = list(mean), list(mean)
        up[i], dn[i] = mean[i] + h, mean[i] - h
        grad.append((g(up) - g(dn)) / (2 * h))
    var = sum(grad[i] * psi[i][j] * grad[j] for i in range(4) for j in range(4)) / len(rows)
    days_per_year = PPY * 15 / 360  # 15 days in 360 hours
    assert got["minus_linear_se"] == pytest.approx(math.sqrt(var * days_per_year), rel=1e-5)
    # without a linear rule there is nothing to subtract
    assert pooled.minus_linear(p, policy, {}, COST, PPY) == {
        "minus_linear": None,
        "minus_linear_se": None,
        "linear_reference": None,
    }


def test_sharpe_difference_se_is_the_spread_over_draws():
    """Two correlated daily series, 60 days, 4,000 draws: the delta-method error of S_a - S_b
    is the standard deviation of the difference over draws (within 10 %)."""
    rng = np.random.default_rng(5)
    n, draws = 60, 4000
    c = rng.standard_normal((draws, n))
    a = 0.15 + 0.8 * c + 0.6 * rng.standard_normal((draws, n))
    b = 0.05 + 0.8 * c + 0.6 * rng.standard_normal((draws, n))
    diff = a.mean(1) / a.std(1) - b.mean(1) / b.std(1)
    se = np.mean([pooled.sharpe_difference_se(a[i], b[i]) for i in range(400)])
    assert se == pytest.approx(diff.std(), rel=0.1)
    # a flat policy (a Sharpe of exactly 0): only the rule's own error, Lo/Mertens' up to n vs n - 1
    flat = pooled.sharpe_difference_se(np.zeros(n), b[0])
    assert flat == pytest.approx(pooled.sharpe_se_per_period(b[0], b[0].mean() / b[0].std()), rel=0.05)
    assert pooled.sharpe_difference_se(a[0][:2], b[0][:2]) is None
