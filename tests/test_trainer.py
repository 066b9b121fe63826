"""The fold trainer: dataset on device, env, index replay, DQN, learning on the planted market."""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.features import FEATURE_NAMES
from fxray.data.folds import Fold, FoldSpec, make_folds
from fxray.data.synth import SynthSpec, oracle_positions, simulate
from fxray.eval.backtest import evaluate
from fxray.rl.config import ConfigError, DQNConfig, field_docs
from fxray.rl.device import DeviceData
from fxray.rl.dqn import Learner, QNetwork, collect, epsilon
from fxray.rl.env import TradingEnv
from fxray.rl.optim import Adam
from fxray.rl.replay import Replay
from fxray.rl.trainer import Trainer, load_checkpoint, train_fold

FOLDS = FoldSpec(train="20d", val="5d", test="5d")
TINY = DQNConfig(
    hidden=32, num_envs=16, batch_size=64, buffer_steps=32, episode_len=20, steps_per_epoch=20, epochs=2, patience=2
)


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


# --- device ---------------------------------------------------------------------------


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


# --- env --------------------------------------------------------------------------------


@pytest.mark.parametrize("fill", ["close", "next_open"])
def test_env_reward_and_resets_stay_in_the_train_range(fill):
    data = DeviceData(random_arrays())
    data.set_fold(Fold(0, (500, 900), (1000, 1500), (1600, 2000)))
    env = TradingEnv(data, num_envs=64, episode_len=7, cost=3e-4, fill=fill)
    torch.manual_seed(0)
    env.reset()
    for _ in range(200):
        t, p = env.t.clone(), env.position.clone()
        assert ((t >= 500) & (t <= 898)).all()
        action = torch.randint(0, 3, (64,))
        reward, done = env.step(action)
        new_p = action - 1
        if fill == "close":  # the new position earns close to close
            expected = new_p * data.returns[t] - 3e-4 * (new_p - p).abs()
        else:  # the old one earns until the next open, the new one from there
            expected = p * data.gap[t] + new_p * data.bar[t] - 3e-4 * (new_p - p).abs()
        torch.testing.assert_close(reward, expected)
        cont = ~done
        assert torch.equal(env.t[cont], t[cont] + 1) and torch.equal(env.position[cont], new_p[cont])
        assert (env.ep_step[done] == 0).all()


# --- replay: n-step returns against a per-transition reference ---------------------------


def test_replay_n_step_matches_a_plain_reference():
    cfg = DQNConfig(n_step=3, gamma=0.8, buffer_steps=40, num_envs=5)
    data = DeviceData(random_arrays())
    data.set_fold(Fold(0, (0, 1000), (1100, 1500), (1600, 2000)))
    env = TradingEnv(data, num_envs=5, episode_len=4, cost=1e-4)
    replay = Replay(cfg, 5, "cpu")
    torch.manual_seed(1)
    env.reset()
    log = []  # per step: (t, p, a, r, done) for every env, kept in full (no ring)
    for _ in range(90):  # more than buffer_steps: the ring wraps
        t, p = env.t.clone(), env.position.clone()
        a = torch.randint(0, 3, (5,))
        r, d = env.step(a)
        replay.add(t, p, a, r, d)
        log.append((t, p, a, r, d))
    step, envi = replay.sample_indices(500)
    assert int(step.min()) >= 90 - 40 and int(step.max()) <= 90 - 3
    got = replay.n_step_batch(step, envi)
    for j in range(500):
        i, e = int(step[j]), int(envi[j])
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


# --- network and learner ---------------------------------------------------------------


def test_q_all_equals_forward_for_each_position():
    torch.manual_seed(0)
    net = QNetwork(50, 32, 3, dueling=True)
    x = torch.randn(100, 50)
    qa = net.q_all(x)
    for p in (-1, 0, 1):
        torch.testing.assert_close(qa[:, p + 1], net(x, torch.full((100,), p)))


def adam_against_torch(device: str, steps: int = 6, **torch_kw) -> tuple[list, list]:
    """Parameters after `steps` updates by fxray's Adam and by torch.optim.Adam from the
    same start and the same gradients (including a reset in the middle)."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(7, 5, generator=gen), torch.randn(5, generator=gen), torch.randn(3, 1, generator=gen)]
    grads = [[torch.randn(p.shape, generator=gen) for p in start] for _ in range(steps)]
    ours = [p.clone().to(device).requires_grad_() for p in start]
    ref = [p.clone().to(device).requires_grad_() for p in start]
    opt = Adam(ours, lr=3e-3)
    ref_opt = torch.optim.Adam(ref, lr=3e-3, **torch_kw)
    for i, g in enumerate(grads):
        if i == steps // 2:  # fxray resets moments and step count between folds
            opt.reset()
            ref_opt = torch.optim.Adam(ref, lr=3e-3, **torch_kw)
        opt.zero_grad()
        ref_opt.zero_grad()
        for p, q, gi in zip(ours, ref, g):
            p.grad, q.grad = gi.to(device), gi.to(device)
        opt.step()
        ref_opt.step()
    return [p.detach().cpu() for p in ours], [p.detach().cpu() for p in ref]


def test_adam_is_torch_adam_on_cpu():
    ours, ref = adam_against_torch("cpu")
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_epsilon_schedule_decays_linearly_then_holds():
    cfg = DQNConfig(eps_start=1.0, eps_end=0.1, eps_decay=0.5)
    eps = [float(epsilon(cfg, torch.tensor(s), 1000)) for s in (0, 250, 500, 900)]
    assert eps == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_learner_reset_is_deterministic_and_device_independent():
    a = Learner(TINY, 50, "cpu")
    b = Learner(TINY, 50, "cpu")
    a.reset(7)
    b.reset(7)
    for p, q in zip(a.params, b.params):
        assert torch.equal(p, q)
    b.reset(8)
    assert any(not torch.equal(p, q) for p, q in zip(a.params, b.params))


# --- the trainer -------------------------------------------------------------------------


def test_same_seed_same_fold_is_bitwise_repeatable_on_cpu(synth_cache):
    market = cache.open(synth_cache)
    data = DeviceData(market)
    fold = make_folds(market.ts, FOLDS)[0]
    trainer = Trainer(data, TINY)
    r1, r2 = trainer.run_fold(fold, seed=3), trainer.run_fold(fold, seed=3)
    assert [c["loss"] for c in r1.curve] == [c["loss"] for c in r2.curve]
    assert r1.val == r2.val and r1.test == r2.test
    r3 = train_fold(data, fold, TINY, seed=4)
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
    plain = Trainer(data, cfg).run_fold(on_val, seed=2)
    trainer = Trainer(data, cfg)
    result = trainer.run_fold(held, seed=2)
    # the same training and the same choice: every epoch is scored on the same window
    strip = lambda curve: [{k: v for k, v in c.items() if not k.endswith("_s")} for c in curve]  # noqa: E731
    assert strip(result.curve) == strip(plain.curve)
    assert (result.best_epoch, result.epochs_run, result.test) == (plain.best_epoch, plain.epochs_run, plain.test)
    # val is the kept weights' score on the val window, which chose nothing
    val = trainer.evaluate(held.val)
    assert result.val == asdict(val.metrics) and result.val != plain.val
    assert result.val_score == trainer.score(val)
    assert result.val_periods == val.periods.as_dict()


def test_select_from_trains_and_scores_the_early_epochs_and_never_keeps_them(synth_cache):
    """select_from = k: epochs before k are trained and in the curve but never kept, and
    patience counts from k. With k = epochs - 1 the kept epoch is the last one, as select:
    last keeps it (same training, same test); with patience 1 the fold still runs to k."""
    market = cache.open(synth_cache)
    data = DeviceData(market)
    fold = make_folds(market.ts, FOLDS)[1]
    strip = lambda curve: [{k: v for k, v in c.items() if not k.endswith("_s")} for c in curve]  # noqa: E731
    last = Trainer(data, TINY.replace(epochs=3, select="last")).run_fold(fold, seed=4)
    late = Trainer(data, TINY.replace(epochs=3, select_from=2, patience=1)).run_fold(fold, seed=4)
    assert strip(late.curve) == strip(last.curve) and len(late.curve) == 3  # patience 1 did not stop it
    assert (late.best_epoch, late.test, late.val) == (2, last.test, last.val)
    # the default choice on the same training can keep an earlier epoch; select_from 1 never keeps 0
    for seed in range(4):
        plain = Trainer(data, TINY.replace(epochs=3)).run_fold(fold, seed=seed)
        one = Trainer(data, TINY.replace(epochs=3, select_from=1)).run_fold(fold, seed=seed)
        assert strip(one.curve) == strip(plain.curve)[: len(one.curve)] and one.best_epoch >= 1
        scores = [c["val_score"] for c in one.curve]
        assert one.best_epoch == 1 + int(np.argmax(scores[1:]))  # the first best of the eligible epochs


def test_divergence_is_a_status_not_an_exception(synth_cache):
    data = DeviceData(cache.open(synth_cache))
    fold = make_folds(cache.open(synth_cache).ts, FOLDS)[0]
    cfg = TINY.replace(reward_scale=1e36, huber_delta=1e36)  # Q overflows float32 at once
    result = train_fold(data, fold, cfg, seed=0)
    assert result.status == "diverged" and result.best_epoch == -1 and result.test == {}
    assert result.baselines["buy_and_hold"]["n_days"] > 0  # the fold still reports its baselines


def test_checkpoint_round_trip(synth_cache, tmp_path):
    data = DeviceData(cache.open(synth_cache))
    fold = make_folds(cache.open(synth_cache).ts, FOLDS)[1]
    result = train_fold(data, fold, TINY, seed=0, checkpoint_dir=tmp_path)
    tensors, meta = load_checkpoint(result.checkpoint)
    assert meta["fold"] == fold.as_dict() and meta["test"] == result.test
    assert DQNConfig.from_dict(meta["config"]) == TINY
    net = QNetwork(50, TINY.hidden, TINY.depth, TINY.dueling)
    net.load_state_dict(tensors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fold1.json", "fold1.safetensors"]


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^dqn\.gamma: 1\.5 must be a number in \[0, 1\]$"):
        DQNConfig(gamma=1.5)
    with pytest.raises(ConfigError, match="dqn.hidden"):
        DQNConfig(hidden=0)
    with pytest.raises(ConfigError, match="unknown key.*widht"):
        DQNConfig.from_dict({"widht": 3})
    with pytest.raises(ConfigError, match="dqn.dtype"):
        DQNConfig(dtype="float16")
    with pytest.raises(ConfigError, match=r"^dqn\.noise_calendar: 'no' must be true or false$"):
        DQNConfig(noise_calendar="no")
    with pytest.raises(ConfigError, match=r"^dqn\.select_from: 3 must .* 3\): lower it \(--set select_from=0\)"):
        DQNConfig(epochs=3, select_from=3)
    with pytest.raises(ConfigError, match=r"^dqn\.select_from: -1 must be an integer in \[0, epochs\) = \[0, 3\)$"):
        DQNConfig(epochs=3, select_from=-1)
    docs = field_docs()
    assert set(docs) == set(DQNConfig().as_dict()) and all(docs.values())


# --- learning, not just running -------------------------------------------------------------


def oracle_sharpe(market_spec: SynthSpec, data: DeviceData, window, cost) -> float:
    from fxray.data.features import MAX_LOOKBACK

    m = simulate(market_spec, market_spec.n_bars + MAX_LOOKBACK)
    a, b = window[0] + MAX_LOOKBACK, window[1] - 1 + MAX_LOOKBACK  # cache row i = simulated bar i + warm-up
    # bar t's return is driven by flow[t] and sigma[t+1]
    pos = oracle_positions(m.flow[a:b], market_spec.beta, cost, m.sigma[a + 1 : b + 1])
    res = evaluate(torch.from_numpy(pos.astype(np.int64)), data.window(window, "close"), cost)
    return res.metrics.sharpe


def test_default_config_learns_a_strong_planted_signal_in_every_fold(strong_cache, one_torch_thread):
    from conftest import STRONG

    market = cache.open(strong_cache)
    data = DeviceData(market)
    cfg = DQNConfig(cost=1e-5)  # the default size (the CPU profile's size reached 0.54 of the oracle in a fold here)
    folds = make_folds(market.ts, FoldSpec(train="20d", val="5d", test="5d", step="10d", max_folds=2))
    trainer = Trainer(data, cfg)
    for fold in folds:
        result = trainer.run_fold(fold, seed=fold.k)
        oracle = oracle_sharpe(SynthSpec(n_bars=60_000, seed=0, **STRONG), data, fold.test, cfg.cost)
        assert oracle > 5, "the planted signal should be worth trading"
        assert result.status == "ok"
        assert result.test["sharpe"] >= 0.5 * oracle, (fold.k, result.test["sharpe"], oracle)


@pytest.mark.parametrize("demo", [0.0, 1.0])
def test_shuffled_returns_control_does_not_look_profitable(strong_cache, one_torch_thread, demo):
    """Same features, returns permuted: the signal is gone, so must be the profit; with the
    ridge rule's demonstrations too (dqn.demo: the rule is fitted on the permuted returns)."""
    market = cache.open(strong_cache)
    rng = np.random.default_rng(0)
    r = np.diff(np.log(market.close))
    close = market.close[0] * np.exp(np.concatenate([[0.0], np.cumsum(rng.permutation(r))]))
    arrays = {"ts": market.ts, "features": market.features, "ofi": market.ofi, "open": close, "close": close}
    cfg = DQNConfig(cost=1e-5, fill="close", demo=demo)
    fold = make_folds(market.ts, FoldSpec(train="20d", val="5d", test="20d", max_folds=1))[0]
    control = train_fold(DeviceData(arrays), fold, cfg, seed=0)
    real = train_fold(DeviceData(market), fold, cfg, seed=0)
    assert real.test["sharpe"] > 8
    assert control.test["sharpe"] < 0.2 * real.test["sharpe"], (control.test, real.test)
    assert control.test["total_return"] < 0.2 * real.test["total_return"]
    assert math.isfinite(control.test["sharpe"])


def filled_replay(cfg, n_batches: int):
    """(data, replay, batches): a random market's fold, a replay filled by a random network,
    and `n_batches` sampled (step, env) index batches, for comparing two learners' updates."""
    data = DeviceData(random_arrays())
    data.set_fold(Fold(0, (0, 1500), (1600, 2200), (2300, 2900)))
    env = TradingEnv(data, cfg.num_envs, cfg.episode_len, cfg.cost)
    replay = Replay(cfg, cfg.num_envs, "cpu")
    torch.manual_seed(0)
    env.reset()
    for _ in range(20):
        collect(env, QNetwork(50, 8, 1, False), replay, torch.tensor(1.0))
    return data, replay, [replay.sample_indices(cfg.batch_size) for _ in range(n_batches)]


def test_compiled_loss_is_the_same_maths_as_eager():
    """cfg.compile (torch.compile of the TD loss) changes speed, not the updates."""
    cfg = TINY.replace(n_step=2)
    data, replay, batches = filled_replay(cfg, 4)
    learners = {}
    for compiled in (False, True):
        learner = Learner(cfg.replace(compile=compiled), 50, "cpu")
        learner.reset(1)
        torch.manual_seed(1)  # the input noise is drawn in learn(): the same draws for both
        for step, envi in batches:
            learner.learn(data, replay, step, envi)
        learners[compiled] = learner
    torch.testing.assert_close(learners[True].loss_sum, learners[False].loss_sum, rtol=1e-5, atol=1e-6)
    for p, q in zip(learners[True].params, learners[False].params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_the_clock_is_noised_unless_noise_calendar_is_false():
    """dqn.noise_calendar: false leaves the clock inputs (found here by name) without input
    noise; true, the default, gives every input the same N(0, input_noise^2)."""
    clock = [FEATURE_NAMES.index(n) for n in ("tod_sin", "tod_cos", "dow_sin", "dow_cos")]
    others = [i for i in range(50) if i not in clock]
    cfg = TINY.replace(input_noise=1.5, batch_size=2048)
    data, replay, batches = filled_replay(cfg, 1)
    for noise_calendar in (True, False):
        learner = Learner(cfg.replace(noise_calendar=noise_calendar), 50, "cpu")
        learner.reset(1)
        seen = []

        def recording(*args, seen=seen, plain=learner.loss_fn):
            seen.append(args[-1])
            return plain(*args)

        learner.loss_fn = recording
        learner.learn(data, replay, *batches[0])
        noise = seen[0]  # (2B, 50): what learn() added to the states of its batch
        assert noise.shape == (2 * cfg.batch_size, 50)
        assert abs(noise[:, others].std().item() - 1.5) < 0.02
        if noise_calendar:
            assert abs(noise[:, clock].std().item() - 1.5) < 0.05
        else:
            assert torch.count_nonzero(noise[:, clock]) == 0


def test_split_online_forward_is_the_joint_one():
    """On CPU the online network's forward over the next states runs without autograd (the
    joint pass over [s, s_next] of CUDA multiplies their zero gradients too): same updates."""
    cfg = TINY.replace(n_step=3, input_noise=0.5)
    data, replay, batches = filled_replay(cfg, 6)
    learners = {}
    for joint in (True, False):
        learner = Learner(cfg, 50, "cpu")
        assert not learner.joint_forward  # the CPU's choice
        learner.joint_forward = joint
        learner.reset(1)
        torch.manual_seed(1)
        for step, envi in batches:
            learner.learn(data, replay, step, envi)
        learners[joint] = learner
    assert learners[True].loss_sum > 0
    torch.testing.assert_close(learners[True].loss_sum, learners[False].loss_sum, rtol=1e-6, atol=1e-7)
    for p, q in zip(learners[True].params, learners[False].params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    untrained = Learner(cfg, 50, "cpu")
    untrained.reset(1)
    assert all(not torch.equal(p, u) for p, u in zip(learners[False].params, untrained.params))  # it learned


def every_action_learner(cfg: DQNConfig):
    """A replay filled under cfg, its env (fill next_open: fresh = bar, carry = gap) and a
    Learner wired to it whose target network is unlike the online one (Double DQN's split shows)."""
    data, replay, batches = filled_replay(cfg, 1)
    env = TradingEnv(data, cfg.num_envs, cfg.episode_len, cfg.cost)
    learner = Learner(cfg, 50, "cpu")
    learner.fresh, learner.carry = env.fresh, env.carry
    learner.reset(3)
    with torch.no_grad():
        for p in learner.target_params:
            p.add_(0.1 * torch.randn_like(p))
    return data, replay, batches, env, learner


def assert_one_step_is_all_actions(cfg: DQNConfig, data, replay, batch, env) -> None:
    """cfg's update at n_step 1 gives the all_actions loss exactly, on one replay batch."""
    step, envi = batch
    noise = torch.randn(2 * cfg.batch_size, 50)
    losses = []
    for update in (cfg.update, "all_actions"):
        lrn = Learner(cfg.replace(n_step=1, update=update), 50, "cpu")
        lrn.fresh, lrn.carry = env.fresh, env.carry
        lrn.reset(3)
        losses.append(lrn.td_loss(data, replay, step, envi, noise)[0])
    assert torch.equal(*losses)


def test_hold_targets_match_a_plain_reference():
    """update 'hold': each action's target is the return of holding its new position n bars
    (cut at the train range's end), bootstrapped Double-DQN at (t + m, p'); n_step 1 is the
    all_actions update exactly."""
    cfg = TINY.replace(update="hold", n_step=4, gamma=0.8, cost=1e-4, reward_scale=1e4)
    data, replay, batches, env, learner = every_action_learner(cfg)
    end = int(data.bounds[1])
    t = torch.tensor([0, 17, 700, end - 5, end - 4, end - 3, end - 2])  # the last four cut n
    position = torch.tensor([-1, 0, 1, 1, -1, 0, 1])
    got = learner.hold_targets(data, t, position, cfg.n_step, torch.float32)
    bar, gap, r = data.bar.double(), data.gap.double(), data.returns.double()
    for j in range(len(t)):
        tj, p = int(t[j]), int(position[j])
        m = min(4, end - 1 - tj)
        s = data.states(torch.tensor([tj + m]))
        q_online, q_target = learner.q_network.q_all(s)[0], learner.target_network.q_all(s)[0]  # (3 p', 3 a)
        for i, new in enumerate((-1, 0, 1)):
            ret = new * bar[tj] + p * gap[tj] - 1e-4 * abs(new - p)
            ret += sum(0.8**k * new * r[tj + k] for k in range(1, m))
            value = q_target[i, int(q_online[i].argmax())]
            want = float(ret) * 1e4 + 0.8**m * float(value)
            assert abs(float(got[j, i]) - want) < 1e-4 * max(1.0, abs(want)), (j, new, float(got[j, i]), want)
    one = learner.hold_targets(data, t, position, 1, torch.float32)
    assert not torch.allclose(one, got)
    assert_one_step_is_all_actions(cfg, data, replay, batches[0], env)
    refused = r"^dqn\.update: 'held' must be 'sampled', 'all_actions', 'hold' or 'rollout'$"
    with pytest.raises(ConfigError, match=refused):
        DQNConfig(update="held")


def test_rollout_targets_match_a_plain_reference():
    """update 'rollout': each first action's target is the n-step return of the online
    network's greedy policy after it, on the bars that followed, cut at the train range's
    end, bootstrapped Double-DQN at (t + m, the branch's position); n_step 1 is all_actions."""
    cfg = TINY.replace(update="rollout", n_step=4, gamma=0.8, cost=1e-4, reward_scale=1e4)
    data, replay, batches, env, learner = every_action_learner(cfg)
    end = int(data.bounds[1])
    t = torch.tensor([0, 17, 700, 1203, end - 5, end - 4, end - 3, end - 2])  # the last four cut n
    position = torch.tensor([-1, 0, 1, 0, 1, -1, 0, 1])
    got = learner.rollout_targets(data, t, position, cfg.n_step, torch.float32)
    bar, gap = data.bar.double(), data.gap.double()
    moves = by_position = 0
    for j in range(len(t)):
        tj, p = int(t[j]), int(position[j])
        m = min(4, end - 1 - tj)
        for i, first in enumerate((-1, 0, 1)):
            ret = first * bar[tj] + p * gap[tj] - 1e-4 * abs(first - p)
            held = first
            for k in range(1, m):  # the greedy policy of the online network, bar by bar
                s = data.states(torch.tensor([tj + k]))
                new = int(learner.q_network(s, torch.tensor([held]))[0].argmax()) - 1
                moves += new != held
                by_position += new != int(learner.q_network(s, torch.tensor([0]))[0].argmax()) - 1
                ret += 0.8**k * (new * bar[tj + k] + held * gap[tj + k] - 1e-4 * abs(new - held))
                held = new
            s = data.states(torch.tensor([tj + m]))
            q_online = learner.q_network(s, torch.tensor([held]))[0]
            value = learner.target_network(s, torch.tensor([held]))[0, int(q_online.argmax())]
            want = float(ret) * 1e4 + 0.8**m * float(value)
            assert abs(float(got[j, i]) - want) < 1e-4 * max(1.0, abs(want)), (j, first, float(got[j, i]), want)
    # the greedy moves were checked where they change the position, and where the position
    # held decides the move (so a rollout that ignored what its branch holds would fail)
    assert moves > 0 and by_position > 0, (moves, by_position)
    assert not torch.allclose(got, learner.hold_targets(data, t, position, cfg.n_step, torch.float32))
    assert_one_step_is_all_actions(cfg, data, replay, batches[0], env)
