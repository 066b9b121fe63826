"""`python -m fxray.tune ... --placebo N`: the sweep, then the same search N more times on
placebo copies of its data, and the real sweep's rank among them.

    code = sweep_with_placebos(args, import_s)

A placebo copy (fxray.data.placebo) has the same bars, features and order flow, but
every bar's return sign-randomised around the mean: nothing can predict a direction
there. Each placebo sweep runs the experiment the real sweep ran (its saved
experiment.yaml, profile, seeds, trial budget: the real sweep's trials over all its
rounds, TPE + ASHA as usual) in its own run directory <storage>/placebo-<i>/ (its data
as market.fxcache there), and is its own MLflow parent run in the same experiment,
named "placebo <i> of <name>" and tagged fxray.placebo = i, fxray.placebo_of = the real
sweep's parent run id (fxray.compare finds them by that tag and leaves them out of "the
latest sweep"). The placebo p-value is the share of all the sweeps, the real one
included, whose best trial's pooled test Sharpe reached the real one's
(fxray.eval.snooping.placebo_pvalue): the whole search, re-training included, under
the null that the features carry no directional information.

Shape: the sweeps run one after another in this process, on the Ray the real sweep
started. The real sweep's FoldWorkers are killed and each placebo starts its own, on its
own object-store copy of the data (fxray.sweep.driver.start, as any sweep): a worker that
Ray restarts reloads the data it was created with, so a placebo worker can never fall
back to the real market. The price is a worker start per placebo (torch import and
device set-up, a few seconds), small beside a sweep. Re-running the command (with
--resume when the real sweep is done) reuses the placebo sweeps that finished, resumes an
interrupted one, and extends one that ran fewer trials than the real sweep has now.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from fxray.sweep import driver
from fxray.sweep.rundir import UsageError, read_sweep
from fxray.track.results import fmt_s, write_json

DATA = "market.fxcache"  # a placebo sweep's data, in its run directory


def placebo_dir(storage: Path, i: int) -> Path:
    return Path(storage) / f"placebo-{i}"


def sweep_with_placebos(args, import_s: float = 0.0) -> int:
    """The sweep of `args`, then `args.placebo` placebo sweeps; the verdict at the end."""
    if args.same_trials:
        raise UsageError("--placebo: a --same-trials replay has no search to account for; drop one of them")
    plan = driver.validate(args, import_s)
    code = driver.run_sweep(plan)
    if code != 0:
        print("fxray.tune: the placebo sweeps wait for a sweep that finished", file=sys.stderr)
        return code
    storage, sweep = plan.storage, read_sweep(plan.storage)
    # a placebo sweep is the real one's search again: its time, until placebos of this session have one
    walls, real_s = [], json.loads((storage / "results.json").read_text()).get("wall_s")
    sweeps = []
    for i in range(1, args.placebo + 1):
        t0, left = time.time(), args.placebo - i + 1
        each = sum(walls) / len(walls) if walls else real_s
        eta = f"; ETA ~{fmt_s(each * left)} for the {left} left" if each else ""
        print(
            f"\n== placebo {i}/{args.placebo}: {placebo_dir(storage, i)} (returns sign-randomised, features kept){eta}",
            flush=True,
        )
        code, pdir, ran = run_placebo(args, storage, sweep, i, import_s)
        if code != 0:
            print(
                f"fxray.tune: placebo {i} stopped; continue with the same command plus --resume "
                f"(--storage {storage} --resume --placebo {args.placebo})",
                file=sys.stderr,
            )
            return code
        res = json.loads((pdir / "results.json").read_text())
        sweeps.append(
            {
                "index": i,
                "storage": str(pdir),
                "parent_run_id": read_sweep(pdir)["mlflow"].get("parent_run_id"),
                "best_test_sharpe": res["best"]["test"]["sharpe"],
                "best_trial_id": res["best"]["trial_id"],
                "n_trials": res["n_trials"],
                "wall_s": time.time() - t0,
            }
        )
        if ran:
            walls.append(time.time() - t0)
    return conclude(args, storage, sweep, sweeps)


def run_placebo(args, storage: Path, real: dict, i: int, import_s: float) -> tuple[int, Path, bool]:
    """Placebo sweep i of the real sweep in `storage` (its sweep.json `real`): made, resumed,
    extended, or (finished with the same budget) reused. (exit code, its run directory, whether
    it ran here)."""
    pdir = placebo_dir(storage, i)
    pargs = placebo_args(args, storage, real, pdir)
    if pargs is None:
        print(f"placebo {i}: finished earlier with the same trials, kept")
        return 0, pdir, False
    ensure_data(pdir / DATA, real, i)
    plan = driver.validate(pargs, import_s)
    plan.mlflow_extra = {
        "tags": {
            "fxray.placebo": str(i),
            "fxray.placebo_of": real["mlflow"].get("parent_run_id") or "",
            "fxray.placebo_of_sweep": real["id"],
        },
        "run_name": f"placebo {i} of {real['experiment']}",
        "sweep": {"placebo": {"index": i, "of": {"storage": str(storage), "sweep_id": real["id"]}}},
    }
    for failures in (driver.WORKER_FAILURE, driver.MLFLOW_FAILURE):  # module state of the last sweep's stopper
        failures.clear()
    return driver.run_sweep(plan), pdir, True


def placebo_args(args, storage: Path, real: dict, pdir: Path):
    """The flags of placebo sweep `pdir`, or None when it finished with the real sweep's budget."""
    budget = sum(r["trials"] for r in real["rounds"])
    mine = read_sweep(pdir)
    p = copy.copy(args)
    p.placebo, p.same_trials, p.json = None, None, None
    p.storage, p.data = str(pdir), str(pdir / DATA)
    p.profile, p.name = real["profile"], real["experiment"]
    p.experiment, p.resume, p.trials, p.seed = None, False, None, None
    if mine is None:
        p.experiment = str(storage / "experiment.yaml")
        p.trials, p.seed = budget, real["rounds"][0]["seed"]
    elif not mine["rounds"][-1]["done"]:
        p.resume = True
    else:
        have = sum(r["trials"] for r in mine["rounds"])
        if have == budget:
            return None
        if have > budget:
            raise UsageError(
                f"{pdir}: ran {have} trials, more than the {budget} of the sweep it is a placebo of; "
                "delete it to run it again"
            )
        n = len(mine["rounds"])
        p.trials, p.seed = budget - have, real["rounds"][min(n, len(real["rounds"]) - 1)]["seed"]
    return p


def ensure_data(path: Path, real: dict, i: int) -> None:
    """The placebo copy of the real data at `path` (written once; refused if it is another's)."""
    from fxray.data import cache
    from fxray.data.placebo import write_placebo

    market_path = real["data"]["path"]
    seed = real["rounds"][0]["seed"]
    if path.exists():
        meta = cache.open(path, verify=False).meta.get("placebo") or {}
        if meta.get("of") != real["data"]["content_hash"] or meta.get("index") != i or meta.get("seed") != seed:
            raise UsageError(
                f"{path}: not placebo {i} (seed {seed}) of {market_path}; delete {path.parent} to make it again"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_placebo(cache.open(market_path), path, index=i, seed=seed)


def conclude(args, storage: Path, real: dict, sweeps: list) -> int:
    """The placebo p-value into the real sweep's results.json (and --json), its verdict
    printed, and both logged to its MLflow parent run (placebo_pvalue, verdict/verdict.png)."""
    from fxray.eval.snooping import placebo_pvalue
    from fxray.track.verdict import add_placebo, json_ready, metrics, snooping_verdict, text, verdict_png
    from fxray.track.writer import Writer

    path = storage / "results.json"
    results = json.loads(path.read_text())
    bests = [s["best_test_sharpe"] for s in sweeps]
    placebo = {**placebo_pvalue(results["best"]["test"]["sharpe"], bests), "sweeps": sweeps}
    # recomputed from results.json's trials (the same numbers as its verdict) for the CSCV logits of the plot
    verdict = snooping_verdict(results["trials"], len(results["folds"]), results["periods_per_year"], results["best"])
    add_placebo(verdict, placebo)
    results["verdict"] = json_ready(verdict)
    write_json(storage, args.json, results)
    print(f"\n== {real['experiment']}: the real sweep against {len(bests)} placebo sweep(s)")
    for s in sweeps:
        print(f"   placebo {s['index']}: best pooled test Sharpe {s['best_test_sharpe']:+.2f} ({s['storage']})")
    print(text(verdict))
    png = verdict_png(storage / "verdict.png", [(real["experiment"], verdict)])
    summary = {**{k: v for k, v in metrics(verdict).items() if k == "placebo_pvalue"}, "placebo_n": len(bests)}
    with Writer(storage) as writer:  # the finished parent run gets the verdict
        lost = writer.finish("FINISHED", summary, [("verdict", png)])
    if lost:
        why = f"the store did not open: {writer.error}" if lost < 0 else f"{lost} write(s) failed"
        print(f"fxray.tune: the verdict did not reach MLflow ({why}); {path} has it", file=sys.stderr)
        return 1
    return 0
