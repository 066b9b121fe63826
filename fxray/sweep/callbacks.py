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
from collections import Counter
from pathlib import Path

from ray.tune import Callback

from fxray.sweep.rounds import trial_ends
from fxray.sweep.search import split_config
from fxray.track.records import FoldRecord
from fxray.track.results import best_trial, fmt_s, load_records, trial_label
from fxray.track.writer import FOLDS, append_event


def say_failed(trial, then: str) -> None:
    """One line for a failed trial in place of Tune's traceback (logs.quiet turns that off): the
    error's last line, where Ray puts the cause; the whole of it is in the trial's error file."""
    try:
        lines = [line for line in Path(trial.error_file).read_text().splitlines() if line.strip()]
    except (OSError, TypeError):  # no file (none written: e.g. a full disk)
        lines = []
    cause = lines[-1].strip() if lines else "see its error file"
    print(f"{trial_label(split_config(trial.config)[0])} failed: {cause}; {then}", flush=True)


class SweepLog(Callback):
    """A progress line per finished fold, every fold appended to folds.jsonl, every ended
    trial to events.jsonl.

    The line's denominator is the folds the round can still train: trials x folds, less
    the folds of every trial that ASHA stopped (or that ended) short of the last; its ETA
    is the folds still expected -- a running trial continues past each ASHA rung with
    probability 1/reduction_factor -- at the rate folds finished in this session since
    its first one (the start-up is not a fold's time). `stops`: the ASHA stops
    (fxray.sweep.trial.asha_stops), None in a --same-trials round (its lengths are fixed).

    Trials are named by their fxray id (in their config), not Tune's. A fold is logged
    once: the one the trial reported, the moment the driver receives it (a fold trained
    again after a kill was never logged). Also returns a lease to the pool when a trial
    ends or is retried (a trial process that died inside a fold cannot return it itself).
    `pool`: the WorkerPool handle. Tune pickles callbacks into its own files (never read
    back): only the storage path and the stops go there, `setup` rebuilds the rest.
    """

    def __init__(self, storage: str, stops: list[int] | None = None, reduction_factor: float = 2.0, pool=None):
        self.storage, self.stops, self.rf, self.pool = storage, stops, reduction_factor, pool

    def __getstate__(self):  # what `setup` rebuilds stays out of Tune's files
        return {"storage": self.storage, "stops": self.stops, "rf": self.rf}

    def setup(self, **info):
        self.sweep = json.loads((Path(self.storage) / "sweep.json").read_text())
        self.records = load_records(self.storage)
        rnd = self.sweep["rounds"][-1]
        self.n_folds = len(self.sweep["folds"])
        self.same = rnd.get("same_trials")  # its trials' lengths are known: the total is exact
        self.planned = sum(n for _, n in self.same["trials"]) if self.same else rnd["trials"] * self.n_folds
        # {trial id: folds done} of the trials ended FINISHED, earlier sessions too (an errored one is retried)
        self.ended = {t: e["folds_done"] for t, e in trial_ends(self.storage).items() if e["status"] == "FINISHED"}
        self.session_folds, self.t0, self.t_first, self.round = 0, time.time(), None, rnd["name"]

    def progress(self, trials) -> tuple[int, int, float]:
        """(folds done, folds the round can still reach, folds still expected) of this round."""
        round_trials = {split_config(t.config)[0] for t in trials}
        done_by = Counter(tid for (tid, _), r in self.records.items() if r.get("round") == self.round)
        done = sum(done_by.values())
        if self.same:
            return done, self.planned, float(self.planned - done)
        ended = {tid: n for tid, n in self.ended.items() if tid in round_trials}
        total = self.planned - sum(self.n_folds - n for n in ended.values())
        unstarted = max(self.sweep["rounds"][-1]["trials"] - len(round_trials), 0)
        running = [done_by[tid] for tid in round_trials - set(ended)] + [0] * unstarted
        return done, total, sum(expected_folds(n, self.n_folds, self.stops, self.rf) for n in running)

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
        now = time.time()
        self.t_first = self.t_first or now
        done, total, expected = self.progress(trials)
        best = best_trial(self.records, self.n_folds)
        rate = (now - self.t_first) / (self.session_folds - 1) if self.session_folds > 1 else None
        eta = f"ETA ~{fmt_s(expected * rate)}" if rate is not None else "ETA ..."  # one fold gives no rate
        score = "diverged" if rec["status"] != "ok" else f"{rec['score']:+.2f}"
        chosen = (  # the trial the sweep would choose now (fxray.track.results.chosen)
            "none (every trial diverged)" if best is None else f"{trial_label(best['trial_id'])} {best['score']:+.2f}"
        )
        print(
            f"[{done:>4}/{total} folds {fmt_s(now - self.t0)}, {eta}] "
            f"{trial_label(tid)} fold {rec['fold'] + 1}/{self.n_folds}: score {score} "
            f"(pooled val Sharpe of its folds)  | chosen so far: {chosen}",
            flush=True,
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        say_failed(trial, "--resume retries it")
        self._end(trial, "FAILED")

    def on_trial_recover(self, iteration, trials, trial, **info):
        say_failed(trial, "Tune starts it again")
        self.pool.release.remote(split_config(trial.config)[0])  # a dead trial process cannot return its lease

    def _end(self, trial, status: str) -> None:
        tid = split_config(trial.config)[0]
        self.pool.release.remote(tid)
        folds = [r for (t, _), r in self.records.items() if t == tid]  # this session's and earlier ones'
        if status == "FINISHED":  # stopped or done: its unrun folds leave the total
            self.ended[tid] = len(folds)
        outcome = "diverged" if any(r["status"] == "diverged" for r in folds) else "ok"
        append_event(
            self.storage, kind="trial_end", trial_id=tid, status=status, folds_done=len(folds), outcome=outcome
        )


def expected_folds(done: int, n_folds: int, stops: list[int] | None, rf: float) -> float:
    """Folds a trial that has run `done` (and was not stopped yet) is still expected to run:
    past each ASHA rung (a stop short of n_folds) it goes on with probability 1/rf."""
    rungs = set(stops or ()) - {n_folds}
    p, total = 1.0, 0.0
    for f in range(done + 1, n_folds + 1):
        if f - 1 in rungs:
            p /= rf
        total += p
    return total
