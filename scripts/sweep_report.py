"""Where a sweep's wall time went, from its results.json (what `fxray.tune --json` writes).

    python scripts/sweep_report.py runs/default/results.json [more.json ...]

Prints, per sweep: wall time, trials/hour, workers (GPUs), the share of
worker-seconds spent inside `train_fold` (training + evaluation on the device),
and the mean non-training time per trial (dispatch, leasing, reporting, Ray/Tune
bookkeeping and idle tail, per worker slot): an upper bound of the per-trial
overhead.
"""

from __future__ import annotations

import json
import sys


def report(path: str) -> dict:
    r = json.loads(open(path).read())
    workers = max(len(r.get("workers") or []), 1)
    gpus = sum(1 for w in r.get("workers") or [] if "cuda" in str(w.get("device", "")))
    fold_s = sum(f["timings"].get("fold_time_s") or 0.0 for t in r["trials"] for f in t["folds"])
    n_folds = sum(len(t["folds"]) for t in r["trials"])
    wall = r["wall_s"]
    busy = fold_s / (wall * workers)
    idle_per_trial = (wall * workers - fold_s) / max(r["n_trials"], 1)
    return {"path": path, "experiment": r["experiment"], "profile": r["profile"], "trials": r["n_trials"],
            "folds_trained": n_folds, "workers": workers, "gpu_workers": gpus, "wall_s": wall,
            "trials_per_hour": 3600 * r["n_trials"] / wall, "worker_busy_share": busy,
            "non_training_s_per_trial": idle_per_trial, "best_mean_val_sharpe": r["best"]["mean_val_sharpe"],
            "best_mean_test_sharpe": r["best"]["mean_test_sharpe"]}


def main(argv=None) -> int:
    rows = [report(p) for p in (argv or sys.argv[1:])]
    keys = ["experiment", "profile", "trials", "folds_trained", "workers", "gpu_workers", "wall_s",
            "trials_per_hour", "worker_busy_share", "non_training_s_per_trial", "best_mean_val_sharpe",
            "best_mean_test_sharpe"]
    for row in rows:
        print(row["path"])
        for k in keys:
            v = row[k]
            print(f"  {k:<26} {v:.3f}" if isinstance(v, float) else f"  {k:<26} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
