"""Train one DQN config over every walk-forward fold, with no Ray.

    python -m fxray.train                                  # embedded synthetic market
    python -m fxray.train --data eurusd.fxcache --epochs 3 --folds 0,1 --device cuda
    python -m fxray.train --set lr=1e-3 --set hidden=128 --json result.json
    # tiny CPU run (seconds):
    python -m fxray.train --synth-bars 60000 --set steps_per_epoch=50 --epochs 2 --folds 0

A line per epoch (loss, val Sharpe, epoch time), then a per-fold table: val and
test Sharpe of the selected epoch against buy-and-hold and flat on the test window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fxray import cache
from fxray.config import DQNConfig
from fxray.device import DeviceData
from fxray.folds import FoldSpec, make_folds
from fxray.trainer import Trainer


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is visible here; use --device cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"--device {name!r}: use cpu, cuda, cuda:N or auto")
    return name


def parse_sets(pairs: list[str]) -> dict:
    """['lr=1e-3', 'dueling=false'] -> {'lr': 0.001, 'dueling': False} (YAML scalars)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {pair!r}: write KEY=VALUE, e.g. --set lr=1e-3")
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_folds(text: str | None, n: int) -> list[int]:
    if text in (None, "all"):
        return list(range(n))
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise ValueError(f"--folds {text!r}: give fold numbers like 0,2 or 'all'") from None
    bad = [k for k in ks if not 0 <= k < n]
    if bad:
        raise ValueError(f"--folds: fold(s) {bad} do not exist; this data has folds 0..{n - 1}")
    return ks


def _default_experiment() -> str:
    # TODO(lead): move beside fxray.experiment.load once the runner lands, shared with tune.py
    here = Path("experiments/default.yaml")
    beside = Path(__file__).resolve().parents[1] / here
    return str(here if here.exists() else beside)


def load_setup(args):
    """(market path, FoldSpec, DQNConfig, experiment name) from the CLI and the experiment file.

    The experiment's `cpu:` profile applies when training on the CPU, as in the sweep.
    """
    from fxray import experiment as exp_mod
    from fxray import synth

    file = args.experiment or _default_experiment()
    profile = "cpu" if args.device == "cpu" else "gpu"
    overrides = {f"data.synth.n_bars": args.synth_bars} if args.synth_bars else {}
    exp = exp_mod.load(file, profile, overrides)
    sets = parse_sets(args.set or [])
    if args.epochs is not None:
        sets["epochs"] = args.epochs
    cfg = DQNConfig.from_dict({**exp.dqn.as_dict(), **sets}, where="--set")
    data_path = args.data or exp.data_path or synth.ensure_default(exp.synth, log=print)
    return data_path, exp.folds, cfg, f"{exp.name} ({profile} profile)"


def fold_table(results: list[dict]) -> str:
    head = (f"{'fold':>4} {'status':>8} {'best':>4} {'val SR':>8} {'test SR':>8} {'B&H SR':>8} "
            f"{'flat SR':>8} {'test DD':>8} {'trades':>7} {'ADX':>6} {'time s':>7}")
    rows = [head, "-" * len(head)]
    for r in results:
        val, test, bh = r["val"], r["test"], r["baselines"]["buy_and_hold"]
        rows.append(f"{r['fold']['k']:>4} {r['status']:>8} {r['best_epoch']:>4} "
                    f"{val.get('sharpe', float('nan')):>8.2f} {test.get('sharpe', float('nan')):>8.2f} "
                    f"{bh['sharpe']:>8.2f} {r['baselines']['flat']['sharpe']:>8.2f} "
                    f"{test.get('max_drawdown', float('nan')):>8.4f} {test.get('n_trades', 0):>7} "
                    f"{r['adx']:>6.1f} {r['timings']['total_s']:>7.1f}")
    if results:
        mean = lambda k: float(np.nanmean([r[k].get("sharpe", np.nan) for r in results]))  # noqa: E731
        rows.append(f"mean val Sharpe {mean('val'):+.2f}   mean test Sharpe {mean('test'):+.2f}")
    return "\n".join(rows)


def run(args) -> dict:
    device = resolve_device(args.device)
    args.device = device
    data_path, spec, cfg, name = load_setup(args)
    t0 = time.perf_counter()
    market = cache.open(data_path)
    folds = make_folds(market.ts, spec)
    chosen = parse_folds(args.folds, len(folds))
    data = DeviceData(market, device, dtype=cfg.dtype)
    t_load = time.perf_counter() - t0
    print(f"fxray.train: {name} on {data_path} ({market.n_bars:,} bars), {len(chosen)}/{len(folds)} folds, "
          f"device {device}, {cfg.epochs} epochs x {cfg.steps_per_epoch} steps, batch {cfg.batch_size}, "
          f"{cfg.num_envs} envs (load {t_load:.2f}s)", flush=True)
    trainer = Trainer(data, cfg)
    results = []
    for k in chosen:
        ckpt = args.checkpoint_dir / f"seed{args.seed}" if args.checkpoint_dir else None
        r = trainer.run_fold(folds[k], seed=args.seed + k, log=lambda s: print(s, flush=True),
                             checkpoint_dir=ckpt)
        results.append(r.as_dict())
    print(fold_table(results))
    return {"experiment": name, "data": str(data_path), "content_hash": market.content_hash,
            "device": device, "seed": args.seed, "config": cfg.as_dict(), "fold_spec": spec.__dict__,
            "folds": results, "timings": {"load_s": t_load, "total_s": time.perf_counter() - t0},
            "mean_val_sharpe": float(np.nanmean([r["val"].get("sharpe", np.nan) for r in results])),
            "mean_test_sharpe": float(np.nanmean([r["test"].get("sharpe", np.nan) for r in results]))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fxray.train", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, help="an fxcache (default: the experiment's data, else the synthetic market)")
    p.add_argument("--experiment", type=Path, help="experiment YAML for folds and the base config "
                   "(default: experiments/default.yaml)")
    p.add_argument("--epochs", type=int, help="max epochs per fold (overrides the config)")
    p.add_argument("--folds", help="fold numbers, e.g. 0,2 (default: all)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--seed", type=int, default=0, help="fold k trains with seed + k")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a DQNConfig field")
    p.add_argument("--synth-bars", type=int, help="size of the synthetic market when no --data")
    p.add_argument("--checkpoint-dir", type=Path, help="write each fold's best weights here (safetensors + JSON)")
    p.add_argument("--json", type=Path, help="write per-fold metrics, config and timings as JSON")
    args = p.parse_args(argv)
    try:
        result = run(args)
    except (ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=float))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
