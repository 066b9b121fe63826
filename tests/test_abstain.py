"""dqn.abstain: a fold whose checked screen keeps no input is not trained, and its policy is flat.

Where the screen keeps nothing, each trainer (alone, a seed ensemble, a sweep worker's population)
returns the flat policy's fold without running a step; where it keeps inputs, abstain changes
nothing; a bad value is a one-line ConfigError.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_demo import market_data  # noqa: F401 (a fixture)
from test_gather import submit_all
from test_learner import BASE, alone, assert_same_fold

from fxray.rl import frontend
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.trainer import FoldResult, Trainer
from fxray.sweep.gather import Gatherer
from fxray.track.records import FoldRecord

SMALL = BASE.replace(epochs=2, steps_per_epoch=5)
NOTHING = SMALL.replace(screen_t=100.0, abstain=True)  # no input's t reaches 100: the screen keeps nothing
SOME = SMALL.replace(screen_t=2.0, abstain=True)  # on this fold the screen keeps some inputs (test_demo)


def assert_flat(result: FoldResult, fold) -> None:
    """Untrained, flat on val and test (no trade, every hour's net return 0), scored and referenced."""
    assert result.status == "ok" and result.abstained
    assert (result.epochs_run, result.best_epoch, result.curve, result.checkpoint) == (0, -1, [], None)
    for window, metrics, periods in (
        ("val", result.val, result.val_periods),
        ("test", result.test, result.test_periods),
    ):
        assert metrics["n_trades"] == 0 and metrics["sharpe"] == 0.0 and metrics["turnover"] == 0.0
        assert periods["n_trades"] == 0 and not any(periods["net"]) and not any(periods["units"])
        # the same hours as every reference's on that window: pooled beside them hour by hour
        assert periods["hours"] == result.baseline_periods["buy_and_hold"][window]["hours"]
    assert {"buy_and_hold", "ridge", "screened"} <= set(result.baselines)
    assert result.timings["train_s"] == 0.0 and result.val_score == pytest.approx(0.0)


def test_a_fold_whose_screen_keeps_nothing_is_flat_and_untrained(market_data, tmp_path):  # noqa: F811
    data, fold = market_data
    data.set_fold(fold)
    assert frontend.screened_inputs(data, fold, NOTHING.cost, NOTHING.fill, NOTHING.screen_t).numel() == 0
    trainer = Trainer(data, [NOTHING])
    before = [p.detach().clone() for p in trainer.dqn.params]
    (result,) = trainer.run_fold(fold, [0], checkpoint_dirs=[tmp_path])
    assert_flat(result, fold)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.dqn.params))  # no step ran
    (marker,) = tmp_path.iterdir()  # no weights to keep: a marker that the fold said "flat"
    assert marker.name == f"fold{fold.k}.abstained.json" and json.loads(marker.read_text())["abstained"]
    record = FoldRecord.from_result(result.as_dict())
    assert record.ok and record.epochs == 0 and record.checkpoint == ""  # pooled as any fold with a result
    from fxray.train import fold_table

    row = fold_table([result.as_dict()]).splitlines()[2].split()
    assert row[:3] == [str(fold.k), "flat", "-1"]  # `fxray train`'s fold table says so
    # another config on the fold: the same flat result
    (again,) = Trainer(data, [NOTHING.replace(lr=NOTHING.lr * 2)]).run_fold(fold, [1])
    same = lambda r: {k: v for k, v in r.as_dict().items() if k not in ("timings", "checkpoint")}  # noqa: E731
    assert again is not result and same(again) == same(result)
    # without abstain the same config trains the fold (its policy may still end flat: a learning question)
    trained = alone(data, NOTHING.replace(abstain=False), fold, 0)
    assert trained.epochs_run == 2 and not trained.abstained


def test_where_the_screen_keeps_inputs_abstain_changes_nothing(market_data):  # noqa: F811
    data, fold = market_data
    data.set_fold(fold)
    assert frontend.screened_inputs(data, fold, SOME.cost, SOME.fill, SOME.screen_t).numel() > 0
    got = alone(data, SOME, fold, 3)
    assert not got.abstained and got.epochs_run == 2
    assert_same_fold(alone(data, SOME.replace(abstain=False), fold, 3), got)


def test_a_seed_ensemble_abstains_as_one_policy(market_data):  # noqa: F811
    data, fold = market_data
    result = alone(data, NOTHING.replace(seeds=2), fold, 0)
    assert_flat(result, fold)
    assert result.seed_spread == {}  # no member trained


def test_a_sweep_workers_population_trains_only_the_requests_that_do_not_abstain(market_data):  # noqa: F811
    data, fold = market_data
    gatherer = Gatherer(data, k_max=2, wait_s=5.0, pad=False)  # long: both arrive before it trains
    keeps = SOME.replace(abstain=False)
    results = submit_all(
        gatherer, [(NOTHING.as_dict(), fold.as_dict(), 0, None), (keeps.as_dict(), fold.as_dict(), 1, None)]
    )
    flat, trained = (FoldResult(**{k: v for k, v in r.items() if k != "population"}) for r in results)
    assert_flat(flat, fold)
    assert_same_fold(alone(data, keeps, fold, 1), trained)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"abstain": True}, "dqn.abstain: True needs screen_t > 0"),
        ({"abstain": "yes", "screen_t": 3.0}, "dqn.abstain: 'yes' must be true or false"),
    ],
)
def test_a_bad_abstain_is_a_one_line_config_error(changes, words):
    with pytest.raises(ConfigError) as err:
        DQNConfig(**changes)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_the_sweeps_vote_reads_an_abstained_fold_as_a_flat_member(market_data, tmp_path):  # noqa: F811
    """A trial that abstained on a fold has no weights there; the vote of the full trials counts
    it as a member that votes flat at every bar (not a missing checkpoint that skips the vote)."""
    from fxray.eval import pooled
    from fxray.sweep.vote import combine_trials, missing_checkpoints

    data, fold = market_data
    trains = SOME.replace(abstain=False)
    trained = alone(data, trains, fold, 2, tmp_path / "checkpoints" / "a")
    assert trained.test["n_trades"] > 0
    for name in ("b", "c"):
        assert alone(data, NOTHING, fold, 0, tmp_path / "checkpoints" / name).abstained
    ppy = data.calendar.periods_per_year
    trials = [
        {"trial_id": name, "status": "ok", "folds_done": 1, "config": cfg.as_dict(), "val": {"sharpe": v}}
        for name, cfg, v in (("a", trains, 2.0), ("b", NOTHING, 1.0), ("c", NOTHING, 0.0))
    ]
    results = {"folds": [fold.as_dict()], "storage": str(tmp_path), "periods_per_year": ppy, "trials": trials}
    assert missing_checkpoints(results, trials) == []  # their markers say they abstained
    combined = combine_trials(results, data, sizes=[1, 2, 3])
    marker = tmp_path / "checkpoints" / "c" / f"fold{fold.k}.abstained.json"
    marker.rename(marker.with_suffix(".kept"))
    assert [p.parent.name for p in missing_checkpoints(results, trials)] == ["c"]  # no marker, no weights: missing
    want = pooled.pooled([trained.test_periods], trains.cost, ppy)
    assert combined[1]["test"]["n_trades"] == want["n_trades"]
    assert combined[1]["test"]["sharpe"] == pytest.approx(want["sharpe"], rel=1e-6)
    # two flat votes of three: no position at any bar; with two members each of "a"'s moves ties
    # with a flat vote, and a tie takes the lower action index: short where "a" is short, else flat
    assert combined[3]["test"]["n_trades"] == 0 and combined[3]["test"]["sharpe"] == 0.0
    assert combined[2]["test"]["n_trades"] > 0


def test_export_refuses_last_when_the_last_fold_abstained(market_data, synth_cache, tmp_path, capsys):  # noqa: F811
    """An abstained fold has no network: `fxray export --model last` of a directory whose last
    fold abstained says so in one line (exit 2, no bundle), and names the fold:K that trained;
    that one exports; a directory where every fold abstained has nothing to export."""
    from fxray import export

    data, fold = market_data
    ckpts = tmp_path / "ckpts"
    alone(data, SOME.replace(abstain=False), fold, 0, ckpts)
    later = type(fold)(fold.k + 1, fold.train, fold.val, fold.test)  # another fold (its k), same bars
    assert alone(data, NOTHING, later, 0, ckpts).abstained
    args = [str(ckpts), "--data", str(synth_cache)]
    assert export.main([*args, "--out", str(tmp_path / "last")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --model last: fold {later.k}, the last, is flat") and f"fold:{fold.k}" in line
    assert not (tmp_path / "last").exists()
    assert export.main([*args, "--out", str(tmp_path / "older"), "--model", f"fold:{fold.k}"]) == 0
    only_flat = tmp_path / "flat"
    alone(data, NOTHING, fold, 0, only_flat)
    assert export.main([str(only_flat), "--data", str(synth_cache), "--out", str(tmp_path / "none")]) == 2
    assert "every fold is flat" in capsys.readouterr().err
