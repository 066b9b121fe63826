"""Sweep DQN hyperparameters over walk-forward folds: Ray Tune + Optuna TPE + ASHA + MLflow.

    python -m fxray.tune --trials 64                                   # the embedded market
    python -m fxray.tune --experiment experiments/smoke.yaml           # tiny, < 2 min on a CPU
    python -m fxray.tune --experiment experiments/X.yaml --data X.fxcache --address auto
    python -m fxray.tune --resume                                      # finish an interrupted sweep
    python -m fxray.tune --same-trials runs/default/results.json --storage runs/again   # same work again

Each trial is a plain function (fxray/trial.py) that walks the folds in time order on a
leased FoldWorker and calls `tune.report` after each fold; the objective is the running
mean of val Sharpe (comparable across fold counts, as ASHA stops trials early). The
Tuner is built in fxray/tuner.py, the MLflow helper process in fxray/mlhelper.py.
The run directory (default ./runs/<experiment name>), resume, extension rounds
and the MLflow layout are described in docs/tune.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

_T_IMPORT = time.time()
import ray  # noqa: E402

from fxray import experiment as expmod
from fxray.cache import CacheError
from fxray.cluster import ObjectStoreError
from fxray.config import ConfigError
from fxray.folds import FoldError
from fxray.leases import Workers, pool_name
from fxray.tuner import (MLFLOW_FAILURE, WORKER_FAILURE, check_same_work, close_orphans, debug_log, ended_trials,
                         make_tuner, read_same_trials)

IMPORT_S = time.time() - _T_IMPORT  # importing Ray and Tune: before a run's clock starts


# --- the driver ------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fxray.tune", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", help=f"experiment YAML (default {expmod.DEFAULT_EXPERIMENT})")
    p.add_argument("--data", help="an fxcache; overrides the experiment's data.path")
    p.add_argument("--trials", type=positive_int, help="trials to run (default: the file's sweep.trials)")
    p.add_argument("--seed", type=int, help="TPE sampler and training seed (default: sweep.seed)")
    p.add_argument("--workers-per-gpu", type=positive_int, help="FoldWorkers per GPU (num_gpus = 1/K each)")
    p.add_argument("--cpu-workers", type=positive_int, help="FoldWorkers on a cluster without GPUs "
                   "(default: one per CPU)")
    p.add_argument("--name", help="MLflow experiment and run-directory name (default: the file's name)")
    p.add_argument("--storage", help="run directory (default: ./runs/<name>)")
    p.add_argument("--resume", action="store_true", help="finish the interrupted sweep in --storage")
    p.add_argument("--address", help="join a running Ray cluster ('auto'); default: start one here")
    p.add_argument("--num-cpus", type=positive_int, help="local Ray: logical CPUs (default: all)")
    p.add_argument("--num-gpus", type=int, help="local Ray: logical GPUs (default: detected)")
    p.add_argument("--profile", choices=("auto", "gpu", "cpu"), default="auto",
                   help="apply the file's cpu: overrides (auto: when the cluster has no GPU)")
    p.add_argument("--same-trials", metavar="RESULTS", help="run the trials of a finished sweep again "
                   "(its results.json): the same configs, each for as many folds as it trained there")
    p.add_argument("--json", help="write per-trial, per-fold results here")
    return p.parse_args(argv)


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return v


class UsageError(ValueError):
    """A bad flag combination or run directory state; one line, exit code 2."""


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (expmod.ExperimentError, UsageError, CacheError, FoldError, ConfigError, ObjectStoreError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"fxray.tune: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fxray.tune: interrupted (if it had made its run directory, --resume continues it)",
              file=sys.stderr)
        return 130


def run(args) -> int:
    with contextlib.ExitStack() as stack:  # the MLflow helper process ends with the run, however it ends
        return sweep_run(args, stack)


def sweep_run(args, stack: contextlib.ExitStack) -> int:
    from fxray import cache, mlhelper, mlruns, synth, tracking

    t_start = time.time()
    overrides = {k: v for k, v in (("sweep.trials", args.trials), ("sweep.seed", args.seed),
                                   ("sweep.workers_per_gpu", args.workers_per_gpu),
                                   ("name", args.name)) if v is not None}
    if args.address and (args.num_cpus or args.num_gpus is not None):
        raise UsageError("--num-cpus/--num-gpus size a local Ray; with --address the cluster's own "
                         "resources are used: drop one of them")
    file, storage, sweep = locate(args, overrides)
    same = same_trials(args, storage, sweep, overrides)
    exp = expmod.load(file, "gpu", overrides)  # validates both profiles before anything starts
    data_path = args.data or (sweep and sweep["data"]["path"]) or (same and same["data"]["path"]) or exp.data_path
    if args.data and sweep and Path(args.data).absolute() != Path(sweep["data"]["path"]):
        raise UsageError(f"--data {args.data}: this sweep ran on {sweep['data']['path']}; "
                         "use --storage DIR for a new sweep")
    if data_path and not Path(data_path).exists():
        where = "--data" if args.data else f"{file}: data.path"
        raise UsageError(f"{where}: {data_path} does not exist (build it with `python -m fxray.data build`)")

    market = cache.open(data_path) if data_path else None  # a bad file fails here, before Ray
    if market is not None:
        make_fold_dicts(file, exp, market)
        if sweep and sweep["data"]["content_hash"] != market.content_hash:
            raise UsageError(f"{data_path}: its contents changed since the sweep started "
                             f"(hash {market.content_hash} != {sweep['data']['content_hash']})")
        if same:
            same_exp = expmod.load(file, same["profile"], overrides)
            try:
                check_same_work(same, same_exp, make_fold_dicts(file, same_exp, market), market.content_hash,
                                data_path)
            except ValueError as e:
                raise UsageError(str(e)) from None

    uri = sweep["mlflow"]["uri"] if sweep else mlruns.tracking_uri()
    try:
        mlruns.check_uri(uri)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # unix times of the start-up steps (and the import time before them), for results.json
    phases = {"ray_tune_import_s": IMPORT_S, "validated": time.time()}
    # first, so that importing mlflow and readying its store overlap Ray's start
    store = stack.enter_context(mlhelper.TrackerProcess(uri, storage / "optuna.db"))
    start_ray(args)
    phases["ray_up"] = time.time()
    gpus = ray.cluster_resources().get("GPU", 0)
    profile = (sweep or same or {}).get("profile") or (args.profile if args.profile != "auto"
                                                       else ("gpu" if gpus >= 1 else "cpu"))
    exp = expmod.load(file, profile, overrides)
    if market is None:
        data_path = str(synth.ensure_default(exp.synth, log=print))
        market = cache.open(data_path)
    folds = make_fold_dicts(file, exp, market)
    resources = ray.cluster_resources()
    from fxray.workers import plan_workers, put_market, start_workers

    try:
        plan = plan_workers(resources, exp.sweep.workers_per_gpu, exp.sweep.cpu_per_trial, args.cpu_workers,
                            exp.sweep.trials_per_worker)
    except ValueError as e:
        raise UsageError(str(e)) from None
    trials = sweep["rounds"][-1]["trials"] if args.resume else exp.sweep.trials
    print(f"{profile.upper()} profile: {trials} trials x {len(folds)} folds x {exp.dqn.epochs} epochs "
          f"x {exp.dqn.steps_per_epoch} steps ({exp.dqn.num_envs} envs, batch {exp.dqn.batch_size}) "
          f"on {plan.describe()}; data {data_path} ({market.n_bars:,} bars)"
          + (" -- resuming" if args.resume else "")
          + (f" -- the trials of {same['from']}, each for as many folds as there" if same else ""), flush=True)

    t0 = time.time()
    arrays_ref = put_market(market)  # ONCE per sweep; the workers get zero-copy views
    workers = start_workers(arrays_ref, plan, exp.dqn.dtype, pool_name(storage),
                            fault=os.environ.get("FXRAY_FAULT_WORKER_EXIT"))
    for handle in workers.handles:  # pays a device process's one-time costs while Tune starts
        handle.warmup.remote(exp.dqn.as_dict(), folds[0])
    phases["workers_created"] = time.time()
    # while the workers import torch and load the data: the run directory, then Tune starts
    # its trial processes (seconds each) while the MLflow helper opens the sweep's runs; a
    # trial's first fold waits on its worker. A worker that cannot load, or a store that
    # cannot open, stops the sweep (StartFailed).
    sweep = prepare_storage(storage, sweep, exp, file, profile, market, data_path, folds, args, same)
    with contextlib.suppress(Exception):  # a helper that cannot: OptunaSearch creates the file
        store.ready_study()

    def opened(parent_id: str) -> None:  # in the tracker's thread; the main thread is in Tune
        if sweep["mlflow"].get("parent_run_id") is None:
            sweep["mlflow"]["parent_run_id"] = parent_id
            write_sweep(storage, sweep)
        phases["mlflow_ready"] = time.time()

    tracker = mlruns.TRACKERS[str(storage)] = mlhelper.OpeningTracker(store, sweep, opened, MLFLOW_FAILURE.append)
    # A sqlite store fails at once if it fails, seconds before a first fold could be
    # reported. A tracking server can take minutes to fail (MLflow retries): folds
    # reported meanwhile would never reach it, not even after --resume. Wait for it.
    if mlruns.sqlite_path(uri) is None and not tracker.wait():
        return start_failed(f"MLflow store {uri} could not be opened: {MLFLOW_FAILURE[0]}", storage)
    watch_workers(workers, t0, phases)
    # what a resumed round trains with is what it started with, whatever the flags say now
    job = {"folds": sweep["folds"], "base": sweep["base"], "seed": sweep["rounds"][-1]["seed"],
           "checkpoints": str(storage / "checkpoints")}
    debug_log(os.environ.get("FXRAY_TUNE_DEBUG_LOG"))
    try:
        tuner = make_tuner(storage, sweep, exp, job, workers, resumed=args.resume)
        phases["tune_started"] = time.time()
        tuner.fit()
        phases["tune_done"] = time.time()
        tracker.wait()
    except Exception as e:  # Tune gives up on e.g. an OOM kill of a trial; its state is saved
        tracker.end_sweep("FAILED")
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"fxray.tune: the sweep stopped: {type(e).__name__}: {first}\n"
              f"continue it with: python -m fxray.tune --storage {storage} --resume", file=sys.stderr)
        return 1
    if MLFLOW_FAILURE:
        return start_failed(f"MLflow store {uri} could not be opened: {MLFLOW_FAILURE[0]}", storage)
    if WORKER_FAILURE:
        tracker.end_sweep("FAILED")
        return start_failed(f"a FoldWorker could not load the data: {WORKER_FAILURE[0]}", storage)
    ended, errors = ended_trials(storage / sweep["rounds"][-1]["name"])
    unfinished = sweep["rounds"][-1]["trials"] - ended
    records = tracking.load_records(storage)
    worker_stats = workers.stats()
    summary = tracking.write_results(storage, sweep, records, worker_stats, time.time() - t_start, args.json,
                                     started=t_start, phases=phases)
    if unfinished:
        tracker.end_sweep("KILLED")
        print(f"interrupted: {unfinished} trial(s) unfinished; resume with: python -m fxray.tune "
              f"--storage {storage} --resume", file=sys.stderr)
        return 130
    orphans = close_orphans(storage)
    if orphans:
        print(f"{orphans} Optuna trial(s) left RUNNING by a hard kill marked FAIL (no Tune trial ran them)")
    sweep["rounds"][-1]["done"] = errors == 0
    write_sweep(storage, sweep)
    lost = tracker.end_sweep("FINISHED" if errors == 0 else "FAILED", summary["mlflow_summary"],
                             summary["artifacts"])
    print(f"results: {storage}\nMLflow:  mlflow ui --backend-store-uri {sweep['mlflow']['uri']} "
          "(serves on 127.0.0.1:5000)")
    if lost:
        print(f"{lost} MLflow write(s) failed (the fxray.mlhelper lines above say why); "
              f"{storage}/results.json has every fold", file=sys.stderr)
    if errors:
        print(f"{errors} trial(s) failed (see {storage}); --resume retries them", file=sys.stderr)
    return 1 if errors or lost else 0


def start_failed(error: str, storage: Path) -> int:
    """A sweep that could not start (StartFailed): its one error line, how to go on, exit 1."""
    print(f"fxray.tune: error: {error}\n"
          f"fix it, then continue with: python -m fxray.tune --storage {storage} --resume", file=sys.stderr)
    return 1


def last_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def watch_workers(workers: Workers, t0: float, phases: dict) -> None:
    """In a thread: wait until every worker has loaded the data, then say so; on a load
    error remember its last line, where Ray puts the cause (StartFailed then stops the sweep)."""
    import threading

    def wait():
        try:
            workers.stats(timeout=600)
        except Exception as e:  # noqa: BLE001 (any failure to start is reported the same way)
            WORKER_FAILURE.append(last_line(e))
            return
        phases["workers_ready"] = time.time()
        print(f"workers ready in {time.time() - t0:.1f}s (data put once, loaded once per worker)", flush=True)

    threading.Thread(target=wait, name="fxray-watch-workers", daemon=True).start()


def make_fold_dicts(file, exp, market) -> list[dict]:
    from fxray.folds import make_folds

    try:
        return [f.as_dict() for f in make_folds(market.ts, exp.folds)]
    except FoldError as e:
        raise UsageError(f"{file}: folds: {e} ({market.path})") from None


def locate(args, overrides) -> tuple[str, Path, dict | None]:
    """(experiment file, run directory, its sweep.json or None). A sweep that exists
    runs from its saved copy of the experiment file, so a resume is the same sweep."""
    storage = Path(args.storage).absolute() if args.storage else None
    sweep = read_sweep(storage) if storage else None
    if sweep is None:
        file = args.experiment or expmod.default_experiment()
        storage = storage or (Path("runs") / expmod.load(file, "gpu", overrides).name).absolute()
        sweep = read_sweep(storage)
    if args.resume and sweep is None:
        raise UsageError(f"{storage}: no sweep to resume (no sweep.json); run without --resume")
    if sweep is None:
        return file, storage, None
    saved = storage / "experiment.yaml"
    if args.experiment and (expmod.read_yaml(args.experiment) is not None  # missing/bad: an error too
                            and Path(args.experiment).read_text() != saved.read_text()):
        raise UsageError(f"{args.experiment}: differs from the file this sweep started with ({saved}); "
                         "use --storage DIR for a new sweep")
    if not args.resume and not sweep["rounds"][-1]["done"]:
        raise UsageError(f"{storage}: the last sweep was interrupted; pass --resume to finish it, "
                         "or --storage DIR to start another")
    return str(saved), storage, sweep


def same_trials(args, storage: Path, sweep: dict | None, overrides: dict) -> dict | None:
    """--same-trials RESULTS, read and checked against the flags; it sets the trials and
    (unless --seed) the training seed of the new sweep. None without the flag."""
    if not args.same_trials:
        return None
    if args.resume:
        raise UsageError("--same-trials: drop it with --resume (a resumed sweep runs what it started with)")
    if sweep is not None:
        raise UsageError(f"--same-trials starts a new sweep and {storage} holds one: pass --storage DIR")
    try:
        same = read_same_trials(args.same_trials)
    except ValueError as e:
        raise UsageError(str(e)) from None
    n = len(same["trials"])
    if args.trials not in (None, n):
        raise UsageError(f"--trials {args.trials}: --same-trials runs the trials of {args.same_trials} "
                         f"({n}); drop --trials")
    if args.profile not in ("auto", same["profile"]):
        raise UsageError(f"--profile {args.profile}: {args.same_trials} ran the {same['profile']} profile; "
                         "drop --profile")
    overrides["sweep.trials"] = n
    overrides.setdefault("sweep.seed", same["seed"])
    return same


def read_sweep(storage: Path) -> dict | None:
    path = storage / "sweep.json"
    return json.loads(path.read_text()) if path.exists() else None


def write_sweep(storage: Path, sweep: dict) -> None:
    tmp = storage / ".sweep.json.tmp"
    tmp.write_text(json.dumps(sweep, indent=1))
    os.replace(tmp, storage / "sweep.json")  # atomic: a reader never sees half a file


def start_ray(args) -> None:
    """Join a cluster (--address) or start a local one; dashboard off, namespace fixed
    (the driver's callbacks find the worker pool by name)."""
    # Our SweepLog prints a line per fold: Tune's own tables and its warning about the
    # per-fold state snapshot (wanted: it makes --resume lose nothing) would drown it.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's default TensorBoard logger imports tensorboardX, which imports torch into the
    # driver (~10 s on the GPU machines): make_tuner asks for the JSON and CSV loggers only.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    kw = dict(namespace="fxray", include_dashboard=False, log_to_driver=True, configure_logging=False)
    if args.address:
        host, _, port = args.address.rpartition(":")
        if host and port.isdigit():  # Ray retries a dead address for minutes: probe it first
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
            except OSError as e:
                raise UsageError(f"--address {args.address}: nothing answers there ({e.strerror or e}); "
                                 "is the cluster up (ray status)?") from None
        try:
            ray.init(address=args.address, **kw)
        except (ConnectionError, RuntimeError) as e:
            raise UsageError(f"--address {args.address}: cannot join the Ray cluster "
                             f"({str(e).strip().splitlines()[0]}); is it up (ray status)?") from None
    else:
        ray.init(num_cpus=args.num_cpus, num_gpus=args.num_gpus, **kw)


def prepare_storage(storage: Path, sweep, exp, file, profile, market, data_path, folds, args, same=None) -> dict:
    """Create the run directory (first run) or open a new round (an extension) or keep
    the last one (a resume). Everything here is validated already: nothing is half-written."""
    from fxray import mlruns

    round_names = [r["name"] for r in sweep["rounds"]] if sweep else []
    if sweep is None:
        storage.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, storage / "experiment.yaml")
        tags = {"fxray.experiment": exp.name, "fxray.dataset_hash": market.content_hash,
                "fxray.profile": profile, "fxray.storage": str(storage),
                "fxray.folds": json.dumps([[f["k"], f["train"], f["val"], f["test"]] for f in folds])}
        commit = mlruns.git_commit()
        if commit:
            tags["mlflow.source.git.commit"] = commit
        sweep = {"experiment": exp.name, "profile": profile, "experiment_file": str(Path(file).absolute()),
                 "data": {"path": str(Path(data_path).absolute()), "content_hash": market.content_hash,
                          "n_bars": market.n_bars},
                 "folds": folds, "base": exp.dqn.as_dict(), "rounds": [],
                 "mlflow": {"uri": mlruns.tracking_uri(), "experiment": exp.name, "tags": tags}}
    if not args.resume:
        name = "tune" if not round_names else f"tune-{len(round_names) + 1}"
        sweep["rounds"].append({"name": name, "trials": exp.sweep.trials, "seed": exp.sweep.seed,
                                "done": False, "started": time.time()})
        if same:  # the parent run says so too (its tags are the sweep's: the first round's)
            sweep["rounds"][-1]["same_trials"] = {"from": same["from"], "trials": same["trials"]}
            sweep["mlflow"]["tags"].setdefault("fxray.same_trials", same["from"])
    write_sweep(storage, sweep)
    return sweep



if __name__ == "__main__":
    sys.exit(main())
