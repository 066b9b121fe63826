"""Tune's side of a sweep: the Tuner (fxray's StudySearch over the Optuna study + ASHA over
folds, fxray's callbacks, the stopper that ends a sweep whose start failed). A resumed round
gets a fresh Tuner too: nothing of Tune's saved state is ever read back (fxray.sweep.rounds
says what is left to run). fxray.sweep.driver drives it; fxray.sweep.trial is what a trial runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from pathlib import Path

import ray
from ray import tune

from fxray.sweep.cluster import MLFLOW_FAILURE, WORKER_FAILURE, trial_resources
from fxray.sweep.leases import Workers
from fxray.sweep.rounds import fold_limits
from fxray.sweep.trial import asha_stops, fold_trial


class StartFailed(tune.Stopper):
    """Ends the whole sweep as soon as a FoldWorker failed to load or the MLflow store
    failed to open (module state, so the stopper itself pickles into Tune's experiment state)."""

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        return bool(WORKER_FAILURE or MLFLOW_FAILURE)


def debug_log(path: str | None) -> None:
    """FXRAY_TUNE_DEBUG_LOG=PATH: Tune's controller logs every trial and actor event
    there (unix time first), to see where a sweep's seconds went between folds."""
    if path:
        import logging

        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
        for name in ("ray.tune.execution.tune_controller", "ray.air.execution._internal.actor_manager"):
            logger = logging.getLogger(name)
            logger.setLevel(logging.DEBUG)
            logger.addHandler(handler)


def keep_mlflow_out_of_tune() -> None:
    """Tuner.fit records which callbacks a run uses (Ray's usage telemetry), importing
    ray.air.integrations.mlflow for its class name, and that module imports mlflow if
    it is installed: 0.7 s on the 2-core box, seconds on the GPU machines, in the
    driver's main thread between Tuner.fit and Tune's first trial, and holding the
    GIL while the FoldWorkers are being started. The driver never uses mlflow (the
    writer process does), so that one module is imported here while mlflow is hidden:
    it sees none and stays light. Everything else still imports mlflow normally."""
    saved = sys.modules.get("mlflow")
    sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, which that module expects
    with contextlib.suppress(ImportError):
        importlib.import_module("ray.air.integrations.mlflow")  # (imported already: nothing happens)
    del sys.modules["mlflow"]
    if saved is not None:
        sys.modules["mlflow"] = saved


class Ahead:
    """The searcher's trials trained ahead of Tune on the one worker: `size` asked at a time, their
    folds queued there in one call (`queue`), and when the worker will have trained each (`pending`)."""

    def __init__(self, worker, job: dict, size: int):
        self.worker, self.job, self.size, self.queued = worker, job, size, None

    def queue(self, trials: list[tuple[str, dict]]) -> None:
        """(trial id, sampled config) of each new trial: its folds, as fold_trial would send them."""
        batch = [(tid, {**self.job["base"], **p}, os.path.join(self.job["checkpoints"], tid)) for tid, p in trials]
        self.queued = self.worker.queue_asked.remote(batch, self.job["folds"], self.job["seed"])

    def pending(self) -> dict[str, tuple[int, int]]:
        """fxray.sweep.workers.DeviceWorker.pending once the last `queue` is in; {} (ask order)
        while the worker is still starting: Tune's first processes start beside it, not after."""
        if not ray.wait([self.queued], timeout=0)[0]:  # (a threaded actor may run a caller's calls out of order)
            return {}
        return ray.get(self.worker.pending.remote(), timeout=30)


def make_tuner(storage: Path, sweep: dict, exp, workers: Workers, plan, periods_per_year: float) -> tune.Tuner:
    """A fresh Tuner over the round: StudySearch (seeded TPE on the RDB study; first the trials
    `plan` resumes, then `plan.n_new` new ones) + ASHA over folds (its time is `folds_done`, so a
    resumed trial meets its rungs where it left them). A --same-trials round enqueues its configs
    in the study (once) and trains each for its fixed number of folds (fold_trial's `limits`),
    with no scheduler stopping anything. A resumed round trains with what it started with
    (sweep.json's folds, base config and seed), whatever the flags say now."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from fxray.sweep.callbacks import SweepLog
    from fxray.sweep.rounds import load_study
    from fxray.sweep.search import StudySearch

    keep_mlflow_out_of_tune()  # before Tuner.fit
    n_folds, rf, rnd = len(sweep["folds"]), exp.sweep.reduction_factor, sweep["rounds"][-1]
    grace = min(exp.sweep.grace_folds, n_folds)
    same = rnd.get("same_trials")  # --same-trials: given configs and lengths, no ASHA
    job = {
        "folds": sweep["folds"],
        "base": sweep["base"],
        "seed": rnd["seed"],
        "periods_per_year": periods_per_year,
        "checkpoints": str(storage / "checkpoints"),
        "stops": asha_stops(n_folds, grace, rf),
        "limits": fold_limits(same),
        "storage": str(storage),
    }
    trainable = tune.with_resources(
        tune.with_parameters(fold_trial, job=job, workers=workers), trial_resources(workers.plan.cpu_per_trial)
    )  # on the head if multi-node
    ahead, in_flight = None, workers.plan.n_trials
    if len(workers.handles) == 1 and workers.plan.population > 1 and job["stops"] == [n_folds] and not same:
        # one worker training populations, no rung before the last fold: a population's trials are
        # asked at once and their folds queued on the worker; Tune gets them in the order they train,
        # and a process per core of this (head) node collects each in turn (Tune reuses the process)
        ahead, in_flight = Ahead(workers.handles[0], job, workers.plan.population), min(in_flight, os.cpu_count() or 1)

    study = load_study(storage)
    if same and not study.get_trials(deepcopy=False):  # the first session of the round: enqueue once
        for sampled, _ in same["trials"]:
            study.enqueue_trial(sampled)
    seed = rnd["seed"] + len(sweep["rounds"]) - 1  # one seed per round: an extension does not replay the first's draws
    asha = ASHAScheduler(time_attr="folds_done", max_t=n_folds, grace_period=grace, reduction_factor=rf)
    tune_dir = storage / rnd["name"]  # Tune's logs, a folder per session of the round; never read back
    session = 1 + len(list(tune_dir.glob("session-*")))
    log = SweepLog(str(storage), None if same else job["stops"], rf, workers.pool)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            search_alg=StudySearch(storage, exp.space(), seed, rnd["name"], plan.resumed, plan.n_new, ahead),
            scheduler=FIFOScheduler() if same else asha,
            num_samples=len(plan.resumed) + plan.n_new,
            max_concurrent_trials=in_flight,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"session-{session}",
            storage_path=str(tune_dir),
            verbose=0,
            stop=StartFailed(),
            callbacks=[log],  # no Tune loggers: its result.json / progress.csv copies of every
            # fold (each ~0.1 MB of returns) cost the controller ~25 ms a report, and nothing read them
            # a dead trial process is run again by Tune; it continues after its last logged fold
            failure_config=tune.FailureConfig(max_failures=2),
        ),
    )
