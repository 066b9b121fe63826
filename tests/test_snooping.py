"""The data-snooping statistics against independent references: Reality Check / SPA / StepM
against arch called directly on a matrix built here by hand, the long-run variance against
a plain loop, PBO by CSCV against a plain-loop implementation of the paper's algorithm."""

import itertools
import math

import numpy as np
import pytest
from arch.bootstrap import SPA, RealityCheck, StepM, optimal_block_length
from scipy.stats import rankdata

from fxray.eval import cscv, snooping


def window(rng, hours, edge=0.0, scale=1e-4, flat=False):
    net = np.zeros(len(hours)) if flat else edge * scale + scale * rng.standard_normal(len(hours))
    return {"net": net.tolist(), "units": [0.0] * len(hours), "hours": list(hours), "n_bars": 60 * len(hours)}


def hand_trials(seed=0, n_folds=3, hours_per_fold=120):
    """Five trials as a sweep's records hold them: two ran every fold (one with an edge), one
    ASHA stopped after 2 folds, one after 1, one never traded."""
    rng = np.random.default_rng(seed)
    hours = [range(1000 * k, 1000 * k + hours_per_fold) for k in range(n_folds)]

    def trial(tid, n, edge=0.0, flat=False):
        folds = {
            k: {"val": window(rng, hours[k], edge, flat=flat), "test": window(rng, hours[k], edge, flat=flat)}
            for k in range(n)
        }
        return {"trial_id": tid, "folds": folds}

    trials = [trial("a", 3, edge=0.25), trial("b", 3), trial("c", 2), trial("d", 1), trial("flat", 3, flat=True)]
    bh = {k: window(rng, hours[k], 0.05) for k in range(n_folds)}
    return trials, bh


def plain_long_run_var(x, b):
    """arch's non-nested SPA variance, written out (one loop over lags)."""
    t = x.shape[0]
    d = x - x.mean(0)
    p = 1.0 / b
    var = (d**2).sum(0) / t
    for i in range(1, t):
        kappa = (1 - i / t) * (1 - p) ** i + (i / t) * (1 - p) ** (t - i)
        var += 2 * kappa * (d[: t - i] * d[i:]).sum(0) / t
    return var


def test_long_run_std_is_the_stationary_bootstrap_kernel():
    x = np.random.default_rng(1).standard_normal((300, 4)).cumsum(0) * 0.01 + np.random.default_rng(2).standard_normal(
        (300, 4)
    )
    for b in (1.0, 3.0, 17.0):
        assert snooping.long_run_std(x, b) ** 2 == pytest.approx(plain_long_run_var(x, b), rel=1e-10)


def test_rungs_and_matrices_are_built_from_the_folds_each_trial_ran():
    trials, bh = hand_trials()
    assert snooping.rungs(trials) == [1, 2, 3]
    m = snooping.rung_matrix(trials, 3, "test", bh)
    assert m.trial_ids == ["a", "b", "flat"] and m.returns.shape == (360, 3)
    assert np.array_equal(m.returns[:, 1], np.concatenate([trials[1]["folds"][k]["test"]["net"] for k in range(3)]))
    assert np.array_equal(m.benchmark, np.concatenate([bh[k]["net"] for k in range(3)]))
    m1 = snooping.rung_matrix(trials, 1, "val")
    assert m1.trial_ids == ["a", "b", "c", "d", "flat"] and m1.returns.shape == (120, 5)
    trials[1]["folds"][0]["test"]["hours"] = [h + 1 for h in trials[1]["folds"][0]["test"]["hours"]]
    with pytest.raises(ValueError, match="trial b: its test hours on folds 0..2 differ"):
        snooping.rung_matrix(trials, 3, "test")


@pytest.mark.parametrize("against", ["flat", "buy_and_hold"])
def test_rc_spa_stepm_equal_arch_called_directly_on_the_same_matrix(against):
    trials, bh = hand_trials()
    m = snooping.rung_matrix(trials, 3, "test", bh)
    bench = m.benchmark if against == "buy_and_hold" else None
    got = snooping.superior_ability(m.returns, bench, m.trial_ids, reps=500, seed=7)
    # the matrix by hand: trials a and b, every fold's test hours in fold order ("flat" is
    # identical to the flat benchmark and is left out there; against buy-and-hold it is not)
    cols = {tid: np.concatenate([t["folds"][k]["test"]["net"] for k in range(3)]) for tid, t in zip("ab", trials[:2])}
    if against == "buy_and_hold":
        cols["flat"] = np.zeros(360)
    b = np.zeros(360) if bench is None else np.concatenate([bh[k]["net"] for k in range(3)])
    d = np.stack([cols[k] - b for k in cols], axis=1)
    block = int(min(max(math.ceil(np.median(optimal_block_length(d)["stationary"])), 1), 90))
    omega = np.sqrt(plain_long_run_var(d, block))
    spa = SPA(np.zeros(360), -d / omega, block_size=block, reps=500, seed=7)
    spa.compute()
    rc = RealityCheck(np.zeros(360), -d, block_size=block, reps=500, seed=7)
    rc.compute()
    stepm = StepM(np.zeros(360), -d / omega, block_size=block, reps=500, seed=7)
    stepm.compute()
    assert got["block_size"] == block
    assert got["n_identical"] == (1 if against == "flat" else 0)
    assert got["spa_pvalue"] == spa.pvalues["consistent"] and got["spa_pvalue_upper"] == spa.pvalues["upper"]
    assert got["reality_check_pvalue"] == rc.pvalues["upper"]
    assert got["stepm_kept"] == sorted(list(cols)[i] for i in stepm.superior_models)
    # and the planted edge is found: trial a, 0.25 sd an hour over 360 hours (t ~ 4.7)
    assert got["spa_pvalue"] < 0.05 and "a" in got["stepm_kept"] and "b" not in got["stepm_kept"]


@pytest.mark.parametrize("test", [SPA, RealityCheck])
def test_the_fast_bootstrap_tests_are_arch_s_own_numbers(test):
    """snooping.fast(test): the same p-values and better models as arch's class, on a matrix of
    a sweep's shape (many trials, some better than the benchmark, blocks of hours)."""
    rng = np.random.default_rng(5)
    losses = rng.standard_normal((700, 24)) + np.linspace(-0.2, 0.15, 24)
    losses[1:] += 0.4 * losses[:-1]  # serially correlated, as hourly returns of held positions are
    options = {"block_size": 3, "reps": 400, "seed": 11}
    plain, quick = test(np.zeros(700), -losses, **options), snooping.fast(test)(np.zeros(700), -losses, **options)
    plain.compute()
    quick.compute()
    assert quick.pvalues.to_dict() == plain.pvalues.to_dict()
    for level in (0.01, 0.05, 0.5):  # quantiles of the bootstrap distribution, to float rounding
        np.testing.assert_allclose(quick.critical_values(level), plain.critical_values(level), rtol=1e-12, atol=0)
    assert list(quick.better_models(0.05)) == list(plain.better_models(0.05)) != []


@pytest.mark.parametrize("edge_b, seed", [(0.07, 0), (0.10, 1), (0.25, 0), (0.0, 0)])
def test_stepm_keeps_every_trial_when_its_steps_reject_them_all(edge_b, seed):
    """Trial a beats flat by far, b barely: in the first two cases StepM's first step rejects
    a only and its second rejects b (arch 8.0's StepM.compute then runs SPA on no model and
    raises); in the third one step rejects both, in the fourth b is never rejected. The
    steps by hand (SPA on the models left, until a step rejects none) are the reference."""
    r = np.random.default_rng(seed).normal(0.0, 1.0, (400, 2))
    r[:, 0] += 1.0
    r[:, 1] += edge_b
    got = snooping.superior_ability(r, None, ["a", "b"])
    b = got["block_size"]
    omega = np.sqrt(plain_long_run_var(r, b))
    spa = SPA(np.zeros(400), -r / omega, block_size=b, reps=1000, seed=0)
    left, kept = np.ones(2, dtype=bool), []
    while left.any():
        spa.subset(left)
        spa.compute()
        step = [int(i) for i in spa.better_models(0.05)]
        if not step:
            break
        kept += step
        left[step] = False
    assert got["stepm_kept"] == sorted("ab"[i] for i in kept)
    assert got["stepm_kept"] == (["a"] if edge_b == 0.0 else ["a", "b"])
    if edge_b in (0.07, 0.10):  # the case arch's own loop cannot finish
        stepm = StepM(np.zeros(400), -r / omega, block_size=b, reps=1000, seed=0)
        with pytest.raises(ValueError, match="zero-size array"):
            stepm.compute()


def test_spa_without_an_edge_and_without_a_trade():
    rng = np.random.default_rng(3)
    noise = rng.standard_normal((500, 6)) * 1e-4
    got = snooping.superior_ability(noise, None, list("uvwxyz"), reps=300)
    assert got["spa_pvalue"] > 0.1 and got["stepm_kept"] == []
    losers = snooping.superior_ability(noise - 3e-5, None, list("uvwxyz"), reps=300)  # every trial below flat
    assert losers["spa_pvalue"] == 1.0 and losers["reality_check_pvalue"] > 0.9  # Hansen's max(T, 0) = 0
    spa = SPA(np.zeros(500), -(noise - 3e-5), block_size=losers["block_size"], reps=300, seed=0)
    spa.compute()
    assert 0.05 < spa.pvalues["consistent"] < 0.95  # what arch alone says there
    flat = snooping.superior_ability(np.zeros((500, 3)), None, list("xyz"))
    assert flat["spa_pvalue"] is None and flat["n_identical"] == 3 and flat["stepm_kept"] == []


def plain_pbo(m, s):
    """The paper's CSCV, written as its steps read (Bailey et al. 2017, section 2.2)."""
    t, n = m.shape
    size = t // s
    m = m[t - size * s :]
    blocks = [m[i * size : (i + 1) * size] for i in range(s)]

    def sharpe(x):
        sd = x.std(ddof=1)
        return x.mean() / sd if sd > 0 else 0.0

    logits, pairs = [], []
    for ins in itertools.combinations(range(s), s // 2):
        train = np.concatenate([blocks[i] for i in ins])
        test = np.concatenate([blocks[i] for i in range(s) if i not in ins])
        r = [sharpe(train[:, j]) for j in range(n)]
        r_bar = [sharpe(test[:, j]) for j in range(n)]
        best = int(np.argmax(r))
        w = rankdata(r_bar)[best] / (n + 1)
        logits.append(math.log(w / (1 - w)))
        pairs.append((r[best], r_bar[best]))
    return np.array(logits), np.array(pairs)


@pytest.mark.parametrize("n_trials,s", [(5, 6), (12, 8), (3, 4)])
def test_pbo_equals_a_plain_loop_implementation_of_cscv(n_trials, s):
    rng = np.random.default_rng(n_trials)
    m = rng.standard_normal((203, n_trials)) + 0.05 * np.arange(n_trials)  # 203: 203 mod S hours are dropped
    m[:, 0] = 0.0  # a trial that never traded ties with itself everywhere
    got = cscv.pbo(m, n_blocks=s)
    logits, pairs = plain_pbo(m, s)
    assert got["n_blocks"] == s and got["n_splits"] == math.comb(s, s // 2) == len(logits)
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-12)
    assert got["pbo"] == np.mean(logits <= 0)
    np.testing.assert_allclose(got["is_sharpe"], pairs[:, 0], rtol=1e-9)
    np.testing.assert_allclose(got["oos_sharpe"], pairs[:, 1], rtol=1e-9)
    slope, intercept = np.polyfit(pairs[:, 0], pairs[:, 1], 1)
    assert got["degradation"]["slope"] == pytest.approx(slope) and got["prob_oos_loss"] == np.mean(pairs[:, 1] < 0)


def test_pbo_of_a_real_edge_and_of_pure_noise():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((1600, 20))
    edge = noise.copy()
    edge[:, 3] += 0.3  # one trial with a real edge: picked in sample, top out of sample
    assert cscv.pbo(edge)["pbo"] < 0.05
    overfit = cscv.pbo(noise)  # no trial is better: the pick is a coin flip out of sample
    assert 0.3 < overfit["pbo"] < 0.7
    assert overfit["degradation"]["oos_sharpe_mean"] < 0.5 * overfit["degradation"]["is_sharpe_mean"]
    assert cscv.pbo(noise[:, :1]) is None and cscv.pbo(noise[:3]) is None
    # trials that are all the same (a sweep whose every trial stayed flat): no search, no PBO
    # (ties averaged, it would read 1.0); one trial that differs anywhere makes it defined
    same = np.repeat(noise[:, :1], 5, axis=1)
    assert cscv.pbo(np.zeros_like(noise)) is None and cscv.pbo(same) is None
    same[7, 2] += 1e-4
    assert cscv.pbo(same) is not None
    assert cscv.blocks_for(9) == 4 and cscv.blocks_for(1000) == 16


def test_placebo_pvalue_is_the_rank_among_all_sweeps():
    p = snooping.placebo_pvalue(2.0, [0.5, -1.0, 2.5, 0.0])
    assert p["pvalue"] == pytest.approx(2 / 5) and p["rank"] == 2 and p["n"] == 4
    assert snooping.placebo_pvalue(9.0, [0.5, -1.0, 2.5, 0.0])["pvalue"] == pytest.approx(1 / 5)
    assert snooping.placebo_pvalue(-9.0, [0.5, -1.0])["pvalue"] == 1.0
    tie = snooping.placebo_pvalue(1.0, [1.0, 0.0])  # a tie counts against the real sweep
    assert tie["pvalue"] == pytest.approx(2 / 3) and tie["rank"] == 1
    none = snooping.placebo_pvalue(1.0, [])
    assert none["pvalue"] is None and none["n"] == 0
