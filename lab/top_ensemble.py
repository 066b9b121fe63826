"""Does averaging the sweep's best few policies beat its one best? The top N full trials by
pooled val Sharpe, per fold one policy: the mean of their normalised advantages, greedy, on
that fold's val and test windows, pooled hourly beside the oracle and the ridge rule.

    python lab/top_ensemble.py runs/default/results.json [--n 1,3,5,10,all] [--json out.json]

Why: on the H200 a config's fold result moved by ~5 val Sharpe when only the float rounding
of its training changed (docs/benchmarks.md, "Populations under the sweep"), as much as it
moves between configs. The chosen trial is then one draw; N policies of similar val score
average some of that noise away, as bagging does. Selection sees the val windows only: the
ranking is by pooled val Sharpe, and each member's advantage scale is its val window's.

How members combine (`--combine advantage`, the default, or `vote`) is fxray.sweep.vote's;
every sweep reports the vote of all its full trials itself (results.json "ensemble"). This
script varies N. Needs the run directory's checkpoints.
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
    from fxray.eval import pooled
    from fxray.sweep import vote

    res = json.loads(args.results.read_text())
    data = vote.sweep_data(res, args.data, args.device)
    n_folds = len(res["folds"])
    full = vote.full_trials(res)
    if not full:
        sys.exit(f"{args.results}: no trial ran all {n_folds} folds")
    sizes = sorted({len(full) if n == "all" else min(n, len(full)) for n in args.n})
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    combined = vote.combine_trials(res, data, sizes, args.combine, log)
    ref_stats = res["best"]["baselines"]  # every full trial ran every fold: the same test windows
    rows = []
    for n in sizes:
        val, test = combined[n]["val"], combined[n]["test"]
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
