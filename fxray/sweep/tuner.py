"""Tune's side of a sweep: the Tuner (OptunaSearch + ASHA over folds, fxray's callbacks,
the stopper that ends a sweep whose start failed), and what the driver reads back from
Tune's and Optuna's saved state. fxray.sweep.driver drives it; fxray.sweep.trial is what a trial runs.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from ray import tune

from fxray.sweep.cluster import trial_resources
from fxray.sweep.leases import Workers
from fxray.sweep.trial import asha_stops, config_key, fold_trial

STUDY = "fxray"  # the Optuna study name inside <storage>/optuna.db


WORKER_FAILURE: list[str] = []  # set by watch_workers' thread; read by StartFailed
MLFLOW_FAILURE: list[str] = []  # set by the MLflow writer's reader thread; read by StartFailed


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


def ended_trials(round_dir: Path) -> tuple[int, int]:
    """(trials that ended, of which errored) in Tune's SAVED state of a round.

    The saved state, not fit()'s ResultGrid: after Ctrl+C, Tune stops the running
    trials and marks them TERMINATED in memory, while the state it saved (and that
    --resume restores) still has them RUNNING."""
    from ray.tune import ExperimentAnalysis
    from ray.tune.experiment import Trial

    trials = ExperimentAnalysis(str(round_dir)).trials
    ended = [t for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)]
    return len(ended), sum(t.status == Trial.ERROR for t in ended)


def close_orphans(storage: Path) -> int:
    """Mark FAIL the study's trials still RUNNING once every Tune trial of the round ended.

    Only a hard kill (SIGKILL, a second Ctrl+C) makes them: the searcher asked Optuna
    for a trial after Tune's last state snapshot, so the restored sweep never runs it."""
    import optuna

    study = optuna.load_study(
        study_name=STUDY, storage=optuna.storages.RDBStorage(f"sqlite:///{storage / 'optuna.db'}")
    )
    running = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING]
    for t in running:
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    return len(running)


def trials_started(storage: Path) -> int:
    """Every trial the study ever started, in any state (the N of the Deflated Sharpe Ratio:
    each was a chance to get lucky, whether ASHA stopped it, it failed or it finished)."""
    import optuna

    study = optuna.load_study(
        study_name=STUDY, storage=optuna.storages.RDBStorage(f"sqlite:///{storage / 'optuna.db'}")
    )
    return len(study.get_trials(deepcopy=False))


def read_same_trials(path: str) -> dict:
    """What `--same-trials RESULTS` replays: a finished one-round sweep's trials, in the
    order they started there, each with the folds it trained there (ASHA's stops become
    fixed lengths), and what the new sweep must match to do the same work (profile,
    data, folds, base config). ValueError with one line naming the file otherwise."""
    try:
        res = json.loads(Path(path).read_text())
        trials, rounds = res["trials"], res["rounds"]
        order = sorted(trials, key=lambda t: (t["folds"][0]["timings"]["trial_start"] or 0, t["trial_id"]))
        same = [[t["sampled"], t["folds_done"]] for t in order]
        out = {
            "from": str(Path(path).absolute()),
            "trials": same,
            "profile": res["profile"],
            "seed": rounds[-1]["seed"],
            "data": res["data"],
            "folds": res["folds"],
            "base": res["base_config"],
        }
    except FileNotFoundError:
        raise ValueError(f"--same-trials {path}: no such file (a sweep's results.json)") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:  # JSON errors are ValueErrors
        raise ValueError(f"--same-trials {path}: not a sweep's results.json ({type(e).__name__}: {e})") from None
    if len(rounds) != 1:
        raise ValueError(
            f"--same-trials {path}: that sweep ran {len(rounds)} rounds with their own seeds; replay a one-round sweep"
        )
    if not same:
        raise ValueError(f"--same-trials {path}: no trial finished a fold there")
    return out


def check_same_work(same: dict, exp, folds: list[dict], content_hash: str, data_path) -> None:
    """--same-trials: the new sweep must train on what that sweep trained on (ValueError)."""
    where = f"--same-trials {same['from']}"
    if content_hash != same["data"]["content_hash"]:
        raise ValueError(
            f"{where}: ran on other data ({same['data']['path']}), not {data_path}: pass that file as --data"
        )
    for what, mine, theirs in (
        ("folds", folds, same["folds"]),
        ("dqn config", exp.config.as_dict(), same["base"]),
        ("search space", sorted(exp.space()), sorted(same["trials"][0][0])),
    ):
        if mine != theirs:
            raise ValueError(
                f"{where}: not the same {what} as {exp.name} here ({exp.profile} profile): pass the --experiment it ran"
            )


def fold_limits(same: dict | None) -> dict[str, int] | None:
    """{config key: folds to train} for fold_trial, from read_same_trials' list."""
    if same is None:
        return None
    limits: dict[str, int] = {}
    for sampled, n in same["trials"]:
        limits.setdefault(config_key(sampled), n)  # an exact duplicate config: its first length
    return limits


def keep_mlflow_out_of_tune() -> None:
    """Tuner.fit records which callbacks a run uses (Ray's usage telemetry), importing
    ray.air.integrations.mlflow for its class name, and that module imports mlflow if
    it is installed: 0.7 s on the 2-core box, seconds on the GPU machines, in the
    driver's main thread between Tuner.fit and Tune's first trial, and holding the
    GIL while the FoldWorkers are being started. The driver never uses mlflow (the
    writer process does), so that one module is imported here while mlflow is hidden:
    it sees none and stays light. Everything else still imports mlflow normally."""
    if "ray.air.integrations.mlflow" in sys.modules:
        return
    saved = sys.modules.get("mlflow")
    sys.modules["mlflow"] = None  # `import mlflow` raises ImportError, which that module expects
    try:
        importlib.import_module("ray.air.integrations.mlflow")
    except ImportError:
        pass
    finally:
        if saved is None:
            del sys.modules["mlflow"]
        else:
            sys.modules["mlflow"] = saved


def make_tuner(storage: Path, sweep: dict, exp, job: dict, workers: Workers, resumed: bool) -> tune.Tuner:
    """OptunaSearch (seeded TPE, RDB study) + ASHA over folds; or Tune's saved state, restored.
    A --same-trials round enqueues its configs in the study and trains each for its fixed
    number of folds (fold_trial's `limits`), with no scheduler stopping anything."""
    import optuna
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.optuna import OptunaSearch

    keep_mlflow_out_of_tune()  # before Tuner.fit, a restored one too
    n_folds = len(job["folds"])
    grace = min(exp.sweep.grace_folds, n_folds)
    rnd = sweep["rounds"][-1]
    same = rnd.get("same_trials")  # --same-trials: given configs and lengths, no ASHA
    job = {**job, "stops": asha_stops(n_folds, grace, exp.sweep.reduction_factor), "limits": fold_limits(same)}
    trainable = tune.with_resources(
        tune.with_parameters(fold_trial, job=job, workers=workers), trial_resources(exp.sweep.cpu_per_trial)
    )  # on the head if multi-node
    path = storage / rnd["name"]
    if resumed and tune.Tuner.can_restore(str(path)):
        return tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
    searcher = OptunaSearch(
        space=exp.space(),
        metric="score",
        mode="max",
        study_name=STUDY,
        # one seed per round, so an extension does not replay the first round's draws
        sampler=optuna.samplers.TPESampler(seed=rnd["seed"] + len(sweep["rounds"]) - 1),
        storage=optuna.storages.RDBStorage(f"sqlite:///{storage / 'optuna.db'}"),
        points_to_evaluate=[sampled for sampled, _ in same["trials"]] if same else None,
    )
    scheduler = (
        FIFOScheduler()
        if same
        else ASHAScheduler(
            time_attr="training_iteration",
            max_t=n_folds,
            grace_period=grace,
            reduction_factor=exp.sweep.reduction_factor,
        )
    )
    from fxray.sweep.callbacks import SweepLog

    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=rnd["trials"],
            max_concurrent_trials=workers.plan.n_trials,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=rnd["name"],
            storage_path=str(storage),
            verbose=0,
            stop=StartFailed(),
            callbacks=[
                SweepLog(str(storage), None if same else job["stops"], exp.sweep.reduction_factor),
                JsonLoggerCallback(),
                CSVLoggerCallback(),
            ],
            failure_config=tune.FailureConfig(max_failures=2),  # a dead trial resumes from its last fold
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
