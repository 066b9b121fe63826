"""Where does `dqn.abstain` act, and what would the learner have done there?

    python lab/abstain_probe.py map lab/grids/gpu_draws_demo_cscreen.json --json map.json
    python lab/abstain_probe.py train lab/grids/gpu_draws_demo_cscreen.json 0:0 12:0 --json folds.json

`map`: for each job of a grid (learner_grid.py's format; its cfg's cost, fill and screen_t), the
number of market inputs the checked screen keeps on each fold's train slice
(fxray.rl.frontend.screened_inputs); 0 is a fold the learner abstains on with `abstain: true`.
`train JOB:FOLD[:SEED] ...`: the job's config without abstain, trained on those folds (the
fold's policy as the learner leaves it: its val and test trades and net return in bp), each
fold printed as it ends. CPU or CUDA (`--device`); on a 2-core CPU a GPU-profile fold (3 seeds
of 2048 agents) takes ~9 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_grid import host_arrays, market  # noqa: E402

from fxray.data.folds import FoldSpec, make_folds  # noqa: E402
from fxray.rl import frontend  # noqa: E402
from fxray.rl.config import DQNConfig  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.ensemble import make_trainer  # noqa: E402


def job_data(job: dict, device: str):
    m = market(job.get("market", {}))
    return make_folds(m.ts, FoldSpec(**job.get("folds", {}))), DeviceData(host_arrays(m), device)


def screen_map(grid: list[dict], device: str) -> list[dict]:
    rows = []
    for i, job in enumerate(grid):
        cfg = DQNConfig(**job.get("cfg", {}))
        folds, data = job_data(job, device)
        kept = []
        for f in folds:
            data.set_fold(f)
            kept.append(int(frontend.screened_inputs(data, f, cfg.cost, cfg.fill, cfg.screen_t).numel()))
        rows.append({"job": i, "tag": job.get("tag", ""), "kept": kept, "abstains": sum(k == 0 for k in kept)})
        print(f"{i:>3} {job.get('tag', '')[:40]:<40} kept {kept}  abstains on {rows[-1]['abstains']}", flush=True)
    return rows


def train(grid: list[dict], picks: list[str], device: str) -> list[dict]:
    rows, loaded = [], {}
    for pick in picks:
        j, k, s = ([int(v) for v in pick.split(":")] + [0])[:3]
        job = grid[j]
        if j not in loaded:
            folds, data = job_data(job, device)
            loaded = {j: (folds, data, make_trainer(data, DQNConfig(**{**job.get("cfg", {}), "abstain": False})))}
        folds, data, trainer = loaded[j]
        t0 = time.time()
        r = trainer.run_fold(folds[k], seed=s)
        row = {
            "job": j,
            "tag": job.get("tag", ""),
            "fold": k,
            "seed": s,
            "status": r.status,
            "best_epoch": r.best_epoch,
            "val_trades": r.val.get("n_trades"),
            "test_trades": r.test.get("n_trades"),
            "val_net_bp": 1e4 * sum(r.val_periods.get("net", [])),
            "test_net_bp": 1e4 * sum(r.test_periods.get("net", [])),
            "seconds": time.time() - t0,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("map", "train"))
    p.add_argument("grid", type=Path)
    p.add_argument("picks", nargs="*", metavar="JOB:FOLD[:SEED]")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    grid = json.loads(args.grid.read_text())
    if args.what == "train" and not args.picks:
        p.error("train: name the folds, JOB:FOLD[:SEED] ...")
    rows = screen_map(grid, args.device) if args.what == "map" else train(grid, args.picks, args.device)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
