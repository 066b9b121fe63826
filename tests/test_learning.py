"""The learner finds an edge that is there (issue 17), on the CPU: the default experiment's
CPU-profile config, as `fxray tune` / `fxray train` run it on a 2-core box, trained on every
fold of small planted markets, reaches a floor share of the oracle's pooled test Sharpe on
the same test windows (0.6, the mean of four markets). (What it reaches of the oracle on the
default markets, and against the ridge rule, is in docs/benchmarks.md.)

The markets: 60k bars of the default generator with a stronger signal than the default one's
(beta 0.09, 3 folds of 15d/3d/3d: 9 test days), so that an oracle's edge is measurable on so
few days (its pooled test Sharpe is ~20 +- 5 here); four draws of it (synth seeds 0-3), each
trained with its own learner seed (seed d on draw d), so that the floor is neither one
market's luck nor one seed's. Nor one machine's: the same code and the same pinned packages
train other weights on another CPU (float rounding of its kernels), and the shares move by a
seed's spread. The profile reads `inputs: ridge` (fxray.rl.frontend) and learns from the ridge
rule's demonstrations (`demo: 1.0`, fxray.rl.demo). On draw 0 seeds 0-5 reached 0.67 / 0.82 /
0.88 / 0.79 / 0.68 / 0.67 on the 2-core box of 2026-12-03 (without demonstrations 0.12 / 0.50 /
0.66 / 0.72 / 0.83 / 0.26); on draws 0-3 with seeds 0-3, 0.67 / 1.58 / 0.86 / 1.13 (mean 1.06)
on 2026-12-04, and seed 0 on draws 1-7 0.80-1.72: the floor is the issue's 0.5 and more, on the
mean of the four (>= 0.6), and every one must reach 0.4 (docs/benchmarks.md, "The learning floor
on another CPU", "Demonstrations", "Fresh draws").
"""

import dataclasses
import json

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.features import FEATURE_NAMES
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, to_cache
from fxray.eval import pooled
from fxray.rl import experiment as expmod
from fxray.rl.device import DeviceData
from fxray.rl.trainer import Trainer

FLOOR = 0.6  # on the mean share of the four markets
SEED_FLOOR = 0.4  # every market's
DRAWS = (0, 1, 2, 3)  # market draw d (its synth seed) trained with learner seed d
MARKET = SynthSpec(n_bars=60_000, seed=0, beta=0.09)  # draw 0 of the floor's markets (scripts/floor_seeds.py's)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The floor's markets: MARKET's generator at each of DRAWS."""
    markets = {}
    for d in DRAWS:
        path = tmp_path_factory.mktemp("floor") / f"floor{d}.fxcache"
        to_cache(dataclasses.replace(MARKET, seed=d), path)
        markets[d] = cache.open(path)
    return markets


def pooled_test(market, cfg, seed: int) -> dict:
    data = DeviceData(market)
    folds = make_folds(market.ts, FoldSpec(train="15d", val="3d", test="3d", max_folds=3))
    trainer = Trainer(data, cfg)
    policy, refs = [], {}
    for fold in folds:
        result = trainer.run_fold(fold, seed=seed + fold.k)  # as fxray train seeds fold k
        assert result.status == "ok"
        policy.append(result.test_periods)
        for name, d in result.baseline_periods.items():
            refs.setdefault(name, []).append(d["test"])
    ppy = data.calendar.periods_per_year
    out = {name: pooled.pooled(w, cfg.cost, ppy) for name, w in refs.items()}
    out["dqn"] = pooled.pooled(policy, cfg.cost, ppy)
    return out


@pytest.mark.slow
def test_the_cpu_profile_reaches_a_floor_share_of_the_oracle_on_small_planted_markets(planted, one_torch_thread):
    exp = expmod.load(expmod.default_experiment(), "cpu")
    cfg = exp.config  # the CPU profile: 128 envs, batch 512, 4 epochs x 200 steps, cost 0.4 bp, the learner's defaults
    assert (cfg.num_envs, cfg.batch_size, cfg.cost, cfg.inputs, cfg.demo) == (128, 512, 4e-5, "ridge", 1.0)
    shares = []  # one torch thread (the fixture), as the sweep's CPU workers train
    for d in DRAWS:
        stats = pooled_test(planted[d], cfg, seed=d)
        oracle = stats["oracle"]
        assert oracle["sharpe"] > 2 * oracle["sharpe_se"], oracle  # an edge that is there, and measurable
        shares.append(pooled.oracle_share(stats["dqn"], oracle))
    assert None not in shares, shares
    print(f"shares of the oracle, draws (and seeds) {DRAWS}: {shares}")
    assert sum(shares) / len(shares) >= FLOOR and min(shares) >= SEED_FLOOR, shares


def test_the_learner_grid_counts_the_trading_in_the_edge_hours(tmp_path, capsys, monkeypatch):
    """scripts/learner_grid.py: a tiny session-market job on the CPU, and its in_edge_hours
    against a count by hand."""
    import runpy

    monkeypatch.setenv("FXRAY_CACHE_DIR", str(tmp_path / "cache"))  # the grid's market, not the user's cache
    grid = runpy.run_path("scripts/learner_grid.py")
    hour = 3600 * 10**9
    day0 = 20_000 * 24  # period numbers of one UTC day's hours 0..23
    windows = [
        {"units": [1.0, 2.0, 0.0], "hours": [day0 + 11, day0 + 12, day0 + 15], "net": [0, 0, 0]},
        {"units": [3.0, 4.0], "hours": [day0 + 24 + 16, day0 + 24 + 13], "net": [0, 0]},
    ]
    assert grid["in_hours"](windows, (12, 16), hour) == pytest.approx((2 + 0 + 4) / 10)
    assert grid["in_hours"](windows, None, hour) is None
    assert grid["in_hours"]([{"units": [0.0], "hours": [day0 + 12], "net": [0]}], (12, 16), hour) is None
    job = json.loads(open("scripts/grids/cpu_tiny.json").read())[0]
    job["market"] = {"n_bars": 30000, "beta": 0.3, "structure": "session"}
    (tmp_path / "grid.json").write_text(json.dumps([job]))
    assert grid["main"]([str(tmp_path / "grid.json"), "--device", "cpu", "--json", str(tmp_path / "out.json")]) == 0
    (r,) = json.loads((tmp_path / "out.json").read_text())
    assert r["edge_hours"] == [12, 16]
    assert r["oracle_in_edge_hours"] > 0.8  # the oracle trades in its hours, and exits after them
    assert 0 <= r["seeds"]["0"]["in_edge_hours"] <= 1
    assert "traded in 12-16 UTC:" in capsys.readouterr().out
    assert r["seeds"]["0"]["oracle_share_se"] is None or r["seeds"]["0"]["oracle_share_se"] >= 0
    # the numbers so far after every fold (what a run stopped at a time limit keeps)
    seen = []
    two = {**job, "folds": {**job["folds"], "max_folds": 2}}
    last = grid["run_job"](two, "cpu", on_fold=seen.append)
    assert [x["folds_done"] for x in seen] == [1, 2] and last["folds"] == 2
    assert [x["seeds"]["0"]["folds_done"] for x in seen] == [1, 2]
    assert seen[-1]["seeds"] == last["seeds"] and seen[-1]["oracle"] == last["oracle"]
    # the edge-input probe: dow_sin becomes the 0/1 indicator of 12-16 UTC, the rest as it was
    import datetime

    from fxray.data import cache as cachemod
    from fxray.data.arrays import host_arrays
    from fxray.data.features import FEATURE_NAMES
    from fxray.data.synth import SynthSpec, default_path

    m = cachemod.open(default_path(SynthSpec(**job["market"])))
    probed = grid["with_edge_input"](m)
    utc = datetime.UTC
    utc_hour = np.array([datetime.datetime.fromtimestamp((int(t) - 1) // 10**9, utc).hour for t in m.ts[:2000]])
    col = list(FEATURE_NAMES).index("dow_sin")
    expected = ((utc_hour >= 12) & (utc_hour < 16)).astype(np.float32)
    assert 0 < expected.sum() < len(expected)  # the first 2000 bars hold hours in and out of 12-16
    assert np.array_equal(probed["features"][:2000, col], expected)
    others = [i for i in range(m.features.shape[1]) if i != col]
    assert np.array_equal(probed["features"][:, others], np.asarray(m.features)[:, others])
    # the hour-inputs probe: 24 one-hot UTC hours after the 8 order-flow inputs
    hours = grid["with_hour_inputs"](probed)["ofi"]
    assert hours.shape == (len(m.ts), 8 + 24)
    assert np.array_equal(hours[:2000, 8:].argmax(1), utc_hour) and np.all(hours[:, 8:].sum(1) == 1)
    assert np.array_equal(hours[:, :8], np.asarray(m.ofi))
    sessions = grid["with_session_inputs"](host_arrays(m))["ofi"][:2000, 8:]  # Tokyo, London, New York
    for k, (a, b) in enumerate([(0, 9), (7, 16), (12, 21)]):
        assert np.array_equal(sessions[:, k], ((utc_hour >= a) & (utc_hour < b)).astype(np.float32))


def test_the_learner_grid_scores_every_epoch_on_test_without_changing_what_it_keeps(tmp_path, monkeypatch):
    """scripts/learner_grid.py's "epoch_tests": each epoch's weights scored on the fold's test
    window, a diagnostic only: the job's kept weights and numbers are those of the same job
    without it, and the kept epoch's row is the kept policy's test; the epoch chosen for every
    fold on the pooled val windows is, with one fold, the fold's own choice."""
    import runpy

    monkeypatch.setenv("FXRAY_CACHE_DIR", str(tmp_path / "cache"))
    grid = runpy.run_path("scripts/learner_grid.py")
    job = json.loads(open("scripts/grids/cpu_tiny.json").read())[0]
    job["cfg"] = {**job["cfg"], "epochs": 3, "patience": 3, "inputs": "ridge"}
    job["seeds"] = [0, 1]
    plain = grid["run_job"](job, "cpu")
    watched = grid["run_job"]({**job, "epoch_tests": True}, "cpu")
    assert watched["best_epochs"] == plain["best_epochs"]
    for s, v in watched["seeds"].items():
        assert len(v["epochs"]) == 3  # one row per epoch (one fold, patience 3: every epoch ran)
        kept = v["epochs"][watched["best_epochs"][int(s)]]
        assert kept["sharpe"] == pytest.approx(v["sharpe"]) and kept["n_trades"] == v["n_trades"]
        assert {k: v[k] for k in ("sharpe", "n_trades")} == {k: plain["seeds"][s][k] for k in ("sharpe", "n_trades")}
        # one fold: the epoch its pooled val chooses for "every" fold is the one the fold kept
        common = v["common_epoch"]
        assert common["epoch"] == watched["best_epochs"][int(s)] and common["sharpe"] == pytest.approx(v["sharpe"])
    assert "by epoch, mean share" in grid["line"](watched) and "by epoch" not in grid["line"](plain)


def test_the_learner_grid_scores_snapshot_ensembles_of_the_epochs_without_changing_what_it_keeps(tmp_path, monkeypatch):
    """scripts/learner_grid.py's "snapshots": every epoch's Q of every member kept, and policies
    made of them scored on test, a diagnostic only: the job's own numbers are those of the same
    job without it; its epoch rows are the fold's own policy where that policy is one epoch's
    (one seed: the kept epoch; a seed ensemble with `select: last`: the last); and the means
    over epochs and members are the plain means (snapshot_policies on hand-made Q)."""
    import runpy

    monkeypatch.setenv("FXRAY_CACHE_DIR", str(tmp_path / "cache"))
    grid = runpy.run_path("scripts/learner_grid.py")
    job = json.loads(open("scripts/grids/cpu_tiny.json").read())[0]
    job["cfg"] = {**job["cfg"], "epochs": 3, "patience": 3}
    ensembles = ({"seeds": 3, "select": "last"}, {"seeds": 3}, {"seeds": 3, "select_from": 1})
    cases = [({}, [0, 1])] + [(cfg, [0]) for cfg in ensembles]
    for cfg, seeds in cases:
        one = {**job, "cfg": {**job["cfg"], **cfg}, "seeds": seeds}
        plain = grid["run_job"](one, "cpu")
        watched = grid["run_job"]({**one, "snapshots": True}, "cpu")
        assert watched["best_epochs"] == plain["best_epochs"]
        for s, v in watched["seeds"].items():
            assert {k: v[k] for k in ("sharpe", "n_trades")} == {
                k: plain["seeds"][s][k] for k in ("sharpe", "n_trades")
            }
            snaps = v["snapshots"]
            assert set(snaps) == {"e0", "e1", "e2", "last", "snap_all", "snap_late", "val_all", "val_late"}
            if cfg.get("select") == "last":
                own = ["last"]
            elif cfg.get("select_from"):  # the trainer's select_from 1 is the probe's val_late
                own = ["val_late"]
            else:  # the members' own val choices, re-made; one seed's is one epoch
                own = ["val_all"] + ([] if cfg else [f"e{watched['best_epochs'][int(s)]}"])
            for name in own:
                assert snaps[name]["sharpe"] == pytest.approx(v["sharpe"]), name
                assert snaps[name]["n_trades"] == v["n_trades"], name
            assert snaps["last"] == snaps["e2"]
        assert "snapshots, mean share" in grid["line"](watched) and "snapshots" not in grid["line"](plain)

    # the means, by hand: member 1 diverged at epoch 1, so only members 0 and 2 count anywhere
    g = torch.Generator().manual_seed(0)
    q = [torch.randn(3, 4, 3, 3, generator=g) for _ in range(3)]  # per epoch: (members 0-2, T 4, 3, 3)
    epochs = [
        {"members": [0, 1, 2], "val": None, "test": q[0]},
        {"members": [0, 2], "val": None, "test": q[1][[0, 2]]},
        {"members": [0, 2], "val": None, "test": q[2][[0, 2]]},
    ]
    out = grid["snapshot_policies"](epochs)
    by_epoch = [(q[e][0] + q[e][2]) / 2 for e in range(3)]
    for e in range(3):
        torch.testing.assert_close(out[f"e{e}"], by_epoch[e])
    torch.testing.assert_close(out["last"], by_epoch[2])
    torch.testing.assert_close(out["snap_all"], (by_epoch[0] + by_epoch[1] + by_epoch[2]) / 3)
    torch.testing.assert_close(out["snap_late"], (by_epoch[1] + by_epoch[2]) / 2)
    assert grid["snapshot_policies"]([]) == {}


def test_the_learner_probes_compute_what_they_say(synth_cache, tmp_path, monkeypatch):
    """scripts/learner_probes.py: the gated network is the plain one while its gate is at 0
    and projects nothing when it is shut; the LayerNorm network against F.layer_norm by hand;
    both_losses is the sum of the two losses on one batch; rollout_lagged's table gives the
    online network's greedy moves; cost_known is the plain Q less
    the move's cost; cost_split's positions differ by p G(x) only; warm starts a fold from
    the last fold's kept weights; a tiny grid runs with each."""
    import runpy

    import torch.nn.functional as F

    import fxray.rl.dqn as dqn

    probes = runpy.run_path("scripts/learner_probes.py")
    torch.manual_seed(0)
    market, position = torch.randn(40, 50), torch.randint(-1, 2, (40,))
    torch.manual_seed(1)
    plain = dqn.QNetwork(50, 16, 2, True)
    torch.manual_seed(1)
    gated = probes["GatedQNetwork"](50, 16, 2, True)
    assert torch.equal(gated(market, position), plain(market, position))
    assert torch.equal(gated.q_all(market), plain.q_all(market))
    with torch.no_grad():
        gated.gate.bias.fill_(-200.0)  # shut: Q from the position alone
    shut = plain._q(
        torch.zeros(40, 16) + (position.unsqueeze(1) == torch.tensor([-1, 0, 1])).float() @ plain.position_embed
    )
    assert torch.allclose(gated(market, position), shut)
    with torch.no_grad():
        gated.gate.bias.zero_()
        gated.gate.weight.normal_()
    assert not torch.allclose(gated(market, position), plain(market, position))
    torch.manual_seed(2)
    ln = probes["LayerNormQNetwork"](50, 16, 3, True)
    with torch.no_grad():
        for norm in ln.norms:
            norm.weight.normal_()
            norm.bias.normal_()
    one_hot = (position.unsqueeze(1) == torch.tensor([-1, 0, 1])).float()
    h = market @ ln.market_in.weight.T + ln.market_in.bias + one_hot @ ln.position_embed
    linears = [ln.body[0], ln.body[2]]
    for k, norm in enumerate(ln.norms):
        h = torch.relu(F.layer_norm(h, (16,), norm.weight, norm.bias))
        if k < len(linears):
            h = h @ linears[k].weight.T + linears[k].bias
    out = h @ ln.head.weight.T + ln.head.bias
    expected = out[:, :1] + out[:, 1:] - out[:, 1:].mean(1, keepdim=True)
    assert torch.allclose(ln(market, position), expected, atol=1e-5)
    # both_losses on a batch of a fold's replay
    from fxray.rl.config import DQNConfig

    m = cache.open(synth_cache)
    data, fold = DeviceData(m), make_folds(m.ts, FoldSpec("20d", "5d", "5d"))[0]
    cfg = DQNConfig(hidden=32, num_envs=16, batch_size=64, buffer_steps=32, episode_len=20, steps_per_epoch=5, epochs=1)
    trainer = Trainer(data, cfg)
    trainer.run_fold(fold, seed=0)
    learner, replay = trainer.algo.learner, trainer.algo.replay
    step, env = replay.sample_indices(64)
    noise = torch.randn(128, data.n_inputs)
    total, q_max = probes["both_losses"](learner, data, replay, step, env, noise)
    a, qa = learner.td_loss(data, replay, step, env, noise)
    b, qb = learner.all_actions_loss(data, replay, step, env, noise)
    assert torch.equal(total, a + b) and torch.equal(q_max, torch.maximum(qa, qb)) and not torch.equal(a, b)
    # hold_max: each action against the larger of its 1-step and hold-n targets
    row = step % replay.S
    t, position = replay.t[row, env], replay.position[row, env]
    one = learner.hold_targets(data, t, position, 1, torch.float32)
    held = learner.hold_targets(data, t, position, learner.cfg.n_step, torch.float32)
    assert (held > one).any() and (held < one).any()
    got = probes["max_targets"](learner, data, t, position, learner.cfg.n_step, torch.float32)
    assert torch.equal(got, torch.maximum(one, held))
    # rollout_lagged: its table, freshly built, gives the online network's greedy moves
    held = torch.randint(-1, 2, (t.shape[0], 3), generator=torch.Generator().manual_seed(6)).float()
    lagged = probes["lagged_greedy_moves"](learner, data, t, held)
    assert torch.equal(lagged, learner.greedy_moves(data, t, held)) and lagged.unique().numel() > 1
    # cost_known: the plain network's Q less the move's known cost, for any position
    cost, position = 0.25, torch.randint(-1, 2, (40,), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(3)
    known = probes["CostKnownQNetwork"](50, 16, 2, True)
    known.cost_scaled = cost
    torch.manual_seed(3)
    plain = dqn.QNetwork(50, 16, 2, True)
    moves = (torch.tensor([-1, 0, 1]) - position.unsqueeze(1)).abs().float()  # (40, 3): |a - 1 - p|
    assert torch.allclose(known(market, position), plain(market, position) - cost * moves)
    grid_p = torch.tensor([-1, 0, 1])
    all_moves = (grid_p.view(1, 3) - grid_p.view(3, 1)).abs().float()  # (3 p, 3 a)
    assert torch.allclose(known.q_all(market), plain.q_all(market) - cost * all_moves)
    # cost_split: Q(x, p, .) - Q(x, p', .) is (p - p') G(x) plus the cost difference, and
    # q_all holds forward's values for each position
    torch.manual_seed(4)
    split = probes["CostSplitQNetwork"](50, 16, 2, True)
    split.cost_scaled = cost
    with torch.no_grad():
        split.carry_head.weight.normal_()
    q = split.q_all(market)  # (40, 3 p, 3 a)
    for k, p in enumerate((-1, 0, 1)):
        assert torch.allclose(q[:, k], split(market, torch.full((40,), p)), atol=1e-6)
    g = split.carry_head(split.body(torch.relu(split.market_in(market))))  # (40, 1)
    assert torch.allclose(
        (q[:, 2] + cost * all_moves[2]) - (q[:, 0] + cost * all_moves[0]), 2 * g.expand(40, 3), atol=1e-5
    )
    # vol_reward: with every bar's weight 1 it is the sampled loss; with weights it is not
    data._vol_weight, data._vol_fold = torch.ones(data.n_bars), data.fold
    plain_sampled = dqn.Learner.td_loss(learner, data, replay, step, env, noise)
    weighted = probes["vol_reward_loss"](learner, data, replay, step, env, noise)
    assert torch.allclose(weighted[0], plain_sampled[0]) and torch.equal(weighted[1], plain_sampled[1])
    del data._vol_fold
    weight = probes["vol_weight"](data)
    rv = data.x[:, list(FEATURE_NAMES).index("rv_60")]
    a, b = data.fold.train
    med = rv[a:b].median()
    assert torch.allclose(weight, med / rv.clamp_min(0.25 * med)) and weight.std() > 0
    assert not torch.allclose(probes["vol_reward_loss"](learner, data, replay, step, env, noise)[0], plain_sampled[0])
    # each variant through the grid (every swap undone after the test)
    monkeypatch.setenv("FXRAY_CACHE_DIR", str(tmp_path / "cache"))
    plain_network, plain_loss, plain_targets = dqn.QNetwork, dqn.Learner.td_loss, dqn.Learner.hold_targets
    plain_init, plain_run, plain_begin = dqn.Learner.__init__, Trainer.run_fold, Trainer._begin
    plain_moves = dqn.Learner.greedy_moves
    plain_dqn = (dqn.DQN.__init__, dqn.DQN.begin, dqn.DQN.q_all)
    monkeypatch.setattr(dqn, "QNetwork", plain_network)
    for name in ("__init__", "begin", "q_all"):
        monkeypatch.setattr(dqn.DQN, name, getattr(dqn.DQN, name))
    for owner, name in (
        (dqn.Learner, "td_loss"),
        (dqn.Learner, "hold_targets"),
        (dqn.Learner, "__init__"),
        (dqn.Learner, "greedy_moves"),
    ):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(Trainer, "run_fold", plain_run)
    monkeypatch.setattr(Trainer, "_begin", plain_begin)
    job = json.loads(open("scripts/grids/cpu_tiny.json").read())[0]
    job["market"] = {"n_bars": 30000, "beta": 0.3}
    (tmp_path / "grid.json").write_text(json.dumps([job]))
    for variant in probes["VARIANTS"]:
        dqn.QNetwork, dqn.Learner.td_loss = plain_network, plain_loss  # one variant at a time
        dqn.Learner.hold_targets, dqn.Learner.__init__ = plain_targets, plain_init
        Trainer.run_fold, Trainer._begin, dqn.Learner.greedy_moves = plain_run, plain_begin, plain_moves
        dqn.DQN.__init__, dqn.DQN.begin, dqn.DQN.q_all = plain_dqn
        out = tmp_path / f"{variant}.json"
        assert probes["main"]([variant, str(tmp_path / "grid.json"), "--device", "cpu", "--json", str(out)]) == 0
        assert json.loads(out.read_text())[0]["seeds"]["0"]["n_trades"] >= 0
        if variant == "rollout_lagged":
            assert dqn.Learner.td_loss is dqn.Learner.rollout_loss
            assert dqn.Learner.greedy_moves is probes["lagged_greedy_moves"]
        if variant == "avg_weights":  # the policy is the average; it starts as the online weights and follows
            algo = dqn.DQN(data, cfg)
            algo.begin(0)
            avg, online = algo._avg_pairs
            assert all(torch.equal(x, y) for x, y in zip(avg, online)) and algo.params is avg
            before = [x.clone() for x in avg]
            algo.learner.learn(data, algo.replay)
            tau = probes["AVG_TAU"]
            assert all(torch.allclose(x, b + tau * (y - b)) for x, y, b in zip(avg, online, before))
            x = data.states(torch.arange(100))
            assert torch.equal(algo.q_all(x), algo.avg_network.q_all(x))
        if variant == "hold_max":
            assert dqn.Learner.td_loss is dqn.Learner.hold_loss and dqn.Learner.hold_targets is probes["max_targets"]
        if variant in ("cost_known", "cost_split"):  # the grid's networks carried the config's cost
            net = Trainer(data, cfg).algo.learner.q_network
            assert isinstance(net, probes["CostKnownQNetwork"]) and net.cost_scaled == cfg.cost * cfg.reward_scale > 0
    # warm: the second fold starts from the first fold's kept weights (the swap from the loop's last variant)
    assert probes["VARIANTS"][-1] == "warm"
    dqn.QNetwork, dqn.Learner.__init__ = plain_network, plain_init
    warm = Trainer(data, cfg)
    folds = make_folds(m.ts, FoldSpec("20d", "5d", "5d"))
    warm.run_fold(folds[0], seed=0)
    kept = [p.detach().clone() for p in warm.algo.params]
    warm._begin(folds[1], seed=1)
    assert all(torch.equal(p, k) for p, k in zip(warm.algo.params, kept))
    assert all(torch.equal(p, k) for p, k in zip(warm.algo.learner.target_params, kept))
    Trainer.run_fold, Trainer._begin = plain_run, plain_begin
    cold = Trainer(data, cfg)
    cold.run_fold(folds[0], seed=0)
    cold._begin(folds[1], seed=1)
    assert not all(torch.equal(p, k) for p, k in zip(cold.algo.params, kept))
    with pytest.raises(SystemExit, match="no variant; known: gate, layernorm, both_losses, hold_max"):
        probes["main"](["dropout", str(tmp_path / "grid.json")])


def test_the_shuffled_twin_keeps_each_bars_size_and_no_days_drift():
    """The twin's returns are the planted market's mirrored around their mean by coins: the
    same sizes bar by bar, and the day's order flow no longer tells the day's drift. A
    permutation within each day (the twin of generator v2), computed here from the planted
    returns, keeps that drift: the day-level correlation this test bounds."""
    from fxray.data.synth import simulate

    spec = SynthSpec(n_bars=150_000, beta=0.045)
    plain, twin = simulate(spec), simulate(SynthSpec(**{**spec.__dict__, "shuffle": True}))
    r, r_twin = np.diff(np.log(plain.close)), np.diff(np.log(twin.close))
    mu = np.log(plain.close[-1] / spec.price0) / spec.n_bars  # the mean of all n returns, the first from price0
    assert np.allclose(np.abs(r_twin - mu), np.abs(r - mu), atol=1e-12)
    assert 0.3 < np.mean(np.sign(r_twin - mu) != np.sign(r - mu)) < 0.7  # coins, not a copy
    day = ((plain.ts - plain.ts[0]) // (86400 * 10**9))[1:]
    flow = plain.ofi[:-1, 0].astype(float)  # the view known at the close before each return

    def day_corr(ret):
        days = np.unique(day)
        return np.corrcoef([flow[day == d].mean() for d in days], [ret[day == d].mean() for d in days])[0, 1]

    permuted = r[np.lexsort((np.random.default_rng(0).random(len(r)), day))]
    assert day_corr(permuted) > 0.3  # the v2 twin: its days' drift told by their order flow
    assert abs(day_corr(r_twin)) < 0.2


def test_floor_seeds_refuses_bad_input_in_one_line(capsys):
    """scripts/floor_seeds.py (the floor's measurement for other seeds and configs): a bad
    argument is one line on stderr and exit 2, before any market is built."""
    import runpy

    script = runpy.run_path("scripts/floor_seeds.py")
    cases = [
        (["{bad", "0"], "Expecting property name"),
        (["[1]", "0"], "must be a JSON object"),
        (['{"no_such_field": 1}', "0"], "no_such_field"),
        (["{}", "zero"], "invalid literal for int()"),
    ]
    for args, needle in cases:
        assert script["main"](args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("floor_seeds.py: error: "), lines
    assert script["main"]([]) == 2 and "floor_seeds.py" in capsys.readouterr().err


def test_across_draws_averages_each_config_over_its_market_draws_and_pairs_them(tmp_path, capsys):
    """scripts/across_draws.py: jobs grouped by config and market (not by the market's seed),
    the share of a draw the mean over its seeds, the group's the mean over draws with the
    draws' standard error, the differences paired by draw (and by seed with the first config
    of the market); results from two calls add up; a bad call is one line and exit 2."""
    import runpy
    import statistics

    script = runpy.run_path("scripts/across_draws.py")
    cfg_a, cfg_b, mk = {"epochs": 3}, {"epochs": 3, "demo": 1.0}, {"n_bars": 1000}

    def job(tag, cfg, draw, seeds):
        return {"tag": tag, "cfg": cfg, "market": {**mk, "seed": draw}, "seeds": seeds}

    def result(tag, oracle, ridge, shares):
        return {
            "tag": tag,
            "oracle": oracle,
            "ridge": ridge,
            "seeds": {str(s): {"oracle_share": v} for s, v in shares.items()},
        }

    grid1 = [job("a, draw 1", cfg_a, 1, [0, 1]), job("b, draw 1", cfg_b, 1, [0, 1]), job("twin", cfg_a, 9, [0])]
    res1 = [
        result("a, draw 1", 4.0, 2.0, {0: 0.2, 1: 0.6}),
        result("b, draw 1", 4.0, 2.0, {0: 0.5, 1: 0.7}),
        result("twin", None, 1.0, {0: None}),  # no oracle: left out
    ]
    grid2 = [job("a, draw 2", cfg_a, 2, [0]), job("b, draw 2", cfg_b, 2, [0, 1])]
    res2 = [result("a, draw 2", 5.0, 4.0, {0: 1.0}), result("b, draw 2", 5.0, 4.0, {0: 0.8, 1: 0.0})]
    files = []
    for i, obj in enumerate((grid1, res1, grid2, res2)):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(obj))
    out = tmp_path / "table.json"
    assert script["main"]([str(f) for f in files] + ["--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["label"] for r in rows] == ["a", "b"]
    a, b = rows
    # a: draw 1 mean(0.2, 0.6) = 0.4, draw 2 1.0; ridge shares 0.5 and 0.8
    assert a["share_mean"] == pytest.approx(0.7) and a["share_se"] == pytest.approx(
        statistics.stdev([0.4, 1.0]) / 2**0.5
    )
    assert a["ridge_share_mean"] == pytest.approx(0.65)
    assert a["vs_ridge"]["mean"] == pytest.approx(((0.4 - 0.5) + (1.0 - 0.8)) / 2)
    assert "vs_first" not in a
    # b against a, paired by draw over the seeds both ran:
    # draw 1 ((0.5-0.2)+(0.7-0.6))/2 = 0.2; draw 2 seed 0 only: -0.2
    assert b["share_mean"] == pytest.approx((0.6 + 0.4) / 2)
    assert b["vs_first"]["mean"] == pytest.approx(0.0) and b["vs_first"]["draws"] == 2
    assert b["vs_first"]["se"] == pytest.approx(statistics.stdev([0.2, -0.2]) / 2**0.5)
    assert "over draws: policy +0.70 ± 0.30" in capsys.readouterr().out
    for args, needle in (
        ([str(files[0])], "pairs"),
        ([str(files[1]), str(files[0])], "no job"),
        ([str(tmp_path / "x"), str(files[1])], "No such file"),
    ):
        assert script["main"](args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("across_draws.py: error: "), lines


def test_discoverable_summarises_rules_over_draws_against_the_ridge_rule(capsys):
    """scripts/discoverable.py --draws: each rule's pooled test Sharpe less the ridge rule's,
    mean and standard error over the draws, and on how many draws it is above; a rule flat on
    every fold of a draw (Sharpe None) leaves that draw out; a bad range is refused."""
    import runpy
    import statistics

    script = runpy.run_path("scripts/discoverable.py")

    def run(ridge, screen, arc):
        return {"rules": {"ridge": {"sharpe": ridge}, "t>3.0": {"sharpe": screen}, "all, arc": {"sharpe": arc}}}

    runs = [run(1.0, 3.0, None), run(2.0, 1.5, 0.5), run(-1.0, 2.0, 1.0)]
    text = script["over_draws"]("m", runs)
    diffs = [2.0, -0.5, 3.0]
    se = statistics.stdev(diffs) / 3**0.5
    assert (
        f"t>3.0              {statistics.mean(diffs):+6.2f} ± {se:.2f}  (above the ridge rule on 2 of 3 draws)" in text
    )
    assert "all, arc" in text and "on 1 of 2 draws" in text  # the draw where it was flat is left out
    assert "  ridge " not in text
    assert script["draw_range"]("3-5") == [3, 4, 5] and script["draw_range"]("2") == [2]
    with pytest.raises(SystemExit):
        script["main"](["--draws", "5-3"])
    assert "the range ends before it starts" in capsys.readouterr().err
