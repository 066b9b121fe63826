"""Fault drills of issue 51 through the real `fxray tune` (local Ray, Optuna, MLflow), printed as a table.

    python lab/drills.py                       # all: 10 driver kills at random moments, a worker, a trial, disk full
    python lab/drills.py --kills 3 --only driver

Each drill runs the tiny sweep of tests/test_tune.py (4 trials x 2 folds), injects the fault, runs
`--resume` until the sweep is done, then checks what tests/test_tune.check_complete_sweep checks
(one MLflow run per trial, one point per fold, the study complete, results.json agreeing) and
that folds.jsonl holds every (trial, fold) exactly once: 0 lost, 0 duplicated. Disk full needs
root (a 4 MiB tmpfs as the run directory's storage). A lab probe: tests/ do the fast subset.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_tune  # noqa: E402
from test_drills import descendants, launch, proc_table  # noqa: E402
from test_tune import check_complete_sweep, cli, setup  # noqa: E402

ORPHANS: list[int] = []


def study_without_orphans(tmp):
    """The study less the trials Optuna was asked for just before a hard kill, which the resume
    marks FAIL (none ran: check_complete_sweep still finds one MLflow run per trial, no more)."""
    study = test_tune.__dict__["_study"](tmp)
    ORPHANS.append(sum(t.state.name == "FAIL" for t in study.trials))
    return type("Study", (), {"trials": [t for t in study.trials if t.state.name != "FAIL"]})


test_tune._study, test_tune.study = test_tune.study, study_without_orphans

N_TRIALS = 4


def folds_once(tmp: Path) -> tuple[int, int]:
    """(distinct (trial, fold) records, duplicated ones) in folds.jsonl."""
    lines = (tmp / "runs/t/folds.jsonl").read_text().splitlines()
    seen = collections.Counter((r["trial_id"], r["fold"]) for r in map(json.loads, lines))
    return len(seen), sum(n - 1 for n in seen.values())


def finish(tmp: Path, exp: Path, env: dict, tries: int = 3) -> tuple[str, list[str]]:
    """--resume until the sweep is done; (outcome, the one-line errors seen on the way)."""
    errors = []
    for _ in range(tries):
        resume = ["--resume"] if (tmp / "runs/t/sweep.json").exists() else []  # killed before it wrote one
        out = cli(["--experiment", exp, "--num-cpus", 2, "--storage", tmp / "runs/t", *resume], env, tmp, timeout=600)
        if out.returncode == 0:
            return "resumed", errors
        errors.append(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return "NOT RESUMABLE", errors


def judge(tmp: Path) -> str:
    try:
        check_complete_sweep(tmp, N_TRIALS)
    except AssertionError as e:
        return f"INCOMPLETE: {str(e).splitlines()[0][:80]}"
    done, dup = folds_once(tmp)
    orphans = f" ({ORPHANS[-1]} Optuna ask(s) of the killed driver marked FAIL, none ran)" if ORPHANS[-1] else ""
    return f"{N_TRIALS * 2 - done} lost, {dup} duplicated{orphans}"


def timed_full_run() -> float:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exp, env = setup(tmp, trials=N_TRIALS, steps=60)
        t0 = time.time()
        out = cli(["--experiment", exp, "--num-cpus", 2, "--storage", tmp / "runs/t"], env, tmp, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return time.time() - t0


def kill_driver(at: float) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exp, env = setup(tmp, trials=N_TRIALS, steps=60)
        proc = launch(["--experiment", exp, "--num-cpus", 2, "--storage", tmp / "runs/t"], env, tmp)
        time.sleep(at)
        if proc.poll() is not None:
            return "ended before the kill", judge(tmp)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(2)
        outcome, errors = finish(tmp, exp, env)
        return outcome + (f" ({len(errors)} refusals: {errors[0]})" if errors else ""), judge(tmp)


def kill_ray_process(pattern: str, after_folds: int = 1) -> tuple[str, str]:
    """kill -9 the first Ray process of the sweep whose command line has `pattern`, once a fold is logged."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exp, env = setup(tmp, trials=N_TRIALS, steps=60)
        proc = launch(["--experiment", exp, "--num-cpus", 2, "--storage", tmp / "runs/t"], env, tmp)
        folds = tmp / "runs/t/folds.jsonl"
        deadline, victim = time.time() + 300, None
        while time.time() < deadline and proc.poll() is None and victim is None:
            if folds.exists() and len(folds.read_text().splitlines()) >= after_folds:
                table = proc_table()
                victims = [p for p in descendants(proc.pid) if p in table and pattern in table[p][2]]
                if victims:
                    victim = victims[0]
                    name = table[victim][2].split()[0]
                    os.kill(victim, signal.SIGKILL)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=600)
        what = f"killed {name}" if victim else "no such process seen"
        if proc.returncode != 0:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            outcome, errors = finish(tmp, exp, env)
            what += f"; the sweep: exit {proc.returncode} ({last[:90]}); {outcome}"
        else:
            what += "; the sweep finished (exit 0)"
        return what, judge(tmp)


def disk_full() -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        exp, env = setup(tmp, trials=N_TRIALS, steps=60)
        mnt = tmp / "runs"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
        try:
            proc = launch(["--experiment", exp, "--num-cpus", 2, "--storage", mnt / "t"], env, tmp)
            folds, filler = mnt / "t/folds.jsonl", mnt / "filler"
            while proc.poll() is None and not (folds.exists() and folds.read_text().count("\n") >= 1):
                time.sleep(0.05)
            with open(filler, "wb") as f:  # take the rest of the disk
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            _, err = proc.communicate(timeout=600)
            Path(tempfile.gettempdir(), "drills-disk-full.err").write_text(err)  # to read the whole of it
            lines = [line for line in err.strip().splitlines() if line.strip()]
            tb = "Traceback" in err
            what = f"exit {proc.returncode}, traceback: {tb}, last line: {lines[-1][:100] if lines else ''}"
            filler.unlink()
            outcome, errors = finish(tmp, exp, env)
            return what + f"; space freed, {outcome}", judge(tmp)
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
            shutil.rmtree(mnt, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--only", choices=["driver", "worker", "trial", "disk"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--at", type=float, nargs="*", help="kill the driver at these seconds instead of random ones")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []

    def row(drill, what, outcome):
        rows.append({"drill": drill, "what": what, "outcome": outcome})
        print(f"| {drill} | {what} | {outcome} |", flush=True)

    print("| drill | what happened | 0 lost, 0 duplicated? |\n|---|---|---|")
    if args.only in (None, "driver"):
        full = timed_full_run()
        rng = random.Random(args.seed)
        for at in args.at or sorted(rng.uniform(1.0, full) for _ in range(args.kills)):
            row(f"kill -9 the driver at {at:.1f} s of {full:.0f} s", *kill_driver(at))
    if args.only in (None, "worker"):
        row("kill -9 a worker (Ray actor) after the first fold", *kill_ray_process("ray::DeviceWorker"))
    if args.only in (None, "trial"):
        row("kill -9 a trial (Tune's trainable) after the first fold", *kill_ray_process("ray::ImplicitFunc"))
    if args.only in (None, "disk") and os.geteuid() == 0:
        row("disk full under the run directory after the first fold", *disk_full())
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
