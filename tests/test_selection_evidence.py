"""Selection needs evidence (issue 53): what a fold may keep (fxray.eval.selection.keeps, with
`dqn.keep: won` the shipped experiments' rule) and whether val ranked the trials as test did
(fxray.eval.selection.spearman, results.json's `selection`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from test_backtest import window_of

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.eval import pooled, selection
from fxray.eval.backtest import Window, evaluate
from fxray.rl.checkpoint import abstained
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.trainer import Trainer
from fxray.track.results import selection_line, val_test_ranks

COST, PPY = 4e-5, 6260.0
BARS_PER_HOUR, HOURS_PER_DAY, DAYS = 6, 24, 5
TINY = DQNConfig(
    hidden=32, num_envs=16, batch_size=64, buffer_steps=32, episode_len=20, steps_per_epoch=20, epochs=2, patience=2
)


def five_days(drift: float) -> Window:
    """Five session days of 24 hours of 6 bars, every bar returning `drift` plus noise."""
    n = DAYS * HOURS_PER_DAY * BARS_PER_HOUR
    rng = np.random.default_rng(0)
    returns = torch.tensor(drift + 1e-4 * rng.standard_normal(n))
    bar = torch.arange(n)
    return window_of(returns, bar // (HOURS_PER_DAY * BARS_PER_HOUR), bar // BARS_PER_HOUR)


def positions(n: int, runs: list[tuple[int, int]]) -> torch.Tensor:
    """Flat, but long over each [start, end) of `runs`."""
    p = torch.zeros(n, dtype=torch.int8)
    for start, end in runs:
        p[start:end] = 1
    return p


def judged(position: torch.Tensor, window: Window) -> tuple[bool, float]:
    result = evaluate(position, window, COST)
    score = pooled.score(pooled.pooled([result.periods.as_dict()], COST, PPY))
    return selection.keeps(result, score), score


def test_selection_refuses_a_one_trade_fold():
    """One trade held for days earns a score no thin-evidence shrink touches (it is active for
    ~100 hours); the fold refuses it, as it refuses two positions (4 trades) over two days, ten
    trades on one day and twenty that lost, and keeps the same edge taken ten times over five days."""
    up, n = five_days(2e-5), DAYS * HOURS_PER_DAY * BARS_PER_HOUR
    day = HOURS_PER_DAY * BARS_PER_HOUR
    one_trade = positions(n, [(n // 5, n)])
    assert evaluate(one_trade, up, COST).metrics.n_trades == 1
    kept, score = judged(one_trade, up)
    assert not kept and score > 5.0  # what won selection before: a high score on one decision
    two = [(d * day + 10, d * day + 130) for d in (1, 3)]  # 2 round trips, 4 trades, 2 days
    assert evaluate(positions(n, two), up, COST).metrics.n_trades == 4
    kept, score = judged(positions(n, two), up)
    assert not kept and score > 0
    spread = [(d * day + h * 40, d * day + h * 40 + 30) for d in range(DAYS) for h in (0, 1)]  # 10 round trips
    assert judged(positions(n, spread), up)[0]
    one_day = [(2 * day + h * 25, 2 * day + h * 25 + 20) for h in range(5)]  # 5 round trips (10 trades), one day
    assert evaluate(positions(n, one_day), up, COST).metrics.n_trades > selection.MIN_TRADES
    assert not judged(positions(n, one_day), up)[0]
    kept, score = judged(positions(n, spread), five_days(-2e-5))
    assert not kept and score < 0


@pytest.fixture(scope="module")
def market(synth_cache):
    market = cache.open(synth_cache)
    return DeviceData(market), make_folds(market.ts, FoldSpec(train="20d", val="5d", test="5d"))[0]


def test_an_epoch_that_lost_on_val_is_not_kept(market, tmp_path):
    """A tiny training on the default market: every epoch loses on val. `keep: best` keeps the
    best of them anyway; `keep: won` keeps none, and the fold is flat as one the learner abstains
    on (best_epoch -1, the flat policy scored on val and test, a marker for its weights), alone
    and as a seed ensemble."""
    data, fold = market
    best = Trainer(data, [TINY]).run_fold(fold, [3])[0]
    assert best.best_epoch >= 0 and max(epoch["val_score"] for epoch in best.curve) < 0 and best.test["n_trades"] > 0
    for cfg in (TINY.replace(keep="won"), TINY.replace(keep="won", seeds=2)):
        folder = tmp_path / f"seeds{cfg.seeds}"
        (won,) = Trainer(data, [cfg]).run_fold(fold, [3], checkpoint_dirs=[folder])
        if cfg.seeds == 1:  # the same training, another choice
            assert [e["val_score"] for e in won.curve] == [e["val_score"] for e in best.curve]
        assert (won.status, won.best_epoch, won.abstained, won.val_score) == ("ok", -1, True, 0.0)
        assert won.val["n_trades"] == won.test["n_trades"] == 0 and won.test_periods["n_trades"] == 0
        assert won.checkpoint is None and abstained(folder, fold.k) and not list(folder.glob("*.safetensors"))
    with pytest.raises(ConfigError, match=r"^dqn\.keep: 'last' must be 'best' or 'won'$"):
        TINY.replace(keep="last")


def test_spearman_is_scipys_and_ranks_the_full_trials():
    val = [3.0, 1.0, 2.0, 2.0, -1.0, 0.5, 2.0]
    test = [1.0, 0.2, 0.2, 0.9, -3.0, 0.4, 0.1]  # ties in both
    assert selection.spearman(val, test) == pytest.approx(spearmanr(val, test).statistic, abs=1e-12)
    assert selection.spearman([1, 2], [2, 1]) is None and selection.spearman([1, 1, 1], [1, 2, 3]) is None
    trials = [
        {"status": "ok", "folds_done": 4, "score": s, "test": {"sharpe": t}} for s, t in zip(val, test, strict=True)
    ]
    trials += [
        {"status": "ok", "folds_done": 1, "score": 9.0, "test": {"sharpe": -9.0}},  # stopped early
        {"status": "diverged", "folds_done": 4, "score": None, "test": {"sharpe": 0.0}},
    ]
    ranks = val_test_ranks(trials, 4)
    assert ranks == {"spearman_val_test": selection.spearman(val, test), "n_trials": 7}
    line = selection_line(ranks)
    assert f"Spearman(val score, test Sharpe) {ranks['spearman_val_test']:+.2f} over the 7 trials" in line
    assert f"(unrelated trials: 0 ± {1 / math.sqrt(6):.2f})" in line
    assert "needs 3 trials" in selection_line(val_test_ranks(trials[:2], 4))
