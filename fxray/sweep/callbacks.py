"""The driver's Tune callback: a progress line per fold, and the sweep's log.

    folds.jsonl   one line per fold (FoldRecord.flat() + trial id, config, time), exactly once
    events.jsonl  a line per ended trial (its status and folds done)

Both files are the sweep's record: results.json is built from them at the end, and the
MLflow writer process (fxray.track.writer) tails them into the store. The callback runs
in the driver, so one process writes them, in the order Tune reports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import ray
from ray.tune import Callback

from fxray.sweep.leases import pool_name
from fxray.sweep.search import split_config
from fxray.track.records import FoldRecord
from fxray.track.results import best_trial, fmt_s, load_records, trial_label
from fxray.track.writer import FOLDS, append_event


class SweepLog(Callback):
    """A progress line per finished fold, every fold appended to folds.jsonl, every ended
    trial to events.jsonl.

    Trials are named by their fxray id (in their config), not Tune's. A fold is logged
    once: the one the trial reported, the moment the driver receives it (a fold trained
    again after a kill was never logged). Also returns a lease to the pool when a trial
    ends or is retried (a trial process that died inside a fold cannot return it itself).
    Holds only the storage path: Tune pickles callbacks into its own files, `setup`
    rebuilds the rest.
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
        self.session_folds, self.t0, self.round = 0, time.time(), rnd["name"]
        self.pool = ray.get_actor(pool_name(Path(self.storage)))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if "fold" not in result:
            return
        tid, config = split_config(trial.config)
        rec = FoldRecord.from_flat(result).flat()
        if (tid, rec["fold"]) in self.records:  # logged already (a retried trial's report): never twice
            return
        rec.update(trial_id=tid, config=config, round=self.round, t=time.time())
        with open(Path(self.storage) / FOLDS, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records[(tid, rec["fold"])] = rec
        self.session_folds += 1
        done = sum(1 for r in self.records.values() if r.get("round") == self.round)
        best = best_trial(self.records, len(self.sweep["folds"]))
        elapsed = time.time() - self.t0
        eta = (self.total - done) * elapsed / self.session_folds
        n_folds = len(self.sweep["folds"])
        score = "diverged" if rec["status"] != "ok" else f"{rec['score']:+.2f}"
        best_score = (
            "none (every trial diverged)" if best is None else f"{best['score']:+.2f} ({trial_label(best['trial_id'])})"
        )
        print(
            f"[{done:>4}/{self.total} folds {fmt_s(elapsed)}, ETA <= {fmt_s(eta)}] "
            f"{trial_label(tid)} fold {rec['fold'] + 1}/{n_folds}: score {score} "
            f"(pooled val Sharpe of its folds)  | best {best_score}",
            flush=True,
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial, "FAILED")

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.pool.release.remote(split_config(trial.config)[0])  # a dead trial process cannot return its lease

    def _end(self, trial, status: str) -> None:
        tid = split_config(trial.config)[0]
        self.pool.release.remote(tid)
        folds = [r for (t, _), r in self.records.items() if t == tid]  # this session's and earlier ones'
        diverged = any(r["status"] == "diverged" for r in folds)
        append_event(
            self.storage,
            kind="trial_end",
            trial_id=tid,
            status=status,
            folds_done=len(folds),
            outcome="diverged" if diverged else "ok",
        )
