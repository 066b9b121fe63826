"""Run a learner grid as one process per (job, seed), N at a time, and merge the results.

    python lab/grid_parallel.py GRID.json [--probe VARIANT] [--procs 8] [--device cuda]
                                    [--deadline S] --json OUT.json

On the H200 one grid process leaves the GPU mostly idle (a learner step is bound by kernel
launches), so the grids of docs/benchmarks.md ran several side by side; this is that launch,
written down. Each (job, seed) runs `lab/learner_grid.py` (or `lab/learner_probes.py
VARIANT`, where --probe or the job's own "probe" key names one) on a grid of one job with one
seed; its fold-by-fold progress goes to stderr with the
job's tag; the merged JSON holds one entry per job of GRID with every seed, as learner_grid's
own --json does, and the merged line of each job is printed as learner_grid prints it. At
--deadline seconds the processes still running are stopped and the merge keeps the seeds that
finished, and of a stopped seed the folds it did (learner_grid writes its JSON after every fold;
its line says "[k/N folds]", and its share is over those folds' test windows only; a device
call has a time limit; the stopped ones are counted as failed).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import learner_grid  # noqa: E402


def split(grid: list[dict]) -> list[tuple[int, dict]]:
    """(index of the job in GRID, a copy of the job with one seed) for every job and seed."""
    return [(i, {**job, "seeds": [s]}) for i, job in enumerate(grid) for s in job.get("seeds", [0])]


def merge(parts: list[dict]) -> dict:
    """One job's per-seed results -> one result with every seed (the references are the seed's
    own: they do not depend on the seed, and the first one's are kept)."""
    out = dict(parts[0])
    out["seeds"] = {k: v for p in parts for k, v in p["seeds"].items()}
    out["best_epochs"] = [e for p in parts for e in p["best_epochs"]]
    out["wall_s"] = max(p["wall_s"] for p in parts)
    out["folds_done"] = min(p.get("folds_done", 0) for p in parts)  # a process stopped at --deadline did fewer
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("grid", type=Path, metavar="GRID.json")
    p.add_argument("--probe", metavar="VARIANT", help="run lab/learner_probes.py VARIANT, not learner_grid")
    p.add_argument("--procs", type=int, default=8, help="processes side by side (default 8)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--deadline", type=float, default=None, metavar="S", help="stop what still runs after S seconds")
    p.add_argument("--json", type=Path, required=True, metavar="PATH", help="the merged results")
    args = p.parse_args(argv)
    if args.procs < 1:
        raise SystemExit("grid_parallel: --procs must be >= 1")
    grid = json.loads(args.grid.read_text())
    pieces = split(grid)
    tmp = Path(tempfile.mkdtemp(prefix="grid_parallel_"))
    running, done = [], []
    t0 = time.time()
    deadline = math.inf if args.deadline is None else t0 + args.deadline

    def reap(room: int) -> None:
        """Move finished processes to `done` until fewer than `room` run (or the deadline)."""
        while True:
            for r in [r for r in running if r[0].poll() is not None]:
                running.remove(r)
                done.append(r)
            if len(running) < room or time.time() > deadline:
                return
            time.sleep(0.5)

    for n, (i, job) in enumerate(pieces):
        reap(args.procs)
        if time.time() > deadline:
            break
        probe = job.get("probe", args.probe)
        script = [str(HERE / "learner_probes.py"), probe] if probe else [str(HERE / "learner_grid.py")]
        spec, out = tmp / f"job{n}.json", tmp / f"out{n}.json"
        spec.write_text(json.dumps([job]))
        cmd = [sys.executable, *script, str(spec), "--device", args.device, "--json", str(out)]
        running.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL), i, out))
    reap(1)
    for r in running:  # past the deadline
        r[0].kill()
        r[0].wait()
        done.append(r)
    started = len(done)
    failed = [r for r in done if r[0].returncode != 0]
    results: dict[int, list[dict]] = {}
    for _, i, out in done:
        if out.exists():
            results.setdefault(i, []).extend(json.loads(out.read_text()))
    shutil.rmtree(tmp)
    merged = [merge(results[i]) for i in sorted(results)]
    args.json.write_text(json.dumps(merged, indent=1))
    for r in merged:
        print(learner_grid.line(r), flush=True)
    print(
        f"grid_parallel: {started} of {len(pieces)} processes started, {len(failed)} failed or stopped,"
        f" {time.time() - t0:.0f}s",
        file=sys.stderr,
    )
    return 1 if failed or started < len(pieces) else 0


if __name__ == "__main__":
    sys.exit(main())
