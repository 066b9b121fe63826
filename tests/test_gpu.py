"""CUDA-only checks: graphed == eager maths, CPU == GPU maths. Skipped without a GPU.

Run on the GPU machine: `python -m pytest -q tests/test_gpu.py`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.dqn import Learner, collect
from fxray.rl.env import TradingEnv
from fxray.rl.replay import Replay
from fxray.rl.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CFG = DQNConfig(
    hidden=64,
    num_envs=64,
    batch_size=256,
    buffer_steps=64,
    episode_len=50,
    steps_per_epoch=60,
    epochs=3,
    patience=3,
    matmul="fp32",
)  # exact maths to compare


def filled_replay(data, cfg, steps=40, seed=0):
    torch.manual_seed(seed)
    env = TradingEnv(data, cfg.num_envs, cfg.episode_len, cfg.cost)
    replay = Replay(cfg, cfg.num_envs, data.device)
    env.reset()
    learner = Learner(cfg, data.n_inputs, data.device)
    learner.reset(seed)
    for _ in range(steps):
        collect(env, learner.q_network, replay, torch.tensor(1.0, device=data.device))
    return replay


def test_fused_adam_is_torch_adam_on_cuda():
    from test_trainer import adam_against_torch  # tests/ is on sys.path under pytest

    ours, ref = adam_against_torch("cuda", fused=True, capturable=True)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_upload_through_pinned_staging_is_exact(synth_cache):
    """Chunked pinned upload (several chunks, a ragged last one) == the host arrays."""
    import fxray.rl.device as device_mod

    market = cache.open(synth_cache)
    x = torch.empty((market.n_bars, 50), device="cuda")
    device_mod._upload_rows(
        x, torch.from_numpy(market.features.copy()), torch.from_numpy(market.ofi.copy()), chunk_rows=7_001
    )
    host = np.concatenate([market.features, market.ofi], 1)
    assert np.array_equal(x.cpu().numpy(), host)
    data = DeviceData(market, "cuda")
    assert np.array_equal(data.x.cpu().numpy(), host)


def test_graphed_learn_equals_eager_on_the_same_batches(synth_cache):
    """Capture Learner.learn on static index tensors; replay it against the eager call."""
    cfg = dataclasses.replace(CFG, input_noise=0.0)  # noise: eager and replay draw apart (the fold test)
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    data.set_fold(make_folds(market.ts, FoldSpec())[0])
    replay = filled_replay(data, cfg)
    eager = Learner(cfg, data.n_inputs, "cuda")
    graphed = Learner(cfg, data.n_inputs, "cuda")
    eager.reset(0)
    graphed.reset(0)
    batches = [replay.sample_indices(CFG.batch_size) for _ in range(30)]
    static_step, static_env = (b.clone() for b in batches[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up creates Adam state; then reset it in place
        for _ in range(3):
            graphed.learn(data, replay, static_step, static_env)
    torch.cuda.current_stream().wait_stream(side)
    graphed.reset(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.learn(data, replay, static_step, static_env)
    eager.learn(data, replay, *batches[0])  # create eager Adam state the same way
    eager.reset(0)
    for step, env in batches:
        eager.reset_accumulators()
        graphed.reset_accumulators()
        eager.learn(data, replay, step, env)
        static_step.copy_(step)
        static_env.copy_(env)
        graph.replay()
        torch.testing.assert_close(graphed.loss_sum, eager.loss_sum, rtol=1e-5, atol=1e-6)
    for p, q in zip(graphed.params, eager.params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    for p, q in zip(graphed.target_params, eager.target_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("demo", [0.0, 1.0])
def test_graphed_fold_equals_eager_fold(synth_cache, demo):
    """The whole fold, graphs on vs off, same seed: same losses and metrics (RNG is graph-safe);
    with demonstrations too (dqn.demo: the fold's table is written in place before capture)."""
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    fold = make_folds(market.ts, FoldSpec())[0]
    on = Trainer(data, CFG.replace(graphs=True, demo=demo)).run_fold(fold, seed=5)
    off = Trainer(data, CFG.replace(graphs=False, demo=demo)).run_fold(fold, seed=5)
    assert on.epochs_run == off.epochs_run
    np.testing.assert_allclose([c["loss"] for c in on.curve], [c["loss"] for c in off.curve], rtol=2e-3)
    np.testing.assert_allclose(
        [c["val_sharpe"] for c in on.curve], [c["val_sharpe"] for c in off.curve], rtol=2e-2, atol=0.05
    )


def test_cpu_and_gpu_evaluate_the_same_weights_alike(synth_cache):
    """Same weights (drawn on the CPU from the seed) -> same greedy backtest on both devices."""
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FoldSpec())[1]
    results = {}
    for dev in ("cpu", "cuda"):
        trainer = Trainer(DeviceData(market, dev), CFG)
        trainer._begin(fold, seed=11)
        results[dev] = (trainer.evaluate(fold.val).metrics, trainer.q_all(fold.val).cpu())
    torch.testing.assert_close(results["cuda"][1], results["cpu"][1], rtol=1e-4, atol=1e-4)
    for k in ("sharpe", "total_return", "turnover"):
        assert getattr(results["cuda"][0], k) == pytest.approx(getattr(results["cpu"][0], k), rel=1e-3, abs=1e-6)


def test_cpu_and_gpu_learn_step_alike(synth_cache):
    torch.backends.cuda.matmul.allow_tf32 = False  # Learner alone: no trainer sets it
    cfg = dataclasses.replace(CFG, input_noise=0.0)  # the two devices' generators draw different noise
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FoldSpec())[0]
    learners, losses = {}, {}
    cpu_data = DeviceData(market, "cpu")
    cpu_data.set_fold(fold)
    replay_cpu = filled_replay(cpu_data, cfg)
    batches = [replay_cpu.sample_indices(cfg.batch_size) for _ in range(10)]
    for dev in ("cpu", "cuda"):
        data = DeviceData(market, dev)
        data.set_fold(fold)
        replay = Replay(cfg, cfg.num_envs, dev)
        for name in ("t", "position", "action", "reward", "done", "steps"):
            getattr(replay, name).copy_(getattr(replay_cpu, name))
        learner = Learner(cfg, data.n_inputs, dev)
        learner.reset(3)
        for step, env in batches:
            learner.learn(data, replay, step.to(dev), env.to(dev))
        learners[dev], losses[dev] = learner, float(learner.loss_sum)
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-3)
    for p, q in zip(learners["cuda"].params, learners["cpu"].params):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-3, atol=1e-4)


def test_gpu_fold_learns_like_cpu(strong_cache):
    """Different RNG streams, same problem: both devices find the planted signal."""
    market = cache.open(strong_cache)
    fold = make_folds(market.ts, FoldSpec(max_folds=1))[0]
    cfg = DQNConfig(cost=1e-5)
    gpu = Trainer(DeviceData(market, "cuda"), cfg).run_fold(fold, seed=0)
    cpu = Trainer(DeviceData(market, "cpu"), cfg).run_fold(fold, seed=0)
    assert gpu.test["sharpe"] > 0.5 * cpu.test["sharpe"] > 0


def test_no_host_sync_inside_an_epoch(synth_cache):
    market = cache.open(synth_cache)
    trainer = Trainer(DeviceData(market, "cuda"), CFG)
    trainer.run_fold(make_folds(market.ts, FoldSpec())[0], seed=0)  # captures the graph
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(CFG.steps_per_epoch):
            trainer.graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --- populations (fxray.rl.population) -------------------------------------------------------


POP = [CFG, CFG.replace(lr=1e-3, gamma=0.9, n_step=3, cost=1e-5, input_noise=0.0, tau=0.05, patience=1)]


def test_population_step_is_the_solo_step_to_float_rounding_on_cuda(synth_cache):
    """Member k's first learner steps on CUDA against DQN alone with the same seed: the same
    draws (each member's generator), and weights equal to float rounding (bmm vs mm, and the
    stacked Adam formula vs torch's fused kernel)."""
    from fxray.rl.dqn import DQN
    from fxray.rl.population import Population

    torch.backends.cuda.matmul.allow_tf32 = False
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    data.set_fold(make_folds(market.ts, FoldSpec())[0])
    pop = Population(data, POP)
    pop.begin([5, 6])
    for _ in range(3):
        pop.step()
    for k, (cfg, seed) in enumerate(zip(POP, [5, 6])):
        torch.manual_seed(seed)
        alone = DQN(data, cfg)
        alone.begin(seed)
        for _ in range(3):
            alone.step()
        assert torch.equal(pop.replay_t[k], alone.replay.t) and torch.equal(pop.t[k], alone.env.t)
        for p, q in zip(pop.params, alone.params):
            torch.testing.assert_close(p[k], q, rtol=1e-5, atol=1e-6)


def test_population_graphed_equals_eager_and_alone_on_cuda(synth_cache):
    from fxray.rl.population_trainer import PopulationTrainer

    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    fold = make_folds(market.ts, FoldSpec())[0]
    on = PopulationTrainer(data, [c.replace(graphs=True) for c in POP]).run_fold(fold, [5, 6])
    off = PopulationTrainer(data, [c.replace(graphs=False) for c in POP]).run_fold(fold, [5, 6])
    alone = [Trainer(data, c.replace(graphs=False)).run_fold(fold, seed=s) for c, s in zip(POP, [5, 6])]
    for a, b in [*zip(on, off), *zip(off, alone)]:
        assert a.epochs_run == b.epochs_run
        np.testing.assert_allclose([c["loss"] for c in a.curve], [c["loss"] for c in b.curve], rtol=2e-3)
        np.testing.assert_allclose(
            [c["val_sharpe"] for c in a.curve], [c["val_sharpe"] for c in b.curve], rtol=2e-2, atol=0.05
        )


def test_population_has_no_host_sync_inside_an_epoch(synth_cache):
    from fxray.rl.population_trainer import PopulationTrainer

    market = cache.open(synth_cache)
    trainer = PopulationTrainer(DeviceData(market, "cuda"), POP)
    trainer.run_fold(make_folds(market.ts, FoldSpec())[0], [0, 1])  # captures the graph
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(CFG.steps_per_epoch):
            trainer.graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_population_worker_on_cuda_trains_many_callers_through_its_device_thread(synth_cache):
    """What a population sweep does to a FoldWorker on an H200 (docs/benchmarks.md, 'A population
    sweep on the H200 failed'): many caller threads at once, two shapes, several folds, padded
    populations of every size, so graphs are captured, reused, re-captured and evicted while the
    callers wait. Every request ends "ok" (a member equals alone to float rounding: the tests above)."""
    import threading

    from fxray.sweep.gather import Gatherer

    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    folds = make_folds(market.ts, FoldSpec(train="10d", val="3d", test="3d", max_folds=3))
    base = CFG.replace(epochs=2, steps_per_epoch=20)
    cfgs = [base.replace(lr=1e-3 * (1 + i % 3), hidden=64 if i % 2 else 32, n_step=1 + i % 3) for i in range(12)]
    gatherer = Gatherer(data, k_max=8, wait_s=0.05)
    out, errors = {}, []

    def caller(i):
        try:
            for fold in folds:  # each caller walks its folds, as a trial does
                out[(i, fold.k)] = gatherer.train(cfgs[i].as_dict(), fold.as_dict(), i)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(cfgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[:3]
    assert len(out) == len(cfgs) * len(folds) and all(r["status"] == "ok" for r in out.values())
    assert max(gatherer.sizes) > 1  # populations formed
    assert all(np.isfinite(r["val"]["sharpe"]) and np.isfinite(r["test"]["sharpe"]) for r in out.values())
