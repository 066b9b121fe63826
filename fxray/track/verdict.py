"""The "is it real" block of a sweep: DSR, Reality Check / SPA / StepM, PBO and the placebo
sweeps, each with a line saying what it means, and its plot.

    v = snooping_verdict(trials, n_folds, ppy, deflated)   # trials as results.py or compare.py hold them
    v["placebo"] = snooping.placebo_pvalue(real_best, placebo_bests)      # when placebos ran
    print(text(v)); json_ready(v); verdict_png(path, [(name, v)])

`trials`: [{"trial_id", "status", "folds": [{"fold", "status", "val_periods", "test_periods",
"baseline_periods"}]}]: the fold records of fxray.track.results (folds.jsonl) and of
fxray.track.compare (MLflow) have that shape. The statistics are fxray.eval.snooping
and fxray.eval.cscv; formulas and references in docs/metrics.md.
"""

from __future__ import annotations

from fxray.eval import cscv, snooping

KEYS = ("spa_pvalue", "reality_check_pvalue", "stepm_kept", "pbo", "placebo_pvalue")  # compare --json


def eval_trials(trials: list[dict]) -> tuple[list[dict], dict]:
    """(trials as fxray.eval.snooping takes them, buy-and-hold's test windows {fold: periods})."""
    out, bh = [], {}
    for t in trials:
        folds = {}
        for f in t["folds"]:
            if f["status"] != "ok" or not f.get("val_periods"):
                continue  # a diverged or cancelled fold ends what the trial ran
            folds[f["fold"]] = {"val": f["val_periods"], "test": f["test_periods"]}
            ref = (f.get("baseline_periods") or {}).get("buy_and_hold")
            if ref and f["fold"] not in bh:
                bh[f["fold"]] = ref["test"]
        out.append({"trial_id": t["trial_id"], "folds": folds})
    return out, bh


def snooping_verdict(trials: list[dict], n_folds: int, periods_per_year: float, deflated: dict | None = None) -> dict:
    """The data-snooping statistics of a sweep's trials, per rung and at the headline rung.

    Rung k: the trials that ran folds 0..k-1, on those folds' windows. Headline: the
    deepest rung (SPA, RC, StepM on the test hours; the trials that ran every fold when
    any did), and for PBO the deepest rung with at least two trials (on the val hours,
    where the sweep selected). `_cscv_logits` (not JSON) is for the plot."""
    ev, bh = eval_trials(trials)
    ks = snooping.rungs(ev)
    v = {
        "dsr": (deflated or {}).get("dsr"),
        "n_trials_counted": (deflated or {}).get("n_trials_counted"),
        "n_folds": n_folds,
        "rungs": [],
        "placebo": None,
        **{k: None for k in KEYS},
        "stepm_kept": [],
    }
    if not ks:
        return v
    pbo_rung = None
    for k in ks:
        test = snooping.rung_matrix(ev, k, "test", bh)
        flat = snooping.superior_ability(test.returns, None, test.trial_ids)
        val = snooping.rung_matrix(ev, k, "val")
        p = cscv.pbo(val.returns, periods_per_year=periods_per_year)
        if p is not None:
            pbo_rung = (k, val, p)
        v["rungs"].append(
            {
                "k": k,
                "n_trials": len(test.trial_ids),
                "n_test_periods": int(test.returns.shape[0]),
                "spa_pvalue": flat["spa_pvalue"],
                "reality_check_pvalue": flat["reality_check_pvalue"],
                "n_stepm_kept": len(flat["stepm_kept"]),
                "pbo": p["pbo"] if p else None,
            }
        )
    top = ks[-1]
    test = snooping.rung_matrix(ev, top, "test", bh)
    v["spa"] = {"k": top, **snooping.superior_ability(test.returns, None, test.trial_ids)}
    v["spa_buy_and_hold"] = (
        {"k": top, **snooping.superior_ability(test.returns, test.benchmark, test.trial_ids)}
        if test.benchmark is not None
        else None
    )
    v.update({k: v["spa"][k] for k in ("spa_pvalue", "reality_check_pvalue", "stepm_kept")})
    if pbo_rung is not None:
        k, val, p = pbo_rung
        v["cscv"] = {"k": k, **cscv.json_safe(p)}
        v["pbo"] = p["pbo"]
        v["_cscv_logits"] = p["logits"]
    return v


def add_placebo(v: dict, placebo: dict) -> dict:
    """The placebo sweeps' result (fxray.eval.snooping.placebo_pvalue) into the verdict."""
    v["placebo"] = placebo
    v["placebo_pvalue"] = placebo.get("pvalue")
    return v


def json_ready(v: dict) -> dict:
    return {k: val for k, val in v.items() if not k.startswith("_")}


def metrics(v: dict) -> dict:
    """The verdict's numbers for the parent run's summary (MLflow gets no point for None)."""
    out = {k: v.get(k) for k in ("spa_pvalue", "reality_check_pvalue", "pbo", "placebo_pvalue")}
    out["stepm_kept"] = len(v.get("stepm_kept") or [])
    bh = v.get("spa_buy_and_hold") or {}
    out["spa_pvalue_vs_buy_and_hold"] = bh.get("spa_pvalue")
    return {k: x for k, x in out.items() if x is not None}


def _p(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def text(v: dict, indent: str = "   ") -> str:
    """The block, one statistic a line and what it means."""
    lines = [f"{indent}is it real? (docs/metrics.md, 'Is the best trial better than luck?')"]
    n = v.get("n_trials_counted")
    lines.append(
        f"{indent}  DSR        {_p(v.get('dsr'))}  P(the best trial's pooled test Sharpe beats the luckiest of "
        f"{n if n is not None else 'N'} skill-less trials); significant at >= 0.95"
    )
    spa, bh = v.get("spa"), v.get("spa_buy_and_hold")
    if spa and spa.get("spa_pvalue") is not None:
        where = f"{spa['n_trials']} trials that ran {spa['k']} of {v['n_folds']} folds, {spa['n_periods']} test hours"
        kept = ", ".join(spa["stepm_kept"][:4]) + (" ..." if len(spa["stepm_kept"]) > 4 else "")
        lines += [
            f"{indent}  SPA p      {_p(spa['spa_pvalue'])}  P(the best of these beats flat by this much | none has an "
            f"edge) (Hansen; {where}; block {spa['block_size']}h); Reality Check p {_p(spa['reality_check_pvalue'])}",
            f"{indent}  StepM      {len(spa['stepm_kept'])} trial(s) beat flat at 5 % family-wise error"
            + (f": {kept}" if kept else ""),
        ]
        if bh and bh.get("spa_pvalue") is not None:
            lines.append(
                f"{indent}  vs B&H     SPA p {_p(bh['spa_pvalue'])}, Reality Check p "
                f"{_p(bh['reality_check_pvalue'])}, StepM keeps {len(bh['stepm_kept'])}: the same against buy-and-hold"
            )
    else:
        lines.append(f"{indent}  SPA p      n/a  no trial's test returns differ from flat (none traded)")
    c = v.get("cscv")
    if c:
        d = c["degradation"]
        lines.append(
            f"{indent}  PBO        {_p(c['pbo'])}  P(the in-sample best lands at or below the median out of sample) "
            f"(CSCV: {c['n_trials']} trials' val hours, {c['n_blocks']} blocks, {c['n_splits']} splits); "
            f"its OOS Sharpe = {_p(d['intercept'], '+.2f')} + {_p(d['slope'], '.2f')} x IS, "
            f"loses OOS in {c['prob_oos_loss']:.0%} of splits"
        )
    else:
        lines.append(f"{indent}  PBO        n/a  needs two trials with the same val hours whose returns differ")
    if len(v.get("rungs") or []) > 1:  # ASHA stopped trials: the same tests on the trials of each rung
        lines.append(
            f"{indent}  per rung   (trials that ran k folds: SPA p, PBO) "
            + "; ".join(
                f"{r['n_trials']} x {r['k']}: {_p(r['spa_pvalue'], '.2f')}, {_p(r['pbo'], '.2f')}" for r in v["rungs"]
            )
        )
    pl = v.get("placebo")
    if pl and pl.get("pvalue") is not None:
        z = f", z {pl['z']:+.1f}" if pl.get("z") is not None else ""
        lines.append(
            f"{indent}  placebo p  {_p(pl['pvalue'])}  P(a sweep on signal-free data reaches this best test Sharpe): "
            f"real {pl['real']:+.2f}, rank {pl['rank']} of {pl['n'] + 1}; placebos {pl['mean']:+.2f}"
            + (f" ± {pl['std']:.2f}" if pl.get("std") is not None else "")
            + z
        )
    else:
        lines.append(f"{indent}  placebo p  n/a  no placebo sweep (python -m fxray.tune ... --placebo N)")
    return "\n".join(lines)


def verdict_png(path, rows: list[tuple[str, dict]]):
    """One row per experiment: the placebo sweeps' best test Sharpe with the real one marked,
    and the CSCV logit histogram (the PBO is the mass at or left of 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.4 * len(rows)), squeeze=False)
    for (name, v), (ax_p, ax_c) in zip(rows, axes):
        pl = v.get("placebo")
        if pl and pl.get("placebos"):
            vals = np.asarray(pl["placebos"])
            lo, hi = min(vals.min(), pl["real"]), max(vals.max(), pl["real"])
            pad = 0.1 * max(hi - lo, 1.0)
            ax_p.hist(vals, bins=30, range=(lo - pad, hi + pad), color="0.6", label=f"{len(vals)} placebo sweeps")
            ax_p.plot(vals, np.zeros_like(vals), "|", color="k", ms=18)  # each one, when they are few
            ax_p.axvline(pl["real"], color="tab:red", lw=2, label=f"real {pl['real']:+.2f}")
            ax_p.set_title(f"{name}: best pooled test Sharpe, placebo p = {pl['pvalue']:.3f}", fontsize=9)
            ax_p.legend(fontsize=8)
        else:
            ax_p.text(0.5, 0.5, "no placebo sweeps\n(python -m fxray.tune --placebo N)", ha="center", va="center")
            ax_p.set_title(f"{name}: placebo sweeps", fontsize=9)
        ax_p.set_xlabel("best trial's pooled test Sharpe (annualised)")
        logits = v.get("_cscv_logits")
        if logits is not None and len(logits):
            finite = np.clip(np.asarray(logits), -8, 8)
            edges = np.linspace(-8, 8, 33)
            ax_c.hist(finite[finite > 0], bins=edges, color="tab:blue", label="above the median OOS")
            ax_c.hist(finite[finite <= 0], bins=edges, color="tab:orange", label="at or below: overfit")
            ax_c.axvline(0, color="k", lw=0.8)
            ax_c.set_title(f"{name}: CSCV logits of the in-sample best, PBO = {v['pbo']:.2f}", fontsize=9)
            ax_c.legend(fontsize=8)
        else:
            why = "PBO n/a: needs two trials with the\nsame val hours whose returns differ"
            ax_c.text(0.5, 0.5, why, ha="center", va="center")
        ax_c.set_xlabel("logit of the pick's out-of-sample relative rank")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
