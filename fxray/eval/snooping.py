"""Is the best trial better than luck? The data-snooping tests of a sweep's trials.

    m = rung_matrix(trials, k, "test")            # the trials that ran folds 0..k-1, their hourly returns
    s = superior_ability(m.returns, benchmark, m.trial_ids)   # Reality Check, SPA, StepM (arch)
    p = placebo_pvalue(real_best, [placebo bests...])          # the whole search, re-training included

`trials`: [{"trial_id", "folds": {k: {"val": periods, "test": periods}}}], each fold's
windows' hourly returns (fxray.eval.backtest.PeriodReturns.as_dict()), as
fxray.eval.selection.walk_forward takes them; PBO by CSCV is fxray.eval.cscv.

Why per rung: ASHA stops most trials after a fold or two, so the trials did not all run
the same folds. A test across trials needs one matrix of the same hours: rung k is the
trials that ran at least folds 0..k-1, on those folds' windows. The headline is the
deepest rung (the trials that ran every fold, among which the sweep picks its best);
the shallower rungs hold more trials on fewer hours. ASHA chose which trials go on by
their val windows only, so the test hours of every rung are untouched by that choice.

arch 8.0.0's SPA does not studentize its statistic (`studentize` only sets Hansen's
re-centring threshold; a later arch does). Hansen's SPA is the max over models of the
studentized mean excess return (or 0 when none is positive: then p = 1), with the
full-sample long-run standard deviation in the bootstrap too, so each column is divided
by its own long-run standard deviation (`long_run_std`: the stationary bootstrap's
kernel, as arch computes it) before arch sees it: the statistic and its bootstrap are
then Hansen's, and a high-volatility trial no longer decides the maximum alone. White's
Reality Check is the unstudentized test with every model re-centred (arch's "upper"
p-value).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

REPS = 1000  # bootstrap replications
SEED = 0  # the bootstrap's seed: a sweep's verdict is reproducible
SIZE = 0.05  # StepM's family-wise error rate


@dataclass(frozen=True)
class RungMatrix:
    """The hourly net returns of the trials that ran folds 0..k-1, on those folds' windows."""

    trial_ids: list  # column order
    returns: np.ndarray  # (T, n) float64: hour x trial, the folds' windows concatenated in fold order
    benchmark: np.ndarray | None  # (T,) buy-and-hold on the same hours (test windows only), or None


def folds_run(trial: dict) -> int:
    """How many folds the trial ran from fold 0 without a gap (ASHA stops at a rung)."""
    return next(k for k in itertools.count() if k not in trial["folds"])


def rungs(trials: list[dict]) -> list[int]:
    """The distinct numbers of folds the trials ran, ascending (ASHA's rungs, and the end)."""
    return sorted({folds_run(t) for t in trials} - {0})


def rung_matrix(trials: list[dict], k: int, window: str = "test", buy_and_hold: dict | None = None) -> RungMatrix:
    """Rung k's matrix of `window` ("val" or "test") returns; `buy_and_hold` {fold: periods}
    gives the benchmark row (test windows). ValueError when two trials' hours differ on a
    fold (they did not run the same folds: not one sweep)."""
    ran = [t for t in trials if folds_run(t) >= k]
    cols, hours = [], None
    for t in ran:
        net = np.concatenate([np.asarray(t["folds"][j][window]["net"], np.float64) for j in range(k)])
        h = np.concatenate([np.asarray(t["folds"][j][window]["hours"], np.int64) for j in range(k)])
        if hours is None:
            hours = h
        elif not np.array_equal(h, hours):
            raise ValueError(f"trial {t['trial_id']}: its {window} hours on folds 0..{k - 1} differ from the others'")
        cols.append(net)
    bench = None
    if buy_and_hold is not None and all(j in buy_and_hold for j in range(k)):
        bench = np.concatenate([np.asarray(buy_and_hold[j]["net"], np.float64) for j in range(k)])
        if hours is not None and bench.size != hours.size:
            raise ValueError(f"buy-and-hold's {window} windows on folds 0..{k - 1} differ from the trials'")
    returns = np.stack(cols, axis=1) if cols else np.zeros((0, 0))
    return RungMatrix([t["trial_id"] for t in ran], returns, bench)


# --- the bootstrap's ingredients ------------------------------------------------------------


def long_run_std(x: np.ndarray, block_size: float) -> np.ndarray:
    """(k,) long-run standard deviation of each column of x (T, k), sqrt(T Var(mean)), with
    the stationary bootstrap's kernel (Politis & Romano 1994; arch's SPA uses the same):
    var = g_0 + 2 sum_{i>=1} kappa_i g_i, kappa_i = (1 - i/T) q^i + (i/T) q^(T-i), q = 1 - 1/b,
    g_i = sum_t x_t x_{t+i} / T of the demeaned columns. Autocovariances by FFT."""
    t = x.shape[0]
    d = x - x.mean(axis=0)
    n = 1 << int(math.ceil(math.log2(max(2 * t, 2))))
    spec = np.fft.rfft(d, n=n, axis=0)
    acov = np.fft.irfft(spec * np.conj(spec), n=n, axis=0)[:t] / t  # (T, k): g_0 .. g_{T-1}
    i = np.arange(1, t, dtype=np.float64)
    q = 1.0 - 1.0 / block_size
    kappa = (1.0 - i / t) * q**i + (i / t) * q ** (t - i)
    var = acov[0] + 2.0 * (kappa[:, None] * acov[1:]).sum(axis=0)
    return np.sqrt(np.maximum(var, 0.0))


def block_size(x: np.ndarray) -> int:
    """The stationary bootstrap's mean block length from the data: the median over columns
    of Politis & White's (2004, corrected 2009) optimal length (arch.bootstrap.optimal_block_length),
    rounded up, between 1 and T / 4."""
    from arch.bootstrap import optimal_block_length

    lengths = optimal_block_length(x)["stationary"].to_numpy()
    lengths = lengths[np.isfinite(lengths)]
    b = math.ceil(float(np.median(lengths))) if lengths.size else 1
    return int(min(max(b, 1), max(x.shape[0] // 4, 1)))


# --- Reality Check, SPA, StepM ---------------------------------------------------------------


def superior_ability(returns: np.ndarray, benchmark: np.ndarray | None, trial_ids: list, reps=REPS, seed=SEED) -> dict:
    """White's Reality Check, Hansen's SPA and Romano & Wolf's StepM of the trials' hourly
    returns (T, n) against `benchmark` (T,) (None: flat, whose returns are 0).

    H0 of RC and SPA: no trial's expected hourly return exceeds the benchmark's. A trial
    identical to the benchmark in every hour (one that never traded, against flat) cannot
    exceed it and has no variance to studentize: it is left out (`n_identical`). StepM
    keeps the trials it finds better than the benchmark, family-wise error SIZE.
    None p-values when no trial differs from the benchmark."""
    from arch.bootstrap import SPA, RealityCheck

    bench = np.zeros(returns.shape[0]) if benchmark is None else np.asarray(benchmark, np.float64)
    excess = returns - bench[:, None]  # (T, n) the trials' hourly returns over the benchmark's
    varies = excess.std(axis=0) > 0 if excess.size else np.zeros(0, bool)
    out = {
        "n_trials": int(returns.shape[1]) if returns.ndim == 2 else 0,
        "n_identical": int((~varies).sum()),
        "n_periods": int(returns.shape[0]),
        "reps": reps,
        "seed": seed,
    }
    out |= dict.fromkeys(("spa_pvalue", "spa_pvalue_lower", "spa_pvalue_upper", "reality_check_pvalue"))  # None
    out |= {"stepm_kept": [], "stepm_size": SIZE, "block_size": None}
    if excess.shape[0] < 8 or not varies.any():
        return out
    d = excess[:, varies]
    kept_ids = [tid for tid, v in zip(trial_ids, varies) if v]
    b = block_size(d)
    omega = long_run_std(d, b)
    ok = omega > 0
    d, omega, kept_ids = d[:, ok], omega[ok], [tid for tid, o in zip(kept_ids, ok) if o]
    if not kept_ids:
        return out
    zeros = np.zeros(d.shape[0])
    studentized = d / omega  # arch's losses are benchmark - model: pass -d / omega against 0
    options = {"block_size": b, "reps": reps, "bootstrap": "stationary", "seed": seed}
    spa = fast(SPA)(zeros, -studentized, **options)
    spa.compute()
    p = {k: float(v) for k, v in spa.pvalues.items()}
    rc = fast(RealityCheck)(zeros, -d, studentize=False, **options)
    rc.compute()
    superior = stepm_superior(spa, SIZE)  # its first step is this SPA
    if d.mean(axis=0).max() <= 0:
        # Hansen's statistic is max(max_k t_k, 0): 0 when no trial's mean beats the benchmark,
        # and its bootstrap (>= 0) always reaches it: p = 1. arch leaves out the max with 0
        # (its p-value is then about 0.5 instead, for models far below the benchmark).
        p = dict.fromkeys(p, 1.0)
    best = int(np.argmax(d.mean(axis=0) / omega))
    out.update(
        spa_pvalue=p["consistent"],
        spa_pvalue_lower=p["lower"],
        spa_pvalue_upper=p["upper"],
        reality_check_pvalue=float(rc.pvalues["upper"]),
        stepm_kept=sorted(kept_ids[i] for i in superior),
        block_size=b,
        best_t=float(math.sqrt(d.shape[0]) * d[:, best].mean() / omega[best]),
        best_trial_id=kept_ids[best],
    )
    return out


def fast(test: type) -> type:
    """arch's SPA or RealityCheck with its two loops as array operations, the same numbers to
    float rounding (tests/test_snooping.py: equal to arch's own): the long-run variances by FFT
    (`long_run_std`) instead of a loop over the T lags, and each replication's mean excess loss
    as one product of the replications' index counts (the same indices, drawn in the same
    order) instead of three means of a resampled copy: a sweep's end runs four of these tests
    over every trial's test hours, on the driver's CPU while the device waits."""

    class Fast(test):
        def _compute_variance(self) -> None:
            self._loss_diff_var = long_run_std(self._loss_diff, self.block_size) ** 2

        def _simulate_values(self) -> None:
            self._compute_variance()
            self._valid_columns = self._check_column_validity()
            upper = self._loss_diff.mean(0)
            centres = (np.maximum(upper, 0.0), np.where(self._valid_columns, upper, 0.0), upper)  # lower, consistent
            t, reps = self._loss_diff.shape[0], self.reps
            rows = np.stack([self.bootstrap.update_indices() + i * t for i in range(reps)])
            counts = np.bincount(rows.ravel(), minlength=reps * t).reshape(reps, t)
            means = counts @ self._loss_diff / t  # (reps, k)
            self._simulated_vals = np.stack([(means - c).T for c in centres], axis=-1)  # (k, reps, 3)

    return Fast


def stepm_superior(spa, size: float) -> list[int]:
    """Romano & Wolf's StepM as arch's StepM.compute runs it (SPA on the models not yet
    rejected, until a step rejects none), from `spa` computed on all the models (its first
    step; arch's StepM computes that SPA again, from the same seed), and stopped also when
    none is left: arch 8.0's loop tests only the last step's rejections against the number of
    models, so when its steps reject them all between them (the CPU quick start's full trials,
    each beating flat) it runs SPA on no model and raises. Up to that point both are the same
    computation."""
    rest, found = np.ones(spa.k, dtype=bool), []
    while True:
        step = [int(i) for i in spa.better_models(size)]
        found += step
        rest[step] = False
        if not step or not rest.any():
            return sorted(found)
        spa.subset(rest)
        spa.compute()


# --- the placebo sweeps ----------------------------------------------------------------------


def placebo_pvalue(real: float, placebos: list[float]) -> dict:
    """The real sweep's best pooled test Sharpe against the best of each placebo sweep (the
    same search on copies of the data whose returns carry no signal).

    pvalue = (1 + #{placebo >= real}) / (N + 1): the share of sweeps, the real one
    included, that reached the real sweep's value when nothing was there to find (a
    permutation test's p-value; never below 1 / (N + 1)). rank: the real sweep's place,
    1 = above every placebo. z: (real - mean) / std of the placebos, a rough guide when N
    is too small for the rank to say much."""
    values = [float(v) for v in placebos if v is not None and math.isfinite(v)]
    n = len(values)
    if n == 0 or real is None or not math.isfinite(real):
        return {"pvalue": None, "rank": None, "n": n, "z": None, "mean": None, "std": None, "real": real}
    mean = float(np.mean(values))
    std = float(np.std(values, ddof=1)) if n > 1 else None
    return {
        "pvalue": (1 + sum(v >= real for v in values)) / (n + 1),
        "rank": 1 + sum(v > real for v in values),
        "n": n,
        "z": (real - mean) / std if std else None,
        "mean": mean,
        "std": std,
        "real": float(real),
        "placebos": values,
    }
