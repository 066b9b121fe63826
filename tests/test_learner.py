"""The one learner: the resident data, the DQN of K members, the Q-network, Adam, the trainer.

The contract checked here: a member of any population computes, bit for bit on the CPU, what
its config computes alone (K = 1); a seed ensemble is the mean-Q policy of its members each
trained alone; the maths of the pieces against plain references. What a solo fold computed
before the learner was one implementation: tests/test_solo_reference.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
import torch
from conftest import one_batch

from fxray.data import cache
from fxray.data.folds import Fold, FoldSpec, make_folds
from fxray.data.synth import SynthSpec, simulate
from fxray.eval.backtest import backtest, evaluate
from fxray.rl.checkpoint import load_checkpoint
from fxray.rl.config import ConfigError, DQNConfig, make_config
from fxray.rl.device import DeviceData
from fxray.rl.dqn import DQN, check_members
from fxray.rl.network import QNetwork, SplitKMatmul, initial_weights, split_chunks
from fxray.rl.optim import Adam
from fxray.rl.trainer import Trainer, q_bound, selection_score
from fxray.track.records import FoldRecord

FOLDS = FoldSpec(train="20d", val="5d", test="5d")
TINY = DQNConfig(
    hidden=32, num_envs=16, batch_size=64, buffer_steps=32, episode_len=20, steps_per_epoch=20, epochs=2, patience=2
)
BASE = TINY.replace(epochs=4, steps_per_epoch=10)
# members that differ in every setting a population lets them differ in
MEMBERS = [
    BASE,
    BASE.replace(
        lr=1e-3,
        gamma=0.9,
        n_step=3,
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
    BASE.replace(n_step=1, input_noise=0.3, demo=0.5, demo_margin=0.3),
]
SEEDS = [3, 5, 3]


def random_arrays(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    ts = (1_700_000_000 + 60 * np.arange(1, n + 1)).astype(np.int64) * 10**9
    close = 100 * np.exp(np.cumsum(rng.normal(0, 1e-3, n)))
    open_ = np.concatenate(([100.0], close[:-1])) * np.exp(rng.normal(0, 2e-4, n))  # opens off the last close
    return {
        "ts": ts,
        "features": rng.normal(3, 2, (n, 42)).astype(np.float32),
        "ofi": rng.normal(0, 1, (n, 8)).astype(np.float32),
        "open": open_,
        "close": close,
    }


@pytest.fixture(scope="module")
def market_data(synth_cache):
    market = cache.open(synth_cache)
    return DeviceData(market), make_folds(market.ts, FOLDS)[0]


def alone(data, cfg, fold, seed, checkpoint_dir=None, stop=None):
    """`cfg` trained on `fold` as the only trial of its trainer."""
    return Trainer(data, [cfg]).run_fold(fold, [seed], checkpoint_dirs=[checkpoint_dir], stop=stop)[0]


def without_timings(curve: list[dict]) -> list[dict]:
    return [{k: v for k, v in epoch.items() if not k.endswith("_s")} for epoch in curve]


def assert_same_fold(a, b):
    for key in ("status", "best_epoch", "epochs_run", "val", "test", "baselines", "val_score"):
        assert getattr(a, key) == getattr(b, key), key
    for key in ("val_periods", "test_periods", "baseline_periods"):
        assert getattr(a, key) == getattr(b, key), key
    assert without_timings(a.curve) == without_timings(b.curve)


# --- the resident data ----------------------------------------------------------------------


def test_device_returns_days_and_train_only_normalisation():
    arrays = random_arrays()
    data = DeviceData(arrays)
    np.testing.assert_allclose(data.returns[:-1].numpy(), np.diff(np.log(arrays["close"])), rtol=1e-6)
    log_o, log_c = np.log(arrays["open"]), np.log(arrays["close"])
    np.testing.assert_allclose(data.gap[:-1].numpy(), log_o[1:] - log_c[:-1], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(data.bar[:-1].numpy(), log_c[1:] - log_o[1:], rtol=1e-5, atol=1e-9)
    assert float(data.returns[-1]) == float(data.gap[-1]) == float(data.bar[-1]) == 0.0
    assert np.array_equal(data.day.numpy(), arrays["ts"] // (86400 * 10**9))
    fold = Fold(0, (100, 1100), (1200, 1800), (1900, 2500))
    ptr = data.x.data_ptr()
    data.set_fold(fold)
    x = np.concatenate([arrays["features"], arrays["ofi"]], 1)[100:1100]
    np.testing.assert_allclose(data.mean.numpy(), x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(1 / data.inv_std.numpy(), x.std(0), rtol=1e-4)
    assert data.x.data_ptr() == ptr  # a fold switch copies nothing
    # no look-ahead: bars outside the train slice do not move the statistics
    arrays2 = {k: v.copy() for k, v in arrays.items()}
    arrays2["features"][1100:] += 1000.0
    arrays2["features"][:100] -= 1000.0
    data2 = DeviceData(arrays2)
    data2.set_fold(fold)
    assert torch.equal(data.mean, data2.mean) and torch.equal(data.inv_std, data2.inv_std)


def test_device_constant_column_does_not_divide_by_zero():
    arrays = random_arrays()
    arrays["ofi"][:] = 0.0
    data = DeviceData(arrays)
    data.set_fold(Fold(0, (0, 1000), (1100, 1500), (1600, 2000)))
    s = data.states(torch.arange(10))
    assert torch.isfinite(s).all() and torch.equal(s[:, 42:], torch.zeros(10, 8))


def test_device_accepts_an_opened_cache(synth_cache):
    market = cache.open(synth_cache)
    data = DeviceData(market)
    assert data.n_bars == market.n_bars and data.n_inputs == 50
    np.testing.assert_array_equal(data.x[:5].numpy(), np.concatenate([market.features[:5], market.ofi[:5]], 1))


# --- the agents and the replay, against plain references -----------------------------------


@pytest.mark.parametrize("fill", ["close", "next_open"])
def test_collect_rewards_resets_and_replay_rows_against_a_plain_reference(fill):
    """Every member's agents: the reward of each move at the fill, the cost of the change, restarts
    inside the train range, and the replay row written; then the n-step transitions sampled from
    the ring (after it wraps) against a per-transition reference."""
    cfg = DQNConfig(n_step=3, gamma=0.8, buffer_steps=40, num_envs=5, episode_len=4, cost=3e-4, fill=fill)
    data = DeviceData(random_arrays())
    data.set_fold(Fold(0, (500, 900), (1000, 1500), (1600, 2000)))
    dqn = DQN(data, [cfg, cfg.replace(gamma=0.5)])
    dqn.begin([1, 2])  # 4 warm-up collect steps each
    log = []  # per collect step of member 0: (t, p, a, r, done), kept in full (no ring)
    for _ in range(90):  # more than buffer_steps: the ring wraps
        t, p = dqn.t.clone(), dqn.position.clone()
        assert ((t >= 500) & (t <= 898)).all()
        row = int(dqn.replay_steps[0]) % dqn.S
        dqn.collect()
        a = dqn.replay_action[:, row]
        new_p = a - 1
        if fill == "close":  # the new position earns close to close
            want = new_p * data.returns[t] - 3e-4 * (new_p - p).abs()
        else:  # the old one earns until the next open, the new one from there
            want = p * data.gap[t] + new_p * data.bar[t] - 3e-4 * (new_p - p).abs()
        torch.testing.assert_close(dqn.replay_reward[:, row], want)
        assert torch.equal(dqn.replay_t[:, row], t) and torch.equal(dqn.replay_position[:, row], p)
        done = dqn.replay_done[:, row]
        assert torch.equal(dqn.t[~done], t[~done] + 1) and torch.equal(dqn.position[~done], new_p[~done])
        assert (dqn.ep_step[done] == 0).all()
        log.append(tuple(x[0] for x in (t, p, a, dqn.replay_reward[:, row], done)))
    step, env = dqn.sample_indices()
    n_rows = int(dqn.replay_steps[0])
    assert int(step[0].min()) >= n_rows - 40 and int(step[0].max()) <= n_rows - 3
    got = [x[0] for x in dqn.n_step_batch(step, env)]
    first = n_rows - 90  # the warm-up rows are not in the log
    for j in range(step.shape[1]):
        i, e = int(step[0, j]) - first, int(env[0, j])
        if i < 0:
            continue
        ret, k = 0.0, 0
        for m in range(3):
            t, p, a, r, d = (x[e] for x in log[i + m])
            ret += 0.8**m * float(r)
            k += 1
            if bool(d):
                break
        last_a = int(log[i + k - 1][2][e])
        want = (int(log[i][0][e]), int(log[i][1][e]), int(log[i][2][e]), ret, int(log[i][0][e]) + k, last_a - 1, 0.8**k)
        have = tuple(float(x[j]) for x in got)
        assert np.allclose(have, want, rtol=1e-5, atol=1e-9), (j, have, want)


def test_epsilon_schedule_decays_linearly_then_holds():
    data = DeviceData(random_arrays())
    cfg = TINY.replace(eps_start=1.0, eps_end=0.1, eps_decay=0.5, epochs=10, steps_per_epoch=100)
    dqn = DQN(data, [cfg])
    eps = []
    for s in (0, 250, 500, 900):
        dqn.global_step.fill_(s)
        eps.append(float(dqn.epsilon()[0, 0]))
    assert eps == pytest.approx([1.0, 0.55, 0.1, 0.1])


# --- the network and the optimizer --------------------------------------------------------------


def test_q_all_equals_forward_for_each_position_and_the_onnx_member():
    net = QNetwork(2, 50, 32, 3, "cpu")
    net.load_members([initial_weights(50, 32, 3, seed) for seed in (0, 1)])
    x = torch.randn(2, 100, 50)
    qa = net.q_all(x)
    for p in (-1, 0, 1):
        torch.testing.assert_close(qa[:, :, p + 1], net(x, torch.full((2, 100), p)))
    # a member's state round-trips through a checkpoint's names
    again = QNetwork.from_states([net.state(1)])
    assert torch.equal(again.q_all(x[1:]), qa[1:])


def test_initial_weights_are_deterministic_and_differ_by_seed():
    a, b, c = initial_weights(50, 32, 2, 7), initial_weights(50, 32, 2, 7), initial_weights(50, 32, 2, 8)
    assert all(torch.equal(p, q) for p, q in zip(a, b)) and not all(torch.equal(p, q) for p, q in zip(a, c))
    assert [tuple(p.shape) for p in a] == [(3, 32), (32, 50), (32,), (32, 32), (32,), (4, 32), (4,)]


def test_adam_is_torch_adamw_per_member_on_cpu_and_the_stacked_formula_agrees():
    """Member by member (the CPU's path) against torch.optim.AdamW with each member's lr and
    weight decay, a reset in the middle and a member masked; the stacked formula CUDA runs,
    on the CPU, equal to float rounding."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 7, 5, generator=gen), torch.randn(3, 5, generator=gen)]
    grads = [[torch.randn(p.shape, generator=gen) for p in start] for _ in range(8)]
    lrs, wds = [1e-3, 3e-3, 5e-4], [0.0, 1e-2, 0.0]
    runs = []
    for stacked in (False, True):
        params, active = [p.clone() for p in start], torch.ones(3, dtype=torch.bool)
        opt = Adam(params, lrs, wds, active)
        opt.stacked = stacked
        for i, g in enumerate(grads):
            if i == 4:
                active[2] = False  # masked from the fifth step on
            for p, gi in zip(params, g):
                p.grad = gi.clone()
            opt.step()
        runs.append((params, opt))
    (plain, plain_opt), (fast, fast_opt) = runs
    assert plain_opt.steps.tolist() == fast_opt.steps.tolist() == [8, 8, 4]
    for a, b in zip(plain, fast):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    for k in range(3):
        ref = [p[k].clone().requires_grad_() for p in start]
        opt = torch.optim.AdamW(ref, lr=lrs[k], weight_decay=wds[k])
        for g in grads[: 8 if k < 2 else 4]:
            for p, gi in zip(ref, g):
                p.grad = gi[k].clone()
            opt.step()
        for a, b in zip(plain, ref):
            torch.testing.assert_close(a[k], b.detach(), rtol=0, atol=1e-7)


@pytest.mark.parametrize("k, n", [(1, 4096), (2, 4096), (3, 1536), (64, 1024), (2, 1000)])
def test_split_k_weight_gradient_is_autograds(k, n):
    """The CUDA path's SplitKMatmul (the weight gradient summed over row chunks) against autograd's
    own baddbmm / bmm backward, in float64: the same gradients to rounding, with and without a bias."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(k, n, 7, dtype=torch.float64, generator=gen)
    w = torch.randn(k, 5, 7, dtype=torch.float64, generator=gen)
    b = torch.randn(k, 5, dtype=torch.float64, generator=gen)
    g = torch.randn(k, n, 5, dtype=torch.float64, generator=gen)
    for bias in (b, None):
        grads = []
        for fast in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (x, w) + ((bias,) if bias is not None else ())]
            xb, wb, bb = leaves[0], leaves[1], leaves[2] if bias is not None else None
            if fast:
                y = SplitKMatmul.apply(xb, wb, bb)
            elif bb is None:
                y = torch.bmm(xb, wb.transpose(1, 2))
            else:
                y = torch.baddbmm(bb.unsqueeze(1), xb, wb.transpose(1, 2))
            y.backward(g)
            grads.append([y.detach()] + [t.grad for t in leaves])
        for plain, split in zip(*grads):
            torch.testing.assert_close(split, plain, rtol=1e-12, atol=1e-12)
    assert split_chunks(4096, 2) == 8 and split_chunks(1000, 2) == 1 and split_chunks(1024, 64) == 1


def test_the_batched_paths_cuda_runs_agree_with_the_per_member_ones(market_data):
    """CUDA's stacked path (one bmm a layer, the position embedding and the bias inside the first layer's GEMM,
    the front end over every member's batch, split-K weight gradients) forced on the CPU: the same Q
    and, after a fold, the same weights to rounding."""
    data, fold = market_data
    cfgs = [BASE.replace(inputs="ridge", lr=1e-3), BASE.replace(inputs="ridge", lr=3e-3, gamma=0.9)]
    weights = []
    for batched in (False, True):
        trainer = Trainer(data, cfgs)
        net = trainer.dqn.q_network
        net.per_member, net.split_k = not batched, batched
        trainer.run_fold(fold, [0, 1])
        weights.append([p.detach().clone() for p in trainer.dqn.params])
        t = torch.arange(fold.val[0], fold.val[0] + 64)
        market = data.states(t).unsqueeze(0).expand(2, -1, -1)
        position = torch.tensor([-1, 0, 1]).repeat(22)[:64].expand(2, -1)
        q = (net(market, position), net.q_all(market))
        if batched:
            net.per_member, net.split_k = True, False
            for a, b in zip(q, (net(market, position), net.q_all(market))):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip(*weights):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_bfloat16_storage_keeps_a_steps_loss_and_gradients_within_tolerance_of_float32(synth_cache):
    """Mixed precision on the CPU (dqn.dtype bfloat16: the features stored in 8 bits of mantissa,
    computed in float32): the same weights, replay rows and batch as float32 storage give the
    same TD loss and |Q| max within 2 % and gradients within 2 % of their norm, per weight."""
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FOLDS)[0]
    cfgs = [TINY.replace(inputs="ridge"), TINY.replace(inputs="ridge", lr=1e-3, gamma=0.9, n_step=3)]
    dqns = {}
    for dtype in ("float32", "bfloat16"):
        data = DeviceData(market, dtype=dtype)
        data.set_fold(fold)
        dqns[dtype] = DQN(data, [c.replace(dtype=dtype) for c in cfgs])
        dqns[dtype].begin([3, 4])
    out = one_batch(dqns, "float32")
    assert not torch.equal(out["bfloat16"][0], out["float32"][0])  # the storage did change the numbers
    torch.testing.assert_close(out["bfloat16"][0], out["float32"][0], rtol=2e-2, atol=0)
    torch.testing.assert_close(out["bfloat16"][1], out["float32"][1], rtol=2e-2, atol=0)
    for a, b in zip(out["bfloat16"][2], out["float32"][2]):
        assert float((a - b).norm() / b.norm()) < 2e-2


# --- a member is what its config trains alone -------------------------------------------------------


def test_each_member_trains_bit_for_bit_what_its_config_trains_alone(market_data, tmp_path):
    data, fold = market_data
    trainer = Trainer(data, MEMBERS)
    results = trainer.run_fold(fold, SEEDS, checkpoint_dirs=[tmp_path / f"m{k}" for k in range(3)])
    # the early stop is exercised: member 1 (patience 1) is masked while the others go on
    assert results[1].epochs_run < results[0].epochs_run == BASE.epochs
    for k, (cfg, seed) in enumerate(zip(MEMBERS, SEEDS)):
        solo = alone(data, cfg, fold, seed, tmp_path / f"alone{k}")
        assert_same_fold(solo, results[k])
        (ours, our_meta), (theirs, their_meta) = (
            load_checkpoint(results[k].checkpoint),
            load_checkpoint(solo.checkpoint),
        )
        assert our_meta == their_meta and list(ours) == list(theirs)
        assert all(torch.equal(ours[name], theirs[name]) for name in theirs), k
    # the same trainer, its slots given other trials: in place (the same step structure keeps
    # the graph) and with another structure (which members draw input noise)
    for order in ([2, 1, 0], [1, 1, 0]):
        trainer.configure([MEMBERS[i] for i in order])
        again = trainer.run_fold(fold, [SEEDS[i] for i in order])
        for i, b in zip(order, again):
            assert without_timings(results[i].curve) == without_timings(b.curve) and results[i].test == b.test


@pytest.mark.parametrize("screen_t", [0.0, 2.0])
def test_members_with_the_front_end_train_what_they_train_alone_and_checkpoint_a_plain_network(
    market_data, tmp_path, screen_t
):
    """dqn.inputs: ridge: the fold's front end (with a screen, 11 wide: the inputs of its products
    too), input noise on the clock only, and each member's checkpoint a plain network's (the front
    folded in) that computes the Q the member scored."""
    data, fold = market_data
    members = [cfg.replace(inputs="ridge", screen_t=screen_t) for cfg in MEMBERS[:2]]
    trainer = Trainer(data, members)
    results = trainer.run_fold(fold, SEEDS[:2], checkpoint_dirs=[tmp_path / "a", tmp_path / "b"])
    for k, (cfg, seed) in enumerate(zip(members, SEEDS)):
        assert_same_fold(alone(data, cfg, fold, seed), results[k])
    state, _ = load_checkpoint(results[0].checkpoint)
    assert state["market_in.weight"].shape[1] == data.n_inputs
    plain = QNetwork.from_states([state])
    x = data.states(torch.arange(*fold.val)).unsqueeze(0)
    torch.testing.assert_close(plain.q_all(x)[0], trainer.dqn.q_network.q_all(x, [0])[0], rtol=1e-4, atol=1e-4)
    raw = alone(data, MEMBERS[0], fold, SEEDS[0])  # the front end is used: raw inputs train another policy
    assert without_timings(raw.curve) != without_timings(results[0].curve)


def test_a_seed_ensemble_is_the_mean_q_policy_of_its_seeds_each_trained_alone(market_data, tmp_path):
    data, fold = market_data
    cfg = BASE.replace(seeds=3)
    (result,) = Trainer(data, [cfg]).run_fold(fold, [4], checkpoint_dirs=[tmp_path])
    seeds = [4, 4 + 7919, 4 + 2 * 7919]
    singles = [alone(data, BASE, fold, s, tmp_path / f"s{s}") for s in seeds]
    nets = QNetwork.from_states([load_checkpoint(s.checkpoint)[0] for s in singles])
    data.set_fold(fold)
    for w in ("val", "test"):
        window = getattr(fold, w)
        x = data.states(torch.arange(window[0], window[1] - 1)).unsqueeze(0).expand(3, -1, -1)
        want = backtest(nets.q_all(x).mean(0), data.window(window, cfg.fill), cfg.cost)
        assert getattr(result, w) == asdict(want.metrics) and getattr(result, f"{w}_periods") == want.periods.as_dict()
    spread = result.seed_spread
    assert spread["seeds"] == seeds and spread["status"] == ["ok"] * 3
    assert spread["test_sharpe"] == [s.test["sharpe"] for s in singles] and len(set(spread["test_sharpe"])) == 3
    # a checkpoint per member, each with its own metrics and the ensemble's beside them
    names = sorted(p.name for p in tmp_path.glob("fold*.safetensors"))
    assert names == [f"fold{fold.k}.m{i}.safetensors" for i in range(3)]
    _, meta = load_checkpoint(tmp_path / names[2])
    assert meta["ensemble"] == {
        "seeds": 3, "val_score": result.val_score, "val": result.val, "test": result.test,
        "member": 2, "member_seed": seeds[2],
    }  # fmt: skip
    rec = FoldRecord.from_result(result.as_dict())
    assert rec.seeds == 3 and rec.seed_test_sharpe == spread["test_sharpe"]
    # trials of different seeds in one trainer: each is what it is alone
    mixed = Trainer(data, [cfg, cfg.replace(lr=2e-3)]).run_fold(fold, [4, 1])
    assert mixed[0].test == result.test and mixed[0].seed_spread == spread
    assert mixed[1].test == Trainer(data, [cfg.replace(lr=2e-3)]).run_fold(fold, [1])[0].test
    stopped = Trainer(data, [cfg]).run_fold(fold, [0], stop=lambda j: True)[0]
    assert stopped.status == "cancelled" and stopped.seed_spread["status"] == ["cancelled"] * 3


def test_a_masked_member_stops_changing_and_the_others_do_not_notice(market_data):
    def member_state(dqn, k):
        tensors = [*dqn.params, *dqn.target_params, *dqn.optimizer.exp_avg, *dqn.optimizer.exp_avg_sq]
        return [t[k].detach().clone() for t in tensors] + [
            x[k].clone() for x in (dqn.optimizer.steps, dqn.global_step, dqn.loss_sum)
        ]

    data, fold = market_data
    data.set_fold(fold)
    masked, free = DQN(data, MEMBERS), DQN(data, MEMBERS)
    for dqn in (masked, free):
        dqn.begin(SEEDS)
        for _ in range(5):
            dqn.step()
    masked.active[1] = False
    frozen = member_state(masked, 1)
    for dqn in (masked, free):
        for _ in range(5):
            dqn.step()
    assert all(torch.equal(a, b) for a, b in zip(frozen, member_state(masked, 1)))
    assert not all(torch.equal(a, b) for a, b in zip(frozen, member_state(free, 1)))  # it would have moved
    for k in (0, 2):
        assert all(torch.equal(a, b) for a, b in zip(member_state(masked, k), member_state(free, k))), k


def test_a_cancelled_trial_ends_at_once_and_the_others_train_on(market_data):
    data, fold = market_data
    asked = []

    def stop(j: int) -> bool:
        asked.append(j)
        return j == 1 and asked.count(1) > BASE.steps_per_epoch + 5  # in the middle of epoch 1

    trainer = Trainer(data, [MEMBERS[0], MEMBERS[2]])
    ours, cancelled = trainer.run_fold(fold, [3, 3], stop=stop)
    assert (cancelled.status, cancelled.epochs_run, cancelled.test) == ("cancelled", 1, {})
    assert_same_fold(alone(data, MEMBERS[0], fold, 3), ours)
    every = trainer.run_fold(fold, [3, 3], stop=lambda j: True)
    assert [(r.status, r.epochs_run) for r in every] == [("cancelled", 0)] * 2


# --- selection, divergence, repeatability ---------------------------------------------------------


def test_same_seed_same_fold_is_bitwise_repeatable_on_cpu(market_data):
    data, fold = market_data
    trainer = Trainer(data, [TINY])
    (r1,), (r2,) = trainer.run_fold(fold, [3]), trainer.run_fold(fold, [3])
    assert [c["loss"] for c in r1.curve] == [c["loss"] for c in r2.curve]
    assert r1.val == r2.val and r1.test == r2.test
    (r3,) = Trainer(data, [TINY]).run_fold(fold, [4])
    assert [c["loss"] for c in r3.curve] != [c["loss"] for c in r1.curve]


def held_out_folds(ts) -> tuple[Fold, Fold]:
    """One fold twice: epochs chosen on window W as its val, and on W as its holdout window
    with another window as val (the training range and test are the same)."""
    folds = make_folds(ts, FOLDS)
    f = folds[1]
    return Fold(1, f.train, f.val, f.test), Fold(1, f.train, folds[2].val, f.test, holdout=f.val)


def test_a_select_window_chooses_the_epoch_and_val_only_scores_it(synth_cache):
    market = cache.open(synth_cache)
    data = DeviceData(market)
    on_val, held = held_out_folds(market.ts)
    cfg = TINY.replace(epochs=4, patience=1)
    plain = alone(data, cfg, on_val, 2)
    trainer = Trainer(data, [cfg])
    (result,) = trainer.run_fold(held, [2])
    # the same training and the same choice: every epoch is scored on the same window
    assert without_timings(result.curve) == without_timings(plain.curve)
    assert (result.best_epoch, result.epochs_run, result.test) == (plain.best_epoch, plain.epochs_run, plain.test)
    # val is the kept weights' score on the val window, which chose nothing
    val = trainer.evaluate(held.val, [0])[0]
    assert result.val == asdict(val.metrics) and result.val != plain.val
    assert result.val_score == selection_score(data, val, cfg.cost) and result.val_periods == val.periods.as_dict()


def test_select_from_trains_and_scores_the_early_epochs_and_never_keeps_them(market_data):
    """select_from = k: epochs before k are trained and in the curve but never kept, and patience
    counts from k (with patience 1 a fold still runs to k)."""
    data, fold = market_data
    late = alone(data, TINY.replace(epochs=3, select_from=2, patience=1), fold, 4)
    assert len(late.curve) == 3 and late.best_epoch == 2
    for seed in range(3):
        plain = alone(data, TINY.replace(epochs=3), fold, seed)
        one = alone(data, TINY.replace(epochs=3, select_from=1), fold, seed)
        assert without_timings(one.curve) == without_timings(plain.curve)[: len(one.curve)] and one.best_epoch >= 1
        scores = [c["val_score"] for c in one.curve]
        assert one.best_epoch == 1 + int(np.argmax(scores[1:]))  # the first best of the eligible epochs


def test_divergence_is_judged_against_the_rewards_scale_and_never_scored(market_data):
    """Overflow (Q inf) and a finite but absurd Q (far past what the fold's rewards allow) are both
    "diverged": no kept epoch, no val or test, the references still reported; the other member of
    the same trainer goes on."""
    data, fold = market_data
    overflow = TINY.replace(reward_scale=1e36, huber_delta=1e36)
    result = alone(data, overflow, fold, 0)
    assert result.status == "diverged" and result.best_epoch == -1 and result.test == {}
    assert result.baselines["buy_and_hold"]["n_days"] > 0
    # a learning rate of 1 without clipping: Q stays finite (float32) but runs far past the bound
    absurd = TINY.replace(lr=1.0, grad_clip=1e30)
    ok, bad = Trainer(data, [TINY, absurd]).run_fold(fold, [0, 0])
    assert bad.status == "diverged" and bad.val == {} and math.isfinite(bad.curve[-1]["q_max"])
    r_max = float(data.returns[fold.train[0] : fold.train[1]].abs().max())
    assert bad.curve[-1]["q_max"] > q_bound(absurd, r_max) > 100 * max(c["q_max"] for c in ok.curve)
    assert ok.status == "ok" and ok.test == alone(data, TINY, fold, 0).test


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^dqn\.gamma: 1\.5 must be a number in \[0, 1\]$"):
        DQNConfig(gamma=1.5)
    with pytest.raises(ConfigError, match="dqn.hidden"):
        DQNConfig(hidden=0)
    with pytest.raises(ConfigError, match="unknown key.*widht"):
        make_config({"widht": 3})
    for gone in ("update", "compile", "dueling", "noise_calendar", "target_every", "select"):
        with pytest.raises(ConfigError, match=rf"unknown key\(s\) {gone}; known: "):
            make_config({gone: 1})
    # an older record's algo (a sidecar's, a run directory's, MLflow params): dqn, read past
    assert make_config({"algo": "dqn", "lr": 1e-3}) == DQNConfig(lr=1e-3) and "algo" not in DQNConfig().as_dict()
    with pytest.raises(ConfigError, match=r"^algo: 'ppo' is not an algorithm fxray trains \(dqn only\)$"):
        make_config({"algo": "ppo"})
    with pytest.raises(ConfigError, match="dqn.dtype"):
        DQNConfig(dtype="float16")
    with pytest.raises(ConfigError, match=r"^dqn\.select_from: 3 must .* 3\): lower it \(--set select_from=0\)"):
        DQNConfig(epochs=3, select_from=3)
    with pytest.raises(ConfigError, match=r"^dqn.inputs: member 1 has 'ridge', member 0 'raw'; "):
        check_members([BASE, BASE.replace(inputs="ridge")])
    with pytest.raises(ConfigError, match=r"^dqn\.hidden: member 1 has 64, member 0 32; "):
        check_members([BASE, BASE.replace(hidden=64)])
    with pytest.raises(ConfigError, match="no members"):
        check_members([])
    with pytest.raises(ConfigError, match=r"^dqn\.seeds: a trainer's trials keep their seeds"):
        Trainer(DeviceData(random_arrays()), [BASE]).configure([BASE.replace(seeds=2)])


SWITCHES = [
    {"fill": "close"},
    {"inputs": "ridge"},
    {"dtype": "bfloat16"},
    {"graphs": False},
    {"matmul": "fp32"},
    {"demo": 1.0},
    {"inputs": "ridge", "demo": 1.0, "screen_t": 2.0},
    {"screen_t": 50.0, "abstain": True},
    {"seeds": 2},
    {"select_from": 1},
]


@pytest.mark.parametrize("switch", SWITCHES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_every_switch_validation_accepts_trains_a_tiny_fold(synth_cache, switch):
    """Each value of each switch left in DQNConfig, on the CPU: a fold that ends "ok" with val and
    test scored (a screen at t 50 keeps nothing: the abstained fold is flat, untrained)."""
    market = cache.open(synth_cache)
    cfg = TINY.replace(epochs=2, steps_per_epoch=5, **switch)
    data = DeviceData(market, dtype=cfg.dtype)
    (result,) = Trainer(data, [cfg]).run_fold(make_folds(market.ts, FOLDS)[0], [0])
    assert result.status == "ok" and math.isfinite(result.val_score) and result.test["n_days"] > 0
    assert result.abstained == cfg.abstain and result.epochs_run == (0 if cfg.abstain else 2)
    assert (len(result.seed_spread.get("seeds", [])) == 2) == (cfg.seeds == 2)


# --- learning, not just running -------------------------------------------------------------


def oracle_positions(flow: np.ndarray, beta: float, cost: float, sigma: np.ndarray) -> np.ndarray:
    """Positions in {-1, 0, +1} of an agent that knows the planted signal (an upper bound).

    Expected next-bar return is beta * sigma * s; holding a position earns it, and
    entering or flipping pays `cost` per unit. A deadband of cost / (beta * sigma)
    (one side of a round trip, amortised over the flow's persistence) keeps it from
    paying more in costs than it earns on weak signals.
    """
    edge = beta * sigma * flow
    return np.where(edge > cost, 1, np.where(edge < -cost, -1, 0)).astype(np.int8)


def oracle_sharpe(market_spec: SynthSpec, data: DeviceData, window, cost) -> float:
    from fxray.data.features import MAX_LOOKBACK

    m = simulate(market_spec, market_spec.n_bars + MAX_LOOKBACK)
    a, b = window[0] + MAX_LOOKBACK, window[1] - 1 + MAX_LOOKBACK  # cache row i = simulated bar i + warm-up
    # bar t's return is driven by flow[t] and sigma[t+1]
    pos = oracle_positions(m.flow[a:b], market_spec.beta, cost, m.sigma[a + 1 : b + 1])
    res = evaluate(torch.from_numpy(pos.astype(np.int64)), data.window(window, "close"), cost)
    return res.metrics.sharpe


@pytest.mark.slow
def test_default_config_learns_a_strong_planted_signal(strong_cache, one_torch_thread):
    from conftest import STRONG

    market = cache.open(strong_cache)
    data = DeviceData(market)
    cfg = DQNConfig(cost=1e-5)
    folds = make_folds(market.ts, FoldSpec(train="20d", val="5d", test="5d", step="10d", max_folds=1))
    trainer = Trainer(data, [cfg])
    for fold in folds:
        (result,) = trainer.run_fold(fold, [fold.k])
        oracle = oracle_sharpe(SynthSpec(n_bars=60_000, seed=0, **STRONG), data, fold.test, cfg.cost)
        assert oracle > 5, "the planted signal should be worth trading"
        assert result.status == "ok"
        assert result.test["sharpe"] >= 0.5 * oracle, (fold.k, result.test["sharpe"], oracle)


@pytest.mark.slow
def test_shuffled_returns_control_does_not_look_profitable(strong_cache, one_torch_thread):
    """Same features, returns permuted: the signal is gone, so must be the profit; with the
    ridge rule's demonstrations too (dqn.demo: the rule is fitted on the permuted returns).
    Both demo values train as one population (each member as it would alone). A smaller learner
    than the default (hidden 128, 3 epochs: a fifth of the CPU time) learns the real market
    (test Sharpe 17.7 and 21.0 on the CPU) and must find nothing in its control."""
    market = cache.open(strong_cache)
    rng = np.random.default_rng(0)
    r = np.diff(np.log(market.close))
    close = market.close[0] * np.exp(np.concatenate([[0.0], np.cumsum(rng.permutation(r))]))
    arrays = {"ts": market.ts, "features": market.features, "ofi": market.ofi, "open": close, "close": close}
    cfgs = [DQNConfig(cost=1e-5, fill="close", demo=demo, hidden=128, epochs=3) for demo in (0.0, 1.0)]
    fold = make_folds(market.ts, FoldSpec(train="20d", val="5d", test="20d", max_folds=1))[0]
    controls = Trainer(DeviceData(arrays), cfgs).run_fold(fold, [0, 0])
    reals = Trainer(DeviceData(market), cfgs).run_fold(fold, [0, 0])
    for cfg, control, real in zip(cfgs, controls, reals):
        assert real.test["sharpe"] > 8, cfg.demo
        assert control.test["sharpe"] < 0.2 * real.test["sharpe"], (cfg.demo, control.test, real.test)
        assert control.test["total_return"] < 0.2 * real.test["total_return"], cfg.demo
        assert math.isfinite(control.test["sharpe"])
