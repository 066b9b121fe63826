"""fxray.rl.frontend (dqn.inputs: ridge): the fold's front end against a plain numpy ridge, no
look-ahead, the network with its front against the plain network it folds into, the clean
predictions under input noise, and the refusals."""

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.schema import CALENDAR_INDICES
from fxray.rl import frontend
from fxray.rl.config import ConfigError, DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.network import QNetwork, initial_weights, names
from fxray.rl.trainer import Trainer


@pytest.fixture(scope="module")
def fold_data(synth_cache):
    m = cache.open(synth_cache)
    data = DeviceData(m)
    fold = make_folds(m.ts, FoldSpec("20d", "5d", "5d"))[0]
    data.set_fold(fold)
    return m, data, fold


def numpy_front(m, fold, horizons=frontend.HORIZONS):
    """The front end by hand: normalise the train slice's inputs, fit ridge of the next-h-bar
    bar return (next_open fill: the bar's open-to-close) on the non-clock ones, scale."""
    a, b = fold.train
    x = np.concatenate([np.asarray(m.features, np.float64), np.asarray(m.ofi, np.float64)], 1)
    train = x[a:b]
    mean, std = train.mean(0), train.std(0)
    std = np.where(std > 1e-8, std, 1.0)
    z = (x - mean) / std
    keep = [i for i in range(x.shape[1]) if i not in CALENDAR_INDICES]
    X = z[a : b - 1][:, keep]
    log_close, log_open = np.log(np.asarray(m.close)), np.log(np.asarray(m.targets[:, 0]))
    fresh = (log_close[1:] - log_open[1:])[a : b - 1]  # bar t's fill earns the next bar's open-to-close
    n = len(fresh)
    out = []
    for h in horizons:
        y = np.array([fresh[t : t + h].sum() for t in range(n)])
        w = np.linalg.solve(X.T @ X + 0.1 * n * np.eye(len(keep)), X.T @ y)
        pred = z[:, keep] @ w
        fit = pred[a : b - 1]
        out.append((pred - fit.mean()) / fit.std(ddof=1))
    return np.stack(out, 1), z[:, list(CALENDAR_INDICES)]


def test_the_front_end_is_the_train_slices_ridge_by_hand(fold_data):
    m, data, fold = fold_data
    A, c = frontend.fit(data, fold, "next_open")
    assert A.shape == (frontend.N_FRONT, data.n_inputs) and c.shape == (frontend.N_FRONT,)
    rows = torch.arange(fold.train[0], fold.test[1])
    u = (data.states(rows) @ A.T + c).numpy()
    preds, clock = numpy_front(m, fold)
    r = rows.numpy()
    np.testing.assert_allclose(u[:, :3], preds[r], atol=2e-3)
    np.testing.assert_allclose(u[:, 3:], clock[r], atol=1e-5)
    assert np.all(A[:3, list(CALENDAR_INDICES)].numpy() == 0)  # the clock is an input, not a regressor


def test_the_front_end_sees_nothing_after_its_train_slice(synth_cache):
    m = cache.open(synth_cache)
    fold = make_folds(m.ts, FoldSpec("20d", "5d", "5d"))[0]
    data = DeviceData(m)
    data.set_fold(fold)
    screened = dict(screen_t=2.0, cost=4e-5)  # with the screen's terms (inputs and products) too
    before = frontend.fit(data, fold, "next_open"), frontend.fit(data, fold, "next_open", **screened)
    end = fold.train[1]
    g = torch.Generator().manual_seed(0)
    data.x[end:] = torch.randn(data.x[end:].shape, generator=g)  # every input after the train slice
    data.bar[end:] = torch.randn(data.bar[end:].shape, generator=g) * 1e-3  # and every return
    data.screens.clear()  # the screen is computed again, on the changed data
    data.set_fold(fold)
    after = frontend.fit(data, fold, "next_open"), frontend.fit(data, fold, "next_open", **screened)
    for (A0, c0), (A1, c1) in zip(before, after):
        assert torch.equal(A0, A1) and torch.equal(c0, c1)


@pytest.mark.parametrize("batched", [False, True])
def test_the_network_with_its_front_is_the_plain_network_it_folds_into(batched):
    """The CPU's member-by-member fold and CUDA's one product for every slot (forced here): the
    checkpoint's plain network scores what the evaluation scored, bit for bit, and any subset of
    members folds to the same numbers as all of them."""
    net = QNetwork(3, 50, 32, 2, "cpu", front=frontend.N_FRONT)
    net.per_member = not batched
    net.load_members([initial_weights(frontend.N_FRONT, 32, 2, k) for k in range(3)])
    g = torch.Generator().manual_seed(0)
    net.front_w.copy_(torch.randn(net.front_w.shape, generator=g))
    net.front_b.copy_(torch.randn(net.front_b.shape, generator=g))
    plain = QNetwork.from_states(net.host_states([0, 2]))
    plain.per_member = net.per_member
    market, position = torch.randn(3, 64, 50), torch.randint(-1, 2, (3, 64))
    trained = net(market, position)[[0, 2]]  # training's forward: the two maps
    market, position = market[[0, 2]], position[[0, 2]]
    assert torch.allclose(plain(market, position), trained, atol=1e-5)
    assert torch.equal(plain.q_all(market), net.q_all(market, [0, 2]))  # evaluation's: the plain network's
    for a, b in zip(net.plain([2, 0]), net.plain()):
        assert torch.equal(a, b[[2, 0]])
    assert all(torch.equal(net.state(1)[name], w[1]) for name, w in zip(names(2), net.plain()))
    # the front is applied: a network reading the raw inputs into the same first layer differs
    assert not torch.allclose(net.q_all(market, [0, 2]), net.q_all(market + 1.0, [0, 2]))


def test_a_ridge_fold_trains_checkpoints_a_plain_network_and_reads_its_predictions_clean(fold_data):
    _, data, fold = fold_data
    cfg = DQNConfig(
        hidden=32, num_envs=16, batch_size=64, buffer_steps=32, episode_len=20, steps_per_epoch=5, epochs=1
    ).replace(inputs="ridge")
    trainer = Trainer(data, [cfg])
    (result,) = trainer.run_fold(fold, [0])
    assert result.status == "ok"
    dqn = trainer.dqn
    A, c = frontend.fit(data, fold, cfg.fill)
    assert torch.equal(dqn.q_network.front_w, A) and torch.equal(dqn.target_network.front_b, c)
    plain = QNetwork.from_states([dqn.q_network.state(0)])
    x = data.states(torch.arange(*fold.test))
    assert torch.equal(
        plain.q_all(x.unsqueeze(0))[0], dqn.q_network.q_all(x.unsqueeze(0), [0])[0]
    )  # what the fold scored
    keep = dqn.noise_std[0, 0] > 0  # input noise reaches the clock only
    assert keep.sum() == len(CALENDAR_INDICES) and bool(keep[list(CALENDAR_INDICES)].all())


def test_inputs_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"^dqn.inputs: 'pca' must be 'raw' or 'ridge'$"):
        DQNConfig(inputs="pca")


@pytest.mark.parametrize("override", [{"sweep.population": 4}, {"dqn.seeds": 2}])
def test_the_shipped_experiment_trains_its_front_end_in_a_population(override):
    """--population K or --set seeds=S on the shipped default experiment keep its inputs: ridge
    (the DQN fits the fold's front end for every member: tests/test_learner.py)."""
    from fxray.rl import experiment as expmod

    assert expmod.load(expmod.default_experiment(), "cpu", override).config.inputs == "ridge"


def test_the_screened_front_end_is_the_front_end_on_the_screened_inputs(fold_data):
    """screen_t > 0: the front end fitted on the market inputs that pass the checked screen,
    which is the front end with those inputs as its regressors; a screen nothing passes, or
    whose rule does not earn on the slice's tail at the cost, leaves the prediction rows at 0
    and the clock rows as they are."""
    from fxray.eval import baselines

    m, data, fold = fold_data
    a, b = fold.train
    z = data.states(torch.arange(a, b - 1)).double()
    window = data.window(fold.train, "next_open")
    fresh = window.fresh
    market = torch.nonzero(frontend.clock_mask(data.n_inputs, data.device) == 0).flatten()
    terms = baselines.checked_screen(z, fresh, 4e-5, 2.0, market, carry=window.carry)
    kept = terms.linear_inputs()
    assert torch.equal(kept, baselines.screen_columns(z, fresh, 2.0, market, robust=True))  # the check passed
    assert not torch.equal(kept, baselines.screen_columns(z, fresh, 2.0, market))  # robust: not the ordinary t
    assert 0 < len(kept) < len(market), kept  # a screen that keeps some inputs, not all
    mask = torch.zeros(data.n_inputs, dtype=torch.bool)
    mask[kept] = True
    A, c = frontend.fit(data, fold, "next_open", screen_t=2.0, cost=4e-5)
    A_ref, c_ref = frontend.fit(data, fold, "next_open", regressors=mask)
    with pytest.raises(ValueError, match="regressors or screen_t > 0, not both"):
        frontend.fit(data, fold, "next_open", regressors=mask, screen_t=2.0, cost=4e-5)
    n = frontend.N_FRONT
    assert A.shape[0] == frontend.width(2.0) == n + frontend.SLOTS
    assert torch.equal(A[:n], A_ref) and torch.equal(c[:n], c_ref)
    assert bool((A[:3, ~mask] == 0).all()) and bool((A[:3, mask] != 0).any())
    # the slots pick the inputs of the product terms, as they are
    raw = terms.nonlinear_inputs()[: frontend.SLOTS]
    slots = torch.zeros(frontend.SLOTS, data.n_inputs)
    slots[torch.arange(len(raw)), raw] = 1.0
    assert torch.equal(A[n:], slots) and bool((c[n:] == 0).all())
    plain_A, plain_c = frontend.fit(data, fold, "next_open")
    # nothing passes; the same inputs pass, but at a cost no rule on them earns
    for A0, c0 in (
        frontend.fit(data, fold, "next_open", screen_t=100.0),
        frontend.fit(data, fold, "next_open", screen_t=2.0, cost=1.0),
    ):
        assert bool((A0[:3] == 0).all()) and bool((c0[:3] == 0).all()) and bool((A0[n:] == 0).all())
        assert torch.equal(A0[3:n], plain_A[3:]) and torch.equal(c0[3:n], plain_c[3:])


def test_screen_t_refusals_are_one_line():
    for bad in (-1, float("nan"), "3"):
        with pytest.raises(ConfigError, match=r"^dqn.screen_t: .* must be a number in \[0, 100\] \(0: no screen\)$"):
            DQNConfig(screen_t=bad)
