"""Where a fresh device process spends its first fold (what a FoldWorker pays once).

    python lab/coldstart.py [--experiment experiments/default.yaml] [--json out.json]

Runs in a new process, in the order a FoldWorker does it: import torch, CUDA
init, import fxray's trainer, upload the experiment's market, build a Trainer
for the base config, then its first fold phase by phase (fold switch, graph
capture, one epoch, val backtest); then the same again for a second config
(another hidden size) and a whole second fold, which are the per-trial costs
that remain once the process is warm. Prints a table of seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
rows: list[tuple[str, float]] = []


def mark(what: str, t_prev: list) -> None:
    now = time.perf_counter()
    rows.append((what, now - t_prev[0]))
    t_prev[0] = now


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default=str(Path(__file__).resolve().parents[1] / "experiments/default.yaml"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    t = [time.perf_counter()]
    import torch

    mark("import torch", t)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.zeros(1, device=dev).add_(1).cpu()
    mark(f"CUDA context + first op ({dev})", t)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fxray.data import cache, synth
    from fxray.data.arrays import host_arrays
    from fxray.data.folds import make_folds
    from fxray.rl import experiment
    from fxray.rl.config import make_config
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer

    mark("import fxray (trainer, device, config)", t)
    exp = experiment.load(args.experiment, "gpu" if dev == "cuda" else "cpu")
    market = cache.open(exp.data_path or synth.ensure_default(exp.synth))
    folds = make_folds(market.ts, exp.folds)
    mark("open the market, make folds", t)
    data = DeviceData(host_arrays(market), device=dev)
    data.synchronize()
    mark(f"upload {market.n_bars:,} bars", t)
    sync = data.synchronize
    for label, cfg in (
        ("base config", exp.config),
        ("second config", make_config({**exp.config.as_dict(), "hidden": 128 if exp.config.hidden != 128 else 256})),
    ):
        trainer = Trainer(data, cfg)
        sync()
        mark(f"{label}: Trainer() (networks, replay, optimizer)", t)
        trainer._begin(folds[0], 0)
        sync()
        mark(f"{label}: fold switch + warm-up collects", t)
        if trainer.use_graph:
            trainer._capture()
            sync()
            mark(f"{label}: CUDA graph capture (3 eager steps + capture)", t)
        for _ in range(cfg.steps_per_epoch):
            trainer.graph.replay() if trainer.graph is not None else trainer._step()
        sync()
        mark(f"{label}: one epoch ({cfg.steps_per_epoch} steps)", t)
        trainer.evaluate(folds[0].val)
        sync()
        mark(f"{label}: val backtest", t)
        trainer.run_fold(folds[1 % len(folds)], 0)
        mark(f"{label}: a whole fold after that ({cfg.epochs} epochs max)", t)
    rows.append(("total since process start", time.perf_counter() - T0))
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"fxray coldstart  torch {torch.__version__}  {name}")
    for what, sec in rows:
        print(f"  {what:<62} {sec:8.3f} s")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
