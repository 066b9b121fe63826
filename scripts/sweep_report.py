"""Where a sweep's wall time went, from its results.json (what `fxray.tune --json` writes).

    python scripts/sweep_report.py runs/default/results.json [more.json ...]
    python scripts/sweep_report.py --speedup one_gpu.json two_gpus.json

Each FoldWorker logs every call it served (start, end, trial token, fold, status),
so the report splits each worker's share of the wall time into:

  training      inside train_fold for folds that counted (the device working for the sweep)
  cancelled     folds queued ahead of a trial that was then stopped (wasted device time;
                since trials free their worker before each report ASHA can act on, only
                a stop from elsewhere, e.g. Ctrl-C, leaves any)
  warmup        the short fold each worker runs at start (one-time kernel loading, cuBLAS,
                first graph capture), while Tune starts its first trials
  startup       driver start -> the first trial's fold, less warmup (Ray, data into the
                object store, workers importing torch and uploading, MLflow, Tune start)
  between       gaps between two leases on one worker: the dispatch overhead (a trial's
                end or its report at an ASHA rung, the lease hand-over, the next submit)
  within        gaps between two folds of one lease (reporting; ~0 once folds are queued)
  tail          the last fold's end -> results written (t_last_fold_end, then Tune's end
                t_tune_done)

and prints the per-trial dispatch gap (mean, median, p90) and when the start-up
milestones happened (validated, ray_up, workers_created, mlflow_ready,
tune_started, workers_ready; the slowest worker's constructor start, torch
imported, data loaded, and the last warmup's end (after the first trial fold when
that reached the worker first: Ray does not order the two); the first trial function
started, the first trial fold; seconds after the run's clock started).
scripts/replay.py times the same folds in a plain loop, for the overhead against no
Ray at all.

--speedup A B compares two sweeps: whether they did the same work (the same configs,
each for the same number of folds: one is the other's `fxray.tune --same-trials`
replay, or they happened to take the same path), the wall speedup A -> B, each one's
work rate (seconds inside train_fold per second of wall), and how far apart the val
Sharpe of the folds both trained is.
"""

from __future__ import annotations

import json
import statistics
import sys


def report(path: str) -> dict:
    r = json.loads(open(path).read())
    workers = r.get("workers") or []
    n_workers = max(len(workers), 1)
    wall = r["wall_s"]
    out = {
        "path": path,
        "experiment": r["experiment"],
        "profile": r["profile"],
        "trials": r["n_trials"],
        "folds_trained": sum(len(t["folds"]) for t in r["trials"]),
        "workers": n_workers,
        "gpu_workers": sum(1 for w in workers if "cuda" in str(w.get("device", ""))),
        "wall_s": wall,
        "trials_per_hour": 3600 * r["n_trials"] / wall,
    }
    chosen = r.get("best") or {}  # the chosen trial (results.json keeps the key `best`): the last screen's numbers
    out.update(chosen_trial=chosen.get("trial_id"), chosen_score=chosen.get("score"))
    out["chosen_pooled_test_sharpe"] = (chosen.get("test") or {}).get("sharpe")
    calls = [w.get("calls") or [] for w in workers]
    if not any(calls) or r.get("started") is None:  # results.json from before the call log
        # a population's members share its wall: count it once
        fold_s = sum(
            (f["timings"].get("fold_time_s") or 0.0) / f.get("population", 1) for t in r["trials"] for f in t["folds"]
        )
        out["training_share"] = fold_s / (wall * n_workers)
        return out
    start, end = r["started"], r["started"] + wall
    parts = dict.fromkeys(("training", "cancelled", "warmup", "startup", "between", "within", "tail"), 0.0)
    dispatch = []
    for log in calls:
        log = sorted(log)
        if not log:
            parts["startup"] += wall
            continue
        parts["startup"] += log[0][0] - start
        parts["tail"] += end - log[-1][1]
        for t0, t1, _token, _k, status in log:
            parts[status if status in ("cancelled", "warmup") else "training"] += t1 - t0
        for prev, cur in zip(log, log[1:]):
            gap = max(cur[0] - prev[1], 0.0)
            if prev[4] == "warmup":
                parts["startup"] += gap
            elif cur[2] == prev[2]:
                parts["within"] += gap
            else:
                parts["between"] += gap
                dispatch.append(gap)
    runs = [w.get("population_runs") or [] for w in workers]
    if any(runs):  # populations: a call spans its wait in the queue too; the device's time is the runs'
        for k in ("training", "cancelled", "warmup", "between", "within"):
            parts[k] = 0.0
        for kind in ("training", "cancelled", "warmup"):
            parts[kind] = sum(t1 - t0 for log in runs for t0, t1, _size, k in log if k == kind)
        parts["between"] = wall * n_workers - sum(parts.values())  # the device idle between populations
        out["population_sizes"] = [size for log in runs for _t0, _t1, size, k in log if k != "warmup"]
    for k, v in parts.items():
        out[f"{k}_share"] = v / (wall * n_workers)
    first = min(c[0] for log in calls for c in log if c[4] != "warmup")
    # start-up milestones, seconds after the run's clock started (Ray/Tune imports are before it)
    for k, v in (r.get("phases") or {}).items():
        out[f"t_{k}"] = v if k.endswith("_s") else v - start
    for k in ("init", "imported", "loaded"):  # the slowest worker's start-up steps
        steps = [w["timeline"][k] for w in workers if w.get("timeline")]
        if steps:
            out[f"t_worker_{k}"] = max(steps) - start
    warm = [c[1] for log in calls for c in log if c[4] == "warmup"]
    if warm:
        out["t_workers_warm"] = max(warm) - start
    starts = [(f.get("timings") or {}).get("trial_start") for t in r["trials"] for f in t["folds"]]
    if any(starts):  # when Tune's first trial process ran the trial function
        out["t_first_trial_started"] = min(x for x in starts if x) - start
    out["t_first_trial_fold"] = first - start
    last = max(c[1] for log in calls for c in log)
    out["t_last_fold_end"] = last - start  # then Tune ends (t_tune_done), then results are written
    out["training_share_after_startup"] = parts["training"] / ((last - first) * n_workers)
    out["cancelled_folds"] = sum(1 for log in calls for c in log if c[4] == "cancelled")
    if dispatch:
        dispatch.sort()
        out["dispatch_gap_mean_s"] = statistics.fmean(dispatch)
        out["dispatch_gap_median_s"] = statistics.median(dispatch)
        out["dispatch_gap_p90_s"] = dispatch[int(0.9 * (len(dispatch) - 1))]
    return out


def speedup(path_a: str, path_b: str) -> dict:
    """Sweep A against sweep B: same work?, wall speedup A -> B, work rates, val Sharpe gap."""
    a, b = (json.loads(open(p).read()) for p in (path_a, path_b))

    def folds(r):  # {sampled config: [val Sharpe per fold]}
        return {json.dumps(t["sampled"], sort_keys=True): [f["val"]["sharpe"] for f in t["folds"]] for t in r["trials"]}

    def fold_s(r):
        return sum(f["timings"].get("fold_time_s") or 0.0 for t in r["trials"] for f in t["folds"])

    fa, fb = folds(a), folds(b)
    both = [(x, y) for key in fa.keys() & fb.keys() for x, y in zip(fa[key], fb[key])]
    return {
        "same_work": {k: len(v) for k, v in fa.items()} == {k: len(v) for k, v in fb.items()},
        "folds_a": sum(map(len, fa.values())),
        "folds_b": sum(map(len, fb.values())),
        "wall_a_s": a["wall_s"],
        "wall_b_s": b["wall_s"],
        "speedup": a["wall_s"] / b["wall_s"],
        "work_rate_a": fold_s(a) / a["wall_s"],
        "work_rate_b": fold_s(b) / b["wall_s"],
        "work_rate_speedup": (fold_s(b) / b["wall_s"]) / (fold_s(a) / a["wall_s"]),
        "val_sharpe_max_abs_diff": max((abs(x - y) for x, y in both), default=None),
    }


def main(argv=None) -> int:
    argv = argv or sys.argv[1:]
    if argv[:1] == ["--speedup"]:
        if len(argv) != 3:
            print("usage: sweep_report.py --speedup A.json B.json", file=sys.stderr)
            return 2
        print_rows(speedup(argv[1], argv[2]))
        return 0
    for row in (report(p) for p in argv):
        print(row.pop("path"))
        print_rows(row)
    return 0


def print_rows(row: dict) -> None:
    for k, v in row.items():
        print(f"  {k:<30} {v:.3f}" if isinstance(v, float) else f"  {k:<30} {v}")


if __name__ == "__main__":
    sys.exit(main())
