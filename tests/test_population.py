"""Populations (fxray.rl.population): a member trains exactly what its config trains alone.

Bit for bit on the CPU: same curve, same kept epoch, same val and test metrics, same
weights as fxray.rl.trainer.Trainer with the member's config and seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_trainer import FOLDS, TINY, held_out_folds

from fxray.data import cache
from fxray.data.folds import make_folds
from fxray.eval.backtest import backtest, backtest_many
from fxray.rl.config import ConfigError
from fxray.rl.device import DeviceData
from fxray.rl.population import Population, check_members
from fxray.rl.population_trainer import PopulationTrainer
from fxray.rl.stacked import SplitKMatmul, StackedAdam, split_chunks
from fxray.rl.trainer import Trainer, load_checkpoint

BASE = TINY.replace(epochs=4, steps_per_epoch=10)
# members that differ in every setting a population lets them differ in
MEMBERS = [
    BASE,
    BASE.replace(
        lr=1e-3,
        gamma=0.9,
        n_step=3,
        cost=1e-5,
        eps_start=0.8,
        eps_end=0.1,
        eps_decay=0.5,
        input_noise=0.0,
        huber_delta=0.5,
        reward_scale=5e3,
        tau=0.05,
        patience=1,
        select_from=1,
        episode_len=10,
        grad_clip=1.0,
        weight_decay=1e-3,
    ),
    BASE.replace(target_every=7, n_step=1, select="last", input_noise=0.3, noise_calendar=False),
]
SEEDS = [3, 5, 3]


@pytest.fixture(scope="module")
def market_data(synth_cache):
    market = cache.open(synth_cache)
    return DeviceData(market), make_folds(market.ts, FOLDS)[0]


def without_timings(curve: list[dict]) -> list[dict]:
    return [{k: v for k, v in epoch.items() if not k.endswith("_s")} for epoch in curve]


def assert_same_fold(alone, member):
    for key in ("status", "best_epoch", "epochs_run", "val", "test", "baselines", "val_score"):
        assert getattr(alone, key) == getattr(member, key), key
    for key in ("val_periods", "test_periods", "baseline_periods", "test_daily_returns", "adx"):
        assert getattr(alone, key) == getattr(member, key), key
    assert without_timings(alone.curve) == without_timings(member.curve)


# --- member == alone ------------------------------------------------------------------------


def test_each_member_trains_bit_for_bit_what_its_config_trains_alone(market_data):
    data, fold = market_data
    population = PopulationTrainer(data, MEMBERS)
    results = population.run_fold(fold, SEEDS)
    # the early stop is exercised: member 1 (patience 1) is masked while the others go on
    assert results[1].epochs_run < results[0].epochs_run == BASE.epochs
    for k, (cfg, seed) in enumerate(zip(MEMBERS, SEEDS)):
        alone = Trainer(data, cfg)
        assert_same_fold(alone.run_fold(fold, seed), results[k])
        ours, theirs = population.algo.state_dict(k), alone.algo.state_dict()
        assert list(ours) == list(theirs)
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (k, name)
    # the same trainer, its slots given other members: in place (same step structure: the
    # graph is kept) and with a new structure (which members draw input noise)
    for order in ([2, 1, 0], [1, 1, 0]):
        population.configure([MEMBERS[i] for i in order])
        assert population.algo.structure == (
            (5, (True, False, True), False) if order[0] == 2 else (5, (False, False, True), False)
        )
        again = population.run_fold(fold, [SEEDS[i] for i in order])
        for i, b in zip(order, again):
            assert without_timings(results[i].curve) == without_timings(b.curve) and results[i].test == b.test


def test_members_with_the_front_end_train_bit_for_bit_what_they_train_alone(market_data, tmp_path):
    """dqn.inputs: ridge in a population: the fold's front end, input noise on the clock only,
    and each member's checkpoint a plain network's (the front folded in), as alone."""
    data, fold = market_data
    members = [cfg.replace(inputs="ridge") for cfg in MEMBERS]
    results = PopulationTrainer(data, members).run_fold(
        fold, SEEDS, checkpoint_dirs=[tmp_path / f"m{k}" for k in range(3)]
    )
    for k, (cfg, seed) in enumerate(zip(members, SEEDS)):
        alone = Trainer(data, cfg).run_fold(fold, seed, checkpoint_dir=tmp_path / f"alone{k}")
        assert_same_fold(alone, results[k])
        (ours, _), (theirs, _) = load_checkpoint(results[k].checkpoint), load_checkpoint(alone.checkpoint)
        assert list(ours) == list(theirs) and ours["market_in.weight"].shape[1] == data.n_inputs
        assert all(torch.equal(ours[name], theirs[name]) for name in theirs), k
    # the front end is used: the raw-input members train another policy
    raw = PopulationTrainer(data, MEMBERS[:1]).run_fold(fold, SEEDS[:1])[0]
    assert without_timings(raw.curve) != without_timings(results[0].curve)


def test_a_population_of_one_is_the_trainer(market_data, tmp_path):
    data, fold = market_data
    (member,) = PopulationTrainer(data, [BASE]).run_fold(fold, [0], checkpoint_dirs=[tmp_path / "pop"])
    alone = Trainer(data, BASE).run_fold(fold, 0, checkpoint_dir=tmp_path / "alone")
    assert_same_fold(alone, member)
    (ours, our_meta), (theirs, their_meta) = load_checkpoint(member.checkpoint), load_checkpoint(alone.checkpoint)
    assert our_meta == their_meta and list(ours) == list(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_a_member_chooses_its_epoch_on_the_select_window_as_the_trainer_does(synth_cache):
    market = cache.open(synth_cache)
    data = DeviceData(market)
    _, held = held_out_folds(market.ts)
    cfg = BASE.replace(patience=1)
    (member,) = PopulationTrainer(data, [cfg]).run_fold(held, [1])
    assert_same_fold(Trainer(data, cfg).run_fold(held, 1), member)


# --- masking ----------------------------------------------------------------------------------


def member_state(pop: Population, k: int) -> list[torch.Tensor]:
    tensors = [*pop.params, *pop.target_params, *pop.optimizer.exp_avg, *pop.optimizer.exp_avg_sq]
    return [t[k].detach().clone() for t in tensors] + [
        x[k].clone() for x in (pop.optimizer.steps, pop.updates, pop.global_step, pop.loss_sum)
    ]


def test_a_masked_member_stops_changing_and_the_others_do_not_notice(market_data):
    data, fold = market_data
    data.set_fold(fold)
    masked, free = Population(data, MEMBERS), Population(data, MEMBERS)
    for pop in (masked, free):
        pop.begin(SEEDS)
        for _ in range(5):
            pop.step()
    masked.active[1] = False
    frozen = member_state(masked, 1)
    for pop in (masked, free):
        for _ in range(5):
            pop.step()
    assert all(torch.equal(a, b) for a, b in zip(frozen, member_state(masked, 1)))
    assert not all(torch.equal(a, b) for a, b in zip(frozen, member_state(free, 1)))  # it would have moved
    for k in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(member_state(masked, k), member_state(free, k))), k


def test_a_cancelled_member_ends_at_once_and_the_others_train_on(market_data):
    """stop(k) (a sweep's trial that no longer wants its fold) masks member k mid-epoch."""
    data, fold = market_data
    asked = []

    def stop(k: int) -> bool:
        asked.append(k)
        return k == 1 and asked.count(1) > BASE.steps_per_epoch + 5  # in the middle of epoch 1

    trainer = PopulationTrainer(data, [MEMBERS[0], MEMBERS[2]])
    ours, cancelled = trainer.run_fold(fold, [3, 3], stop=stop)
    assert (cancelled.status, cancelled.epochs_run, cancelled.test) == ("cancelled", 1, {})
    assert_same_fold(Trainer(data, MEMBERS[0]).run_fold(fold, 3), ours)
    every = trainer.run_fold(fold, [3, 3], stop=lambda k: True)
    assert [(r.status, r.epochs_run) for r in every] == [("cancelled", 0)] * 2


# --- the stacked (CUDA) Adam and the batched backtest against the plain ones ------------------------


def test_stacked_adam_is_the_per_member_adam():
    """The formula CUDA runs (one stacked update, masked) against the CPU's member-by-member
    Adam, on the CPU: equal to float rounding (the per-member scalar lr/bias becomes a tensor)."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 7, 5, generator=gen), torch.randn(3, 5, generator=gen)]
    lrs, wds = [1e-3, 3e-3, 5e-4], [0.0, 1e-2, 0.0]
    runs = []
    for stacked in (False, True):
        params = [p.clone() for p in start]
        active = torch.ones(3, dtype=torch.bool)
        opt = StackedAdam(params, lrs, wds, active)
        opt.stacked = stacked
        g = torch.Generator().manual_seed(1)
        for i in range(8):
            if i == 4:
                active[2] = False  # masked from the fifth step on
            for p in params:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        runs.append((params, opt))
    (plain, plain_opt), (fast, fast_opt) = runs
    assert torch.equal(plain_opt.steps, fast_opt.steps) and plain_opt.steps.tolist() == [8, 8, 4]
    for a, b in zip(plain, fast):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("k, n", [(1, 4096), (2, 4096), (3, 1536), (64, 1024), (2, 1000)])
def test_split_k_weight_gradient_is_autograds(k, n):
    """The CUDA path's SplitKMatmul (the weight gradient summed over row chunks) against autograd's
    own baddbmm / bmm backward, in float64 on the CPU: the same gradients to rounding, with and
    without a bias, for chunk counts 1 (n not divisible, or K large) up to 32."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(k, n, 7, dtype=torch.float64, generator=gen)
    w = torch.randn(k, 5, 7, dtype=torch.float64, generator=gen)
    b = torch.randn(k, 5, dtype=torch.float64, generator=gen)
    g = torch.randn(k, n, 5, dtype=torch.float64, generator=gen)
    for bias in (b, None):
        grads = []
        for fast in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (x, w)] + (
                [bias.clone().requires_grad_(True)] if bias is not None else []
            )
            xb, wb, bb = leaves[0], leaves[1], leaves[2] if bias is not None else None
            if fast:
                y = SplitKMatmul.apply(xb, wb, bb)
            else:
                y = (
                    torch.bmm(xb, wb.transpose(1, 2))
                    if bb is None
                    else torch.baddbmm(bb.unsqueeze(1), xb, wb.transpose(1, 2))
                )
            y.backward(g)
            grads.append([y.detach()] + [t.grad for t in leaves])
        for plain, split in zip(*grads):
            torch.testing.assert_close(split, plain, rtol=1e-12, atol=1e-12)
    assert split_chunks(4096, 2) == 8 and split_chunks(1000, 2) == 1 and split_chunks(1024, 64) == 1


def test_a_population_with_split_k_trains_what_the_plain_one_does(market_data):
    """The same population with the CUDA path's split weight gradients forced on, on the CPU:
    weights after a fold equal to float rounding (CUDA runs this path; the CPU the plain one)."""
    data, fold = market_data
    cfgs = [BASE.replace(lr=1e-3), BASE.replace(lr=3e-3, gamma=0.9)]
    weights = []
    for split in (False, True):
        trainer = PopulationTrainer(data, cfgs)
        trainer.algo.q_network.split_k = split
        trainer.run_fold(fold, [0, 1])
        weights.append([p.detach().clone() for p in trainer.algo.params])
    for a, b in zip(*weights):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_the_stacked_front_end_is_the_per_member_one(market_data):
    """With inputs: ridge, CUDA's path (one matmul of the front end over every member's batch, one
    bmm a layer) against the CPU's per-member path, on the CPU: the same Q to float rounding."""
    data, fold = market_data
    data.set_fold(fold)
    pop = Population(data, [BASE.replace(inputs="ridge"), BASE.replace(inputs="ridge", lr=3e-3)])
    pop.begin([0, 1])
    net = pop.q_network
    assert net.front and bool(net.front_w.abs().sum() > 0)  # the fold's front end is in
    t = torch.arange(fold.val[0], fold.val[0] + 64)
    market = data.states(t).unsqueeze(0).expand(2, -1, -1)
    position = torch.tensor([-1, 0, 1]).repeat(22)[:64].expand(2, -1)
    out = {}
    for per_member in (True, False):
        net.per_member = per_member
        out[per_member] = (net(market, position), net.q_all(market))
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_backtest_many_is_backtest_per_policy(market_data):
    data, fold = market_data
    data.set_fold(fold)
    for fill in ("next_open", "close"):
        window = data.window(fold.val, fill)
        q = torch.randn(3, window.n_bars, 3, 3, generator=torch.Generator().manual_seed(2))
        costs = [4e-5, 0.0, 2e-4]
        for k, many in enumerate(backtest_many(q, window, costs)):
            one = backtest(q[k], window, costs[k])
            assert torch.equal(many.position, one.position) and torch.equal(many.net_returns, one.net_returns)
            assert np.array_equal(many.daily_returns, one.daily_returns)
            assert many.metrics == one.metrics and many.periods.as_dict() == one.periods.as_dict()


# --- bad input ----------------------------------------------------------------------------------


def test_members_of_different_shapes_are_refused():
    with pytest.raises(ConfigError, match=r"^dqn.inputs: member 1 has 'ridge', member 0 'raw'; "):
        check_members([BASE, BASE.replace(inputs="ridge")])
    with pytest.raises(ConfigError, match=r"^dqn\.hidden: member 1 has 64, member 0 32; "):
        check_members([BASE, BASE.replace(hidden=64)])
    for update in ("all_actions", "hold"):
        with pytest.raises(ConfigError, match=rf"^dqn\.update: '{update}' is not supported in a population"):
            check_members([BASE.replace(update=update)])
    with pytest.raises(ConfigError, match="no members"):
        check_members([])


# --- the benchmark script runs (CPU, tiny sizes) -------------------------------------------------


def test_bench_population_runs_on_the_cpu_and_writes_its_rows(tmp_path, capsys):
    import runpy

    bench = runpy.run_path("scripts/bench_population.py")
    assert (
        bench["main"](
            ["--quick", "--device", "cpu", "--max-k", "2", "--steps", "2", "--json", str(tmp_path / "b.json")]
        )
        == 0
    )
    import json

    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["kind"], r["K"]) for r in rows] == [("alone", 1), ("population", 1), ("population", 2)]
    assert all(r["samples_s"] > 0 and r["env_steps_s"] > 0 for r in rows)
    assert "population     2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        bench["main"](["--sizes", "8192"])
    assert stop.value.code == 2
