"""MLflow, written by the driver only: one parent run per sweep, one child run per trial.

    experiment (from the experiment file's `name`)
      parent run "sweep <name>"     tags: dataset hash, experiment, git commit, fold ranges
        |                           artifacts: experiment.yaml, folds.csv, equity.png, best_checkpoint/
        +- child run per trial      tag mlflow.parentRunId, fxray.trial_id; params: the full DQNConfig
                                    metrics per fold (step = fold k): val_sharpe, test_sharpe, ...
                                    summary: the last points of mean_val_sharpe / mean_test_sharpe
                                    (running means), folds_done, tag fxray.stopped_early

Why the driver: trials run in many processes, and many processes writing one
sqlite file lock it. The Tune callbacks below run in the driver; trials only
`tune.report`. The MLflow client itself (fxray.mlruns.Tracker) lives in a helper
process (fxray.mlhelper) the driver starts before Ray, so that importing mlflow and
creating the store overlap Ray's start; the callbacks' writes are queued there, in order. Runs
are found again by tags, so a resumed sweep never gives a trial a second run nor a
fold a second point.

Also here, driver-side too: `SweepLog` (a progress line per fold, and every fold
appended to <run dir>/folds.jsonl) and the end-of-sweep files built from those
records (folds.csv, equity.png, results.json, the top-trials table).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import ray
from ray.tune import Callback

from fxray.mlruns import sweep_tracker
from fxray.leases import pool_name

class MlflowCallback(Callback):
    """Tune callback in the driver: per-fold metrics into the trial's child run, logged
    when the fold's checkpoint is registered (see SweepLog.on_checkpoint).

    It holds only the storage path: Tune pickles callbacks into the run's state
    and `Tuner.restore` brings back that copy, so everything live (the Tracker in
    the helper process, the parent run id) is found again in `setup`.
    """

    def __init__(self, storage: str):
        self.storage = storage

    def __getstate__(self):
        return {"storage": self.storage}

    def setup(self, **info):
        sweep = json.loads((Path(self.storage) / "sweep.json").read_text())
        self.tracker, self.base, self.n_folds = sweep_tracker(self.storage), sweep["base"], len(sweep["folds"])

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        result = trial.last_result  # the fold whose checkpoint Tune just registered (see SweepLog)
        if "fold" in result:
            self.tracker.log_fold(trial.trial_id, trial_label(trial.trial_id),
                                  {**self.base, **trial.config}, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial, "FAILED")

    def _end(self, trial, status):
        folds_done = (trial.last_result or {}).get("folds_done", 0)
        self.tracker.end_trial(trial.trial_id, folds_done, self.n_folds, status)


def trial_label(trial_id: str) -> str:
    """Tune's trial id 'a1b2c3d4' -> 'trial-a1b2c3d4' (the MLflow run name)."""
    return "trial-" + trial_id.replace("_", "-")


# --- progress: a line per fold, and folds.jsonl ---------------------------------------

class SweepLog(Callback):
    """A progress line per finished fold, and every fold appended to <storage>/folds.jsonl.

    Also returns a lease to the pool when a trial ends or is retried (a trial process
    that died inside a fold cannot return it itself). Holds only the storage path:
    Tune pickles callbacks into its state, `setup` rebuilds the rest.
    """

    def __init__(self, storage: str):
        self.storage = storage

    def __getstate__(self):
        return {"storage": self.storage}

    def setup(self, **info):
        self.sweep = json.loads((Path(self.storage) / "sweep.json").read_text())
        self.records = load_records(self.storage)
        rnd = self.sweep["rounds"][-1]
        same = rnd.get("same_trials")  # its trials' lengths are known: the ETA is exact
        self.total = sum(n for _, n in same["trials"]) if same else rnd["trials"] * len(self.sweep["folds"])
        self.session_folds, self.t0 = 0, time.time()
        self.pool = ray.get_actor(pool_name(Path(self.storage)))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        # Not on_trial_result: Tune registers a report's checkpoint a moment after the
        # result. A fold logged only once its checkpoint is in Tune's state is a fold a
        # resumed trial will not train again: folds.jsonl and MLflow see it exactly once.
        # (The trial is blocked in tune.report until then, so last_result is this fold.)
        result = trial.last_result
        if "fold" not in result:
            return
        rec = {k: v for k, v in result.items() if k in RECORD_KEYS or k.startswith(("val_", "test_"))}
        rec.update(trial_id=trial.trial_id, config=trial.config, t=time.time())
        with open(Path(self.storage) / "folds.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records[(trial.trial_id, rec["fold"])] = rec
        self.session_folds += 1
        round_trials = {t.trial_id for t in trials}
        done = sum(1 for (tid, _) in self.records if tid in round_trials)
        best = best_trial(self.records, len(self.sweep["folds"]))
        elapsed = time.time() - self.t0
        eta = (self.total - done) * elapsed / self.session_folds
        n_folds = len(self.sweep["folds"])
        print(f"[{done:>4}/{self.total} folds {fmt_s(elapsed)}, ETA <= {fmt_s(eta)}] "
              f"{trial_label(trial.trial_id)} fold {rec['fold'] + 1}/{n_folds}: "
              f"val {rec['val_sharpe']:+.2f} test {rec['test_sharpe']:+.2f} "
              f"mean val {result['mean_val_sharpe']:+.2f}  | best {best['mean_val_sharpe']:+.2f} "
              f"({trial_label(best['trial_id'])})", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.pool.release.remote(trial.trial_id)

    on_trial_error = on_trial_recover = on_trial_complete


RECORD_KEYS = ("fold", "status", "epochs", "best_epoch", "worker", "checkpoint", "fold_time_s",
               "fold_switch_s", "train_s", "eval_s", "bh_test_sharpe", "adx", "folds_done",
               "mean_val_sharpe", "mean_test_sharpe", "trial_start")


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


def write_results(storage, sweep: dict, records: dict, worker_stats: list, wall_s: float,
                  json_path=None, top: int = 10, started: float | None = None, phases: dict | None = None) -> dict:
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
    cols = ["trial", "fold", *RECORD_COLS, *names]
    with open(storage / "folds.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for t in trials.values():
            for r in t["folds"]:
                w.writerow([trial_label(t["trial_id"]), r["fold"], *(r.get(c, "") for c in RECORD_COLS),
                            *(t["config"].get(n, "") for n in names)])
    equity = equity_png(storage / "equity.png", [(r["fold"], r.get("test_daily_returns", []))
                                                  for r in best["folds"]],
                        f"{sweep['experiment']}: best {trial_label(best['trial_id'])} on its test windows")
    # --- results.json -------------------------------------------------------------------
    results = {
        "experiment": sweep["experiment"], "profile": sweep["profile"], "storage": str(storage),
        "data": sweep["data"], "folds": sweep["folds"], "base_config": sweep["base"],
        "rounds": sweep["rounds"], "started": started, "phases": phases or {}, "wall_s": wall_s,
        "workers": worker_stats, "n_trials": len(trials),
        "trials": [{"trial_id": t["trial_id"], "config": {**sweep["base"], **t["config"]},
                    "sampled": t["config"], "folds_done": t["folds_done"],
                    "stopped_early": t["folds_done"] < n_folds, "mean_val_sharpe": t["mean_val_sharpe"],
                    "mean_test_sharpe": t["mean_test_sharpe"], "folds": [_fold_json(r) for r in t["folds"]]}
                   for t in trials.values()],
        "best": {"config": {**sweep["base"], **best["config"]}, "sampled": best["config"],
                 **{k: best[k] for k in ("trial_id", "folds_done", "mean_val_sharpe", "mean_test_sharpe")}},
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
    summary = {"best_mean_val_sharpe": best["mean_val_sharpe"], "n_trials": len(trials),
               "best_mean_test_sharpe": best["mean_test_sharpe"], "wall_s": wall_s, "trial_id": best["trial_id"]}
    return {"mlflow_summary": summary, "artifacts": artifacts}


def _fold_json(r: dict) -> dict:
    """A folds.jsonl record -> results.json's fold: val/test metric dicts, timings."""
    out = {k: r.get(k) for k in ("fold", "status", "epochs", "best_epoch", "worker", "checkpoint",
                                  "bh_test_sharpe", "adx")}
    for w in ("val", "test"):
        out[w] = {k[len(w) + 1:]: v for k, v in r.items()
                  if k.startswith(w + "_") and k != "test_daily_returns"}
    out["timings"] = {k: r.get(k) for k in ("fold_switch_s", "train_s", "eval_s", "fold_time_s", "trial_start")}
    out["test_daily_returns"] = r.get("test_daily_returns", [])
    return out


def print_top(trials: dict, names: list, n_folds: int, wall_s: float, top: int) -> None:
    """The best trials (those that ran every fold first), with their sampled values."""
    ranked = sorted(trials.values(), key=lambda t: (t["folds_done"] >= n_folds, t["mean_val_sharpe"]),
                    reverse=True)[:top]
    print(f"\ntop {len(ranked)} of {len(trials)} trials by mean val Sharpe ({n_folds} folds; "
          f"fewer = stopped by ASHA); wall time {wall_s / 60:.1f} min")
    print(f"  {'trial':<20} {'folds':>5} {'val':>7} {'test':>7}  " + "  ".join(f"{n:>10}" for n in names))
    for t in ranked:
        print(f"  {trial_label(t['trial_id']):<20} {t['folds_done']:>5} {t['mean_val_sharpe']:>+7.2f} "
              f"{t['mean_test_sharpe']:>+7.2f}  " + "  ".join(f"{fmt(t['config'].get(n)):>10}" for n in names))


RECORD_COLS = ("val_sharpe", "test_sharpe", "mean_val_sharpe", "val_sortino", "test_sortino",
               "val_max_drawdown", "test_max_drawdown", "val_turnover", "test_turnover",
               "test_total_return", "bh_test_sharpe", "epochs", "best_epoch", "status", "worker",
               "fold_time_s", "train_s", "eval_s", "fold_switch_s", "checkpoint")


def fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
