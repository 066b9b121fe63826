"""CUDA-only checks: graphed == eager maths, CPU == GPU maths. Skipped without a GPU.

Run on the GPU machine: `python -m pytest -q tests/test_gpu.py`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import one_batch

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.dqn import DQN
from fxray.rl.optim import Adam
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
POP = [CFG, CFG.replace(lr=1e-3, gamma=0.9, n_step=3, input_noise=0.0, tau=0.05, patience=1)]


def alone(data, cfg, fold, seed):
    return Trainer(data, [cfg]).run_fold(fold, [seed])[0]


def test_stacked_adam_on_cuda_is_torch_adamw_per_member():
    """The stacked formula CUDA runs (one lr and weight decay per member, one masked) against
    torch.optim.AdamW on each member's slices, on the GPU: equal to float rounding."""
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 7, 5, generator=gen), torch.randn(3, 5, generator=gen)]
    grads = [[torch.randn(p.shape, generator=gen) for p in start] for _ in range(6)]
    lrs, wds = [1e-3, 3e-3, 5e-4], [0.0, 1e-2, 0.0]
    params, active = [p.clone().cuda() for p in start], torch.ones(3, dtype=torch.bool, device="cuda")
    opt = Adam(params, lrs, wds, active)
    assert opt.stacked
    for i, g in enumerate(grads):
        if i == 3:
            active[2] = False
        for p, gi in zip(params, g):
            p.grad = gi.cuda()
        opt.step()
    for k in range(3):
        ref = [p[k].clone().cuda().requires_grad_() for p in start]
        ref_opt = torch.optim.AdamW(ref, lr=lrs[k], weight_decay=wds[k])
        for g in grads[: 6 if k < 2 else 3]:
            for p, gi in zip(ref, g):
                p.grad = gi[k].cuda()
            ref_opt.step()
        for a, b in zip(params, ref):
            torch.testing.assert_close(a[k], b.detach(), rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("demo", [0.0, 1.0])
def test_graphed_fold_equals_eager_fold(synth_cache, demo):
    """The whole fold, graphs on vs off, same seed: same losses and metrics (RNG is graph-safe);
    with demonstrations too (dqn.demo: the fold's table is written in place before capture)."""
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    fold = make_folds(market.ts, FoldSpec())[0]
    on = alone(data, CFG.replace(graphs=True, demo=demo), fold, 5)
    off = alone(data, CFG.replace(graphs=False, demo=demo), fold, 5)
    assert on.epochs_run == off.epochs_run
    np.testing.assert_allclose([c["loss"] for c in on.curve], [c["loss"] for c in off.curve], rtol=2e-3)
    np.testing.assert_allclose(
        [c["val_sharpe"] for c in on.curve], [c["val_sharpe"] for c in off.curve], rtol=2e-2, atol=0.05
    )


@pytest.mark.parametrize("inputs", ["raw", "ridge"])
def test_cpu_and_gpu_evaluate_the_same_weights_alike(synth_cache, inputs):
    """Same weights (drawn on the CPU from the seed) -> the same Q on both devices; with the front
    end, CUDA's fold of every slot in one product gives any subset of members, and the checkpoints'
    host copy, the numbers it gives all of them."""
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FoldSpec())[1]
    q = {}
    for dev in ("cpu", "cuda"):
        data = DeviceData(market, dev)
        data.set_fold(fold)
        dqn = DQN(data, [CFG.replace(inputs=inputs)] * 3)
        dqn.begin([11, 12, 13])
        market = data.states(torch.arange(*fold.val, device=data.device))
        q[dev] = dqn.q_network.q_all(market.expand(dqn.K, -1, -1)).cpu()
    net = dqn.q_network
    for sub, every, host in zip(net.plain([2, 0]), net.plain(), zip(*[s.values() for s in net.host_states([2, 0])])):
        assert torch.equal(sub, every[[2, 0]]) and torch.equal(torch.stack(host), sub.cpu())
    torch.testing.assert_close(q["cuda"], q["cpu"], rtol=1e-4, atol=1e-4)


def test_cpu_and_gpu_td_loss_and_gradients_alike(synth_cache):
    """The same replay rows and the same batch on both devices: the same loss, |Q| max and gradients
    (to float rounding: bmm / split-K on CUDA, per-member mm on the CPU)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FoldSpec())[0]
    dqns = {}
    for dev in ("cpu", "cuda"):
        data = DeviceData(market, dev)
        data.set_fold(fold)
        dqns[dev] = DQN(data, POP)
        dqns[dev].begin([3, 4])
    out = one_batch(dqns, "cpu")
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["cuda"][1], out["cpu"][1], rtol=1e-4, atol=1e-5)
    for a, b in zip(out["cuda"][2], out["cpu"][2]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_tf32_keeps_a_steps_loss_and_gradients_within_tolerance_of_fp32(synth_cache):
    """Mixed precision on CUDA (dqn.matmul tf32, the default: tensor-core matmuls on inputs rounded
    to 10 bits of mantissa) against fp32 on the same weights, replay rows and batch: the TD loss
    and |Q| max within 1 %, each weight's gradient within 2 % of its norm."""
    market = cache.open(synth_cache)
    fold = make_folds(market.ts, FoldSpec())[0]
    dqns = {}
    for matmul in ("fp32", "tf32"):
        data = DeviceData(market, "cuda")
        data.set_fold(fold)
        dqns[matmul] = DQN(data, [c.replace(matmul=matmul) for c in POP])
        dqns[matmul].begin([3, 4])

    def precision(matmul):  # process-wide in torch: Trainer.run_fold sets it so for each fold
        torch.backends.cuda.matmul.allow_tf32 = matmul == "tf32"

    try:
        out = one_batch(dqns, "fp32", precision)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    assert not torch.equal(out["tf32"][0], out["fp32"][0])  # the precision did change the numbers
    torch.testing.assert_close(out["tf32"][0], out["fp32"][0], rtol=1e-2, atol=0)
    torch.testing.assert_close(out["tf32"][1], out["fp32"][1], rtol=1e-2, atol=0)
    for a, b in zip(out["tf32"][2], out["fp32"][2]):
        assert float((a - b).norm() / b.norm()) < 2e-2


def test_gpu_fold_learns_like_cpu(strong_cache):
    """Different RNG streams, same problem: both devices find the planted signal. The median of
    three GPU seeds: one seed can keep an early, half-trained epoch (lab/gpu_learning_check.py)."""
    market = cache.open(strong_cache)
    fold = make_folds(market.ts, FoldSpec(max_folds=1))[0]
    cfg = DQNConfig(cost=1e-5)
    data = DeviceData(market, "cuda")
    gpu = sorted(alone(data, cfg, fold, seed).test["sharpe"] for seed in range(3))[1]
    cpu = alone(DeviceData(market, "cpu"), cfg, fold, 0)
    assert gpu > 0.5 * cpu.test["sharpe"] > 0


def test_no_host_sync_inside_an_epoch(synth_cache):
    market = cache.open(synth_cache)
    trainer = Trainer(DeviceData(market, "cuda"), [CFG])
    trainer.run_fold(make_folds(market.ts, FoldSpec())[0], [0])  # captures the graph
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(CFG.steps_per_epoch):
            trainer.graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --- populations --------------------------------------------------------------------------


def test_a_members_steps_in_a_population_are_its_steps_alone_to_float_rounding_on_cuda(synth_cache):
    """Member k's first steps on CUDA in a population of two against the same config alone (K = 1):
    the same draws (each member's own generator) and weights equal to float rounding (the
    batched kernels' reduction orders differ with K)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    data.set_fold(make_folds(market.ts, FoldSpec())[0])
    pop = DQN(data, POP)
    pop.begin([5, 6])
    for _ in range(3):
        pop.step()
    for k, (cfg, seed) in enumerate(zip(POP, [5, 6])):
        solo = DQN(data, [cfg])
        solo.begin([seed])
        for _ in range(3):
            solo.step()
        assert torch.equal(pop.replay_t[k], solo.replay_t[0]) and torch.equal(pop.t[k], solo.t[0])
        for p, q in zip(pop.params, solo.params):
            torch.testing.assert_close(p[k], q[0], rtol=1e-5, atol=1e-6)


def test_population_graphed_equals_eager_and_alone_on_cuda(synth_cache):
    market = cache.open(synth_cache)
    data = DeviceData(market, "cuda")
    fold = make_folds(market.ts, FoldSpec())[0]
    on = Trainer(data, [c.replace(graphs=True) for c in POP]).run_fold(fold, [5, 6])
    off = Trainer(data, [c.replace(graphs=False) for c in POP]).run_fold(fold, [5, 6])
    solo = [alone(data, c.replace(graphs=False), fold, s) for c, s in zip(POP, [5, 6])]
    for a, b in [*zip(on, off), *zip(off, solo)]:
        assert a.epochs_run == b.epochs_run
        np.testing.assert_allclose([c["loss"] for c in a.curve], [c["loss"] for c in b.curve], rtol=2e-3)
        np.testing.assert_allclose(
            [c["val_sharpe"] for c in a.curve], [c["val_sharpe"] for c in b.curve], rtol=2e-2, atol=0.05
        )


def test_population_has_no_host_sync_inside_an_epoch(synth_cache):
    market = cache.open(synth_cache)
    trainer = Trainer(DeviceData(market, "cuda"), POP)
    trainer.run_fold(make_folds(market.ts, FoldSpec())[0], [0, 1])  # captures the graph
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(CFG.steps_per_epoch):
            trainer.graph.replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_a_population_worker_on_cuda_trains_many_callers_through_its_device_thread(synth_cache):
    """What a population sweep does to a FoldWorker on a GPU: many caller threads at once, two
    shapes, several folds, padded populations of every size, so graphs are captured, reused,
    re-captured and evicted while the callers wait. Every request ends "ok" (a member equals
    alone to float rounding: the tests above)."""
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
