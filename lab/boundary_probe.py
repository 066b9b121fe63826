"""Where a population's boundary goes (issue 50): on the GPU the sweep's trained populations sit
idle ~1 s at each end and start (nvidia-smi each second, lab/notes.md thirteenth stop). This runs
one population's fold as the worker does (Trainer.run_fold with checkpoint folders), twice on one
trainer (the second is timed: no capture), and splits its wall into the fold switch, the training,
the members' evaluation (FoldResult.timings), the seed ensembles' mean-Q backtests with the
rest, and the checkpoints; then the same without checkpoints.

    python lab/boundary_probe.py --device cuda --trials 41 --seeds 3 --hidden 128   # one GPU: ~1 min
    python lab/boundary_probe.py --device cpu --quick                               # the script itself

A probe: its numbers go to the note, not to a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learner_profile as lp  # noqa: E402  (its market, configs and imports of fxray)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--trials", type=int, default=41)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    bars, batch, envs, hidden, k = (
        (20_000, 64, 16, 32, 3) if a.quick else (1_000_000, a.batch, 2048, a.hidden, a.trials)
    )
    data = lp.DeviceData(lp.bp.random_market(bars), dev)
    vb = bars // 10
    # three folds, one a run: a sweep's next population is on another fold (its switch is real)
    folds = [
        lp.Fold(
            i, (s, bars - 2 * vb - 200 - d), (bars - 2 * vb - 100 - d, bars - vb - 100 - d), (bars - vb - d, bars - d)
        )
        for i, (s, d) in enumerate(((0, 0), (vb // 4, vb // 4), (vb // 2, vb // 2)))
    ]
    cfgs = [
        c.replace(seeds=a.seeds, epochs=2, steps_per_epoch=20, select_from=0, keep="best")
        for c in lp.configs(k, batch, envs, hidden, dev.type == "cuda", 1.0)
    ]
    trainer = lp.Trainer(data, cfgs)
    for fold, label, saving in zip(
        folds, ("first (capture)", "with checkpoints", "without checkpoints"), (True, True, False)
    ):
        with tempfile.TemporaryDirectory() as tmp:
            dirs = [str(Path(tmp) / f"t{j}") for j in range(k)] if saving else None
            sync()
            t0 = time.perf_counter()
            results = trainer.run_fold(fold, list(range(k)), checkpoint_dirs=dirs)
            sync()
            wall = time.perf_counter() - t0
        t = results[0].timings  # a seed ensemble's total_s ends after its mean-Q backtests
        parts = {n: t[f"{n}_s"] for n in ("fold_switch", "train", "eval")}
        parts["ensembles and the rest"] = t["total_s"] - sum(parts.values())
        parts["checkpoints"] = wall - max(r.timings.get("total_s", 0.0) for r in results)
        print(
            f"{label:>20}: {k} trials x {a.seeds} seeds, wall {wall:.3f} s = "
            + ", ".join(f"{n} {v:.3f}" for n, v in parts.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
