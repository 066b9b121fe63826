"""The oracle-share table: per sweep, the chosen trial's pooled test Sharpe beside the planted
market's oracle and the ridge rule on the same test windows, and its share of the oracle
with that share's standard error (fxray.eval.pooled.oracle_share_se).

    python lab/oracle_share.py runs/default/results.json runs/session/results.json ...

Reads what fxray.tune wrote (results.json: best.test, best.baselines); prints one row per
file, best first among the trials that ran every fold, then the best full trial's share
(what selection could have found).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(path: str) -> dict:
    r = json.loads(Path(path).read_text())
    b, n_folds = r["best"], len(r["folds"])
    full = [t for t in r["trials"] if t["folds_done"] >= n_folds and t["status"] == "ok"]
    oracle = b["baselines"].get("oracle", {}).get("sharpe")
    best_full = max((t["test"]["sharpe"] for t in full), default=None)
    return {
        "sweep": r["experiment"],
        "trials": r["n_trials"],
        "full": len(full),
        "oracle": oracle,
        "ridge": b["baselines"].get("ridge", {}).get("sharpe"),
        "chosen": b["test"]["sharpe"],
        "se": b["test"]["sharpe_se"],
        "share": b["test"].get("oracle_share"),
        "share_se": b["test"].get("oracle_share_se"),  # absent in results.json written before 2026-12-03
        "dsr": b.get("dsr"),
        "best_full_share": best_full / oracle if oracle and best_full is not None and oracle > 0 else None,
        "walk_forward": (b.get("walk_forward") or {}).get("sharpe"),
        "wall_s": r["wall_s"],
    }


def main(argv=None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2

    def f(v, spec="+6.2f"):
        return "n/a".rjust(6) if v is None else format(v, spec)

    print(
        f"{'sweep':<10} {'trials':>6} {'full':>4} {'oracle':>6} {'ridge':>6} {'chosen':>6} {'± se':>5} "
        f"{'share':>6} {'± se':>5} {'DSR':>5} {'best full share':>15} {'walk-fwd':>8} {'wall s':>6}"
    )
    for p in paths:
        x = row(p)
        print(
            f"{x['sweep']:<10} {x['trials']:>6} {x['full']:>4} {f(x['oracle'])} {f(x['ridge'])} {f(x['chosen'])} "
            f"{f(x['se'], '5.2f')} {f(x['share'], '6.2f')} {f(x['share_se'], '5.2f')} {f(x['dsr'], '5.2f')} "
            f"{f(x['best_full_share'], '15.2f')} {f(x['walk_forward'], '+8.2f')} {x['wall_s']:>6.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
