"""A sweep's chosen trial, scored the honest way: its saved weights on every fold's val and
test windows, pooled hourly, beside the oracle and the ridge rule on the same windows.

    python lab/rescore.py runs/default/results.json [--data X.fxcache] [--json out.json]

Works on any fxray results.json that names its best trial and kept its checkpoints (the
run directory's checkpoints/<trial>/fold<k>.safetensors; a fold it abstained on, dqn.abstain,
counts flat), including those of versions
that selected by the mean of per-fold daily Sharpe ratios: it is how the "before" of
docs/benchmarks.md was scored. It prints what that sweep selected on (the best trial's
mean per-fold val Sharpe) against what its weights earn out of sample, pooled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a sweep's results.json")
    p.add_argument("--data", type=Path, help="the fxcache it ran on (default: the one results.json names)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from fxray.data import cache
    from fxray.data.folds import Fold
    from fxray.eval import pooled
    from fxray.rl.checkpoint import abstained
    from fxray.rl.config import make_config
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer, flat_fold, load_checkpoint

    res = json.loads(args.results.read_text())
    best = next(t for t in res["trials"] if t["trial_id"] == res["best"]["trial_id"])
    seeds = int(best["config"].get("seeds", 1))
    if seeds > 1:  # its members' mean Q is its policy, and results.json already pools it honestly
        print(
            f"rescore: error: {args.results}: the best trial is a seed ensemble (seeds = {seeds}); "
            "rescore reads one network a fold: its pooled val and test are results.json's best.val and best.test",
            file=sys.stderr,
        )
        return 2
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    market = cache.open(args.data or res["data"]["path"])
    data = DeviceData(market, device)
    ppy = data.calendar.periods_per_year
    known = set(make_config({}).as_dict())
    cfg = make_config({k: v for k, v in best["config"].items() if k in known})
    trainer = Trainer(data, cfg)
    ckpts = Path(res["storage"]) / "checkpoints" / best["trial_id"]
    windows = {"val": [], "test": []}
    refs: dict = {}
    for f in best["folds"]:
        fold = Fold.from_dict(next(x for x in res["folds"] if x["k"] == f["fold"]))
        path = ckpts / f"fold{fold.k}.safetensors"
        data.set_fold(fold)  # the fold's train-slice normalisation, as in training
        if path.exists():
            tensors, _ = load_checkpoint(path)
            trainer.algo.learner.q_network.load_state_dict({k: v.to(device) for k, v in tensors.items()})
            for w in windows:
                windows[w].append(trainer.evaluate(getattr(fold, w)).periods.as_dict())
            periods = trainer._references(fold)[1]
        elif abstained(ckpts, fold.k):  # not trained, flat (dqn.abstain): its zero returns count too
            (flat,) = flat_fold(data, fold, [cfg], 0.0)
            windows["val"].append(flat.val_periods)
            windows["test"].append(flat.test_periods)
            periods = flat.baseline_periods
        else:
            continue
        for name, d in periods.items():
            refs.setdefault(name, []).append(d["test"])
    stats = {w: pooled.pooled(ws, cfg.cost, ppy) for w, ws in windows.items()}
    ref_stats = {n: pooled.pooled(ws, cfg.cost, ppy) for n, ws in refs.items()}
    selected_on = best.get("mean_val_sharpe")
    out = {
        "results": str(args.results),
        "trial_id": best["trial_id"],
        "folds": len(windows["test"]),
        "selected_on_mean_val_sharpe": selected_on,
        "mean_test_sharpe": best.get("mean_test_sharpe"),
        "pooled": stats,
        "baselines": ref_stats,
        "oracle_share": pooled.oracle_share(stats["test"], ref_stats.get("oracle")),
    }
    print(f"{'':<28} {'val':>8} {'test':>8}")
    print(
        f"{'mean of per-fold Sharpe':<28} {selected_on or float('nan'):>+8.2f} "
        f"{best.get('mean_test_sharpe') or float('nan'):>+8.2f}   (daily, per window: what older sweeps selected on)"
    )
    print(
        f"{'pooled hourly Sharpe':<28} {stats['val']['sharpe']:>+8.2f} {stats['test']['sharpe']:>+8.2f} "
        f"± {stats['test']['sharpe_se'] or float('nan'):.2f}"
    )
    for name, s in ref_stats.items():
        print(f"{name + ' (test)':<28} {'':>8} {s['sharpe']:>+8.2f}")
    share = out["oracle_share"]
    print(f"share of the oracle: {'n/a' if share is None else f'{share:.2f}'}; trades {stats['test']['n_trades']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
