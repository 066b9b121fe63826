"""What a fold's setup costs in the device thread (issue 50): on the GPU the sweep's first
populations are abstained folds whose time is the fold's screen and references (~0.2 s each on an
H100, the GPU mostly idle). For each fold of an experiment (the default's, or 137d152's equal
work with `--set`), on a fresh DeviceData: the fold switch (set_fold), the screen (abstains) and
the references (fxray.rl.references), each timed after a device sync, and the same fold again
(cached: what a second trial pays).

    python lab/fold_setup_probe.py --device cuda
    python lab/fold_setup_probe.py --device cuda --set folds.val=5d --set folds.test=5d --set folds.max_folds=12
    python lab/fold_setup_probe.py --device cpu --folds 2                    # the script itself

A probe: its numbers go to the note, not to a test.
"""

from __future__ import annotations

import argparse
import time

import torch

from fxray.data import cache, synth
from fxray.data.folds import make_folds
from fxray.rl import experiment
from fxray.rl.device import DeviceData
from fxray.rl.overrides import set_overrides
from fxray.rl.references import abstains, references


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--experiment", default="experiments/default.yaml")
    p.add_argument("--profile", default="gpu")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--folds", type=int, default=None, help="the first N folds only")
    a = p.parse_args()
    exp = experiment.load(a.experiment, a.profile, set_overrides(a.set))
    path = exp.data_path or synth.ensure_default(exp.synth)
    market = cache.open(path)
    cfg = exp.config
    data = DeviceData(market, a.device, dtype=cfg.dtype)
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    folds = make_folds(market.ts, exp.folds)[: a.folds]
    print(f"{len(folds)} folds, device {a.device}, screen_t {cfg.screen_t}, abstain {cfg.abstain}")
    print(f"{'fold':>4} {'switch s':>9} {'screen s':>9} {'refs s':>8} {'again s':>8}  abstains")
    tot = [0.0] * 4
    for fold in folds:
        sync()
        t0 = time.perf_counter()
        data.set_fold(fold)
        sync()
        t1 = time.perf_counter()
        flat = abstains(data, fold, cfg)
        sync()
        t2 = time.perf_counter()
        references(data, fold, cfg.cost, cfg.fill, cfg.screen_t)
        sync()
        t3 = time.perf_counter()
        abstains(data, fold, cfg), references(data, fold, cfg.cost, cfg.fill, cfg.screen_t)
        sync()
        t4 = time.perf_counter()
        parts = (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        tot = [x + y for x, y in zip(tot, parts)]
        print(f"{fold.k:>4} " + " ".join(f"{x:>8.3f} " for x in parts) + f" {flat}")
    print("all  " + " ".join(f"{x:>8.3f} " for x in tot))


if __name__ == "__main__":
    main()
