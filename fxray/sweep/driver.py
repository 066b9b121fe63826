"""The sweep driver, in four steps (fxray.tune is its command line):

    plan = validate(args)           everything checked, nothing started: a bad input is one line, exit 2
    run = start(plan, stack)        MLflow writer, Ray, the data in the object store, FoldWorkers,
                                    the run directory (sweep.json)
    ok = fit(run)                   Tune + Optuna + ASHA over the trials (fxray.sweep.tuner)
    return finish(run)              results.json & co., the round marked done, MLflow's parent ended

Start-up overlaps what it can: the writer imports mlflow while Ray starts; the workers
import torch and load the data while Tune starts its trial processes; a worker that
cannot load or a store that cannot open stops the sweep (StartFailed).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

from fxray.data import cache, synth
from fxray.data.calendar import Calendar
from fxray.rl import experiment as expmod
from fxray.rl.overrides import set_overrides
from fxray.sweep import rundir, vote
from fxray.sweep.cluster import MLFLOW_FAILURE, WORKER_FAILURE, plan_workers, start_ray
from fxray.sweep.leases import Workers
from fxray.sweep.logs import capture_stdout, known_ray_lines
from fxray.sweep.rounds import resume_plan, round_state, trials_started
from fxray.sweep.rundir import UsageError
from fxray.sweep.workers import put_market, start_workers
from fxray.track import results
from fxray.track import runs as mlruns
from fxray.track.links import next_steps
from fxray.track.report import mlflow_report, next_commands
from fxray.track.writer import Writer


@dataclass
class Plan:
    """What `validate` decided; nothing is started yet."""

    args: object
    overrides: dict
    file: str  # the experiment file (a sweep's saved copy when it exists)
    storage: Path
    sweep: dict | None  # its sweep.json, or None for a new sweep
    same: dict | None  # --same-trials: what to replay
    data_path: str | None  # None: the embedded market, made once the profile is known
    market: object | None
    uri: str  # the MLflow store
    t_start: float = field(default_factory=time.time)
    phases: dict = field(default_factory=dict)  # unix times of the start-up steps, for results.json
    mlflow_extra: dict = field(default_factory=dict)  # a new sweep's extra parent tags / run name (a placebo's)


@dataclass
class Run:
    """A started sweep: what `fit` and `finish` need."""

    plan: Plan
    exp: object
    sweep: dict
    workers: Workers
    writer: object
    arrays_ref: object  # held for the whole sweep: a restarted worker loads it again
    calendar: object  # fxray.data.calendar.Calendar of the data: what the pooled statistics annualise by
    warmups: list  # the workers' warm-up calls (ObjectRefs), one per worker


def validate(args, import_s: float = 0.0) -> Plan:
    """Every check that needs nothing started: flags, run directory, experiment, data, folds, store."""
    from fxray.cli import check_file_out

    flags = {"sweep.trials": args.trials, "sweep.seed": args.seed, "sweep.workers_per_gpu": args.workers_per_gpu}
    flags.update({"sweep.population": args.population, "name": args.name})
    overrides = {k: v for k, v in flags.items() if v is not None}
    if args.address and (args.num_cpus or args.num_gpus is not None):
        raise UsageError(
            "--num-cpus/--num-gpus size a local Ray; with --address the cluster's own "
            "resources are used: drop one of them"
        )
    file, storage, sweep = rundir.locate(args, overrides)
    if sweep and args.tracking_uri and os.environ.get("MLFLOW_TRACKING_URI") != sweep["mlflow"]["uri"]:
        raise UsageError(f"--tracking-uri: this sweep logs to {sweep['mlflow']['uri']}; drop --tracking-uri")
    overrides.update(set_overrides(args.set) if args.set else {})
    if sweep:  # a resumed or extended sweep is the same sweep: its stored overrides, none changed
        overrides = rundir.reuse_overrides(storage, sweep, overrides, args.resume)
    same = rundir.same_trials(args, storage, sweep, overrides)
    exp = expmod.load(file, "gpu", overrides)  # validates both profiles before anything starts
    if not 0 <= exp.sweep.seed < 2**32:
        raise UsageError(f"{file}: sweep.seed: {exp.sweep.seed} is not a seed; use an integer in [0, 4294967295]")
    for line in exp.warnings():
        print(f"fxray.tune: warning: {line}", file=sys.stderr)
    searched = [k for k in overrides if k.split(".", 1)[-1] in exp.space() and k.startswith(exp.config.SECTION + ".")]
    if searched:
        raise UsageError(f"--set {searched[0]}: that field is searched (search: in {file}); drop it from one of them")
    data_path = args.data or (sweep and sweep["data"]["path"]) or (same and same["data"]["path"]) or exp.data_path
    if args.data and sweep and Path(args.data).absolute() != Path(sweep["data"]["path"]):
        raise UsageError(
            f"--data {args.data}: this sweep ran on {sweep['data']['path']}; use --storage DIR for a new sweep"
        )
    if not args.data and (sweep or same) and exp.data_path is None and data_path and not Path(data_path).exists():
        # the embedded market of a sweep that ran on another machine (a fresh GPU host): generated
        # again here from the spec of the profile it ran (the cpu section may name another market);
        # its content hash is checked against the sweep's below
        ran = expmod.load(file, (sweep or same)["profile"], overrides)
        data_path = str(synth.ensure_default(ran.synth, log=print))
    if data_path and not Path(data_path).exists():
        where = "--data" if args.data else f"{file}: data.path"
        raise UsageError(f"{where}: {data_path} does not exist (build it with `fxray data build`)")
    # structure, metadata, values and content hash checked here: a bad file fails before Ray
    market = cache.open(data_path) if data_path else None
    if market is not None:
        rundir.make_fold_dicts(file, exp, market)
        if sweep and sweep["data"]["content_hash"] != market.content_hash:
            raise UsageError(
                f"{data_path}: its contents changed since the sweep started "
                f"(hash {market.content_hash} != {sweep['data']['content_hash']})"
            )
        if same:
            same_exp = expmod.load(file, same["profile"], overrides)
            same_folds = rundir.make_fold_dicts(file, same_exp, market)
            rundir.check_same_work(same, same_exp, same_folds, market.content_hash, data_path)
    uri = sweep["mlflow"]["uri"] if sweep else mlruns.tracking_uri()
    try:
        check_file_out(args.json, "--json")  # found now, not after the whole sweep
        mlruns.check_uri(uri)
    except ValueError as e:
        raise UsageError(str(e)) from None
    plan = Plan(args, overrides, file, storage, sweep, same, data_path, market, uri)
    plan.phases.update(ray_tune_import_s=import_s, validated=time.time())
    return plan


def start(plan: Plan, stack: contextlib.ExitStack) -> Run:
    """The writer, Ray, the data, the workers and the run directory, in that order."""
    args, phases, storage = plan.args, plan.phases, plan.storage

    def opened(parent_id: str) -> None:  # in the writer's reader thread, after go(): `run` exists
        if run.sweep["mlflow"].get("parent_run_id") is None:
            run.sweep["mlflow"]["parent_run_id"] = parent_id
            rundir.write_sweep(storage, run.sweep)
        phases["mlflow_ready"] = time.time()

    # first, so that importing mlflow overlaps Ray's start; it opens the store once sweep.json exists
    writer = stack.enter_context(Writer(storage, on_open=opened, on_error=MLFLOW_FAILURE.append, wait_for_go=True))
    # Tune's and Optuna's import too (seconds on the GPU machines): this process mostly waits on
    # Ray's while they start; fit() imports the tuner (done by then, or it waits for this thread)
    threading.Thread(target=importlib.import_module, args=("fxray.sweep.tuner",), daemon=True).start()
    start_ray(args)  # a local session's Ray processes end with us, however we end (its reaper)
    phases["ray_up"] = time.time()
    resources = ray.cluster_resources()
    auto = "gpu" if resources.get("GPU", 0) >= 1 else "cpu"
    profile = (plan.sweep or plan.same or {}).get("profile") or (auto if args.profile == "auto" else args.profile)
    exp = expmod.load(plan.file, profile, plan.overrides)
    if plan.market is None:  # the embedded market, now that the profile is known
        plan.data_path = str(synth.ensure_default(exp.synth, log=print))
        plan.market = cache.open(plan.data_path)
    market, folds, s = plan.market, rundir.make_fold_dicts(plan.file, exp, plan.market), exp.sweep
    trials = plan.sweep["rounds"][-1]["trials"] if args.resume else s.trials
    wplan = plan_workers(
        resources, s.workers_per_gpu, s.cpu_per_trial, args.cpu_workers, s.trials_per_worker, s.population, trials
    )
    if wplan.kind == "gpu" and wplan.population > 1:
        print(
            f"fxray.tune: note: populations of up to {wplan.population} trials on a GPU: each step is the "
            "one-config step to float rounding, but over a fold the rounding grows: a fold's Sharpe may differ "
            "from a one-trial-per-worker sweep's by several units (docs/tune.md, 'Populations')",
            file=sys.stderr,
            flush=True,
        )
    cfg = exp.config
    print(
        f"{profile.upper()} profile: {trials} trials x {len(folds)} folds x {cfg.epochs} epochs "
        f"x {cfg.steps_per_epoch} steps ({cfg.num_envs} envs, batch {cfg.batch_size}) "
        f"on {wplan.describe()}; data {plan.data_path} ({market.n_bars:,} bars)"
        + (" -- resuming" if args.resume else "")
        + (f" -- the trials of {plan.same['from']}, each for as many folds as there" if plan.same else ""),
        flush=True,
    )
    t0 = time.time()
    arrays_ref = put_market(market)  # ONCE per sweep; the workers get zero-copy views
    with known_ray_lines():  # Ray's false alarm about the constructor's ref (fxray.sweep.logs)
        workers = start_workers(arrays_ref, wplan, cfg.dtype)
    # pays a device process's one-time costs while Tune starts (unordered with the trials' folds)
    warmups = [handle.warmup.remote(cfg.as_dict(), folds) for handle in workers.handles]
    phases["workers_created"] = time.time()
    # while the workers import torch and load the data: the run directory (then the writer
    # opens the store), then Tune starts its trial processes; a first fold waits on its worker
    sweep = rundir.prepare_storage(plan, exp, profile, folds, device=wplan.kind)
    run = Run(plan, exp, sweep, workers, writer, arrays_ref, Calendar.of(market.ts), warmups)
    writer.go()  # the sweep is checked and recorded: the store may be opened now
    watch_workers(workers, t0, phases)
    return run


def fit(run: Run) -> int | None:
    """Tune over the round's trials; None when it ran, else the exit code of a sweep that stopped."""
    from fxray.sweep.tuner import debug_log, make_tuner

    plan, storage, sweep = run.plan, run.plan.storage, run.sweep
    # A sqlite store fails at once if it fails, seconds before a first fold could be
    # reported. A tracking server can take minutes to fail (MLflow retries): folds
    # reported meanwhile would never reach it, not even after --resume. Wait for it.
    if mlruns.sqlite_path(plan.uri) is None and not run.writer.wait_open():
        return start_failed(f"MLflow store {plan.uri} could not be opened: {MLFLOW_FAILURE[0]}", storage)
    debug_log(os.environ.get("FXRAY_TUNE_DEBUG_LOG"))
    left = resume_plan(storage, sweep)  # what is left of the round, from fxray's records
    if left.resumed or left.ended:
        print(
            f"resuming: {len(left.resumed)} trial(s) continue after their last logged fold, "
            f"{len(left.ended)} ended from the log, {left.n_new} to sample",
            flush=True,
        )
    try:
        plan.phases["tune_started"] = time.time()
        if left.resumed or left.n_new:
            make_tuner(storage, sweep, run.exp, run.workers, left, run.calendar.periods_per_year).fit()
        plan.phases["tune_done"] = time.time()
    except Exception as e:  # Tune gives up on e.g. an OOM kill of a trial; its state is saved
        run.writer.finish("FAILED")
        print(
            f"fxray.tune: the sweep stopped: {type(e).__name__}: {cache.first_line(e)}\n"
            f"continue it with: python -m fxray.tune --storage {storage} --resume",
            file=sys.stderr,
        )
        return 1
    if MLFLOW_FAILURE:
        return start_failed(f"MLflow store {plan.uri} could not be opened: {MLFLOW_FAILURE[0]}", storage)
    if WORKER_FAILURE:
        run.writer.finish("FAILED")
        return start_failed(f"a FoldWorker could not load the data: {WORKER_FAILURE[0]}", storage)
    return None


def finish(run: Run) -> int:
    """The end of a round: results files, the round marked done, the MLflow parent ended."""
    plan, storage, sweep = run.plan, run.plan.storage, run.sweep
    unfinished, errors = round_state(storage, sweep)
    # the store opens while Tune runs; on a loaded box a short sweep can end first. The end is
    # written through it anyway: wait for it, so that results.json's phases say when it opened
    run.writer.wait_open(timeout=120)
    # Ray orders a worker's calls per caller only: a warm-up that reached its worker after the
    # trials' folds may still be queued; the workers' stats account for it once it has run
    ray.wait(run.warmups, num_returns=len(run.warmups), timeout=120)
    with capture_stdout() as screen:  # the last screen, also the parent run's summary.md
        summary = results.write_results(
            storage,
            sweep,
            results.load_records(storage),
            run.workers.stats(),
            time.time() - plan.t_start,
            plan.args.json,
            started=plan.t_start,
            phases=plan.phases,
            periods_per_year=run.calendar.periods_per_year,
            n_trials_started=trials_started(storage),
            ensemble=vote.on_worker(run.workers),
            asha=None if sweep["rounds"][-1].get("same_trials") else asha_rungs(run.exp, len(sweep["folds"])),
        )
    if unfinished:
        run.writer.finish("KILLED")
        print(
            f"interrupted: {unfinished} trial(s) unfinished; resume with: python -m fxray.tune "
            f"--storage {storage} --resume",
            file=sys.stderr,
        )
        return 130
    # finished: what a later --resume says ("nothing to resume")
    sweep["rounds"][-1].update(done=errors == 0, finished=time.time())
    rundir.write_sweep(storage, sweep)
    path = storage / "results.json"
    results_json = json.loads(path.read_text()) if path.exists() else None
    # top: the trials the sweep's last lines and summary.md link to
    report = {"screen": screen.getvalue(), **mlflow_report(results_json, len(sweep["folds"])), "top": 5}
    lost = run.writer.finish(
        "FINISHED" if errors == 0 else "FAILED", summary["mlflow_summary"], summary["artifacts"], report=report
    )
    w = run.writer
    files = [f for f in ("results.json", "folds.csv", "equity.png", "summary.md") if (storage / f).exists()]
    print(f"results: {storage} ({', '.join(files)})")
    print(next_steps(sweep["mlflow"]["uri"], w.experiment_id, w.parent_id, w.top, next_commands(results_json, w.top)))
    if lost:
        why = (
            f"the MLflow store never opened ({MLFLOW_FAILURE[0] if MLFLOW_FAILURE else 'the writer exited'})"
            if lost < 0
            else f"{lost} MLflow write(s) failed (the fxray.track.writer lines above say why)"
        )
        print(f"{why}; {storage}/results.json has every fold", file=sys.stderr)
    if errors:
        print(f"{errors} trial(s) failed (see {storage}); --resume retries them", file=sys.stderr)
    return 1 if errors or lost else 0


def asha_rungs(exp, n_folds: int) -> dict:
    """results.json's asha block (less its counts): ASHA's settings and the folds done at each
    rung it may stop a trial at (fxray.sweep.trial.asha_stops, less the last fold)."""
    from fxray.sweep.trial import asha_stops

    grace, rf = min(exp.sweep.grace_folds, n_folds), exp.sweep.reduction_factor
    rungs = [s for s in asha_stops(n_folds, grace, rf) if s < n_folds]
    return {"grace_folds": grace, "reduction_factor": rf, "rungs": rungs}


def run_sweep(plan: Plan) -> int:
    """start, fit, finish; whatever was started ends with the run, however it ends, and its
    FoldWorkers and their pool when it ends (their devices go to the next sweep: a placebo's)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(rundir.hold(plan.storage, plan.sweep))  # one sweep at a time in a run directory
        run = start(plan, stack)
        stopped = fit(run)
        code = stopped if stopped is not None else finish(run)
    run.workers.stop()
    return code


def start_failed(error: str, storage: Path) -> int:
    """A sweep that could not start (StartFailed): its one error line, how to go on, exit 1."""
    print(
        f"fxray.tune: error: {error}\nfix it, then continue with: python -m fxray.tune --storage {storage} --resume",
        file=sys.stderr,
    )
    return 1


def watch_workers(workers: Workers, t0: float, phases: dict) -> None:
    """In a thread: wait until every worker has loaded the data, then say so; on a load
    error remember its last line, where Ray puts the cause (StartFailed then stops the sweep)."""

    def wait():
        try:
            workers.stats(timeout=600)
        except Exception as e:  # noqa: BLE001 (any failure to start is reported the same way)
            WORKER_FAILURE.append(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
            return
        phases["workers_ready"] = time.time()
        print(f"workers ready in {time.time() - t0:.1f}s (data put once, loaded once per worker)", flush=True)
        # what the sweep's end imports (the verdict's bootstraps, the equity plot: seconds on the
        # GPU machines), imported here while the trials train, not after them
        with contextlib.suppress(ImportError):
            import arch.bootstrap  # noqa: F401

            from fxray.track.report import pyplot

            pyplot()

    threading.Thread(target=wait, name="fxray-watch-workers", daemon=True).start()
