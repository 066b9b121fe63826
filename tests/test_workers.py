"""fxray.workers on a real local Ray: one load per worker, exclusive leases, restart after a kill."""

import numpy as np
import pytest
import ray

from fxray.data import cache
from fxray.data.arrays import host_arrays
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, to_cache
from fxray.sweep.cluster import plan_workers
from fxray.sweep.workers import FoldWorker, put_market, start_workers

TINY = {
    "num_envs": 16,
    "batch_size": 64,
    "hidden": 16,
    "buffer_steps": 32,
    "episode_len": 32,
    "epochs": 2,
    "steps_per_epoch": 10,
    "patience": 2,
}


def test_plan_cpu_box():
    plan = plan_workers({"CPU": 2.0}, cpu_per_trial=0.25)
    assert (plan.kind, plan.n_workers, plan.num_gpus, plan.torch_threads) == ("cpu", 2, 0.0, 1)
    assert plan.num_cpus == 0.75  # 2 workers x 0.75 + 2 trials x 0.25 = the 2 CPUs
    wide = plan_workers({"CPU": 8.0}, cpu_per_trial=0.5, cpu_workers=2)
    assert (wide.n_workers, wide.torch_threads, wide.num_cpus) == (2, 4, 3.5)


def test_plan_gpu_box():
    plan = plan_workers({"CPU": 16.0, "GPU": 2.0}, workers_per_gpu=2)
    assert (plan.kind, plan.n_workers, plan.num_gpus, plan.num_cpus) == ("gpu", 4, 0.5, 1.0)
    # the default GPU sweep: its 64 trials are one population, all in flight
    assert plan_workers({"CPU": 16.0, "GPU": 1.0}, population=64, max_trials=64).n_trials == 64


@pytest.mark.parametrize("cpus, population, asked", [(2.0, 4, 8), (2.0, 16, 64), (1.0, 1, 64), (2.0, 2, 1)])
def test_any_population_fits_any_cpu_box_and_no_more_trials_fly_than_were_asked(cpus, population, asked):
    """Trials only wait on workers: between them they reserve at most half the CPUs (less than
    cpu_per_trial each where needed), the workers the rest, whatever the population."""
    plan = plan_workers({"CPU": cpus}, cpu_per_trial=1.0, population=population, max_trials=asked)
    assert plan.n_trials <= asked and plan.n_trials >= min(asked, plan.n_workers)
    assert plan.n_trials * plan.cpu_per_trial <= cpus / 2 + 1e-9 and plan.cpu_per_trial >= 0.01
    assert plan.num_cpus > 0 and plan.n_workers * plan.num_cpus + plan.n_trials * plan.cpu_per_trial <= cpus + 1e-9
    assert plan_workers({"CPU": 2.0}, population=4, max_trials=8).n_trials == 8  # what was asked, not 10


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Two workers on two LOGICAL GPUs of a CPU box: they must still compute on the CPU."""
    path = tmp_path_factory.mktemp("w") / "m.fxcache"
    to_cache(SynthSpec(n_bars=20_000, seed=3), path)
    market = cache.open(path)
    folds = [f.as_dict() for f in make_folds(market.ts, FoldSpec("4d", "2d", "2d", max_folds=2))]
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, namespace="fxray-test-workers")
    try:
        ref = put_market(market)
        plan = plan_workers(ray.cluster_resources(), 1, 0.25)
        workers = start_workers(ref, plan)
        workers.stats()  # loaded
        yield workers, ref, folds, path
    finally:
        ray.shutdown()


def test_each_worker_loads_once_on_its_own_gpu(pool):
    workers, ref, _, _ = pool
    stats = workers.stats()
    assert [s["n_loads"] for s in stats] == [1, 1]
    assert sorted(s["gpu_ids"][0] for s in stats) == ["0", "1"]  # one per (logical) GPU
    assert {s["device"] for s in stats} == {"cpu"}  # no CUDA here: CPU, not a crash
    arrays = ray.get(ref)
    assert not arrays["features"].flags.writeable  # the object store hands out read-only views
    assert arrays["close"].flags.c_contiguous
    host = host_arrays(cache.open(pool[3]))
    assert arrays.keys() == host.keys()  # put_market builds what DeviceData reads
    for k in host:
        np.testing.assert_array_equal(arrays[k], host[k])


def test_leases_are_exclusive(pool):
    workers, _, _, _ = pool
    a = ray.get(workers.pool.acquire.remote("trial-a"))
    b = ray.get(workers.pool.acquire.remote("trial-b"))
    assert {a, b} == {0, 1}
    assert ray.get(workers.pool.acquire.remote("trial-a")) == a  # same owner, same worker
    waiting = workers.pool.acquire.remote("trial-c")
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(waiting, timeout=0.5)  # both busy: trial-c waits
    assert ray.get(workers.pool.release.remote("trial-a")) == 1
    assert ray.get(waiting, timeout=10) == a
    for owner in ("trial-b", "trial-c", "nobody"):
        ray.get(workers.pool.release.remote(owner))
    # a trial coming back for more folds gets the worker it used (its Trainer is there) if idle
    assert ray.get(workers.pool.acquire.remote("trial-d", 1)) == 1
    assert ray.get(workers.pool.acquire.remote("trial-e", 1)) == 0  # busy: any idle one
    for owner in ("trial-d", "trial-e"):
        ray.get(workers.pool.release.remote(owner))


def test_fold_survives_a_killed_worker(pool, tmp_path):
    workers, _, folds, _ = pool
    with workers.lease("trial-k") as index:
        first = train_fold(workers, index, TINY, folds[0], seed=7, checkpoint_dir=str(tmp_path))
        assert first["status"] == "ok" and first["worker"] == index
        assert (tmp_path / "fold0.safetensors").exists()
        ray.kill(workers.handles[index], no_restart=False)  # Ray restarts it from the object store
        again = train_fold(workers, index, TINY, folds[0], seed=7)
    stats = workers.stats()[index]
    assert stats["restarted"] and stats["n_loads"] == 1 and stats["n_calls"] == 1
    # Same config, seed, fold and thread count: the restarted worker reproduces the fold.
    assert again["val"]["sharpe"] == pytest.approx(first["val"]["sharpe"], abs=1e-9)
    np.testing.assert_allclose(again["test_periods"]["net"], first["test_periods"]["net"], atol=1e-12)


def test_a_trainer_is_reused_across_folds_and_configs_of_one_shape(pool):
    workers, _, folds, _ = pool
    config = {**TINY, "lr": 3e-4, "hidden": 24}  # a shape no other test trains
    with workers.lease("trial-r") as index:
        before = workers.stats()[index]
        for fold in folds:
            r = train_fold(workers, index, config, fold, seed=1)
            assert r["fold"]["k"] == fold["k"]
        train_fold(workers, index, {**config, "lr": 1e-3}, folds[0], seed=1)  # another config, the same shape
    after = workers.stats()[index]
    assert after["n_calls"] == before["n_calls"] + len(folds) + 1
    assert after["n_trainers"] == before["n_trainers"] + 1  # one Trainer for all of them
    assert after["n_loads"] == 1


def train_fold(workers, index, config, fold, seed, checkpoint_dir=None) -> dict:
    """One fold on worker `index`, as a trial's stream runs it (a dead worker's fold is retried)."""
    return next(workers.run_folds(index, config, [fold], seed, checkpoint_dir))


def wait_for(predicate, timeout=60.0):
    import time

    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def test_run_folds_keeps_the_next_fold_queued(pool):
    workers, _, folds, _ = pool
    config = {**TINY, "lr": 5e-4}
    with workers.lease("trial-p") as index:
        plain = [train_fold(workers, index, config, f, seed=2) for f in folds]
        n0 = workers.stats()[index]["n_calls"]
        results = workers.run_folds(index, config, folds, seed=2)
        first = next(results)
        # the caller has not asked for fold 2, yet the worker trains it already
        wait_for(lambda: workers.stats()[index]["n_calls"] == n0 + 2)
        rest = list(results)
    piped = [first, *rest]
    assert [r["fold"]["k"] for r in piped] == [f["k"] for f in folds]
    for a, b in zip(plain, piped):  # the same folds, the same numbers, only earlier
        assert a["status"] == b["status"] == "ok"
        assert a["val"] == b["val"] and a["test"] == b["test"]


def test_closing_run_folds_cancels_what_it_queued(pool):
    workers, _, folds, _ = pool
    long = {**TINY, "epochs": 400, "patience": 1000, "lr": 7e-4}  # minutes if not cancelled
    with workers.lease("trial-c") as index:
        n0 = len(workers.stats()[index]["calls"])
        results = workers.run_folds(index, long, folds, seed=3)
        wait_for(lambda: (workers.stats()[index]["running"] or [0, 0, -1])[2] == folds[0]["k"])
        results.close()  # what a trial stopped inside tune.report does, via contextlib.closing
        stats = wait_for(lambda: (lambda s: s if len(s["calls"]) == n0 + 2 else None)(workers.stats()[index]))
    # the running fold ended at an epoch boundary, the queued one never started
    assert [c[4] for c in stats["calls"][n0:]] == ["cancelled", "cancelled"]
    assert stats["running"] is None
    after = train_fold(workers, index, TINY, folds[0], seed=7)  # the worker serves the next trial
    assert after["status"] == "ok"


def test_plan_counts_the_trials_in_flight():
    plan = plan_workers({"CPU": 2.0}, cpu_per_trial=0.25, trials_per_worker=2)
    assert (plan.n_workers, plan.n_trials) == (2, 4)
    assert plan.num_cpus == 0.5  # 2 workers x 0.5 + 4 waiting/leasing trials x 0.25 = the 2 CPUs
    gpu = plan_workers({"CPU": 16.0, "GPU": 2.0}, trials_per_worker=3)
    assert (gpu.n_workers, gpu.n_trials, gpu.num_cpus) == (2, 6, 1.0)
    squeezed = plan_workers({"CPU": 1.0}, cpu_per_trial=0.25, trials_per_worker=4)  # 4 x 0.25 would take it all
    assert (squeezed.n_trials, squeezed.cpu_per_trial, squeezed.num_cpus) == (4, 0.12, 0.52)


def test_warmup_runs_a_short_fold_and_logs_it(pool):
    """The warm-up trains one epoch of its config even where the experiment's own settings would
    not: epoch 0 not selectable (the shipped select_from 1) and a fold the screen keeps nothing on
    (screen_t 100 with abstain). One that cannot run is kept as the worker's warmup_error."""
    _, ref, folds, _ = pool
    fresh = FoldWorker.options(num_cpus=0, num_gpus=0).remote([ref], 7)
    shipped = {**TINY, "steps_per_epoch": 500, "select_from": 1, "screen_t": 100.0, "abstain": True}
    assert ray.get(fresh.warmup.remote(shipped, folds[:1])) == {"status": "ok", "epochs_run": 1}
    stats = ray.get(fresh.stats.remote())
    (call,) = stats["calls"]
    assert call[2:] == [None, folds[0]["k"], "warmup"] and call[1] > call[0] and stats["warmup_error"] is None
    assert stats["n_trainers"] == 1 and stats["n_calls"] == 0  # it trained, and is not a trial's fold
    assert ray.get(fresh.warmup.remote({**shipped, "dtype": "bfloat16"}, folds[:1])) is None
    assert "dqn.dtype 'bfloat16' differs from the worker's data" in ray.get(fresh.stats.remote())["warmup_error"]
    ray.kill(fresh)


def test_a_warmup_that_comes_after_a_fold_only_logs_itself(pool):
    """Ray orders calls per caller: the driver's warm-up may reach a worker after a trial's
    fold has paid the one-time costs; it then trains nothing and is logged with no length."""
    _, ref, folds, _ = pool
    fresh = FoldWorker.options(num_cpus=0, num_gpus=0).remote([ref], 8)
    assert ray.get(fresh.train_fold.remote(TINY, folds[0], 1))["status"] == "ok"
    ray.get(fresh.warmup.remote({**TINY, "steps_per_epoch": 500}, folds[:1]))
    stats = ray.get(fresh.stats.remote())
    assert [c[4] for c in stats["calls"]] == ["ok", "warmup"]
    warm = stats["calls"][1]
    assert warm[0] == warm[1] >= stats["calls"][0][1] and stats["n_trainers"] == 1
    ray.kill(fresh)


# --- populations (sweep.population > 1: fxray.sweep.gather) ------------------------------------


def test_a_pool_of_capacity_k_leases_a_worker_to_k_trials(pool):
    from fxray.sweep.leases import WorkerPool

    shared = WorkerPool.remote(2, 2)
    got = [ray.get(shared.acquire.remote(f"trial-{c}")) for c in "abcd"]
    assert got == [0, 1, 0, 1]  # the least held worker first
    waiting = shared.acquire.remote("trial-e")
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(waiting, timeout=0.5)  # both full
    ray.get(shared.release.remote("trial-b"))
    assert ray.get(waiting, timeout=10) == 1
    assert [ray.get(shared.release.remote(f"trial-{c}")) for c in "acde"] == [1, 1, 1, 1]


def gathering_worker(ref, index: int):
    """A FoldWorker training populations of 2 (threads gather them), each waiting for its second
    trial's fold however loaded the box (10 s at most, not WAIT_S)."""
    worker = FoldWorker.options(num_cpus=0.1, num_gpus=0, max_concurrency=6).remote([ref], index, 1, "float32", 2)
    ray.get(worker.__ray_call__.remote(lambda self: setattr(self.gatherer, "wait_s", 10.0)))
    return worker


def test_a_population_worker_trains_two_trials_together_as_each_alone(pool):
    """Two trials' folds on a worker with population 2 (threads gather them): each result is what
    the one-at-a-time worker returns for that config."""
    from fxray.sweep.leases import FoldStream

    workers, ref, folds, _ = pool
    gathering = gathering_worker(ref, 9)
    configs = [{**TINY, "lr": 1e-3}, {**TINY, "lr": 2e-4, "gamma": 0.9, "n_step": 2}]
    streams = [FoldStream(gathering, c, folds, seed=4) for c in configs]  # both queue both folds now
    together = [list(s) for s in streams]
    with workers.lease("trial-p") as index:
        alone = [[train_fold(workers, index, c, f, seed=4) for f in folds] for c in configs]
    for mine, theirs in zip(together, alone):
        for a, b in zip(mine, theirs):
            assert a["population"] == 2 and (a["val"], a["test"]) == (b["val"], b["test"])
    assert ray.get(gathering.stats.remote())["populations"] == [2] * len(folds)
    ray.kill(gathering, no_restart=True)


def test_folds_queued_as_a_trial_is_asked_are_what_its_own_calls_get(pool):
    """The searcher queues each new trial's folds on a population worker as it asks the trial
    (queue_asked); the trial's calls then collect those results, each what the one-at-a-time
    worker returns for that config; a fold the trial's own call reached first is trained by it,
    once: the late queue_asked leaves it alone."""
    from fxray.sweep.leases import FoldStream

    workers, ref, folds, _ = pool
    gathering = gathering_worker(ref, 8)
    configs = {"a": {**TINY, "lr": 1e-3}, "b": {**TINY, "lr": 2e-4, "gamma": 0.9, "n_step": 2}}
    ray.get(gathering.queue_asked.remote([(tid, c, None) for tid, c in configs.items()], folds, 4))
    asked = {tid: list(FoldStream(gathering, c, folds, seed=4, trial_id=tid)) for tid, c in configs.items()}
    stats = ray.get(gathering.stats.remote())
    assert stats["n_asked"] == stats["n_asked_collected"] == stats["n_calls"] == 2 * len(folds)
    assert stats["populations"] == [2] * len(folds)
    with workers.lease("trial-q") as index:
        for tid, c in configs.items():
            alone = [train_fold(workers, index, c, f, seed=4) for f in folds]
            assert [(r["val"], r["test"]) for r in asked[tid]] == [(r["val"], r["test"]) for r in alone]
    # trial c's calls first, its first fold twice (as a retried trial process asks again), then its queue
    late = list(FoldStream(gathering, configs["a"], folds[:1] * 2, seed=4, trial_id="c"))
    ray.get(gathering.queue_asked.remote([("c", configs["a"], None)], folds[:1], 4))
    assert [(r["val"], r["test"]) for r in late] == [(asked["a"][0]["val"], asked["a"][0]["test"])] * 2
    stats = ray.get(gathering.stats.remote())
    assert stats["n_asked"] - 1 == stats["n_asked_collected"] == 2 * len(folds)  # c's fold asked, not queued
    assert sum(stats["populations"]) == 2 * len(folds) + 2  # c's two calls, nothing more
    ray.kill(gathering, no_restart=True)


def test_trials_are_handed_to_tune_in_the_order_the_worker_trains_them(pool, tmp_path):
    """The searcher asks a population's trials at once and queues their folds on the worker in one
    call; the worker says which population will train each trial's last fold (`pending`), and the
    searcher hands Tune the trials trained first, first (StudySearch.soonest), not in the order it
    sampled them: Tune's few processes never wait on a trial trained last."""
    import optuna

    from fxray.sweep.leases import FoldStream
    from fxray.sweep.search import TRIAL_KEY, StudySearch
    from fxray.sweep.tuner import Ahead

    workers, ref, folds, _ = pool
    gathering = FoldWorker.options(num_cpus=0.1, num_gpus=0, max_concurrency=10).remote([ref], 9, 1, "float32", 4)
    job = {"base": TINY, "folds": folds, "seed": 4, "checkpoints": str(tmp_path / "checkpoints")}
    space = {"hidden": optuna.distributions.CategoricalDistribution([16, 24])}
    ahead = Ahead(gathering, job, 4)
    searcher = StudySearch(tmp_path, space, 0, "round-1", [], 4, ahead)
    handed = [searcher.suggest("tune-0")]  # the first in ask order: the worker may still be starting
    ray.get(ahead.queued)  # the worker has the batch: it can say when each trains
    handed += [searcher.suggest(f"tune-{i}") for i in range(1, 4)]
    # seed 0 samples hidden 24, 16, 24, 24: the worker trains the three 24s (the first asked's shape)
    # fold by fold, then the 16; Tune gets them in that order
    assert [searcher.live[f"tune-{i}"] for i in range(4)] == [0, 2, 3, 1]  # study numbers = ask order
    assert [h["hidden"] for h in handed] == [24, 24, 24, 16]
    for h in handed:  # every fold collected: what each trial's process does
        cfg = {**TINY, "hidden": h["hidden"]}
        assert len(list(FoldStream(gathering, cfg, folds, seed=4, trial_id=h[TRIAL_KEY]))) == len(folds)
    assert ray.get(gathering.pending.remote()) == {}
    assert ray.get(gathering.stats.remote())["populations"] == [3] * len(folds) + [1] * len(folds)
    ray.kill(gathering, no_restart=True)
