"""How much of a planted market's edge can be found from a fold's train slice at all (issue 17).

The oracle (fxray.eval.baselines) is told two things the learner is not: which input columns
carry the signal, and in which hours it is on. This script fits the same ridge + hysteresis
rule on each fold's train slice with each of those pieces of knowledge taken away in turn,
and scores them on the same test windows, pooled, beside the oracle:

    oracle           the planted columns, the true hours (the yardstick of every share)
    cols, arc        the planted columns; the hours an arc [a, b) of the day chosen on train
                     (the arc whose bars' in-sample P&L of the columns' signal has the largest
                     t-statistic over days): the edge's shape known to be one arc, not where
    cols, hours t>2  the planted columns; the hours whose train t-statistic is above 2
    cols, all day    the planted columns, no gate
    all, true hours  every input, the true hours
    all, arc         every input; the arc chosen on train as above
    ridge            every input, no gate (fxray's supervised baseline)
    t>2.5, t>3       the market inputs whose next-bar t-statistic on train passes 2.5 or 3
                     (fxray.eval.baselines.screen_columns), no gate: a screen before the ridge
    ... robust       the same with White's heteroskedasticity-consistent standard error
    ... checked      the robust screen kept only if its rule, fitted on the slice's first two
                     thirds, earns on the last third (fxray.eval.baselines.checked_screen:
                     dqn.screen_t's screen)
    t>2.5 robust, arc  the robust screen's inputs, in the arc of the day chosen on train

    python lab/discoverable.py                       # the session market, GPU and CPU profiles
    python lab/discoverable.py --json discoverable.json
    python lab/discoverable.py --only "default, GPU" --draws 0-7  # each market at synth seeds 0..7

With --draws each market runs at each of those seeds (fresh draws of its generator), and a
summary per market gives each rule's pooled test Sharpe less the ridge rule's, as a mean over
draws with its standard error (Sharpe, not share: on some draws the oracle's Sharpe is near 0).

A rule that is told less and still reaches most of the oracle says the edge can be found from
the data of one train slice; one that falls far below it says a learner that must find the
hours (or the columns) itself cannot be asked for the oracle's Sharpe on that market. Numpy and
torch on the CPU; seconds per market.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from learner_grid import market  # noqa: E402

from fxray.data.arrays import host_arrays  # noqa: E402
from fxray.data.folds import FoldSpec, make_folds  # noqa: E402
from fxray.eval import baselines, pooled  # noqa: E402
from fxray.eval.backtest import evaluate  # noqa: E402
from fxray.rl.device import DeviceData  # noqa: E402
from fxray.rl.frontend import clock_mask  # noqa: E402

COST = 4e-5
SCREEN_K = (2, 4, 8)  # columns the train-slice screen keeps
SCREEN_T = (2.5, 3.0)  # the t-statistic screens' thresholds
MARKETS = (
    (
        "session, GPU profile",
        {"n_bars": 300000, "structure": "session", "beta": 0.03},
        {"train": "60d", "max_folds": 12},
    ),
    (
        "session, GPU, anchored",
        {"n_bars": 300000, "structure": "session", "beta": 0.03},
        {"train": "60d", "max_folds": 12, "anchored": True},
    ),
    (
        "session, CPU profile",
        {"n_bars": 150000, "structure": "session", "beta": 0.09},
        {"train": "60d", "max_folds": 4},
    ),
    ("default, GPU profile", {"n_bars": 300000}, {"train": "60d", "max_folds": 12}),
    (
        "session beta 0.05, GPU",
        {"n_bars": 300000, "structure": "session", "beta": 0.05},
        {"train": "60d", "max_folds": 12},
    ),
    (
        "session beta 0.06, GPU",
        {"n_bars": 300000, "structure": "session", "beta": 0.06},
        {"train": "60d", "max_folds": 12},
    ),
    (
        "session 7-16 beta 0.03, GPU",
        {"n_bars": 300000, "structure": "session", "beta": 0.03, "session_hours": (7, 16)},
        {"train": "60d", "max_folds": 12},
    ),
    (
        "session 7-16 beta 0.04, GPU",
        {"n_bars": 300000, "structure": "session", "beta": 0.04, "session_hours": (7, 16)},
        {"train": "60d", "max_folds": 12},
    ),
)


def day_of(data: DeviceData, a: int, b: int) -> torch.Tensor:
    return torch.from_numpy(data.period_host[a:b] * data.calendar.period_ns // 86_400_000_000_000)


def direction(x: torch.Tensor, fresh: torch.Tensor, columns, horizon: int = 20) -> torch.Tensor:
    """The ridge prediction of the next-`horizon`-bar return from x's `columns` (None = all),
    fitted on every bar of x: the signal whose hours are then looked for (no threshold, no
    cost: a direction, not a rule)."""
    X = (x if columns is None else x[:, columns]).double()
    y = baselines.forward_sum(fresh, horizon)
    return X @ torch.linalg.solve(baselines.ridge_gram(X), X.T @ y)


def hour_pnl(signal: torch.Tensor, fresh: torch.Tensor, hour: torch.Tensor, day: torch.Tensor) -> torch.Tensor:
    """(24, n_days): the in-sample covariance of the signal with the next bar's return, per
    hour of each day (next-bar returns: no overlap between bars)."""
    pnl = signal * fresh
    days = day - day.min()
    out = torch.zeros(24, int(days.max()) + 1, dtype=torch.float64)
    out.index_put_((hour, days), pnl.double(), accumulate=True)
    return out


def t_stat(x: torch.Tensor) -> torch.Tensor:
    """t-statistic of the mean over the last axis (days)."""
    n = x.shape[-1]
    return x.mean(-1) / (x.std(-1) / n**0.5).clamp_min(1e-30)


def best_arc(per_hour: torch.Tensor) -> tuple[int, int]:
    """The arc [a, b) of the day (1 to 12 hours, wrapping) whose summed daily P&L has the
    largest t-statistic."""
    best, arc = -np.inf, (0, 24)
    for a in range(24):
        for length in range(1, 13):
            idx = [(a + i) % 24 for i in range(length)]
            t = float(t_stat(per_hour[idx].sum(0)))
            if t > best:
                best, arc = t, (a, a + length)
    return arc


def screen(x: torch.Tensor, fresh: torch.Tensor, k: int, horizon: int = 20) -> torch.Tensor:
    """The k input columns whose correlation with the next-`horizon`-bar return on train is
    largest in size: a screen of the columns that uses the train slice only."""
    y = baselines.forward_sum(fresh, horizon)
    X = x.double() - x.double().mean(0)
    yc = y - y.mean()
    corr = (X.T @ yc) / (X.norm(dim=0) * yc.norm()).clamp_min(1e-30)
    return torch.topk(corr.abs(), k).indices


def in_set(hour: torch.Tensor, hours) -> torch.Tensor:
    if isinstance(hours, tuple):  # an arc [a, b), possibly past midnight
        a, b = hours
        return ((hour - a) % 24) < (b - a)
    return torch.isin(hour, torch.tensor(sorted(hours), dtype=hour.dtype))


def fold_rules(data: DeviceData, fold) -> dict:
    """Each rule's test-window periods on one fold."""
    data.set_fold(fold)  # the train slice's normalisation, as the trainer's references use
    cols, true_hours = data.oracle  # true_hours None: the edge is on all day
    a, b = fold.train[0], fold.train[1] - 1
    train = data.window(fold.train, "next_open")
    x = data.states(torch.arange(a, b))
    hour, day = data.bar_hours(a, b), day_of(data, a, b)
    chosen = {}
    market_cols = torch.nonzero(clock_mask(data.n_inputs, x.device) == 0).flatten()
    screened = {k: screen(x, train.fresh, k) for k in SCREEN_K}
    robust = baselines.screen_columns(x, train.fresh, 2.5, market_cols, robust=True)
    for which, c in (("cols", cols), ("all", None), ("robust", robust)):
        s = direction(x, train.fresh, c)
        per_hour = hour_pnl(s, train.fresh, hour, day)
        chosen[which] = {"arc": best_arc(per_hour), "t>2": {int(h) for h in torch.nonzero(t_stat(per_hour) > 2)}}
    specs = {
        "oracle": (cols, true_hours),
        "t>2.5 robust, arc": (robust, chosen["robust"]["arc"]),
        "cols, arc": (cols, chosen["cols"]["arc"]),
        "cols, hours t>2": (cols, chosen["cols"]["t>2"]),
        "cols, all day": (cols, None),
        "all, true hours": (None, true_hours),
        "all, arc": (None, chosen["all"]["arc"]),
        "ridge": (None, None),
    }
    for k, c in screened.items():
        specs[f"top{k}, true hours"] = (c, true_hours)
        specs[f"top{k}, no gate"] = (c, None)
    for t_min in SCREEN_T:
        specs[f"t>{t_min}"] = (baselines.screen_columns(x, train.fresh, t_min, market_cols), None)
        specs[f"t>{t_min} robust"] = (baselines.screen_columns(x, train.fresh, t_min, market_cols, robust=True), None)
        checked = baselines.checked_screen(x, train.fresh, COST, t_min, market_cols, carry=train.carry)
        specs[f"t>{t_min} checked"] = (checked, None)
    hits = {k: len(set(c.tolist()) & set(cols.tolist())) for k, c in screened.items()}
    out = {}
    for name, (c, hours) in specs.items():
        gate = None if hours is None else in_set(hour, hours)
        if gate is not None and not bool(gate.any()):
            out[name] = None  # no hour chosen: flat on test
            continue
        rule = baselines.fit_rule(x, train.fresh, COST, carry=train.carry, columns=c, gate=gate)  # no column: flat
        s, e = fold.test[0], fold.test[1] - 1
        xt = data.states(torch.arange(s, e))
        gt = None if hours is None else in_set(data.bar_hours(s, e), hours)
        out[name] = evaluate(rule.positions(xt, gt), data.window(fold.test, "next_open"), COST).periods.as_dict()
    out["_chosen"] = {k: {"arc": list(v["arc"]), "t>2": sorted(v["t>2"])} for k, v in chosen.items()}
    out["_chosen"]["screen_hits"] = hits
    return out


def run(tag: str, spec: dict, folds_kw: dict) -> dict:
    m = market(spec)
    data = DeviceData(host_arrays(m), "cpu")
    folds = make_folds(m.ts, FoldSpec(**folds_kw))
    per_fold = [fold_rules(data, f) for f in folds]
    ppy = data.calendar.periods_per_year
    names = [k for k in per_fold[0] if not k.startswith("_")]
    stats = {}
    for name in names:
        windows = [f[name] for f in per_fold if f[name] is not None]
        stats[name] = pooled.pooled(windows, COST, ppy) if windows else None
    oracle = stats["oracle"]
    oracle_windows = [f["oracle"] for f in per_fold]
    rows = {
        name: {
            "sharpe": st and st["sharpe"],
            "sharpe_se": st and st["sharpe_se"],
            "n_trades": st and st["n_trades"],
            "oracle_share": st and pooled.oracle_share(st, oracle),
            # a rule flat on a fold (no hour chosen) has no window there: no paired error
            "oracle_share_se": st
            and all(f[name] is not None for f in per_fold)
            and pooled.oracle_share_se([f[name] for f in per_fold], oracle_windows),
        }
        for name, st in stats.items()
    }
    return {"tag": tag, "market": spec, "folds": folds_kw, "rules": rows, "chosen": [f["_chosen"] for f in per_fold]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the numbers here")
    p.add_argument("--only", nargs="*", metavar="TAG", help="run the markets whose tag contains one of these")
    p.add_argument("--draws", type=draw_range, metavar="A-B", help="run each market at synth seeds A..B")
    args = p.parse_args(argv)
    os.environ.setdefault("FXRAY_CACHE_DIR", str(Path.home() / ".cache" / "fxray"))
    results = []
    for tag, spec, folds_kw in MARKETS:
        if args.only and not any(o in tag for o in args.only):
            continue
        for d in args.draws or [None]:
            if d is not None:
                tag_d, spec_d = f"{tag}, draw {d}", {**spec, "seed": d}
            else:
                tag_d, spec_d = tag, spec
            results.append(run(tag_d, spec_d, folds_kw))
            report(results[-1])
        if args.draws:
            print(over_draws(tag, results[-len(args.draws) :]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


def draw_range(text: str) -> list[int]:
    a, _, b = text.partition("-")
    try:
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range of seeds like 0-7") from None
    if hi < lo:
        raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
    return list(range(lo, hi + 1))


def over_draws(tag: str, runs: list[dict]) -> str:
    """Each rule's pooled test Sharpe less the ridge rule's, mean ± se over the draws."""
    lines = [f"\n{tag}, over {len(runs)} draws: each rule's pooled test Sharpe less the ridge rule's"]
    for name in runs[0]["rules"]:
        diffs = [
            r["rules"][name]["sharpe"] - r["rules"]["ridge"]["sharpe"]
            for r in runs
            if r["rules"][name]["sharpe"] is not None
        ]
        if len(diffs) < 2 or name == "ridge":
            continue
        m = float(np.mean(diffs))
        se = float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
        better = sum(d > 0 for d in diffs)
        lines.append(f"  {name:<18} {m:+6.2f} ± {se:.2f}  (above the ridge rule on {better} of {len(diffs)} draws)")
    return "\n".join(lines)


def report(r: dict) -> None:
    """One market's rules, as printed per market (and per draw with --draws)."""
    tag = r["tag"]
    print(f"\n{tag} ({len(r['chosen'])} folds)")
    for name, v in r["rules"].items():
        if v["sharpe"] is None:
            print(f"  {name:<18} flat on every fold (no hour chosen)")
            continue
        share = "n/a" if v["oracle_share"] is None else f"{v['oracle_share']:.2f}"
        if v["oracle_share_se"]:
            share += f" ± {v['oracle_share_se']:.2f}"
        se = "" if v["sharpe_se"] is None else f" ± {v['sharpe_se']:.2f}"
        print(f"  {name:<18} {v['sharpe']:+6.2f}{se}  share {share:>12}  trades {v['n_trades']}")
    hits = " ".join(str(c["screen_hits"]) for c in r["chosen"])
    print(f"  planted columns among the screen's top k, per fold: {hits}")
    for which in ("cols", "all", "robust"):
        arcs = " ".join("{}-{}".format(*c[which]["arc"]) for c in r["chosen"])
        print(f"  arcs chosen on train ({which}): {arcs}")


if __name__ == "__main__":
    sys.exit(main())
