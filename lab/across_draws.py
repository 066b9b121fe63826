"""A learner judged over fresh draws of its market (issue 17): per config and market, the mean
share of the oracle over market draws (each draw a SynthSpec seed), beside the ridge rule's on
the same draws, with standard errors over draws, and paired differences.

    python lab/across_draws.py GRID.json RESULTS.json [GRID.json RESULTS.json ...] [--json PATH]

Each pair is a grid file (lab/grids/) and what lab/grid_parallel.py or
lab/learner_grid.py wrote for it (--json); several pairs merge, so draws run in different
calls add up. Jobs are matched to results by tag and grouped by everything but the market's
seed and the learner seeds: one group is one config on one market, its draws the jobs of the
group. Per draw, the policy's share is the mean over the seeds that ran it; the group's share is
the mean over draws and its error the draws' spread (sd / sqrt(draws)), which holds the market's
own luck: on 12 test windows of 5 days one draw's oracle Sharpe moves by ~2.5 (4.3 to 9.7 over
draws 0-7 of the default market), and a learner's share with it. Two differences, paired by
draw: the policy against the ridge rule (the supervised baseline), and against the first group
of the same market in the order given (over the draws and seeds both ran).

Why: the GPU learner's design was measured on draw 0 of each market for many rounds; on draws
1-7 the same config reached a different share (docs/benchmarks.md "Fresh draws").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

DRAW = re.compile(r"(,\s*)?(fresh )?draw \(?(seed )?\d+\)?")


def group_key(job: dict) -> str:
    """Everything that defines a config on a market, except the market's seed and the learner seeds."""
    rest = {k: v for k, v in job.items() if k not in ("tag", "seeds")}
    rest["market"] = {k: v for k, v in job.get("market", {}).items() if k != "seed"}
    return json.dumps(rest, sort_keys=True)


def market_key(job: dict) -> str:
    return json.dumps({k: v for k, v in job.get("market", {}).items() if k != "seed"}, sort_keys=True)


def mean_se(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def collect(pairs: list[tuple[dict, dict]]) -> list[dict]:
    """Groups in order of first appearance: {label, market, draws: {seed: {oracle, ridge_share, seeds}}}."""
    groups: dict[str, dict] = {}
    for grid, results in pairs:
        by_tag = {r["tag"]: r for r in results}
        for job in grid:
            r = by_tag.get(job["tag"])
            if r is None or not r.get("oracle") or r["oracle"] <= 0:
                continue  # not run, or no oracle to share (the twin)
            g = groups.setdefault(
                group_key(job), {"label": DRAW.sub("", job["tag"]).strip(" ,:"), "market": market_key(job), "draws": {}}
            )
            d = g["draws"].setdefault(
                job.get("market", {}).get("seed", 0),
                {"oracle": r["oracle"], "ridge_share": r["ridge"] / r["oracle"], "seeds": {}},
            )
            for s, v in r["seeds"].items():
                if v.get("oracle_share") is not None:
                    d["seeds"][int(s)] = v["oracle_share"]
    return list(groups.values())


def summarise(groups: list[dict]) -> list[dict]:
    first_of_market: dict[str, dict] = {}
    out = []
    for g in groups:
        draws = {k: v for k, v in sorted(g["draws"].items()) if v["seeds"]}
        share = {k: sum(v["seeds"].values()) / len(v["seeds"]) for k, v in draws.items()}
        row = {
            "label": g["label"],
            "market": json.loads(g["market"]),
            "draws": {
                str(k): {
                    "oracle": v["oracle"],
                    "ridge_share": v["ridge_share"],
                    "share": share[k],
                    "seeds": len(v["seeds"]),
                }
                for k, v in draws.items()
            },
        }
        row["share_mean"], row["share_se"] = mean_se(list(share.values()))
        row["ridge_share_mean"], row["ridge_share_se"] = mean_se([v["ridge_share"] for v in draws.values()])
        m, se = mean_se([share[k] - v["ridge_share"] for k, v in draws.items()])
        row["vs_ridge"] = {"mean": m, "se": se}
        base = first_of_market.setdefault(g["market"], g)
        if base is not g:
            diffs = []
            for k, v in draws.items():
                b = base["draws"].get(k, {"seeds": {}})["seeds"]
                common = sorted(set(v["seeds"]) & set(b))
                if common:
                    diffs.append(sum(v["seeds"][s] - b[s] for s in common) / len(common))
            m, se = mean_se(diffs)
            row["vs_first"] = {"label": base["label"], "mean": m, "se": se, "draws": len(diffs)}
        out.append(row)
    return out


def fmt(m, se) -> str:
    if m is None:
        return "n/a"
    return f"{m:+.2f}" + ("" if se is None else f" ± {se:.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "files", nargs="+", type=Path, metavar="GRID.json RESULTS.json", help="pairs of a grid and its results"
    )
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the table here")
    args = p.parse_args(argv)
    if len(args.files) % 2:
        print(
            "across_draws.py: error: give pairs GRID.json RESULTS.json (an odd number of files given)", file=sys.stderr
        )
        return 2
    pairs = []
    for grid, results in zip(args.files[::2], args.files[1::2]):
        try:
            pairs.append((json.loads(grid.read_text()), json.loads(results.read_text())))
        except (OSError, ValueError) as e:
            print(f"across_draws.py: error: {e}: each pair is a grid file and its --json results", file=sys.stderr)
            return 2
    rows = summarise(collect(pairs))
    if not rows:
        print(
            "across_draws.py: error: no job of the grids has results with an oracle; check the pairs' order",
            file=sys.stderr,
        )
        return 2
    for r in rows:
        n = len(r["draws"])
        print(f"\n{r['label']}  ({n} draws)")
        for k, v in r["draws"].items():
            policy = f"{v['share']:+.2f} ({v['seeds']} seeds)"
            print(f"  draw {k}: oracle {v['oracle']:+.2f}  ridge {v['ridge_share']:+.2f}  policy {policy}")
        print(
            f"  over draws: policy {fmt(r['share_mean'], r['share_se'])}"
            f"  ridge {fmt(r['ridge_share_mean'], r['ridge_share_se'])}"
            f"  policy - ridge {fmt(r['vs_ridge']['mean'], r['vs_ridge']['se'])}"
        )
        if r.get("vs_first", {}).get("draws"):
            v = r["vs_first"]
            print(f"  paired with {v['label']!r} on {v['draws']} draws: {fmt(v['mean'], v['se'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
