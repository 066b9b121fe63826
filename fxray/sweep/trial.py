"""What runs in a Tune trial process: walk one config's folds on a leased FoldWorker.

No torch, no CUDA, no MLflow here: a trial only sends (config, fold, seed) to the
worker it leased (fxray.sweep.leases) and reports each fold to Tune. The folds are cut
into segments at the reports ASHA can act on (`asha_stops`): inside a segment the
next fold is queued on the worker while the last one is reported; before a
segment's last report the worker goes back to the pool, so a trial that ASHA stops
leaves nothing queued and the trial waiting for the worker trains meanwhile.
A --same-trials sweep gives each config its number of folds (`limits`). The driver
(fxray.tune) builds the trainable from `fold_trial`.

A trial's id is fxray's (in its config: fxray.sweep.search.TRIAL_KEY), not Tune's, and
what it has done is what the driver logged in folds.jsonl: a trial Tune retries after
its process died, or one a `--resume` runs again, continues after its last logged fold.
Reports carry no Tune checkpoint (nothing of Tune's is read back).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import numpy as np
from ray import tune

from fxray.eval import pooled
from fxray.rl.config import make_config
from fxray.sweep.leases import Workers
from fxray.sweep.logs import quiet_exit
from fxray.sweep.rounds import config_key, done_folds
from fxray.sweep.search import split_config
from fxray.track.records import FoldRecord, put_baselines


def fold_trial(config: dict, *, job: dict, workers: Workers) -> None:
    """Train the sampled config on every fold, in time order, reporting after each; a fold
    that diverged ends the trial (its score is DIVERGED: no config that diverges can win)."""
    started = time.time()  # when Tune's trial process got to us (the report's trial_start)
    quiet_exit()  # its end, when Tune ends the process, says nothing (fxray.sweep.logs)
    trial_id, config = split_config(config)
    cfg = {**job["base"], **config}
    make_config(cfg)  # a sampled combination the config rejects fails here, not on a worker
    # its folds (val/test Sharpe, val hourly returns: what the score pools), the logged ones first
    done = [FoldRecord.from_flat(r) for r in done_folds(job["storage"], trial_id)]
    if done and not done[-1].ok:  # it diverged: nothing more to train
        return
    folds = job["folds"]
    if job.get("limits"):  # --same-trials: as many folds as this config trained in that sweep
        # (a config not in it: one the study sampled after a hard kill lost an enqueued one)
        folds = folds[: job["limits"].get(config_key(config), len(folds))]
    checkpoint_dir = os.path.join(job["checkpoints"], trial_id)
    worker = None  # after a rung ASHA let us pass, lease the same worker again if it is free
    for segment in segments(folds[len(done) :], len(done), job["stops"]):
        with (
            workers.lease(trial_id, prefer=worker) as worker,
            contextlib.closing(
                workers.run_folds(worker, cfg, segment, job["seed"], checkpoint_dir, owner=trial_id)
            ) as results,
        ):
            for result in results:
                diverged = result["status"] != "ok"
                if results.consumed == len(segment) or diverged:  # nothing more to run here: free it first
                    workers.release(trial_id)
                record = FoldRecord.from_result(result)
                done.append(record)
                record.folds_done, record.trial_start = len(done), started
                record.score = objective(done, cfg["cost"], job["periods_per_year"])
                ok = [d for d in done if d.ok]
                record.mean_val_sharpe = mean(d.val.get("sharpe") for d in ok)
                record.mean_test_sharpe = mean(d.test.get("sharpe") for d in ok)
                put_baselines(job["storage"], record)
                tune.report(record.flat())
                if diverged:
                    return


DIVERGED = -1e4  # the score of a trial with a fold whose training diverged: below any Sharpe (a policy
# that flips every bar at 0.4 bp scores ~ -250)


def objective(done: list[FoldRecord], cost: float, periods_per_year: float) -> float:
    """The sweep's objective after the folds `done`: fxray.eval.pooled.score of the val windows
    of all of them pooled (comparable across fold counts, as ASHA needs: it is one Sharpe
    estimate that gets more precise with more folds, not a sum); DIVERGED if one diverged."""
    if not all(d.ok for d in done):
        return DIVERGED
    return pooled.score(pooled.pooled([d.val_periods for d in done], cost, periods_per_year))


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def asha_stops(n_folds: int, grace: int, rf: float) -> list[int]:
    """The folds-done counts at which ASHAScheduler(max_t=n_folds, grace_period=grace,
    reduction_factor=rf) may stop a trial: its rungs (the first report at or past each
    milestone) and max_t. Same arithmetic as Ray's _Bracket (a test compares the two)."""
    n_rungs = int(np.log(n_folds / grace) / np.log(rf) + 1)
    return sorted({math.ceil(grace * rf**k) for k in range(n_rungs)} | {n_folds})


def segments(folds: list, done: int, stops) -> list[list]:
    """`folds` (the next ones after `done` reported) cut after each report in `stops`."""
    cuts = [0] + [s - done for s in sorted(stops) if 0 < s - done < len(folds)] + [len(folds)]
    return [folds[a:b] for a, b in zip(cuts, cuts[1:])] if folds else []
