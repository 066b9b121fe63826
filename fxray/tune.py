"""Sweep hyperparameters over walk-forward folds: Ray Tune + Optuna TPE + ASHA + MLflow.

examples:
  fxray tune --trials 64                                   # the embedded market
  fxray tune --experiment experiments/smoke.yaml           # tiny, < 2 min on a CPU
  fxray tune --experiment experiments/X.yaml --data X.fxcache --address auto
  fxray tune --experiment experiments/smoke.yaml --set epochs=3 --set sweep.trials=8
  fxray tune --tracking-uri sqlite:///$PWD/sweeps.db       # MLflow store (default ./mlflow.db)
  fxray tune --resume                                      # finish an interrupted sweep
  fxray tune --same-trials runs/default/results.json --storage runs/again   # same work again
  fxray tune --experiment experiments/smoke.yaml --placebo 4   # + 4 sweeps on signal-free copies
  (each also as python -m fxray.tune ...)

Each trial is a plain function (fxray/sweep/trial.py) that walks the folds in time order
on a leased FoldWorker and calls `tune.report` after each fold; the objective is the
pooled val Sharpe of the folds it ran (comparable across fold counts, as ASHA stops
trials early). The driver is fxray/sweep/driver.py; the run directory (default
./runs/<experiment name>), resume, extension rounds and the MLflow layout are
described in docs/tune.md. The sweep ends with its verdict, the `fxray compare`
command and the MLflow URLs that open on its runs.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time

_T_IMPORT = time.time()
import ray  # noqa: E402, F401  (before the clock: Ray's import is not the run's; Tune's overlaps Ray's start)

from fxray.cli import command_parser, nonnegative_int, positive_int, seed  # noqa: E402
from fxray.data.cache import CacheError, first_line  # noqa: E402
from fxray.data.folds import FoldError  # noqa: E402
from fxray.rl import experiment as expmod  # noqa: E402
from fxray.rl.config import ConfigError  # noqa: E402
from fxray.sweep import driver, placebo  # noqa: E402
from fxray.sweep.cluster import ClusterError, ObjectStoreError  # noqa: E402
from fxray.sweep.logs import quiet  # noqa: E402
from fxray.sweep.rundir import NothingToResume, UsageError  # noqa: E402
from fxray.track.runs import sqlite_path  # noqa: E402

IMPORT_S = time.time() - _T_IMPORT  # importing Ray and fxray: before a run's clock starts
USER_ERRORS = (expmod.ExperimentError, UsageError, CacheError, FoldError, ConfigError, ObjectStoreError, ClusterError)


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("tune", __doc__, label="")
    p.add_argument("--experiment", metavar="YAML", help=f"experiment file (default {expmod.DEFAULT_EXPERIMENT})")
    p.add_argument("--data", metavar="FXCACHE", help="an fxcache; overrides the experiment's data.path")
    p.add_argument("--trials", type=positive_int, metavar="N", help="trials to run (default: the file's sweep.trials)")
    p.add_argument("--seed", type=seed, metavar="INT", help="TPE sampler and training seed (default: sweep.seed)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override the experiment file, repeatable: a config field (epochs=3, lr=1e-3: the "
        "dqn section) or a dotted key (sweep.grace_folds=2, folds.max_folds=2); YAML values",
    )
    p.add_argument(
        "--workers-per-gpu", type=positive_int, metavar="K", help="FoldWorkers per GPU (num_gpus = 1/K each)"
    )
    p.add_argument(
        "--population",
        type=positive_int,
        metavar="K",
        help="train the folds of up to K trials together on a worker, as one population (sweep.population)",
    )
    p.add_argument(
        "--cpu-workers",
        type=positive_int,
        metavar="N",
        help="FoldWorkers on a cluster without GPUs (default: one per CPU)",
    )
    p.add_argument("--name", metavar="NAME", help="MLflow experiment and run-directory name (default: the file's name)")
    p.add_argument("--storage", metavar="DIR", help="run directory (default: ./runs/<name>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish the interrupted sweep in --storage (a finished one: says so, exit 0, touches nothing)",
    )
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow store of a new sweep (default: $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db); "
        "a sweep that exists keeps its own",
    )
    p.add_argument(
        "--address",
        metavar="ADDR",
        help="join a running Ray cluster ('auto'); default: start one here (not one `ray start` or RAY_ADDRESS names)",
    )
    p.add_argument("--num-cpus", type=positive_int, metavar="N", help="local Ray: logical CPUs (default: all)")
    p.add_argument("--num-gpus", type=nonnegative_int, metavar="N", help="local Ray: logical GPUs (default: detected)")
    p.add_argument(
        "--profile",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="apply the file's cpu: overrides (auto: when the cluster has no GPU)",
    )
    p.add_argument(
        "--same-trials",
        metavar="RESULTS",
        help="run the trials of a finished sweep again "
        "(its results.json): the same configs, each for as many folds as it trained there",
    )
    p.add_argument(
        "--placebo",
        type=positive_int,
        metavar="N",
        help="then run the same search N times on placebo copies of the data (returns sign-randomised, "
        "features as they are) and rank the real best among them (docs/tune.md)",
    )
    p.add_argument("--json", metavar="PATH", help="write per-trial, per-fold results here")
    p.add_argument(
        "--verbose", action="store_true", help="show Ray's, Tune's, Optuna's and MLflow's own INFO lines and warnings"
    )
    return p


def apply_flags(args) -> None:
    """--tracking-uri and --verbose become the environment the driver, the MLflow writer
    and Ray's processes read (a relative sqlite path is made absolute: Tune moves cwd)."""
    if args.tracking_uri:
        path = sqlite_path(args.tracking_uri)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{path.absolute()}" if path else args.tracking_uri
    quiet(args.verbose)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        apply_flags(args)
        if args.placebo:
            return placebo.sweep_with_placebos(args, IMPORT_S)
        return driver.run_sweep(driver.validate(args, IMPORT_S))
    except NothingToResume as e:
        print(e)
        return 0
    except USER_ERRORS as e:
        print(f"fxray.tune: error: {first_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fxray.tune: interrupted (if it had made its run directory, --resume continues it)", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(
            f"fxray.tune: error: no space left on the device{where}; free some, then run the command again "
            "(--resume continues a sweep that had started: every fold logged so far is kept)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    from fxray.cli import leave

    sys.exit(leave(main()))
