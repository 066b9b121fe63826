"""Demonstrations (dqn.demo, fxray.rl.demo): the ridge rule's moves as DQfD's margin loss.

The table is the rule's own path (fxray.eval.baselines, fitted on the train slice only), the
loss is the TD loss plus the margin term computed here by hand, a population member with
demonstrations trains what it trains alone, and a bad value is a one-line ConfigError.
"""

from __future__ import annotations

import pytest
import torch
from test_learner import BASE, FOLDS, alone, assert_same_fold, without_timings

from fxray.data import cache
from fxray.data.folds import make_folds
from fxray.eval import backtest, baselines
from fxray.rl import demo
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.trainer import Trainer


@pytest.fixture(scope="module")
def market_data(synth_cache):
    market = cache.open(synth_cache)
    return DeviceData(market), make_folds(market.ts, FOLDS)[0]


def test_the_margin_loss_is_dqfds_by_hand():
    g = torch.Generator().manual_seed(0)
    q, expert = torch.randn(2, 30, 3, generator=g), torch.randint(0, 3, (2, 30), generator=g)
    margins = torch.tensor([0.8, 0.3]).view(2, 1, 1)
    got = demo.margin_loss(q, expert, margins)
    for k, margin in enumerate((0.8, 0.3)):
        rows = []
        for i in range(30):
            e = int(expert[k, i])
            rows.append(max(float(q[k, i, a]) + (0.0 if a == e else margin) for a in range(3)) - float(q[k, i, e]))
        assert got[k].item() == pytest.approx(sum(rows) / 30, rel=1e-6)
        assert demo.margin_loss(q[k], expert[k], margin).item() == pytest.approx(got[k].item(), rel=1e-6)
    # zero once the expert's action leads every other by the margin
    clear = torch.zeros(30, 3).scatter_(1, expert[0].unsqueeze(1), 1.0)
    assert demo.margin_loss(clear, expert[0], 0.8).item() == 0.0
    assert demo.margin_loss(clear, expert[0], 1.5).item() == pytest.approx(0.5)


def test_the_table_is_the_ridge_rules_path_on_the_train_slice_only(market_data):
    data, fold = market_data
    data.set_fold(fold)
    cfg = BASE
    table = demo.fit(data, fold, cfg.cost, cfg.fill)
    a, b = fold.train[0], fold.train[1] - 1
    x = data.states(torch.arange(a, b))
    train = data.window(fold.train, cfg.fill)
    rule = baselines.fit_rule(x, train.fresh, cfg.cost, carry=train.carry)
    one_hot = torch.zeros(b - a, 3, 3).scatter_(2, table[a:b].long().unsqueeze(2), 1.0)
    path = backtest.greedy_positions(one_hot)
    assert torch.equal(path, rule.positions(x)) and path.abs().sum() > 0 and (path == 0).any()
    assert (table[:a] == 1).all() and (table[b:] == 1).all()  # flat outside the train bars
    # no look-ahead: the returns after the train slice do not change it
    market = data.returns.clone()
    data.returns[b:] = torch.randn(data.returns.shape[0] - b, generator=torch.Generator().manual_seed(1)) * 1e-3
    key = (repr(fold.as_dict()), cfg.cost, cfg.fill, 0.0)  # screen_t 0: no screen
    assert torch.equal(data.references[key][2], table[a:b])  # the reference rule's, fitted once per fold
    data.references.clear()  # fitted again, on the changed returns
    try:
        assert torch.equal(demo.fit(data, fold, cfg.cost, cfg.fill), table)
    finally:
        data.returns.copy_(market)
        data.references.clear()  # what was fitted on the changed returns goes with them


def test_the_loss_is_the_td_loss_plus_the_weighted_margin_term(market_data):
    data, fold = market_data
    cfg = BASE.replace(demo=2.0, demo_margin=0.5, epochs=1, steps_per_epoch=5)
    trainer = Trainer(data, [cfg])
    trainer.run_fold(fold, [0])
    dqn = trainer.dqn
    assert torch.equal(dqn.demo_table, demo.fit(data, fold, cfg.cost, cfg.fill))
    step, env = dqn.sample_indices()
    noise = torch.randn(1, 128, data.n_inputs, generator=torch.Generator().manual_seed(2))
    got, q_got = dqn.td_loss(step, env, noise)
    dqn.demo_weight.zero_()  # the same learner, TD alone
    td, q_td = dqn.td_loss(step, env, noise)
    t, position = (x[0] for x in dqn.n_step_batch(step, env)[:2])
    with torch.no_grad():
        q = dqn.q_network((data.states(t) + noise[0, :64]).unsqueeze(0), position.unsqueeze(0))[0]
    by_hand = []
    for i in range(64):
        e = int(dqn.demo_table[t[i], int(position[i]) + 1])
        by_hand.append(max(float(q[i, a]) + (0.0 if a == e else 0.5) for a in range(3)) - float(q[i, e]))
    assert got.item() == pytest.approx(td.item() + cfg.demo * sum(by_hand) / 64, rel=1e-5)
    assert torch.equal(q_got, q_td) and sum(by_hand) > 0


def test_demonstrations_change_what_is_learned(market_data):
    data, fold = market_data
    plain = alone(data, BASE, fold, 0)
    shown = alone(data, BASE.replace(demo=1.0), fold, 0)
    assert without_timings(plain.curve) != without_timings(shown.curve)


def test_members_with_demonstrations_train_what_they_train_alone(market_data):
    """Each member its own weight and margin (the rule is the fold's, at the population's cost);
    every member, with demonstrations or without, trains bit for bit what it trains alone."""
    data, fold = market_data
    members = [BASE.replace(demo=1.0), BASE.replace(demo=0.5, demo_margin=0.3, lr=1e-3), BASE.replace(n_step=3)]
    seeds = [3, 5, 3]
    population = Trainer(data, members)
    results = population.run_fold(fold, seeds)
    for k, (cfg, seed) in enumerate(zip(members, seeds)):
        solo = Trainer(data, [cfg])
        (result,) = solo.run_fold(fold, [seed])
        assert_same_fold(result, results[k])
        ours, theirs = population.dqn.q_network.state(k), solo.dqn.q_network.state(0)
        assert all(torch.equal(ours[n], theirs[n]) for n in theirs), k
        if cfg.demo > 0:
            assert torch.equal(population.dqn.demo_table, solo.dqn.demo_table)
    # reconfigured without demonstrations: the table goes, the structure changes
    population.configure([BASE, BASE, BASE])
    assert population.dqn.demo_table is None and population.dqn.structure[2] is False


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("demo", -1.0, "dqn.demo: -1.0 must be a number in [0, 100]"),
        ("demo", float("nan"), "dqn.demo: nan must be a number in [0, 100]"),
        ("demo_margin", 0.0, "dqn.demo_margin: 0.0 must be a number > 0"),
    ],
)
def test_a_bad_demo_setting_is_a_one_line_error(key, value, words):
    with pytest.raises(ConfigError) as err:
        DQNConfig(**{key: value})
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def screened_rule(market_data, t_min=2.0):
    """(data, fold, x, train, market, kept, rule) of the fold's train slice: its inputs and
    returns, the market columns, the checked screen at t_min and the ridge rule on what it
    keeps (some inputs, not all), at BASE's cost and fill."""
    from fxray.rl import frontend

    data, fold = market_data
    data.set_fold(fold)
    x = data.states(torch.arange(fold.train[0], fold.train[1] - 1))
    train = data.window(fold.train, BASE.fill)
    market = torch.nonzero(frontend.clock_mask(data.n_inputs, data.device) == 0).flatten()
    kept = baselines.checked_screen(x, train.fresh, BASE.cost, t_min, market, carry=train.carry)
    assert 0 < len(kept.linear_inputs()) < len(market), kept
    rule = baselines.fit_rule(x, train.fresh, BASE.cost, carry=train.carry, columns=kept)
    return data, fold, x, train, market, kept, rule


def test_the_screened_table_is_the_rule_on_the_screened_inputs(market_data, monkeypatch):
    """screen_t > 0: the demonstrator is the ridge rule on the market inputs that pass the
    checked screen (cached apart from the unscreened one); a screen nothing passes, or one
    whose check fails, demonstrates flat."""
    data, fold, x, train, market, kept, rule = screened_rule(market_data)
    cfg = BASE
    a, b = fold.train[0], fold.train[1] - 1
    assert torch.equal(
        kept.linear_inputs(), baselines.screen_columns(x, train.fresh, 2.0, market, robust=True)
    )  # the check passed
    assert not torch.equal(
        kept.linear_inputs(), baselines.screen_columns(x, train.fresh, 2.0, market)
    )  # robust: not the ordinary t
    table = demo.fit(data, fold, cfg.cost, cfg.fill, screen_t=2.0)
    one_hot = torch.zeros(b - a, 3, 3).scatter_(2, table[a:b].long().unsqueeze(2), 1.0)
    path = backtest.greedy_positions(one_hot)
    assert torch.equal(path, rule.positions(x)) and path.abs().sum() > 0
    assert not torch.equal(table, demo.fit(data, fold, cfg.cost, cfg.fill))  # not the unscreened table
    flat = demo.fit(data, fold, cfg.cost, cfg.fill, screen_t=100.0)
    assert bool((flat == 1).all())
    # the check decides: a failing one (its tail made to lose) empties the screen, and the table is flat
    calls = []

    def failing_check(*args, **kwargs):
        calls.append((args[2], args[3]))
        return torch.zeros(0, dtype=torch.int64)

    monkeypatch.setattr(baselines, "checked_screen", failing_check)
    assert bool((demo.fit(data, fold, cfg.cost, cfg.fill, screen_t=2.5) == 1).all())
    assert calls == [(cfg.cost, 2.5)]


def test_the_screened_reference_is_the_demonstrators_rule(market_data):
    """With screen_t > 0 the references beside the policy (fxray.rl.references) carry
    "screened": the ridge rule on the checked screen's inputs, fitted on the train slice, the
    rule the demonstrator's table moves as, scored on val and test as the other rules are;
    without a screen there is none."""
    from fxray.eval.backtest import evaluate
    from fxray.rl.references import references

    data, fold, x, train, market, kept, rule = screened_rule(market_data)
    cfg = BASE
    a, b = fold.train[0], fold.train[1] - 1
    table, periods = references(data, fold, cfg.cost, cfg.fill, screen_t=2.0)
    for w in ("val", "test"):
        s, e = getattr(fold, w)[0], getattr(fold, w)[1] - 1
        want = evaluate(
            rule.positions(data.states(torch.arange(s, e))), data.window(getattr(fold, w), cfg.fill), cfg.cost
        )
        assert periods["screened"][w] == want.periods.as_dict()
    assert table["screened"]["n_trades"] > 0 and periods["screened"] != periods["ridge"]
    moves = demo.fit(data, fold, cfg.cost, cfg.fill, screen_t=2.0)[a:b]
    one_hot = torch.zeros(b - a, 3, 3).scatter_(2, moves.long().unsqueeze(2), 1.0)
    assert torch.equal(backtest.greedy_positions(one_hot), rule.positions(x))  # the demonstrator's path
    assert "screened" not in references(data, fold, cfg.cost, cfg.fill)[0]
    assert "screened" in references(data, fold, cfg.cost, cfg.fill, 2.0)[0]
    assert "screened" not in references(data, fold, cfg.cost, cfg.fill)[0]  # cached apart
