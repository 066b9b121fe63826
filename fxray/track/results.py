"""A sweep's results from its fold log: the trials table, the best trial, and the files
written at the end of a run (folds.csv, equity.png, results.json, the top-trials table).

    records = load_records(storage)        # {(trial_id, fold): FoldRecord flat dict} from folds.jsonl
    best = best_trial(records, n_folds)    # the trial the sweep picked
    write_results(storage, sweep, records, ...)   # the files, and the parent run's summary

No Ray and no mlflow here: the driver calls it after Tune, tests call it on any folds.jsonl.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fxray.track.records import CSV_COLUMNS, FoldRecord


def trial_label(trial_id: str) -> str:
    """Tune's trial id 'a1b2c3d4' -> 'trial-a1b2c3d4' (the MLflow run name)."""
    return "trial-" + trial_id.replace("_", "-")


def fmt_s(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# --- artifacts -----------------------------------------------------------------------


def equity_png(path, daily_by_fold: list[tuple[int, list]], title: str) -> Path:
    """Equity (start 1) over the concatenated test windows of one trial; folds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(9, 4))
    start, level, starts = 0, 0.0, []
    for i, (k, daily) in enumerate(daily_by_fold):
        log_eq = level + np.concatenate([[0.0], np.cumsum(daily)])  # daily log returns add
        x = np.arange(start, start + len(log_eq))
        ax.plot(x, np.exp(log_eq), color="tab:blue")
        if i % 2:
            ax.axvspan(x[0], x[-1], color="0.92")
        starts.append((k, x[0]))
        start, level = x[-1], log_eq[-1]
    for k, x0 in starts:  # labels at the top, in axes coordinates: the y range is final now
        ax.annotate(f"fold {k}", (x0, 0.97), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set(title=title, xlabel="test day (folds concatenated)", ylabel="equity")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# --- the sweep's fold records (folds.jsonl, written by the driver) ---------------------


def load_records(storage) -> dict:
    """{(trial_id, fold): record} from folds.jsonl; a fold logged twice keeps its last line."""
    path, out = Path(storage) / "folds.jsonl", {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[(rec["trial_id"], rec["fold"])] = rec
    return out


def trials_table(records: dict) -> dict:
    """{trial_id: {"config", "folds": [records in fold order], "mean_val_sharpe", ...}}."""
    trials: dict = {}
    for (tid, _), rec in sorted(records.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        t = trials.setdefault(tid, {"trial_id": tid, "config": rec["config"], "folds": []})
        t["folds"].append(rec)
    for t in trials.values():
        f = t["folds"]
        t["folds_done"] = len(f)
        t["mean_val_sharpe"] = sum(r["val_sharpe"] for r in f) / len(f)
        t["mean_test_sharpe"] = sum(r["test_sharpe"] for r in f) / len(f)
    return trials


def best_trial(records: dict, n_folds: int | None = None) -> dict:
    """Highest mean val Sharpe, among trials that ran every fold when any did."""
    trials = list(trials_table(records).values())
    full = [t for t in trials if n_folds and t["folds_done"] >= n_folds]
    return max(full or trials, key=lambda t: t["mean_val_sharpe"])


def write_results(
    storage,
    sweep: dict,
    records: dict,
    worker_stats: list,
    wall_s: float,
    json_path=None,
    top: int = 10,
    started: float | None = None,
    phases: dict | None = None,
) -> dict:
    """folds.csv, equity.png and results.json in the run directory (and --json), the top
    table on stdout; returns the parent run's summary metrics and artifacts."""
    storage, n_folds = Path(storage), len(sweep["folds"])
    trials = trials_table(records)
    if not trials:
        print("no trial finished a fold")
        return {"mlflow_summary": {}, "artifacts": [(None, storage / "experiment.yaml")]}
    best = best_trial(records, n_folds)
    names = sorted({k for t in trials.values() for k in t["config"]})
    # --- fold table: one row per trial x fold -------------------------------------
    cols = ["trial", *CSV_COLUMNS, *names]
    with open(storage / "folds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for t in trials.values():
            for r in t["folds"]:
                w.writerow(
                    [
                        trial_label(t["trial_id"]),
                        *FoldRecord.from_flat(r).csv_row(),
                        *(t["config"].get(n, "") for n in names),
                    ]
                )
    equity = equity_png(
        storage / "equity.png",
        [(r["fold"], r.get("test_daily_returns", [])) for r in best["folds"]],
        f"{sweep['experiment']}: best {trial_label(best['trial_id'])} on its test windows",
    )
    # --- results.json -------------------------------------------------------------------
    results = {
        "experiment": sweep["experiment"],
        "profile": sweep["profile"],
        "storage": str(storage),
        "data": sweep["data"],
        "folds": sweep["folds"],
        "base_config": sweep["base"],
        "rounds": sweep["rounds"],
        "started": started,
        "phases": phases or {},
        "wall_s": wall_s,
        "workers": worker_stats,
        "n_trials": len(trials),
        "trials": [
            {
                "trial_id": t["trial_id"],
                "config": {**sweep["base"], **t["config"]},
                "sampled": t["config"],
                "folds_done": t["folds_done"],
                "stopped_early": t["folds_done"] < n_folds,
                "mean_val_sharpe": t["mean_val_sharpe"],
                "mean_test_sharpe": t["mean_test_sharpe"],
                "folds": [FoldRecord.from_flat(r).results_json() for r in t["folds"]],
            }
            for t in trials.values()
        ],
        "best": {
            "config": {**sweep["base"], **best["config"]},
            "sampled": best["config"],
            **{k: best[k] for k in ("trial_id", "folds_done", "mean_val_sharpe", "mean_test_sharpe")},
        },
    }
    text = json.dumps(results, indent=1)
    (storage / "results.json").write_text(text)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text)
    print_top(trials, names, n_folds, wall_s, top)
    best_fold = max(best["folds"], key=lambda r: r["val_sharpe"])
    ckpt = best_fold.get("checkpoint") or ""
    artifacts = [(None, storage / "experiment.yaml"), (None, storage / "folds.csv"), (None, equity)]
    if ckpt:
        artifacts += [("best_checkpoint", ckpt), ("best_checkpoint", Path(ckpt).with_suffix(".json"))]
    summary = {
        "best_mean_val_sharpe": best["mean_val_sharpe"],
        "n_trials": len(trials),
        "best_mean_test_sharpe": best["mean_test_sharpe"],
        "wall_s": wall_s,
        "trial_id": best["trial_id"],
    }
    return {"mlflow_summary": summary, "artifacts": artifacts}


def print_top(trials: dict, names: list, n_folds: int, wall_s: float, top: int) -> None:
    """The best trials (those that ran every fold first), with their sampled values."""
    ranked = sorted(trials.values(), key=lambda t: (t["folds_done"] >= n_folds, t["mean_val_sharpe"]), reverse=True)[
        :top
    ]
    print(
        f"\ntop {len(ranked)} of {len(trials)} trials by mean val Sharpe ({n_folds} folds; "
        f"fewer = stopped by ASHA); wall time {wall_s / 60:.1f} min"
    )
    print(f"  {'trial':<20} {'folds':>5} {'val':>7} {'test':>7}  " + "  ".join(f"{n:>10}" for n in names))
    for t in ranked:
        print(
            f"  {trial_label(t['trial_id']):<20} {t['folds_done']:>5} {t['mean_val_sharpe']:>+7.2f} "
            f"{t['mean_test_sharpe']:>+7.2f}  " + "  ".join(f"{fmt(t['config'].get(n)):>10}" for n in names)
        )


def fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
