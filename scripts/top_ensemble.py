"""Does averaging the sweep's best few policies beat its one best? The top N full trials by
pooled val Sharpe, per fold one policy: the mean of their normalised advantages, greedy, on
that fold's val and test windows, pooled hourly beside the oracle and the ridge rule.

    python scripts/top_ensemble.py runs/default/results.json [--n 1,3,5,10,all] [--json out.json]

Why: on the H200 a config's fold result moved by ~5 val Sharpe when only the float rounding
of its training changed (docs/benchmarks.md, "Populations under the sweep"), as much as it
moves between configs. The chosen trial is then one draw; N policies of similar val score
average some of that noise away, as bagging does. Selection sees the val windows only: the
ranking is by pooled val Sharpe, and each member's advantage scale is its val window's.

Members may differ in gamma, n_step and reward scale, so raw Q-values are not comparable:
member k's advantage A_k = Q_k - mean over actions, divided by its standard deviation over
the fold's val window; the ensemble acts greedily on the mean of those. `--combine vote`
instead: each member votes for its own greedy action at every bar and position, and the
ensemble takes the action most members chose (ties: the lower action index, as argmax breaks
them). Needs the run directory's checkpoints (checkpoints/<trial>/fold<k>.safetensors).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_ns(text: str) -> list:
    return [x if x == "all" else int(x) for x in text.split(",")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a sweep's results.json (its run directory kept the checkpoints)")
    p.add_argument("--n", type=parse_ns, default=parse_ns("1,3,5,10,all"), help="ensemble sizes (default 1,3,5,10,all)")
    p.add_argument("--data", type=Path, help="the fxcache it ran on (default: the one results.json names)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--combine", choices=("advantage", "vote"), default="advantage", help="how members combine")
    p.add_argument("--json", type=Path, help="write the numbers here")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from fxray.data import cache
    from fxray.data.folds import Fold
    from fxray.eval import pooled
    from fxray.eval.backtest import backtest
    from fxray.rl.config import make_config
    from fxray.rl.device import DeviceData
    from fxray.rl.trainer import Trainer, load_checkpoint

    res = json.loads(args.results.read_text())
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    data = DeviceData(cache.open(args.data or res["data"]["path"]), device)
    ppy = data.calendar.periods_per_year
    n_folds = len(res["folds"])
    full = [t for t in res["trials"] if t["status"] == "ok" and t["folds_done"] >= n_folds]
    if not full:
        sys.exit(f"{args.results}: no trial ran all {n_folds} folds")
    full.sort(key=lambda t: t["val"]["sharpe"], reverse=True)
    sizes = sorted({len(full) if n == "all" else min(n, len(full)) for n in args.n})
    known = set(make_config({}).as_dict())
    ckpts = Path(res["storage"]) / "checkpoints"
    cost = make_config({k: v for k, v in full[0]["config"].items() if k in known}).cost
    trainers: dict = {}

    def advantages(trial: dict, fold: Fold) -> dict:
        """{window: the member's (T, 3, 3) advantages over that window, scaled by its val std}."""
        cfg = make_config({k: v for k, v in trial["config"].items() if k in known})
        trainer = trainers.setdefault(json.dumps(cfg.as_dict(), sort_keys=True), Trainer(data, cfg))
        tensors, _ = load_checkpoint(ckpts / trial["trial_id"] / f"fold{fold.k}.safetensors")
        trainer.algo.learner.q_network.load_state_dict({k: v.to(device) for k, v in tensors.items()})
        out = {}
        for w in ("val", "test"):
            q = trainer.q_all(getattr(fold, w))
            out[w] = q - q.mean(-1, keepdim=True)
        if args.combine == "vote":  # one-hot greedy actions: their mean is the share of votes
            return {w: torch.nn.functional.one_hot(a.argmax(-1), a.shape[-1]).to(a.dtype) for w, a in out.items()}
        scale = out["val"].std().clamp_min(1e-12)
        return {w: a / scale for w, a in out.items()}

    periods = {n: {"val": [], "test": []} for n in sizes}
    refs: dict = {}
    ref_trainer = Trainer(data, make_config({k: v for k, v in full[0]["config"].items() if k in known}))
    for fd in res["folds"]:
        fold = Fold.from_dict(fd)
        data.set_fold(fold)  # the fold's train-slice normalisation, as in training
        members = [advantages(t, fold) for t in full[: sizes[-1]]]
        for n in sizes:
            for w in ("val", "test"):
                mean = torch.stack([m[w] for m in members[:n]]).mean(0)
                result = backtest(mean, data.window(getattr(fold, w), ref_trainer.cfg.fill), cost)
                periods[n][w].append(result.periods.as_dict())
        _, ref_periods = ref_trainer._references(fold)
        for name, d in ref_periods.items():
            refs.setdefault(name, []).append(d["test"])
        print(f"fold {fold.k}: {len(members)} members scored", file=sys.stderr, flush=True)
    ref_stats = {name: pooled.pooled(ws, cost, ppy) for name, ws in refs.items()}
    rows = []
    for n in sizes:
        val, test = (pooled.pooled(periods[n][w], cost, ppy) for w in ("val", "test"))
        rows.append(
            {
                "n": n,
                "val_sharpe": val["sharpe"],
                "test_sharpe": test["sharpe"],
                "test_sharpe_se": test["sharpe_se"],
                "test_n_trades": test["n_trades"],
                "oracle_share": pooled.oracle_share(test, ref_stats.get("oracle")),
            }
        )
    print(
        f"{args.results}: {len(full)} full trials of {res['n_trials']}, {n_folds} folds, ranked by pooled val "
        f"Sharpe; combined by {args.combine}"
    )
    print(f"{'top N':>6} {'val':>7} {'test':>7} {'± se':>6} {'trades':>7} {'share':>6}")
    for r in rows:
        share = "n/a" if r["oracle_share"] is None else f"{r['oracle_share']:.2f}"
        print(
            f"{r['n']:>6} {r['val_sharpe']:>+7.2f} {r['test_sharpe']:>+7.2f} {r['test_sharpe_se'] or 0:>6.2f} "
            f"{r['test_n_trades']:>7} {share:>6}"
        )
    for name, s in ref_stats.items():
        print(f"{name + ' (test)':>22} {s['sharpe']:>+7.2f}")
    if args.json:
        out = {
            "results": str(args.results),
            "combine": args.combine,
            "full_trials": len(full),
            "rows": rows,
            "baselines": ref_stats,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
