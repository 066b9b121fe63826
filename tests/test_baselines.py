"""The supervised baseline (ridge + hysteresis, fxray.eval.baselines) against a plain numpy
reference written from its docstring: the same regression, the same threshold grid, the
same choice on train, the same positions bar by bar."""

import math

import numpy as np
import pytest
import torch

from fxray.eval import baselines
from fxray.eval.baselines import (
    ENTER_QUANTILES,
    EXIT_SHARES,
    HORIZONS,
    RIDGE,
    fit_rule,
    hysteresis,
    net_returns,
    screen_columns,
)


def np_hysteresis(s: np.ndarray, enter: float, exit: float) -> np.ndarray:
    pos, out = 0, np.empty(len(s), dtype=np.int8)
    for t, v in enumerate(s):
        if pos == 0:
            pos = 1 if v > enter else -1 if v < -enter else 0
        elif pos == 1:
            pos = -1 if v < -enter else 1 if v > exit else 0
        else:
            pos = 1 if v > enter else -1 if v < -exit else 0
        out[t] = pos
    return out


def np_net(pos: np.ndarray, fresh: np.ndarray, cost: float, carry=None) -> np.ndarray:
    prev = np.concatenate([[0.0], pos[:-1].astype(float)])
    return pos * fresh - cost * np.abs(pos - prev) + (0.0 if carry is None else prev * carry)


def np_fit(x: np.ndarray, fresh: np.ndarray, cost: float, carry=None, gate=None):
    """(weights, enter, exit, horizon, train Sharpe) chosen as the docstring says, one
    candidate at a time; with `gate` fitted on those bars, the signal 0 elsewhere."""
    n = len(x)
    gate = np.ones(n, dtype=bool) if gate is None else gate
    xg = x[gate]
    gram = xg.T @ xg + RIDGE * len(xg) * np.eye(x.shape[1])
    best = None
    for h in HORIZONS:
        c = np.concatenate([[0.0], np.cumsum(fresh)])
        y = (c[np.minimum(np.arange(n) + h, n)] - c[:n])[gate]
        w = np.linalg.solve(gram, xg.T @ y)
        s = np.where(gate, x @ w, 0.0)
        for q in ENTER_QUANTILES:
            enter = float(np.quantile(np.abs(s[gate]).astype(np.float32), q))
            for share in EXIT_SHARES:
                r = np_net(np_hysteresis(s, enter, share * enter), fresh, cost, carry)
                sd = r.std(ddof=1)
                sharpe = r.mean() / sd if sd > 0 else -math.inf
                if best is None or sharpe > best[4]:
                    best = (w, enter, share * enter, h, sharpe)
    return best


def small_market(n=3000, k=6, seed=0, beta=0.3):
    """Inputs with a persistent signal in column 0 that predicts the next returns."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k))
    z = np.zeros(n)
    for t in range(1, n):
        z[t] = 0.95 * z[t - 1] + rng.standard_normal() * 0.3
    x[:, 0] = z + 0.3 * rng.standard_normal(n)
    fresh = 1e-4 * (beta * z + rng.standard_normal(n))
    return x, fresh


def test_hysteresis_is_the_plain_loop():
    rng = np.random.default_rng(1)
    s = rng.standard_normal(5000)
    for enter, exit in ((0.5, 0.0), (1.0, 0.5), (0.2, 0.2), (math.inf, math.inf)):
        got = hysteresis(torch.from_numpy(s), enter, exit).numpy()
        assert np.array_equal(got, np_hysteresis(s, enter, exit)), (enter, exit)


def test_net_returns_is_the_plain_formula():
    rng = np.random.default_rng(2)
    pos = rng.integers(-1, 2, 400).astype(np.int8)
    fresh = rng.standard_normal(400) * 1e-4
    got = net_returns(torch.from_numpy(pos), torch.from_numpy(fresh), 4e-5).numpy()
    np.testing.assert_allclose(got, np_net(pos, fresh, 4e-5), rtol=0, atol=1e-18)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fitted_rule_is_the_numpy_reference(seed):
    x, fresh = small_market(seed=seed)
    cost = 2e-5
    rule = fit_rule(torch.from_numpy(x), torch.from_numpy(fresh), cost)
    w, enter, exit, h, sharpe = np_fit(x, fresh, cost)
    assert sharpe > 0  # the planted column pays on train: the rule is not the flat fallback
    assert (rule.horizon, rule.enter, rule.exit) == (h, pytest.approx(enter, rel=1e-6), pytest.approx(exit, rel=1e-6))
    np.testing.assert_allclose(rule.weights.numpy(), w, rtol=1e-9, atol=1e-15)
    assert rule.train_sharpe == pytest.approx(sharpe, rel=1e-9)
    # positions on a window it never saw, bar by bar
    x2, _ = small_market(n=1500, seed=seed + 10)
    got = rule.positions(torch.from_numpy(x2)).numpy()
    assert np.array_equal(got, np_hysteresis(x2 @ w, enter, exit))
    assert 0.05 < np.mean(got != 0) < 0.95  # it trades: the comparison is not of two flat paths


def test_a_gated_rule_with_carry_is_the_numpy_reference():
    """The grid run as batches of paths (fit_rule) against the one-at-a-time reference, with the
    two arguments the oracle and a carry market add: an hour gate and a carry per bar."""
    x, fresh = small_market(seed=6)
    rng = np.random.default_rng(7)
    gate = (np.arange(len(x)) // 60) % 3 != 0  # two hours in three
    carry = rng.standard_normal(len(x)) * 2e-6
    rule = fit_rule(
        torch.from_numpy(x), torch.from_numpy(fresh), 2e-5, carry=torch.from_numpy(carry), gate=torch.from_numpy(gate)
    )
    w, enter, exit, h, sharpe = np_fit(x, fresh, 2e-5, carry, gate)
    assert sharpe > 0
    assert (rule.horizon, rule.enter, rule.exit) == (h, pytest.approx(enter, rel=1e-6), pytest.approx(exit, rel=1e-6))
    np.testing.assert_allclose(rule.weights.numpy(), w, rtol=1e-9, atol=1e-15)
    assert rule.train_sharpe == pytest.approx(sharpe, rel=1e-9)
    got = rule.positions(torch.from_numpy(x), torch.from_numpy(gate)).numpy()
    assert np.array_equal(got, np_hysteresis(np.where(gate, x @ w, 0.0), enter, exit))
    assert 0.05 < np.mean(got != 0) < 0.95  # it trades: the comparison is not of two flat paths


def test_no_signal_on_train_is_a_flat_rule():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2000, 4))
    fresh = rng.standard_normal(2000) * 1e-4
    rule = fit_rule(torch.from_numpy(x), torch.from_numpy(fresh), cost=5e-3)  # a cost nothing can pay
    assert rule.enter == math.inf and not rule.positions(torch.from_numpy(x)).any()
    assert baselines.Rule is type(rule)


def test_the_screen_keeps_the_columns_whose_ols_t_statistic_passes():
    """screen_columns against the textbook OLS t-statistic of each column alone (numpy's
    lstsq with an intercept, the slope's standard error from the residual variance): the
    planted column passes, pure-noise columns mostly do not, and candidates restrict it."""
    x, fresh = small_market(seed=4)
    rng = np.random.default_rng(5)
    x[:, 3] = np.cumsum(rng.standard_normal(len(x))) / 30  # a slow, trending input

    def t_ref(col):
        A = np.column_stack((np.ones(len(col)), col))
        coef, res, *_ = np.linalg.lstsq(A, fresh, rcond=None)
        sigma2 = res[0] / (len(col) - 2)
        cov = sigma2 * np.linalg.inv(A.T @ A)
        return coef[1] / np.sqrt(cov[1, 1])

    t = np.array([t_ref(x[:, j]) for j in range(x.shape[1])])
    for t_min in (1.0, 2.0, 3.0):
        got = screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), t_min).tolist()
        assert got == [j for j in range(x.shape[1]) if abs(t[j]) > t_min], (t_min, t)
    assert abs(t[0]) > 3 and screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), 3.0).tolist()[:1] == [0]
    some = screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), 0.0, candidates=[1, 2, 3]).tolist()
    assert some == [1, 2, 3]  # every candidate with a nonzero t, and none outside them
    x[:, 2] = 0.0  # a constant input has no t: never kept
    assert 2 not in screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), 0.0).tolist()


def test_the_checked_screen_keeps_only_what_earns_on_the_slices_tail():
    """checked_screen: the robust screen of the whole slice where the screened rule, fitted on
    the first two thirds, earns on the last third; nothing where it loses there (the relation
    flips in the tail, though the whole slice's screen still keeps the column), and nothing
    where the head's screen keeps nothing."""
    x, fresh = small_market(n=6000, seed=3, beta=0.4)
    X, F = torch.from_numpy(x), torch.from_numpy(fresh)
    cost = 2e-6
    kept = baselines.checked_screen(X, F, cost, 3.0)
    assert kept.linear_inputs().tolist() == screen_columns(X, F, 3.0, robust=True).tolist()
    assert 0 in kept.linear_inputs().tolist() and kept.nonlinear_inputs() == []  # a linear market: no product
    cut = int(len(fresh) * (1 - baselines.HOLDOUT))
    head_rule = baselines.fit_rule(X[:cut], F[:cut], cost, columns=screen_columns(X[:cut], F[:cut], 3.0, robust=True))
    assert float(baselines.net_returns(head_rule.positions(X[cut:]), F[cut:], cost).sum()) > 0
    flipped = F.clone()
    noise = np.random.default_rng(4).standard_normal(len(fresh) - cut)
    flipped[cut:] = torch.from_numpy(1e-4 * (-0.4 * x[cut:, 0] + noise))
    assert 0 in screen_columns(X, flipped, 3.0, robust=True).tolist()  # the whole slice still says column 0
    assert baselines.checked_screen(X, flipped, cost, 3.0).numel() == 0
    assert baselines.checked_screen(X, F, cost, 100.0).numel() == 0  # no column passes on the head
    carry = torch.zeros_like(F)  # a carry of zeros is no carry
    assert torch.equal(baselines.checked_screen(X, F, cost, 3.0, carry=carry).index, kept.index)


def test_the_robust_screen_uses_whites_standard_error():
    """screen_columns(robust=True) against White's HC0 sandwich written as matrices (numpy:
    (A'A)^-1 A' diag(e^2) A (A'A)^-1 with an intercept column), on returns whose variance
    moves with one input's size: there the ordinary t overstates that input, the robust one
    does not, and the two screens keep different columns."""
    x, fresh = small_market(seed=6)
    rng = np.random.default_rng(7)
    loud = np.abs(x[:, 4]) ** 2  # the return's variance rises with input 4's size
    fresh = fresh + 1e-4 * loud * rng.standard_normal(len(fresh)) + 2e-6 * x[:, 4] * loud

    def t_hc0(col):
        A = np.column_stack((np.ones(len(col)), col))
        bread = np.linalg.inv(A.T @ A)
        coef = bread @ A.T @ fresh
        e = fresh - A @ coef
        cov = bread @ (A.T * e**2) @ A @ bread
        return coef[1] / np.sqrt(cov[1, 1])

    def t_ols(col):
        A = np.column_stack((np.ones(len(col)), col))
        coef, res, *_ = np.linalg.lstsq(A, fresh, rcond=None)
        return coef[1] / np.sqrt(res[0] / (len(col) - 2) * np.linalg.inv(A.T @ A)[1, 1])

    t = np.array([t_hc0(x[:, j]) for j in range(x.shape[1])])
    for t_min in (0.5, 1.0, 2.0, 3.0):
        got = screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), t_min, robust=True).tolist()
        assert got == [j for j in range(x.shape[1]) if abs(t[j]) > t_min], (t_min, t)
    t4 = t_ols(x[:, 4])
    assert abs(t4) > 1.5 * abs(t[4])  # the ordinary error is too small where the variance moves with x
    cut = (abs(t[4]) + abs(t4)) / 2
    plain = screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), cut).tolist()
    robust = screen_columns(torch.from_numpy(x), torch.from_numpy(fresh), cut, robust=True).tolist()
    assert 4 in plain and 4 not in robust
