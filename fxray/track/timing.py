"""Where a sweep's wall time went: results.json's `time_breakdown` (docs/tune.md, "Where the time goes").

    breakdown = time_breakdown(started, wall_s, phases, workers, trials)

    wall_s = startup_s + fold_setup_s + learner_s + backtest_s + overhead_s + idle_s

Built from what the sweep records: the driver's start-up milestones (`phases`, unix times),
each FoldWorker's stats (fxray.sweep.workers: the populations its device thread ran,
`population_runs` [start, end, size, kind]; none in a results.json from before them), and each
fold's timings (`trials[].folds[].timings`: fold_switch_s, train_s, eval_s, fold_time_s, and the
worker and population it ran in). The driver's clock runs from `started` to `started + wall_s`;
the sweep's first fold starts at `lo`, its last fold ends at `hi`:

    [started, lo)   start-up, for every worker
    [lo, hi)        each worker's own time: its fold runs split by part (its folds' timings), the
                    gaps between its runs (overhead: the trial's report, Tune, Optuna, the lease
                    and Ray's call), the gaps before its first fold and after its last (idle: no
                    trial had a fold for it), a warm-up run (start-up)
    [hi, end)       overhead: Tune ending, then the driver's results

A worker's seconds add up to wall_s; each part is the mean over the workers (one worker of
two training the whole sweep is half the wall in fold work, half idle), so the parts add up to
wall_s too. No Ray, no torch here: the driver calls it, scripts/bench.py --sweep prints it.
"""

from __future__ import annotations

from collections import Counter

SETUP = ("fold_switch", "abstained", "other")  # fold_setup_s's parts (worker_time)
# the driver's start-up milestones in the order it reaches them (fxray.sweep.driver), each part
# named for what ends at it
STARTUP = (
    ("validated", "validate"),  # flags, experiment, data opened, folds, the store checked
    ("ray_up", "ray"),
    ("workers_created", "workers"),  # the data into the object store, the FoldWorkers created
    ("tune_started", "run_dir"),  # sweep.json, the MLflow writer let go, what is left to run
)


def time_breakdown(started: float, wall_s: float, phases: dict, workers: list, trials: list) -> dict:
    """results.json's time_breakdown (seconds; see the module's docstring). `trials`: results.json's."""
    end = started + wall_s
    logs = [w.get("population_runs", []) for w in workers]
    folds = [r for log in logs for r in log if r[3] != "warmup"]
    lo = min(max(min((r[0] for r in folds), default=end), started), end)
    hi = min(max(max((r[1] for r in folds), default=lo), lo), end)
    timings = fold_timings(trials, started, len(workers))
    total: Counter = Counter()
    busy = []
    for log, parts in zip(logs, timings):
        mine = worker_time(log, parts, lo, hi)
        busy.append(sum(v for k, v in mine.items() if k not in ("warmup", "between", "idle")) / max(wall_s, 1e-9))
        total.update(mine)
    mean = {k: v / max(len(workers), 1) for k, v in total.items()}
    between, tail = mean.get("between", 0.0), end - hi  # tail: [hi, end), Tune ending then the driver's results
    done = phases.get("tune_done")
    tune_end = min(max(done - hi, 0.0), tail) if done else 0.0
    return {
        "startup_s": (lo - started) + mean.get("warmup", 0.0),
        "fold_setup_s": sum(mean.get(k, 0.0) for k in SETUP),
        "learner_s": mean.get("learner", 0.0) + mean.get("cancelled", 0.0),
        "backtest_s": mean.get("backtest", 0.0),
        "overhead_s": between + tail,
        "idle_s": mean.get("idle", 0.0),
        "workers": len(workers),
        "busy_share": busy,  # per worker: its fold runs / wall_s
        "startup_parts": startup_parts(started, lo, phases) | {"warmup": mean.get("warmup", 0.0)},
        "fold_setup_parts": {k: mean.get(k, 0.0) for k in SETUP},
        "overhead_parts": {"between_folds": between, "tune_end": tune_end, "results": tail - tune_end},
    }


def fold_timings(trials: list, started: float, n_workers: int) -> list[Counter]:
    """Per worker, the seconds its folds of this session report by part: fold_switch, learner
    (train_s), backtest (eval_s), abstained (a fold not trained: its whole fold_time_s). A
    population's members share its run and each reports it: each counts 1/size of it."""
    out = [Counter() for _ in range(n_workers)]
    for fold in (f for t in trials for f in t["folds"]):
        timings, worker = fold.get("timings") or {}, fold.get("worker", -1)
        if not 0 <= worker < n_workers or (timings.get("trial_start") or 0.0) < started:
            continue  # logged by an earlier session of the sweep (its trial started before this one)
        share = 1.0 / max(fold.get("population") or 1, 1)
        if fold.get("epochs", 0) == 0 and fold.get("status") == "ok":  # abstained: nothing trained
            out[worker]["abstained"] += share * timings.get("fold_time_s", 0.0)
            continue
        for part, key in (("fold_switch", "fold_switch_s"), ("learner", "train_s"), ("backtest", "eval_s")):
            out[worker][part] += share * timings.get(key, 0.0)
    return out


def worker_time(log: list, parts: Counter, lo: float, hi: float) -> Counter:
    """One worker's seconds in [lo, hi): its fold runs by part (`parts`, what its folds report;
    "other" the rest of the runs: trainers built, CUDA graphs captured, seed ensembles' mean-Q
    backtests, checkpoints), cancelled and warm-up runs, the gaps between fold runs ("between")
    and before its first and after its last ("idle"). Its runs never overlap (one device thread)."""
    runs = sorted((max(a, lo), min(b, hi), kind) for a, b, _size, kind in log if b > lo and a < hi)
    fold = [(a, b) for a, b, kind in runs if kind != "warmup"]
    first, last = (fold[0][0], max(b for _, b in fold)) if fold else (hi, hi)
    out: Counter = Counter()
    t = lo
    for a, b, kind in runs:
        if a > t:
            out["idle" if a <= first or t >= last else "between"] += a - t
        if kind in ("warmup", "cancelled"):  # cancelled: a population no trial wanted (no fold logged)
            out[kind] += b - a
        t = max(t, b)
    out["idle"] += hi - t
    fold_s = sum(b - a for a, b, kind in runs if kind not in ("warmup", "cancelled"))
    measured = sum(parts.values())
    scale = min(1.0, fold_s / measured) if measured > 0 else 0.0  # a population's mean member is < its run
    out.update({k: v * scale for k, v in parts.items()})
    out["other"] += fold_s - measured * scale
    return out


def startup_parts(started: float, lo: float, phases: dict) -> dict:
    """[started, lo) by the driver's milestones, in order; what is left is "first_fold": Tune
    starts its trials while the workers import torch, load the data and warm up."""
    out, t = {}, started
    for key, name in STARTUP:
        if isinstance(phases.get(key), (int, float)):
            at = min(max(phases[key], t), lo)
            out[name], t = at - t, at
    out["first_fold"] = lo - t
    return out
