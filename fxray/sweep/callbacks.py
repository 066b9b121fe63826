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
from fxray.track.records import FoldRecord
from fxray.track.results import best_trial, fmt_s, load_records, trial_label
from fxray.track.writer import FOLDS, append_event


class SweepLog(Callback):
    """A progress line per finished fold, every fold appended to folds.jsonl, every ended
    trial to events.jsonl.

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
        rec = FoldRecord.from_flat(result).flat()
        rec.update(trial_id=trial.trial_id, config=trial.config, t=time.time())
        with open(Path(self.storage) / FOLDS, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records[(trial.trial_id, rec["fold"])] = rec
        self.session_folds += 1
        round_trials = {t.trial_id for t in trials}
        done = sum(1 for (tid, _) in self.records if tid in round_trials)
        best = best_trial(self.records, len(self.sweep["folds"]))
        elapsed = time.time() - self.t0
        eta = (self.total - done) * elapsed / self.session_folds
        n_folds = len(self.sweep["folds"])
        score = "diverged" if rec["status"] != "ok" else f"{rec['score']:+.2f}"
        best_score = "diverged" if best["status"] != "ok" else f"{best['score']:+.2f}"
        print(
            f"[{done:>4}/{self.total} folds {fmt_s(elapsed)}, ETA <= {fmt_s(eta)}] "
            f"{trial_label(trial.trial_id)} fold {rec['fold'] + 1}/{n_folds}: score {score} "
            f"(pooled val Sharpe of its folds)  | best {best_score} ({trial_label(best['trial_id'])})",
            flush=True,
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial, "FAILED")

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.pool.release.remote(trial.trial_id)  # a trial process that died cannot return its lease

    def _end(self, trial, status: str) -> None:
        self.pool.release.remote(trial.trial_id)
        folds_done = (trial.last_result or {}).get("folds_done", 0)
        append_event(self.storage, kind="trial_end", trial_id=trial.trial_id, status=status, folds_done=folds_done)
