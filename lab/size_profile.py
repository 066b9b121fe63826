"""How big should a GPU profile's folds be? Fold time and Sharpe of candidate sizes.

    python lab/size_profile.py [--experiment experiments/default.yaml] [--configs 6]
                                   [--windows 8] [--long 60] [--short 20] [--json out.json]

Trains `--configs` configs drawn at random from the experiment's search space (seed 0),
each on `--windows` walk-forward folds spread over the experiment's market, once per
candidate size (agents, batch, learning-rate multiplier, training days). The val and
test windows are the same for every candidate: the folds are made with `--long` days of
training and the short candidates keep the last `--short` days of it. Prints one row per
candidate: mean fold time, epochs run, the time of a collect+learn step, the gradient
samples per second, and the mean val / test Sharpe (also of the best config). On a
machine without CUDA it runs one tiny candidate (to check the script, not to size).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

# agents, batch, lr multiplier, training days ("long"/"short")
CANDIDATES = [
    (256, 1024, 1, "short"),
    (256, 1024, 1, "long"),
    (1024, 4096, 1, "long"),
    (2048, 8192, 1, "long"),
    (1024, 4096, 3, "short"),
    (2048, 8192, 3, "long"),
    (1024, 4096, 3, "long"),
]
TINY = [(16, 64, 1, "short")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default=str(Path(__file__).resolve().parents[1] / "experiments/default.yaml"))
    p.add_argument("--configs", type=int, default=6, help="random configs from the search space")
    p.add_argument("--windows", type=int, default=8, help="folds, spread evenly over the market")
    p.add_argument("--long", type=int, default=60, help="days of training of the long candidates")
    p.add_argument("--short", type=int, default=20, help="days of training of the short candidates")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fxray.data import cache, synth
    from fxray.data.arrays import host_arrays
    from fxray.data.folds import Fold, make_folds
    from fxray.rl import experiment
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer

    torch.set_num_threads(1)  # as a FoldWorker
    cuda = torch.cuda.is_available()
    exp = experiment.load(args.experiment, "gpu")
    market = cache.open(exp.data_path or synth.ensure_default(exp.synth))
    ts = np.asarray(market.ts)
    folds = make_folds(ts, dataclasses.replace(exp.folds, train=f"{args.long}d", max_folds=None))
    windows = [folds[i] for i in np.linspace(0, len(folds) - 1, min(args.windows, len(folds))).round().astype(int)]

    def train_days(f: Fold, days: int) -> Fold:  # the same val/test, the last `days` of training
        start = int(np.searchsorted(ts, ts[f.train[1] - 1] - days * 86_400 * 10**9, side="right"))
        return Fold(f.k, (max(start, f.train[0]), f.train[1]), f.val, f.test)

    data = DeviceData(host_arrays(market), device="cuda" if cuda else "cpu")
    data.synchronize()
    rng = random.Random(0)
    configs = [{prm.name: draw(rng, prm) for prm in exp.search} for _ in range(args.configs)]
    rows = []
    for envs, batch, mult, length in CANDIDATES if cuda else TINY:
        days = args.long if length == "long" else args.short
        per_fold = []
        for i, sampled in enumerate(configs):
            if "lr" in sampled:
                sampled = {**sampled, "lr": sampled["lr"] * mult}
            cfg = exp.config.replace(num_envs=envs, batch_size=batch, **sampled)
            if not cuda:
                cfg = cfg.replace(hidden=16, epochs=2, steps_per_epoch=10, buffer_steps=32, episode_len=32)
            trainer = Trainer(data, cfg)
            for f in windows:
                t = time.perf_counter()
                r = trainer.run_fold(train_days(f, days), 0)
                data.synchronize()
                per_fold.append(
                    {
                        "config": i,
                        "fold_s": time.perf_counter() - t,
                        "epochs": r.epochs_run,
                        "train_s": r.timings.get("train_s", 0.0),
                        "steps": r.epochs_run * cfg.steps_per_epoch,
                        "val": r.val.get("sharpe", float("nan")),
                        "test": r.test.get("sharpe", float("nan")),
                    }
                )
        mean = lambda key, rs=per_fold: sum(r[key] for r in rs) / len(rs)  # noqa: E731
        by_config = [
            (
                mean("val", [r for r in per_fold if r["config"] == i]),
                mean("test", [r for r in per_fold if r["config"] == i]),
            )
            for i in range(len(configs))
        ]
        steps = sum(r["steps"] for r in per_fold)
        train_s = sum(r["train_s"] for r in per_fold)
        rows.append(
            {
                "agents": envs,
                "batch": batch,
                "lr_x": mult,
                "train_days": days,
                "fold_s": mean("fold_s"),
                "epochs_run": mean("epochs"),
                "step_ms": 1000 * train_s / steps,
                "samples_per_s": steps * batch / train_s,
                "val_sharpe": mean("val"),
                "test_sharpe": mean("test"),
                "best_config_val_test": list(max(by_config)),
            }
        )
    print(f"{len(configs)} configs x {len(windows)} folds each, on {torch.cuda.get_device_name() if cuda else 'CPU'}")
    print(
        f"{'agents':>6} {'batch':>6} {'lr x':>4} {'train':>5} {'fold s':>7} {'epochs':>6} {'step ms':>7} "
        f"{'samples/s':>10} {'val':>6} {'test':>6} {'best config val/test':>21}"
    )
    for r in rows:
        best = "{:.1f} / {:.1f}".format(*r["best_config_val_test"])
        print(
            f"{r['agents']:>6} {r['batch']:>6} {r['lr_x']:>4} {r['train_days']:>4}d {r['fold_s']:>7.3f} "
            f"{r['epochs_run']:>6.2f} {r['step_ms']:>7.3f} {r['samples_per_s'] / 1e6:>9.2f}M "
            f"{r['val_sharpe']:>6.1f} {r['test_sharpe']:>6.1f} {best:>21}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"configs": configs, "windows": [f.as_dict() for f in windows], "rows": rows}, indent=1)
        )
    return 0


def draw(rng: random.Random, prm):
    """One value of a search dimension (uniform in log space for loguniform)."""
    import math

    if prm.type == "choice":
        return rng.choice(list(prm.values))
    if prm.type in ("int", "randint"):
        return rng.randint(int(prm.low), int(prm.high))
    if prm.type == "loguniform":
        return math.exp(rng.uniform(math.log(prm.low), math.log(prm.high)))
    return rng.uniform(prm.low, prm.high)


if __name__ == "__main__":
    sys.exit(main())
