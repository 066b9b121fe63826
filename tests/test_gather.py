"""fxray.sweep.gather: the fold requests of several callers, trained together (no Ray)."""

from __future__ import annotations

import threading
import time

from test_learner import MEMBERS, SEEDS, alone, assert_same_fold, market_data  # noqa: F401 (a fixture)

from fxray.rl.trainer import FoldResult, Trainer
from fxray.sweep.gather import Gatherer


def submit_all(gatherer: Gatherer, requests: list[tuple]) -> list[dict]:
    """Each (config, fold, seed, stop) from its own thread at once, as a worker's calls arrive."""
    results: list = [None] * len(requests)

    def call(i, config, fold, seed, stop):
        results[i] = gatherer.train(config, fold, seed, None, stop)

    threads = [threading.Thread(target=call, args=(i, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a request was never trained"
    return results


def test_concurrent_requests_of_one_fold_train_as_one_population_and_get_their_own_results(market_data):  # noqa: F811
    data, fold = market_data
    gatherer = Gatherer(data, k_max=3, wait_s=5.0, pad=False)  # long: all three arrive before it trains
    members = [cfg.replace(epochs=2) for cfg in MEMBERS]
    requests = [(cfg.as_dict(), fold.as_dict(), seed, None) for cfg, seed in zip(members, SEEDS)]
    results = submit_all(gatherer, requests)
    assert gatherer.sizes == [3] and all(r["population"] == 3 for r in results)
    for cfg, seed, got in zip(members, SEEDS, results):
        got = FoldResult(**{k: v for k, v in got.items() if k != "population"})
        assert_same_fold(alone(data, cfg, fold, seed), got)


def test_a_padded_population_masks_its_spare_slots(market_data):  # noqa: F811
    """pad (CUDA's default): 3 requests take 4 slots; the spare one is masked, the results are alone's."""
    data, fold = market_data
    gatherer = Gatherer(data, k_max=4, wait_s=1.0, pad=True)
    small = [cfg.replace(epochs=2) for cfg in MEMBERS]
    results = submit_all(gatherer, [(c.as_dict(), fold.as_dict(), s, None) for c, s in zip(small, SEEDS)])
    assert gatherer.sizes == [3] and [key[1] for key in gatherer.trainers] == [4]
    for cfg, seed, got in zip(small, SEEDS, results):
        assert got["population"] == 3
        assert_same_fold(
            alone(data, cfg, fold, seed), FoldResult(**{k: v for k, v in got.items() if k != "population"})
        )


def test_populations_hold_at_most_k_and_one_fold_each(market_data):  # noqa: F811
    data, fold = market_data
    other = type(fold)(fold.k + 1, fold.train, fold.val, fold.test)  # another fold (key), same bars
    gatherer = Gatherer(data, k_max=2, wait_s=0.5, pad=False)
    small = MEMBERS[0].replace(epochs=1, steps_per_epoch=2)
    cancel = threading.Event()
    cancel.set()
    requests = [(small.as_dict(), fold.as_dict(), 0, None), (small.as_dict(), other.as_dict(), 0, cancel.is_set)]
    requests += [(small.as_dict(), fold.as_dict(), 1, None)] * 2
    results = submit_all(gatherer, requests)
    # fold k: three requests, at most two per population; fold k+1 apart, and cancelled
    assert sorted(gatherer.sizes) == [1, 1, 2] and results[1]["status"] == "cancelled"
    assert [r["fold"]["k"] for r in results] == [fold.k, fold.k + 1, fold.k, fold.k]
    assert all(r["status"] == "ok" for i, r in enumerate(results) if i != 1)


def test_equal_requests_are_each_trained(market_data):  # noqa: F811
    """Two trials may ask for the same fold with the same config and seed (Optuna can suggest a
    config twice): three equal requests queued together, two per population, are three results."""
    data, fold = market_data
    other = type(fold)(fold.k + 1, fold.train, fold.val, fold.test)
    gatherer = Gatherer(data, k_max=2, wait_s=2.0, pad=False)
    small = MEMBERS[0].replace(epochs=1, steps_per_epoch=2).as_dict()
    first = threading.Thread(target=gatherer.train, args=(small, other.as_dict(), 0))
    first.start()  # the device thread waits up to 2 s for its population: the equal three queue meanwhile
    time.sleep(0.3)
    results = submit_all(gatherer, [(small, fold.as_dict(), 1, None)] * 3)
    first.join()
    assert sorted(gatherer.sizes) == [1, 1, 2] and [r["status"] for r in results] == ["ok"] * 3
    assert results[0]["val"] == results[1]["val"] == results[2]["val"]


def test_a_failed_population_gets_its_error_and_its_trainer_is_not_reused(market_data, monkeypatch):  # noqa: F811
    """A population that raises mid-fold (on CUDA: a graph capture) hands the error to each of its
    callers, and its trainer (whose generators may be left mid-capture) is dropped: the next
    population of that shape trains on a fresh one and gets alone's result."""

    data, fold = market_data
    gatherer = Gatherer(data, k_max=2, wait_s=0.5, pad=False)
    small = MEMBERS[0].replace(epochs=1, steps_per_epoch=3)
    real = Trainer.run_fold
    calls = []

    def fail_once(self, *args, **kwargs):
        calls.append(id(self))
        if len(calls) == 1:
            raise RuntimeError("capture invalidated")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "run_fold", fail_once)
    failed = []

    def call():
        try:
            gatherer.train(small.as_dict(), fold.as_dict(), 0)
        except RuntimeError as e:
            failed.append(str(e))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert failed == ["capture invalidated"] * 2 and gatherer.trainers == {}
    again = gatherer.train(small.as_dict(), fold.as_dict(), 0)
    assert calls[1] != calls[0] and again["status"] == "ok"
    solo = alone(data, small, fold, 0)
    assert_same_fold(solo, FoldResult(**{k: v for k, v in again.items() if k != "population"}))


def test_a_failed_capture_trains_the_population_again_on_a_fresh_trainer(market_data, monkeypatch):  # noqa: F811
    """A CaptureError (on CUDA: a graph capture invalidated) drops the trainer and trains the same
    batch once more on a fresh one: the callers get alone's results, not the error. A second
    failure in a row is handed to them."""
    from fxray.rl.trainer import CaptureError

    data, fold = market_data
    small = MEMBERS[0].replace(epochs=1, steps_per_epoch=3)
    real = Trainer.run_fold

    def failing(n_failures, calls):
        def run_fold(self, *args, **kwargs):
            calls.append(id(self))
            if len(calls) <= n_failures:
                raise CaptureError("capture invalidated")
            return real(self, *args, **kwargs)

        return run_fold

    calls: list = []
    monkeypatch.setattr(Trainer, "run_fold", failing(1, calls))
    gatherer = Gatherer(data, k_max=2, wait_s=0.5, pad=False)
    results = submit_all(gatherer, [(small.as_dict(), fold.as_dict(), s, None) for s in (0, 1)])
    assert gatherer.capture_retries == 1 and len(calls) == 2 and calls[0] != calls[1]
    assert gatherer.sizes == [2] and [r["population"] for r in results] == [2, 2]
    for seed, got in zip((0, 1), results):
        solo = alone(data, small, fold, seed)
        assert_same_fold(solo, FoldResult(**{k: v for k, v in got.items() if k != "population"}))

    calls = []
    monkeypatch.setattr(Trainer, "run_fold", failing(2, calls))
    gatherer = Gatherer(data, k_max=1, wait_s=0.0, pad=False)
    try:
        gatherer.train(small.as_dict(), fold.as_dict(), 0)
    except CaptureError as e:
        failed = str(e)
    else:
        failed = None
    assert failed == "capture invalidated" and len(calls) == 2 and gatherer.trainers == {}


def test_seed_ensembles_of_one_shape_train_together_and_each_gets_what_it_gets_alone(market_data):  # noqa: F811
    """A sweep's trials of seeds S join one population (their seeds are members beside each
    other's), where a trial of another seed count trains apart."""
    data, fold = market_data
    gatherer = Gatherer(data, k_max=3, wait_s=5.0, pad=False)
    ens = [MEMBERS[0].replace(epochs=2, seeds=2), MEMBERS[0].replace(epochs=2, seeds=2, lr=2e-3)]
    one = MEMBERS[0].replace(epochs=2)
    requests = [(c.as_dict(), fold.as_dict(), s, None) for c, s in ((ens[0], 4), (ens[1], 1), (one, 2))]
    gatherer.wait_s = 1.0
    results = submit_all(gatherer, requests)
    assert sorted(gatherer.sizes) == [1, 2] and [r["population"] for r in results] == [2, 2, 1]
    for (cfg, seed), got in zip(((ens[0], 4), (ens[1], 1), (one, 2)), results):
        solo = alone(data, cfg, fold, seed)
        for key in ("status", "val", "test", "val_periods", "test_periods", "seed_spread"):
            assert got[key] == getattr(solo, key), key
