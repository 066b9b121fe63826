"""What a person sees of a sweep: its last screen (the top trials and the chosen trial's
pooled out-of-sample line with its baselines, DSR and what it adds over the supervised rule; the
verdict's evidence follows it, fxray.track.verdict; then `closing_lines`: the market, the chosen
trial beside the oracle and the ridge rule, the verdict in one sentence), the commands to run
next, what MLflow is told at the end, and the equity plot of the chosen trial's test windows
beside the reference rules.

One word for each thing on every screen: the "chosen trial" is the one the sweep picks (the
highest score among the trials that ran every fold; fxray.track.results.chosen), "top" trials
are the first rows by score. results.json's `best` block and the MLflow keys `best_*` hold the
chosen trial's numbers (names kept for the scripts that read them)."""

from __future__ import annotations

from pathlib import Path


def fmt(v, spec: str = "+.2f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def bp(cost) -> str:
    return "n/a" if cost is None else f"{cost * 1e4:.2f} bp"


def sharpe_line(s: dict) -> str:
    """'+4.10 ± 2.40' or a flag for no evidence."""
    if s is None:
        return "n/a"
    if s["evidence"] == "none":
        return "no trades (no evidence)"
    line = f"{s['sharpe']:+.2f} ± {fmt(s['sharpe_se'], '.2f')}"
    return line + (f" (thin: {s['n_active']} active hours)" if s["evidence"] == "thin" else "")


def share_text(test: dict) -> str:
    """'; share of the oracle 0.57 ± 0.35' (its standard error where known), or '' without an oracle."""
    share = test.get("oracle_share")
    if share is None:
        return ""
    se = test.get("oracle_share_se")
    return f"; share of the oracle {share:.2f}" + (f" ± {se:.2f}" if se is not None else "")


def linear_line(test: dict) -> str:
    """What the learner adds over the supervised rule (fxray.eval.pooled.minus_linear), in words: it
    adds when the difference is more than 1.645 standard errors above 0, does worse when as far
    below, and adds nothing in between; '' without such a rule."""
    x, se, ref = test.get("minus_linear"), test.get("minus_linear_se"), test.get("linear_reference")
    if x is None:
        return ""
    diff = f"{x:+.2f} ± {fmt(se, '.2f')}"
    where = f"the supervised rule ({ref}, the better by val; paired daily differences)"
    if se is not None and x - 1.645 * se > 0:
        return f"the DQN adds {diff} over {where}"
    if se is not None and x + 1.645 * se < 0:
        return f"the DQN does worse than {where}: {diff}"
    return f"the DQN adds nothing over {where}: {diff}"


def pooled_lines(best: dict, cost) -> list[str]:
    """The pooled out-of-sample block of the last screen, fxray compare and fxray train: `best`'s
    test windows pooled at the hour at `cost` (its `test`, the references' `baselines` on the same
    windows; a sweep's chosen trial adds its `dsr`, `sr0`, `n_trials_counted`, `walk_forward`), what
    it adds over the supervised rule. The first line, then the others indented by two spaces."""
    test, walk = best["test"], best.get("walk_forward")
    dsr = f"  DSR {fmt(best['dsr'], '.3f')}" if "dsr" in best else ""
    beside = ", ".join(f"{n} {sharpe_line(r)}" for n, r in best["baselines"].items())
    why = "each test window's trial chosen on the val windows before it"
    lines = [
        f"out of sample, pooled over {test['n_days']} test days ({test['n_periods']} hours) at {bp(cost)}: "
        f"Sharpe {sharpe_line(test)}  PSR(0) {fmt(test['psr'], '.3f')}{dsr}",
        dsr
        and f"(DSR: N = {best['n_trials_counted']} trials started; the luckiest of N skill-less trials would "
        f"reach {fmt(best['sr0'], '+.2f')} here)",
        f"at 2x cost {test['sharpe_2x']:+.2f}, at 3x {test['sharpe_3x']:+.2f}; break-even cost "
        f"{bp(test['break_even_cost'])}; {test['n_trades']} trades, turnover {test['turnover']:.4f} per bar"
        + flat_text(test),
        f"beside it: {beside}, flat 0{share_text(test)}",
        linear_line(test),  # '' without a rule
        walk and f"walk-forward selection ({why}): {sharpe_line(walk)}",
    ]
    return [lines[0], *("  " + line for line in lines[1:] if line)]


def ranked(trials: list, n_folds: int) -> list:
    """results.json's trials, ranked: the order of the last screen (and of the MLflow rank
    tags): trials that did not diverge, then those that ran every fold, by score; the chosen
    trial first."""

    def key(t):
        score = t["score"] if t["score"] is not None else float("-inf")  # a diverged trial has none
        return t["status"] == "ok", t["folds_done"] >= n_folds, score

    return sorted(trials, key=key, reverse=True)


def print_last_screen(results: dict, names: list, n_folds: int, top: int = 10) -> None:
    trials = ranked(results["trials"], n_folds)[:top]
    lines = [
        f"\ntop {len(trials)} of {results['n_trials']} trials by score (pooled val Sharpe of the folds each ran; "
        f"{n_folds} folds, fewer = stopped by ASHA); wall time {results['wall_s'] / 60:.1f} min",
        f"  {'trial':<20} {'folds':>5} {'score':>7} {'val SR':>14} {'test SR':>14}  "
        + "  ".join(f"{n:>10}" for n in names),
    ]
    for t in trials:
        score = "diverged" if t["status"] != "ok" else f"{t['score']:+.2f}"
        val, test = (f"{s['sharpe']:+6.2f}±{fmt(s['sharpe_se'], '.2f'):>5}" for s in (t["val"], t["test"]))
        lines.append(
            f"  {'trial-' + t['trial_id']:<20} {t['folds_done']:>5} {score:>7} {val:>14} {test:>14}  "
            + "  ".join(f"{fmt_value(t['sampled'].get(n)):>10}" for n in names)
        )
    b, base = results["best"], results["base_config"]
    which = "of the trials that ran every fold" if b["folds_done"] >= n_folds else "(no trial ran every fold)"
    lines += [
        f"\nchosen trial-{b['trial_id']} (the highest score {which}): {b['folds_done']} test windows, "
        f"fill {base.get('fill')}",
        *("  " + line for line in pooled_lines(b, base["cost"])),
    ]
    spread = b.get("seed_spread")
    if spread:
        lines.append(
            f"  a seed ensemble of {spread['seeds']} (mean Q); each seed alone, per fold: test Sharpe "
            f"{spread['mean']:+.2f} on average, spread between seeds {spread['std']:.2f} (mean std over "
            f"{spread['folds']} folds)"
        )
    vote = results.get("ensemble")
    if vote:
        lines.append("  " + vote_line(vote))
    print("\n".join(lines))


def market_info(path) -> dict:
    """What results.json's data block says of the market beside its path and hash: the
    fxcache header's instrument, bar and source, the synthetic market's seed and structure,
    and `embedded`: whether it is the market `fxray tune` generates when the experiment names
    no data (fxray.data.synth's default file for its spec). {} when the file cannot be read."""
    from fxray.data import cache, synth

    if not path:
        return {}
    try:
        meta = cache.open(path, verify=False).meta
    except cache.CacheError:
        return {}
    out = {k: meta.get(k) for k in ("instrument", "bar", "source")}
    spec = meta.get("synth")
    if spec:
        out["synth"] = {k: spec.get(k) for k in ("seed", "structure", "shuffle")}
        try:
            out["embedded"] = synth.default_path(synth.SynthSpec(**spec)) == Path(path)
        except TypeError:  # a spec of another generator version
            out["embedded"] = False
    return out


def market_line(data: dict) -> str:
    """Which market: 'the embedded synthetic market (...)' or the file's path and what it holds."""
    bars = f"{data['n_bars']:,} {data.get('bar') or ''} bars".replace("  ", " ") if data.get("n_bars") else None
    s = data.get("synth")
    if s:
        planted = "no signal: the shuffled twin" if s.get("shuffle") else f"a planted {s.get('structure')} edge"
        what = f"seed {s.get('seed')}, {bars}; {planted}"
        return (
            f"the embedded synthetic market ({what})" if data.get("embedded") else f"{data['path']} (synthetic: {what})"
        )
    source = data.get("source") and f"from {data['source']}"
    return f"{data.get('path')} ({', '.join(v for v in (data.get('instrument'), bars, source) if v)})"


def closing_lines(results: dict, verdict_sentence: str) -> list[str]:
    """The end of the last screen: the market, the chosen trial's pooled test Sharpe beside
    the oracle (where the market has one) and the ridge rule on the same days, the verdict."""
    b = results["best"]
    test, refs = b["test"], b["baselines"]
    beside = [f"oracle {sharpe_line(refs['oracle'])}" if "oracle" in refs else "oracle unknown (not a planted market)"]
    beside += [f"ridge rule {sharpe_line(refs['ridge'])}"] if "ridge" in refs else []
    days = f"{test['n_days']} test days"
    traded = test["evidence"] != "none"
    record = f"pooled test Sharpe {sharpe_line(test)} over {days}" if traded else f"no trade in its {days}"
    return [
        f"market:  {market_line(results['data'])}",
        f"chosen:  trial-{b['trial_id']}, {record}; " + ", ".join(beside) + " on the same days",
        verdict_sentence,
    ]


def next_commands(results: dict | None, top: list) -> list[str]:
    """The commands a sweep's last line suggests: `fxray compare` of it, and where the verdict
    is an edge, the export of the chosen trial's policy (`top`: [(run id, name)], ranked)."""
    if not results:
        return []
    store = f" --tracking-uri {results['tracking_uri']}" if results.get("tracking_uri") else ""
    cmds = [f"fxray compare {results['experiment']}{store}   # the verdict's evidence, plotted"]
    if (results.get("verdict") or {}).get("answer") == "edge" and top:
        cmds.append(f"fxray export {top[0][0]} --out policy/{store}   # the chosen trial's policy, to backtest")
    return cmds


def mlflow_report(results: dict | None, n_folds: int) -> dict:
    """What MLflow is told at the end of a sweep besides its screen (fxray.track.runs.end_sweep):
    the trial ids ranked as the last screen lists them, each one's pooled Sharpes (the last
    screen's numbers, not the running means of per-window values) and the searched names."""
    trials = ranked(results["trials"] if results else [], n_folds)

    def defined(s: dict | None, key: str):  # a window with no trade has no Sharpe: no point, not a 0 that ranks
        return None if not s or s.get("evidence") == "none" else s.get(key)

    named = (("val", "sharpe"), ("test", "sharpe"), ("test", "sharpe_se"))  # pooled_val_sharpe, ...
    pooled = {t["trial_id"]: {f"pooled_{w}_{k}": defined(t.get(w), k) for w, k in named} for t in trials}
    params = sorted({k for t in trials for k in t.get("sampled", {})})
    return {"ranking": [t["trial_id"] for t in trials], "pooled": pooled, "params": params}


def flat_text(test: dict) -> str:
    """'; no position in k of n test windows' where the policy sat some windows out (pooled's
    flat_windows; absent from results written before it was counted)."""
    k, n = test.get("flat_windows"), test.get("n_windows")
    return f"; no position in {k} of {n} test windows" if k else ""


def vote_line(vote: dict) -> str:
    """The vote of the full trials (fxray.sweep.vote), one line."""
    head = f"vote of the {vote['n_members']} trials that ran every fold (members chosen on val only)"
    if "skipped" in vote:
        return f"{head}: not run: {vote['skipped']}"
    test = vote["test"]
    # a Sharpe of a few active hours says nothing; neither does its PSR (it is not shown)
    psr = f"PSR {fmt(test['psr'], '.3f')}" if test["evidence"] == "ok" else "too few active hours for a PSR"
    if test["evidence"] == "ok" and vote.get("dsr") is not None:  # fxray.track.results.run_ensemble
        psr += f", DSR {vote['dsr']:.3f} (deflated for the {vote['n_trials_counted']} trials its members came from)"
    return f"{head}: {sharpe_line(test)}, {test['n_trades']} trades" + share_text(test) + f"; {psr}"


def seed_spread(folds: list) -> dict | None:
    """The seeds of a trial's ensemble folds (fxray.rl.trainer; its fold records, flat or as in
    results.json): {seeds, mean, std, folds}, or None."""
    folds = [f for f in folds if f.get("seeds", 1) > 1 and f.get("seed_test_sharpe")]
    if not folds:
        return None
    per_seed = [v for f in folds for v in f["seed_test_sharpe"] if v is not None]
    stds = [f["seed_test_sharpe_std"] for f in folds if f.get("seed_test_sharpe_std") is not None]
    return {
        "seeds": folds[0]["seeds"],
        "mean": sum(per_seed) / max(len(per_seed), 1),
        "std": sum(stds) / len(stds) if stds else float("nan"),
        "folds": len(folds),
    }


def fmt_value(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def pyplot():
    """matplotlib.pyplot on the Agg backend: fxray's figures are files, never windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path, dpi: int) -> Path:
    """`fig` laid out and written to `path` (a PNG), then closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def equity_png(path, folds: list, title: str) -> Path:
    """Equity (start 1) of the chosen trial over its test windows, hour by hour on a dated axis,
    beside the reference rules on the same windows; each test window shaded."""
    fig, ax = pyplot().subplots(figsize=(10, 4.2))
    plot_equity(ax, folds, title)
    fig.autofmt_xdate()
    return save(fig, path, 110)


def plot_equity(ax, folds: list, title: str) -> None:
    """equity_png's drawing on a given matplotlib axis (fxray.compare stacks one per sweep).
    The windows are not contiguous: each curve is broken between them (equity carries over,
    no line is drawn across the days no window covers)."""
    import numpy as np

    lines = {  # colour, width
        "policy": ("tab:blue", 2.0),
        "oracle": ("tab:green", 1.2),
        "ridge": ("tab:orange", 1.2),
        "screened": ("tab:purple", 1.2),
        "buy_and_hold": ("0.4", 1.0),
    }
    series: dict = {name: ([], []) for name in lines}
    label = {"xycoords": ("data", "axes fraction"), "fontsize": 8, "color": "0.35", "va": "bottom"}  # "fold k" text
    for f in folds:
        if not f.ok:
            continue
        t = np.asarray(f.test_periods["hours"], dtype="int64") * 3600  # hours since the epoch -> seconds
        dates = t.astype("datetime64[s]")
        ax.axvspan(dates[0], dates[-1], color="0.93", zorder=0)
        ax.annotate(f"fold {f.fold}", (dates[0], 0.02), **label)
        windows = {"policy": f.test_periods, **{k: v["test"] for k, v in f.baseline_periods.items()}}
        for name, w in windows.items():
            if name in series:
                series[name][0].append(dates)
                series[name][1].append(np.asarray(w["net"], dtype=np.float64))
    for name, (dates, nets) in series.items():
        if not dates:
            continue
        equity = np.exp(np.cumsum(np.concatenate(nets)))
        ends = np.cumsum([len(d) for d in dates])[:-1]  # a gap (NaN) after each window but the last
        x = np.concatenate(dates)
        x = np.insert(x, ends, x[ends - 1])  # at the gap's start; its NaN y breaks the line
        y = np.insert(equity, ends, np.nan)
        ax.plot(x, y, color=lines[name][0], lw=lines[name][1], label=name.replace("_", " "))
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_title(title, fontsize=11)
    ax.set_ylabel("equity (net of costs, start 1)", fontsize=10)
    ax.tick_params(labelsize=9)
    ax.legend(fontsize=9, loc="upper left", framealpha=0.9)
