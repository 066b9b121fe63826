"""Rules beside every policy, fitted on a fold's train slice only: a supervised linear
baseline, and the planted market's oracle. Vectorised on the device, milliseconds a fold.

    rule = fit_rule(train_x, train_fresh, cost)   # ridge + hysteresis
    positions = rule.positions(x)            # (T,) int8 on any window's normalised inputs

The supervised baseline: a ridge regression of the next-h-bar return on the fold's
normalised inputs (all 50 columns), then a cost-aware hysteresis rule on its
prediction s: enter long when s > enter, stay long while s > exit (short
symmetrically), flat otherwise. h, enter and exit are picked by the rule's net
Sharpe on the train slice, at the experiment's cost. The oracle is the same fit
restricted to the columns (and the hours) where fxray.data.synth planted its
signal: what a trader who knew where the edge lives would do with the same data. On a
nonlinear planted market the oracle's ridge reads the planted function of those columns
(`form`, form_inputs), which no linear rule on the inputs can express.

With a screen (fxray.rl.frontend.screened_inputs) the rule reads the screened terms of the
inputs (`Terms`): inputs and pairwise products of inputs (squares included) whose robust
next-bar t passes, so that an edge which is a product of two inputs, a sign set by another
input, or a level of |x| (an even function: x squared) has a term a ridge can weigh.

The hysteresis path is sequential in the position, so it is run as the greedy
backtest runs a policy: each bar maps the previous position to the next (hysteresis_moves),
and the maps are composed in a log-depth scan (fxray.eval.backtest.compose); fit_rule runs the
whole threshold grid of a horizon as one batch of paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fxray.eval.backtest import compose

RIDGE = 0.1  # ridge penalty per row, on normalised inputs (XtX / n is near a correlation matrix)
HORIZONS = (5, 20, 60)  # bars ahead the regression predicts
ENTER_QUANTILES = (0.6, 0.8, 0.9, 0.97)  # of |prediction| on train
EXIT_SHARES = (0.0, 0.5)  # exit threshold as a share of the enter threshold


def form_inputs(cols: torch.Tensor, form) -> torch.Tensor:
    """(T, 1) float64: a nonlinear planted market's f (fxray.data.synth) from its columns (T, k)
    of normalised inputs, by `form` [name, *parameters]: the input the oracle's ridge sees.
    "product": a b; "signed": view x sign(regime); "threshold" (c, p): 1{|u| > c} - p;
    "hold" (seen, bars): the value of the last |event| > seen within `bars` bars, else 0."""
    name, *par = form
    x = cols.double()
    if name == "product":
        f = x[:, 0] * x[:, 1]
    elif name == "signed":
        f = x[:, 0] * torch.sign(x[:, 1])
    elif name == "threshold":
        f = (x[:, 0].abs() > par[0]).double() - par[1]
    elif name == "hold":
        t = torch.arange(x.shape[0], device=x.device)
        last = torch.cummax(torch.where(x[:, 0].abs() > par[0], t, -1), 0).values
        f = torch.where((last >= 0) & (t - last < int(par[1])), x[last.clamp_min(0), 0], 0.0)
    else:
        raise ValueError(f"oracle form {name!r} must be one of {', '.join(FORMS)}")
    return f[:, None]


FORMS = ("product", "signed", "threshold", "hold")


@dataclass(frozen=True)
class Terms:
    """k terms of the normalised inputs x: row (i, -1) of `index` is x_i, row (i, j) the product
    (x_i - m_i)(x_j - m_j) (i == j: a square) of the inputs less their train slice's means
    (`shift`), each term then centred and scaled by its train slice's mean and std (an input
    term by 0 and 1: it reads x_i exactly)."""

    index: torch.Tensor  # (k, 2) int64
    shift: torch.Tensor  # (k, 2) float64: m_i, m_j (0 for an input term)
    center: torch.Tensor  # (k,) float64
    scale: torch.Tensor  # (k,) float64

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(T, k) float64 of x (T, n_inputs)."""
        xd = x.double()
        j = self.index[:, 1]
        other = torch.where(j >= 0, xd[:, j.clamp_min(0)] - self.shift[:, 1], xd.new_ones(()))
        return ((xd[:, self.index[:, 0]] - self.shift[:, 0]) * other - self.center) / self.scale

    def numel(self) -> int:
        return int(self.index.shape[0])

    def nonlinear_inputs(self) -> list[int]:
        """The inputs of the product terms, each once, in the terms' order (the learner reads them raw)."""
        return list(dict.fromkeys(self.index[self.index[:, 1] >= 0].flatten().tolist()))

    def linear_inputs(self) -> torch.Tensor:
        """(m,) int64: the inputs kept as terms of their own."""
        return self.index[self.index[:, 1] < 0, 0]


def _columns(x: torch.Tensor, columns) -> torch.Tensor:
    """x's columns a rule reads: all (None), an index (k,), or screened Terms."""
    if columns is None:
        return x
    return columns(x) if isinstance(columns, Terms) else x[:, columns]


@dataclass(frozen=True)
class Rule:
    weights: torch.Tensor  # (k,) float64 on the columns `columns`
    columns: torch.Tensor | Terms | None  # (k,) int64 indices into the inputs, screened Terms, None = all
    enter: float
    exit: float
    horizon: int
    train_sharpe: float  # per bar, net, on the train slice (what chose the thresholds)
    form: tuple | None = None  # the columns through form_inputs first (a nonlinear market's oracle)

    def signal(self, x: torch.Tensor) -> torch.Tensor:
        cols = _columns(x, self.columns)
        if self.form is not None:
            cols = form_inputs(cols, self.form)
        return cols.double() @ self.weights

    def positions(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """(T,) int8 positions on normalised inputs x (T, n_inputs); where `gate` is False, flat."""
        s = self.signal(x)
        if gate is not None:
            s = torch.where(gate, s, torch.zeros_like(s))
        return hysteresis(s, self.enter, self.exit)


def hysteresis(signal: torch.Tensor, enter, exit) -> torch.Tensor:
    """(T,) int8: long from signal > enter until signal <= exit, short mirrored, else flat; from flat.
    With enter and exit tensors (R, 1): (R, T), the R rules' paths in one scan."""
    return compose(hysteresis_moves(signal, enter, exit))


def net_returns(position: torch.Tensor, fresh: torch.Tensor, cost: float, carry=None) -> torch.Tensor:
    """Per-bar net returns of a path (..., T) (the backtest's convention, without its bookkeeping)."""
    pos = position.to(torch.float64)
    prev = torch.cat((pos.new_zeros(*pos.shape[:-1], 1), pos[..., :-1]), -1)
    out = pos * fresh.double() - cost * (pos - prev).abs()
    return out if carry is None else out + prev * carry.double()


def forward_sum(fresh: torch.Tensor, h: int) -> torch.Tensor:
    """(T,) sum of fresh[t .. t+h-1], truncated at the end (the regression's target)."""
    c = torch.cat((fresh.new_zeros(1, dtype=torch.float64), fresh.double().cumsum(0)))
    idx = torch.arange(fresh.shape[0], device=fresh.device)
    return c[torch.clamp(idx + h, max=fresh.shape[0])] - c[idx]


def ridge_gram(X: torch.Tensor) -> torch.Tensor:
    """(k, k) X'X + RIDGE n I for float64 rows X (n, k): the ridge regression's normal matrix."""
    n, k = X.shape
    return X.T @ X + RIDGE * max(n, 1) * torch.eye(k, dtype=torch.float64, device=X.device)


def screen_columns(
    x: torch.Tensor, fresh: torch.Tensor, t_min: float, candidates=None, robust: bool = False
) -> torch.Tensor:
    """(k,) int64: the columns of x (n, n_inputs), among `candidates` (None = all), whose
    univariate least-squares slope on the next bar's fresh return (n,) has |t| > t_min, with
    t = slope / its standard error, on these rows only (a train slice).

    A screen of the inputs before the ridge: the next bar's return, not the next h bars', so
    that the rows' errors do not overlap and a slow input (a trend or volatility level, which
    a 60-day slice's drift correlates with) gets no more t than its evidence. The standard
    error is the ordinary one (homoskedastic errors), or with `robust` White's (1980)
    heteroskedasticity-consistent HC0: sum((x - mean x)^2 e^2) / sxx^2, for returns whose
    variance moves with the volatility regime and the hour, as a market's do. Measured against
    the ridge on every input in docs/benchmarks.md ("Fresh draws", "A robust screen")."""
    cols = _candidates(x, candidates)
    t = t_statistics(x[:, cols], fresh, robust)
    return cols[t.abs() > t_min]


def _candidates(x: torch.Tensor, candidates) -> torch.Tensor:
    """(k,) int64 on x's device: the columns `candidates` names, None = all."""
    if candidates is None:
        return torch.arange(x.shape[1], device=x.device)
    return torch.as_tensor(candidates, device=x.device)


def t_statistics(X: torch.Tensor, fresh: torch.Tensor, robust: bool = True) -> torch.Tensor:
    """(k,) float64: each column of X (n, k) alone, its least-squares slope on fresh (n,) over
    its standard error (screen_columns)."""
    X, y = X.double(), fresh.double()
    Xc, yc = X - X.mean(0), y - y.mean()
    sxx = (Xc**2).sum(0)
    slope = (Xc.T @ yc) / sxx.clamp_min(1e-300)
    if robust:  # each column's own residuals e = yc - slope x_c, weighted by x_c^2
        meat = ((Xc**2) * (yc[:, None] - Xc * slope) ** 2).sum(0)
        se = torch.sqrt(meat) / sxx.clamp_min(1e-300)
    else:
        resid = ((yc**2).sum() - slope**2 * sxx).clamp_min(0.0)  # per column: the residual sum of squares
        se = torch.sqrt(resid / max(len(y) - 2, 1) / sxx.clamp_min(1e-300))
    return torch.where((sxx > 0) & (se > 0), slope / se, torch.zeros_like(slope))


def pair_t(t_min: float, n_inputs: int, n_pairs: int) -> float:
    """The |t| a product term must pass: the two-sided tail of N(0, 1) beyond t_min, times
    n_inputs / n_pairs, so that the n_pairs products expect as many chance passes as the
    n_inputs inputs do at t_min (a Bonferroni share; t_min 3 over 46 inputs: 3.87)."""
    tail = math.erfc(t_min / math.sqrt(2)) * n_inputs / max(n_pairs, 1)
    return -float(torch.special.ndtri(torch.tensor(tail / 2, dtype=torch.float64)))


def screen_terms(x: torch.Tensor, fresh: torch.Tensor, t_min: float, candidates=None) -> Terms:
    """Terms (`Terms`) of x (n, n_inputs) among `candidates` (None = all) whose robust next-bar
    t passes: each input at t_min (screen_columns); then each product of two of them (i <= j,
    of the inputs less their means on these rows) at pair_t (one product family: as many chance
    passes as the inputs'), on the next bar's return less its least-squares fit on the inputs
    kept (a product passes for what the inputs do not already say). Inputs first, in column
    order, then products in (i, j) order."""
    cols = _candidates(x, candidates)
    linear = screen_columns(x, fresh, t_min, cols, robust=True)
    y = fresh.double() - fresh.double().mean()
    if len(linear):
        kept = x[:, linear].double()
        kept = kept - kept.mean(0)
        y = y - kept @ torch.linalg.lstsq(kept, y[:, None]).solution[:, 0]
    xd = x[:, cols].double()
    means = xd.mean(0)
    xd = xd - means
    m = len(cols)
    i, j = torch.triu_indices(m, m, device=x.device)  # the pairs i <= j, in (i, j) order
    t, mean, sd = [], [], []
    for a in range(m):  # the products of input a with a..m-1: (n, m - a) at a time
        prod = xd[:, a : a + 1] * xd[:, a:]
        t.append(t_statistics(prod, y))
        mean.append(prod.mean(0))
        sd.append(prod.std(0))
    mean, sd = torch.cat(mean), torch.cat(sd)
    ok = (sd > 1e-12) & (torch.cat(t).abs() > pair_t(t_min, m, len(i)))
    i, j = i[ok], j[ok]
    f64 = dict(dtype=torch.float64, device=x.device)
    return Terms(
        torch.cat((torch.stack((linear, torch.full_like(linear, -1)), 1), torch.stack((cols[i], cols[j]), 1))),
        torch.cat((torch.zeros(len(linear), 2, **f64), torch.stack((means[i], means[j]), 1))),
        torch.cat((torch.zeros(len(linear), **f64), mean[ok])),
        torch.cat((torch.ones(len(linear), **f64), sd[ok])),
    )


HOLDOUT = 1 / 3  # the share of a train slice that checks the screened rule (checked_screen)


def checked_screen(
    x: torch.Tensor, fresh: torch.Tensor, cost: float, t_min: float, candidates=None, *, carry=None, holdout=HOLDOUT
) -> Terms:
    """`screen_terms` (robust t) on these rows (a train slice), kept only if the
    screened rule earns out of its own sample inside them: screened and fitted (fit_rule) on
    the first 1 - `holdout` of the rows, its positions on the rest must make a positive net
    return at `cost`; else no term (a flat rule, a front end with no prediction).

    A screen of day-long slopes keeps inputs whose edge a rule cannot earn (on a market whose
    edge is on a few hours a day, the views of it outside those hours cost more than they
    make): the held-out tail of the slice is where that shows, before any val or test bar is
    read. Measured: docs/benchmarks.md "A screen that must earn on the train slice's tail"."""
    cut = int(x.shape[0] * (1 - holdout))
    inner = screen_terms(x[:cut], fresh[:cut], t_min, candidates)
    if inner.numel() == 0:
        return inner
    head_carry, tail_carry = (None, None) if carry is None else (carry[:cut], carry[cut:])
    rule = fit_rule(x[:cut], fresh[:cut], cost, carry=head_carry, columns=inner)
    earned = net_returns(rule.positions(x[cut:]), fresh[cut:], cost, tail_carry).sum()
    if not float(earned) > 0:
        return Terms(inner.index[:0], inner.shift[:0], inner.center[:0], inner.scale[:0])
    return screen_terms(x, fresh, t_min, candidates)


def hysteresis_moves(signal: torch.Tensor, enter, exit) -> torch.Tensor:
    """(..., T, 3) int64: the rule's new position index (0 short, 1 flat, 2 long) at each bar from
    each previous one: enter beyond +-enter, hold while beyond +-exit, else flat."""
    up, down = signal > enter, signal < -enter
    hold_long, hold_short = signal > exit, signal < -exit
    flat_to = torch.where(up, 2, torch.where(down, 0, 1))
    long_to = torch.where(down, 0, torch.where(hold_long, 2, 1))
    short_to = torch.where(up, 2, torch.where(hold_short, 0, 1))
    return torch.stack((short_to, flat_to, long_to), dim=-1)


def fit_rule(
    x: torch.Tensor, fresh: torch.Tensor, cost: float, *, carry=None, columns=None, gate=None, form=None
) -> Rule:
    """Ridge + hysteresis fitted on train inputs x (n, n_inputs) and their fresh returns (n,).

    `columns` restricts the regression to those inputs; `gate` (n,) bool restricts it to
    those bars (and holds the rule flat elsewhere); `form` regresses on form_inputs of the
    columns instead (a nonlinear planted market's oracle). A train slice with no usable
    signal gives an all-zero rule (flat)."""
    cols = _columns(x, columns)
    form = tuple(form) if form is not None else None
    X = form_inputs(cols, form) if form is not None else cols.double()
    rows = gate if gate is not None else torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
    Xg = X[rows]
    gram = ridge_gram(Xg)
    # every (horizon, enter quantile, exit share) candidate on the device, then one host sync
    q = torch.tensor(ENTER_QUANTILES, device=X.device)
    share = torch.tensor(EXIT_SHARES, dtype=torch.float64, device=X.device)
    weights, enters, sharpes = [], [], []
    for h in HORIZONS:
        y = forward_sum(fresh, h)[rows]
        w = torch.linalg.solve(gram, Xg.T @ y)
        s = X @ w
        if gate is not None:
            s = torch.where(gate, s, torch.zeros_like(s))
        mags = s[rows].abs().float()
        enter = torch.quantile(mags, q).double() if mags.numel() else q.new_zeros(len(q), dtype=torch.float64)
        enter = enter.repeat_interleave(len(share))  # (R,): each quantile's with every exit share
        r = net_returns(hysteresis(s, enter[:, None], (enter * share.repeat(len(q)))[:, None]), fresh, cost, carry)
        mean, sd = r.mean(-1), r.std(-1)
        weights.append(w)
        enters.append(enter)
        sharpes.append(torch.where(sd > 0, mean / sd, -math.inf))
    enters, sharpes = torch.stack(enters).tolist(), torch.stack(sharpes).tolist()
    best = None
    for i, h in enumerate(HORIZONS):  # the first best in grid order, as a loop over the grid would keep
        for j, (enter, sharpe) in enumerate(zip(enters[i], sharpes[i])):
            if best is None or sharpe > best.train_sharpe:
                exit = EXIT_SHARES[j % len(EXIT_SHARES)] * enter
                best = Rule(weights[i], columns, enter, exit, h, sharpe, form)
    if not best.train_sharpe > 0:  # nothing pays on train: stay flat
        return Rule(X.new_zeros(X.shape[1]), columns, math.inf, math.inf, 1, 0.0, form)
    return best
