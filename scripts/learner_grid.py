"""The learner grid (issue 17): train configs on planted markets, one line per config, with
the pooled test Sharpe of each seed beside the market's oracle and the ridge rule on the
same test windows, and the share of the oracle. No Ray, no sweep: one config at a time,
every fold, so that a change to the learner is judged on its own, on several markets and
seeds.

    python scripts/learner_grid.py scripts/grids/gpu_levers.json            # the GPU machine
    python scripts/learner_grid.py scripts/grids/gpu_levers.json --json grid.json

A grid file is a JSON list of jobs: {"tag": str, "market": SynthSpec keys, "folds": FoldSpec
keys, "cfg": DQNConfig keys, "seeds": [int, ...], "ensemble": false}. With "ensemble": true
the seeds are trained alone and the policy of each test window is their mean Q.
Fold k of seed s trains with seed s + k (100 s + k in an ensemble), as `fxray train` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from fxray.data import cache
from fxray.data.folds import FoldSpec, make_folds
from fxray.data.synth import SynthSpec, default_path, to_cache
from fxray.eval import pooled
from fxray.eval.backtest import backtest
from fxray.rl.config import DQNConfig
from fxray.rl.device import DeviceData
from fxray.rl.trainer import Trainer

NO_RESULT = {"net": [], "units": [], "hours": [], "n_bars": 0, "n_trades": 0, "n_days": 0}  # a diverged fold


def market(kw: dict):
    spec = SynthSpec(**kw)
    path = default_path(spec)
    if not path.exists():
        to_cache(spec, path)
    return cache.open(path)


def run_job(job: dict, device: str) -> dict:
    m = market(job.get("market", {}))
    folds = make_folds(m.ts, FoldSpec(**job.get("folds", {})))
    data = DeviceData(m, device)
    ppy = data.calendar.periods_per_year
    cfg = DQNConfig(**job.get("cfg", {}))
    trainer = Trainer(data, cfg)
    seeds, ensemble = tuple(job.get("seeds", [0])), bool(job.get("ensemble"))
    t0 = time.time()
    tests = {s: [] for s in seeds}
    ens, refs, best_epochs = [], {}, []
    for f in folds:
        qs = []
        for s in seeds:
            r = trainer.run_fold(f, seed=(100 * s if ensemble else s) + f.k)
            tests[s].append(r.test_periods or NO_RESULT)
            best_epochs.append(r.best_epoch)
            if ensemble:
                qs.append(trainer.q_all(f.test))  # the kept weights are loaded after run_fold
        if ensemble:
            q = torch.stack(qs).mean(0)
            ens.append(backtest(q, data.window(f.test, cfg.fill), cfg.cost).periods.as_dict())
        for name, d in r.baseline_periods.items():
            refs.setdefault(name, []).append(d["test"])
    ref = {n: pooled.pooled(w, cfg.cost, ppy) for n, w in refs.items()}
    oracle = ref.get("oracle")

    def stat(windows):
        p = pooled.pooled(windows, cfg.cost, ppy)
        return {
            "sharpe": p["sharpe"],
            "sharpe_se": p["sharpe_se"],
            "n_trades": p["n_trades"],
            "oracle_share": pooled.oracle_share(p, oracle),
        }

    out = {
        "tag": job.get("tag", ""),
        "wall_s": time.time() - t0,
        "oracle": oracle and oracle["sharpe"],
        "ridge": ref["ridge"]["sharpe"],
        "seeds": {str(s): stat(tests[s]) for s in seeds},
        "best_epochs": best_epochs,
    }
    if ensemble:
        out["ensemble"] = stat(ens)
    return out


def line(r: dict) -> str:
    def share(x):
        return "n/a" if x is None else f"{x:.2f}"

    seeds = " ".join(f"s{s} {v['sharpe']:+.2f} ({share(v['oracle_share'])})" for s, v in r["seeds"].items())
    ens = (
        f" | ensemble {r['ensemble']['sharpe']:+.2f} ({share(r['ensemble']['oracle_share'])})"
        if "ensemble" in r
        else ""
    )
    oracle = "n/a" if r["oracle"] is None else f"{r['oracle']:+.2f}"
    return f"{r['tag']:<24} {r['wall_s']:5.0f}s oracle {oracle} ridge {r['ridge']:+.2f} | test (share) {seeds}{ens}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", type=Path, metavar="GRID.json", help="a JSON list of jobs (scripts/grids/)")
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        metavar="DEVICE",
        help="cpu or cuda (default: cuda when there is one)",
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every job's numbers here")
    args = p.parse_args(argv)
    os.environ.setdefault("FXRAY_CACHE_DIR", str(Path.home() / ".cache" / "fxray"))
    jobs = json.loads(args.grid.read_text())
    results = []
    for job in jobs:
        results.append(run_job(job, args.device))
        print(line(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
