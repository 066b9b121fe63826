"""Sweep hyperparameters over walk-forward folds: Ray Tune + Optuna TPE + ASHA + MLflow.

    python -m fxray.tune --trials 64                                   # the embedded market
    python -m fxray.tune --experiment experiments/smoke.yaml           # tiny, < 2 min on a CPU
    python -m fxray.tune --experiment experiments/X.yaml --data X.fxcache --address auto
    python -m fxray.tune --resume                                      # finish an interrupted sweep
    python -m fxray.tune --same-trials runs/default/results.json --storage runs/again   # same work again
    python -m fxray.tune --experiment experiments/smoke.yaml --placebo 4   # + 4 sweeps on signal-free copies

Each trial is a plain function (fxray/sweep/trial.py) that walks the folds in time order
on a leased FoldWorker and calls `tune.report` after each fold; the objective is the
running mean of val Sharpe (comparable across fold counts, as ASHA stops trials early).
The driver is fxray/sweep/driver.py; the run directory (default ./runs/<experiment
name>), resume, extension rounds and the MLflow layout are described in docs/tune.md.
"""

from __future__ import annotations

import argparse
import sys
import time

_T_IMPORT = time.time()
import ray  # noqa: E402, F401  (before the clock: Ray and Tune's import is not the run's)

from fxray.data.cache import CacheError  # noqa: E402
from fxray.data.folds import FoldError  # noqa: E402
from fxray.rl import experiment as expmod  # noqa: E402
from fxray.rl.config import ConfigError  # noqa: E402
from fxray.sweep.cluster import ClusterError, ObjectStoreError  # noqa: E402
from fxray.sweep.driver import sweep_run  # noqa: E402
from fxray.sweep.rundir import UsageError  # noqa: E402

IMPORT_S = time.time() - _T_IMPORT  # importing Ray and Tune: before a run's clock starts
USER_ERRORS = (expmod.ExperimentError, UsageError, CacheError, FoldError, ConfigError, ObjectStoreError, ClusterError)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m fxray.tune",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--experiment", help=f"experiment YAML (default {expmod.DEFAULT_EXPERIMENT})")
    p.add_argument("--data", help="an fxcache; overrides the experiment's data.path")
    p.add_argument("--trials", type=positive_int, help="trials to run (default: the file's sweep.trials)")
    p.add_argument("--seed", type=int, help="TPE sampler and training seed (default: sweep.seed)")
    p.add_argument("--workers-per-gpu", type=positive_int, help="FoldWorkers per GPU (num_gpus = 1/K each)")
    p.add_argument(
        "--cpu-workers", type=positive_int, help="FoldWorkers on a cluster without GPUs (default: one per CPU)"
    )
    p.add_argument("--name", help="MLflow experiment and run-directory name (default: the file's name)")
    p.add_argument("--storage", help="run directory (default: ./runs/<name>)")
    p.add_argument("--resume", action="store_true", help="finish the interrupted sweep in --storage")
    p.add_argument("--address", help="join a running Ray cluster ('auto'); default: start one here")
    p.add_argument("--num-cpus", type=positive_int, help="local Ray: logical CPUs (default: all)")
    p.add_argument("--num-gpus", type=int, help="local Ray: logical GPUs (default: detected)")
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
    p.add_argument("--json", help="write per-trial, per-fold results here")
    return p.parse_args(argv)


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return v


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.placebo:
            from fxray.sweep.placebo import sweep_with_placebos

            return sweep_with_placebos(args, IMPORT_S)
        return sweep_run(args, IMPORT_S)
    except USER_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"fxray.tune: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fxray.tune: interrupted (if it had made its run directory, --resume continues it)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
